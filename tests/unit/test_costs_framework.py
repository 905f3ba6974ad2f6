"""Cost formulas of framework ops (analysis/costs/framework.py) on shapes taken from real
traces, checked against TraceLens's own analysis of the same traces (``perf_csvs/``)."""

from __future__ import annotations

import ast
import csv
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis.costs.framework import OpContext, StepAttention, moe_cost, step_attention
from perfscope.analysis.costs.operators import op_cost
from perfscope.analysis.readers.kineto.reader import MISSING_COST, NO_SHAPES, read_kineto

MIB = 1024 * 1024
VLLM, SGLANG = "tracelens_vllm_decode_full", "tracelens_sglang_decode"


def _csv(fixtures_dir: Path, trace: str, name: str) -> list[dict[str, str]]:
    with open(fixtures_dir / "thirdparty" / trace / "perf_csvs" / name, newline="") as f:
        return list(csv.DictReader(f))


def _args(row: dict[str, str]) -> tuple[Any, Any, Any]:
    return tuple(ast.literal_eval(row[f"{k}_first"]) for k in ("Input Dims", "Input type", "Concrete Inputs"))


def _context(fixtures_dir: Path, trace: str, name: str) -> OpContext:
    """The step sums of the trace's own vLLM step annotation (TraceLens reads the same)."""
    path = next((fixtures_dir / "thirdparty" / trace).glob("*.json.gz"))
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    text = next(e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("execute"))
    work = step_attention(text)
    assert work is not None, text
    return OpContext(attention=work, world_size=1)


@pytest.mark.parametrize("trace", [VLLM, SGLANG])
def test_every_gemm_equals_tracelens(fixtures_dir: Path, trace: str) -> None:
    rows = _csv(fixtures_dir, trace, "GEMM.csv")
    assert len(rows) >= 8
    for row in rows:
        cost = op_cost(row["name"], *_args(row))
        assert cost is not None, row["name"]
        m, n, k = (int(row[f"param: {p}"]) for p in "MNK")
        assert cost.flops == 2 * m * n * k
        assert cost.flops == pytest.approx(float(row["GFLOPS_first"]) * 1e9, rel=0.01)
        assert cost.bytes == pytest.approx(float(row["Data Moved (MB)_first"]) * MIB, rel=0.01)


def test_vllm_unified_attention_equals_tracelens(fixtures_dir: Path) -> None:
    row = _csv(fixtures_dir, VLLM, "InferenceAttention_fwd.csv")[0]
    ctx = _context(fixtures_dir, VLLM, row["name"])
    assert ctx.attention == StepAttention(32, 55086, 32, 55086)
    cost = op_cost(row["name"], *_args(row), ctx)
    assert cost is not None and cost.category == "attention"
    assert cost.flops == 4 * 64 * 64 * 55086  # 4 Hq D sum(sk): one query token per sequence
    assert cost.flops == pytest.approx(float(row["GFLOPS_first"]) * 1e9, rel=1e-9)
    # Q and O (32 x 64 x 64 bf16 each) + the paged K and V of 55,086 positions x 8 heads x 64
    assert cost.bytes == 2 * 32 * 64 * 64 * 2 + 55086 * 8 * 128 * 2
    assert cost.bytes == pytest.approx(float(row["Data Moved (MB)_first"]) * MIB, rel=1e-6)


def test_sglang_paged_attention_equals_tracelens(fixtures_dir: Path) -> None:
    row = next(r for r in _csv(fixtures_dir, SGLANG, "InferenceAttention_fwd.csv") if "paged" in r["name"])
    ctx = _context(fixtures_dir, SGLANG, row["name"])
    cost = op_cost("sglang_profiler::attention_paged_attention_ragged_100", *_args(row), ctx)
    assert cost is not None
    assert cost.flops == 4 * 32 * 128 * 32785
    assert cost.flops == pytest.approx(float(row["GFLOPS_first"]) * 1e9, rel=1e-9)
    assert cost.bytes == pytest.approx(float(row["Data Moved (MB)_first"]) * MIB, rel=0.001)


