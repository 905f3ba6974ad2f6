"""Kernel rules: far below the bandwidth or matrix roof, latency-bound, FP32 matmuls where tensor cores
apply, measured vs analytic FLOPs that disagree, and kernels doing more work than their op needs.

Kernels are grouped by short name (template arguments dropped) and judged on their totals: total
bytes (or FLOPs) over total time, against the roof of their precision. FP32 GEMMs whose kernel
name shows TF32 tensor-core code (``tf32``, cutlass ``tensorop_s1688``) are judged against the TF32
roof: they already run on tensor cores.

Each group has one bound, the one holding most of its time (``bound``: the measured limiter's where
Nsight Compute or rocprof-compute measured each unit, else the roofline's), so a group is never in a
memory-bound and a compute-bound finding at once. The findings list their groups as ``kernels`` items
with the limiter and its % of peak, and pick their advice from the limiters (:data:`LIMITER_ADVICE`):
a group whose limiter was not measured is listed, but its cause is not known (it counts as unexplained).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import counted, duration
from perfscope.memo import memo
from perfscope.schema import column_codes, text_of, value_mask

from ..costs.limiter import (
    LATENCY_PCT,
    UNIT_COLUMNS,
    UNIT_NAMES,
    bound_label,
    group_limiter,
    limiter_words,
)
from ..costs.roofline import classify
from ..summaries.kernels import group_codes
from ._base import (
    NCU_REPROFILE,
    Finding,
    Item,
    collect_advice,
    explained_ns,
    from_ncu,
    group_key,
    info,
    is_cpu_report,
    pct,
    ranked,
    severity_for,
)
from .matmul_units import MATMUL_CATEGORIES, TF32_NAME, faster_matrix, fp32_matmuls
from .roof_causes import Causes, causes_advice, group_causes
from .timeline import SHORT_KERNEL_NS

if TYPE_CHECKING:
    from perfscope.report import Report

MEMORY_ROOF_LOW_PCT = 50.0
"""A streaming kernel reaches 70-90% of the DRAM roof on current GPUs and CPUs (STREAM-like copy);
a memory-bound kernel group below half of it has a large, reachable gain."""
COMPUTE_ROOF_LOW_PCT = 50.0
"""Large cuBLAS/cutlass GEMMs reach 70-80% of the dense matrix roof; a compute-bound group below
half of it is badly tiled, too small for the machine, or on the wrong unit."""
ROOF_MIN_STAKE_PCT = 1.0
"""Roofline findings need at least 1% of kernel time at stake (fewer is noise in a ranking)."""
TOP_GROUPS = 3
"""How many kernel groups the evidence names."""
ROOFLINE_COLUMNS = ("precision", "arith_intensity", "achieved_flops_per_s", "achieved_bytes_per_s", "bound",
                    "roofline_bound", "roof_flops_per_s", "pct_of_roof")
"""The columns ``classify`` fills, copied back for the re-classified rows."""
FP32_MATMUL_MIN_PCT = 5.0
"""FP32 matmuls worth moving to tensor cores: at least 5% of the kernel time."""
FLOPS_TOLERANCE = 1.25
"""Measured and analytic FLOPs disagree when their ratio leaves [1/1.25, 1.25]: beyond counting
conventions of a few percent (FMA = 2, masked lanes), 25% means a wrong formula, a wrong kernel to
op link, or a different algorithm (ncu half-precision counters differ 2x between versions)."""
FLOPS_MISMATCH_MIN_PCT = 5.0
"""...on at least 5% of the time of the kernels where both are known."""
EXCESS_WORK_RATIO = 1.10
"""A kernel whose measured FLOPs exceed its op's useful work by more than 10% computes what the op
does not need (tiles under a causal mask computed in full, rows padded to the tile); below that,
softmax, epilogues and counter rounding add a few percent."""

TF32_ADVICE = (
    "Move the matmuls to tensor cores: torch.backends.cuda.matmul.allow_tf32 = True (or "
    "torch.set_float32_matmul_precision('high')) keeps FP32 tensors and runs TF32; autocast to bf16 "
    "(torch.autocast('cuda', dtype=torch.bfloat16)) or a bf16 model halves the bytes too. Check the accuracy "
    "of the result after the change.")
LOW_PRECISION_ADVICE = (
    "Move the matmuls to tensor cores: this device's tensor cores run {target}, not FP32, so autocast the "
    "forward pass (torch.autocast('cuda', dtype=torch.float16 / torch.bfloat16)) or convert the model, keeping "
    "FP32 accumulation and loss scaling where training needs it. Check the accuracy after the change.")
CPU_LOW_PRECISION_ADVICE = (
    "This CPU's measured {target} matmul roof is {speedup:.1f}x its FP32 roof (its matrix units run {target}): run "
    "the model in {target} (model.to(torch.bfloat16), or torch.autocast('cpu', dtype=torch.bfloat16)), which "
    "also halves the bytes each decode step reads. Check the accuracy after the change.")



# ---------------------------------------------------------------------------- helpers
def effective_kernels(report: Report) -> pd.DataFrame:
    """The kernel table with TF32 tensor-core GEMMs re-classified against the TF32 roof (computed
    once per Report object: several rules read it; do not modify it)."""
    return memo(report, "rules:effective_kernels", lambda: _effective_kernels(report))


def _effective_kernels(report: Report) -> pd.DataFrame:
    k = report.kernels
    dev = report.device
    if dev is None or "tf32" not in dev.compute or not len(k):
        return k
    fp32_mm = k.index[(k["precision"] == "fp32") & k["category"].isin(MATMUL_CATEGORIES)]
    names = text_of(k.loc[fp32_mm, "name"])
    tf32 = names.index[names.str.contains(TF32_NAME)]
    if not len(tf32):
        return k
    fixed = classify(k.loc[tf32].assign(precision="tf32"), dev)
    out = k.copy()
    for col in ROOFLINE_COLUMNS:
        out.loc[tf32, col] = fixed[col].to_numpy()
    return out


def dominant_bounds(k: pd.DataFrame) -> np.ndarray:
    """Per group code (:func:`group_codes`), the bound holding most of the group's time; None for a group
    without timed rows. A group's launches can differ (one in a prefill, one in a decode): the group is
    judged under one bound, so no group is in a memory-bound and a compute-bound finding at once."""
    def build() -> np.ndarray:
        codes, names = group_codes(k)
        bcodes, bnames = column_codes(k, "bound")
        dur = k["duration_ns"].to_numpy("float64", na_value=0.0)
        ok = (codes >= 0) & (bcodes >= 0)
        nb = max(len(bnames), 1)
        w = np.bincount(codes[ok] * nb + bcodes[ok], weights=dur[ok], minlength=len(names) * nb)
        w = w.reshape(len(names), nb)
        out = np.full(len(names), None, dtype=object)
        has = w.max(axis=1, initial=0.0) > 0
        out[has] = np.asarray(bnames, dtype=object)[w.argmax(axis=1)[has]]
        return out
    return memo(k, "rules:dominant_bounds", build)


def _limiters(k: pd.DataFrame, rows: np.ndarray, group: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Per group (``group``: each row's group 0..n-1), its limiter (the one holding most time), the
    limiter's time-weighted % of peak, and the first launch's position, start and end."""
    dur = k["duration_ns"].to_numpy("float64", na_value=0.0)[rows]
    limiter = np.full(n, None, dtype=object)
    pct_of_peak = np.full(n, np.nan)
    if "limiter" in k and "limiter_pct" in k:
        lcodes, lnames = column_codes(k, "limiter")
        lc = lcodes[rows]
        lpct = pd.to_numeric(k["limiter_pct"], errors="coerce").to_numpy("float64", na_value=np.nan)[rows]
        has = (lc >= 0) & ~np.isnan(lpct)
        if has.any():
            nl = len(lnames)
            w = np.bincount(group[has] * nl + lc[has], weights=dur[has], minlength=n * nl).reshape(n, nl)
            known = w.max(axis=1, initial=0.0) > 0
            limiter[known] = np.asarray(lnames, dtype=object)[w.argmax(axis=1)[known]]
            weight = np.bincount(group[has], weights=dur[has], minlength=n)
            with np.errstate(invalid="ignore", divide="ignore"):
                pct_of_peak = np.bincount(group[has], weights=(dur * lpct)[has], minlength=n) / weight
            pct_of_peak = np.where(known, pct_of_peak, np.nan)
    units = {}
    for col in (*UNIT_COLUMNS, *GROUP_MEANS):  # time-weighted over the launches that measured it
        if col in k:
            v = pd.to_numeric(k[col], errors="coerce").to_numpy("float64", na_value=np.nan)[rows]
            ok = ~np.isnan(v)
            with np.errstate(invalid="ignore", divide="ignore"):
                units[col] = (np.bincount(group[ok], weights=(dur * v)[ok], minlength=n)
                              / np.bincount(group[ok], weights=dur[ok], minlength=n))
    first = np.full(n, -1, dtype=np.int64)
    order = np.argsort(group, kind="stable")
    starts = np.r_[True, group[order][1:] != group[order][:-1]] if len(order) else np.zeros(0, dtype=bool)
    first[group[order][starts]] = rows[order][starts]
    start = k["start_ns"].to_numpy("float64", na_value=np.nan)
    end = k["end_ns"].to_numpy("float64", na_value=np.nan)
    return {"limiter": limiter, "limiter_pct": pct_of_peak, "first": first,
            "start_ns": np.where(first >= 0, start[first], np.nan), "end_ns": np.where(first >= 0, end[first], np.nan),
            **units}


