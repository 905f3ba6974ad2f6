"""memory-below-roof / compute-below-roof without measured counters: each group's advice comes from the causes
its trace shows (analysis/rules/roof_causes.py), checked against the kernel table's own columns and known
truth (a GEMM's weights K*N against its M*K + M*N activations); a group none explains is listed as unexplained,
with the measurement that would tell. The idle label's gap sizes (analysis/rules/_gaps.py gap_size_text)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfscope.analysis.findings import RULES
from perfscope.analysis.rules._gaps import gap_size_text
from perfscope.analysis.rules.roof_causes import (
    FLOOR_SHARE,
    SMALL_STREAM_NS,
    UNDERFILL_WAVES,
    gemm_dims,
    resident_blocks,
    weight_share,
)
from perfscope.analysis.summaries.kernels import group_key
from perfscope.device_models import device_models, kernel_family
from perfscope.format import si

B200 = "kineto/tracelens_b200__eager_trace.json.gz"
MI300X_GRAPH = "thirdparty/tracelens_vllm_decode_full/graph_execution.json.gz"
H200_EAGER = "h200/h200_llama1b_engine_eager.pt.trace.json.gz"  # not looked at while the rule was written
STOCK = ("access pattern", "coalesced", "70-90% of DRAM", "tiles well")


def _items(f):
    return {i.attrs["group"]: i for i in f.items}


def _blocks(grid: str) -> int:
    return int(np.prod([int(v) for v in grid.strip("()").split(",")]))


def test_gemm_dims_from_the_operators_shapes() -> None:
    assert gemm_dims("aten::addmm", "[[5120],[32,2880],[2880,5120],[],[]]") == (32, 2880, 5120)
    assert gemm_dims("aten::mm", "[[2,2048],[2048,8192]]") == (2, 2048, 8192)
    assert gemm_dims("aten::linear", "[[4,16,2048],[8192,2048],[8192]]") == (64, 2048, 8192)
    assert gemm_dims("aten::bmm", "[[8,128,64],[8,64,256]]") == (128, 64, 256)
    assert gemm_dims("vllm::moe_forward", "[[32,3072],[32,32],[]]") == (32, None, None)  # M only
    assert gemm_dims("aten::mm", None) == (None, None, None)
    # K*N against M*K + M*N: a decode GEMM's bytes are its weights, a prefill GEMM's are not
    assert weight_share(32, 2880, 5120, [], 0.0, "bf16") == pytest.approx(2880 * 5120 / (2880 * 5120 + 32 * 2880
                                                                                           + 32 * 5120))
    assert weight_share(888, 2880, 640, [], 0.0, "bf16") < 0.5


def test_b200_below_roof_names_the_causes_its_trace_shows(load) -> None:
    r = load(B200)
    (f,) = RULES["memory-below-roof"](r)
    k = r.kernels
    g = group_key(k)
    items = _items(f)
    sms = r.device.properties["sm_count"]
    assert sms == 148 and not any(s in f.recommendation for s in STOCK)
    # the attention group: a grid of 4 x 8 = 32 blocks on 148 SMs, and 1.48 MB per launch
    (fmha,) = [i for n, i in items.items() if n.startswith("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausal")]
    rows = k[g == fmha.attrs["group"]]
    assert fmha.attrs["grid_blocks"] == np.median([_blocks(x) for x in rows["grid"]]) == 32
    assert f"grid of 32 blocks on {sms} SMs" in fmha.label and 32 <= UNDERFILL_WAVES * sms
    per_launch = rows.loc[rows["bound"] == "memory", "dram_bytes"].sum() / fmha.attrs["count"]
    assert fmha.attrs["bytes_per_launch"] == pytest.approx(per_launch)
    assert fmha.attrs["stream_at_roof_ns"] == pytest.approx(per_launch / r.device.peak_bandwidth("dram") * 1e9)
    assert fmha.attrs["stream_at_roof_ns"] < SMALL_STREAM_NS and fmha.explains
    # the MoE bmm: vllm::moe_forward on [888, 3072] fp8 activations, 139 MB per launch: the rest are the weights
    (bmm,) = [i for n, i in items.items() if n.startswith("bmm_MxE4m3")]
    rows = k[(g == bmm.attrs["group"]) & (k["bound"] == "memory")]
    act = 2 * 888 * 3072 * 1  # read and written, fp8
    assert json.loads(rows["op_shapes"].iloc[0])[0] == [888, 3072] and rows["precision"].iloc[0] == "fp8"
    assert bmm.attrs["weight_share"] == pytest.approx(1 - act / (rows["dram_bytes"].sum() / len(rows)))
    assert "weights are 96% of its bytes" in bmm.label and "weight streaming" in f.recommendation
    # its weights are MXFP4 already (MxE2m1 in the kernel's name): no lower-precision weights offered
    assert bmm.attrs["weight_precision"] == "fp4" and "at 4 bits (the kernel's name)" in bmm.label
    assert "already stream at 4 bits" in f.recommendation and "FP8 weights halve" not in f.recommendation
    # the fused add-RMSNorm: B200 measured no reduction kernel, so H100's measured floor stands in, and says so
    (norm,) = [i for n, i in items.items() if "fused_add_rms_norm" in n]
    h100 = device_models().devices["H100 SXM5 80 GB"].curves["reduction"].trace_floor_ns
    assert norm.attrs["floor_ns"] == h100 and norm.attrs["stream_at_roof_ns"] < h100 < norm.attrs["mean_launch_ns"]
    assert "B200 (HGX, per GPU) measured no reduction kernel: H100 SXM5 80 GB's stands in" in norm.label
    assert norm.explains and norm.attrs["causes"] == "small"
    explained = sum(i.time_ns for i in f.items if i.explains)
    assert f.explained_ns == pytest.approx(explained)


def test_a_group_nothing_explains(load) -> None:
    """TimeSformer on H100: the softmax, Kernel2 and elementwise groups show no cause: listed as such, their time
    unexplained, and the advice names the measurement that would tell."""
    r = load("crossgpu/tracelens_h100_vs_mi300/h100__facebook_timesformer-base-finetuned-k400__1016002.json.gz")
    (f,) = RULES["memory-below-roof"](r)
    none = [i for i in f.items if not i.explains]
    assert none and all("nothing in the trace explains it" in i.label and not i.attrs.get("causes") for i in none)
    assert "Nothing in the trace explains" in f.recommendation and "Nsight Compute" in f.recommendation
    explained = sum(i.time_ns for i in f.items if i.explains)
    assert f.explained_ns == pytest.approx(explained) and f.unexplained_ns > 0


def test_mi300x_decode_graph_weights_kv_and_fusion(load) -> None:
    r = load(MI300X_GRAPH)
    (f,) = RULES["memory-below-roof"](r)
    assert not any(s in f.recommendation for s in STOCK)
    by = {}
    for i in f.items:
        by.setdefault(i.attrs.get("causes"), []).append(i)
    # the dense decode GEMMs: aten::addmm of 32 rows, K=2880, N=5120 (op_shapes): weights 98% of the bytes
    addmm = [i for i in f.items if i.attrs.get("gemm_k") == 2880 and i.attrs.get("gemm_n") == 5120]
    assert addmm and all(i.attrs["gemm_m"] == 32 and "weights" in i.attrs["causes"] for i in addmm)
    assert addmm[0].attrs["weight_share"] == pytest.approx(2880 * 5120 / (2880 * 5120 + 32 * 2880 + 32 * 5120))
    # the advice follows the precision the weights stream at: the dense ones bf16 (the op's input types), the
    # experts' MXFP4 (triton_kernels' ``bf16xbf16xmxfp4`` kernel name): one sentence each, each its own cut
    assert all(i.attrs["weight_precision"] == "bf16" and "at 16 bits (the op's input types)" in i.label for i in addmm)
    ogs = [i for i in f.items if i.attrs["group"].startswith("_matmul_ogs_NNT_bf16xbf16xmxfp4")]
    assert len(ogs) == 2 and all(i.attrs["weight_precision"] == "fp4" for i in ogs)
    sentences = [s for s in f.recommendation.split(". ") if "weight streaming" in s]
    (fp4,) = [s for s in sentences if "_matmul_ogs" in s]
    (bf16,) = [s for s in sentences if "Cijk_" in s]
    assert "already stream at 4 bits" in fp4 and "FP8" not in fp4
    assert "FP8 weights halve the bytes" in bf16 and "_matmul_ogs" not in bf16
    # the experts' finalize epilogue: category gemm (its op, vllm::moe_forward) and bytes a time share of the op's,
    # 96% of them above its activations: not the weights' reader, since its siblings' names state MXFP4 and its own
    # does not; said so, with no weights advice (it was told "they stream at 16 bits: FP8 weights halve the bytes")
    (fin,) = [i for i in f.items if i.attrs["group"] == "_finalize_matmul_scatter_bf16"]
    assert "weights" not in fin.attrs["causes"] and fin.attrs.get("weight_precision") is None
    assert fin.attrs["weights_read_by"].count("_matmul_ogs_NNT_bf16xbf16xmxfp4") == 2
    assert "the op's 4-bit weights are read by _matmul_ogs" in fin.label and "time share" in fin.label
    assert "_finalize" not in bf16 and "_finalize" not in fp4
    # the attention of the decode phase reads the KV cache; a graph replay records no grid: no grid clause
    att = [i for i in f.items if i.attrs.get("category") == "attention"]
    assert att and all("kv" in i.attrs["causes"] and "grid_blocks" not in i.attrs for i in att)
    assert "KV cache" in f.recommendation and "CUs" not in f.recommendation
    assert f.explained_share == pytest.approx(1.0)


def test_unseen_h200_trace_reads_right(load) -> None:
    """A trace the rule was not tuned on: the H200 eager Llama-1B decode (batch 2)."""
    r = load(H200_EAGER)
    (f,) = RULES["memory-below-roof"](r)
    (gemm,) = [i for i in f.items if i.attrs.get("category") == "gemm"]
    assert gemm.attrs["gemm_m"] == 2 and gemm.attrs["weight_share"] > 0.99 and gemm.explains
    assert gemm.attrs["weight_precision"] == "bf16" and "FP8 weights halve the bytes" in f.recommendation
    assert gemm.attrs["grid_blocks"] < 132 and gemm.attrs["sm_count"] == 132
    assert all(i.explains == bool(i.attrs.get("causes")) for i in f.items)
    assert not any(s in f.recommendation for s in STOCK)


def test_which_kernels_of_a_fused_op_read_its_packed_weights(load) -> None:
    """A fused MoE op's bytes are split among its kernels by time; its packed weights are read by the GEMM kernels
    whose names state the format. Checked on a table built to the rule's cases and on the B200 trace (TensorRT-LLM's
    ``bmm_..._MxE2m1`` experts, whose finalize and routing kernels the op also launched)."""
    import pandas as pd

    from perfscope.analysis.rules.roof_causes import packed_readers

    def table(*names: str, types: str = '["c10::BFloat16","c10::BFloat16"]') -> pd.DataFrame:
        return pd.DataFrame({"name": list(names), "op": "vllm::moe_forward", "op_shapes": "[[32,3072],[32,32]]",
                             "op_input_types": types})

    k = table("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1", "_finalize_matmul_scatter_bf16")
    assert packed_readers(k, k.iloc[[1]]) == (4, ["_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1"])
    assert packed_readers(k, k.iloc[[0]]) is None  # the reader names its format itself
    # a dequantize kernel is no GEMM: the bf16 GEMM after it reads the weights it wrote
    k = table("dequantize_int4_to_bf16_kernel", "Cijk_Alik_Bljk_BBS_BH")
    assert packed_readers(k, k.iloc[[1]]) is None
    # no sibling names a narrower format (a bf16 fused MoE): no reader is known, the weights clause stays
    k = table("fused_moe_kernel", "moe_align_block_size_kernel")
    assert packed_readers(k, k.iloc[[0]]) is None and packed_readers(k, k.iloc[[1]]) is None
    # the same kernels under another op or other inputs are not siblings
    k = pd.concat([table("_finalize_matmul_scatter_bf16"),
                   table("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1").assign(op_shapes="[[64,3072],[64,32]]")])
    assert packed_readers(k, k.iloc[[0]]) is None
    b200 = load(B200).kernels
    for part in ("finalizeKernelVecLoad", "routingIndicesOffsetsKernel"):
        bits, names = packed_readers(b200, b200[b200["name"].str.contains(part, regex=False)])
        assert bits == 4 and len(names) == 2 and all(n.startswith("bmm_") for n in names)
    assert packed_readers(b200, b200[b200["name"].str.startswith("bmm_MxE4m3")]) is None


def test_the_weights_precision_from_the_kernel_name_else_the_op_types() -> None:
    """What a weight-streaming GEMM's weights are stored at: the narrowest format its kernel's name states (each
    family's spelling), else its op's narrowest tensor input, else unknown: then the advice says it is unknown."""
    from perfscope.analysis.costs.quantized import narrowest_operand
    from perfscope.analysis.rules.roof_causes import CAUSE_ADVICE, WEIGHT_CUT

    name = "the kernel's name"
    assert narrowest_operand("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16") == ("fp4", name)
    assert narrowest_operand("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu") == ("fp4", name)
    assert narrowest_operand("sm90_xmma_gemm_e4m3e4m3_bf16_f32_tn_n_tilesize64x128x128") == ("fp8", name)
    assert narrowest_operand("gemm_w4a16_kernel<128>") == ("int4", name)
    assert narrowest_operand("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", ["c10::BFloat16", "c10::BFloat16"]) == (
        "bf16", "the op's input types")
    assert narrowest_operand("Cijk_Alik_Bljk_SB", ["float", "float", "Scalar"]) == ("fp32", "the op's input types")
    assert narrowest_operand("Cijk_Alik_Bljk_SB", ["c10::BFloat16", "c10::Float8_e4m3fn"])[0] == "fp8"
    assert narrowest_operand("gemm_kernel", []) is None and narrowest_operand(None, ["Scalar"]) is None
    unknown = CAUSE_ADVICE["weights"].format(groups="g", cut=WEIGHT_CUT[None])
    assert "unknown" in unknown and "FP8" not in unknown


def test_measured_ncu_path_is_unchanged(load) -> None:
    """Where ncu measured the limiter, the limiter's advice alone: no trace-evidence clause, nothing unexplained."""
    r = load("ncu/esmm_a10g_roofline_set.ncu-rep")
    (f,) = RULES["compute-below-roof"](r)
    assert [i.attrs["limiter"] for i in f.items] == ["lsu"] and all(i.explains for i in f.items)
    assert "causes" not in f.items[0].attrs and "Nothing in the trace" not in f.recommendation
    assert f.recommendation.startswith("The LSU pipe")


def test_gap_size_text_cannot_be_read_as_n_times_t() -> None:
    ms = 1e6
    # the group fills most of its gaps: "N gaps of T" reads right
    assert gap_size_text(9 * ms, 3, 3 * ms, 9.5 * ms) == " in 3 gaps of 3 ms"
    # the V100 ResNet-50's aten::to: 26.9 ms in 260 gaps whose time-weighted length is 57.3 ms
    assert gap_size_text(26.9 * ms, 260, 57.3 * ms, 300 * ms) == " in 260 gaps; half of it in gaps of 57.3 ms or longer"
    # one gap holds more than half of it, and the group fills its gaps (6.74 ms) but not 12 x 6.63 ms: that gap is said
    assert gap_size_text(6.63 * ms, 12, 6.63 * ms, 6.74 * ms, (6.54 * ms, 6.63 * ms)) == (
        " in 12 gaps, 6.54 ms of it in one gap of 6.63 ms")
    # gaps of like length that the group fills: N x T is right
    assert gap_size_text(3.1 * ms, 2, 1.6 * ms, 3.2 * ms, (1.6 * ms, 1.6 * ms)) == " in 2 gaps of 1.6 ms"
    assert gap_size_text(1 * ms, 1, 4 * ms, 4 * ms) == " in 1 gap of 4 ms"


def test_v100_resnet_idle_label(load) -> None:
    from perfscope.analysis.findings import run_rules

    r = load("kineto/kineto_resnet50_v100_2021.pt.trace.json.gz")
    (f,) = [x for x in run_rules(r, rules=["gpu-idle"]) if x.id == "gpu-idle"]
    (to,) = [i for i in f.items if i.attrs.get("op") == "aten::to"]
    assert "in 260 gaps; half of it in gaps of 57.3 ms or longer" in to.label
    assert to.attrs["gaps"] == 260 and to.time_ns < 0.5 * 260 * to.attrs["typical_gap_ns"]


def test_compute_bound_gemm_off_multiples_of_8(load) -> None:
    """TimeSformer on MI300X: the compute-bound GEMMs of M = 25089 rows (8 x 3136 patches + 1 class token)."""
    r = load("crossgpu/tracelens_h100_vs_mi300/mi300__facebook_timesformer-base-finetuned-k400__1016002.json.gz")
    (f,) = RULES["compute-below-roof"](r)
    shaped = [i for i in f.items if i.attrs.get("causes") == "shape"]
    assert shaped and all(i.attrs["gemm_m"] % 8 and i.attrs["gemm_k"] >= 64 for i in shaped)
    assert all(f"M={i.attrs['gemm_m']}" in i.label and "not a multiple of 8" in i.label for i in shaped)
    assert "multiples of 16" in f.recommendation


def test_low_estimated_occupancy_names_registers_and_shared_memory(load) -> None:
    """Kineto's est. achieved occupancy: the B200 trace's elementwise group given 12% (its real registers and shared
    memory kept), and 0 read as not estimated."""
    from dataclasses import replace

    from perfscope.analysis.rules.kernels import _group_totals, effective_kernels
    from perfscope.analysis.rules.roof_causes import group_causes

    r = load(B200)
    k = effective_kernels(r)
    groups = _group_totals(k, "memory")
    row = groups[groups["group"] == "elementwise_kernel"]
    at = group_key(k) == "elementwise_kernel"
    (before,) = group_causes(r, k, row, "memory")
    assert "occupancy" not in before.advice
    low = k.assign(est_occupancy_pct=k["est_occupancy_pct"].where(~at, 12.0))
    (c,) = group_causes(replace(r, kernels=low), low, row, "memory")
    regs = int(k.loc[at, "registers_per_thread"].median())
    assert c.advice["occupancy"] == "elementwise_kernel" and c.attrs["est_occupancy_pct"] == 12.0
    assert f"estimated occupancy 12% ({regs} registers per thread" in "; ".join(c.clauses)
    zero = k.assign(est_occupancy_pct=k["est_occupancy_pct"].where(~at, 0.0))
    (z,) = group_causes(replace(r, kernels=zero), zero, row, "memory")
    assert "occupancy" not in z.advice and "est_occupancy_pct" not in z.attrs


@pytest.mark.parametrize("cap, threads, registers, shared, blocks", [
    ("9.0", 256, 128, 0, 2),  # registers: 4,096 a warp, 4 x (16,384 // 4,096) = 16 warps = 2 blocks of 8
    ("8.0", 128, 240, 147456, 1),  # shared memory: 144 KiB + 1 KiB reserved of 164 KiB
    ("8.9", 1024, 32, 0, 1),  # warps: 48 // 32
    ("7.5", 1024, 32, 0, 1),  # warps: 32 // 32
    ("7.0", 128, 32, 0, 16),  # warps: 64 // 4
    ("8.6", 64, 16, 0, 16),  # the block limit of 8.6
    ("9.0", 128, 200, 0, 2),  # 6,400 a warp: 2 warps per sub-partition, 8 per SM, 2 blocks of 4 (not 10 // 4)
    ("9.0", 384, 168, 134144, 1),  # the H200 engine's cuDNN flash attention kernel
    ("10.0", 128, 255, 0, 2),  # 8,192 a warp
    ("11.0", 128, 32, 0, None),  # a capability the table does not hold is not guessed
    ("9.0", 128, 32, 300000, None),  # more shared memory than an SM has
    ("9.0", 1024, 255, 0, None),  # more registers than the register file
])
def test_resident_blocks_by_cudas_occupancy_rules(cap: str, threads: int, registers: int, shared: int,
                                                  blocks: int | None) -> None:
    """Blocks one SM holds at once, counted by hand with CUDA's occupancy rules (cuda_occupancy.h: registers per
    warp rounded to 256 within 4 sub-partitions, shared memory in 128-byte units plus 1 KiB a block on 8.0+, and
    the capability's warp and block limits)."""
    assert resident_blocks(cap, threads, registers, shared) == blocks


@pytest.mark.parametrize("grid, tail", [(133, (1, 133 / 132, 1, 131 / 132 / 2)), (264, None), (200, None), (100, None)])
def test_a_grid_that_ends_in_a_partial_wave_is_a_tail(load, grid: int, tail: tuple | None) -> None:
    """The H200 engine's cuDNN flash attention (384 threads, 168 registers, 131 KiB of shared memory: one block per
    SM) at grids it could have had: 133 blocks on 132 SMs is two waves, the second of one block, so 131 SMs idle
    through half the launch; 264 is two full waves; 200 leaves 64 SMs idle through the second of two waves, 24% of the
    SM time (under the quarter a cause needs); 100 is under one wave (the grid cause)."""
    from dataclasses import replace

    from perfscope.analysis.rules.kernels import _group_totals, effective_kernels
    from perfscope.analysis.rules.roof_causes import causes_advice, group_causes

    r = load(H200_EAGER)
    k = effective_kernels(r)
    name = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
    at = (group_key(k) == name).to_numpy()
    assert at.any()
    k = k.assign(grid=k["grid"].astype(object).where(~at, f"({grid}, 1, 1)"))
    groups = _group_totals(k, "memory")
    (c,) = group_causes(replace(r, kernels=k), k, groups[groups["group"] == name], "memory")
    if tail is None:
        assert "tail" not in c.advice and "waves" not in c.attrs
        assert ("grid" in c.advice) == (grid <= UNDERFILL_WAVES * 132)
        return
    resident, waves, last, idle = tail
    assert "tail" in c.advice and "grid" not in c.advice
    assert (c.attrs["resident_blocks_per_sm"], c.attrs["last_wave_blocks"]) == (resident, last)
    assert c.attrs["waves"] == pytest.approx(waves) and c.attrs["tail_idle_share"] == pytest.approx(idle)
    assert ("133 blocks on 132 SMs x 1 resident: 1.01 waves, the last of 1 block, so 131 SMs have none through it "
            "(50% of the launch's SM time)") in "; ".join(c.clauses)
    advice = " ".join(causes_advice(replace(r, kernels=k), [c], [1.0], [name]))
    assert "the grid ends in a partial wave (wave quantization)" in advice and "persistent (stream-K)" in advice


def test_cpu_report_gets_only_cpu_causes(sample_reports_dir) -> None:
    from perfscope.api import load as load_report

    r = load_report(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope")
    (f,) = RULES["memory-below-roof"](r)
    causes = {c for i in f.items for c in str(i.attrs.get("causes") or "").split(", ") if c}
    assert causes and causes <= {"fuse", "fp32", "weights", "shape", "fp32mm"}
    assert not any("grid_blocks" in i.attrs or "stream_at_roof_ns" in i.attrs for i in f.items)
    assert "Nsight" not in f.recommendation and "SM" not in f.recommendation.split()
    # a fusion pair is named once ("silu with mul", not also "mul with silu"), of operators, not kernels
    assert "silu with mul" in f.recommendation and "mul with silu" not in f.recommendation
    assert "elementwise/norm/copy operators" in f.recommendation and "perf stat" in f.recommendation


@pytest.mark.parametrize("bf16", [None, 1.34e9])
def test_lower_precision_is_advised_only_where_the_device_computes_it_faster(sample_reports_dir,
                                                                            bf16: float | None) -> None:
    """The sample CPU report (a CPU whose measured bf16 roof is 2.3x its fp32 one) and the same report with the bf16
    roof this project's AMD EPYC measures without a bf16 matrix path (1.34 GFLOP/s against 161 GFLOP/s fp32): BF16
    weights and a tensor-core precision are advised on the first; on the second the advice says why not, and an FP32
    matmul is not called a cause of running below the roof. Its decode matmul group (fp32 weights, one row), priced
    as the below-roof findings price it."""
    from dataclasses import replace

    from perfscope.analysis.rules.kernels import _group_totals, effective_kernels
    from perfscope.analysis.rules.llm import _prefill_advice
    from perfscope.analysis.rules.roof_causes import causes_advice, group_causes
    from perfscope.api import load as load_report
    from perfscope.device import Roof

    r = load_report(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope")
    dev = r.device
    assert dev.compute["bf16"].value >= 2 * dev.compute["fp32"].value
    if bf16 is not None:
        r = r.with_manifest(device=replace(dev, compute={**dev.compute, "bf16": Roof(bf16, "measured", "torch.mm")})
                            .to_dict())
    k = effective_kernels(r)
    groups = _group_totals(k, "memory")
    (c,) = group_causes(r, k, groups[groups["group"] == "matmul"], "memory")
    assert c.attrs["weight_precision"] == "fp32" and c.advice.get("weights") == "matmul"
    advice = " ".join(causes_advice(r, [c], [1.0], ["matmul"]))
    clauses = "; ".join(c.clauses)
    prefill = _prefill_advice([], r.kernels, "fp32", r.device)  # what prefill-mfu says of an fp32 prefill
    if bf16 is None:
        assert "fp32mm" in c.advice and "FP32 matmul" in clauses
        assert "they stream at 32 bits: BF16 weights halve the bytes and FP8 ones quarter them" in advice
        assert "a tensor-core precision (bf16) raises the roof itself" in prefill
        return
    said = f"this device computes bf16 at 1.34 GFLOP/s against {si(dev.compute['fp32'].value, 'FLOP/s')} in fp32"
    assert "fp32mm" not in c.advice and f"FP32 matmul ({said}: not a cause here)" in clauses
    assert f"It computes in fp32, and {said}: a lower precision would not raise the roof here" in prefill
    assert "tensor-core precision" not in prefill
    assert f"they stream at 32 bits; BF16 weights would halve the bytes, but {said}" in advice
    assert "BF16 weights halve" not in advice


NORMS = "memory/tracelens_mi300x_normalization_profile_memory/normalization_layer_test.json.gz"
SGLANG = "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz"


def _stream_pairs(k):
    """Reference: (row, next row) on each (device, stream), from the columns' text (what the codes must equal)."""
    import pandas as pd

    t = pd.DataFrame({"d": k["device"].astype(str), "s": k["stream"].astype(str), "t": k["start_ns"],
                      "i": np.arange(len(k))}).sort_values(["d", "s", "t"], kind="stable")
    same = (t["d"].to_numpy()[1:] == t["d"].to_numpy()[:-1]) & (t["s"].to_numpy()[1:] == t["s"].to_numpy()[:-1])
    i = t["i"].to_numpy()
    return set(zip(i[:-1][same].tolist(), i[1:][same].tolist()))


@pytest.mark.parametrize("name", [H200_EAGER, SGLANG, "kineto/hta_negative_queue_length_values_check__rank0.json.gz"])
def test_stream_order_from_codes_equals_the_text_order(load, name) -> None:
    """The stream order is built from the device and stream columns' codes (no text pass over the table): each
    kernel's next one on its stream is the one the columns' text gives (missing streams a lane of their own)."""
    from perfscope.analysis.rules.roof_causes import _stream_order
    from perfscope.memo import memo_peek
    from perfscope.schema import CODES_KEY

    k = load(name).kernels.copy()
    order, lane, pos = _stream_order(k)
    assert memo_peek(k, f"{CODES_KEY}stream") is not None  # the column's codes, kept for the other rules
    a, b = order[:-1], order[1:]
    same = lane[a] == lane[b]
    assert set(zip(a[same].tolist(), b[same].tolist())) == _stream_pairs(k)
    assert (pos[order] == np.arange(len(k))).all()


def test_fuse_needs_one_op_chain_where_the_trace_records_scopes(load) -> None:
    """MI300X normalization benchmarks: each norm runs in its own record_function range (``LayerNorm affine=True``
    beside ``BatchNorm affine=True``); stream neighbours of two benchmarks are not a fusible chain."""
    from perfscope.analysis.rules.roof_causes import _scopes

    r = load(NORMS)
    (f,) = RULES["memory-below-roof"](r)
    (ln,) = [i for i in f.items if i.attrs["group"] == "vectorized_layer_norm_kernel"]
    assert "fuse" not in ln.attrs["causes"] and "launched beside" not in ln.label
    k = r.kernels
    at = np.flatnonzero((group_key(k) == ln.attrs["group"]).to_numpy())
    sc = _scopes(k)
    assert sc.column == "range" and (sc.code[at] >= 0).all()
    # the kernel before each launch on its stream is another benchmark's: another range, not its parent or sibling
    ks = k.sort_values("start_ns", kind="stable")
    prev = {i: ks.index[j - 1] for j, i in enumerate(ks.index) if j}
    ranges = {str(k.at[prev[k.index[i]], "range"]) for i in at if k.index[i] in prev}
    assert ranges and not ranges & set(k["range"].iloc[at].astype(str))


def test_fuse_in_one_module_call_of_a_graph_capture(load) -> None:
    """SGLang Qwen3-8B decode replays, joined to their capture's nn.Module calls: rotary embedding beside the
    KV-cache store and the fused add-RMSNorm of its attention block is one op chain by its module calls; the
    embedding gather beside the first layer's norm is not (another module: VocabParallelEmbedding)."""
    r = load(SGLANG)
    (f,) = RULES["memory-below-roof"](r)
    items = _items(f)
    (rope,) = [i for n, i in items.items() if n.startswith("rotary_embedding_kernel")]
    assert "fuse" in rope.attrs["causes"] and rope.attrs["neighbours_scope"] == "capture_module"
    assert "one op chain by their module calls" in rope.label
    k = r.kernels
    mods = k.loc[group_key(k) == rope.attrs["group"], "capture_module"].dropna().astype(str)
    assert len(mods) and all("Qwen3Attention_" in m for m in mods)
    (gather,) = [i for n, i in items.items() if n.startswith("vectorized_gather_kernel")]
    # its 13.5 µs launch is far over the ~2 µs elementwise floor: neither the floor nor a neighbour explains it
    assert not gather.attrs["causes"] and not gather.explains and gather.attrs["floor_share"] < FLOOR_SHARE
    assert set(k.loc[group_key(k) == gather.attrs["group"], "capture_module"].astype(str)) == {
        "Qwen3Model_0/VocabParallelEmbedding_0"}


def test_fuse_says_stream_neighbours_without_scopes(load) -> None:
    """B200 eager: one record_function range holds 766 of its 768 kernels (vLLM's step), no op chain: the
    elementwise group's neighbours are stream neighbours, and its label says so."""
    r = load(B200)
    (f,) = RULES["memory-below-roof"](r)
    (ew,) = [i for n, i in _items(f).items() if n == "elementwise_kernel"]
    assert "fuse" in ew.attrs["causes"] and ew.attrs["neighbours_scope"] == "stream"
    assert "stream neighbours" in ew.label and "one op chain" not in ew.label
    assert r.kernels["range"].value_counts().iloc[0] > 0.5 * len(r.kernels)


def test_unseen_h200_fuse_by_ranges(load) -> None:
    """A trace not looked at while the scope rule was written: the H200 eager Llama-1B's reduce_kernel beside its
    elementwise kernel, one op chain by the engine's record_function ranges (``decode/layer.N/...``)."""
    r = load(H200_EAGER)
    (f,) = RULES["memory-below-roof"](r)
    fused = [i for i in f.items if "fuse" in str(i.attrs.get("causes"))]
    assert fused and {i.attrs["neighbours_scope"] for i in fused} == {"range"}
    (red,) = [i for i in fused if i.attrs["group"] == "reduce_kernel"]
    assert red.attrs["fusible_neighbours"].split("; ")[0] == "elementwise_kernel"
    assert all(("one op chain by their record_function / NVTX ranges" in i.label)
               == (i.attrs["neighbours_scope"] == "range") for i in fused)


def _trace_floor(k, family: str) -> float:
    """The shortest kernel of ``family`` in the table, from the columns (what the rule's cap must equal)."""
    fam = kernel_family(k["category"].to_numpy(object), k["precision"].to_numpy(object),
                        k["flops"].to_numpy("float64"), k["dram_bytes"].to_numpy("float64"), k["phase"].to_numpy(object))
    return float(k["duration_ns"].to_numpy("float64")[fam == family].min())


def test_small_is_measured_against_the_devices_own_floor(load) -> None:
    """H200 eager: the reduce kernel's 513 kB per launch stream in 107 ns at the DRAM roof, under the shortest reduction
    kernel the H200's device model measured in a trace (not a fixed 1 µs): its attrs say which floor and where from;
    small is its cause only where that floor is at least half of what a launch loses to the roof."""
    r = load(H200_EAGER)
    (f,) = RULES["memory-below-roof"](r)
    (red,) = [i for i in f.items if i.attrs["group"] == "reduce_kernel"]
    own = device_models().devices["H200 SXM 141 GB"].curves["reduction"].trace_floor_ns
    assert np.isfinite(own) and own != SMALL_STREAM_NS and own <= _trace_floor(r.kernels, "reduction")
    assert red.attrs["floor_ns"] == own and red.attrs["floor_source"] == "H200 SXM 141 GB reduction, shortest in a trace"
    # its bytes stream under the floor, but a 35.7 µs launch is far over it: the floor is 5% of what a launch loses
    # to the roof (the fixed cost is not its cause; its 1-wave grid is)
    assert red.attrs["stream_at_roof_ns"] < own
    lost = red.attrs["mean_launch_ns"] - red.attrs["stream_at_roof_ns"]
    assert red.attrs["floor_share"] == pytest.approx(own / lost) and red.attrs["floor_share"] < FLOOR_SHARE
    assert "small" not in red.attrs["causes"] and "grid" in red.attrs["causes"]
    # the sm90 attention's 9.07 µs launch is about the floor plus its bytes' time: the floor explains it
    (att,) = [i for i in f.items if str(i.attrs["group"]).startswith("cudnn_generated_fort_native_sdpa_sm90")]
    assert att.attrs["floor_share"] >= FLOOR_SHARE and "small" in att.attrs["causes"] and att.explains
    assert "a launch loses to the roof" in att.label


def test_floor_capped_by_the_traces_own_shortest_kernel(load) -> None:
    """vLLM GPT-OSS decode on MI300X (a trace the floor was not tuned on): MI300X measured no decode attention, so
    MI308X's model stands in with 60.9 µs, longer than kernels this very trace ran: the trace's own shortest decode
    attention kernel is the floor, and the 99.5 MB unified-attention launch (18.8 µs at the roof) is not called small."""
    r = load(MI300X_GRAPH)
    (f,) = RULES["memory-below-roof"](r)
    k = r.kernels
    stand_in = device_models().devices["MI308X"].curves["attention-decode"].trace_floor_ns
    own = _trace_floor(k, "attention-decode")
    assert own < stand_in
    att = [i for i in f.items if i.attrs.get("category") == "attention"]
    assert att and all(i.attrs["floor_ns"] == own and "this trace" in i.attrs["floor_source"] for i in att)
    (uni,) = [i for i in att if i.attrs["group"] == "kernel_unified_attention_3d"]
    assert own < uni.attrs["stream_at_roof_ns"] < stand_in and "small" not in uni.attrs["causes"]
    (seg,) = [i for i in att if i.attrs["group"] == "reduce_segments"]
    assert seg.attrs["stream_at_roof_ns"] < own and "small" in seg.attrs["causes"]
    assert "under the shortest attention-decode kernel of this trace" in seg.label


def test_floor_default_where_no_device_of_the_vendor_measured_one() -> None:
    from perfscope.analysis.rules.roof_causes import _floor

    none = _floor(None, "elementwise")
    assert none.ns == SMALL_STREAM_NS and none.kind == "default" and "no datasheet row" in none.source()
    other = _floor(("Gaudi 3", "intel", "intel-3"), "elementwise")
    assert other.ns == SMALL_STREAM_NS and "no intel device measured a elementwise kernel" in other.source()


@pytest.mark.parametrize(("measured", "family"), [("h200/h200_engine_gemm_attn_full.ncu-rep", "H200"),
                                                   ("ncu/esmm_a10g_roofline_set.ncu-rep", "A10G")])
def test_l2_table_equals_the_devices_own_attribute(load, measured, family) -> None:
    """The table's H200 and A10G figures are what the devices themselves report (Nsight Compute's
    device__attribute_l2_cache_size in the committed reports)."""
    from perfscope.analysis.rules.roof_causes import L2_BYTES

    assert L2_BYTES[family] == load(measured).device.properties["l2_cache_bytes"]


def test_l2_of_a_trace_without_the_property(load) -> None:
    """Kineto traces carry no L2 size: the table by the datasheet row or the device name's words (never a prefix:
    ``A100-SXM4-80GB`` is an A100, not an A10)."""
    from dataclasses import replace

    from perfscope.analysis.rules.roof_causes import L2_BYTES, l2_bytes

    mib = 2**20
    for name, want in [(H200_EAGER, 60 * mib), (SGLANG, 4 * mib), ("kineto/kineto_resnet50_v100_2021.pt.trace.json.gz",
                        6 * mib), ("kineto/hta_negative_queue_length_values_check__rank0.json.gz", 40 * mib),
                       ("kineto/tracelens_mi210__gpu_only_trace__gpu_only_trace.json.gz", 8 * mib),
                       (B200, None)]:
        r = load(name)
        assert "l2_cache_bytes" not in r.device.properties
        got = l2_bytes(r)
        assert (np.isnan(got) if want is None else got == want), (name, got)
    r = load(H200_EAGER)
    dev = replace(r.device, name="NVIDIA A10", properties={})
    a10 = replace(r, manifest={**r.manifest, "device": dev.to_dict()})
    assert l2_bytes(a10) == L2_BYTES["A10"] and "B200" not in L2_BYTES


def test_unseen_torch_compile_mi300x_trace(load) -> None:
    """A trace not looked at while floors and the L2 table were written: TraceLens's torch.compile MI300X trace. Its
    fused Triton SiLU-mul moves 1.07 GB per launch (203 µs at the DRAM roof), far above MI300X's own measured
    elementwise floor, so it is not small; Kineto records no L2 size, the table gives MI300X's 4 MiB per XCD."""
    r = load("kineto/tracelens_torch_compile_triton__trace.json.gz")
    (f,) = RULES["memory-below-roof"](r)
    (silu,) = f.items
    own = device_models().devices["MI300X"].curves["elementwise"].trace_floor_ns
    assert silu.attrs["floor_ns"] == own and silu.attrs["floor_source"] == "MI300X elementwise, shortest in a trace"
    assert silu.attrs["stream_at_roof_ns"] > 100 * own and not silu.explains and silu.attrs["l2_bytes"] == 4 * 2**20
    assert "l2_cache_bytes" not in r.device.properties