def test_attention_without_step_stays_missing(fixtures_dir: Path) -> None:
    row = _csv(fixtures_dir, VLLM, "InferenceAttention_fwd.csv")[0]
    assert op_cost(row["name"], *_args(row)) is None  # the capture trace alone: no sequence lengths


@pytest.mark.parametrize("trace", [VLLM, SGLANG])
def test_rmsnorm_equals_tracelens(fixtures_dir: Path, trace: str) -> None:
    for row in _csv(fixtures_dir, trace, "RMSNorm_fwd.csv"):
        cost = op_cost(row["name"], *_args(row))
        assert cost is not None and cost.category == "norm", row["name"]
        assert cost.flops == pytest.approx(float(row["GFLOPS_first"]) * 1e9, rel=1e-9)
        assert cost.bytes == pytest.approx(float(row["Data Moved (MB)_first"]) * MIB, rel=1e-9)


def test_rope_and_silu_and_store_cache_match_tracelens(fixtures_dir: Path) -> None:
    rope = _csv(fixtures_dir, SGLANG, "RoPE_fwd.csv")[0]
    cost = op_cost(rope["name"], *_args(rope))
    assert cost is not None
    assert cost.flops == 3 * 32 * (4096 + 1024) == pytest.approx(float(rope["GFLOPS_first"]) * 1e9)
    # TraceLens counts q and k read and written (0.625 MiB); the op also reads the positions
    # (32 x int64) and one cos/sin row per token (32 x 128 bf16): 8,448 bytes more (1.3%)
    assert cost.bytes - float(rope["Data Moved (MB)_first"]) * MIB == 32 * 8 + 32 * 128 * 2
    silu = next(r for r in _csv(fixtures_dir, SGLANG, "UnaryElementwise.csv") if "silu" in r["name"])
    cost = op_cost(silu["name"], *_args(silu))
    assert cost is not None
    assert cost.flops == pytest.approx(float(silu["GFLOPS_first"]) * 1e9)
    assert cost.bytes == pytest.approx(float(silu["Data Moved (MB)_first"]) * MIB)
    store = next(r for r in _csv(fixtures_dir, SGLANG, "InferenceAttention_fwd.csv") if "store" in r["name"])
    cost = op_cost(store["name"], *_args(store))
    assert cost is not None and cost.flops == 0
    assert cost.bytes == pytest.approx(float(store["Data Moved (MB)_first"]) * MIB, rel=0.001)  # + loc indices


def test_moe_forward_flops_equal_tracelens_up_plus_down(fixtures_dir: Path) -> None:
    rows = {r["name"]: r for r in _csv(fixtures_dir, VLLM, "MoE_unfused_fwd.csv")}
    up, down = rows["pseudo_op::moe_triton_unfused_up"], rows["pseudo_op::moe_triton_unfused_down"]
    cost = op_cost("vllm::moe_forward", *_args(up), OpContext(world_size=1))
    assert cost is not None and cost.category == "gemm"
    tl_flops = (float(up["GFLOPS_first"]) + float(down["GFLOPS_first"])) * 1e9
    assert cost.flops == 6 * 32 * 4 * 3072 * 3072 == pytest.approx(tl_flops, rel=1e-9)
    # bytes: all 32 experts (routing is on the device, not in the trace) where TraceLens takes
    # the expected 32(1-(28/32)^32) = 31.55 hit, and MXFP4's E8M0 scale (1 byte per 32
    # weights) that TraceLens leaves out: 32/31.55 x 0.53125/0.5 = 1.078 on the weights, less
    # the 32 x 3072 bf16 intermediate its two unfused stages write and read: 1.074 in all
    weights = 32 * 3 * 3072 * 3072 * (0.5 + 1 / 32)
    assert cost.bytes == 2 * 32 * 3072 * 2 + weights
    tl_bytes = (float(up["Data Moved (MB)_first"]) + float(down["Data Moved (MB)_first"])) * MIB
    assert cost.bytes / tl_bytes == pytest.approx(1.074, abs=0.001)


# ---------------------------------------------------------------------------- B200 eager (GPT-OSS 120B, TP 8)
B200_STEP = "execute_context_1(888_788544)_generation_0(0)"


