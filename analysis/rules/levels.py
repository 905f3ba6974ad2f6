"""Hierarchical roofline finding: which memory level binds the kernels that have bytes per level.

A kernel's binding level (``bound_level``, filled at import from ``l2_bytes``, ``l1_bytes`` and
``shared_bytes`` against the device's per-level roofs) is the level whose traffic takes longest at
its bandwidth. A kernel bound at L2, L1 or LDS is limited by on-chip traffic, not HBM: fewer bytes from
HBM will not speed it up; more reuse in registers or LDS (larger tiles, fused loads) will.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import duration

from ._base import Finding, info, is_cpu_report, pct, ranked

if TYPE_CHECKING:
    from perfscope.report import Report

LEVEL_NAMES = {"dram": "HBM/DRAM", "l2": "L2", "l1": "L1", "shared": "shared memory/LDS"}
CACHE_BOUND_MIN_PCT = 5.0
"""A cache-bound finding needs at least 5% of the time of the kernels with per-level bytes."""
TOP = 3
LEVEL_BUSY_MIN = 0.3
"""A kernel is held back by its binding cache level when moving its bytes there at the level's roof
takes at least 30% of its time."""


def memory_level(report: Report) -> list[Finding]:
    """The memory level that binds most of the kernel time, and the kernels bound at a cache level."""
    k = report.kernels
    if not len(k) or "bound_level" not in k or is_cpu_report(report) or not k["bound_level"].notna().any():
        return []
    known = k[k["bound_level"].notna()]
    total = float(known["duration_ns"].sum())
    share = known.groupby("bound_level")["duration_ns"].sum().sort_values(ascending=False)
    evidence: dict[str, float | int | str] = {f"{lvl}_bound_time_pct": pct(float(t), total) for lvl, t in share.items()}
    evidence["kernels_with_level_bytes"] = len(known)
    dev = report.device
    peak = pd.to_numeric(known["precision"].map(lambda p: dev.peak_flops(p if isinstance(p, str) else None)
                                                 if dev is not None else None), errors="coerce")
    roof = pd.to_numeric(known["level_roof_flops_per_s"], errors="coerce")
    # memory-bound at its binding level: that level's roof is below the compute roof (a GEMM whose
    # slowest level still lets it reach the compute peak is compute-bound at every level)
    memory_bound = (roof < peak) | (pd.to_numeric(known["flops"], errors="coerce") == 0)
    caches = known[(known["bound_level"] != "dram") & memory_bound]
    needed = pd.Series(np.nan, index=caches.index)  # ns the binding level needs to move the kernel's bytes
    for level, col in (("l2", "l2_bytes"), ("l1", "l1_bytes"), ("shared", "shared_bytes")):
        bw = dev.peak_bandwidth(level) if dev is not None else None
        rows = caches["bound_level"] == level
        if bw and col in caches:
            needed[rows] = pd.to_numeric(caches.loc[rows, col], errors="coerce") / bw * 1e9
    # a level busy for under LEVEL_BUSY_MIN of the kernel's time does not hold it back: such kernels
    # (a few KB in a few µs) are latency- or launch-bound, below every roof
    busy = (needed / caches["duration_ns"].astype("float64")) >= LEVEL_BUSY_MIN
    evidence["below_every_roof_kernels"] = int((~busy).sum())
    caches, needed = caches[busy], needed[busy]
    cache_pct = pct(float(caches["duration_ns"].sum()), total)
    evidence["compute_bound_every_level_time_pct"] = pct(float(known.loc[roof >= peak, "duration_ns"].sum()), total)
    if not len(caches) or cache_pct < CACHE_BOUND_MIN_PCT:
        lead = str(share.index[0])
        return [info("memory-level", f"Hierarchical roofline: {evidence[f'{lead}_bound_time_pct']:.0f}% of the time of "
                     f"{len(known)} kernels with per-level bytes has its lowest memory roof at "
                     f"{LEVEL_NAMES.get(lead, lead)}; {evidence['compute_bound_every_level_time_pct']:.0f}% is "
                     "compute-bound at every level",
                     "Where HBM binds, fewer bytes from HBM (fusion, lower-precision weights or KV cache) are the "
                     "lever; the cache levels have headroom.", **evidence)]
    at_stake = float((caches["duration_ns"] - needed).clip(lower=0).sum())
    by_name = caches.groupby("name")["duration_ns"].sum().sort_values(ascending=False)
    lead = str(caches.groupby("bound_level")["duration_ns"].sum().idxmax())
    evidence.update({"cache_bound_time_ns": float(caches["duration_ns"].sum()), "cache_bound_time_pct": cache_pct})
    title = (f"{cache_pct:.0f}% of the time of kernels with per-level bytes ({duration(float(caches['duration_ns'].sum()))}) is bound by on-chip "
             f"traffic, mostly at {LEVEL_NAMES.get(lead, lead)}, not by HBM")
    advice = ("At these kernels' intensities the cache level's bandwidth, not HBM's, is the lowest roof: cutting HBM "
              "bytes will not speed them up. Reuse data closer to the ALUs: larger tiles held in registers or LDS, "
              "vectorised and coalesced loads (fewer L1/L2 transactions per byte), fewer LDS bank conflicts, and "
              "fusing the kernels that re-read the same tensor.")
    return [ranked(report, "memory-level", title, evidence, advice, at_stake,
                   kernels=tuple(str(n) for n in by_name.index[:TOP]))]
