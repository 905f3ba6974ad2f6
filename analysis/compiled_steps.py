"""Costs for an engine step compiled into one inductor CPU kernel.

With inductor's kernel profiling on (the engine's compiled CPU decode turns it on), each C++
kernel of a compiled graph appears in a torch.profiler trace as a range named
``graph_<n>_cpp_fused_...``, with no op and no shapes. When the engine says that every matrix
product of its compiled decode step runs inside inductor's own code (manifest
``params.decode_matmuls_in_kernels``; the caller checks it) and a step ran as exactly one such
kernel with no GEMM operator beside it, that kernel did the step's model work: it takes the
step's model FLOPs (``steps.flops``: every matrix's 2·M·N·K per token plus attention) and bytes
(weights + KV cache read), with ``flops_source`` / ``bytes_source`` = ``engine-step``, and the
model's precision.

Otherwise the kernels keep NaN costs: when some products take the BLAS path, inductor calls them
between several kernels (each an ``aten::mm`` operator with shapes, costed like an eager one), so
the step's work is not all in its kernels, and splitting the rest among them by time would only
restate their durations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COMPILED_PREFIX = "graph_"
COMPILED_PART = "_cpp_fused_"
"""How inductor names a profiled CPU kernel: ``graph_<graph id>_cpp_fused_<origin ops>_<n>``."""

SOURCE = "engine-step"


def compiled_kernels(names: pd.Series) -> np.ndarray:
    """True for the rows that are inductor CPU kernels (by name)."""
    text = names.astype("string")
    return (text.str.startswith(COMPILED_PREFIX) & text.str.contains(COMPILED_PART, regex=False)).fillna(False) \
        .to_numpy(bool)


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
    step_start, step_end = steps["start_ns"].to_numpy("int64"), steps["end_ns"].to_numpy("int64")
    start = kernels["start_ns"].to_numpy("int64")
    step_of = np.searchsorted(step_start, start, side="right") - 1  # the step a kernel starts in (-1: none)
    step_of[(step_of < 0) | (start >= step_end[np.maximum(step_of, 0)])] = -1
    in_step = step_of >= 0
    gemm = (kernels["category"].astype("string") == "gemm").fillna(False).to_numpy(bool)
    n = len(steps)
    cost = pd.to_numeric(steps["flops"], errors="coerce").to_numpy("float64")
    moved = (pd.to_numeric(steps["weight_bytes"], errors="coerce")
             + pd.to_numeric(steps["kv_cache_bytes"], errors="coerce")).to_numpy("float64")
    # a step qualifies with exactly one compiled kernel, no GEMM operator beside it, and a known cost
    qualifies = ((np.bincount(step_of[compiled & in_step], minlength=n) == 1)
                 & (np.bincount(step_of[gemm & in_step], minlength=n) == 0) & np.isfinite(cost) & np.isfinite(moved))
    rows = np.flatnonzero(compiled & in_step & qualifies[np.maximum(step_of, 0)])
    flops, nbytes = cost[step_of[rows]], moved[step_of[rows]]
    if not len(rows):
        return kernels
    out = kernels.copy()
    at = out.index[rows]
    out.loc[at, "flops"] = flops
    out.loc[at, "dram_bytes"] = nbytes
    for column in ("flops_source", "bytes_source"):
        out[column] = out[column].astype("object")
        out.loc[at, column] = SOURCE
    if precision:
        out["precision"] = out["precision"].astype("object") if "precision" in out else None
        out.loc[at, "precision"] = precision
    return out
