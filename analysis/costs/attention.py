"""Attention priced from its shapes: one formula for every framework's attention op.

Every attention op, whatever its name or framework, computes ``softmax(Q Kᵀ) V`` over some
(query, key) pairs. Its cost depends on four things only, all read from its inputs:

- the heads and head dims: ``h_q``, ``h_kv``, ``d_qk`` (Q and K), ``d_v`` (V and O);
- the sequences: per sequence its query tokens ``q`` and key tokens ``k`` (dense ``[b, h, s, d]``
  or ``[b, s, h, d]``: ``b`` sequences of the same lengths; varlen: ``cu_seqlens``; paged: the
  step's sequence lengths, :class:`.args.StepAttention`);
- the mask: causal or not, and where a causal mask is aligned when ``q != k`` (flash-attn,
  vLLM, aiter, flashinfer: bottom right, a query sees the keys up to its own position at the
  end of the context; PyTorch's ``scaled_dot_product_attention(is_causal=True)``: top left);
- the storage widths of Q, K/V (the cache's) and O.

:func:`attention_cost` is the one formula:

- FLOPs ``= 2·h_q·(d_qk + d_v)·pairs``: QKᵀ is ``2·h_q·d_qk`` per (query, key) pair and PV
  ``2·h_q·d_v``; for ``d_qk = d_v = d`` and no mask, ``4·b·h·q·k·d`` (two matmuls of
  ``2·b·h·q·k·d`` each). ``pairs`` is ``q·k`` per sequence without a mask and the triangle
  (``q(q+1)/2`` for ``q = k``) or trapezoid (``q·k - q(q-1)/2`` for ``q < k``, bottom right)
  under a causal one. Softmax and scaling are not counted (FlashAttention-2's convention).
  GQA/MQA (``h_kv < h_q``) changes the bytes, not the FLOPs.
- bytes: Q and O once (``q_tokens·h_q·d``), K and V once (``k_tokens·h_kv·(d_qk + d_v)``) in
  the KV cache's width.

The adapters below only read an op's inputs into those numbers: :func:`sdpa` (aten's
``scaled_dot_product_attention`` family), :func:`varlen` (flash-attn / aiter varlen with
``cu_seqlens``), :func:`paged` (aiter ``mha_batch_prefill``, flashinfer's ragged and paged runs,
vLLM's and SGLang's paged ops) and :func:`by_name` (any other op whose name says attention and
whose first tensors are q, k, v). Where the sequence lengths are neither in the shapes nor in
the step around the call, the cost stays missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .args import StepAttention, int_arg
from .base import OpCost, OpInputs, Shape, itemsize

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True)
class Heads:
    """Heads and head dims of one attention call (``d_v`` may differ from ``d_qk``: MLA)."""

    q: int
    kv: int
    d_qk: int
    d_v: int


def attention_cost(heads: Heads, work: StepAttention, *, causal: bool, q_itemsize: float,
                   kv_itemsize: float, o_itemsize: float | None = None, pairs: float | None = None) -> OpCost:
    """FLOPs and bytes of attention over the sequences ``work`` sums (see the module doc).

    Args:
        heads: heads and head dims.
        work: sums over the sequences (``sq``, ``sk``, ``sqsq``, ``sqsk``).
        causal: a causal mask (bottom-right aligned where ``q != k``; ``pairs`` overrides it).
        q_itemsize, kv_itemsize, o_itemsize: bytes per element of Q, of the K/V read (the
            cache's width), of O (default: Q's).
        pairs: the (query, key) pairs attended, when the caller counted them (a top-left mask).
    """
    n = work.pairs(causal=causal) if pairs is None else pairs
    flops = 2.0 * heads.q * (heads.d_qk + heads.d_v) * n
    o_size = q_itemsize if o_itemsize is None else o_itemsize
    q_bytes = float(work.sq) * heads.q * heads.d_qk * q_itemsize
    o_bytes = float(work.sq) * heads.q * heads.d_v * o_size
    kv_bytes = float(work.sk) * heads.kv * (heads.d_qk + heads.d_v) * kv_itemsize
    return OpCost(flops, q_bytes + o_bytes + kv_bytes, "attention")


def dense_work(b: int, q_len: int, k_len: int) -> StepAttention:
    """The sums of ``b`` sequences of ``q_len`` queries over ``k_len`` keys each."""
    return StepAttention(b * q_len, b * k_len, b * q_len * q_len, b * q_len * k_len)


def top_left_pairs(b: int, q_len: int, k_len: int) -> float:
    """Pairs under a causal mask aligned top left (PyTorch SDPA's ``is_causal``): query ``i``
    sees keys ``0..i`` (at most ``k_len``)."""
    if q_len <= k_len:
        return b * q_len * (q_len + 1) / 2.0
    return b * (k_len * (k_len + 1) / 2.0 + (q_len - k_len) * k_len)


def uniform_work(b: int, total_q: int, total_k: int, max_q: int | None, max_k: int | None) -> StepAttention | None:
    """The sums of a varlen batch from its totals, when they say every sequence has the same
    lengths (``b·max_q == total_q`` and ``b·max_k == total_k``); else None (the lengths of the
    sequences are device data, not in the trace)."""
    if b <= 0 or max_q is None or max_k is None or b * max_q != total_q or b * max_k != total_k:
        return None
    return dense_work(b, max_q, max_k)


# ---------------------------------------------------------------------------- reading the inputs
def _flag(ins: OpInputs, pos: int) -> bool | None:
    """A boolean ``Concrete Inputs`` value (``True`` / ``False``), else None."""
    text = ins.concrete[pos] if pos < len(ins.concrete) else None
    return {"True": True, "False": False, "1": True, "0": False}.get(text or "")


def _tensor(ins: OpInputs, pos: int) -> tuple[Shape, str] | None:
    if pos >= len(ins.shapes) or not ins.shapes[pos]:
        return None
    return ins.shapes[pos], ins.dtypes[pos] or "float"  # type: ignore[return-value]


def _batch_of(ins: OpInputs, pos: int) -> int | None:
    """``b`` from a ``[b+1]`` offsets tensor (``cu_seqlens``, ``qo_indptr``)."""
    t = _tensor(ins, pos)
    return t[0][0] - 1 if t is not None and len(t[0]) == 1 else None


# aten: (positions of the is_causal flag, layout, positions of cu_seqlens_q, cu_seqlens_k, max_q, max_k)
SDPA_SIGNATURES: dict[str, tuple[int | None, str, tuple[int, int, int, int] | None]] = {
    "scaled_dot_product_attention": (5, "bhsd", None),            # (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    "_scaled_dot_product_attention_math": (5, "bhsd", None),      # (q, k, v, attn_mask, dropout_p, is_causal, dropout_mask, scale)
    "_scaled_dot_product_flash_attention": (4, "bhsd", None),     # (q, k, v, dropout_p, is_causal, return_debug_mask, scale)
    "_scaled_dot_product_flash_attention_for_cpu": (4, "bhsd", None),  # (q, k, v, dropout_p, is_causal, attn_mask, scale)
    "_scaled_dot_product_efficient_attention": (6, "bhsd", None),  # (q, k, v, attn_bias, compute_lse, dropout_p, is_causal, scale)
    "_scaled_dot_product_cudnn_attention": (6, "bhsd", None),     # (q, k, v, attn_bias, compute_lse, dropout_p, is_causal, ...)
    "_flash_attention_forward": (8, "bshd", (3, 4, 5, 6)),       # (q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, ...)
    "_efficient_attention_forward": (9, "bshd", (4, 5, 6, 7)),   # (q, k, v, bias, cu_q, cu_k, max_q, max_k, dropout_p, custom_mask_type, ...)
}
"""aten's attention ops (native_functions.yaml): where each keeps its causal flag, its layout,
and for the varlen forms where its offsets and maximum lengths are."""


def _dense_heads(q: Shape, k: Shape, v: Shape, layout: str) -> tuple[int, int, int, Heads]:
    """(b, q_len, k_len, heads) of dense 4-D q, k, v in ``bhsd`` or ``bshd`` layout."""
    if layout == "bshd":
        q, k, v = [q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]], [v[0], v[2], v[1], v[3]]
    return q[0], q[2], k[2], Heads(q[1], k[1], q[3], v[3])


def sdpa(name: str, ins: OpInputs) -> OpCost | None:
    """aten's ``scaled_dot_product_attention`` and its backends (:data:`SDPA_SIGNATURES`).

    Dense ``[b, h, s, d]`` (``bshd`` for ``_flash_attention_forward`` and
    ``_efficient_attention_forward``; 3-D inputs have no batch). ``is_causal`` from the
    recorded flag: top-left aligned (PyTorch's ``is_causal`` mask is ``tril`` of ``q x k``);
    ``_efficient_attention_forward``'s ``custom_mask_type`` 1 is top left, 2 bottom right. A
    call whose flag was not recorded, or with an explicit mask, counts every pair (the kernel
    computes every tile; FlopCounterMode's count). The varlen forms (``cum_seq_q`` given,
    ``[total, h, d]`` inputs) go through :func:`uniform_work` or the step's sums."""
    causal_pos, layout, offsets = SDPA_SIGNATURES[name]
    t = ins.tensors()
    if len(t) < 3 or any(len(s) < 3 for s, _ in t[:3]):
        return None
    (q, dq), (k, dk), (v, dv) = t[:3]
    align = "top_left"
    causal = bool(causal_pos is not None and _flag(ins, causal_pos))
    if name == "_efficient_attention_forward":
        mask_type = int_arg(ins, 9)
        causal, align = mask_type in (1, 2), "bottom_right" if mask_type == 2 else "top_left"
    if name == "_flash_attention_forward":
        align = "bottom_right"  # flash-attn >= 2.1
    varlen = offsets is not None and _tensor(ins, offsets[0]) is not None
    if varlen and offsets is not None and len(q) == 3:
        b = _batch_of(ins, offsets[0])
        work = ins.context.attention if ins.context is not None else None
        if work is None and b is not None:
            work = uniform_work(b, q[0], k[0], int_arg(ins, offsets[2]), int_arg(ins, offsets[3]))
        if work is None:
            return None
        if causal and align == "top_left":
            return None  # a top-left mask over varlen sequences: the sums give bottom-right pairs only
        return attention_cost(Heads(q[1], k[1], q[2], v[2]), work, causal=causal, q_itemsize=itemsize(dq),
                              kv_itemsize=itemsize(dk))
    if len(q) == 3:
        q, k, v = [1, *q], [1, *k], [1, *v]
        if layout == "bshd":
            q, k, v = [q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]], [v[0], v[2], v[1], v[3]]
            layout = "bhsd"
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None
    return _dense_cost((q, dq), (k, dk), (v, dv), layout, causal=causal, align=align)


def _dense_cost(q: tuple[Shape, str], k: tuple[Shape, str], v: tuple[Shape, str], layout: str, *,
                causal: bool, align: str) -> OpCost:
    b, lq, lk, heads = _dense_heads(q[0], k[0], v[0], layout)
    work = dense_work(b, lq, lk)
    pairs = top_left_pairs(b, lq, lk) if causal and align == "top_left" else None
    if causal and align == "bottom_right" and lq > lk:
        pairs = b * lk * (lk + 1) / 2.0  # the first lq - lk queries see no key
    return attention_cost(heads, work, causal=causal, q_itemsize=itemsize(q[1]),
                          kv_itemsize=itemsize(k[1]), pairs=pairs)


# ---------------------------------------------------------------------------- framework ops
@dataclass(frozen=True)
class Signature:
    """Where a framework attention op keeps what its cost needs (positions in its schema).

    ``q``, ``k``, ``v``: the query and the key/value (new tokens ``[T, h, d]`` or a paged cache);
    ``b_from``: an offsets tensor ``[b+1]``; ``k_tokens_from``: a tensor with one entry per key
    token (SGLang's token-level ``kv_indices``), used only when the key is token-level
    (``[pool, h_kv, d]``); ``max_q``, ``max_k``: the maximum lengths (concrete ints);
    ``causal``: the causal flag's position (a bool) or, with ``mask_mode``, an int whose 1
    means causal (flashinfer's ``MaskMode``); ``always_causal``: a decoder op that masks
    causally by construction (vLLM)."""

    q: int
    k: int
    v: int
    b_from: int | None = None
    k_tokens_from: int | None = None
    max_q: int | None = None
    max_k: int | None = None
    causal: int | None = None
    mask_mode: bool = False
    always_causal: bool = False
    paged: bool = False


FRAMEWORK_SIGNATURES: dict[str, Signature] = {
    # aiter/ops/mha.py: (q [Tq,hq,d], k, v, cu_seqlens_q [b+1], kv_indptr [b+1], kv_page_indices,
    #   max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, logits_soft_cap, zero_tensors, is_causal, ...)
    "aiter::mha_batch_prefill": Signature(0, 1, 2, b_from=3, k_tokens_from=5, max_q=6, max_k=7, causal=12, paged=True),
    # aiter/ops/mha.py: (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, min_seqlen_q,
    #   dropout_p, softmax_scale, logits_soft_cap, zero_tensors, is_causal, ...)
    "aiter::mha_varlen_fwd": Signature(0, 1, 2, b_from=3, max_q=5, max_k=6, causal=12),
    "aiter::fmha_v3_varlen_fwd": Signature(0, 1, 2, b_from=3, max_q=5, max_k=6, causal=12),
    # flash_attn/flash_attn_interface.py (torch.library ops of flash-attn >= 2.6): (q, k, v,
    #   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, ...)
    "flash_attn::_flash_attn_varlen_forward": Signature(0, 1, 2, b_from=3, max_q=5, max_k=6, causal=9),
    # vllm_flash_attn: varlen_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k,
    #   block_table, alibi_slopes, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, ...)
    "_vllm_fa2_C::varlen_fwd": Signature(0, 1, 2, b_from=4, max_q=10, max_k=11, causal=15, paged=True),
    # flashinfer prefill.py ragged_run(float_ws, int_ws, plan_info, q, k, v, qo_indptr, kv_indptr, o, lse, mask_mode, ...)
    "flashinfer::ragged_run": Signature(3, 4, 5, b_from=6, causal=10, mask_mode=True),
    # paged_run(float_ws, int_ws, plan_info, q, paged_k_cache, paged_v_cache, qo_indptr, paged_kv_indptr,
    #   paged_kv_indices, paged_kv_last_page_len, o, lse, mask_mode, ...)
    "flashinfer::paged_run": Signature(3, 4, 5, b_from=6, causal=12, mask_mode=True, paged=True),
    # vllm/attention/layer.py: (query [T,Hq,D], key [T,Hkv,D], value [T,Hkv,Dv], output, layer_name, ...)
    "vllm::unified_attention_with_output": Signature(0, 1, 2, always_causal=True),
    "vllm::unified_attention": Signature(0, 1, 2, always_causal=True),
    # aiter paged_attention_ragged(out, workspace, query [T,Hq,D], key_cache, value_cache, ...): decode
    "aiter::paged_attention_ragged": Signature(2, 3, 4, always_causal=True, paged=True),
    "sglang_profiler::attention_paged_attention_ragged": Signature(2, 3, 4, always_causal=True, paged=True),
}
"""Framework attention ops (qualified name) -> where their inputs are; every one is priced by
:func:`attention_cost` through :func:`framework_attention`."""

FLASHINFER_RUN = re.compile(r"^flashinfer::.*_(ragged|paged)_run$")
"""flashinfer registers its runs per JIT module: ``flashinfer::<uri>_ragged_run``."""


def signature_of(name: str) -> Signature | None:
    """The :class:`Signature` of a qualified framework op name, or None."""
    found = FRAMEWORK_SIGNATURES.get(name)
    if found is None:
        m = FLASHINFER_RUN.match(name)
        if m:
            found = FRAMEWORK_SIGNATURES[f"flashinfer::{m.group(1)}_run"]
    return found


def cache_heads(shape: Shape, *, value: bool = False) -> tuple[int, int, int] | None:
    """(h_kv, d, tokens per page) of a K or V argument: new tokens or a token-level pool
    ``[T, h, d]`` (page 1), an NHD cache ``[blocks, page, h, d]``, or aiter's vectorized 5-D
    cache (K ``[blocks, h, d/x, page, x]``, V ``[blocks, h, page/x, d, x]``)."""
    if len(shape) == 3:
        return shape[1], shape[2], 1
    if len(shape) == 4:
        return shape[2], shape[3], shape[1]
    if len(shape) == 5:
        if value:
            return shape[1], shape[3], shape[2] * shape[4]
        return shape[1], shape[2] * shape[4], shape[3]
    return None


def framework_attention(name: str, ins: OpInputs) -> OpCost | None:
    """A framework attention op (:data:`FRAMEWORK_SIGNATURES`) by :func:`attention_cost`.

    The sequences: the step's sums (the step annotation around the call) when the trace has
    them, else the op's own totals when they say every sequence has the same lengths
    (:func:`uniform_work`); else missing. The KV cache is read in the narrower of Q's and K's
    widths (vLLM quantizes the query to an fp8 cache), O written in the wider."""
    sig = signature_of(name)
    if sig is None:
        return None
    q, k, v = _tensor(ins, sig.q), _tensor(ins, sig.k), _tensor(ins, sig.v)
    if q is None or k is None or v is None or len(q[0]) != 3:
        return None
    kh, vh = cache_heads(k[0]), cache_heads(v[0], value=True)
    if kh is None or vh is None or kh[1] != q[0][2]:
        return None
    heads = Heads(q[0][1], kh[0], q[0][2], vh[1])
    work = ins.context.attention if ins.context is not None else None
    if work is None and sig.b_from is not None and not sig.always_causal:
        b = _batch_of(ins, sig.b_from)
        total_k: int | None = None
        if not sig.paged:
            total_k = k[0][0]
        elif sig.k_tokens_from is not None and len(k[0]) == 3:
            tokens = _tensor(ins, sig.k_tokens_from)
            total_k = tokens[0][0] if tokens is not None and len(tokens[0]) == 1 else None
        max_q = int_arg(ins, sig.max_q) if sig.max_q is not None else None
        max_k = int_arg(ins, sig.max_k) if sig.max_k is not None else None
        if b is not None and total_k is not None:
            work = uniform_work(b, q[0][0], total_k, max_q, max_k)
    if work is None:
        return None
    if sig.always_causal:
        causal = True
    elif sig.causal is None:
        causal = False
    elif sig.mask_mode:
        causal = int_arg(ins, sig.causal) == 1
    else:
        flag = _flag(ins, sig.causal)
        if flag is None:
            return None
        causal = flag
    q_size, k_size = itemsize(q[1]), itemsize(k[1])
    return attention_cost(heads, work, causal=causal, q_itemsize=q_size, kv_itemsize=min(q_size, k_size),
                          o_itemsize=max(q_size, k_size))


# ---------------------------------------------------------------------------- by name
ATTENTION_WORDS = re.compile(r"attention|attn|mha|fmha|flash|sdpa|scaled_dot_product", re.IGNORECASE)
NOT_ATTENTION = re.compile(r"backward|bwd|grad|store|cache_ops|reshape_and_cache|rotary|rope|norm|proj|quant|"
                           r"merge|plan|metadata|indices", re.IGNORECASE)
"""Words of an op name that say attention, and of one that says a neighbour of it (the KV
store, RoPE, the plan step) or its backward pass (not priced here)."""


def says_attention(op: str) -> bool:
    """True when ``op`` is a framework op (a namespace other than aten's and prims') whose name
    (its namespace left out: ``flashinfer::`` says nothing) says forward attention. aten's own
    attention ops have their signatures (:data:`SDPA_SIGNATURES`); a range name
    (``layer.0/attn``) is not an op."""
    ns, _, base = op.rpartition("::")
    if ns in ("", "aten", "prims") or not re.fullmatch(r"[\w.]+", ns):
        return False
    return bool(ATTENTION_WORDS.search(base)) and not NOT_ATTENTION.search(base)


def by_name(name: str, ins: OpInputs) -> OpCost | None:
    """Any other op whose name says attention (:func:`says_attention`): its first three
    tensors of rank 3 or more, taken as q, k, v, must agree (K's head dim is Q's, V's
    sequence K's, K's heads divide Q's).

    - 4-D dense: ``[b, h, s, d]`` or ``[b, s, h, d]``, told apart by which axis holds heads
      (the one where K's divides Q's and V's equals K's); no mask is assumed (the flag's
      position is not known), so every pair is counted.
    - 3-D ``[T, h, d]`` (varlen or paged): the step's sums around the call (a decoder's
      attention in a serving step: causal, bottom right); without them, missing.
    """
    shaped = [(s, d) for s, d in ins.tensors() if len(s) >= 3]
    if len(shaped) < 3:
        return None
    (q, dq), (k, dk), (v, dv) = shaped[:3]
    if len(q) == 4 and len(k) == 4 and len(v) == 4:
        if q[0] != k[0] or q[3] != k[3]:
            return None
        layout = dense_layout(name, q, k, v)
        if layout is None:
            return None
        return _dense_cost((q, dq), (k, dk), (v, dv), layout, causal=False, align="top_left")
    if len(q) != 3:
        return None
    work = ins.context.attention if ins.context is not None else None
    kh, vh = cache_heads(k), cache_heads(v, value=True)
    if work is None or kh is None or vh is None or kh[1] != q[2] or not kh[0] or q[1] % kh[0]:
        return None
    q_size, k_size = itemsize(dq), itemsize(dk)
    return attention_cost(Heads(q[1], kh[0], q[2], vh[1]), work, causal=True, q_itemsize=q_size,
                          kv_itemsize=min(q_size, k_size), o_itemsize=max(q_size, k_size))


def dense_layout(name: str, q: Shape, k: Shape, v: Shape) -> str | None:
    """``bhsd`` or ``bshd`` for 4-D q, k, v of an op known by name only: the heads axis is one
    where K's count divides Q's and V's equals K's. When both axes could be, the one whose other
    axis has as many queries as keys (self-attention: GQA differs in heads, not lengths); else
    the name's convention (flash-attn's ``[b, s, h, d]`` for ``flash``/``fmha``/``varlen``,
    SDPA's ``[b, h, s, d]`` for ``sdpa``); else None."""
    axes = [a for a in (1, 2) if k[a] and q[a] % k[a] == 0 and v[a] == k[a] and v[3 - a] == k[3 - a]]
    layouts = {1: "bhsd", 2: "bshd"}
    if len(axes) == 2:
        equal = [a for a in axes if q[3 - a] == k[3 - a]]
        if len(equal) == 1:
            return layouts[equal[0]]
        base = name.rpartition("::")[2].lower()
        if any(w in base for w in ("flash", "fmha", "varlen")):
            return "bshd"
        if "sdpa" in base or "scaled_dot_product" in base:
            return "bhsd"
        return None
    return layouts[axes[0]] if axes else None


def pairs_of(q_lens: Sequence[int], k_lens: Sequence[int], *, causal: bool) -> float:
    """Pairs of explicit per-sequence lengths (bottom-right causal), for tests and callers
    that have the lengths themselves."""
    work = StepAttention(0, 0, 0, 0)
    for lq, lk in zip(q_lens, k_lens):
        work = work + dense_work(1, lq, lk)
    return work.pairs(causal=causal)
