"""The module -> op -> kernel hierarchy checked op by op against TraceLens (issue #23), on the two
TraceLens fixtures: SGLang Qwen3-8B decode and vLLM GPT-OSS decode, both MI300X, both one
CUDA-graph replay with the engine's capture trace beside the main trace.

TraceLens's ``ops_summary.csv`` describes the main trace with its capture merged in
(``trace_capture_merge``): the capture's events inside the stream capture hang below the
replay's ``hipGraphLaunch`` and each replayed kernel below its captured launch. A row is
(``name``, ``parent_module``): the kernel launcher (the innermost ``cpu_op`` above the launch, or
the launch call itself when there is none), the class of the innermost ``nn.Module`` above it
(``_N`` dropped), ``Count`` launchers and ``total_direct_kernel_time_sum`` (us): the busy time of
their own kernels, memcpys included. ``ops_unique_args.csv`` splits the rows by input shapes,
with ``num_kernels`` per launcher and the full ``call_stack`` of its first launcher.

perfscope reads the same files (``read_kineto`` joins the ``capture_traces/`` beside the trace);
its op nodes carry the op (``name``) and the class of the innermost module above (``module``).
"""

from __future__ import annotations

import ast
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.summaries.hierarchy import NO_OP, Hierarchy, hierarchy
from perfscope.report import Report

FIXTURES = {
    "sglang": ("thirdparty/tracelens_sglang_decode", "sglang_Qwen3-8B_decode.json.gz", 544),
    "vllm": ("thirdparty/tracelens_vllm_decode_full", "graph_execution.json.gz", 421),
}
"""name -> (folder, main trace, kernels of its one graph replay, joined to the capture trace)."""

NO_OP_ROWS = {"hipLaunchKernel", "hipModuleLaunchKernel"}
"""SGLang rows perfscope has as ``(no op)``: launches under no op, which TraceLens names by the
launch call."""


def tracelens_name(op: str) -> str:
    """TraceLens's name of an op: ``sglang_profiler::<module>_<fn>_<n>`` (SGLang's shape profiler
    numbers the custom ops it registers) without ``_<n>`` (TraceLens's
    ``normalize_sglang_profiler_op_names``); others unchanged."""
    return re.sub(r"_\d+$", "", op) if op.startswith("sglang_profiler::") else op


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def case(request: pytest.FixtureRequest, fixtures_dir: Path) -> dict:
    folder, main, replayed = FIXTURES[request.param]
    base = fixtures_dir / folder
    report = read_kineto(base / main)
    summary = pd.read_csv(base / "perf_csvs" / "ops_summary.csv")
    summary["module"] = summary["parent_module"].str.removeprefix("nn.Module: ")
    unique = pd.read_csv(base / "perf_csvs" / "ops_unique_args.csv")
    unique["module"] = unique["parent_module"].str.removeprefix("nn.Module: ")
    with gzip.open(base / main) as f:
        last_us = max(float(e.get("ts", 0)) + float(e.get("dur", 0)) for e in json.load(f)["traceEvents"]
                      if e.get("cat") in ("kernel", "gpu_memcpy"))
    return {"name": request.param, "report": report, "summary": summary, "unique": unique,
            "gemm": pd.read_csv(base / "perf_csvs" / "GEMM.csv"), "replayed": replayed, "last_us": last_us,
            "by_category": pd.read_csv(base / "perf_csvs" / "ops_summary_by_category.csv").assign(
                module=lambda d: d["parent_module"].str.removeprefix("nn.Module: "))}


def ours(tree: Hierarchy) -> pd.DataFrame:
    """The op nodes summed per (TraceLens name, module class): kernels and kernel time (us)."""
    ops = tree.nodes[tree.nodes["level"] == "op"]
    key = pd.DataFrame({"name": ops["name"].map(tracelens_name), "module": ops["module"].fillna("")})
    out = ops.groupby([key["name"], key["module"]])[["calls", "time_ns"]].sum()
    return out.assign(us=out["time_ns"] / 1e3)


