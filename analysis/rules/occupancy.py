"""Occupancy and warp stalls, from Nsight Compute reports: kernel groups whose achieved occupancy is
low, why (launch limits or a small/unbalanced grid), and their dominant warp-stall reasons.

The ncu reader adds ``achieved_occupancy_pct``, ``theoretical_occupancy_pct`` and, per launch, the
top stall reasons ``stall_top{1,2,3}`` with ``stall_top{1,2,3}_ratio`` (cycles stalled per issued
instruction). Other sources have none of these columns, so the rule stays silent on them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import counted, duration

from ..costs.limiter import LATENCY_PCT, UNIT_NAMES, bound_label, group_limiter
from ._base import Finding, Item, explained_ns, group_key, is_cpu_report, pct, severity_for

if TYPE_CHECKING:
    from perfscope.report import Report

OCCUPANCY_LOW_PCT = 25.0
"""Achieved occupancy (active warps / maximum) below a quarter leaves too few warps to hide memory
latency on NVIDIA GPUs (the CUDA best-practices guide's latency-hiding argument)."""
OCCUPANCY_MIN_TIME_PCT = 1.0
"""Kernel groups with under 1% of the kernel time are not reported: an ncu report holds only the
kernels someone chose to profile, so anything above that is worth a line."""
ACHIEVED_VS_THEORETICAL = 0.6
"""Achieved below 60% of theoretical occupancy points at the grid (too few blocks, tail effect)
rather than at the per-block resource limits."""
ROOF_OK_PCT = 50.0
"""A kernel group at or above half of its roof is not slowed by its occupancy: Hopper's
warp-specialized wgmma kernels (cuBLAS ``nvjet``, cuDNN flash) run at 10-20% occupancy by design
and still reach 50-80% of the tensor roof. Such a group's finding is ``info``, not a fix to make; so is a
group whose measured limiter (a pipe or a memory level at 60% or more of its peak) is what limits it."""
STALL_RANKS = 3
"""The ncu reader keeps the top three stall reasons per launch."""
STALL_ADVICE = {
    "long_scoreboard": "waiting on global/local memory loads: improve coalescing and reuse (shared memory "
                       "tiling, L2-friendly ordering), keep more loads in flight",
    "short_scoreboard": "waiting on shared memory or special-function results: avoid bank conflicts, cut "
                        "shared-memory round trips",
    "mio_throttle": "the memory-input/output queue is full (shared memory, special math): fewer, wider "
                    "shared-memory accesses",
    "lg_throttle": "the local/global memory queue is full: use wider (vectorised) loads, fewer of them",
    "math_pipe_throttle": "a math pipe is saturated: the kernel is compute-bound there; use tensor cores or "
                          "a cheaper instruction mix",
    "barrier": "warps wait at __syncthreads: balance the work between barriers, fewer barriers",
    "membar": "memory fences: drop unneeded __threadfence / atomics ordering",
    "branch_resolving": "branch resolution: reduce divergent control flow",
    "no_instruction": "instruction cache misses: smaller unrolled code, fewer kernel variants",
    "wait": "fixed-latency dependencies: more independent instructions (ILP) between dependent ones",
    "not_selected": "eligible warps not picked: the scheduler has enough warps (not a problem by itself)",
    "dispatch_stall": "dispatch stalls: pipeline conflicts in the dispatcher",
    "drain": "draining memory stores at exit",
    "imc_miss": "constant-cache misses: keep kernel parameters/constants small and uniform",
    "tex_throttle": "the texture pipe is full: fewer texture/surface accesses",
    "sleeping": "warps sleeping (nanosleep, cooperative waits)",
    "gmma": "waiting on warpgroup MMA (Hopper): feed the tensor cores faster (TMA, deeper pipelining)",
}
"""What each ncu warp-stall reason means and the usual fix (WarpStateStatistics section)."""


def occupancy_stalls(report: Report) -> list[Finding]:
    """Kernel groups with low achieved occupancy, and each one's dominant warp-stall reasons."""
    k = report.kernels
    if "achieved_occupancy_pct" not in k.columns or is_cpu_report(report):
        return []
    kernel_ns = float(k["duration_ns"].sum())
    k = k[pd.to_numeric(k["achieved_occupancy_pct"], errors="coerce").notna()]
    findings = []
    for group, g in k.groupby(group_key(k), sort=False):
        time_ns = float(g["duration_ns"].sum())
        occ = float(np.average(g["achieved_occupancy_pct"].astype("float64"), weights=_weights(g)))
        if occ < OCCUPANCY_LOW_PCT and pct(time_ns, kernel_ns) >= OCCUPANCY_MIN_TIME_PCT:
            findings.append(_occupancy_finding(str(group), g, occ, time_ns, kernel_ns))
    return findings


def _weights(g: pd.DataFrame) -> np.ndarray:
    return g["duration_ns"].astype("float64").clip(lower=1).to_numpy()


def group_stalls(g: pd.DataFrame) -> list[tuple[str, float]]:
    """Stall reasons of a kernel group, by time-weighted mean ratio over the launches that name them."""
    total: dict[str, float] = defaultdict(float)
    weight: dict[str, float] = defaultdict(float)
    for rank in range(1, STALL_RANKS + 1):
        reason, ratio = f"stall_top{rank}", f"stall_top{rank}_ratio"
        if reason not in g or ratio not in g:
            continue
        for name, value, w in zip(g[reason], pd.to_numeric(g[ratio], errors="coerce"), _weights(g)):
            if isinstance(name, str) and name and math.isfinite(value):
                total[name] += value * w
                weight[name] += w
    means = {name: total[name] / weight[name] for name in total}
    return sorted(means.items(), key=lambda kv: -kv[1])


def _occupancy_finding(group: str, g: pd.DataFrame, occ: float, time_ns: float, kernel_ns: float) -> Finding:
    evidence: dict[str, float | int | str] = {
        "kernel": group[:120], "launches": len(g), "time_ns": time_ns,
        "time_pct_of_kernel_time": pct(time_ns, kernel_ns), "achieved_occupancy_pct": occ,
    }
    theo = pd.to_numeric(g.get("theoretical_occupancy_pct"), errors="coerce") if "theoretical_occupancy_pct" in g else None
    if theo is not None and theo.notna().any():
        evidence["theoretical_occupancy_pct"] = float(np.average(theo.fillna(0), weights=_weights(g)))
    for col in ("registers_per_thread", "shared_mem_bytes"):
        if col in g and g[col].notna().any():
            evidence[col] = float(g[col].dropna().astype("float64").median())
    if "block" in g and g["block"].notna().any():
        evidence["block"] = str(g["block"].dropna().iloc[0])
    stalls = group_stalls(g)[:2]
    for i, (name, value) in enumerate(stalls, start=1):
        evidence[f"stall{i}"] = name
        evidence[f"stall{i}_cycles_per_issue"] = value
    reasons = "; ".join(f"{name}: {STALL_ADVICE.get(name, 'see the ncu WarpStateStatistics section')}"
                        for name, _ in stalls)
    title = (f"{group[:60]} runs at {occ:.0f}% achieved occupancy ({duration(time_ns)}, "
             f"{pct(time_ns, kernel_ns):.3g}% of kernel time)" + (f"; top stall: {stalls[0][0]}" if stalls else ""))
    roof = _roof_pct(g)
    if not math.isnan(roof):
        evidence["pct_of_roof"] = roof
    limiter, limiter_pct, bound = group_limiter(g)
    if limiter is not None:
        evidence["limiter"], evidence["limiter_pct"] = limiter, limiter_pct
    items = (_item(group, g, time_ns, limiter, limiter_pct, bound, occ),)
    stalls_text = f" Dominant stalls - {reasons}." if reasons else ""
    if limiter is not None and limiter_pct >= LATENCY_PCT:
        advice = (f"Its {UNIT_NAMES.get(limiter, limiter)} already runs at {limiter_pct:.0f}% of its peak "
                  f"({bound_label(bound, limiter)}): its occupancy is not what limits it, that unit is; look at other "
                  "kernels first." + stalls_text)
        return Finding("occupancy-stalls", "info", title, evidence, advice, math.nan, kernels=(group,), items=items,
                       explained_ns=explained_ns(items, math.nan))
    if roof >= ROOF_OK_PCT:
        advice = (f"It already runs at {roof:.0f}% of its roof, so its occupancy is not what limits it (warp-"
                  "specialized tensor-core kernels keep few warps resident by design); look at other kernels "
                  "first." + stalls_text)
        return Finding("occupancy-stalls", "info", title, evidence, advice, math.nan, kernels=(group,), items=items,
                       explained_ns=explained_ns(items, math.nan))
    lead = (f"No unit reaches {LATENCY_PCT:.0f}% of its peak (latency-bound): more warps in flight hide the latency. "
            if limiter is not None else "")
    advice = lead + _limiter(evidence, occ) + stalls_text
    return Finding("occupancy-stalls", severity_for(time_ns, kernel_ns), title, evidence, advice, math.nan,
                   kernels=(group,), items=items, explained_ns=explained_ns(items, math.nan))


def _item(group: str, g: pd.DataFrame, time_ns: float, limiter: str | None, limiter_pct: float,
          bound: str | None, occ: float) -> Item:
    what = (f"{bound_label(bound, limiter)}: {UNIT_NAMES.get(limiter, limiter)} at {limiter_pct:.0f}% of peak"
            if limiter is not None else "limiter not measured")
    first = g.index[0]
    return Item("kernels" if len(g) > 1 else "kernel",
                f"{group[:80]}: {counted(len(g), 'launch')}, {duration(time_ns)}, {occ:.0f}% achieved occupancy; {what}",
                time_ns, explains=limiter is not None,
                start_ns=float(g.at[first, "start_ns"]) if "start_ns" in g else math.nan,
                end_ns=float(g.at[first, "end_ns"]) if "end_ns" in g else math.nan,
                attrs={"group": group[:200], "count": len(g), "achieved_occupancy_pct": occ, "limiter": limiter,
                       "limiter_pct": limiter_pct if limiter is not None else None,
                       "bound": bound_label(bound, limiter) if bound else None})


def _roof_pct(g: pd.DataFrame) -> float:
    """Time-weighted % of roof of a kernel group (NaN when no launch has one)."""
    if "pct_of_roof" not in g:
        return math.nan
    roof = pd.to_numeric(g["pct_of_roof"], errors="coerce").astype("float64")
    ok = roof.notna().to_numpy()
    return float(np.average(roof[ok], weights=_weights(g)[ok])) if ok.any() else math.nan


def _limiter(ev: dict[str, float | int | str], occ: float) -> str:
    theo = ev.get("theoretical_occupancy_pct")
    if isinstance(theo, float) and theo > 0 and occ < ACHIEVED_VS_THEORETICAL * theo:
        return (f"Achieved occupancy is far below the theoretical {theo:.0f}%: the grid is too small or "
                "unbalanced (tail effect, too few blocks per SM); launch more, smaller blocks or use a "
                "persistent/stream-K schedule.")
    regs = ev.get("registers_per_thread")
    detail = f" ({regs:.0f} registers per thread)" if isinstance(regs, float) else ""
    return (f"Occupancy is limited at launch{detail}: fewer registers per thread (__launch_bounds__, "
            "-maxrregcount), less shared memory per block, or a block size that packs more warps per SM.")
