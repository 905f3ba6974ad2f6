"""Hierarchical roofline finding: which memory level binds the kernels that have bytes per level.

A kernel's binding level (``bound_level``, filled at import from ``l2_bytes``, ``l1_bytes`` and
``shared_bytes`` against the device's per-level roofs) is the level whose traffic takes longest at
its bandwidth. A kernel bound at L2, L1 or LDS is limited by on-chip traffic, not HBM: fewer bytes from
HBM will not speed it up; more reuse in registers or LDS (larger tiles, fused loads) will.

Where Nsight Compute or rocprof-compute measured each unit, the measured limiter decides: a kernel limited by a
pipe (compute) or by no unit (latency) is not called cache-bound, whatever its bytes per level say, and a kernel
a cache level limits is bound there (its ``bound_level``). The finding lists its kernels as items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import clip, duration
from perfscope.kernel_names import short_kernel_name

from ..costs.limiter import UNIT_NAMES
from ._base import Finding, Item, info, is_cpu_report, pct, ranked
from .kernels import LIMITER_ADVICE

if TYPE_CHECKING:
    from perfscope.report import Report

LEVEL_NAMES = {"dram": "HBM/DRAM", "l2": "L2", "l1": "L1", "shared": "shared memory/LDS"}
CACHE_BOUND_MIN_PCT = 5.0
"""A cache-bound finding needs at least 5% of the time of the kernels with per-level bytes."""
TOP = 3
LEVEL_BUSY_MIN = 0.3
"""A kernel is held back by its binding cache level when moving its bytes there at the level's roof
takes at least 30% of its time."""


def _lowest_roof_advice(known: pd.DataFrame, lead: str) -> str:
    """What the lowest roof of most of the time says, naming the memory-bound kernels (``known``: those below their
    compute roof at that level) that hold most of that time: a kernel compute-bound at every level is not shortened
    by fewer bytes."""
    mine = known[known["bound_level"] == lead]
    by = mine.groupby("name")["duration_ns"].sum()
    by = by.groupby([clip(short_kernel_name(str(n)), 48) for n in by.index]).sum()  # one name per kernel family
    names = [str(n) for n in by.sort_values(ascending=False).head(TOP).index]
    where = f" (most of it in {', '.join(names)})" if names else ""
    if lead == "dram":
        return (f"Where HBM/DRAM is the lowest roof{where}, only fewer bytes from it shorten those kernels; the cache "
                "levels have headroom. The below-roof findings name, per kernel group, what its bytes are (weights, "
                "KV cache, re-read tensors) where the trace shows it.")
    return (f"{LEVEL_NAMES.get(lead, lead)} is the lowest memory roof for most of the time{where}, yet the kernels its "
            f"bandwidth holds back (busy there for {LEVEL_BUSY_MIN:.0%} of their time or more) hold under "
            f"{CACHE_BOUND_MIN_PCT:.0f}% of it: the rest is compute-bound at every level or runs below every roof.")


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
    if "limiter" in known:  # a measured limiter overrides the bytes: a pipe- or latency-limited kernel is not cache-bound
        measured = known["limiter"].notna()
        memory_bound = (memory_bound & ~measured) | (measured & known["bound"].eq("memory"))
        evidence["measured_not_memory_bound_kernels"] = int((measured & ~known["bound"].eq("memory")).sum())
    latency = int((known["limiter"].notna() & known["bound"].eq("latency")).sum()) if "limiter" in known else 0
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
    evidence["below_every_roof_kernels"] = int((~busy).sum()) + latency  # measured latency-bound: below every roof
    caches, needed = caches[busy], needed[busy]
    cache_pct = pct(float(caches["duration_ns"].sum()), total)
    evidence["compute_bound_every_level_time_pct"] = pct(float(known.loc[roof >= peak, "duration_ns"].sum()), total)
    if not len(caches) or cache_pct < CACHE_BOUND_MIN_PCT:
        lead = str(share.index[0])
        return [info("memory-level", f"Hierarchical roofline: {evidence[f'{lead}_bound_time_pct']:.0f}% of the time of "
                     f"{len(known)} kernels with per-level bytes has its lowest memory roof at "
                     f"{LEVEL_NAMES.get(lead, lead)}; {evidence['compute_bound_every_level_time_pct']:.0f}% is "
                     "compute-bound at every level", _lowest_roof_advice(known[memory_bound], lead), **evidence)]
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
    if "limiter" in caches and caches["limiter"].notna().all():  # every one measured: the limiters' own advice
        by_limiter = caches.groupby(caches["limiter"].astype(str))["duration_ns"].sum().sort_values(ascending=False)
        parts = [LIMITER_ADVICE[lim] for lim in by_limiter.index if lim in LIMITER_ADVICE]
        if parts:
            advice = "Measured, not only read from the bytes: cutting HBM bytes will not speed them up. " + " ".join(parts)
    return [ranked(report, "memory-level", title, evidence, advice, at_stake,
                   kernels=tuple(str(n) for n in by_name.index[:TOP]), items=_items(caches, needed))]


def _items(caches: pd.DataFrame, needed: pd.Series) -> tuple[Item, ...]:
    """One item per cache-bound kernel: the time beyond what its level needs to move its bytes (at stake), the
    level, and the measured limiter where there is one (the cause is known only where it was measured)."""
    items = []
    for i in caches.index:
        row = caches.loc[i]
        stake = max(0.0, float(row["duration_ns"]) - float(needed[i])) if np.isfinite(needed[i]) else float("nan")
        level = str(row["bound_level"])
        limiter = row.get("limiter")
        lpct = float(row["limiter_pct"]) if isinstance(limiter, str) and pd.notna(row.get("limiter_pct")) else None
        what = (f"{UNIT_NAMES.get(limiter, limiter)} measured at {lpct:.0f}% of its peak" if lpct is not None
                else f"{LEVEL_NAMES.get(level, level)} is its lowest roof (limiter not measured)")
        items.append(Item("kernel", f"{str(row['name'])[:80]}: {duration(float(row['duration_ns']))} bound at "
                          f"{LEVEL_NAMES.get(level, level)}; {what}", stake, explains=lpct is not None,
                          start_ns=float(row["start_ns"]), end_ns=float(row["end_ns"]),
                          attrs={"bound_level": level, "limiter": limiter if lpct is not None else None,
                                 "limiter_pct": lpct, f"{level}_bytes": float(row.get(f"{level}_bytes", np.nan))
                                 if level != "shared" else float(row.get("shared_bytes", np.nan))}))
    return tuple(items)