def test_b200_prefill_attention_is_causal() -> None:
    work = step_attention(B200_STEP)
    assert work == StepAttention(888, 888, 788544, 788544)
    dims = [[888, 8, 64], [888, 1, 64], [888, 1, 64], [888, 8, 64], [], [], []]
    types = ["c10::Float8_e4m3fn", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "", ""]
    cost = op_cost("vllm::unified_attention_with_output", dims, types, None, OpContext(attention=work))
    assert cost is not None
    pairs = 888 * 889 // 2  # one 888-token prompt from position 0, causal
    assert cost.flops == 4 * 8 * 64 * pairs
    # fp8 query (the cache's width: QkvE4m3 in the kernel name), bf16 output, fp8 K/V of 888 positions
    assert cost.bytes == 888 * 8 * 64 * 1 + 888 * 8 * 64 * 2 + 888 * 1 * 128 * 1


def test_b200_fused_ops() -> None:
    norm = op_cost("_C::fused_add_rms_norm", [[888, 2880], [888, 2880], [2880], []],
                   ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar"])
    assert norm is not None and norm.flops == 888 * (5 * 2880 + 2)
    assert norm.bytes == 4 * 888 * 2880 * 2 + 2880 * 2  # input and residual read and written in place
    rope = op_cost("_C::rotary_embedding", [[888], [888, 512], [888, 64], [], [131072, 64], []],
                   ["long int", "c10::BFloat16", "c10::BFloat16", "Scalar", "c10::BFloat16", "Scalar"])
    assert rope is not None and rope.flops == 3 * 888 * (512 + 64)
    cache = op_cost("_C_cache_ops::reshape_and_cache_flash",
                    [[888, 1, 64], [888, 1, 64], [4213816, 16, 1, 64], [4213816, 16, 1, 64], [888], [], [], []],
                    ["c10::BFloat16", "c10::BFloat16", "unsigned char", "unsigned char", "long int", "", "float", "float"])
    assert cache is not None and cache.flops == 0
    assert cache.bytes == 2 * 888 * 64 * 2 + 2 * 888 * 64 * 1 + 888 * 8  # bf16 in, fp8 cache out, slots
    quant = op_cost("_C::static_scaled_fp8_quant", [[888, 512], [888, 512], []],
                    ["c10::Float8_e4m3fn", "c10::BFloat16", "float"])
    assert quant is not None and quant.bytes == 888 * 512 * 3 + 4


def test_b200_moe_forward_is_tensor_parallel() -> None:
    cost = op_cost("vllm::moe_forward", [[888, 3072], [888, 128], []], ["c10::BFloat16", "c10::BFloat16", ""],
                   None, OpContext(world_size=8))
    assert cost is not None
    assert cost == moe_cost(888, 3072, 3072 // 8, 128, 4, gated=True, act_dtype="c10::bfloat16", weight_format="mxfp4")
    assert cost.flops == 6 * 888 * 4 * 3072 * 384
    assert cost.precision == "bf16"  # bf16 activations x mxfp4 weights: dequantized, bf16 math


def test_collectives_move_bytes_without_flops() -> None:
    cost = op_cost("symm_mem::multimem_all_reduce_", [[2557440], [], []], ["c10::BFloat16", "", ""],
                   None, OpContext(world_size=8))
    assert cost is not None and cost.category == "comm"
    assert cost.bytes == 2 * 7 / 8 * 2557440 * 2
    assert cost.flops != cost.flops  # NaN: missing, not 0
    assert op_cost("vllm::all_reduce", [[888, 2880], []], ["c10::BFloat16", ""]) is None  # ranks unknown


def test_fp8_gemm_is_placed_on_the_fp8_roof() -> None:
    # the B200 trace's o_proj shape (888 x 2880 x 640) as a per-tensor fp8 _scaled_mm
    cost = op_cost("aten::_scaled_mm", [[888, 2880], [2880, 640], [], [], [], [], [], []],
                   ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", "", "", "Scalar", "Scalar"],
                   ["", "", "", "", "", "", "15", "False"])
    assert cost is not None and cost.precision == "fp8"
    assert cost.flops == 2 * 888 * 640 * 2880
    # fp8 operands, their two per-tensor float scales (0-dim tensors), bf16 out
    assert cost.bytes == 888 * 2880 + 2880 * 640 + 2 * 4 + 888 * 640 * 2


def test_framework_op_never_takes_an_aten_formula_of_the_same_name() -> None:
    # _C::rms_norm(out, input, weight, eps) has aten::rms_norm's base name, not its argument order
    cost = op_cost("_C::rms_norm", [[888, 2880], [888, 2880], [2880], []],
                   ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar"])
    assert cost is not None and cost.bytes == 2 * 888 * 2880 * 2 + 2880 * 2
    assert op_cost("mylib::mm", [[4, 8], [8, 16]], ["float", "float"]) is None


# ---------------------------------------------------------------------------- whole traces
def test_b200_eager_trace_costed(fixtures_dir: Path) -> None:
    report = read_kineto(fixtures_dir / "kineto" / "tracelens_b200__eager_trace.json.gz")
    k = report.kernels
    time = k["duration_ns"].astype(float)
    both = k["flops"].notna() & k["dram_bytes"].notna()
    comm = k["category"].eq("comm")
    assert time[both].sum() / time.sum() >= 0.80  # was 12%; the rest is the all-reduce (bytes, no FLOPs)
    assert time[both | (comm & k["dram_bytes"].notna())].sum() / time.sum() >= 0.99
    attn = k[k["op"].eq("vllm::unified_attention_with_output")]
    assert len(attn) == 36 and attn["flops"].notna().all()
    assert not any(w.startswith(MISSING_COST) and "moe_forward" in w for w in report.warnings)


def test_no_shapes_recorded_says_how_to_record_them(fixtures_dir: Path, tmp_path: Path) -> None:
    """The same real trace as torch.profiler writes it with ``record_shapes=False``: ops keep
    their names but carry no ``Input Dims``/``Input type``/``Concrete Inputs``."""
    with gzip.open(fixtures_dir / "thirdparty" / SGLANG / "sglang_Qwen3-8B_decode.json.gz", "rt") as f:
        trace = json.load(f)
    for event in trace["traceEvents"]:
        for key in ("Input Dims", "Input type", "Concrete Inputs", "Input Strides"):
            event.get("args", {}).pop(key, None)
    trace["record_shapes"] = 0
    path = tmp_path / "no_shapes.json"
    path.write_text(json.dumps(trace))
    report = read_kineto(path)
    shapes = [w for w in report.warnings if w.startswith(NO_SHAPES)]
    assert len(shapes) == 1 and "record_shapes=True" in shapes[0]
    assert "aten::argmax" in shapes[0]  # priced when its shapes are recorded (the original trace)
    assert not any(w.startswith(MISSING_COST[0]) and "aten::argmax" in w for w in report.warnings)


# ---------------------------------------------------------------------------- vLLM's GPT-OSS capture (MI300X)
def test_triton_routing_and_inductor_pointwise() -> None:
    """Shapes of the vLLM capture trace's TopK, SortTokens and Inductor kernels."""
    topk = op_cost("TopK", [[32, 32], [], [], [], [], [], []],
                   ["c10::BFloat16", "Scalar", "Scalar", "Scalar", "Scalar", "", ""], ["", "4", "True", "1", "True", "", ""])
    assert topk is not None and topk.flops == 32 * 32 + 5 * 32 * 4
    assert topk.bytes == 32 * 32 * 2 + 32 * 4 * (2 + 2) + 32 * 1 * 4
    sort = op_cost("SortTokens", [[32, 4], [32, 4], []], ["c10::BFloat16", "short int", "Scalar"], ["", "", "32"])
    assert sort is not None and sort.bytes == 32 * 4 * 2 * 2 + 2 * 128 * 4 + 33 * 4
    cast = op_cost("triton_poi_fused__to_copy_1", [[131072, 64], [131072, 64], []],
                   ["float", "c10::BFloat16", "Scalar"], ["", "", "8388608"])
    assert cast is not None and cast.flops == 0 and cast.bytes == 131072 * 64 * (4 + 2)
    mask = op_cost("triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0",
                   [[888], [888], [888], [], [], [], [], [], []],
                   ["int", "long int", "bool", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
                   ["", "", "", "0", "25136", "201088", "201088", "0", "888"])
    assert mask is not None and mask.flops == 8 * 888 and mask.bytes == 888 * (4 + 8 + 1)
    pad = op_cost("triton_poi_fused_constant_pad_nd_moe_forward_0", [[32, 2880], [32, 3072], []],
                  ["c10::BFloat16", "c10::BFloat16", "Scalar"], ["", "", "98304"])
    assert pad is not None and pad.flops == 0 and pad.bytes == 32 * (2880 + 3072) * 2
    # a fused gather (the embedding table is an argument, read only at 32 rows): left missing
    assert op_cost("triton_poi_fused_0", [[32], [201088, 2880], [131072, 64], [32, 2880], [131072, 64]],
                   ["int", "c10::BFloat16", "float", "c10::BFloat16", "c10::BFloat16"], ["", "", "", "", ""]) is None


def test_moe_forward_of_another_model_stays_missing() -> None:
    # Qwen3-30B-A3B's shapes (hidden 2048, 128 experts): GPT-OSS's sizes would be wrong
    assert op_cost("vllm::moe_forward", [[32, 2048], [32, 128], []], ["c10::BFloat16", "c10::BFloat16", ""]) is None


def test_kernel_names_state_the_moe_precision(fixtures_dir: Path) -> None:
    from perfscope.analysis.costs.framework import kernel_precision

    assert kernel_precision("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32") == "fp8"
    assert kernel_precision("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16") == "fp8"
    assert kernel_precision("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu") == "bf16"
    assert kernel_precision("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT") is None
    k = read_kineto(fixtures_dir / "kineto" / "tracelens_b200__eager_trace.json.gz").kernels
    bmm = k[k["name"].str.startswith("bmm_")]
    assert len(bmm) == 72 and bmm["precision"].eq("fp8").all() and bmm["flops"].notna().all()


@pytest.mark.parametrize(("trace", "capture", "uncosted"), [
    (VLLM, "graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
     {"triton_poi_fused_0", "aten::index"}),
    (SGLANG, "bs_32_rank0.json.gz", set()),
])
def test_capture_trace_ops_are_costed(fixtures_dir: Path, trace: str, capture: str, uncosted: set[str]) -> None:
    """Every op a capture trace launches kernels from (the ops the replays will take) is priced
    with the replay step's annotation, but for the named fused gather and the
    ``aten::index`` whose tensor-list indices are recorded without shapes."""
    from perfscope.analysis.costs.operators import has_formula

    with gzip.open(fixtures_dir / "thirdparty" / trace / "capture_traces" / capture, "rt") as f:
        events = json.load(f)["traceEvents"]
    ctx = _context(fixtures_dir, trace, "")
    ops: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ops.setdefault((e["pid"], e["tid"]), []).append(e)
    calls = [e for e in events if e.get("cat") == "cuda_runtime" and "kernel" in e.get("args", {})]
    assert len(calls) > 300
    missing = set()
    for call in calls:
        chain = [o for o in ops.get((call["pid"], call["tid"]), []) if o["ts"] <= call["ts"] <= o["ts"] + o["dur"]]
        chain.sort(key=lambda o: (o["ts"], -o["dur"]))
        op = next((o for o in reversed(chain) if has_formula(o["name"])), chain[-1] if chain else None)
        assert op is not None
        a = op["args"]
        cost = op_cost(op["name"], a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs"), ctx)
        if cost is None or cost.bytes != cost.bytes:
            missing.add(op["name"])
    assert missing == uncosted


def test_nvfp4_and_block_scaled_fp8_gemms() -> None:
    # the B200 trace's o_proj shape (M 888, K 2880, N 640) in NVFP4: operands packed 2 per byte,
    # one E4M3 scale per 16 values (as vLLM's swizzled layout records them), fp32 alpha, bf16 out
    dims = [[888, 640], [888, 1440], [640, 1440], [896, 180], [640, 180], []]
    types = ["c10::BFloat16", "unsigned char", "unsigned char", "c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float"]
    cost = op_cost("_C::cutlass_scaled_fp4_mm", dims, types)
    assert cost is not None and cost.precision == "fp4"
    assert cost.flops == 2 * 888 * 640 * 2880
    assert cost.bytes == 888 * 640 * 2 + (888 + 640) * 1440 + (896 + 640) * 180 + 4
    # fp8 with 128 x 128 block scales (DeepSeek-style): a [M, K], b [K, N], scales [M, K/128], [K/128, N/128]
    dims = [[888, 640], [888, 2880], [2880, 640], [888, 23], [23, 5], []]
    types = ["c10::BFloat16", "c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", ""]
    cost = op_cost("_C::cutlass_scaled_mm", dims, types)
    assert cost is not None and cost.precision == "fp8" and cost.flops == 2 * 888 * 640 * 2880
    assert cost.bytes == 888 * 640 * 2 + 888 * 2880 + 2880 * 640 + (888 * 23 + 23 * 5) * 4


def test_sglang_profiler_counter_is_dropped_where_names_meet_formulas(fixtures_dir: Path) -> None:
    """SGLang's shape profiler names each wrapped launcher ``sglang_profiler::<module>_<fn>_<n>``;
    the counter ``n`` differs between runs. Formulas are keyed without it, as TraceLens keys
    its perf models (its CSVs name the op ``sglang_profiler::attention_paged_attention_ragged``)."""
    from perfscope.analysis.costs.framework import (
        framework_formula,
        paged_attention_ragged,
        qualified,
    )
    from perfscope.analysis.costs.operators import formula_of

    path = fixtures_dir / "thirdparty" / SGLANG / "capture_traces" / "bs_32_rank0.json.gz"
    with gzip.open(path, "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"]
                 if e.get("cat") == "cpu_op" and e["name"].startswith("sglang_profiler::")}
    assert "sglang_profiler::attention_paged_attention_ragged_100" in names and len(names) == 6
    stripped = {qualified(n) for n in names}
    assert len(stripped) == len(names) and not any(n[-1].isdigit() for n in stripped)
    theirs = {r["name"] for r in _csv(fixtures_dir, SGLANG, "ops_unique_args.csv")}
    assert qualified("sglang_profiler::attention_paged_attention_ragged_100") in theirs
    row = next(r for r in _csv(fixtures_dir, SGLANG, "InferenceAttention_fwd.csv") if "paged" in r["name"])
    ctx = _context(fixtures_dir, SGLANG, row["name"])
    for counter in ("_100", "_7", ""):  # another run's counter, TraceLens's stripped name
        op = f"sglang_profiler::attention_paged_attention_ragged{counter}"
        assert framework_formula(op) is paged_attention_ragged
        assert formula_of(op) == ("sglang_profiler::attention_paged_attention_ragged", paged_attention_ragged)
        cost = op_cost(op, *_args(row), ctx)
        assert cost is not None and cost.flops == pytest.approx(float(row["GFLOPS_first"]) * 1e9, rel=1e-9)
    # only that namespace carries a counter: other names keep their digits
    assert qualified("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert qualified("_C::rms_norm_2.default") == "_C::rms_norm_2"
    assert framework_formula("sglang_profiler::other_paged_attention_ragged_like_3") is None


def test_an_op_without_a_formula_is_listed_once_shapes_or_not(fixtures_dir: Path) -> None:
    """HTA's sampled trace has record_param_comms calls with and without recorded inputs: one
    entry in the no-formula warning, its rows and time the sum of both."""
    report = read_kineto(fixtures_dir / "kineto" / "hta_trace_filter__sampled_rank-0.json.gz")
    (warning,) = [w for w in report.warnings if w.startswith(MISSING_COST[0])]
    assert warning.count("record_param_comms (") == 1
    k = report.kernels
    rows = k["op"].eq("record_param_comms") & k["flops"].isna() & k["dram_bytes"].isna()
    share = 100 * k.loc[rows, "duration_ns"].sum() / k["duration_ns"].sum()
    assert f"record_param_comms ({int(rows.sum())} rows, {share:.1f}% of time)" in warning
