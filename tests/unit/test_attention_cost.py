"""Attention priced from its shapes (analysis/costs/attention.py): one formula for every
framework's attention op, checked on known shapes (two matmuls of 2·b·h·q·k·d each, the causal
triangle / trapezoid, GQA, MLA), across the dense, varlen and paged forms of the same work, on a
realistic ``aiter::mha_batch_prefill`` event of an SGLang prefill step, and on the committed
Qwen trace's recorded SDPA calls."""

from __future__ import annotations

import json

import pytest

from perfscope.analysis.costs.args import OpContext, step_attention
from perfscope.analysis.costs.attention import (
    Heads,
    attention_cost,
    dense_work,
    pairs_of,
    says_attention,
)
from perfscope.analysis.costs.operators import category_of, has_formula, needs_step, op_cost

BF16 = "c10::BFloat16"


def _two_matmuls(b: int, h: int, q: int, k: int, d: int) -> float:
    return 2 * (2.0 * b * h * q * k * d)  # QKᵀ and PV, 2·b·h·(q·k)·d each


def test_dense_no_mask_is_two_matmuls() -> None:
    b, h, q, k, d = 2, 8, 16, 24, 32
    cost = op_cost("aten::scaled_dot_product_attention", [[b, h, q, d], [b, h, k, d], [b, h, k, d]],
                   [BF16] * 3)
    assert cost is not None and cost.category == "attention"
    assert cost.flops == _two_matmuls(b, h, q, k, d)
    assert cost.bytes == 2 * (b * h * q * d * 2 + 2 * b * h * k * d)  # q, o; k, v (bf16)


def test_causal_square_is_the_triangle() -> None:
    b, h, s, d = 16, 16, 559, 64  # the committed Qwen trace's SDPA call
    dims = [[b, h, s, d]] * 3 + [[], [], [], [], []]
    types = [BF16] * 3 + ["", "Scalar", "Scalar", "Scalar", "Scalar"]
    causal = op_cost("aten::scaled_dot_product_attention", dims, types, ["", "", "", "", "0.", "True", "0.125", "False"])
    full = op_cost("aten::scaled_dot_product_attention", dims, types, ["", "", "", "", "0.", "False", "0.125", "False"])
    assert causal is not None and full is not None
    assert full.flops == _two_matmuls(b, h, s, s, d)
    assert causal.flops == 4.0 * b * h * d * s * (s + 1) / 2
    assert causal.bytes == full.bytes  # every tensor is read once either way


def test_causal_alignment_when_queries_are_fewer_than_keys() -> None:
    """PyTorch's ``is_causal`` is aligned top left, flash-attn's bottom right (the trapezoid)."""
    b, h, q, k, d = 1, 4, 3, 10, 16
    sdpa = op_cost("aten::_scaled_dot_product_flash_attention", [[b, h, q, d], [b, h, k, d], [b, h, k, d]],
                   [BF16] * 3, ["", "", "", "0.", "True", "False", ""])
    assert sdpa is not None and sdpa.flops == 4.0 * h * d * (1 + 2 + 3)
    flash = op_cost("aten::_flash_attention_forward", [[b, q, h, d], [b, k, h, d], [b, k, h, d]] + [[]] * 6,
                    [BF16] * 3 + [""] * 6, ["", "", "", "", "", "3", "10", "0.", "True"])
    assert flash is not None and flash.flops == 4.0 * h * d * (8 + 9 + 10)  # q·k - q(q-1)/2 = 27
    assert pairs_of([q], [k], causal=True) == 27


def test_gqa_changes_bytes_not_flops_and_mla_head_dims() -> None:
    work = dense_work(2, 128, 128)
    mha = attention_cost(Heads(32, 32, 128, 128), work, causal=True, q_itemsize=2, kv_itemsize=2)
    gqa = attention_cost(Heads(32, 8, 128, 128), work, causal=True, q_itemsize=2, kv_itemsize=2)
    assert mha.flops == gqa.flops == 2 * 32 * 256 * 2 * 128 * 129 / 2
    assert mha.bytes - gqa.bytes == 2 * 128 * (32 - 8) * 256 * 2
    mla = attention_cost(Heads(16, 16, 192, 128), work, causal=False, q_itemsize=2, kv_itemsize=1)
    assert mla.flops == 2 * 16 * (192 + 128) * 2 * 128 * 128
    assert mla.bytes == 256 * 16 * 192 * 2 + 256 * 16 * 128 * 2 + 256 * 16 * (192 + 128) * 1  # fp8 KV