GROUP_MEANS = ("waves_per_sm", "achieved_occupancy_pct", "pct_of_roof")
"""Launch measurements (Nsight Compute) a group carries as time-weighted means, beside each unit's % of peak."""
GROUP_COLUMNS = ["group", "count", "time_ns", "flops", "dram_bytes", "precision", "limiter", "limiter_pct",
                 "first", "start_ns", "end_ns"]


def _group_totals(k: pd.DataFrame, bound: str, *, need_work: bool = True) -> pd.DataFrame:
    """Per group (short name) whose bound is ``bound`` (:func:`dominant_bounds`), over its ``bound``-bound
    rows (with FLOPs and bytes known, unless ``need_work`` is False): count, time, FLOPs and bytes, the
    precision with the most time (ties: the first by name), the limiter and the first launch.

    Grouped on the table's memoized codes (a 1M-kernel table is never copied or re-hashed)."""
    flops = pd.to_numeric(k["flops"], errors="coerce").to_numpy("float64", na_value=np.nan)
    nbytes = pd.to_numeric(k["dram_bytes"], errors="coerce").to_numpy("float64", na_value=np.nan)
    dur = k["duration_ns"].to_numpy("float64", na_value=np.nan)
    codes, names = group_codes(k)
    dominant = dominant_bounds(k)
    mine = np.zeros(len(k), dtype=bool)
    mine[codes >= 0] = dominant[codes[codes >= 0]] == bound
    work = (~np.isnan(flops) & ~np.isnan(nbytes)) if need_work else np.ones(len(k), dtype=bool)
    rows = np.flatnonzero(value_mask(k, "bound", lambda v: v == bound) & work & (dur > 0) & (codes >= 0) & mine)
    if not len(rows):
        return pd.DataFrame(columns=GROUP_COLUMNS)
    group, firsts = pd.factorize(codes[rows])  # groups in order of first appearance
    n = len(firsts)
    # the dominant precision: most time, ties to the first name in sort order (a missing one first)
    prec_codes, prec_names = column_codes(k, "precision")
    by_name = np.argsort(np.asarray([str(v) for v in prec_names], dtype=object), kind="stable")
    rank = np.empty(len(prec_names) + 1, dtype="int64")
    rank[by_name], rank[-1] = np.arange(1, len(prec_names) + 1), 0
    pairs, pair_of = np.unique(group * (len(prec_names) + 1) + rank[prec_codes[rows]], return_inverse=True)
    pair_ns = np.bincount(pair_of, weights=dur[rows])
    pair_group, pair_rank = pairs // (len(prec_names) + 1), pairs % (len(prec_names) + 1)
    order = np.lexsort((pair_rank, -pair_ns, pair_group))
    best = order[np.r_[True, pair_group[order][1:] != pair_group[order][:-1]]]
    values = np.concatenate([[None], np.asarray(prec_names, dtype=object)[by_name]])
    precision = np.full(n, None, dtype=object)
    precision[pair_group[best]] = values[pair_rank[best]]
    with np.errstate(invalid="ignore"):
        return pd.DataFrame({
            "group": np.asarray(names, dtype=object)[firsts], "count": np.bincount(group, minlength=n),
            "time_ns": np.bincount(group, weights=dur[rows], minlength=n),
            "flops": np.bincount(group, weights=np.nan_to_num(flops[rows]), minlength=n) if not need_work
            else np.bincount(group, weights=flops[rows], minlength=n),
            "dram_bytes": np.bincount(group, weights=np.nan_to_num(nbytes[rows]), minlength=n) if not need_work
            else np.bincount(group, weights=nbytes[rows], minlength=n),
            "precision": precision, **_limiters(k, rows, group, n)})