def kernels_per_row(unique: pd.DataFrame) -> pd.Series:
    """TraceLens's kernels (and memcpys) per (name, module): launchers x kernels per launcher."""
    key = [unique["name"], unique["module"].fillna("")]
    return (unique["num_kernels"] * unique["operation_count"]).groupby(key).sum()


def tolerance_us(kernels: int, value_us: float, last_us: float) -> float:
    """How far TraceLens's sum may be from the exact one: it measures each kernel as
    (ts + dur) - ts in float64 us at the trace's absolute timestamps (~5e12 us, where one ulp is
    ~1 ns: half an ulp per kernel), and writes float32 sums."""
    return kernels * 0.5 * float(np.spacing(last_us)) + abs(value_us) * 2.0 ** -23


def test_replays_take_the_modules_of_their_captured_launches(case: dict) -> None:
    k = case["report"].kernels
    captured = k["capture_module"].notna()
    assert int(captured.sum()) == case["replayed"]  # every replayed kernel was inside a module of the capture
    top = {p.split("/")[0] for p in k.loc[captured, "capture_module"]}
    assert top == ({"Qwen3Model_0", "LogitsProcessor_0"} if case["name"] == "sglang" else {"GptOssForCausalLM_0"})


def test_every_gemm_row_has_its_parent_module_calls_and_time(case: dict) -> None:
    summary, unique = case["summary"], case["unique"]
    gemm = summary[summary["Categories"].map(ast.literal_eval).map(lambda c: "GEMM" in c)]
    assert set(gemm["name"]) == ({"aten::mm"} if case["name"] == "sglang" else {"aten::mm", "aten::addmm"})
    # GEMM.csv's other names are the wrappers around these (aiter::gemm_a16w16,
    # vllm::rocm_unquantized_gemm): they launch no kernel themselves, so they have no row
    wrappers = set(case["gemm"]["name"]) - set(gemm["name"])
    assert wrappers and not wrappers & set(summary["name"])
    ops = ours(hierarchy(case["report"]))
    for row in gemm.itertuples():
        launchers = unique[(unique["name"] == row.name) & (unique["module"] == row.module)]
        assert set(launchers["num_kernels"]) == {1}  # one kernel per call: kernels are calls
        got = ops.loc[(row.name, row.module)]
        assert int(got["calls"]) == row.Count, (row.name, row.module)
        assert got["us"] == pytest.approx(row.total_direct_kernel_time_sum,
                                          abs=tolerance_us(row.Count, row.total_direct_kernel_time_sum,
                                                           case["last_us"])), (row.name, row.module)
    assert len(gemm) == (4 if case["name"] == "sglang" else 2)
    # ops_summary_by_category's GEMM rows: the same, summed per parent module
    by_cat = case["by_category"]
    assert (by_cat["op category"] == "GEMM").sum() == len(gemm)  # one GEMM op name per module here
    for row in by_cat[by_cat["op category"] == "GEMM"].itertuples():
        names = set(gemm.loc[gemm["module"] == row.module, "name"])
        got = ops.loc[[(n, row.module) for n in names]]
        assert int(got["calls"].sum()) == row.Count
        assert got["us"].sum() == pytest.approx(row.total_direct_kernel_time_ms * 1e3,
                                                abs=tolerance_us(row.Count, got["us"].sum(), case["last_us"]))