def _mha_batch_prefill_args(total_q: int, b: int, pool: int, kv_tokens: int, max_q: int, max_k: int,
                            *, hq: int = 32, hkv: int = 8, d: int = 128) -> tuple[list, list, list]:
    """A Kineto ``aiter::mha_batch_prefill`` event's args, in its schema's order (aiter/ops/mha.py):
    (q, k, v, cu_seqlens_q, kv_indptr, kv_page_indices, max_seqlen_q, max_seqlen_k, dropout_p,
    softmax_scale, logits_soft_cap, zero_tensors, is_causal, window_size_left, window_size_right,
    return_softmax_lse, return_dropout_randval, out, alibi_slopes, gen). SGLang's aiter backend
    passes the whole KV pool as k and v (token-level ``[pool, h_kv, d]``) and one
    ``kv_page_indices`` entry per key token (``kv_indptr = cumsum(seq_lens)``)."""
    dims = [[total_q, hq, d], [pool, hkv, d], [pool, hkv, d], [b + 1], [b + 1], [kv_tokens]] + [[]] * 11 + \
        [[total_q, hq, d], [], []]
    types = [BF16, BF16, BF16, "int", "int", "int"] + ["Scalar"] * 11 + [BF16, "", ""]
    concrete = ["", "", "", "", "", "", str(max_q), str(max_k), "0.", "0.088388347648318", "0.", "False", "True",
                "-1", "-1", "False", "False", "", "", ""]
    return dims, types, concrete


def test_sglang_mha_batch_prefill_is_priced_from_its_shapes() -> None:
    """``step[EXTEND bs=15 toks=15360]`` of Qwen3-8B on MI300X (32 query heads, 8 KV heads, head
    dim 128): 15 prompts of 1,024 tokens, no cached prefix, causal."""
    b, s, hq, hkv, d = 15, 1024, 32, 8, 128
    args = _mha_batch_prefill_args(b * s, b, 1_200_000, b * s, s, s)
    assert has_formula("aiter::mha_batch_prefill") and needs_step("aiter::mha_batch_prefill")
    assert category_of("aiter::mha_batch_prefill") == "attention"
    cost = op_cost("aiter::mha_batch_prefill", *args)
    assert cost is not None
    assert cost.flops == b * 4.0 * hq * d * s * (s + 1) / 2  # per request: its triangle
    # q and o once; the K and V of the 15,360 key tokens once (not the whole pool)
    assert cost.bytes == b * s * hq * d * 2 * 2 + b * s * hkv * d * 2 * 2
    # the same step from the step annotation (TraceLens-patched SGLang writes vLLM's form)
    work = step_attention(f"execute_15_context_15(sq{b * s}sk{b * s}sqsq{b * s * s}sqsk{b * s * s})"
                          "_generation_0(sq0sk0sqsq0sqsk0)")
    assert op_cost("aiter::mha_batch_prefill", *args, OpContext(attention=work)) == cost


def test_mha_batch_prefill_of_unequal_prompts_needs_the_step() -> None:
    """Prompts of 100 and 300 tokens (the second after a 200-token cached prefix): their lengths
    are device data; the totals alone do not give the pairs, the step annotation does."""
    args = _mha_batch_prefill_args(400, 2, 100_000, 600, 300, 500)
    assert op_cost("aiter::mha_batch_prefill", *args) is None
    work = step_attention("execute_2_context_2(sq400sk600sqsq100000sqsk160000)_generation_0(sq0sk0sqsq0sqsk0)")
    cost = op_cost("aiter::mha_batch_prefill", *args, OpContext(attention=work))
    assert cost is not None
    assert cost.flops == 4.0 * 32 * 128 * pairs_of([100, 300], [100, 500], causal=True)
    assert pairs_of([100, 300], [100, 500], causal=True) == 100 * 101 / 2 + (300 * 500 - 300 * 299 / 2)


def test_one_formula_for_dense_varlen_ragged_and_paged_forms_of_the_same_work() -> None:
    b, s, hq, hkv, d = 4, 64, 16, 4, 64
    t = b * s
    dense = op_cost("aten::_scaled_dot_product_efficient_attention",
                    [[b, hq, s, d], [b, hkv, s, d], [b, hkv, s, d], [], [], [], []],
                    [BF16] * 3 + ["", "Scalar", "Scalar", "Scalar"], ["", "", "", "", "False", "0.", "True"])
    varlen = op_cost("flash_attn::_flash_attn_varlen_forward",
                     [[t, hq, d], [t, hkv, d], [t, hkv, d], [b + 1], [b + 1], [], [], [], [], []],
                     [BF16] * 3 + ["int", "int"] + ["Scalar"] * 5, ["", "", "", "", "", str(s), str(s), "0.", "0.125", "True"])
    ragged = op_cost("flashinfer::batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_head_dim_qk_64_ragged_run",
                     [[1024], [256], [], [t, hq, d], [t, hkv, d], [t, hkv, d], [b + 1], [b + 1], [t, hq, d], [],
                      [], [], []],
                     ["unsigned char", "unsigned char", "GenericList", BF16, BF16, BF16, "int", "int", BF16, "",
                      "Scalar", "Scalar", "Scalar"],
                     [""] * 10 + ["1", "0", "-1"],
                     OpContext(attention=dense_work(b, s, s)))
    paged = op_cost("vllm::unified_attention_with_output", [[t, hq, d], [t, hkv, d], [t, hkv, d], [t, hq, d], []],
                    [BF16] * 4 + ["Scalar"], None, OpContext(attention=dense_work(b, s, s)))
    want = b * 4.0 * hq * d * s * (s + 1) / 2
    for cost in (dense, varlen, ragged, paged):
        assert cost is not None and cost.flops == want and cost.category == "attention"
    assert dense.bytes == varlen.bytes == ragged.bytes == paged.bytes  # type: ignore[union-attr]