# ---------------------------------------------------------------------------- evidence
LIMITER_ADVICE: dict[str, str] = {
    "alu": "The ALU pipe (integer, logic, bit and compare instructions) is the busiest unit: cut the integer "
           "instruction mix. Hoist index arithmetic out of loops, replace integer division and modulo by shifts "
           "or precomputed reciprocals, give each thread more elements (vectorised) so its index math is "
           "amortised, and move table-like integer work to look-ups; a random-number kernel can use a generator "
           "with fewer rounds or draw fewer numbers per element.",
    "fma": "The FMA pipe (FP32 multiply-add) is the busiest unit: fewer FP32 operations (fused or simplified "
           "math, packed half2/bfloat162 arithmetic where the precision allows).",
    "fma:matmul": "The FMA pipe runs this matmul on the FP32 cores, not the tensor cores: run it on tensor cores "
                  "(TF32 with torch.backends.cuda.matmul.allow_tf32 = True, or BF16/FP16 via autocast; cuBLAS "
                  "and cuDNN pick tensor-core kernels for those), whose roof is many times the FMA pipe's.",
    "fp16": "The FP16 pipe is the busiest unit: packed half2 math is at its limit; a matmul belongs on the tensor "
            "cores (cuBLAS/cuDNN with FP16/BF16 inputs).",
    "fp64": "The FP64 pipe is the busiest unit: compute in FP32 where the precision allows (FP64 runs at 1/2 to "
            "1/64 of the FP32 rate), or on the FP64 tensor cores (DMMA) for matmuls.",
    "tensor": "The tensor pipe is the busiest unit: the matmul already runs on tensor cores near their limit. "
              "What is left is less work (skip masked tiles, no padding) or a lower precision (FP8 where the "
              "accuracy holds).",
    "mfma": "The MFMA units are the busiest: the matmul already runs on matrix cores near their limit. What is "
            "left is less work (skip masked tiles, no padding) or a lower precision (FP8 where the accuracy holds).",
    "xu": "The XU pipe (transcendentals, reciprocals, type conversions) is the busiest unit: use the fast "
          "intrinsics (__expf, __fdividef, exp2 of pre-scaled inputs; -use_fast_math), and fewer conversions "
          "between integer and floating-point types.",
    "lsu": "The LSU pipe (load, store, shared-memory and shuffle instructions) is the busiest unit: issue fewer, "
           "wider memory instructions (16-byte vectorised loads), reuse each loaded value more from registers "
           "(larger per-thread tiles), and keep shared-memory accesses free of bank conflicts.",
    "vmem": "Vector memory instructions (VMEM) are the busiest unit: fewer, wider loads (dwordx4), more reuse of "
            "each loaded value from registers or LDS.",
    "valu": "The VALU (vector integer and floating-point instructions) is the busiest unit: cut the instruction mix. "
            "Hoist index arithmetic out of loops, replace integer division and modulo by shifts or precomputed "
            "reciprocals, use packed math, and draw fewer random numbers (or a generator with fewer rounds) per "
            "element; a matmul belongs on the MFMA units (hipBLASLt, composable kernels).",
    "salu": "The scalar ALU is the busiest unit: less uniform control and address work per wavefront.",
    "uniform": "The uniform datapath is the busiest unit: less warp-uniform address and control arithmetic.",
    "adu": "The ADU (branch targets, address divergence) is the busiest unit: less divergent control flow.",
    "cbu": "The CBU (warp convergence and barriers) is the busiest unit: less divergence, fewer warp-level "
           "synchronisations.",
    "branch": "The branch unit is the busiest: less divergent control flow per wavefront.",
    "tex": "The texture pipe is the busiest unit: fewer texture/surface fetches.",
    "tma": "The TMA unit is the busiest: fewer, larger bulk copies.",
    "sm": "The SM is the busiest unit, but the report has no per-pipe breakdown to say which pipe: collect the "
          "ComputeWorkloadAnalysis section (ncu --section ComputeWorkloadAnalysis) to see it.",
    "dram": "DRAM bandwidth is the limit: move fewer bytes (fuse kernels so each tensor is read once, lower-"
            "precision weights or KV cache), with coalesced, vectorised accesses.",
    "l2": "L2 bandwidth is the limit, not DRAM: reuse data closer to the ALUs (larger tiles in shared memory or "
          "registers, a tile order that keeps a block's inputs in L1), and fewer L2 transactions per byte "
          "(coalesced, vectorised loads).",
    "l1": "L1 bandwidth is the limit: coalesce the accesses (a warp's loads in as few 128-byte lines as "
          "possible), vectorise them, and keep reused data in registers or shared memory.",
    "shared": "Shared memory/LDS bandwidth is the limit: fewer shared-memory round trips (keep values in "
              "registers), no bank conflicts, wider accesses.",
}
"""What to change when each unit limits a kernel (:data:`perfscope.analysis.costs.limiter.UNIT_NAMES`)."""


def limiter_advice(limiter: object, category: object = None) -> str | None:
    """The advice for a kernel limited by ``limiter`` (a matmul on the FMA pipe: tensor cores); None if unknown."""
    if not isinstance(limiter, str):
        return None
    if limiter == "fma" and category in MATMUL_CATEGORIES:
        return LIMITER_ADVICE["fma:matmul"]
    return LIMITER_ADVICE.get(limiter)


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


