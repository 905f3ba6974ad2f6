"""Kernel families whose arithmetic intensity follows from their own name, without shapes.

llama.cpp's quantized matrix-vector kernel ``mul_mat_vec_q<(ggml_type)T, ncols_dst, ...>`` reads each
quantized weight once and does one multiply-add (2 FLOPs) per weight and destination column; the
weights dominate its bytes (the activation vector and output are K + M values against M x K weights).
So its intensity is ``2 x ncols_dst / bytes per weight`` whatever the matrix: for Q4_0 (18 bytes per
32 weights) 3.6 FLOP/byte, far below any GPU's ridge point. The bytes per weight are ggml's block
sizes (``ggml/src/ggml.c`` type_traits: type_size / blck_size). An upper bound on the true intensity
(activation bytes neglected), so "memory-bound" is safe; FLOPs and bytes themselves stay missing.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from perfscope.schema import map_distinct

GGML_BYTES_PER_WEIGHT = {
    0: 4.0, 1: 2.0, 2: 18 / 32, 3: 20 / 32, 6: 22 / 32, 7: 24 / 32, 8: 34 / 32,
    10: 84 / 256, 11: 110 / 256, 12: 144 / 256, 13: 176 / 256, 14: 210 / 256, 30: 2.0,
}
"""ggml_type id -> bytes per weight: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, BF16."""
MMVQ = re.compile(r"\bmul_mat_vec_q<\(ggml_type\)(\d+),\s*(\d+)\b")


def family_intensity(name: object) -> float | None:
    """FLOP/byte of a kernel of a known family from its name, or None."""
    m = MMVQ.search(str(name)) if isinstance(name, str) else None
    if m is None:
        return None
    per_weight = GGML_BYTES_PER_WEIGHT.get(int(m.group(1)))
    return 2.0 * int(m.group(2)) / per_weight if per_weight else None


def with_family_intensity(kernels: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Set ``family_intensity`` on kernels without measured FLOPs or bytes whose family gives one."""
    if not len(kernels) or "name" not in kernels:
        return kernels
    values = pd.to_numeric(map_distinct(kernels["name"], family_intensity), errors="coerce").astype("float64")
    measured = pd.Series(False, index=kernels.index)
    if "flops" in kernels and "dram_bytes" in kernels:
        measured = kernels["flops"].notna() & kernels["dram_bytes"].notna()
    values = values.where(~measured)
    if values.notna().any():
        kernels = kernels.assign(family_intensity=values.to_numpy(np.float64))
        warnings.append(f"{int(values.notna().sum())} llama.cpp mul_mat_vec_q dispatches placed on the roofline by "
                        "their family's intensity (2 x columns / bytes per quantized weight, from the template "
                        "arguments); their FLOPs, bytes and % of roof stay unknown")
    return kernels
