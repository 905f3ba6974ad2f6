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
from functools import lru_cache
from typing import Any

from .args import (
    OpContext,
    StepAttention,
    int_arg,
    nbytes_of,
    step_attention,
    tensor_arg,
    tensor_args,
)
from .attention import FLASHINFER_RUN, FRAMEWORK_SIGNATURES, Heads, framework_attention
from .attention import attention_cost as shaped_attention
from .base import OpCost, OpInputs, Shape, itemsize, numel
from .quantized import (
    GPT_OSS_MOE,
    cutlass_scaled_fp4_mm,
    cutlass_scaled_mm,
    is_gpt_oss,
    kernel_precision,
    linear_wrapper,
    moe_cost,
    moe_forward,
    scaled_mm,
    storage_bytes,
)

__all__ = ["GPT_OSS_MOE", "OpContext", "StepAttention", "attention_cost", "framework_category", "framework_formula",
           "is_gpt_oss", "kernel_precision", "moe_cost", "step_attention", "storage_bytes"]


# ---------------------------------------------------------------------------- attention
def attention_cost(q: tuple[Shape, str], k: tuple[Shape, str], v: tuple[Shape, str],
                   work: StepAttention, *, causal: bool, kv_itemsize: float | None = None) -> OpCost:
    """FLOPs and bytes of varlen attention over a step's sequences, by the one attention
    formula (:func:`.attention.attention_cost`: ``2·Hq·(D + Dv)·pairs``; Q and O once, K and V of
    every key position once).

    Args:
        q, k, v: (shape, dtype) of the query ``[T, Hq, D]``, key ``[T, Hkv, D]``, value
            ``[T, Hkv, Dv]`` arguments (the step's new tokens).
        work: the step's sequence sums.
        causal: decoder self-attention (a query sees keys up to its own position).
        kv_itemsize: bytes per cached K/V element (default: the key's dtype).
    """
    (qs, dq), (ks, dk), (vs, _) = q, k, v
    width = kv_itemsize if kv_itemsize is not None else itemsize(dk)
    heads = Heads(qs[-2], ks[-2], qs[-1], vs[-1])
    return shaped_attention(heads, work, causal=causal, q_itemsize=itemsize(dq), kv_itemsize=width,
                            o_itemsize=max(itemsize(dq), itemsize(dk)))  # an fp8 query gives bf16 out