def group_items(groups: pd.DataFrame, bound: str, stake: str = "stake_ns", *,
                extra: str | None = None) -> tuple[Item, ...]:
    """One ``kernels`` item per group row (:func:`_group_totals`): its time at stake (``stake``), the first
    launch's place, its bound and limiter with each measured unit's % of peak; it explains its time where
    a limiter was measured. ``extra``: a column (a % of roof) the label and attrs add."""
    items = []
    for row in groups.to_dict("records"):
        limiter, lpct = row.get("limiter"), _num(row.get("limiter_pct"))
        measured = isinstance(limiter, str) and np.isfinite(lpct)
        pipe = _num(row.get(f"pipe_{limiter}_pct")) if measured else float("nan")
        more = f", {_num(row[extra]):.2g}% of its roof" if extra and np.isfinite(_num(row.get(extra))) else ""
        label = (f"{str(row['group'])[:80]}: {counted(int(row['count']), 'launch')}, {duration(float(row['time_ns']))}"
                 f"{more}; {bound_label(bound, limiter)}: {limiter_words(limiter, lpct, pipe)}")
        attrs: dict[str, float | int | str | None] = {
            "group": str(row["group"])[:200], "count": int(row["count"]), "group_time_ns": float(row["time_ns"]),
            "bound": bound_label(bound, limiter if measured else None),
            "limiter": limiter if measured else None, "limiter_pct": lpct if measured else None,
        }
        if extra:
            attrs[extra] = _num(row.get(extra))
        for col in UNIT_COLUMNS:
            if np.isfinite(_num(row.get(col))):
                attrs[col] = _num(row[col])
        items.append(Item("kernels" if int(row["count"]) > 1 else "kernel", label, float(row[stake]),
                          explains=measured, start_ns=_num(row.get("start_ns")), end_ns=_num(row.get("end_ns")),
                          attrs=attrs))
    return tuple(items)


def rows_items(k: pd.DataFrame, sub: pd.DataFrame, stake: pd.Series, detail: str, *,
               explains: bool = True) -> tuple[Item, ...]:
    """One ``kernel``/``kernels`` item per group of the kernel rows ``sub`` (of ``k``): the group's time at stake
    (``stake``, per row; NaN where unknown), its first launch's place, its bound and measured limiter;
    ``detail``: what the finding says of them (``FP32 matmul off the tensor cores``)."""
    key = group_key(k).loc[sub.index]
    items = []
    for name, g in sub.groupby(key, sort=False):
        at_stake = float(pd.to_numeric(stake.loc[g.index], errors="coerce").sum(min_count=1))
        time_ns = float(g["duration_ns"].sum())
        limiter, lpct, bound = group_limiter(g)
        measured = f"; {bound_label(bound, limiter)}: {limiter_words(limiter, lpct)}" if limiter else ""
        first = g.index[0]
        items.append(Item("kernels" if len(g) > 1 else "kernel",
                          f"{str(name)[:80]}: {counted(len(g), 'launch')}, {duration(time_ns)}; {detail}{measured}",
                          at_stake, explains=explains, start_ns=float(g.at[first, "start_ns"]),
                          end_ns=float(g.at[first, "end_ns"]),
                          attrs={"group": str(name)[:200], "count": len(g), "group_time_ns": time_ns,
                                 "limiter": limiter, "limiter_pct": lpct if limiter else None,
                                 "bound": bound_label(bound, limiter) if bound else None}))
    return tuple(items)


def advice_from(groups: pd.DataFrame, categories: dict[str, object] | None = None,
                stake: str = "stake_ns") -> list[str]:
    """The distinct limiter advice of the groups, heaviest group first (groups without a limiter add none)."""
    out: list[str] = []
    for row in groups.sort_values(stake, ascending=False, kind="stable").itertuples(index=False):
        text = limiter_advice(getattr(row, "limiter", None), (categories or {}).get(str(row.group)))
        if text and text not in out:
            out.append(text)
    return out


def group_categories(k: pd.DataFrame, groups: pd.DataFrame) -> dict[str, object]:
    """Each group's kernel category (of its first launch)."""
    if "category" not in k or "first" not in groups:
        return {}
    return {str(g): k["category"].iat[int(f)] for g, f in zip(groups["group"], groups["first"]) if int(f) >= 0}


def _top_evidence(top: pd.DataFrame, value: str) -> dict[str, float | int | str]:
    ev: dict[str, float | int | str] = {}
    for i, row in enumerate(top.head(TOP_GROUPS).itertuples(index=False), start=1):
        ev[f"top{i}"] = str(row.group)[:120]
        ev[f"top{i}_pct_of_roof"] = float(getattr(row, value))
        ev[f"top{i}_time_ns"] = float(row.time_ns)
    return ev


def _no_work_info(report: Report, rule: str) -> list[Finding]:
    """Say once why the roofline rules could not judge anything, when that is the case (nothing to say
    for a report without kernels: a load test of an endpoint measures the server from outside)."""
    k = report.kernels
    if not len(k):
        return []
    if not len(k) or k["flops"].notna().any():
        if (report.params or {}).get("gpu_work") is False:
            return []  # nothing ran on the GPU here: the no-gpu-work finding says where it did
        if report.device is None or not report.device.compute:
            roofs = ("The device is not in perfscope's datasheet table (by its name or its properties). "
                     "Classify against known roofs: `perfscope import TRACE --roofs NAME` with a model of "
                     "`perfscope devices --datasheet`, or `--roofs cuda` (measured) on the profiled machine; "
                     "a report folder lends its roofs.")
            return [info(rule, "Roofline rules skipped: no device roofs in this report",
                         f"{NCU_REPROFILE} Or: {roofs[0].lower()}{roofs[1:]}" if from_ncu(report) else roofs)]
        return []
    return [info(rule, "Roofline rules skipped: no FLOPs or bytes for any kernel",
                 collect_advice(report, "This source has no hardware counters or operator shapes. Profile the top "
                                "kernels with {counters} or capture a torch.profiler trace with record_shapes=True."),
                 kernels=len(k))]


