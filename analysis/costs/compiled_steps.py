"""Costs for the kernels of an engine step compiled by inductor on the CPU.

With inductor's kernel profiling on (the engine's compiled CPU decode turns it on), each C++
kernel of a compiled graph appears in a torch.profiler trace as a range named
``graph_<n>_cpp_fused_...``, with no op and no shapes. When the engine says that every matrix
product of its compiled decode step runs inside inductor's own code (manifest
``params.decode_matmuls_in_kernels``; the caller checks it) and a step ran as exactly one such
kernel with no GEMM operator beside it, that kernel did the step's model work: it takes the
step's model FLOPs (``steps.flops``: every matrix's 2·M·N·K per token plus attention) and bytes
(weights + KV cache read), with ``flops_source`` / ``bytes_source`` = ``engine-step``, and the
model's precision.

When the products take the BLAS path instead, inductor calls them between several kernels, each an
``aten::mm`` operator with shapes, costed 2·M·N·K like an eager one. What is left of the step's
model FLOPs after those products is attention's (QK^T and PV), and it ran in the kernels that fuse
each layer's ``bmm`` (one per layer per step, all of one shape): :func:`cost_compiled_attention`
splits that remainder and the step's KV-cache bytes evenly among them (``engine-attention``). The
other fused kernels (norms, activations) keep NaN costs: splitting by time would only restate
their durations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COMPILED_PREFIX = "graph_"
COMPILED_PART = "_cpp_fused_"
"""How inductor names a profiled CPU kernel: ``graph_<graph id>_cpp_fused_<origin ops>_<n>``."""

SOURCE = "engine-step"
ATTENTION_SOURCE = "engine-attention"
ATTENTION_PART = "_bmm_"
"""In a fused kernel's name (its origin ops), the mark of attention's batched products."""


def compiled_kernels(names: pd.Series) -> np.ndarray:
    """True for the rows that are inductor CPU kernels (by name)."""
    text = names.astype("string")
    return (text.str.startswith(COMPILED_PREFIX) & text.str.contains(COMPILED_PART, regex=False)).fillna(False) \
        .to_numpy(bool)


def _step_of(kernels: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """Per kernel row, the position in ``steps`` (sorted by start) of the step it starts in; -1: none."""
    step_start, step_end = steps["start_ns"].to_numpy("int64"), steps["end_ns"].to_numpy("int64")
    start = kernels["start_ns"].to_numpy("int64")
    step_of = np.searchsorted(step_start, start, side="right") - 1
    step_of[(step_of < 0) | (start >= step_end[np.maximum(step_of, 0)])] = -1
    return step_of


def _gemm_rows(kernels: pd.DataFrame) -> np.ndarray:
    """True for the matrix-product operators (category ``gemm``)."""
    return (kernels["category"].astype("string") == "gemm").fillna(False).to_numpy(bool)


def _with_costs(kernels: pd.DataFrame, rows: np.ndarray, flops: np.ndarray, nbytes: np.ndarray, source: str,
                precision: str | None) -> pd.DataFrame:
    out = kernels.copy()
    at = out.index[rows]
    out.loc[at, "flops"] = flops
    out.loc[at, "dram_bytes"] = nbytes
    for column in ("flops_source", "bytes_source"):
        out[column] = out[column].astype("object")
        out.loc[at, column] = source
    if precision:
        out["precision"] = out["precision"].astype("object") if "precision" in out else None
        out.loc[at, "precision"] = precision
    return out


def cost_compiled_attention(kernels: pd.DataFrame, steps: pd.DataFrame, precision: str | None) -> pd.DataFrame:
    """``kernels`` (not modified) with attention's cost on each step's fused ``bmm`` kernels; see the module doc.

    A step qualifies when its products are all costed operators (at least one, none uncosted), some
    compiled kernels fuse ``bmm``, and its model FLOPs exceed the products' by a known remainder.
    """
    if not len(kernels) or not len(steps) or "flops" not in steps:
        return kernels
    steps = steps.sort_values("start_ns", kind="stable")
    step_of = _step_of(kernels, steps)
    in_step = step_of >= 0
    names = kernels["name"].astype("string")
    attention = (compiled_kernels(kernels["name"]) & names.str.contains(ATTENTION_PART, regex=False).fillna(False)
                 .to_numpy(bool) & kernels["flops"].isna().to_numpy() & in_step)
    if not attention.any():
        return kernels
    n = len(steps)
    gemm = _gemm_rows(kernels) & in_step
    gemm_flops = kernels["flops"].to_numpy("float64", na_value=np.nan)
    products = np.bincount(step_of[gemm], weights=np.nan_to_num(gemm_flops[gemm]), minlength=n)
    uncosted = np.bincount(step_of[gemm & np.isnan(gemm_flops)], minlength=n)
    per_step = np.bincount(step_of[attention], minlength=n)
    remainder = pd.to_numeric(steps["flops"], errors="coerce").to_numpy("float64", na_value=np.nan) - products
    kv = pd.to_numeric(steps["kv_cache_bytes"], errors="coerce").to_numpy("float64", na_value=np.nan)
    qualifies = ((np.bincount(step_of[gemm], minlength=n) > 0) & (uncosted == 0) & (per_step > 0)
                 & np.isfinite(remainder) & (remainder >= 0) & np.isfinite(kv))
    rows = np.flatnonzero(attention & qualifies[np.maximum(step_of, 0)])
    if not len(rows):
        return kernels
    share = per_step[step_of[rows]]
    return _with_costs(kernels, rows, remainder[step_of[rows]] / share, kv[step_of[rows]] / share,
                       ATTENTION_SOURCE, precision)


def cost_compiled_steps(kernels: pd.DataFrame, steps: pd.DataFrame, precision: str | None) -> pd.DataFrame:
    """``kernels`` (not modified) with the step cost on each step's one compiled kernel; see the module doc.

    ``steps`` needs ``start_ns``, ``end_ns``, ``flops``, ``weight_bytes`` and ``kv_cache_bytes`` on the
    kernels' timeline; ``precision`` is the model's (``fp32``, ``bf16``, ...).
    """
    if not len(kernels) or not len(steps) or "flops" not in steps:
        return kernels
    compiled = compiled_kernels(kernels["name"]) & kernels["flops"].isna().to_numpy()
    if not compiled.any():
        return kernels
    steps = steps.sort_values("start_ns", kind="stable")
    step_of = _step_of(kernels, steps)  # the step a kernel starts in (-1: none)
    in_step = step_of >= 0
    gemm = _gemm_rows(kernels)
    n = len(steps)
    cost = pd.to_numeric(steps["flops"], errors="coerce").to_numpy("float64", na_value=np.nan)
    moved = (pd.to_numeric(steps["weight_bytes"], errors="coerce")
             + pd.to_numeric(steps["kv_cache_bytes"], errors="coerce")).to_numpy("float64", na_value=np.nan)
    # a step qualifies with exactly one compiled kernel, no GEMM operator beside it, and a known cost
    qualifies = ((np.bincount(step_of[compiled & in_step], minlength=n) == 1)
                 & (np.bincount(step_of[gemm & in_step], minlength=n) == 0) & np.isfinite(cost) & np.isfinite(moved))
    rows = np.flatnonzero(compiled & in_step & qualifies[np.maximum(step_of, 0)])
    if not len(rows):
        return kernels
    return _with_costs(kernels, rows, cost[step_of[rows]], moved[step_of[rows]], SOURCE, precision)
