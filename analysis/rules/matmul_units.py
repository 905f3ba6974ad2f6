"""Which matmul kernels run FP32 off the tensor / matrix cores: the one test the ``fp32-matmul`` finding
and the roof findings' FP32-matmul cause share (by the kernel's precision and its name)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from perfscope.schema import value_mask

from ..costs.operators import MATMUL_CATEGORIES, category_of

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.device import DeviceSpec

TF32_NAME = re.compile(r"tf32|tensorop_s\d{3,}", re.IGNORECASE)
"""Kernel names of FP32 GEMMs that run TF32 on NVIDIA's tensor cores (cuBLAS ``..._tf32f32_...``, cutlass
``tensorop_s1688gemm``): judged against the TF32 roof."""
MFMA_NAME = re.compile(r"_MI\d+x\d+x\d+")
"""A Tensile / hipBLASLt kernel's MatrixInstruction (``Cijk_..._SB_..._MI16x16x1_...`` is
``v_mfma_f32_16x16x1f32``; a kernel on the vector units names a ThreadTile instead): FP32 on AMD's matrix
cores, at the FP32 matrix rate (not TF32's, even where the device has a TF32 roof)."""
TENSOR_CORE_FP32_NAME = re.compile(f"{TF32_NAME.pattern}|{MFMA_NAME.pattern}", re.IGNORECASE)
"""Kernel names of FP32 GEMMs that already run on the tensor / matrix cores: :data:`TF32_NAME` or
:data:`MFMA_NAME`."""
FP32_SIMT_GEMM_NAME = re.compile(r"sgemm", re.IGNORECASE)
"""Single-precision SIMT GEMM kernels by name (cuBLAS ``volta_sgemm_*``, ``ampere_sgemm_*``, cuDNN
``implicit_convolve_sgemm``): FP32 even when the trace records no dtype."""
NOT_MATMUL_BY_NAME = ("elementwise", "memory", "reduction")
"""Name-only categories (:func:`..costs.operators.category_of` without the op) of kernels that a matmul op
launches but that do no matmul: ``aten::addmm``'s bias broadcast is an ``elementwise_kernel``."""


def fp32_matmuls(k: pd.DataFrame) -> pd.DataFrame:
    """GEMM/attention kernels that run FP32 off the tensor cores: precision fp32, or no precision
    but a SIMT single-precision GEMM name (``volta_sgemm``, ``implicit_convolve_sgemm``). A kernel
    whose own name is an elementwise, copy or reduction kernel is not one, whatever op launched it."""
    fp32 = value_mask(k, "precision", lambda p: p == "fp32")
    unknown = value_mask(k, "precision", lambda p: p is None)
    named = value_mask(k, "name", lambda n: n is not None and FP32_SIMT_GEMM_NAME.search(str(n)) is not None)
    on_tensor_cores = value_mask(k, "name", lambda n: n is not None and TENSOR_CORE_FP32_NAME.search(str(n)) is not None)
    no_matmul = value_mask(k, "name", lambda n: n is not None and category_of(None, str(n)) in NOT_MATMUL_BY_NAME)
    return k[value_mask(k, "category", lambda c: c in MATMUL_CATEGORIES) & (fp32 | (unknown & named))
             & ~on_tensor_cores & ~no_matmul]


FASTER_MATRIX_PRECISIONS = ("tf32", "bf16", "fp16")
"""Tried in order as the FP32 matmul's replacement; TF32 first because it needs no dtype change."""
MATRIX_SPEEDUP_MIN = 2.0
"""A lower-precision roof only "applies" when it is at least twice the FP32 roof (tensor cores);
CPUs without matrix units measure bf16 at or below fp32."""


def faster_matrix(dev: DeviceSpec | None) -> str | None:
    """The first of :data:`FASTER_MATRIX_PRECISIONS` whose compute roof on ``dev`` is at least
    :data:`MATRIX_SPEEDUP_MIN` times its FP32 roof; None where none is (a CPU without matrix units)."""
    if dev is None:
        return None
    fp32 = dev.peak_flops("fp32")
    for p in FASTER_MATRIX_PRECISIONS:
        peak = dev.compute[p].value if p in dev.compute else None
        if fp32 and peak and peak >= MATRIX_SPEEDUP_MIN * fp32:
            return p
    return None


def no_faster_matrix_text(dev: DeviceSpec | None) -> str:
    """Why a lower precision is not advised on ``dev``: ``this device computes bf16 at 1.34 GFLOP/s against 161
    GFLOP/s in fp32`` where it has a bf16 roof, else that it has no faster matrix roof."""
    from perfscope.format import si

    fp32 = dev.peak_flops("fp32") if dev is not None else None
    bf16 = dev.compute["bf16"].value if dev is not None and "bf16" in dev.compute else None
    if fp32 and bf16:
        return f"this device computes bf16 at {si(bf16, 'FLOP/s')} against {si(fp32, 'FLOP/s')} in fp32"
    return "this device has no matrix roof faster than its fp32 one"