# ---------------------------------------------------------------------------- far below the roof
ROOF_EXCEEDED_PCT = 110.0
"""A compute-bound kernel group above this share of its roof means the roof is too low: timing and
FLOP counts are good to well within a tenth, so more than that is not the kernel being fast."""


def memory_below_roof(report: Report) -> list[Finding]:
    """Memory-bound kernel groups far below their memory roof (time-weighted, on their totals): the DRAM roof
    from their bytes, or, where a memory level was measured to limit them, that level's % of its peak (at or
    above 60% by construction: such a group is near its roof and never listed)."""
    dev = report.device
    bw = dev.peak_bandwidth("dram") if dev else None
    k = effective_kernels(report)
    if not bw or not k["flops"].notna().any():
        return _no_work_info(report, "roofline-unchecked")
    groups = _group_totals(k, "memory")
    measured = pd.to_numeric(groups["limiter_pct"], errors="coerce")
    groups["pct_of_roof"] = measured.where(measured.notna(), groups["dram_bytes"] / (groups["time_ns"] * 1e-9) / bw * 100.0)
    return _below_roof(report, k, groups, "memory-below-roof", "DRAM bandwidth", MEMORY_ROOF_LOW_PCT, {
        "dram_roof_bytes_per_s": float(bw), "dram_roof_provenance": dev.memory["dram"].provenance if dev else ""})


def _compute_groups(report: Report) -> pd.DataFrame | None:
    """The compute-bound kernel groups' totals with their % of their precision's roof; None when
    the report has no compute roofs or no FLOPs."""
    dev = report.device
    k = effective_kernels(report)
    if dev is None or not dev.compute or not k["flops"].notna().any():
        return None
    groups = _group_totals(k, "compute")
    peaks = groups["precision"].map(lambda p: dev.peak_flops(p if isinstance(p, str) else None))
    groups["pct_of_roof"] = groups["flops"] / (groups["time_ns"] * 1e-9) / pd.to_numeric(peaks) * 100.0
    return groups


def compute_below_roof(report: Report) -> list[Finding]:
    """Compute-bound kernel groups far below the compute roof of their precision; where a pipe was measured
    to limit them, the advice is that pipe's (an ALU-bound kernel's FLOP rate is low because its work is
    integer instructions, a matmul on the FMA pipe is not on the tensor cores)."""
    groups = _compute_groups(report)
    if groups is None:
        return []
    return _below_roof(report, effective_kernels(report), groups, "compute-below-roof", "compute roof",
                       COMPUTE_ROOF_LOW_PCT, {})


def _at_stake(report: Report, groups: pd.DataFrame, share: str) -> tuple[pd.DataFrame | None, float, float]:
    """The groups of mean launch >= 5 µs (shorter ones are the short-kernels rule's), each with its time at stake
    ``time x (1 - share/100)``, most first; the kernel time and the total at stake. None for the groups when
    nothing is left or the stake is under :data:`ROOF_MIN_STAKE_PCT` of the kernel time."""
    kernel_ns = float(report.kernels["duration_ns"].sum())
    if not len(groups):
        return None, kernel_ns, 0.0
    kept = groups[groups["time_ns"] / groups["count"] >= SHORT_KERNEL_NS].copy()
    kept["stake_ns"] = kept["time_ns"] * (1.0 - pd.to_numeric(kept[share], errors="coerce") / 100.0)
    kept = kept.sort_values("stake_ns", ascending=False, kind="stable")
    at_stake = float(kept["stake_ns"].sum())
    if not len(kept) or not pct(at_stake, kernel_ns) >= ROOF_MIN_STAKE_PCT:
        return None, kernel_ns, at_stake
    return kept, kernel_ns, at_stake


def _with_causes(item: Item, c: Causes) -> Item:
    """A group item whose limiter was not measured, with what its trace evidence shows (:func:`group_causes`): it
    explains its time when a cause is named, else it says that nothing in the trace does."""
    said = "; ".join(c.clauses) if c.advice else "nothing in the trace explains it"
    attrs = {**item.attrs, **{a: v for a, v in c.attrs.items() if v is not None}, "causes": ", ".join(c.advice) or None}
    return replace(item, label=f"{item.label}; {said}", explains=bool(c.advice), attrs=attrs)


def _below_roof(report: Report, k: pd.DataFrame, groups: pd.DataFrame, rule: str, roof: str, low_pct: float,
                extra: dict[str, float | int | str]) -> list[Finding]:
    below, kernel_ns, at_stake = _at_stake(report, groups[groups["pct_of_roof"] < low_pct], "pct_of_roof")
    if below is None:
        return []
    time_ns = float(below["time_ns"].sum())
    weighted = float((below["pct_of_roof"] * below["time_ns"]).sum() / time_ns)
    evidence: dict[str, float | int | str] = {
        "kernel_groups_below": len(below), "time_ns": time_ns,
        "time_pct_of_kernel_time": pct(time_ns, kernel_ns),
        "time_weighted_pct_of_roof": weighted, "threshold_pct_of_roof": low_pct, **extra,
    }
    evidence.update(_top_evidence(below, "pct_of_roof"))
    bound = rule.split("-")[0]
    top = below.iloc[0]
    unit = "operator" if is_cpu_report(report) else "kernel"
    title = (f"{counted(len(below), f'{bound}-bound {unit} group')} run{'s' if len(below) == 1 else ''} at "
             f"{weighted:.2g}% of the {roof} "
             f"({duration(time_ns)}); worst: {str(top['group'])[:60]} at {top['pct_of_roof']:.2g}%")
    if isinstance(top["limiter"], str):
        title += ", " + limiter_words(top["limiter"], top["limiter_pct"], top.get(f"pipe_{top['limiter']}_pct"))
    items = group_items(below, bound, extra="pct_of_roof")
    parts = advice_from(below, group_categories(k, below))
    unmeasured = [n for n, i in enumerate(items) if not i.explains]
    if unmeasured:  # groups whose limiter was not measured: the causes their trace evidence shows, or none
        rows = below.iloc[unmeasured]
        causes = group_causes(report, k, rows, bound)
        by_row = dict(zip(unmeasured, causes))
        items = tuple(_with_causes(i, by_row[n]) if n in by_row else i for n, i in enumerate(items))
        parts += causes_advice(report, causes, [float(v) for v in rows["stake_ns"]], [str(g) for g in rows["group"]])
    return [ranked(report, rule, title, evidence, " ".join(parts), at_stake,
                   kernels=tuple(str(g) for g in below["group"].head(TOP_GROUPS)), items=items)]