def test_an_unknown_op_that_says_attention_is_priced_by_its_shapes() -> None:
    assert says_attention("my_lib::fused_attn_fwd") and says_attention("ck::FmhaFwd")
    assert not says_attention("aten::_scaled_dot_product_flash_attention_backward")
    assert not says_attention("sglang::store_cache") and not says_attention("layer.0/attn")
    assert not says_attention("my_lib::fused_attn_bwd")
    dense = op_cost("my_lib::fused_attn_fwd", [[2, 128, 8, 64], [2, 128, 2, 64], [2, 128, 2, 64]], [BF16] * 3)
    assert dense is not None and dense.flops == _two_matmuls(2, 8, 128, 128, 64)  # [b, s, h, d] found
    assert category_of("my_lib::fused_attn_fwd") == "attention"
    # varlen [T, h, d]: the step's lengths, else missing
    dims = [[96, 8, 64], [96, 2, 64], [96, 2, 64]]
    assert op_cost("my_lib::varlen_attn", dims, [BF16] * 3) is None
    cost = op_cost("my_lib::varlen_attn", dims, [BF16] * 3, None, OpContext(attention=dense_work(3, 32, 32)))
    assert cost is not None and cost.flops == 3 * 4.0 * 8 * 64 * 32 * 33 / 2


def test_qwen_sdpa_calls_are_their_triangles(load) -> None:
    """The committed Qwen1.5-0.5B trace (HF transformers, H100): every priced attention kernel's
    FLOPs are the causal triangle of its op's recorded shapes."""
    k = load("kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz").kernels
    att = k[(k["category"] == "attention") & k["flops"].notna() & k["op_shapes"].notna()]
    assert len(att)
    for op, shapes, flops in zip(att["op"], att["op_shapes"], att["flops"]):
        q, kk = json.loads(shapes)[:2]
        b, h, s, d = (q[0], q[2], q[1], q[3]) if op == "aten::_flash_attention_forward" else q
        assert s == (kk[1] if op == "aten::_flash_attention_forward" else kk[2])
        assert flops == pytest.approx(4.0 * b * h * d * s * (s + 1) / 2, rel=1e-12), (op, shapes)


def test_sglang_prefill_step_imported_end_to_end(tmp_path) -> None:
    """The issue's SGLang prefill (``step[EXTEND bs=15 toks=15360]`` on MI300X) was 4.1% uncosted:
    its ``aiter::mha_batch_prefill`` kernel. A Kineto trace of that step (the step ranges, the op
    with its recorded arguments, its launch and its CK kernel) now prices the kernel by the formula."""
    from perfscope.analysis.readers.detect import import_file

    b, s = 15, 1024
    dims, types, concrete = _mha_batch_prefill_args(b * s, b, 1_200_000, b * s, s, s)
    step = f"execute_15_context_15(sq{b * s}sk{b * s}sqsq{b * s * s}sqsk{b * s * s})_generation_0(sq0sk0sqsq0sqsk0)"
    events = [
        {"ph": "X", "cat": "user_annotation", "name": step, "pid": 1, "tid": 1, "ts": 100, "dur": 1000, "args": {}},
        {"ph": "X", "cat": "user_annotation", "name": f"step[EXTEND bs={b} toks={b * s}]", "pid": 1, "tid": 1,
         "ts": 110, "dur": 980, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aiter::mha_batch_prefill", "pid": 1, "tid": 1, "ts": 200, "dur": 50,
         "args": {"External id": 7, "Input Dims": dims, "Input type": types, "Concrete Inputs": concrete}},
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 1, "ts": 210, "dur": 10,
         "args": {"correlation": 5, "External id": 7}},
        {"ph": "X", "cat": "kernel", "name": "_ZN7ck_tile6kentryILi1ENS_36FmhaBatchPrefillWithPagedKVCacheKernelE",
         "pid": 0, "tid": 7, "ts": 300, "dur": 400, "args": {"correlation": 5, "External id": 7, "device": 0,
                                                              "stream": 7}},
    ]
    path = tmp_path / "sglang_prefill.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X"}],
                                "traceEvents": events}))
    k = import_file(path).kernels
    (row,) = k.itertuples()
    assert (row.op, row.category, row.phase) == ("aiter::mha_batch_prefill", "attention", "prefill")
    assert row.flops == b * 4.0 * 32 * 128 * s * (s + 1) / 2
    assert row.dram_bytes == b * s * (32 * 128 * 2 * 2 + 8 * 128 * 2 * 2)
