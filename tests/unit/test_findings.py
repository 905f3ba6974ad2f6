"""Findings on real profiler outputs: each rule fires where it must and stays silent where it must not,
and its evidence equals an independent computation on the same tables (plain-Python sweeps here,
not the interval helpers the rules use)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from perfscope.analysis.findings import RULES, Finding, run_rules
from perfscope.analysis.rules import timeline
from perfscope.errors import UsageError
from perfscope.report import Report
from tests.unit.ranks_support import union as union_sweep

B200 = "kineto/tracelens_b200__eager_trace.json.gz"
QWEN = "kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
A100 = "kineto/hta_negative_queue_length_values_check__rank0.json.gz"
ALEXNET = "kineto/hta_critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
CPU_RANK = "kineto/hta_rank_non_gpu__rank_non_gpu.json.gz"
V100 = "kineto/hta_ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
T4 = "nsys/aws_t4_softmax.sqlite"
H100_NSYS = "nsys/nvfuser_h100_matmul.sqlite"
ONE_KERNEL = "kineto/kineto_docs_h100_before_fix.json"
EVENT_SYNC = "kineto/hta_critical_path__cuda_event_sync_multi_stream__event_sync_trace.json.gz"



def only(findings: list[Finding], rule_id: str) -> Finding:
    hits = [f for f in findings if f.id == rule_id]
    assert len(hits) == 1, [f.id for f in findings]
    return hits[0]


def device_intervals(report: Report) -> list[tuple[int, int]]:
    rows = [*zip(report.kernels["start_ns"], report.kernels["end_ns"]),
            *zip(report.transfers["start_ns"], report.transfers["end_ns"])]
    return [(int(s), int(e)) for s, e in rows]


# ---------------------------------------------------------------------------- idle
def test_gpu_idle_fires_on_the_launch_bound_b200_trace(load) -> None:
    r = load(B200)
    f = only(RULES["gpu-idle"](r), "gpu-idle")
    merged = union_sweep(device_intervals(r))
    span = merged[-1][1] - merged[0][0]
    busy = sum(e - s for s, e in merged)
    gaps = sorted((merged[i + 1][0] - merged[i][1] for i in range(len(merged) - 1)), reverse=True)
    assert f.evidence["span_ns"] == span and f.evidence["idle_ns"] == span - busy
    assert f.evidence["idle_pct"] == pytest.approx(100 * (span - busy) / span)
    assert f.evidence["gaps"] == len(gaps) and f.evidence["gap1_ns"] == gaps[0] and f.evidence["gap2_ns"] == gaps[1]
    assert f.time_at_stake_ns == span - busy and f.severity == "high"
    # waiting for launch: the launch call of the work that ends a gap returned after the gap began
    api_end = dict(zip(r.api["correlation"], r.api["end_ns"]))
    work = sorted(zip(r.kernels["start_ns"], r.kernels["end_ns"], r.kernels["correlation"]))
    work += sorted(zip(r.transfers["start_ns"], r.transfers["end_ns"], r.transfers["correlation"]))
    work.sort(key=lambda w: w[0])
    waited, latest = 0, None
    for s, e, corr in work:
        if latest is not None and s > latest and api_end.get(corr, -math.inf) > latest:
            waited += s - latest
        latest = e if latest is None else max(latest, e)
    assert f.evidence["idle_waiting_for_launch_ns"] == waited
    assert waited / (span - busy) > 0.5 and "CUDA graph" in f.recommendation


def test_gpu_idle_silent_on_the_busy_qwen_trace(load) -> None:
    r = load(QWEN)
    merged = union_sweep(device_intervals(r))
    span = merged[-1][1] - merged[0][0]
    idle_pct = 100 * (span - sum(e - s for s, e in merged)) / span
    assert idle_pct < timeline.IDLE_MIN_PCT
    assert RULES["gpu-idle"](r) == []


def test_cpu_report_reports_time_outside_operators(load) -> None:
    r = load(CPU_RANK)
    findings = RULES["gpu-idle"](r)
    f = only(findings, "time-outside-ops")
    merged = union_sweep([(int(s), int(e)) for s, e in zip(r.kernels["start_ns"], r.kernels["end_ns"])])
    span = merged[-1][1] - merged[0][0]
    assert f.evidence["idle_ns"] == span - sum(e - s for s, e in merged)
    assert "idle_waiting_for_launch_ns" not in f.evidence and "torch.compile" in f.recommendation
    # a compiled run is not told to compile: the advice names the host work around the compiled calls
    compiled = only(RULES["gpu-idle"](r.with_manifest(params={"compile": True})), "time-outside-ops")
    assert compiled.evidence == f.evidence
    assert "torch.compile" not in compiled.recommendation and "guard check" in compiled.recommendation


# ---------------------------------------------------------------------------- short kernels
def test_short_kernels_fire_on_the_a100_training_trace(load) -> None:
    r = load(A100)
    f = only(RULES["short-kernels"](r), "short-kernels")
    durations = r.kernels["duration_ns"].tolist()
    short = [d for d in durations if d < timeline.SHORT_KERNEL_NS]
    assert f.evidence["short_kernels"] == len(short) == 4044 and f.evidence["kernels"] == len(durations)
    assert f.evidence["short_time_ns"] == sum(short)
    assert f.evidence["short_kernels_pct"] == pytest.approx(100 * len(short) / len(durations))
    assert 0 < f.time_at_stake_ns <= len(short) * timeline.LAUNCH_GAP_CAP_NS


def test_short_kernels_advice_states_its_gaps_and_operators(load) -> None:
    """The H200 eager decode: the advice says how much time the gaps in front of the short kernels hold, the share
    of the kind that chose it (dispatch), and the operators that launched most of them, all from the trace."""
    r = load("h200/h200_llama1b_engine_eager.pt.trace.json.gz")
    f = only(RULES["short-kernels"](r), "short-kernels")
    assert f.evidence["gaps_before_short_kind"] == "dispatch"
    from perfscope.format import duration

    head = (f"The gaps in front of them hold {duration(f.evidence['launch_gaps_before_short_ns'])}, "
            f"{f.evidence['gaps_before_short_kind_pct']:.0f}% of it the framework's per-operator dispatch")
    assert f.recommendation.startswith(head)
    k = r.kernels
    short = k[k["duration_ns"] < timeline.SHORT_KERNEL_NS]
    # what the short kernels are: unfused elementwise / norm / copy kernels, named by the operators that launched them
    fusable = short[short["category"].astype("object").isin(timeline.FUSABLE)]
    ops = fusable["op"].dropna().value_counts().head(3).index.tolist()
    assert (f"{len(fusable):,} of the {len(short):,} launches are elementwise, normalisation or copy kernels (most "
            f"from {', '.join(ops)}): fusing them") in f.recommendation
    assert f.evidence["launches_fusable"] == len(fusable) == 2694 and "most launched by" not in f.recommendation
    # and the repeated range they are launched in: the engine's 7 decode steps
    assert f.evidence["repeated_range"] == "decode" and f.evidence["repeats"] == 7
    assert "The trace's 7 'decode' ranges launch about" in f.recommendation


def test_short_operators_of_a_cpu_report_state_their_gaps_and_names(sample_reports_dir) -> None:
    """A CPU engine report: the short operators' advice says what the gaps in front of them are (dispatch, with its
    share) and which operators they are, most first, from the report's own table."""
    from perfscope.api import load as load_report
    from perfscope.format import duration

    r = load_report(str(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope"))
    f = only(RULES["short-kernels"](r), "short-kernels")
    assert f.evidence["gaps_before_short_kind"] == "dispatch"
    k = r.kernels
    names = k.loc[k["duration_ns"] < timeline.SHORT_KERNEL_NS, "name"].value_counts().head(3).index.tolist()
    assert f.recommendation.startswith(f"The gaps in front of them hold {duration(f.time_at_stake_ns)}, "
                                       f"{f.evidence['gaps_before_short_kind_pct']:.0f}% of it per-operator dispatch")
    assert f"(most: {', '.join(names)})" in f.recommendation and "torch.compile" in f.recommendation


def test_short_kernels_silent_on_qwen(load) -> None:
    r = load(QWEN)
    share = (r.kernels["duration_ns"] < timeline.SHORT_KERNEL_NS).mean() * 100
    assert share < timeline.SHORT_KERNEL_MIN_PCT
    assert RULES["short-kernels"](r) == []


# ---------------------------------------------------------------------------- launch overhead
def test_launch_overhead_silent_on_b200_where_launch_calls_do_not_explain_the_idle(load) -> None:
    """Most B200 kernels start right after their launch returns, but the host spends the gaps in its own
    code between launches, not in the launch calls (kernel launches, memsets, device-to-device copies):
    launch-bound is not claimed (issue 29)."""
    r = load(B200)
    gaps = union_sweep(device_intervals(r))
    gaps = [(gaps[i][1], gaps[i + 1][0]) for i in range(len(gaps) - 1) if gaps[i + 1][0] > gaps[i][1]]
    device_copies = set(r.transfers.loc[r.transfers["kind"] == "DtoD", "correlation"])
    calls = union_sweep([(int(s), int(e)) for n, s, e, c in zip(r.api["name"], r.api["start_ns"], r.api["end_ns"],
                                                                r.api["correlation"])
                         if ("Launch" in str(n) or "Memset" in str(n) or c in device_copies) and e > s])
    inside, j = 0, 0
    for gs, ge in gaps:  # plain sweep: launch-call time inside the gaps
        while j < len(calls) and calls[j][1] <= gs:
            j += 1
        k = j
        while k < len(calls) and calls[k][0] < ge:
            inside += min(ge, calls[k][1]) - max(gs, calls[k][0])
            k += 1
    idle = sum(ge - gs for gs, ge in gaps)
    assert inside / idle < timeline.LAUNCH_EXPLAINS_PCT / 100
    assert RULES["launch-overhead"](r) == []
    f = only(RULES["gpu-idle"](r), "gpu-idle")
    assert f.evidence["idle_launch_ns"] == pytest.approx(inside, rel=1e-3)
    assert f.evidence["idle_cause"] == "host" and f.evidence["idle_kind"] == "dispatch"
    assert f.evidence["idle_dispatch_pct"] > 50 and "CUDA graph" in f.recommendation


@pytest.mark.parametrize("name", [QWEN, ONE_KERNEL])
def test_launch_overhead_silent_when_the_queue_is_full_or_too_short(load, name: str) -> None:
    assert RULES["launch-overhead"](load(name)) == []


# ---------------------------------------------------------------------------- streams
def test_serialized_streams_fire_when_event_waits_order_the_streams(load) -> None:
    r = load(EVENT_SYNC)
    f = only(RULES["serialized-streams"](r), "serialized-streams")
    k = r.kernels
    per_stream = {int(s): sum(e - b for b, e in union_sweep(list(zip(g["start_ns"], g["end_ns"]))))
                  for s, g in k.groupby("stream")}
    union = sum(e - s for s, e in union_sweep(list(zip(k["start_ns"], k["end_ns"]))))
    main = max(per_stream, key=per_stream.get)
    assert f.evidence["busiest_stream"] == main and f.evidence["streams"] == len(per_stream) == 3
    assert f.evidence["outside_busiest_stream_ns"] == union - per_stream[main] == f.time_at_stake_ns
    assert f.evidence["overlapped_ns"] == sum(per_stream.values()) - union == 0


def test_collectives_are_left_to_the_exposed_comm_rule(load) -> None:
    r = load(A100)
    assert RULES["serialized-streams"](r) == []
    exposed = only(run_rules(r), "exposed-comm")
    assert any("nccl" in name.lower() for name in exposed.kernels)


def test_serialized_streams_silent_on_a_single_stream(load) -> None:
    r = load(QWEN)
    assert r.kernels["stream"].nunique() == 1
    assert RULES["serialized-streams"](r) == []


# ---------------------------------------------------------------------------- copies
def exposed_by_sweep(r: Report) -> int:
    busy = union_sweep([(int(s), int(e)) for s, e in zip(r.kernels["start_ns"], r.kernels["end_ns"])])
    total = 0
    host = r.transfers[r.transfers["kind"].isin(["HtoD", "DtoH"])]
    for s, e in zip(host["start_ns"], host["end_ns"]):
        covered = sum(max(0, min(e, be) - max(s, bs)) for bs, be in busy)
        total += (e - s) - covered
    return total


@pytest.mark.parametrize("name", [ALEXNET, T4])
def test_copies_exposed_fire_when_no_kernel_runs_beside_them(load, name: str) -> None:
    r = load(name)
    f = only(RULES["copies-exposed"](r), "copies-exposed")
    assert f.evidence["exposed_ns"] == exposed_by_sweep(r) == f.time_at_stake_ns
    host = r.transfers[r.transfers["kind"].isin(["HtoD", "DtoH"])]
    assert f.evidence["copies"] == len(host) and f.evidence["bytes"] == host["bytes"].sum()


def test_unified_memory_migrations_get_the_prefetch_advice(load) -> None:
    f = only(RULES["copies-exposed"](load(T4)), "copies-exposed")
    assert f.evidence["unified_memory_copies"] == 2370 and "cudaMemPrefetchAsync" in f.recommendation


def test_copies_silent_on_qwen(load) -> None:
    r = load(QWEN)
    assert RULES["copies-exposed"](r) == [] and RULES["pageable-copies"](r) == []


def test_pageable_copies_fire_on_alexnet(load) -> None:
    r = load(ALEXNET)
    f = only(RULES["pageable-copies"](r), "pageable-copies")
    t = r.transfers
    pageable = t[t["kind"].isin(["HtoD", "DtoH"]) & (t["pinned"] == False)]
    assert f.evidence["pageable_copies"] == len(pageable) == 16
    assert f.evidence["pageable_time_ns"] == pageable["duration_ns"].sum() == f.time_at_stake_ns
    assert f.evidence["pageable_bytes_per_s"] == pytest.approx(pageable["bytes"].sum() / pageable["duration_ns"].sum() * 1e9)
    assert "pin_memory" in f.recommendation
    # what the trace shows they cost: no kernel beside them, the CPU inside cudaMemcpyAsync for nearly all of it
    calls = r.api[r.api["correlation"].isin(pageable["correlation"])].set_index("correlation")
    held = sum(max(0, min(calls.at[c, "end_ns"], e) - max(calls.at[c, "start_ns"], s))
               for c, s, e in zip(pageable["correlation"], pageable["start_ns"], pageable["end_ns"]))
    assert f.evidence["pageable_time_in_call_ns"] == held and f.evidence["pageable_overlapped_ns"] == 0
    share = held / pageable["duration_ns"].sum()
    assert share > 0.95 and ("kernels ran beside them for 0% of their 55.5 ms, and the CPU sat inside the copy calls "
                             f"for {share:.0%} of the copy time.") in f.recommendation
    # without the runtime calls the trace cannot say whether the CPU waited, and says so
    import dataclasses

    bare = only(RULES["pageable-copies"](dataclasses.replace(r, api=r.api.iloc[:0])), "pageable-copies")
    assert "the trace records none of their calls, so whether the CPU waited on them is unknown" in bare.recommendation
    assert "pageable_time_in_call_ns" not in bare.evidence


def test_exposed_copy_advice_follows_what_the_copies_are(load) -> None:
    """copies-exposed: the larger of uploads and downloads first, each with its share of the exposed time; unified-
    memory migrations get prefetching and nothing about transfer sizes; the nano-vllm trace's KV reads back."""
    from perfscope.analysis.rules.transfers import _copy_advice

    f = only(RULES["copies-exposed"](load("kineto/nanovllm_cpu_kv_attention__forward_10.json.gz")), "copies-exposed")
    down = f.evidence["exposed_DtoH_ns"] / f.evidence["exposed_ns"]
    assert f.recommendation.startswith(f"{down:.0%} of the exposed time is downloads (results the host reads)")
    assert f"{1 - down:.0%} is uploads" in f.recommendation
    base = {"exposed_ns": 100.0, "copies": 10, "copies_on_kernel_streams": 0, "pageable_copies": 0,
            "median_copy_bytes": 1e6}
    um = _copy_advice({**base, "unified_memory_copies": 10, "exposed_HtoD_ns": 100.0, "median_copy_bytes": 4096.0})
    assert "cudaMemPrefetchAsync" in um and "uploads" not in um and "batch them" not in um
    up = _copy_advice({**base, "unified_memory_copies": 0, "exposed_HtoD_ns": 95.0, "exposed_DtoH_ns": 5.0})
    assert up.startswith("95% of the exposed time is uploads") and "downloads" not in up  # 5%: under a tenth


def test_unknown_pinning_is_not_called_pageable(load, fixtures_dir) -> None:
    r = load(T4)
    assert r.transfers["pinned"].isna().all()
    assert RULES["pageable-copies"](r) == []
    # ROCm names the host side of a copy "Host" (HTA's MI250 trace): its pinning is not recorded either
    r = load("kineto/hta_amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    host = r.transfers[r.transfers["kind"].isin(["HtoD", "DtoH"])]
    assert len(host) and (host["src_kind"].eq("Host") | host["dst_kind"].eq("Host")).all()
    assert host["pinned"].isna().all() and RULES["pageable-copies"](r) == []
    # nor their sizes: the raw events carry no bytes, so the bytes are missing, never 0 (they were stored as 0)
    import gzip
    import json

    with gzip.open(fixtures_dir / "kineto/hta_amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz") as fh:
        raw = json.load(fh)
    memcpy = [e for e in raw["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert memcpy and not any("bytes" in e.get("args", {}) for e in memcpy)
    assert len(r.transfers) == len(memcpy) and r.transfers["bytes"].isna().all()


def test_pageable_advice_follows_what_the_copies_are(load) -> None:
    """Uploads get a pinned source (DataLoader, staging buffer), downloads a pinned destination with an event, each
    with its share: the nano-vllm trace's KV-cache reads back (DtoH, 69%) and its small uploads (31%)."""
    f = only(RULES["pageable-copies"](load("kineto/nanovllm_cpu_kv_attention__forward_10.json.gz")), "pageable-copies")
    down = sum(i.time_ns for i in f.items if i.attrs["kind"] == "DtoH") / f.time_at_stake_ns
    assert f"{down:.0%} are downloads (results the host reads)" in f.recommendation
    assert f"{1 - down:.0%} are uploads" in f.recommendation
    assert f.recommendation.index("downloads") < f.recommendation.index("uploads")  # the larger first
    # the same copies outside the steps of a report: set-up, not per step
    from perfscope.analysis.rules._base import Item
    from perfscope.analysis.rules.transfers import _pageable_advice

    items = (Item("copies", "x", 9.5, True, attrs={"kind": "HtoD", "where": "load_weights", "in_steps": "no"}),
             Item("copies", "y", 0.5, True, attrs={"kind": "HtoD", "where": "ProfilerStep#N", "in_steps": "yes"}))
    (setup,) = _pageable_advice(items, 10.0)
    assert setup.startswith("95% run outside the steps in load_weights (set-up") and "5%" not in setup[3:]


# ---------------------------------------------------------------------------- roofline
def test_memory_below_roof_fires_on_qwen_elementwise(load) -> None:
    r = load(QWEN)
    f = only(RULES["memory-below-roof"](r), "memory-below-roof")
    k = r.kernels
    bw = r.device.peak_bandwidth("dram")
    rows = k[(k["bound"] == "memory") & (k["short_name"] == "elementwise_kernel") & k["flops"].notna()
             & k["dram_bytes"].notna()]
    pct = rows["dram_bytes"].sum() / (rows["duration_ns"].sum() * 1e-9) / bw * 100
    assert f.evidence["top1"] == "elementwise_kernel"
    assert f.evidence["top1_pct_of_roof"] == pytest.approx(pct)
    assert f.evidence["top1_time_ns"] == rows["duration_ns"].sum()
    assert "elementwise_kernel" in f.kernels and pct < 50


def test_compute_below_roof_fires_on_measured_ncu_sgemms(load) -> None:
    r = load("ncu/esmm_a10g_roofline_set.ncu-rep")
    f = only(RULES["compute-below-roof"](r), "compute-below-roof")
    peak = r.device.compute["fp32"].value
    k = r.kernels
    pct = {name: 100 * fl / (d * 1e-9) / peak for name, fl, d in zip(k["short_name"], k["flops"], k["duration_ns"])}
    # ncu measured the 1D-blocktiling kernel's LSU pipe at 65% (compute); the three others reach no unit's 60%:
    # latency-bound, in their own finding, not below the compute roof
    assert f.evidence["kernel_groups_below"] == 1 and f.evidence["top1"] == "one_blocktiling"
    assert f.evidence["top1_pct_of_roof"] == pytest.approx(pct[f.evidence["top1"]])
    lost = sum(d * (1 - pct[n] / 100) for n, d in zip(k["short_name"], k["duration_ns"]) if n == "one_blocktiling")
    assert f.time_at_stake_ns == pytest.approx(lost)
    assert "LSU" in f.recommendation and [i.attrs["limiter"] for i in f.items] == ["lsu"]
    latency = only(RULES["latency-bound"](r), "latency-bound")
    assert set(latency.kernels) == {"two_blocktiling", "vectorized_blocktiling", "warptiling"}


def test_compute_below_roof_silent_when_the_gemm_is_near_its_roof(load) -> None:
    r = load(QWEN)
    gemm = r.kernels[r.kernels["bound"] == "compute"]
    assert (gemm["flops"].sum() / (gemm["duration_ns"].sum() * 1e-9) / r.device.compute["bf16"].value) > 0.5
    assert RULES["compute-below-roof"](r) == []


def test_no_flops_gives_one_info_finding(load) -> None:
    r = load(H100_NSYS)
    findings = run_rules(r, rules=["memory-below-roof", "compute-below-roof", "fp32-matmul"])
    assert [(f.id, f.severity) for f in findings] == [("roofline-unchecked", "info")]
    assert math.isnan(findings[0].time_at_stake_ns) and "Nsight Compute" in findings[0].recommendation


def test_fp32_sgemm_on_a_tensor_core_v100(load) -> None:
    r = load(V100)
    f = only(RULES["fp32-matmul"](r), "fp32-matmul")
    k = r.kernels
    sgemm = k[k["category"].isin(["gemm", "attention"]) & k["name"].str.contains("sgemm")]
    assert f.evidence["fp32_matmul_time_ns"] == sgemm["duration_ns"].sum()
    assert f.evidence["target_precision"] == "fp16" and f.evidence["roof_ratio"] == pytest.approx(125 / 15.7)
    # No FLOPs in this trace: the stake is the bound of kernels limited by the FP32 pipe, 1 - 1/speedup of
    # their time, and the title says it is a bound
    assert f.evidence["kernels_without_flops"] == len(sgemm)
    bound = sgemm["duration_ns"].sum() * (1 - 15.7 / 125)
    assert f.time_at_stake_ns == pytest.approx(bound) and f.evidence["at_stake_bound_ns"] == pytest.approx(bound)
    assert "upper bound" in f.title and "no FLOPs recorded" in f.title
    assert "float16" in f.recommendation
    # ranked by that stake: ahead of the short-kernel finding's 1.4 ms
    ids = [x.id for x in run_rules(r) if math.isfinite(x.time_at_stake_ns)]
    assert ids.index("fp32-matmul") < ids.index("short-kernels")


def test_fp32_mfma_and_a_matmul_ops_elementwise_kernel_are_not_fp32_matmuls_off_the_matrix_cores(load) -> None:
    """HTA's MI250 trace (now with roofs: an MI250 GCD and an MI210 agree): its two FP32 Tensile GEMMs name their
    MatrixInstruction (``MI16x16x1``: ``v_mfma_f32_16x16x1f32``), so they run on the matrix cores, and the third
    FP32 "gemm" was ``aten::addmm``'s bias broadcast, an ``elementwise_kernel`` (now set aside: a copy). None is an FP32 matmul off the
    matrix cores (the rule said "3 matmul kernels run in FP32 off the matrix cores, fp16 roof 8x" for them)."""
    from perfscope.analysis.rules.kernels import fp32_matmuls

    r = load("kineto/hta_amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    k = r.kernels
    fp32_gemm = k[(k["category"] == "gemm") & (k["precision"] == "fp32")]
    names = sorted(fp32_gemm["name"].str[:20])
    assert names == ["Cijk_Ailk_Bjlk_SB_Bi", "Cijk_Alik_Bljk_SB_Bi"]
    assert fp32_gemm["name"].str.contains(r"_MI16x16x1_").sum() == 2 and r.device.peak_flops("fp16")
    # addmm's bias copy is set aside by the import (docs/costs.md): its own category, none of the op's FLOPs
    bias = k[(k["op"] == "aten::addmm") & k["name"].str.startswith("void at::native::elementwise_kernel")]
    assert len(bias) == 1 and bias["category"].tolist() == ["memory"] and bias["flops"].isna().all()
    # a table that still files it as an FP32 GEMM (a report saved before) does not make it an FP32 matmul either
    saved = pd.concat([fp32_gemm, bias.assign(category="gemm", precision="fp32")])
    assert len(fp32_matmuls(saved)) == 0 and len(fp32_matmuls(k)) == 0 and RULES["fp32-matmul"](r) == []
    # so no other finding sends the reader to it: the roof finding's evidence says where the GEMMs ran
    (below,) = RULES["memory-below-roof"](r)
    assert "fp32-matmul finding" not in below.recommendation
    gemms = [i for i in below.items if "_MI16x16x1_" in str(i.attrs.get("group"))]
    assert len(gemms) == 2 and all("FP32 matmul on the tensor cores (TF32 / MFMA, by its name)" in i.label
                                   for i in gemms)
    # the same names on the vector units (a ThreadTile, no MatrixInstruction) and a real GEMM kernel stay in
    vector = fp32_gemm.assign(name=fp32_gemm["name"].str.replace(r"_MI16x16x1_", "_TT4_4_", regex=True))
    assert len(fp32_matmuls(vector)) == 2



def test_fp32_mfma_kernels_keep_the_fp32_roof_on_a_device_with_a_tf32_roof(fixtures_dir) -> None:
    """FP32 MFMA runs at the FP32 matrix rate, not TF32's: classified against an MI300X (which has a TF32 roof),
    the MI250 trace's two MFMA GEMMs stay fp32, where a kernel named for TF32 would move to the TF32 roof."""
    from perfscope.analysis.readers.detect import import_file
    from perfscope.analysis.rules.kernels import effective_kernels
    from perfscope.datasheets import pick_datasheet, sheet_spec

    spec = sheet_spec(pick_datasheet("MI300X")[0])
    assert spec.peak_flops("tf32")
    r = import_file(fixtures_dir / "kineto/hta_amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz", device=spec)
    k = effective_kernels(r)
    mfma = k["name"].str.contains("_MI16x16x1_")
    assert mfma.sum() == 2 and (k.loc[mfma, "precision"] == "fp32").all()
    renamed = r.replace(kernels=r.kernels.assign(name=r.kernels["name"].str.replace("_MI16x16x1_", "_tf32_")))
    assert (effective_kernels(renamed).loc[mfma.to_numpy(), "precision"] == "tf32").all()


def test_fp32_matmul_silent_on_a_bf16_model(load) -> None:
    assert RULES["fp32-matmul"](load(QWEN)) == []


# ---------------------------------------------------------------------------- measured vs analytic
def ncu_sgemms_with_analytic(load, fma_flops: int) -> Report:
    """The ncu CSV's measured SGEMMs next to the analytic count of a 1024^3 SGEMM (the ESMM benchmark's
    size: the naive kernel's 32x32 grid of 32x32 blocks covers a 1024x1024 output)."""
    r = load("ncu/esmm_a10g_roofline_metrics.csv")
    assert r.kernels.loc[r.kernels["short_name"] == "basic", "grid"].iloc[0] == "(32, 32, 1)"
    return r.replace(kernels=r.kernels.assign(flops_analytic=float(fma_flops) * 1024**3))


def test_flops_agree_with_the_2mnk_formula(load) -> None:
    r = ncu_sgemms_with_analytic(load, 2)
    ratios = r.kernels["flops"] / r.kernels["flops_analytic"]
    assert ratios.between(0.99, 1.03).all()
    assert RULES["flops-mismatch"](r) == []


def test_flops_mismatch_fires_on_a_convention_error(load) -> None:
    r = ncu_sgemms_with_analytic(load, 1)  # counting an FMA as one FLOP
    f = only(RULES["flops-mismatch"](r), "flops-mismatch")
    ratios = r.kernels["flops"] / r.kernels["flops_analytic"]
    assert f.evidence["kernels_disagreeing"] == len(r.kernels) == 9
    assert f.evidence["median_measured_over_analytic"] == pytest.approx(ratios.median())
    assert math.isnan(f.time_at_stake_ns) and "2x" in f.recommendation


# ---------------------------------------------------------------------------- occupancy
def test_low_occupancy_from_ncu(load) -> None:
    r = load("ncu/esmm_a10g_sol_partial.ncu-rep")
    f = only(RULES["occupancy-stalls"](r), "occupancy-stalls")
    row = r.kernels[r.kernels["short_name"] == "two_blocktiling"].iloc[0]
    assert f.kernels == ("two_blocktiling",)
    assert f.evidence["achieved_occupancy_pct"] == pytest.approx(row["achieved_occupancy_pct"])
    assert f.evidence["theoretical_occupancy_pct"] == pytest.approx(row["theoretical_occupancy_pct"])
    assert f.evidence["registers_per_thread"] == row["registers_per_thread"] == 150
    assert "registers" in f.recommendation


@pytest.mark.parametrize("name", ["ncu/esmm_a10g_all_metrics.ncu-rep", QWEN])
def test_occupancy_silent_without_achieved_occupancy(load, name: str) -> None:
    assert RULES["occupancy-stalls"](load(name)) == []


# ---------------------------------------------------------------------------- engine-only rules
@pytest.mark.parametrize("rule", ["decode-mbu", "prefill-mfu", "kv-cache-share"])
def test_llm_rules_are_silent_on_traces_without_engine_steps(load, rule: str) -> None:
    assert RULES[rule](load(QWEN)) == []


# ---------------------------------------------------------------------------- the engine
def test_run_rules_ranks_by_time_at_stake_then_unknowns_by_severity(load) -> None:
    findings = run_rules(load(V100))
    stakes = [f.time_at_stake_ns for f in findings]
    known = [s for s in stakes if not math.isnan(s)]
    assert known == sorted(known, reverse=True)
    first_nan = next(i for i, s in enumerate(stakes) if math.isnan(s))
    assert all(math.isnan(s) for s in stakes[first_nan:])
    order = ["high", "medium", "low", "info"]
    tail = [order.index(f.severity) for f in findings[first_nan:]]
    assert tail == sorted(tail)


def test_a_crashing_rule_becomes_one_info_finding(load, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(report: Report) -> list[Finding]:
        raise KeyError("no_such_column")

    monkeypatch.setitem(RULES, "broken", broken)
    monkeypatch.delenv("PERFSCOPE_DEBUG", raising=False)
    findings = run_rules(load(B200), rules=["broken", "gpu-idle"])
    assert [f.id for f in findings] == ["gpu-idle", "rule-error"]
    assert findings[1].evidence == {"rule": "broken", "error": "KeyError: 'no_such_column'"}
    monkeypatch.setenv("PERFSCOPE_DEBUG", "1")
    with pytest.raises(KeyError):
        run_rules(load(B200), rules=["broken"])


def test_run_rules_subset_and_unknown_rule(load) -> None:
    r = load(B200)
    assert {f.id for f in run_rules(r, rules=["gpu-idle"])} == {"gpu-idle"}
    with pytest.raises(UsageError, match="no-such-rule"):
        run_rules(r, rules=["no-such-rule"])


@pytest.mark.parametrize("name", [A100, B200, QWEN, ALEXNET, CPU_RANK, V100, T4, H100_NSYS, ONE_KERNEL,
                                  "kineto/hta_cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz",
                                  "kineto/tracelens_mi210__gpu_only_trace__gpu_only_trace.json.gz",
                                  "ncu/esmm_a10g_sol_partial.ncu-rep"])
def test_every_rule_degrades_and_serialises(load, name: str) -> None:
    findings = run_rules(load(name))
    assert not [f.title for f in findings if f.id == "rule-error"]
    for f in findings:
        d = json.loads(json.dumps(f.to_dict(), allow_nan=False))
        assert d["id"] == f.id and d["severity"] in ("high", "medium", "low", "info")
        assert f.title and f.recommendation
        assert all(isinstance(v, (int, float, str)) or v is None for v in d["evidence"].values())


def test_fp32_matmul_on_a_cpu_speaks_of_the_cpu_not_tensor_cores(sample_reports_dir) -> None:
    """The committed CPU engine report: this CPU measured bf16 matmuls faster than fp32, so the FP32
    finding points at bf16, in CPU terms (no CUDA autocast, no tensor cores)."""
    from perfscope.report import Report

    r = Report.load(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope")
    found = RULES["fp32-matmul"](r)
    if r.device.compute["bf16"].value <= r.device.compute["fp32"].value:
        assert found == []
        return
    f = only(found, "fp32-matmul")
    assert "CPU" in f.title and "tensor cores" not in f.title + f.recommendation
    assert "autocast('cpu'" in f.recommendation or "model.to(torch.bfloat16)" in f.recommendation


# ---------------------------------------------------------------------------- roof-exceeded
def _gemm_report(achieved_flops_per_s: float, roof_flops_per_s: float) -> Report:
    """Ten fp32 GEMMs of 2*512^3 FLOPs at a given speed, classified against an fp32 roof."""
    import pandas as pd

    from perfscope.analysis.readers.finish import Imported, finish
    from perfscope.device import DeviceSpec, Roof

    flops = 2.0 * 512**3
    dur = int(flops / achieved_flops_per_s * 1e9)
    n = 10
    kernels = pd.DataFrame({
        "name": ["aten::mm"] * n, "short_name": ["aten::mm"] * n, "device": ["cpu"] * n,
        "start_ns": [i * 2 * dur for i in range(n)], "end_ns": [i * 2 * dur + dur for i in range(n)],
        "duration_ns": [dur] * n, "category": ["gemm"] * n, "dtype": ["float32"] * n,
        "flops": [flops] * n, "dram_bytes": [3 * 512 * 512 * 4.0] * n,
    })
    device = DeviceSpec("test cpu", "cpu", compute={"fp32": Roof(roof_flops_per_s, "measured", "torch.mm, busy machine")},
                        memory={"dram": Roof(10e9, "measured", "sum")}, properties={"measured_at": "2026-11-30T17:59:00"})
    return finish(Imported({"kernels": kernels}, {"name": "gemms"}, device))


def test_roof_exceeded_says_the_roof_is_too_low() -> None:
    """The README run on a fresh machine showed a linear at 223% of a CPU roof measured while the
    machine was busy: a kernel above its compute roof means the roof is wrong."""
    report = _gemm_report(achieved_flops_per_s=81e9, roof_flops_per_s=36.3e9)
    assert (report.kernels["bound"] == "compute").all()
    f = only(run_rules(report), "roof-exceeded")
    assert f.severity == "medium" and f.kernels == ("aten::mm",)
    assert f.evidence["worst_pct_of_roof"] == pytest.approx(81e9 / 36.3e9 * 100, rel=1e-3)
    assert f.evidence["roofs_measured_at"] == "2026-11-30T17:59:00"
    assert "perfscope devices --refresh" in f.recommendation


def test_roof_exceeded_silent_at_or_below_the_roof() -> None:
    report = _gemm_report(achieved_flops_per_s=36e9, roof_flops_per_s=36.3e9)
    assert not [f for f in run_rules(report) if f.id == "roof-exceeded"]


def test_an_idle_gap_no_record_names_is_not_given_a_host_work_recipe(load) -> None:
    """The event-sync trace idles 18.5 ms between two CUDA calls with no operator, range or Python function recorded
    on the host (its raw events: a cudaEventRecord, then nothing until the next one): the finding says the trace does
    not show it and how to record it; its evidence counts it unexplained."""
    r = load(EVENT_SYNC)
    (f,) = RULES["gpu-idle"](r)
    unexplained = sum(i.time_ns for i in f.items if not i.explains)
    assert unexplained > 0.95 * f.time_at_stake_ns
    assert "For 97% of the idle time the host was in no recorded operator, range, Python function or CUDA call" in \
        f.recommendation
    assert "Move or overlap this host work" not in f.recommendation and "with_stack=True" in f.recommendation
