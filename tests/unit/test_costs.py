"""The analytic cost model against torch's own FlopCounterMode and hand-derived numbers."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from perfscope.analysis.costs.operators import attention_flops, has_formula, op_cost


def recorded_calls(fn):
    """Run ``fn`` under torch.profiler and return (name, Input Dims, Input type, Concrete) of every op."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [(e.name, e.input_shapes, e.input_types if hasattr(e, "input_types") else None,
             e.concrete_inputs if hasattr(e, "concrete_inputs") else None) for e in prof.events()]


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as mode:
        fn()
    return mode.get_total_flops()


def profiled_cost(fn, op: str):
    calls = [c for c in recorded_calls(fn) if c[0] == op]
    assert calls, f"{op} was not recorded"
    name, dims, types, concrete = calls[0]
    types = types or ["float"] * len(dims)
    return op_cost(name, dims, types, concrete)


MATMUL_CASES = [
    ("aten::mm", lambda: torch.mm(torch.randn(37, 64), torch.randn(64, 29))),
    ("aten::addmm", lambda: torch.addmm(torch.randn(29), torch.randn(37, 64), torch.randn(64, 29))),
    ("aten::bmm", lambda: torch.bmm(torch.randn(3, 17, 64), torch.randn(3, 64, 23))),
    ("aten::matmul", lambda: torch.matmul(torch.randn(2, 5, 17, 64), torch.randn(64, 23))),
    ("aten::linear", lambda: F.linear(torch.randn(2, 9, 48), torch.randn(40, 48), torch.randn(40))),
    ("aten::linear", lambda: F.linear(torch.randn(7, 48), torch.randn(40, 48))),
]


@pytest.mark.parametrize("op,fn", MATMUL_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(MATMUL_CASES)])
def test_matmul_flops_equal_flop_counter_mode(op, fn):
    cost = profiled_cost(fn, op)
    assert cost is not None
    assert cost.flops == counted_flops(fn)
    assert cost.category == "gemm"


def test_mm_bytes_are_compulsory_traffic():
    cost = op_cost("aten::mm", [[37, 64], [64, 29]], ["float", "float"])
    assert cost.bytes == 4 * (37 * 64 + 64 * 29 + 37 * 29)
    half = op_cost("aten::mm", [[37, 64], [64, 29]], ["c10::BFloat16", "c10::BFloat16"])
    assert half.bytes == cost.bytes / 2


@pytest.mark.parametrize("shape_q,shape_kv", [((2, 8, 16, 32), (2, 8, 24, 32)), ((1, 4, 1, 64), (1, 4, 40, 64))])
def test_attention_flops_equal_flop_counter_mode_math_path(shape_q, shape_kv):
    q = torch.randn(*shape_q, device="meta")
    k = torch.randn(*shape_kv, device="meta")
    v = torch.randn(*shape_kv, device="meta")
    counted = counted_flops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert attention_flops(list(shape_q), list(shape_kv), list(shape_kv)) == counted
    cost = op_cost("aten::scaled_dot_product_attention", [list(shape_q), list(shape_kv), list(shape_kv)],
                   ["float"] * 3)
    assert cost.flops == counted and cost.category == "attention"


def test_flash_forward_layout_is_batch_len_heads_dim():
    bhle = attention_flops([2, 8, 16, 32], [2, 8, 24, 32], [2, 8, 24, 32])
    blhe = attention_flops([2, 16, 8, 32], [2, 24, 8, 32], [2, 24, 8, 32], layout="blhe")
    assert bhle == blhe == 4 * 2 * 8 * 16 * 24 * 32