# ---------------------------------------------------------------------------- latency-bound
LATENCY_ADVICE_WAVES = 1.0
"""A grid of fewer waves than this leaves SMs idle for part of the kernel (Nsight Compute's "Small Grid")."""


def latency_bound(report: Report) -> list[Finding]:
    """Kernel groups where Nsight Compute or rocprof-compute measured no unit at 60% of its peak: neither
    compute nor memory limits them, so faster units will not help; more parallel work in flight will.

    The time at stake is what running their busiest unit at its peak would save (``time x (1 - its %)``)."""
    k = effective_kernels(report)
    if "limiter" not in k or is_cpu_report(report):
        return []
    groups = _group_totals(k, "latency", need_work=False)
    found, kernel_ns, at_stake = _at_stake(report, groups, "limiter_pct")
    if found is None:
        return []
    groups = found
    time_ns = float(groups["time_ns"].sum())
    evidence: dict[str, float | int | str] = {
        "kernel_groups_latency_bound": len(groups), "time_ns": time_ns,
        "time_pct_of_kernel_time": pct(time_ns, kernel_ns), "threshold_pct_of_peak": LATENCY_PCT}
    for i, row in enumerate(groups.head(TOP_GROUPS).itertuples(index=False), start=1):
        evidence[f"top{i}"] = str(row.group)[:120]
        evidence[f"top{i}_limiter"] = str(row.limiter)
        evidence[f"top{i}_limiter_pct"] = float(row.limiter_pct)
        evidence[f"top{i}_time_ns"] = float(row.time_ns)
    top = groups.iloc[0]
    title = (f"{counted(len(groups), 'kernel group')} {'is' if len(groups) == 1 else 'are'} latency-bound "
             f"({duration(time_ns)}, {pct(time_ns, kernel_ns):.3g}% "
             f"of kernel time): no unit reaches {LATENCY_PCT:.0f}% of its peak; worst: {str(top['group'])[:60]} "
             f"(busiest: {UNIT_NAMES.get(str(top['limiter']), top['limiter'])} at {top['limiter_pct']:.0f}%)")
    return [ranked(report, "latency-bound", title, evidence, _latency_advice(k, groups), at_stake,
                   kernels=tuple(str(g) for g in groups["group"].head(TOP_GROUPS)),
                   items=group_items(groups, "latency"))]


def _latency_advice(k: pd.DataFrame, groups: pd.DataFrame) -> str:
    """More parallel work or occupancy, as far as the groups' measurements say which (heaviest group first)."""
    from .occupancy import OCCUPANCY_LOW_PCT, ROOF_OK_PCT, STALL_ADVICE, group_stalls

    heavy = groups.head(TOP_GROUPS)
    parts = ["No unit of the GPU is near its peak: the kernels wait on latency (too little work in flight), so "
             "faster memory or math will not help; more parallel work will."]
    waves = pd.to_numeric(heavy.get("waves_per_sm"), errors="coerce") if "waves_per_sm" in heavy else None
    if waves is not None and (waves < LATENCY_ADVICE_WAVES).any():
        names = ", ".join(str(g)[:40] for g in heavy.loc[waves < LATENCY_ADVICE_WAVES, "group"])
        parts.append(f"The grid of {names} fills under one wave of the SMs ({waves.min():.2f}): launch more blocks "
                     "(smaller tiles, split-K or stream-K, more requests per batch) so every SM has work.")
    occ = (pd.to_numeric(heavy.get("achieved_occupancy_pct"), errors="coerce")
           if "achieved_occupancy_pct" in heavy else pd.Series(np.nan, index=heavy.index))
    roof = pd.to_numeric(heavy.get("pct_of_roof"), errors="coerce") if "pct_of_roof" in heavy else occ * np.nan
    low = (occ < OCCUPANCY_LOW_PCT) & ~(roof >= ROOF_OK_PCT)  # near its roof, occupancy is by design (occupancy.py)
    if low.any():
        names = ", ".join(str(g)[:40] for g in heavy.loc[low, "group"])
        parts.append(f"{names} run(s) at {occ[low].min():.0f}% achieved occupancy: more warps per SM hide latency "
                     "(fewer registers per thread, less shared memory per block, or more blocks).")
    codes, _ = group_codes(k)
    first = int(heavy["first"].iloc[0])
    stalls = group_stalls(k.iloc[np.flatnonzero(codes == codes[first])]) if first >= 0 else []
    if stalls:
        reason = stalls[0][0]
        parts.append(f"The warps of {str(heavy['group'].iloc[0])[:40]} stall most on {reason}: "
                     f"{STALL_ADVICE.get(reason, 'see the WarpStateStatistics section')}.")
    if len(parts) == 1:
        parts.append("Give each thread more independent work (unrolled loops, several loads in flight), or batch "
                     "more work into each launch.")
    return " ".join(parts)


