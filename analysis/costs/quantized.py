"""Cost formulas of GEMMs in narrow formats: fp8 GEMMs with their scales, block-scaled
(MXFP4, NVFP4) expert weights, and the MoE layers that run them; and the precision a MoE GEMM
kernel's own name states (the op's dtypes cannot: the quantization is inside the op)."""

from __future__ import annotations

import re

from .args import nbytes_of, tensor_arg, tensor_args
from .base import OpCost, OpInputs, itemsize


# ---------------------------------------------------------------------------- GEMMs
def linear_wrapper(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::rocm_unquantized_gemm(x [M,K], weight [N,K], bias [N])`` and
    ``aiter::gemm_a16w16(A [M,K], B [N,K], bias, out_dtype, ...)``: ``aten::linear``'s
    formula (``2·M·N·K``; x, weight, bias read, output written), from their schemas
    (vllm/model_executor/layers/utils.py, aiter/ops/gemm_op_a16w16.py)."""
    from .base import _gemm

    return _gemm("linear", ins)


# ---------------------------------------------------------------------------- quantized GEMMs
BLOCK_SCALE = {"mxfp4": (0.5, 32, 1), "nvfp4": (0.5, 16, 1), "mxfp8": (1.0, 32, 1)}
"""Block-scaled formats: (bytes per element, elements per scale, bytes per scale): OCP MX
spec v1.0 (E8M0 scale per 32) and NVIDIA's NVFP4 (E4M3 scale per 16)."""


def storage_bytes(n_elements: float, fmt: str) -> float:
    """Bytes of ``n_elements`` stored in ``fmt`` (a torch dtype name, or a block-scaled format
    of :data:`BLOCK_SCALE`, whose scales are included)."""
    if fmt in BLOCK_SCALE:
        width, block, scale = BLOCK_SCALE[fmt]
        return n_elements * width + n_elements / block * scale
    return n_elements * itemsize(fmt)


def scaled_mm(name: str, ins: OpInputs) -> OpCost | None:
    """``aten::_scaled_mm(a [M,K], b [K,N], scale_a, scale_b, bias, scale_result, out_dtype,
    use_fast_accum)``: ``2·M·N·K`` FLOPs; bytes: a and b in their storage width (fp8), their
    scales (per tensor: one float; per row/block: their recorded shapes) and the output,
    taken as bf16 unless ``out_dtype`` says otherwise. Placed on the operands' roof (fp8)."""
    t = tensor_args(ins, 0, 1)
    if t is None:
        return None
    (a, da), (b, db) = t
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    m, k, n = a[0], a[1], b[1]
    scales = sum(nbytes_of(*s) for s in (tensor_arg(ins, 2), tensor_arg(ins, 3), tensor_arg(ins, 4)) if s is not None)
    out_code = ins.concrete[6] if len(ins.concrete) > 6 else None
    out_width = {"5": 2, "15": 2, "6": 4}.get(out_code or "", 2)
    nbytes = nbytes_of(a, da) + nbytes_of(b, db) + scales + m * n * out_width
    return OpCost(2.0 * m * n * k, nbytes, "gemm", precision=_gemm_precision(da, db))


def cutlass_scaled_mm(name: str, ins: OpInputs) -> OpCost | None:
    """``_C::cutlass_scaled_mm(out [M,N], a [M,K], b [K,N], a_scales, b_scales, bias)``
    (vllm csrc/torch_bindings.cpp): as :func:`scaled_mm`, the output recorded."""
    t = tensor_args(ins, 0, 1, 2)
    if t is None:
        return None
    (out, do), (a, da), (b, db) = t
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    scales = sum(nbytes_of(*s) for s in (tensor_arg(ins, 3), tensor_arg(ins, 4), tensor_arg(ins, 5)) if s is not None)
    nbytes = nbytes_of(a, da) + nbytes_of(b, db) + scales + nbytes_of(out, do)
    return OpCost(2.0 * a[0] * b[1] * a[1], nbytes, "gemm", precision=_gemm_precision(da, db))


def cutlass_scaled_fp4_mm(name: str, ins: OpInputs) -> OpCost | None:
    """``_C::cutlass_scaled_fp4_mm(out [M,N], a [M,K/2], b [N,K/2], a_scales, b_scales, alpha)``
    (vllm csrc/torch_bindings.cpp): NVFP4 operands packed two per byte (uint8), so K is twice
    the recorded inner size; ``2·M·N·K`` FLOPs; bytes: the packed operands, their E4M3 block
    scales (as recorded: swizzled, padded), alpha and the output. Placed on the fp4 roof."""
    t = tensor_args(ins, 0, 1, 2)
    if t is None:
        return None
    (out, do), (a, da), (b, db) = t
    if len(a) != 2 or len(b) != 2 or a[1] != b[1] or itemsize(da) != 1:
        return None
    k = 2 * a[1]
    scales = sum(nbytes_of(*s) for s in (tensor_arg(ins, 3), tensor_arg(ins, 4), tensor_arg(ins, 5)) if s is not None)
    nbytes = nbytes_of(a, da) + nbytes_of(b, db) + scales + nbytes_of(out, do)
    return OpCost(2.0 * a[0] * b[0] * k, nbytes, "gemm", precision="fp4")


PRECISION_WIDTH = {"fp4": 0, "int4": 0, "fp8": 1, "int8": 1, "bf16": 2, "fp16": 2, "fp32": 3}


def _gemm_precision(*dtypes: str) -> str | None:
    """A matrix product runs at the precision of its wider operand (bf16 x mxfp4 dequantizes
    the weights and runs bf16; fp8 x fp4 runs the f8f6f4 MMA, at fp8 rate)."""
    from .roofline import precision_of

    precs = [p for p in (precision_of(d) if d not in ("fp4", "mxfp4", "nvfp4") else "fp4" for d in dtypes) if p]
    return max(precs, key=lambda p: PRECISION_WIDTH.get(p, 3)) if precs else None


# ---------------------------------------------------------------------------- MoE
def moe_cost(tokens: int, hidden: int, inter: int, experts: int, topk: int, *, gated: bool,
             act_dtype: str, weight_format: str, experts_hit: int | None = None) -> OpCost:
    """A MoE layer's expert GEMMs: each token through ``topk`` experts, each an up (gate+up
    when ``gated``) ``hidden -> inter`` and a down ``inter -> hidden`` projection.

    FLOPs: ``2·T·k·H·I·(2 if gated else 1) + 2·T·k·I·H`` (the GEMMs; routing, activation and
    the weighted sum are not counted). Bytes: the tokens in and out (``T·H`` each, activation
    width) and the weights of ``experts_hit`` experts (all ``experts`` when the trace does not
    show which were hit) in their storage format with their block scales
    (:func:`storage_bytes`). Sources: Shazeer et al. 2017 (top-k gating), Fedus et al. 2021.
    """
    up = 2 * inter if gated else inter
    flops = 2.0 * tokens * topk * hidden * up + 2.0 * tokens * topk * inter * hidden
    hit = experts if experts_hit is None else experts_hit
    weights = storage_bytes(float(hit) * (up * hidden + inter * hidden), weight_format)
    nbytes = 2.0 * tokens * hidden * itemsize(act_dtype) + weights
    return OpCost(flops, nbytes, "gemm", precision=_gemm_precision(act_dtype, weight_format))


GPT_OSS_MOE = {"topk": 4, "gated": True, "weight_format": "mxfp4"}
"""vLLM's ``moe_forward`` does not pass the expert weights (they hang off ``layer_name``): the
sizes the trace does not record are GPT-OSS's (config.json of openai/gpt-oss-20b/-120b:
``experts_per_token`` 4, SwiGLU, MXFP4 expert weights, ``intermediate_size`` =
``hidden_size`` = 2880, padded with the hidden size to 3072 by vLLM's mxfp4 path), the only
``moe_forward`` model in perfscope's fixtures; TraceLens assumes the same."""


def is_gpt_oss(hidden: int, experts: int) -> bool:
    """GPT-OSS's MoE layer: hidden 2880 (3072 padded), 32 (20b) or 128 (120b) experts. Another
    model's ``moe_forward`` is left uncosted rather than priced with GPT-OSS's sizes."""
    return hidden in (2880, 3072) and experts in (32, 128)


def moe_forward(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::moe_forward(hidden_states [T, H], router_logits [T, E], layer_name)``
    (vllm/model_executor/layers/fused_moe/layer.py) by :func:`moe_cost`, with the sizes of
    :data:`GPT_OSS_MOE`: intermediate = the (padded) hidden size split over the job's ranks
    (tensor-parallel experts), every expert's weights read (routing is not in the trace).
    Only for GPT-OSS's shapes (:func:`is_gpt_oss`); other models' stay missing."""
    t = tensor_args(ins, 0, 1)
    if t is None:
        return None
    (x, dx), (logits, _) = t
    if len(x) != 2 or len(logits) != 2 or not is_gpt_oss(x[1], logits[1]):
        return None
    ranks = ins.context.world_size or 1
    inter = max(x[1] // ranks, 1)
    return moe_cost(x[0], x[1], inter, logits[1], int(str(GPT_OSS_MOE["topk"])), gated=True,
                    act_dtype=dx, weight_format=str(GPT_OSS_MOE["weight_format"]))


TRTLLM_BMM = re.compile(r"^bmm_[A-Za-z0-9]+_((?:(?:Mx)?E\dm\d|Bfloat16|Fp16|Fp32)+)_")
OGS_MATMUL = re.compile(r"^_matmul_ogs_[A-Z]+_([a-z0-9]+(?:x[a-z0-9]+)+)_\d")
OGS_FORMATS = r"mxfp4|nvfp4|mxfp8|bf16|fp16|fp32|fp8|e4m3|e5m2|e2m1"
KERNEL_FORMAT = {"e2m1": "fp4", "mxfp4": "fp4", "nvfp4": "fp4", "e4m3": "fp8", "e5m2": "fp8", "mxfp8": "fp8",
                 "fp8": "fp8", "bfloat16": "bf16", "bf16": "bf16", "fp16": "fp16", "f16": "fp16", "fp32": "fp32"}


def kernel_precision(kernel: str | None) -> str | None:
    """The math precision a block-scaled MoE GEMM kernel's own name states, else None.

    TensorRT-LLM's batched GEMMs (``bmm_<out>_<weights><activations>_<acc>_...``, the
    trtllm-gen kernels flashinfer runs for vLLM on Blackwell) and triton_kernels'
    ``_matmul_ogs_<layout>_<out>x<act>x<weights>_...`` name their operand formats; the product
    runs at the wider operand's (:func:`_gemm_precision`): ``MxE4m3 x MxE2m1`` at fp8,
    ``bf16 x mxfp4`` at bf16. The op's dtypes cannot say it (the quantization is inside the op)."""
    if not kernel:
        return None
    trt = TRTLLM_BMM.match(kernel)
    if trt is not None:
        parts = re.findall(r"(?:Mx)?E\dm\d|Bfloat16|Fp16|Fp32", trt.group(1))
        formats = [KERNEL_FORMAT.get(p.lower().removeprefix("mx")) for p in parts]
    else:
        ogs = OGS_MATMUL.match(kernel)
        if ogs is None:
            return None
        formats = [KERNEL_FORMAT.get(p) for p in re.findall(OGS_FORMATS, ogs.group(1))[1:]]
    if not formats or any(f is None for f in formats):
        return None
    return max(formats, key=lambda p: PRECISION_WIDTH.get(p or "", 3))  # type: ignore[arg-type]


NAME_FORMATS = re.compile(r"mxfp4|nvfp4|mxfp8|e2m1|e4m3|e5m2|fp8|fp4|uint4|int4|int8|w4a16|w4a8|w8a8|w8a16",
                          re.IGNORECASE)
NAME_FORMAT = {"mxfp4": "fp4", "nvfp4": "fp4", "e2m1": "fp4", "fp4": "fp4", "mxfp8": "fp8", "e4m3": "fp8",
               "e5m2": "fp8", "fp8": "fp8", "uint4": "int4", "int4": "int4", "w4a16": "int4", "w4a8": "int4",
               "int8": "int8", "w8a8": "int8", "w8a16": "int8"}
"""Operand formats a GEMM kernel's name can state (TensorRT-LLM's ``MxE2m1``, triton_kernels' ``mxfp4``,
CUTLASS's ``e4m3``, the ``w4a16``-style names of weight-only kernels), each as the precision it stores."""


def narrowest_operand(kernel: object, dtypes: object = ()) -> tuple[str, str] | None:
    """The narrowest operand precision of a GEMM, and where it was read: the formats its kernel's own name states
    (a weight-quantized kernel names its packed format: the op's dtypes cannot, the quantization is inside the op),
    else its op's tensor input dtypes (``dtypes``: the names torch prints; scalars and unknown names skipped).
    A weight-streaming GEMM's narrowest operand is its weights. None when neither says."""
    from .roofline import precision_of

    found = [NAME_FORMAT[m.lower()] for m in NAME_FORMATS.findall(kernel)] if isinstance(kernel, str) else []
    where = "the kernel's name"
    if not found:
        found = [p for p in (precision_of(d) for d in (dtypes if isinstance(dtypes, (list, tuple)) else ()))
                 if p in PRECISION_WIDTH]
        where = "the op's input types"
    return (min(found, key=lambda p: PRECISION_WIDTH[p]), where) if found else None