def test_cpu_sdpa_is_priced_from_the_recorded_call():
    q = torch.randn(1, 4, 16, 32)
    cost = profiled_cost(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
                         "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert cost.flops == 4 * 1 * 4 * 16 * 16 * 32
    assert cost.bytes == 4 * 4 * q.numel()  # q, k, v read, out written


def test_elementwise_counts_per_output_element_with_broadcast():
    cost = op_cost("aten::mul", [[4, 1, 8], [1, 3, 8]], ["float", "float"])
    assert cost.flops == 4 * 3 * 8
    assert cost.bytes == 4 * (32 + 24 + 96)
    silu = op_cost("aten::silu", [[10, 10]], ["float"])
    assert silu.flops == 400 and silu.bytes == 800


def test_reduction_uses_concrete_dims():
    cost = op_cost("aten::mean", [[2, 5, 64], [], [], []], ["float", "ScalarList", "Scalar", ""],
                   ["", "[-1]", "True", ""])
    assert cost.flops == 2 * 5 * 64
    assert cost.bytes == 4 * (2 * 5 * 64 + 2 * 5)


def test_data_movement_ops():
    emb = op_cost("aten::embedding", [[1000, 64], [3, 7]], ["float", "long int"])
    assert emb.flops == 0 and emb.bytes == 3 * 7 * 8 + 2 * 21 * 64 * 4
    cat = op_cost("aten::cat", [[[1, 5, 8], [1, 3, 8]], []], ["TensorList", "Scalar"])
    assert cat.bytes == 2 * 4 * (40 + 24)
    copy = op_cost("aten::copy_", [[4, 4], [4, 4], []], ["c10::BFloat16", "float", "Scalar"])
    assert copy.bytes == 16 * 2 + 16 * 4
    zeros = op_cost("aten::zeros", [[], [], [], [], []], ["ScalarList", "Scalar", "", "", ""],
                    ["[3, 5]", "6", "", "", ""])
    assert zeros.bytes == 15 * 4


def test_views_are_free_and_unknown_ops_are_missing_not_zero():
    view = op_cost("aten::view", [[4, 4], []], ["float", "ScalarList"])
    assert view.flops == 0 and view.bytes == 0 and view.category == "view"
    assert op_cost("aten::some_custom_kernel", [[4]], ["float"]) is None
    assert not has_formula("mylib::fused_thing")
    assert op_cost("aten::mm", [[4, 5], [6, 7]], ["float", "float"]) is None  # shapes don't fit


def test_cost_model_covers_every_op_the_engine_emits():
    from perfscope.engine.generate import build_model, generate, random_prompts

    model = build_model("tiny", attention="naive")
    prompts = random_prompts(2, 8, model.args.vocab_size)
    calls = recorded_calls(lambda: generate(model, prompts, 3))
    priced = {name for name, dims, types, conc in calls if has_formula(name)}
    emitted = {name for name, *_ in calls if name.startswith("aten::")}
    for op in ("aten::linear", "aten::matmul", "aten::softmax", "aten::silu", "aten::mul", "aten::add",
               "aten::embedding"):
        if op in emitted:
            assert op in priced
    compute_ops = {"aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "aten::softmax",
                   "aten::_softmax", "aten::silu", "aten::rsqrt", "aten::mean", "aten::pow"}
    unpriced = (emitted & compute_ops) - priced
    assert not unpriced
    assert math.isfinite(sum(op_cost(n, d, t or ["float"] * len(d), c).flops
                             for n, d, t, c in calls if n in priced and op_cost(n, d, t or ["float"] * len(d), c)))


def test_roll_and_flip_move_their_input_once(fixtures_dir) -> None:
    """The engine's RoPE rotates with ``x.roll``: read once, written once, no FLOPs; on the real H200
    eager trace every aten::roll kernel carries exactly that (it was uncosted, 1.7% of the time)."""
    from perfscope.analysis.readers.kineto.reader import read_kineto

    for name in ("aten::roll", "aten::flip"):
        cost = op_cost(name, [[2, 256, 40, 64], [], []], ["c10::BFloat16", "ScalarList", "ScalarList"])
        assert cost is not None and cost.flops == 0 and cost.bytes == 2 * (2 * 256 * 40 * 64) * 2
    k = read_kineto(fixtures_dir / "h200" / "h200_llama1b_engine_eager.pt.trace.json.gz").kernels
    roll = k[k["op"] == "aten::roll"]
    assert len(roll) == 128 and (roll["flops"] == 0).all()
    shapes = roll["op_shapes"].map(lambda s: math.prod(json.loads(s)[0]))
    assert (roll["dram_bytes"] == 2 * shapes * 2).all()  # bf16


def test_index_is_a_gather_with_no_flops(fixtures_dir) -> None:
    """``aten::index`` (``table[positions]``) does no arithmetic: 0 FLOPs whatever its indices. The
    profiler records its ``List[Optional[Tensor]]`` as ``[]``, so its bytes stay missing then; with
    the index shapes recorded, the broadcast output (times the unindexed dims) is read and written."""
    from perfscope.analysis.readers.kineto.reader import read_kineto

    unrecorded = op_cost("aten::index", [[263, 64], []], ["c10::BFloat16", ""])
    assert unrecorded is not None and unrecorded.flops == 0 and math.isnan(unrecorded.bytes)
    # x[[4,1] positions, [3] positions] of an [8, 37, 16] fp32 tensor -> [4, 3, 16]
    recorded = op_cost("aten::index", [[8, 37, 16], [[4, 1], [3]]], ["float", "TensorList"])
    assert recorded is not None and recorded.flops == 0
    assert recorded.bytes == (4 + 3) * 8 + 2 * (4 * 3 * 16) * 4
    assert op_cost("aten::index", [[8, 37], [[4], [3]]], ["float", "TensorList"]) is None  # no broadcast
    k = read_kineto(fixtures_dir / "h200" / "h200_llama1b_engine_eager.pt.trace.json.gz").kernels
    index = k[k["op"] == "aten::index"]
    assert len(index) and (index["flops"] == 0).all() and index["dram_bytes"].isna().all()