# ---------------------------------------------------------------------------- above the roof
def roof_exceeded(report: Report) -> list[Finding]:
    """Compute-bound kernel groups above their compute roof: the roofs are too low, not the kernels fast.

    Only compute-bound groups: FLOPs are FLOPs, while a memory-bound kernel may beat the DRAM roof
    legitimately when its data sits in a cache (analytic bytes count every access)."""
    groups = _compute_groups(report)
    dev = report.device
    if groups is None or dev is None:
        return []
    over = groups[groups["pct_of_roof"] > ROOF_EXCEEDED_PCT].sort_values("pct_of_roof", ascending=False, kind="stable")
    if not len(over):
        return []
    top = over.iloc[0]
    precision = top["precision"] if isinstance(top["precision"], str) else None
    roof = dev.compute.get(precision or "fp32")
    evidence: dict[str, float | int | str] = {
        "kernel_groups_above_roof": len(over), "time_ns": float(over["time_ns"].sum()),
        "threshold_pct_of_roof": ROOF_EXCEEDED_PCT, "worst_pct_of_roof": float(top["pct_of_roof"]),
        "worst_precision": precision or "unknown",
        "worst_roof_flops_per_s": float(roof.value) if roof else math.nan,
        "worst_roof_provenance": roof.provenance if roof else "unknown",
        "worst_roof_method": (roof.method or "")[:120] if roof else "",
    }
    measured_at = dev.properties.get("measured_at")
    if measured_at:
        evidence["roofs_measured_at"] = str(measured_at)
    evidence.update(_top_evidence(over, "pct_of_roof"))
    unit = "operator" if is_cpu_report(report) else "kernel"
    title = (f"{counted(len(over), f'compute-bound {unit} group')} run{'s' if len(over) == 1 else ''} above "
             f"{'its' if len(over) == 1 else 'their'} roof (up to {top['pct_of_roof']:.0f}%): "
             f"the {precision or 'compute'} roof of {dev.name} is too low")
    advice = ("No kernel runs faster than the hardware's peak, so these roofs understate the device, and every bound "
              "and % of roof in this report is suspect. Roofs measured while other work was running (perfscope "
              "caches them per machine), a throttled clock during the measurement, or another device's roofs do "
              "this. Measure again on an idle machine with `perfscope devices --refresh` and profile again, or "
              "classify against the right roofs (`perfscope import FILE --roofs cuda|REPORT`).")
    items = tuple(replace(i, explains=True) for i in group_items(over, "compute", stake="time_ns", extra="pct_of_roof"))
    return [Finding("roof-exceeded", "medium", title, evidence, advice, math.nan,
                    tuple(str(g) for g in over["group"].head(TOP_GROUPS)), items=items,
                    explained_ns=explained_ns(items, math.nan))]


# ---------------------------------------------------------------------------- FP32 matmuls
def fp32_matmul(report: Report) -> list[Finding]:
    """FP32 GEMM/attention kernels on a device whose tensor cores run TF32/BF16/FP16 much faster.

    The time at stake is what the kernels with known FLOPs and bytes would save at the faster
    roof (max of FLOPs / matrix roof and bytes / DRAM roof), plus, for kernels without FLOPs, a bound:
    ``1 - 1/speedup`` of their time, what they save if the FP32 pipe limits them (the title says which
    part is a bound, and ``at_stake_bound_ns`` holds it).
    """
    dev = report.device
    target = faster_matrix(dev)
    if target is None or dev is None:
        return []
    mm = fp32_matmuls(effective_kernels(report))
    kernel_ns = float(report.kernels["duration_ns"].sum())
    time_ns = float(mm["duration_ns"].sum())
    if not len(mm) or not pct(time_ns, kernel_ns) >= FP32_MATMUL_MIN_PCT:
        return []
    known = mm[mm["flops"].notna() & mm["dram_bytes"].notna()]
    bw = dev.peak_bandwidth("dram") or math.inf
    floor_ns = np.maximum(known["flops"] / dev.compute[target].value, known["dram_bytes"] / bw) * 1e9
    speedup = dev.compute[target].value / dev.compute["fp32"].value
    saved = pd.Series(np.nan, index=mm.index)
    saved.loc[known.index] = (known["duration_ns"] - floor_ns).clip(lower=0)
    unknown = mm.index.difference(known.index)
    # Without FLOPs the saving is bounded, not measured: a kernel limited by the FP32 pipe saves at most
    # 1 - 1/speedup of its time at the faster roof (one limited by its bytes saves less).
    saved.loc[unknown] = mm.loc[unknown, "duration_ns"] * (1.0 - 1.0 / speedup)
    at_stake = float(saved.sum()) if len(mm) else math.nan
    bounded_ns = float(saved.loc[unknown].sum())
    evidence: dict[str, float | int | str] = {
        "fp32_matmul_kernels": len(mm), "fp32_matmul_time_ns": time_ns,
        "time_pct_of_kernel_time": pct(time_ns, kernel_ns), "kernels_with_flops": len(known),
        "time_with_flops_ns": float(known["duration_ns"].sum()),
        "fp32_roof_flops_per_s": float(dev.compute["fp32"].value), "target_precision": target,
        "target_roof_flops_per_s": float(dev.compute[target].value), "roof_ratio": speedup,
        "time_at_target_roof_ns": float(floor_ns.sum()),
        "kernels_without_flops": len(unknown), "at_stake_bound_ns": bounded_ns,
    }
    if dev.kind == "cpu":
        title = (f"{len(mm)} matmul operators run in FP32 ({duration(time_ns)}, {pct(time_ns, kernel_ns):.3g}% of "
                 f"operator time); this CPU's {target} roof is {speedup:.1f}x its FP32 roof")
        advice = CPU_LOW_PRECISION_ADVICE.format(target=target, speedup=speedup)
    else:
        title = (f"{len(mm)} matmul kernels run in FP32 off the tensor cores ({duration(time_ns)}, "
                 f"{pct(time_ns, kernel_ns):.3g}% of kernel time); the {target} roof is {speedup:.0f}x the FP32 roof")
        advice = TF32_ADVICE if target == "tf32" else LOW_PRECISION_ADVICE.format(target=target)
    if len(unknown):  # the stake (printed after the title) is partly or wholly a bound: say which
        title += ("; the stake is an upper bound: no FLOPs recorded, the kernels taken as limited by the FP32 pipe"
                  if len(unknown) == len(mm) else
                  f"; {duration(bounded_ns)} of the stake is an upper bound: {len(unknown)} of them have no FLOPs "
                  "recorded and are taken as limited by the FP32 pipe")
    kernels = tuple(_top_by_time(mm))[:TOP_GROUPS]
    units = "the CPU's matrix units" if dev.kind == "cpu" else "the tensor cores"  # a CPU report has no GPU words
    items = rows_items(effective_kernels(report), mm, saved, f"FP32 matmul off {units} ({target} roof "
                       f"{speedup:.0f}x)")
    other = [i for i in items if isinstance(i.attrs.get("limiter"), str) and i.attrs["limiter"] not in ("fma", "fp16")]
    if other:  # measured: what limits the heaviest of them is not the FP32 pipe, so the roof ratio overstates the gain
        i = max(other, key=lambda x: x.attrs.get("group_time_ns") or 0)
        advice += (f" Measured: {i.attrs['group']} is {i.attrs['bound']} ({limiter_words(i.attrs['limiter'], i.attrs['limiter_pct'])}), "
                   "not limited by the FP32 pipe, so it gains less than the roof ratio.")
    return [ranked(report, "fp32-matmul", title, evidence, advice, at_stake, kernels=kernels, items=items)]