def vllm_unified_attention(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::unified_attention_with_output(query [T,Hq,D], key [T,Hkv,D], value [T,Hkv,Dv],
    output [T,Hq,Dv], layer_name, ...)`` and ``vllm::unified_attention(query, key, value,
    layer_name)`` (vllm/attention/layer.py), through :func:`.attention.framework_attention`. The
    sequence lengths are not arguments: they come from the step annotation around the call
    (:class:`StepAttention`); without one the cost stays missing. Causal: vLLM's decoder
    attention masks causally (``causal=True`` in every backend's ``forward`` for
    ``AttentionType.DECODER``). The KV cache holds the query's width when that is narrower
    (vLLM quantizes the query to the fp8 cache dtype)."""
    return framework_attention(name, ins)


def paged_attention_ragged(name: str, ins: OpInputs) -> OpCost | None:
    """aiter's ``paged_attention_ragged(out [T,Hq,D], workspace, query [T,Hq,D],
    key_cache [blocks, page, Hkv, D], value_cache [blocks, page, Hkv, Dv], ...)``
    (aiter/ops/attention.py) as SGLang's aiter backend calls it, recorded by SGLang's shape
    profiler as ``sglang_profiler::attention_paged_attention_ragged_<n>`` (the counter is
    dropped by :func:`qualified`), through :func:`.attention.framework_attention`. Decode: one
    query token per sequence, causal is moot. The context lengths are device data
    (``kv_indptr``): the step annotation gives them; without one the cost stays missing."""
    return framework_attention(name, ins)


def batch_attention(name: str, ins: OpInputs) -> OpCost | None:
    """The varlen and paged prefill attentions of aiter (``mha_batch_prefill``,
    ``mha_varlen_fwd``), flash-attn (``_flash_attn_varlen_forward``), vLLM's flash-attn
    (``varlen_fwd``) and flashinfer (``<uri>_ragged_run`` / ``<uri>_paged_run``): their
    argument positions are in :data:`.attention.FRAMEWORK_SIGNATURES`, their cost the one
    formula. The sequences come from the step annotation, else from the op's own totals when
    every sequence has the same lengths; else the cost stays missing."""
    return framework_attention(name, ins)


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
    return OpCost(flops, tensors * nbytes_of(shape, dtype) + nbytes_of(*weight), "norm")


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
    t = tensor_args(ins, x_pos, w_pos)
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
    t = tensor_args(ins, 0, 1, 2, 4)
    if t is None:
        return None
    (pos, dp), (q, dq), (k, dk), (cache, dc) = t
    moved = nbytes_of(q, dq) + nbytes_of(k, dk)
    rows = numel(pos) * cache[-1] * itemsize(dc)
    return OpCost(3.0 * (numel(q) + numel(k)), 2.0 * moved + nbytes_of(pos, dp) + rows, "elementwise")


ACT_FLOPS = {"silu_and_mul": 5, "gelu_and_mul": 9, "gelu_tanh_and_mul": 9, "gelu_new": 8,
             "gelu_fast": 8, "gelu_quick": 5, "mul_and_silu": 5, "swigluoai_and_mul": 7}
"""FLOPs per output element: the activation (:data:`.costs.FLOPS_PER_ELEMENT`'s silu 4,
gelu 8) and the product."""


def act_and_mul(name: str, ins: OpInputs) -> OpCost | None:
    """``silu_and_mul(out [T, I], input [T, 2I])`` and its gelu variants (vllm ``_C``,
    sgl_kernel): ``act(x[:, :I]) * x[:, I:]``. Bytes: input read, output written."""
    t = tensor_args(ins, 0, 1)
    if t is None:
        return None
    (out, do), (x, dx) = t
    base = name.split("::", 1)[-1]
    return OpCost(float(ACT_FLOPS.get(base, 5) * numel(out)), nbytes_of(out, do) + nbytes_of(x, dx), "elementwise")


# ---------------------------------------------------------------------------- KV cache, quant
def reshape_and_cache(name: str, ins: OpInputs) -> OpCost | None:
    """``reshape_and_cache[_flash](key [T,Hkv,D], value [T,Hkv,D], key_cache, value_cache,
    slot_mapping [T], kv_cache_dtype, k_scale, v_scale)`` (vllm ``_C_cache_ops``): the new
    tokens' K and V read, written into the cache in its width, the slots read. No FLOPs
    (a conversion to an fp8 cache is a cast, counted as a copy is)."""
    t = tensor_args(ins, 0, 1, 2, 3, 4)
    if t is None:
        return None
    (k, dk), (v, dv), (_, dkc), (_, dvc), (slots, ds) = t
    written = numel(k) * itemsize(dkc) + numel(v) * itemsize(dvc)
    return OpCost(0.0, nbytes_of(k, dk) + nbytes_of(v, dv) + written + nbytes_of(slots, ds), "memory")


def store_cache(name: str, ins: OpInputs) -> OpCost | None:
    """``sglang::store_cache(k [T, Hkv·D], v, k_cache [N, Hkv·D], v_cache, loc [T], ...)``:
    as :func:`reshape_and_cache`."""
    return reshape_and_cache(name, ins)


def scaled_quant(name: str, ins: OpInputs) -> OpCost | None:
    """``static_scaled_fp8_quant(out, input, scale)`` / ``dynamic_scaled_fp8_quant(out,
    input, scale)`` / ``dynamic_per_token_scaled_fp8_quant(out, input, scales, ...)`` (vllm
    ``_C``): one FLOP per element (the scale; the dynamic forms one more for the absmax);
    bytes: input read, output and scales written."""
    t = tensor_args(ins, 0, 1)
    if t is None:
        return None
    (out, do), (x, dx) = t
    per = 1.0 if "static" in name else 2.0
    scale = tensor_arg(ins, 2)
    extra = nbytes_of(*scale) if scale is not None and scale[0] else 4.0
    return OpCost(per * numel(x), nbytes_of(out, do) + nbytes_of(x, dx) + extra, "elementwise")


def routing_topk(name: str, ins: OpInputs) -> OpCost | None:
    """``TopK(logits [T, E], k, apply_softmax, dim, return_bitmatrix, ...)``, the
    ``record_function`` of triton_kernels' routing (triton_kernels/topk.py, vLLM's GPT-OSS
    path): one comparison per logit (the reductions' convention) and a softmax over the ``k``
    kept (5 each); bytes: the logits read, ``k`` values (the logits' width) and int16 indices
    written a token, and the token x expert bitmatrix (one bit each, in 32-bit words)."""
    t = tensor_args(ins, 0)
    k = int_arg(ins, 1)
    if t is None or k is None or len(t[0][0]) != 2:
        return None
    (shape, dtype), = t
    tokens, experts = shape
    written = tokens * k * (itemsize(dtype) + 2) + tokens * -(-experts // 32) * 4
    return OpCost(float(tokens * experts + 5 * tokens * k), nbytes_of(shape, dtype) + written, "reduction")


def routing_sort(name: str, ins: OpInputs) -> OpCost | None:
    """``SortTokens(expt_scal [T, k], expt_indx [T, k], n_expts_tot)`` (triton_kernels/routing.py):
    the expert histogram and the gather/scatter permutation. One operation per (token,
    expert) pair; bytes: both inputs read, the two int32 permutations written and the
    ``n_expts_tot + 1`` int32 offsets."""
    t = tensor_args(ins, 0, 1)
    experts = int_arg(ins, 2)
    if t is None or experts is None:
        return None
    (scal, ds), (indx, di) = t
    pairs = numel(indx)
    return OpCost(float(pairs), nbytes_of(scal, ds) + nbytes_of(indx, di) + 2 * pairs * 4 + (experts + 1) * 4, "reduction")


INDUCTOR_FREE = frozenset({"to_copy", "_to_copy", "copy", "clone", "constant_pad_nd", "view", "unsafe_view",
                           "_unsafe_view", "cat", "slice", "select", "permute", "transpose", "expand", "squeeze",
                           "unsqueeze", "t", "reshape", "lift_fresh", "alias", "split", "split_with_sizes"})
"""Ops an Inductor kernel name may list that move data without arithmetic."""


def inductor_pointwise(name: str, ins: OpInputs) -> OpCost | None:
    """An Inductor pointwise Triton kernel (``triton_poi_fused_<ops>_<n>(in_ptr..., out_ptr...,
    xnumel)``; torch/_inductor/codegen/triton.py): every pointer argument is one tensor read
    or written once (bytes: their sum), over ``xnumel`` elements (the last integer argument);
    FLOPs per element: one per arithmetic op its name lists (:data:`.costs.FLOPS_PER_ELEMENT`
    where named), none for the data-movement ones (:data:`INDUCTOR_FREE`) and the custom ops
    it prepares inputs for (:func:`custom_op_names`). A kernel whose
    name lists no op, or a gather (``embedding``, ``index``: its table is not read whole),
    stays missing."""
    from .base import ELEMENTWISE, FLOPS_PER_ELEMENT

    ops = _fused_ops(name.split("::")[-1], ELEMENTWISE | INDUCTOR_FREE | custom_op_names())
    xnumel = next((int_arg(ins, i) for i in range(len(ins.concrete) - 1, -1, -1) if int_arg(ins, i) is not None), None)
    tensors = [(s, d) for s, d in zip(ins.shapes, ins.dtypes) if s is not None]
    if not ops or xnumel is None or not tensors:
        return None
    free = INDUCTOR_FREE | custom_op_names()
    per = sum(0 if op in free else FLOPS_PER_ELEMENT.get(op, 1) for op in ops)
    return OpCost(float(per * xnumel), sum(nbytes_of(s, d) for s, d in tensors), "elementwise")


@lru_cache(maxsize=1)
def custom_op_names() -> frozenset[str]:
    """Base names of the framework ops of :data:`FORMULAS` (``moe_forward``). Inductor lists a
    custom op among a kernel's origins when the kernel prepares its input
    (``triton_poi_fused_constant_pad_nd_moe_forward_0`` pads ``moe_forward``'s hidden states);
    the custom op runs on its own, so its name adds no arithmetic to the kernel."""
    return frozenset(qualified(n).split("::")[-1] for n in FORMULAS if "::" in n)


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
    t = tensor_arg(ins, 0)
    ranks = ins.context.world_size
    if t is None or not t[0] or not ranks or ranks < 2:
        return None
    return OpCost(float("nan"), 2.0 * (ranks - 1) / ranks * nbytes_of(*t), "comm")


def all_gather(name: str, ins: OpInputs) -> OpCost | None:
    """``vllm::all_gather(tensor, dim, world_size, group_name)``: ``(p-1)·N`` bytes into each
    rank (its input of N bytes from every other rank; nccl-tests' algorithm bytes of an
    all-gather are ``(p-1)/p`` of the ``p·N`` output). FLOPs missing (none are done)."""
    t = tensor_arg(ins, 0)
    ranks = ins.context.world_size
    if t is None or not t[0] or not ranks or ranks < 2:
        return None
    return OpCost(float("nan"), (ranks - 1) * nbytes_of(*t), "comm")


FrameworkFormula = Callable[[str, OpInputs], "OpCost | None"]

FORMULAS: dict[str, FrameworkFormula] = {
    "vllm::unified_attention_with_output": vllm_unified_attention,
    "vllm::unified_attention": vllm_unified_attention,
    "sglang_profiler::attention_paged_attention_ragged": paged_attention_ragged,
    "aiter::paged_attention_ragged": paged_attention_ragged,
    **{name: batch_attention for name in FRAMEWORK_SIGNATURES if name not in (
        "vllm::unified_attention_with_output", "vllm::unified_attention", "aiter::paged_attention_ragged",
        "sglang_profiler::attention_paged_attention_ragged")},
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
    "_C::cutlass_scaled_fp4_mm": cutlass_scaled_fp4_mm,
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
    (re.compile(r"^triton_poi_fused_"), inductor_pointwise),
    (FLASHINFER_RUN, batch_attention),
)
"""Ops named with a varying suffix (Inductor's ``triton_poi_fused_add_mul_0``)."""

COUNTED_NAMESPACES = frozenset({"sglang_profiler"})
"""Namespaces whose op names end in a per-call-site counter: SGLang's kernel shape profiler
registers each wrapped launcher as the custom op ``sglang_profiler::<module>_<function>_<n>``
(``attention_paged_attention_ragged_100``), ``n`` numbering the wrappers of one run, so the same
function gets another ``n`` in another build or run. TraceLens strips it the same way
(``normalize_sglang_profiler_op_names``: ``^(sglang_profiler::.+?)_\\d+$``)."""

_COUNTER = re.compile(r"_\d+$")


def qualified(op: str) -> str:
    """The name a framework op's formula is keyed by: the overload dropped
    (``_C::rms_norm.default`` -> ``_C::rms_norm``) and, in :data:`COUNTED_NAMESPACES`, the
    trailing call-site counter (``sglang_profiler::attention_paged_attention_ragged_100`` ->
    ``sglang_profiler::attention_paged_attention_ragged``)."""
    ns, _, rest = op.rpartition("::")
    if not ns:
        return rest.split(".", 1)[0]
    base = rest.split(".", 1)[0]
    if ns in COUNTED_NAMESPACES:
        base = _COUNTER.sub("", base)
    return f"{ns}::{base}"


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


NEEDS_STEP = frozenset({vllm_unified_attention, paged_attention_ragged, batch_attention})
"""Formulas that need the step's sequence sums (:attr:`OpContext.attention`)."""


CATEGORY: dict[Any, str] = {
    vllm_unified_attention: "attention", paged_attention_ragged: "attention", batch_attention: "attention",
    framework_rms_norm: "norm",
    rotary_embedding: "elementwise", act_and_mul: "elementwise", scaled_quant: "elementwise",
    reshape_and_cache: "memory", store_cache: "memory", scaled_mm: "gemm", linear_wrapper: "gemm", cutlass_scaled_fp4_mm: "gemm", cutlass_scaled_mm: "gemm",
    moe_forward: "gemm", all_reduce: "comm", all_gather: "comm", routing_topk: "reduction",
    routing_sort: "reduction", inductor_pointwise: "elementwise",
}
"""Formula -> the category of its op (also when its cost is missing)."""


def framework_category(op: str) -> str | None:
    """The category of a framework op with a formula, else None."""
    formula = framework_formula(op)
    return CATEGORY.get(formula) if formula is not None else None

