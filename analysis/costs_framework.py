"""Cost formulas of the custom ops LLM serving frameworks launch (vLLM, SGLang, aiter).

Each formula reads the op's recorded ``Input Dims`` / ``Input type`` / ``Concrete Inputs`` by
the argument order of the op's own signature (cited in its docstring) and, where the arguments
do not carry what the cost needs, the :class:`OpContext` the trace gives around the call (the
step's sequence lengths, the number of ranks). Bytes are the compulsory DRAM traffic: each
tensor read once, each output written once, in its storage width. Where the context lacks a
number a formula needs, it returns None (left missing), never a guess; the only assumed
numbers are the GPT-OSS MoE sizes of :func:`moe_forward`, which say so.

The formulas are keyed by qualified name (``_C::rms_norm``), so a framework op never takes
the formula of an aten op of the same base name with a different argument order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .costs import OpCost, OpInputs, Shape, itemsize, numel


@dataclass(frozen=True)
class StepAttention:
    """Sums over a step's sequences, for attention: query tokens ``sq``, key tokens ``sk``,
    ``sqsq`` = sum sq², ``sqsk`` = sum sq·sk. ``sk`` of a sequence counts its whole context
    (cached and new tokens)."""

    sq: int
    sk: int
    sqsq: int
    sqsk: int

    def pairs(self, *, causal: bool) -> float:
        """(query, key) pairs attended. Causal: query ``i`` of a sequence (0-based among its
        ``sq`` new tokens) sees ``sk - sq + i + 1`` keys, so a sequence contributes
        ``sq·sk - (sq² - sq)/2``; without a mask every query sees all ``sk`` keys."""
        if not causal:
            return float(self.sqsk)
        return float(self.sqsk) - (self.sqsq - self.sq) / 2.0

    def __add__(self, other: StepAttention) -> StepAttention:
        return StepAttention(self.sq + other.sq, self.sk + other.sk, self.sqsq + other.sqsq,
                             self.sqsk + other.sqsk)


@dataclass(frozen=True)
class OpContext:
    """What the trace says around one op call, beyond its own arguments.

    Attributes:
        attention: the sums of the step the call ran in (from the vLLM step annotation).
        world_size: ranks of the job (``distributedInfo``), for collectives and for the
            tensor-parallel share of a MoE layer.
    """

    attention: StepAttention | None = None
    world_size: int | None = None


VLLM_DETAILED = re.compile(r"(context|generation)_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)")
VLLM_SHORT_CONTEXT = re.compile(r"context_(\d+)\((\d+)_(\d+)\)")
VLLM_SHORT_GENERATION = re.compile(r"generation_(\d+)\((\d+)\)")


def step_attention(annotation: str | None) -> StepAttention | None:
    """The attention sums of a vLLM step annotation, or None when it is not one.

    ``execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)`` (the
    detailed form) gives every sum. The older ``execute_context_1(888_788544)_generation_0(0)``
    gives the prefill tokens and sum sq·sk, and the decode context: there sk is taken as sq
    for the prefills (no cached prefix, sqsq = sqsk), the decode sequences' sq as 1.
    """
    if not annotation or "execute" not in annotation:
        return None
    parts = VLLM_DETAILED.findall(annotation)
    if parts:
        total = StepAttention(0, 0, 0, 0)
        for _, _, sq, sk, sqsq, sqsk in parts:
            total = total + StepAttention(int(sq), int(sk), int(sqsq), int(sqsk))
        return total
    ctx, gen = VLLM_SHORT_CONTEXT.search(annotation), VLLM_SHORT_GENERATION.search(annotation)
    if ctx is None or gen is None:
        return None
    sq, sqsk = int(ctx.group(2)), int(ctx.group(3))
    seqs, sk_gen = int(gen.group(1)), int(gen.group(2))
    return StepAttention(sq, sq, sqsk, sqsk) + StepAttention(seqs, sk_gen, seqs, sk_gen)


def _bytes(shape: Shape, dtype: str | None) -> float:
    return float(numel(shape) * itemsize(dtype))


def _tensor(ins: OpInputs, pos: int) -> tuple[Shape, str] | None:
    if pos >= len(ins.shapes) or ins.shapes[pos] is None:
        return None
    return ins.shapes[pos] or [], ins.dtypes[pos] or "float"  # type: ignore[return-value]


def _need(ins: OpInputs, *pos: int) -> list[tuple[Shape, str]] | None:
    out = [_tensor(ins, p) for p in pos]
    return None if any(t is None or not t[0] for t in out) else out  # type: ignore[misc]


# ---------------------------------------------------------------------------- attention
def attention_cost(q: tuple[Shape, str], k: tuple[Shape, str], v: tuple[Shape, str],
                   work: StepAttention, *, causal: bool, kv_itemsize: float | None = None) -> OpCost:
    """FLOPs and bytes of varlen attention over a step's sequences (FlashAttention-2's count).

    FLOPs: ``2·Hq·D·pairs`` for QKᵀ plus ``2·Hq·Dv·pairs`` for PV (Dao, FlashAttention-2, §4:
    ``4·seqlen²·head_dim·heads``, halved when causal); softmax is not counted.
    Bytes: Q and O once, and the K and V of every key position of every sequence once
    (``sk`` summed over the step: the paged KV read of a decode), in the cache's width.

    Args:
        q, k, v: (shape, dtype) of the query ``[T, Hq, D]``, key ``[T, Hkv, D]``, value
            ``[T, Hkv, Dv]`` arguments (the step's new tokens).
        work: the step's sequence sums.
        causal: decoder self-attention (a query sees keys up to its own position).
        kv_itemsize: bytes per cached K/V element (default: the key's dtype).
    """
    (qs, dq), (ks, dk), (vs, _) = q, k, v
    hq, d, hkv, dv = qs[-2], qs[-1], ks[-2], vs[-1]
    pairs = work.pairs(causal=causal)
    flops = 2.0 * hq * d * pairs + 2.0 * hq * dv * pairs
    width = kv_itemsize if kv_itemsize is not None else itemsize(dk)
    q_bytes = float(work.sq * hq * d * itemsize(dq))
    o_bytes = float(work.sq * hq * dv * itemsize(dk if itemsize(dq) < itemsize(dk) else dq))
    kv_bytes = float(work.sk) * hkv * (d + dv) * width
    return OpCost(flops, q_bytes + o_bytes + kv_bytes, "attention")


def vllm_unified_attention(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::unified_attention_with_output(query [T,Hq,D], key [T,Hkv,D], value [T,Hkv,Dv],
    output [T,Hq,Dv], layer_name, ...)`` and ``vllm::unified_attention(query, key, value,
    layer_name)`` (vllm/attention/layer.py). The sequence lengths are not arguments: they come
    from the step annotation around the call (:class:`StepAttention`); without one the cost
    stays missing. Causal: vLLM's decoder attention masks causally (``causal=True`` in every
    backend's ``forward`` for ``AttentionType.DECODER``). The KV cache holds the query's width
    when that is narrower (vLLM quantizes the query to the fp8 cache dtype)."""
    work = ins.context.attention
    t = _need(ins, 0, 1, 2)
    if work is None or t is None or any(len(s) != 3 for s, _ in t):
        return None
    q, k, v = t
    width = min(itemsize(q[1]), itemsize(k[1]))
    return attention_cost(q, k, v, work, causal=True, kv_itemsize=width)


def paged_attention_ragged(name: str, ins: OpInputs) -> OpCost | None:
    """aiter's ``paged_attention_ragged(out [T,Hq,D], workspace, query [T,Hq,D],
    key_cache [blocks, page, Hkv, D], value_cache [blocks, page, Hkv, Dv], kv_indptr,
    kv_page_indices, kv_last_page_lens, ...)`` as SGLang's aiter backend calls it (decode: one
    query token per sequence, causal is moot). The context lengths are device data: the
    step annotation gives them; without one the cost stays missing."""
    work = ins.context.attention
    t = _need(ins, 2, 3, 4)
    if work is None or t is None:
        return None
    q, kc, vc = t
    k = ([kc[0][0], kc[0][-2], kc[0][-1]], kc[1])
    v = ([vc[0][0], vc[0][-2], vc[0][-1]], vc[1])
    return attention_cost(q, k, v, work, causal=True)


# ---------------------------------------------------------------------------- norms
def rms_norm_cost(x: tuple[Shape, str], weight: tuple[Shape, str], *, tensors: int,
                  fused_add: bool) -> OpCost:
    """RMSNorm of ``rows x hidden``: ``4·hidden + 2`` FLOPs a row (square, sum, scale by the
    reciprocal RMS, by the weight; mean and rsqrt once a row), ``hidden`` more with a fused
    residual add (Zhang & Sennrich, RMSNorm, eq. 4). Bytes: ``tensors`` activations of the
    input's shape touched once each (reads and writes, as the op's signature has them) and the
    weight once."""
    shape, dtype = x
    rows = numel(shape[:-1]) if len(shape) > 1 else 1
    hidden = shape[-1]
    flops = rows * (4.0 * hidden + 2.0) + (rows * hidden if fused_add else 0.0)
    return OpCost(flops, tensors * _bytes(shape, dtype) + _bytes(*weight), "norm")


NORM_ROLES: dict[str, tuple[int, int, int, bool]] = {
    "_C::rms_norm": (1, 2, 2, False),                    # (out, input, weight, eps)
    "_C::fused_add_rms_norm": (0, 2, 4, True),           # (input!, residual!, weight, eps): both in place
    "aiter::rms_norm": (0, 1, 2, False),                 # (input, weight, eps, ...) -> out
    "aiter::rmsnorm": (1, 2, 2, False),                  # (out, input, weight, eps)
    "aiter::rmsnorm2d_fwd": (1, 2, 2, False),            # (out, input, weight, eps, ...)
    "aiter::add_rmsnorm": (1, 4, 4, True),               # (out, input, residual_in, residual_out, weight, eps)
    "aiter::rmsnorm2d_fwd_with_add": (1, 4, 4, True),    # same order (aiter/ops/rmsnorm.py)
    "aiter::rmsnorm2d_fwd_with_add_ck": (1, 4, 4, True),
}
"""op -> (position of the normalised input, position of the weight, activation tensors moved,
fused residual add), from each op's schema (vllm csrc/torch_bindings.cpp, aiter/ops/rmsnorm.py)."""


def framework_rms_norm(name: str, ins: OpInputs) -> OpCost | None:
    """The fused RMSNorms of vLLM and aiter (:data:`NORM_ROLES`), by :func:`rms_norm_cost`."""
    x_pos, w_pos, tensors, fused = NORM_ROLES[name]
    t = _need(ins, x_pos, w_pos)
    if t is None:
        return None
    return rms_norm_cost(t[0], t[1], tensors=tensors, fused_add=fused)


# ---------------------------------------------------------------------------- rope, activations
def rotary_embedding(name: str, ins: OpInputs) -> OpCost | None:
    """``rotary_embedding(positions [T], query [T, Hq·D], key [T, Hkv·D], head_size,
    cos_sin_cache [max_pos, rot_dim], is_neox)`` (vllm ``_C``, sgl_kernel): query and key
    rotated in place. 3 FLOPs per rotated element (``x1·cos - x2·sin``: two products, one
    sum; RoFormer eq. 34); bytes: query and key read and written, the positions and one
    cos/sin row per token read."""
    t = _need(ins, 0, 1, 2, 4)
    if t is None:
        return None
    (pos, dp), (q, dq), (k, dk), (cache, dc) = t
    moved = _bytes(q, dq) + _bytes(k, dk)
    rows = numel(pos) * cache[-1] * itemsize(dc)
    return OpCost(3.0 * (numel(q) + numel(k)), 2.0 * moved + _bytes(pos, dp) + rows, "elementwise")


ACT_FLOPS = {"silu_and_mul": 5, "gelu_and_mul": 9, "gelu_tanh_and_mul": 9, "gelu_new": 8,
             "gelu_fast": 8, "gelu_quick": 5, "mul_and_silu": 5, "swigluoai_and_mul": 7}
"""FLOPs per output element: the activation (:data:`.costs.FLOPS_PER_ELEMENT`'s silu 4,
gelu 8) and the product."""


def act_and_mul(name: str, ins: OpInputs) -> OpCost | None:
    """``silu_and_mul(out [T, I], input [T, 2I])`` and its gelu variants (vllm ``_C``,
    sgl_kernel): ``act(x[:, :I]) * x[:, I:]``. Bytes: input read, output written."""
    t = _need(ins, 0, 1)
    if t is None:
        return None
    (out, do), (x, dx) = t
    base = name.split("::", 1)[-1]
    return OpCost(float(ACT_FLOPS.get(base, 5) * numel(out)), _bytes(out, do) + _bytes(x, dx), "elementwise")


# ---------------------------------------------------------------------------- KV cache, quant
def reshape_and_cache(name: str, ins: OpInputs) -> OpCost | None:
    """``reshape_and_cache[_flash](key [T,Hkv,D], value [T,Hkv,D], key_cache, value_cache,
    slot_mapping [T], kv_cache_dtype, k_scale, v_scale)`` (vllm ``_C_cache_ops``): the new
    tokens' K and V read, written into the cache in its width, the slots read. No FLOPs
    (a conversion to an fp8 cache is a cast, counted as a copy is)."""
    t = _need(ins, 0, 1, 2, 3, 4)
    if t is None:
        return None
    (k, dk), (v, dv), (_, dkc), (_, dvc), (slots, ds) = t
    written = numel(k) * itemsize(dkc) + numel(v) * itemsize(dvc)
    return OpCost(0.0, _bytes(k, dk) + _bytes(v, dv) + written + _bytes(slots, ds), "memory")


def store_cache(name: str, ins: OpInputs) -> OpCost | None:
    """``sglang::store_cache(k [T, Hkv·D], v, k_cache [N, Hkv·D], v_cache, loc [T], ...)``:
    as :func:`reshape_and_cache`."""
    return reshape_and_cache(name, ins)


def scaled_quant(name: str, ins: OpInputs) -> OpCost | None:
    """``static_scaled_fp8_quant(out, input, scale)`` / ``dynamic_scaled_fp8_quant(out,
    input, scale)`` / ``dynamic_per_token_scaled_fp8_quant(out, input, scales, ...)`` (vllm
    ``_C``): one FLOP per element (the scale; the dynamic forms one more for the absmax);
    bytes: input read, output and scales written."""
    t = _need(ins, 0, 1)
    if t is None:
        return None
    (out, do), (x, dx) = t
    per = 1.0 if "static" in name else 2.0
    scale = _tensor(ins, 2)
    extra = _bytes(*scale) if scale is not None and scale[0] else 4.0
    return OpCost(per * numel(x), _bytes(out, do) + _bytes(x, dx) + extra, "elementwise")


# ---------------------------------------------------------------------------- GEMMs
def linear_wrapper(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::rocm_unquantized_gemm(x [M,K], weight [N,K], bias [N])`` and
    ``aiter::gemm_a16w16(A [M,K], B [N,K], bias, out_dtype, ...)``: ``aten::linear``'s
    formula (``2·M·N·K``; x, weight, bias read, output written), from their schemas
    (vllm/model_executor/layers/utils.py, aiter/ops/gemm_op_a16w16.py)."""
    from .costs import _gemm

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
    t = _need(ins, 0, 1)
    if t is None:
        return None
    (a, da), (b, db) = t
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    m, k, n = a[0], a[1], b[1]
    scales = sum(_bytes(*s) for s in (_tensor(ins, 2), _tensor(ins, 3), _tensor(ins, 4)) if s is not None)
    out_code = ins.concrete[6] if len(ins.concrete) > 6 else None
    out_width = {"5": 2, "15": 2, "6": 4}.get(out_code or "", 2)
    nbytes = _bytes(a, da) + _bytes(b, db) + scales + m * n * out_width
    return OpCost(2.0 * m * n * k, nbytes, "gemm", precision=_gemm_precision(da, db))


def cutlass_scaled_mm(name: str, ins: OpInputs) -> OpCost | None:
    """``_C::cutlass_scaled_mm(out [M,N], a [M,K], b [K,N], a_scales, b_scales, bias)``
    (vllm csrc/torch_bindings.cpp): as :func:`scaled_mm`, the output recorded."""
    t = _need(ins, 0, 1, 2)
    if t is None:
        return None
    (out, do), (a, da), (b, db) = t
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        return None
    scales = sum(_bytes(*s) for s in (_tensor(ins, 3), _tensor(ins, 4), _tensor(ins, 5)) if s is not None)
    nbytes = _bytes(a, da) + _bytes(b, db) + scales + _bytes(out, do)
    return OpCost(2.0 * a[0] * b[1] * a[1], nbytes, "gemm", precision=_gemm_precision(da, db))


PRECISION_WIDTH = {"fp4": 0, "fp8": 1, "int8": 1, "bf16": 2, "fp16": 2, "fp32": 3}


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
    t = _need(ins, 0, 1)
    if t is None:
        return None
    (x, dx), (logits, _) = t
    if len(x) != 2 or len(logits) != 2 or not is_gpt_oss(x[1], logits[1]):
        return None
    ranks = ins.context.world_size or 1
    inter = max(x[1] // ranks, 1)
    return moe_cost(x[0], x[1], inter, logits[1], int(GPT_OSS_MOE["topk"]), gated=True,
                    act_dtype=dx, weight_format=str(GPT_OSS_MOE["weight_format"]))


def routing_topk(name: str, ins: OpInputs) -> OpCost | None:
    """``TopK(logits [T, E], k, apply_softmax, dim, return_bitmatrix, ...)``, the
    ``record_function`` of triton_kernels' routing (triton_kernels/topk.py, vLLM's GPT-OSS
    path): one comparison per logit (the reductions' convention) and a softmax over the ``k``
    kept (5 each); bytes: the logits read, ``k`` values (the logits' width) and int16 indices
    written a token, and the token x expert bitmatrix (one bit each, in 32-bit words)."""
    t = _need(ins, 0)
    k = _int(ins, 1)
    if t is None or k is None or len(t[0][0]) != 2:
        return None
    (shape, dtype), = t
    tokens, experts = shape
    written = tokens * k * (itemsize(dtype) + 2) + tokens * -(-experts // 32) * 4
    return OpCost(float(tokens * experts + 5 * tokens * k), _bytes(shape, dtype) + written, "reduction")


def routing_sort(name: str, ins: OpInputs) -> OpCost | None:
    """``SortTokens(expt_scal [T, k], expt_indx [T, k], n_expts_tot)`` (triton_kernels/routing.py):
    the expert histogram and the gather/scatter permutation. One operation per (token,
    expert) pair; bytes: both inputs read, the two int32 permutations written and the
    ``n_expts_tot + 1`` int32 offsets."""
    t = _need(ins, 0, 1)
    experts = _int(ins, 2)
    if t is None or experts is None:
        return None
    (scal, ds), (indx, di) = t
    pairs = numel(indx)
    return OpCost(float(pairs), _bytes(scal, ds) + _bytes(indx, di) + 2 * pairs * 4 + (experts + 1) * 4, "reduction")


def _int(ins: OpInputs, pos: int) -> int | None:
    text = ins.concrete[pos] if pos < len(ins.concrete) else None
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


INDUCTOR_FREE = frozenset({"to_copy", "_to_copy", "copy", "clone", "constant_pad_nd", "view", "unsafe_view",
                           "_unsafe_view", "cat", "slice", "select", "permute", "transpose", "expand", "squeeze",
                           "unsqueeze", "t", "reshape", "lift_fresh", "alias", "split", "split_with_sizes"})
"""Ops an Inductor kernel name may list that move data without arithmetic."""


def inductor_pointwise(name: str, ins: OpInputs) -> OpCost | None:
    """An Inductor pointwise Triton kernel (``triton_poi_fused_<ops>_<n>(in_ptr..., out_ptr...,
    xnumel)``; torch/_inductor/codegen/triton.py): every pointer argument is one tensor read
    or written once (bytes: their sum), over ``xnumel`` elements (the last integer argument);
    FLOPs per element: one per arithmetic op its name lists (:data:`.costs.FLOPS_PER_ELEMENT`
    where named), none for the data-movement ones (:data:`INDUCTOR_FREE`). A kernel whose
    name lists no op, or a gather (``embedding``, ``index``: its table is not read whole),
    stays missing."""
    from .costs import ELEMENTWISE, FLOPS_PER_ELEMENT

    ops = _fused_ops(name.split("::")[-1], ELEMENTWISE | INDUCTOR_FREE)
    xnumel = next((_int(ins, i) for i in range(len(ins.concrete) - 1, -1, -1) if _int(ins, i) is not None), None)
    tensors = [(s, d) for s, d in zip(ins.shapes, ins.dtypes) if s is not None]
    if not ops or xnumel is None or not tensors:
        return None
    per = sum(0 if op in INDUCTOR_FREE else FLOPS_PER_ELEMENT.get(op, 1) for op in ops)
    return OpCost(float(per * xnumel), sum(_bytes(s, d) for s, d in tensors), "elementwise")


def _fused_ops(kernel: str, vocabulary: frozenset[str]) -> list[str] | None:
    """The aten ops of ``triton_poi_fused_add_mul_0``'s name (``[add, mul]``), matched greedily
    against ``vocabulary`` (op names hold underscores: ``bitwise_and``), or None when a part
    of the name is not an op."""
    match = re.fullmatch(r"triton_poi_fused_(.+?)_\d+", kernel)
    if match is None:
        return None
    words, ops, i = match.group(1).split("_"), [], 0
    while i < len(words):
        for j in range(len(words), i, -1):
            piece = "_".join(words[i:j])
            if piece in vocabulary or piece.lstrip("_") in vocabulary:
                ops.append(piece.lstrip("_"))
                i = j
                break
        else:
            if words[i] == "":
                i += 1
                continue
            return None
    return ops or None


# ---------------------------------------------------------------------------- collectives
def all_reduce(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::all_reduce(tensor, group_name)``, ``symm_mem::multimem_all_reduce_(input,
    reduce_op, group_name)``, ``c10d::allreduce_``: the bytes each rank moves, NCCL's bus
    convention ``2·(p-1)/p·N`` (nccl-tests PERFORMANCE.md), p the job's ranks. FLOPs are left
    missing: where the reduction runs (SMs, NVLink SHARP switches) is not in the trace."""
    t = _tensor(ins, 0)
    ranks = ins.context.world_size
    if t is None or not t[0] or not ranks or ranks < 2:
        return None
    return OpCost(float("nan"), 2.0 * (ranks - 1) / ranks * _bytes(*t), "comm")


def all_gather(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::all_gather(tensor, dim, world_size, group_name)``: ``(p-1)·N`` bytes into each
    rank (its input of N bytes from every other rank; nccl-tests' algorithm bytes of an
    all-gather are ``(p-1)/p`` of the ``p·N`` output). FLOPs missing (none are done)."""
    t = _tensor(ins, 0)
    ranks = ins.context.world_size
    if t is None or not t[0] or not ranks or ranks < 2:
        return None
    return OpCost(float("nan"), (ranks - 1) * _bytes(*t), "comm")


FrameworkFormula = Callable[[str, OpInputs], "OpCost | None"]

FORMULAS: dict[str, FrameworkFormula] = {
    "vllm::unified_attention_with_output": vllm_unified_attention,
    "vllm::unified_attention": vllm_unified_attention,
    **{name: framework_rms_norm for name in NORM_ROLES},
    "_C::rotary_embedding": rotary_embedding,
    "sgl_kernel::rotary_embedding": rotary_embedding,
    **{f"{ns}::{op}": act_and_mul for ns in ("_C", "sgl_kernel") for op in ACT_FLOPS},
    "_C_cache_ops::reshape_and_cache_flash": reshape_and_cache,
    "_C_cache_ops::reshape_and_cache": reshape_and_cache,
    "sglang::store_cache": store_cache,
    "_C::static_scaled_fp8_quant": scaled_quant,
    "_C::dynamic_scaled_fp8_quant": scaled_quant,
    "_C::dynamic_per_token_scaled_fp8_quant": scaled_quant,
    "aten::_scaled_mm": scaled_mm,
    "_C::cutlass_scaled_mm": cutlass_scaled_mm,
    "vllm::moe_forward": moe_forward,
    "vllm::rocm_unquantized_gemm": linear_wrapper,
    "aiter::gemm_a16w16": linear_wrapper,
    "vllm::all_reduce": all_reduce,
    "symm_mem::multimem_all_reduce_": all_reduce,
    "vllm::all_gather": all_gather,
    "TopK": routing_topk,
    "SortTokens": routing_sort,
}
"""Qualified op name (overload dropped) -> formula."""

PATTERNS: tuple[tuple[re.Pattern[str], FrameworkFormula], ...] = (
    (re.compile(r"paged_attention_ragged"), paged_attention_ragged),
    (re.compile(r"^triton_poi_fused_"), inductor_pointwise),
)
"""Ops named with a varying prefix or suffix (SGLang's ``sglang_profiler::attention_paged_attention_ragged_100``)."""


def qualified(op: str) -> str:
    """``_C::rms_norm.default`` -> ``_C::rms_norm``."""
    ns, _, rest = op.rpartition("::")
    return f"{ns}::{rest.split('.', 1)[0]}" if ns else rest.split(".", 1)[0]


def framework_formula(op: str) -> FrameworkFormula | None:
    """The formula of a framework op, or None."""
    name = qualified(op)
    found = FORMULAS.get(name)
    if found is not None:
        return found
    if not name.startswith("aten::"):
        for pattern, formula in PATTERNS:
            if pattern.search(name):
                return formula
    return None


NEEDS_STEP = frozenset({vllm_unified_attention, paged_attention_ragged})
"""Formulas that need the step's sequence sums (:attr:`OpContext.attention`)."""


def needs_step(op: str) -> bool:
    """True when ``op``'s formula needs the step's sequence sums."""
    return framework_formula(op) in NEEDS_STEP


CATEGORY = {
    vllm_unified_attention: "attention", paged_attention_ragged: "attention", framework_rms_norm: "norm",
    rotary_embedding: "elementwise", act_and_mul: "elementwise", scaled_quant: "elementwise",
    reshape_and_cache: "memory", store_cache: "memory", scaled_mm: "gemm", linear_wrapper: "gemm", cutlass_scaled_mm: "gemm",
    moe_forward: "gemm", all_reduce: "comm", all_gather: "comm", routing_topk: "reduction",
    routing_sort: "reduction", inductor_pointwise: "elementwise",
}
"""Formula -> the category of its op (also when its cost is missing)."""


def framework_category(op: str) -> str | None:
    """The category of a framework op with a formula, else None."""
    formula = framework_formula(op)
    return CATEGORY.get(formula) if formula is not None else None


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