def test_every_ops_summary_row_matches_but_memcpys_and_op_less_launches(case: dict) -> None:
    """All rows, op and parent module as TraceLens has them; two known differences, checked
    exactly: memcpys (TraceLens's kernels, perfscope's ``transfers``: all are aten::copy_ outside
    any module here) and SGLang's op-less launches (:data:`NO_OP_ROWS`)."""
    report, summary = case["report"], case["summary"]
    ops = ours(hierarchy(report))
    kernels = kernels_per_row(case["unique"])
    summary = summary.assign(key=list(zip(summary["name"], summary["module"].fillna(""))))
    copies = report.transfers
    exact = 0
    for row in summary.itertuples():
        want_k, want_us = int(kernels[row.key]), row.total_direct_kernel_time_sum
        if row.name in NO_OP_ROWS or row.key == ("aten::copy_", ""):
            continue
        got = ops.loc[row.key]
        assert int(got["calls"]) == want_k, row.key
        assert got["us"] == pytest.approx(want_us, abs=tolerance_us(want_k, want_us, case["last_us"])), row.key
        exact += 1
    # memcpys: the kernels of aten::copy_ outside modules plus every transfer of the trace
    copy_row = summary[summary["key"] == ("aten::copy_", "")].iloc[0]
    copy_k, copy_us = int(kernels[("aten::copy_", "")]), copy_row.total_direct_kernel_time_sum
    got = ops.loc[("aten::copy_", "")]
    assert len(copies) and set(copies["kind"]) <= {"DtoD", "DtoH", "HtoD"}
    assert int(got["calls"]) + len(copies) == copy_k
    assert got["us"] + copies["duration_ns"].sum() / 1e3 == pytest.approx(
        copy_us, abs=tolerance_us(copy_k, copy_us, case["last_us"]))
    # op-less launches: perfscope's (no op) outside modules holds exactly TraceLens's two rows
    no_op = summary[summary["name"].isin(NO_OP_ROWS)]
    if case["name"] == "sglang":
        assert set(no_op["name"]) == NO_OP_ROWS and no_op["module"].isna().all()
        n = int(sum(kernels[key] for key in no_op["key"]))
        got = ops.loc[(NO_OP, "")]
        assert int(got["calls"]) == n == 3
        assert got["us"] == pytest.approx(no_op["total_direct_kernel_time_sum"].sum(),
                                          abs=tolerance_us(n, got["us"], case["last_us"]))
    else:
        assert no_op.empty and NO_OP not in ops.index.get_level_values(0)
    # nothing of ours is left over
    theirs = set(summary["key"]) - set(no_op["key"])
    assert set(ops.index) - {(NO_OP, "")} == theirs
    assert exact == len(summary) - len(no_op) - 1 == (18 if case["name"] == "sglang" else 15)
    if case["name"] == "sglang":  # an op without a cost formula still names its kernels, cost missing
        assert ops.loc[("aten::_foreach_copy_", ""), "calls"] == 2
        foreach = report.kernels[report.kernels["op"] == "aten::_foreach_copy_"]
        assert len(foreach) == 2 and foreach["flops"].isna().all() and foreach["flops_source"].isna().all()
        assert any("aten::_foreach_copy_ (2 rows" in w for w in report.warnings)


def test_each_call_stack_is_an_op_path_of_the_expanded_tree(case: dict) -> None:
    """Every ops_unique_args row's ``call_stack`` (its first launcher's module instances,
    innermost first), e.g. vLLM's attention inside GraphModule_0 inside GraphModule_0, is the path
    of one of our op nodes."""
    nodes = hierarchy(case["report"], collapse=False).nodes
    ops = nodes[nodes["level"] == "op"]
    paths = set(ops["path"].str.rsplit(" / ", n=1).str[0].where(ops["depth"] > 0, "") + " | "
                + ops["name"].map(tracelens_name))
    for stack in case["unique"]["call_stack"]:
        frames = ast.literal_eval(stack)
        mods = [f.removeprefix("nn.Module: ") for f in reversed(frames[1:])]
        op = NO_OP if frames[0] in NO_OP_ROWS else frames[0]
        assert " / ".join(mods) + " | " + op in paths, frames
    if case["name"] == "vllm":
        attention = ops[ops["name"] == "vllm::unified_attention_with_output"]
        assert set(attention["path"]) == {"GptOssForCausalLM_0 / GraphModule_0 / GraphModule_0 / "
                                          "vllm::unified_attention_with_output"}


