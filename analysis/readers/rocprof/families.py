"""Kernel families whose arithmetic intensity follows from their own name, without shapes.

llama.cpp's quantized matrix-vector kernel ``mul_mat_vec_q<(ggml_type)T, ncols_dst, ...>`` reads each
quantized weight once and does one multiply-add (2 FLOPs) per weight and destination column; the
weights dominate its bytes (the activation vector and output are K + M values against M x K weights).
So its intensity is ``2 x ncols_dst / bytes per weight`` whatever the matrix: for Q4_0 (18 bytes per
32 weights) 3.6 FLOP/byte, far below any GPU's ridge point. The bytes per weight are ggml's block
sizes (``ggml/src/ggml.c`` type_traits: type_size / blck_size). An upper bound on the true intensity
(activation bytes neglected), so "memory-bound" is safe; FLOPs and bytes themselves stay missing.

Its prefill counterpart ``mul_mat_q<(ggml_type)T, mmq_x, need_check>`` (a tiled GEMM over many tokens) has
no shape in its name, but its launch geometry has one: :func:`mmq_shape` reads M, N and K from its grid
and from the ``quantize_mmq_q8_1`` dispatch that prepared its activations, and :func:`mmq_intensity` gives
the GEMM's intensity with each operand read from DRAM once. That too is an upper bound: it is what the
kernel reaches when its weights stream once (one column tile covers the tokens, as in the committed
captures) and its activations stay in L2; weights re-read per column tile lower it. A bound that places
a kernel below the ridge point is safe; one above it is the best case, not a measurement.
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
MMQ = re.compile(r"\bmul_mat_q<\(ggml_type\)(\d+),\s*(\d+),\s*(true|false)\b")
QUANTIZE_MMQ = re.compile(r"\bquantize_mmq_q8_1<\(mmq_q8_1_ds_layout\)\d")
DIMS = re.compile(r"\((\d+),\s*(\d+),\s*(\d+)\)")
MMQ_Y = 128
"""Rows of a mul_mat_q tile on every GPU but RDNA1 and pre-Volta NVIDIA (ggml-cuda/mmq.cuh get_mmq_y_host)."""
Q8_1_MMQ_BYTES = 144 / 128
"""Bytes per activation value as mul_mat_q reads it: block_q8_1_mmq, 4 x 32 int8 values and 4 half2 scales."""
QUANTIZE_BLOCK = 128
"""quantize_mmq_q8_1's threads per block (CUDA_QUANTIZE_BLOCK_SIZE_MMQ); each block covers 4 x 128 of K."""


