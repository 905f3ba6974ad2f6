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
as extern functions the profiler does not show, between several kernels, so the step's work is not
all in its kernels, and splitting it among them by time would only restate their durations.
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
    start = kernels["start_ns"].to_numpy("int64")
    gemm = (kernels["category"].astype("string") == "gemm").fillna(False).to_numpy(bool)
    rows, flops, nbytes = [], [], []
    for step in steps.itertuples(index=False):
        in_step = (start >= step.start_ns) & (start < step.end_ns)
        mine = np.flatnonzero(in_step & compiled)
        cost = float(step.flops) if step.flops is not None else float("nan")
        moved = float(step.weight_bytes) + float(step.kv_cache_bytes)
        if len(mine) != 1 or gemm[in_step].any() or not np.isfinite(cost) or not np.isfinite(moved):
            continue
        rows.append(int(mine[0]))
        flops.append(cost)
        nbytes.append(moved)
    if not rows:
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
