"""The measured limiter of a kernel: the unit with the highest share of its peak, and the bound it gives.

Where Nsight Compute or rocprof-compute measured the throughput of each unit of the GPU, a kernel's
bound is read from those measurements instead of from its FLOPs and bytes (docs/findings.md, "The
limiter rule"):

- the units are the SM (CU) with its pipes (ALU, FMA, FP16, FP64, tensor/MFMA, XU, LSU, ...) and the
  memory levels (L1/vL1D, shared/LDS, L2, DRAM/HBM), each as a % of its own peak (the kernel-table
  columns of :data:`UNIT_COLUMNS` and :data:`PIPE_COLUMNS`);
- the limiter is the unit with the highest share. When the SM (its ``sm__throughput``, or on AMD the
  busiest pipe) leads, the limiter is named after its busiest pipe (``alu``), else ``sm``;
- the bound follows it: ``compute`` for the SM and its pipes, ``memory`` for a memory level, and
  ``latency`` when no unit reaches :data:`LATENCY_PCT` of its peak (Nsight Compute's own threshold).

``limiter`` / ``limiter_pct`` name the unit and its share (the SM's share when a pipe is named: the
pipe's own share is in its ``pipe_<name>_pct`` column). A kernel without any unit measured gets no
limiter, and its bound stays the roofline's (FLOPs and bytes against the roofs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.schema import KERNEL_UNIT_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Mapping

LATENCY_PCT = 60.0
"""No unit at or above this share of its peak: the kernel is latency-bound. Nsight Compute's SpeedOfLight
``SOLBottleneck`` rule says so in the same words ("Achieved compute throughput and/or memory bandwidth below
60.0% of peak typically indicate latency issues"); rocprof-compute has no such rule, the same threshold is used."""

MEMORY_UNITS: tuple[tuple[str, str], ...] = (
    ("dram", "dram_throughput_pct"), ("l2", "l2_throughput_pct"), ("l1", "l1_throughput_pct"),
    ("shared", "shared_throughput_pct"))
"""Memory levels, outermost first (ties go to the outer level): (limiter name, kernel-table column)."""
SM_COLUMN = "sm_throughput_pct"
PIPE_COLUMNS = {c.name.removeprefix("pipe_").removesuffix("_pct"): c.name
                for c in KERNEL_UNIT_COLUMNS if c.name.startswith("pipe_")}
"""Pipes of the SM (NVIDIA: Nsight Compute's pipe names) and of the CU (AMD: rocprof-compute's units) -> column."""
PIPES = tuple(PIPE_COLUMNS)
UNIT_COLUMNS = (SM_COLUMN, *(c for _, c in MEMORY_UNITS), *PIPE_COLUMNS.values())
"""Every column the limiter reads (% of the unit's peak, over the kernel's elapsed time)."""

UNIT_NAMES = {
    "sm": "SM", "dram": "DRAM", "l2": "L2", "l1": "L1", "shared": "shared memory",
    "alu": "ALU pipe", "fma": "FMA pipe", "fp16": "FP16 pipe", "fp64": "FP64 pipe", "tensor": "tensor pipe",
    "xu": "XU pipe", "lsu": "LSU pipe", "uniform": "uniform pipe", "adu": "ADU pipe", "cbu": "CBU pipe",
    "tex": "TEX pipe", "tma": "TMA pipe", "valu": "VALU", "mfma": "MFMA", "salu": "SALU", "vmem": "VMEM",
    "branch": "branch unit", "cu": "CU",
}
"""How the text names each limiter."""
MEMORY_LIMITERS = frozenset(name for name, _ in MEMORY_UNITS)


def kind_of(limiter: object) -> str | None:
    """``memory`` for a memory level, ``compute`` for the SM/CU and its pipes, None for no limiter."""
    if not isinstance(limiter, str) or not limiter:
        return None
    return "memory" if limiter in MEMORY_LIMITERS else "compute"


def bound_label(bound: object, limiter: object = None) -> str:
    """``compute (alu)``, ``memory (dram)``, ``latency``; the bound alone without a measured limiter."""
    text = str(bound) if isinstance(bound, str) and bound else "unknown"
    if text in ("compute", "memory") and kind_of(limiter) == text:
        return f"{text} ({limiter})"
    return text


def limiter_words(limiter: object, limiter_pct: object, pipe_pct: object = None) -> str:
    """``the ALU pipe limits it (SM at 70% of peak, the pipe at 57%)``, ``L2 limits it (67% of peak)``,
    ``no unit reaches 60% of its peak (busiest: DRAM at 19%)``; ``limiter not measured``."""
    value = _float(limiter_pct)
    if not isinstance(limiter, str) or not np.isfinite(value):
        return "limiter not measured"
    name = UNIT_NAMES.get(limiter, limiter)
    if value < LATENCY_PCT:
        return f"no unit reaches {LATENCY_PCT:.0f}% of its peak (busiest: {name} at {value:.0f}%)"
    pipe = _float(pipe_pct)
    if limiter in MEMORY_LIMITERS or limiter == "sm" or not np.isfinite(pipe) or abs(pipe - value) < 0.5:
        return f"the {name} limits it ({value:.0f}% of peak)"
    return f"the {name} limits it (the SM at {value:.0f}% of peak, the pipe at {pipe:.0f}%)"


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


def limiter_note(row: Mapping[str, object]) -> str | None:
    """Where the measured limiter contradicts the roofline's reading of a kernel row, the sentence that says so
    (``the FLOPs and bytes put it memory-bound (19% of its roof); measured: compute (alu), the ALU pipe limits
    it (...)``); None where they agree or either is unknown."""
    roofline, bound = row.get("roofline_bound"), row.get("bound")
    if not disagrees(roofline, bound):
        return None
    limiter = row.get("limiter")
    roof = _float(row.get("pct_of_roof"))
    at = f" ({roof:.2g}% of its roof)" if np.isfinite(roof) else ""
    pipe = row.get(f"pipe_{limiter}_pct") if isinstance(limiter, str) else None
    return (f"the FLOPs and bytes put it {roofline}-bound{at}; measured: {bound_label(bound, limiter)}, "
            f"{limiter_words(limiter, row.get('limiter_pct'), pipe)}")


def _numbers(df: pd.DataFrame, columns: Mapping[str, str]) -> tuple[list[str], np.ndarray]:
    names = [n for n, c in columns.items() if c in df]
    if not names:
        return [], np.empty((len(df), 0))
    values = np.column_stack([pd.to_numeric(df[columns[n]], errors="coerce").to_numpy("float64", na_value=np.nan)
                              for n in names])
    return names, values


def _first_max(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the position of the largest finite value (first on ties; -1 where none) and the value."""
    if not values.shape[1]:
        return np.full(len(values), -1), np.full(len(values), np.nan)
    filled = np.where(np.isnan(values), -np.inf, values)
    at = filled.argmax(axis=1)
    best = filled[np.arange(len(values)), at]
    known = np.isfinite(best)
    return np.where(known, at, -1), np.where(known, best, np.nan)


def measured_limiters(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel row, the limiter's name (None where no unit was measured) and its % of peak."""
    n = len(df)
    pipe_names, pipes = _numbers(df, PIPE_COLUMNS)
    pipe_at, pipe_pct = _first_max(pipes)
    sm = (pd.to_numeric(df[SM_COLUMN], errors="coerce").to_numpy("float64", na_value=np.nan)
          if SM_COLUMN in df else np.full(n, np.nan))
    sm = np.where(np.isnan(sm), pipe_pct, sm)  # AMD (no aggregate): the CU's busiest pipe
    unit_names, units = _numbers(df, {name: col for name, col in MEMORY_UNITS})
    at, best = _first_max(np.column_stack([units, sm]))
    limiter = np.full(n, None, dtype=object)
    memory = (at >= 0) & (at < len(unit_names))
    limiter[memory] = np.asarray(unit_names, dtype=object)[at[memory]] if unit_names else None
    on_sm = at == len(unit_names)
    named = on_sm & (pipe_at >= 0)
    if named.any():
        limiter[named] = np.asarray(pipe_names, dtype=object)[pipe_at[named]]
    limiter[on_sm & ~named] = "sm"
    return limiter, best


def apply_limiter(df: pd.DataFrame) -> None:
    """Fill ``limiter``, ``limiter_pct`` (from the unit columns; kept where given, as on an aggregate row)
    and make ``bound`` / ``bound_level`` follow the limiter where there is one; in place.

    ``roofline_bound`` must already hold the roofline's bound (FLOPs and bytes against the roofs)."""
    if any(c in df for c in UNIT_COLUMNS):
        limiter, pct = measured_limiters(df)
        measured = np.asarray([v is not None for v in limiter], dtype=bool)
        if measured.any():
            before = df["limiter"].to_numpy(object) if "limiter" in df else np.full(len(df), None, dtype=object)
            df["limiter"] = np.where(measured, limiter, before)
            given = (pd.to_numeric(df["limiter_pct"], errors="coerce").to_numpy("float64", na_value=np.nan)
                     if "limiter_pct" in df else np.full(len(df), np.nan))
            df["limiter_pct"] = np.where(measured, pct, given)
    if "limiter" not in df or "limiter_pct" not in df or not len(df):
        return
    pct = pd.to_numeric(df["limiter_pct"], errors="coerce").to_numpy("float64", na_value=np.nan)
    has = df["limiter"].notna().to_numpy() & ~np.isnan(pct)  # a trace's million kernels: no limiter, no loop below
    if not has.any():
        return
    limiter = df["limiter"].to_numpy(object)
    kinds = np.full(len(df), None, dtype=object)
    kinds[has] = [kind_of(v) for v in limiter[has]]
    has[has] = [k is not None for k in kinds[has]]
    bound = df["bound"].to_numpy(object).copy()
    bound[has] = np.where(pct[has] >= LATENCY_PCT, kinds[has], "latency")
    df["bound"] = bound
    if "bound_level" in df:
        level = df["bound_level"].to_numpy(object).copy()
        at_level = has & (pct >= LATENCY_PCT) & np.asarray([v in MEMORY_LIMITERS for v in limiter], dtype=bool)
        level[at_level] = limiter[at_level]
        df["bound_level"] = level


def group_limiter(g: pd.DataFrame) -> tuple[str | None, float, str | None]:
    """A kernel group's measured limiter: among its launches of the bound holding most of its time, the limiter
    holding most time, its time-weighted % of peak over the launches it limits, and that bound; (None, NaN,
    None) where no launch was measured."""
    if "limiter" not in g or "limiter_pct" not in g:
        return None, float("nan"), None
    lpct = pd.to_numeric(g["limiter_pct"], errors="coerce")
    ok = (g["limiter"].notna() & lpct.notna()).to_numpy()
    if not ok.any():
        return None, float("nan"), None
    w = g["duration_ns"].astype("float64").clip(lower=1).to_numpy()
    bounds = g["bound"].astype(str).to_numpy()
    bound = max(set(bounds[ok]), key=lambda b: (w[ok & (bounds == b)].sum(), b))
    mine = ok & (bounds == bound)
    limiters = g["limiter"].astype(str).to_numpy()
    lead = max(set(limiters[mine]), key=lambda x: (w[mine & (limiters == x)].sum(), x))
    rows = mine & (limiters == lead)
    return lead, float(np.average(lpct.to_numpy()[rows], weights=w[rows])), bound


def disagrees(roofline_bound: object, bound: object) -> bool:
    """Whether the measured limiter's bound contradicts the roofline's (FLOPs and bytes) reading."""
    known = ("memory", "compute")
    return isinstance(roofline_bound, str) and roofline_bound in known and isinstance(bound, str) \
        and bound != roofline_bound and bound in (*known, "latency")