def _dims(text: object) -> tuple[int, int, int] | None:
    m = DIMS.fullmatch(str(text).strip()) if isinstance(text, str) else None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def mmq_shape(name: str, grid: object, block: object, quantize_grid: object) -> tuple[int, int, int, int] | None:
    """(M, N, K, type) of a llama.cpp ``mul_mat_q<type, mmq_x, need_check>`` dispatch from its launch
    geometry, or None where the geometry does not give it.

    Grids are rocprof's, in work-items. mul_mat_q launches ``(ceil(M / mmq_y), ceil(N / mmq_x), batch)``
    blocks of ``(warp, nwarps, 1)`` threads (``launch_mul_mat_q``); the activations were quantized just
    before by ``quantize_mmq_q8_1`` over ``(N, ceil(K_padded / 512), batch)`` blocks of 128 threads. So N is the
    quantize grid's x / 128 (checked against the GEMM's column tiles), K is K padded to ggml's 512-value row
    padding (``MATRIX_ROW_PADDING``), M is the row tiles x 128 (exact when ``need_check`` is false). A stream-k
    launch (one row of blocks per CU) or a grid flattened to one dimension (rocprof v1/v2 print the
    product) does not have this layout, and gives None.
    """
    m = MMQ.search(name)
    g, b, q = _dims(grid), _dims(block), _dims(quantize_grid)
    if m is None or g is None or b is None or q is None or b[1] <= 1 or min(b) <= 0:
        return None
    mmq_x = int(m.group(2))
    row_tiles, col_tiles = g[0] // b[0], g[1] // b[1]
    n, k = q[0] // QUANTIZE_BLOCK, q[1] * 4 * QUANTIZE_BLOCK
    if row_tiles <= 0 or n <= 0 or k <= 0 or col_tiles != -(-n // mmq_x) or g[0] % b[0] or g[1] % b[1]:
        return None
    return row_tiles * MMQ_Y, n, k, int(m.group(1))


def mmq_intensity(shape: tuple[int, int, int, int]) -> float | None:
    """FLOP/byte of a mul_mat_q GEMM of ``shape`` reading each operand once: 2·M·N·K over the quantized
    weights (M·K at ggml's bytes per weight), the q8_1 activations (N·K x 144/128) and the fp32 output (4·M·N)."""
    m, n, k, ggml_type = shape
    per_weight = GGML_BYTES_PER_WEIGHT.get(ggml_type)
    if not per_weight:
        return None
    return 2.0 * m * n * k / (m * k * per_weight + n * k * Q8_1_MMQ_BYTES + 4.0 * m * n)


def family_intensity(name: object) -> float | None:
    """FLOP/byte of a kernel of a known family from its name, or None."""
    m = MMVQ.search(str(name)) if isinstance(name, str) else None
    if m is None:
        return None
    per_weight = GGML_BYTES_PER_WEIGHT.get(int(m.group(1)))
    return 2.0 * int(m.group(2)) / per_weight if per_weight else None


def _mmq_intensities(kernels: pd.DataFrame) -> tuple[pd.Series, int]:
    """Each mul_mat_q dispatch's intensity from its geometry (NaN where not recoverable), and how many
    mul_mat_q dispatches there were."""
    names = kernels["name"].astype("object")
    is_mmq = map_distinct(names, lambda n: isinstance(n, str) and MMQ.search(n) is not None).astype(bool)
    out = pd.Series(np.nan, index=kernels.index, dtype="float64")
    if not is_mmq.any() or "grid" not in kernels or "block" not in kernels:
        return out, int(is_mmq.sum())
    is_quant = map_distinct(names, lambda n: isinstance(n, str) and QUANTIZE_MMQ.search(n) is not None).astype(bool)
    keys = [c for c in ("device", "stream") if c in kernels]
    order = kernels.sort_values([*keys, "start_ns"], kind="stable")
    quant_grid = order["grid"].where(is_quant.loc[order.index])
    last_quant = quant_grid.groupby([order[c] for c in keys], dropna=False).ffill() if keys else quant_grid.ffill()
    # one shape per distinct (name, grid, block, quantize grid): a trace repeats a handful of GEMMs per layer
    launch = pd.DataFrame({"name": names, "grid": kernels["grid"], "block": kernels["block"],
                           "quant": last_quant.reindex(kernels.index)})[is_mmq.to_numpy()].astype("object")
    launch = launch.where(launch.notna(), None)  # NaN is not equal to itself: no dict key
    values: dict[tuple[object, ...], float] = {}
    for key in set(launch.itertuples(index=False, name=None)):
        shape = mmq_shape(*key)  # type: ignore[arg-type]
        value = mmq_intensity(shape) if shape else None
        values[key] = np.nan if value is None else value
    out[launch.index] = [values[key] for key in launch.itertuples(index=False, name=None)]
    return out, int(is_mmq.sum())


def with_family_intensity(kernels: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """Set ``family_intensity`` on kernels without measured FLOPs or bytes whose family gives one:
    llama.cpp's mul_mat_vec_q from its template, mul_mat_q from its launch geometry."""
    if not len(kernels) or "name" not in kernels:
        return kernels
    gemv = pd.to_numeric(map_distinct(kernels["name"], family_intensity), errors="coerce").astype("float64")
    gemm, n_mmq = _mmq_intensities(kernels)
    measured = pd.Series(False, index=kernels.index)
    if "flops" in kernels and "dram_bytes" in kernels:
        measured = kernels["flops"].notna() & kernels["dram_bytes"].notna()
    gemv, gemm = gemv.where(~measured), gemm.where(~measured)
    values = gemv.fillna(gemm)
    if gemv.notna().any():
        warnings.append(f"{int(gemv.notna().sum())} llama.cpp mul_mat_vec_q dispatches placed on the roofline by "
                        "their family's intensity (2 x columns / bytes per quantized weight, from the template "
                        "arguments); their FLOPs, bytes and % of roof stay unknown")
    if gemm.notna().any():
        warnings.append(f"{int(gemm.notna().sum())} llama.cpp mul_mat_q dispatches placed on the roofline by the "
                        "intensity of their GEMM (M, N, K from the launch grid and the quantize_mmq_q8_1 dispatch "
                        "before it; each operand read once); their FLOPs, bytes and % of roof stay unknown")
    if n_mmq > int(gemm.notna().sum()):
        warnings.append(f"{n_mmq - int(gemm.notna().sum())} llama.cpp mul_mat_q dispatches without a recoverable "
                        "shape (a one-dimensional grid as rocprof v1/v2 print it, a stream-k launch, or no "
                        "quantize_mmq_q8_1 dispatch before it): their cost stays unknown")
    if values.notna().any():
        kernels = kernels.assign(family_intensity=values.to_numpy(np.float64, na_value=np.nan))
        # both families multiply quantized weights by q8_1-quantized activations with int8 dot products
        # (dp4a, or the int8 matrix cores): their compute roof is the int8 one
        known = values.notna().to_numpy()
        precision = kernels["precision"].astype("object") if "precision" in kernels else \
            pd.Series(None, index=kernels.index, dtype="object")
        kernels = kernels.assign(precision=precision.where(~(known & precision.isna().to_numpy()), "int8"))
    return kernels