def _top_by_time(k: pd.DataFrame) -> list[str]:
    return list(k.groupby(group_key(k))["duration_ns"].sum().sort_values(ascending=False).index)


# ---------------------------------------------------------------------------- measured vs analytic
def flops_mismatch(report: Report) -> list[Finding]:
    """Kernels whose measured FLOPs (ncu) and analytic FLOPs (op shapes) disagree beyond tolerance."""
    k = report.kernels
    # the engine's useful-work model differs from the kernel's work on purpose: excess_work judges those
    both = k[(k["flops"] > 0) & (k["flops_analytic"] > 0) & k["analytic_source"].ne("engine")]
    if not len(both):
        return []
    ratio = both["flops"] / both["flops_analytic"]
    off = both[(ratio > FLOPS_TOLERANCE) | (ratio < 1.0 / FLOPS_TOLERANCE)]
    both_ns = float(both["duration_ns"].sum())
    off_ns = float(off["duration_ns"].sum())
    if not len(off) or not pct(off_ns, both_ns) >= FLOPS_MISMATCH_MIN_PCT:
        return []
    off_ratio = ratio.loc[off.index]
    worst = off_ratio.map(lambda r: abs(math.log(r))).idxmax()
    evidence: dict[str, float | int | str] = {
        "kernels_compared": len(both), "kernels_disagreeing": len(off),
        "disagreeing_time_pct": pct(off_ns, both_ns),
        "median_measured_over_analytic": float(off_ratio.median()),
        "worst_kernel": str(k.loc[worst, "name"])[:120],
        "worst_measured_flops": float(k.loc[worst, "flops"]), "worst_analytic_flops": float(k.loc[worst, "flops_analytic"]),
        "tolerance_ratio": FLOPS_TOLERANCE,
    }
    title = (f"Measured and analytic FLOPs disagree on {len(off)} of {len(both)} kernels "
             f"(median ratio {float(evidence['median_measured_over_analytic']):.3g}x)")
    advice = ("Do not trust either roofline position for these kernels until the counts agree. A ratio near 2x "
              "or 0.5x is usually a counting convention (FMA = 2 FLOPs, ncu's half-precision counters); other "
              "ratios mean the kernel was linked to the wrong operator, the operator's formula misses work "
              "(masking, padding, recomputation), or the library ran a different algorithm.")
    severity = severity_for(off_ns, float(k["duration_ns"].sum()))
    items = rows_items(k, off, pd.Series(np.nan, index=off.index),
                       f"measured / analytic FLOPs {float(off_ratio.median()):.3g}x (median)", explains=False)
    return [Finding("flops-mismatch", severity, title, evidence, advice, math.nan,
                    kernels=tuple(str(n) for n in _top_by_time(off))[:TOP_GROUPS], items=items)]


# ---------------------------------------------------------------------------- excess work
EXCESS_WORK_ADVICE = {
    "attention": "The attention kernel computes the masked half of the scores too: an explicit attn_mask makes "
                 "SDPA run every tile. Pass is_causal=True (no mask) when the mask is causal, so flash kernels "
                 "skip the masked tiles (about half the work of a prefill from position 0).",
    "gemm": "The GEMM does more than 2*M*N*K: its tile pads a small M (decode rows) or N. Batch more rows per "
            "step, or let the library pick a GEMV / small-M kernel (cuBLASLt heuristics, torch.compile).",
}


def excess_work(report: Report) -> list[Finding]:
    """Kernels whose measured FLOPs exceed their op's analytic (useful) FLOPs by more than 10%."""
    k = report.kernels
    both = k[(k["flops"] > 0) & (k["flops_analytic"] > 0)]
    over = both[both["flops"] > EXCESS_WORK_RATIO * both["flops_analytic"]]
    if not len(over):
        return []
    ratio = over["flops"] / over["flops_analytic"]
    wasted_ns = over["duration_ns"] * (1.0 - 1.0 / ratio)  # at the same rate, on the useful work only
    worst = wasted_ns.idxmax()
    op = k.loc[worst, "analytic_op"]
    kinds = [str(c) for c in over["category"].dropna().unique() if c in EXCESS_WORK_ADVICE]
    evidence: dict[str, float | int | str] = {
        "kernels_compared": len(both), "kernels_over": len(over),
        "excess_flops": float((over["flops"] - over["flops_analytic"]).sum()),
        "worst_kernel": str(k.loc[worst, "name"])[:120], "worst_op": op if isinstance(op, str) else "",
        "worst_measured_flops": float(k.loc[worst, "flops"]), "worst_analytic_flops": float(k.loc[worst, "flops_analytic"]),
        "worst_ratio": float(ratio.loc[worst]), "threshold_ratio": EXCESS_WORK_RATIO,
    }
    title = (f"{len(over)} of {len(both)} kernels do more work than their op needs: {group_key(k.loc[[worst]]).iloc[0]} "
             f"{float(ratio.loc[worst]):.2f}x the analytic FLOPs"
             + (f" ({evidence['worst_op']})" if evidence["worst_op"] else ""))
    advice = " ".join(EXCESS_WORK_ADVICE[c] for c in sorted(kinds)) or (
        "Compare the kernel's algorithm with the op: padding, recomputation or masked work the op does not need.")
    items = rows_items(k, over, wasted_ns, f"measured FLOPs {float(ratio.median()):.2f}x its op's (median)")
    return [ranked(report, "excess-work", title, evidence, advice, float(wasted_ns.sum()),
                   kernels=tuple(str(n) for n in _top_by_time(over))[:TOP_GROUPS], items=items)]