@pytest.mark.parametrize("collapse", [True, False])
def test_each_module_time_is_the_sum_over_its_kernels(case: dict, collapse: bool) -> None:
    report: Report = case["report"]
    k = report.kernels
    tree = hierarchy(report, collapse=collapse)
    modules = tree.nodes[tree.nodes["level"] == "module"]
    # SGLang: the 508 nn.Module calls of the capture and the main trace's Sampler_0, each around
    # kernels; vLLM: its 24 inner GraphModule_0 calls share one path
    assert len(modules) == {("sglang", True): 17, ("sglang", False): 509}.get((case["name"], collapse), 4)
    for row in modules.itertuples():
        mask = tree.kernel_mask(int(row.node), len(k))
        assert int(mask.sum()) == row.calls
        assert row.time_ns == float(k.loc[mask, "duration_ns"].sum()), row.path
    assert tree.nodes.loc[tree.nodes["depth"] == 0, "time_ns"].sum() == float(k["duration_ns"].sum())


def test_a_module_around_the_whole_capture_is_not_part_of_the_graph(fixtures_dir: Path, tmp_path: Path) -> None:
    """SGLang's capture with its Qwen3Model_0 call stretched to start before the capture range
    (as a model whose forward captures its own graph): that call runs around the graph launch
    at a replay, not inside the graph, so the replayed kernels' modules start one level down."""
    folder, main, replayed = FIXTURES["sglang"]
    src = fixtures_dir / folder / "capture_traces" / "bs_32_rank0.json.gz"
    with gzip.open(src) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    (capture,) = [e for e in events if e.get("name") == "capture_32_DECODE" and e["dur"] > 1000]
    (model,) = [e for e in events if e.get("name") == "nn.Module: Qwen3Model_0"]
    end = model["ts"] + model["dur"]
    model["ts"] = capture["ts"] - 10.0
    model["dur"] = end - model["ts"]
    out = tmp_path / "capture_traces"
    out.mkdir()
    with gzip.open(out / src.name, "wt") as f:
        json.dump(trace, f)
    (out / "execution_details.json").write_text(json.dumps([{"file": src.name, "batch_size": 32, "mode": "FULL"}]))
    k = read_kineto(fixtures_dir / folder / main, capture=out).kernels
    captured = k["capture_module"].dropna()
    assert len(captured) == replayed  # every launch is in a module below Qwen3Model_0 too
    assert {p.split("/")[0] for p in captured} == {f"Qwen3DecoderLayer_{i}" for i in range(36)} | {
        "VocabParallelEmbedding_0", "RMSNorm_144", "LogitsProcessor_0"}


def test_replayed_modules_go_below_the_modules_around_the_graph_launch(fixtures_dir: Path, tmp_path: Path) -> None:
    """vLLM's main trace with the python call around its graph launch (``cuda_graph.py:
    __call__``, vLLM's CUDAGraphWrapper) renamed into a module call: the replayed kernels sit
    below it, then below their captured modules (TraceLens's merge hangs the capture below the
    graph launch, so its call stacks run on through the launch's own ancestors)."""
    folder, main, replayed = FIXTURES["vllm"]
    with gzip.open(fixtures_dir / folder / main) as f:
        trace = json.load(f)
    (wrapper,) = [e for e in trace["traceEvents"] if e.get("cat") == "python_function"
                  and str(e.get("name", "")).startswith("vllm/compilation/cuda_graph.py(208): __call__")]
    wrapper["name"] = "nn.Module: CUDAGraphWrapper_0"
    with gzip.open(tmp_path / main, "wt") as f:
        json.dump(trace, f)
    report = read_kineto(tmp_path / main, capture=fixtures_dir / folder / "capture_traces")
    nodes = hierarchy(report, collapse=False).nodes
    top = nodes[nodes["depth"] == 0]
    wrapped = top[top["name"] == "CUDAGraphWrapper_0"].iloc[0]
    assert wrapped["calls"] == replayed
    gemm = nodes[(nodes["name"] == "aten::addmm")]
    assert set(gemm["path"]) == {"CUDAGraphWrapper_0 / GptOssForCausalLM_0 / GraphModule_0 / aten::addmm"}
    assert set(gemm["module"]) == {"GraphModule"} and gemm["calls"].sum() == 72
