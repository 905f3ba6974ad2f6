"""CUDA-graph replays joined to the engine's capture traces (``perfscope import --capture``).

Real MI300X traces: a vLLM FULL-graph decode step (GPT-OSS) and an SGLang decode step
(Qwen3-8B), each with the ``capture_traces/`` folder the engine wrote. The truth is read from
the raw JSON here (the captured launch calls in ``capture_<bs>_<mode>``, their ops by External
id), from TraceLens's ``ops_unique_args.csv`` (which kernels each op owns, joined the same way)
and its ``GEMM.csv`` (FLOPs). The tests check the join, not final costed percentages: those
move with the cost model.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.costs.framework import OpContext, step_attention
from perfscope.analysis.costs.operators import needs_step, op_cost
from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.readers.kineto.capture import read_captures, step_batch
from perfscope.analysis.readers.kineto.parse import CPU_KINDS, parse_trace
from perfscope.errors import InputFormatError, UsageError

VLLM = "thirdparty/tracelens_vllm_decode_full"
SGLANG = "thirdparty/tracelens_sglang_decode"
TRACES = {VLLM: "graph_execution.json.gz", SGLANG: "sglang_Qwen3-8B_decode.json.gz"}
CAPTURES = {VLLM: "graph_capture_rank_0.1773709742341309550.pt.trace.json.gz", SGLANG: "bs_32_rank0.json.gz"}
REPLAYED = {VLLM: 421, SGLANG: 544}
"""Kernels of the one hipGraphLaunch in each trace (counted in the raw JSON by the tests below)."""

_CACHE: dict[Any, Any] = {}


def _events(path: Path) -> list[dict[str, Any]]:
    if path not in _CACHE:
        with gzip.open(path) as fh:
            _CACHE[path] = json.loads(fh.read())["traceEvents"]
    return _CACHE[path]


def _report(path: Path, capture: Path | None = None) -> Any:
    key = ("report", path, capture)
    if key not in _CACHE:
        _CACHE[key] = import_file(path, capture=capture)
    return _CACHE[key]


def _captured_launches(path: Path) -> list[dict[str, Any]]:
    """The launch calls inside the capture range whose kernel did not run, in launch order."""
    ev = _events(path)
    (rng,) = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("capture_")]
    ran = {e["args"].get("correlation") for e in ev if e.get("cat") == "kernel"}
    out = [e for e in ev if e.get("cat") == "cuda_runtime" and "kernel" in e.get("args", {})
           and rng["ts"] <= e["ts"] <= rng["ts"] + rng["dur"] and e["args"]["correlation"] not in ran]
    return sorted(out, key=lambda e: e["ts"])


def _replayed(report: Any) -> pd.DataFrame:
    """The report's kernels launched by the trace's graph launch, in time order."""
    api = report.api
    (corr,) = api.loc[api["name"].str.contains("GraphLaunch"), "correlation"].tolist()
    k = report.kernels
    return k[k["correlation"] == corr].sort_values("start_ns")


@pytest.fixture(params=[VLLM, SGLANG], ids=["vllm", "sglang"])
def case(request: pytest.FixtureRequest, fixtures_dir: Path) -> tuple[str, Path]:
    return request.param, fixtures_dir / request.param


# ---------------------------------------------------------------------------- the join
def test_the_reader_keeps_the_kernel_a_launch_call_names(case: tuple[str, Path]) -> None:
    name, folder = case
    path = folder / "capture_traces" / CAPTURES[name]
    trace = parse_trace(path)
    api = trace.cpu["kind"] == CPU_KINDS.index("api")
    raw = [e for e in _events(path) if e.get("cat") == "cuda_runtime" and "kernel" in e.get("args", {})]
    assert int((trace.cpu["kernel"][api] >= 0).sum()) == len(raw)
    assert (trace.cpu["kernel"][~api] == -1).all()


def test_replays_take_the_op_and_shapes_of_their_captured_launch(case: tuple[str, Path]) -> None:
    name, folder = case
    launches = _captured_launches(folder / "capture_traces" / CAPTURES[name])
    ops = {e["args"]["External id"]: e for e in _events(folder / "capture_traces" / CAPTURES[name])
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    k = _replayed(_report(folder / TRACES[name]))
    assert len(k) == len(launches) == REPLAYED[name]
    assert k["name"].tolist() == [e["args"]["kernel"] for e in launches]  # the graph's kernel sequence
    assert k["op"].notna().all()  # every replayed kernel joined
    launcher = [ops[e["args"]["External id"]] for e in launches]
    same = np.array([op == lop["name"] for op, lop in zip(k["op"], launcher)])
    # the op is the launching op, or the enclosing op the cost model prices (a composite's child)
    assert same.mean() > 0.9
    for shapes, lop in zip(k["op_shapes"][same], np.array(launcher, dtype=object)[same]):
        dims = lop["args"].get("Input Dims")
        assert (json.loads(shapes) if shapes is not None else None) == dims


def test_replay_costs_are_the_captured_ops_costs(case: tuple[str, Path]) -> None:
    name, folder = case
    (graph,) = read_captures(folder / "capture_traces", found="--capture").graphs
    assert (graph.batch, graph.mode, len(graph.names)) == (32, "FULL", REPLAYED[name])
    r = _report(folder / TRACES[name])
    k = _replayed(r)
    costed = k["flops"].notna().to_numpy()
    # attention needs the step's sequence lengths, which the capture range lacks: the capture
    # leaves it missing and the replay prices it with the replay's step (the same formula)
    step = np.array([needs_step(op) for op in graph.cols["op"]])
    assert step.any() and np.isnan(graph.cols["flops"][step]).all()
    (annotation,) = [n for n in r.ranges["name"] if str(n).startswith("execute_")]
    context = OpContext(attention=step_attention(annotation), world_size=None)
    want_flops, want_bytes = graph.cols["flops"].copy(), graph.cols["dram_bytes"].copy()
    for i in np.flatnonzero(step):
        cost = op_cost(graph.cols["op"][i], *graph.cols["inputs"][i], context)
        assert cost is not None
        want_flops[i], want_bytes[i] = cost.flops, cost.bytes
    # a replayed kernel is costed exactly where its captured op is (or the step prices it), by the join
    assert (costed == ~np.isnan(want_flops)).all()
    assert costed.all() or name == VLLM  # vLLM: one Inductor kernel, triton_poi_fused_0, names no op
    assert set(k.loc[costed, "flops_source"]) == {"graph-capture-trace"}
    assert set(k.loc[costed, "bytes_source"]) == {"graph-capture-trace"}
    assert k.loc[~costed, "flops_source"].isna().all()
    # each captured op's FLOPs/bytes are split over its replayed kernels: the sums per op are the op's
    unit = graph.cols["unit"]
    for head in np.unique(unit[costed]):
        mine = unit == head
        assert k["flops"].to_numpy()[mine].sum() == pytest.approx(want_flops[head], rel=1e-9)
        assert k["dram_bytes"].to_numpy()[mine].sum() == pytest.approx(want_bytes[head], rel=1e-9)


def test_kernels_per_op_agree_with_tracelens(case: tuple[str, Path]) -> None:
    """TraceLens joins replays to the capture the same way: each op owns the same kernels."""
    name, folder = case
    tl = pd.read_csv(folder / "perf_csvs" / "ops_unique_args.csv")
    theirs: Counter[tuple[str, str]] = Counter()
    for op, details in zip(tl["name"], tl["kernel_details_summary"]):
        for m in re.finditer(r"'name': '([^']*)', 'stream': [^,]*, 'count': (\d+)", str(details)):
            theirs[(re.sub(r"_\d+$", "", op), m.group(1))] += int(m.group(2))
    k = _replayed(_report(folder / TRACES[name]))
    # SGLang's per-call attention op name ends in a counter TraceLens strips
    ours = Counter((re.sub(r"_\d+$", "", op), kernel) for op, kernel in zip(k["op"], k["name"]))
    agree = sum(min(c, theirs[key]) for key, c in ours.items())
    assert agree == len(k)  # every replayed kernel is under the same op in TraceLens's table


def test_gemm_flops_match_tracelens_gemm_csv(fixtures_dir: Path) -> None:
    folder = fixtures_dir / VLLM
    k = _replayed(_report(folder / TRACES[VLLM]))
    mm = k[k["op"] == "aten::addmm"]
    assert len(mm) == 72  # 4 GEMMs in each of GPT-OSS-20B's 24 layers... less the MoE experts (matmul_ogs)
    dims = [json.loads(s)[:3] for s in mm["op_shapes"]]
    gemm = pd.read_csv(folder / "perf_csvs" / "GEMM.csv")
    gemm = gemm[gemm["name"] == "aten::addmm"]
    assert len(gemm)
    for _, row in gemm.iterrows():
        m, n, kk = int(row["param: M"]), int(row["param: N"]), int(row["param: K"])
        hit = [i for i, d in enumerate(dims) if d[1] == [m, kk] and d[2] == [kk, n]]
        assert hit
        flops = mm["flops"].to_numpy()[hit]
        # 2*M*N*K (+ the bias add): TraceLens's GFLOPS for the same op, within 1%
        assert flops == pytest.approx(np.full(len(hit), row["GFLOPS_first"] * 1e9), rel=0.01)
        assert (flops >= 2 * m * n * kk).all()


def test_capture_folder_beside_the_trace_is_found_and_said(case: tuple[str, Path]) -> None:
    name, folder = case
    r = _report(folder / TRACES[name])
    record = r.manifest["params"]["capture_traces"]
    assert record["found"] == "beside the trace" and Path(record["path"]) == folder / "capture_traces"
    line = [w for w in r.warnings if "joined to the capture trace" in w]
    assert len(line) == 1 and "found beside the trace" in line[0] and f"{REPLAYED[name]} kernels" in line[0]
    given = _report(folder / TRACES[name], folder / "capture_traces" / CAPTURES[name])
    assert given.manifest["params"]["capture_traces"]["found"] == "--capture"
    assert given.kernels["flops"].sum() == pytest.approx(r.kernels["flops"].sum())


def test_costed_share_is_the_share_inheriting_a_captured_cost(case: tuple[str, Path]) -> None:
    name, folder = case
    r = _report(folder / TRACES[name])
    k = r.kernels
    replay = _replayed(r)
    joined = replay["flops_source"].eq("graph-capture-trace")
    eager = k.drop(replay.index)
    # costed = FLOPs and bytes known (an aten::index has 0 FLOPs and, without recorded index shapes, no bytes)
    eager_costed = eager["flops"].notna() & eager["dram_bytes"].notna()
    share = (replay.loc[joined, "duration_ns"].sum() + eager.loc[eager_costed, "duration_ns"].sum())
    costed = k.loc[k["flops"].notna() & k["dram_bytes"].notna(), "duration_ns"].sum()
    assert costed == share
    before = import_file(folder / TRACES[name], capture=fixtures_dir_empty_capture(folder))
    assert before.kernels["flops"].notna().sum() < k["flops"].notna().sum()


def fixtures_dir_empty_capture(folder: Path) -> Path:
    """The other engine's capture folder: joins nothing, so the costs are those of the trace alone."""
    return folder.parent / ("tracelens_sglang_decode" if folder.name.startswith("tracelens_vllm")
                            else "tracelens_vllm_decode_full") / "capture_traces"


def test_step_batch_from_the_step_ranges() -> None:
    assert step_batch("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)") == 32
    assert step_batch("step[DECODE bs=32]") == 32
    assert step_batch("perfscope.step[decode bs=8 toks=8 ctx=512]") == 8
    assert step_batch("capture_32_FULL") is None
    assert step_batch("ProfilerStep#134") is None


# ---------------------------------------------------------------------------- mismatches
@pytest.mark.parametrize(("trace_of", "capture_of"), [(VLLM, SGLANG), (SGLANG, VLLM)], ids=["vllm<-sglang", "sglang<-vllm"])
def test_a_capture_of_another_model_leaves_replays_uncosted_with_one_warning(
        fixtures_dir: Path, trace_of: str, capture_of: str) -> None:
    r = _report(fixtures_dir / trace_of / TRACES[trace_of], fixtures_dir / capture_of / "capture_traces")
    replay = _replayed(r)
    assert replay["flops"].isna().all() and replay["op"].isna().all()
    assert not r.kernels["flops_source"].eq("graph-capture-trace").any()
    lines = [w for w in r.warnings if "graph" in w and "replay" in w]
    assert len(lines) == 1
    assert "match no graph" in lines[0] and CAPTURES[capture_of] in lines[0]
    assert f"{REPLAYED[trace_of]} kernels" in lines[0] and f"{REPLAYED[capture_of]} kernels" in lines[0]
    # the eager kernels keep their own costs
    alone = _report(fixtures_dir / trace_of / TRACES[trace_of])
    eager = r.kernels.drop(replay.index)
    assert eager["flops"].sum() == pytest.approx(alone.kernels.drop(_replayed(alone).index)["flops"].sum())


def _folder(tmp_path: Path, src: Path, details: Any | None, *, rename: tuple[str, str] | None = None) -> Path:
    out = tmp_path / "capture_traces"
    out.mkdir()
    if rename:
        with gzip.open(src, "rt") as fh:
            text = fh.read().replace(*rename)
        with gzip.open(out / src.name, "wt") as fh:
            fh.write(text)
    else:
        (out / src.name).symlink_to(src)
    if details is not None:
        (out / "execution_details.json").write_text(json.dumps(details))
    return out


def test_an_index_and_a_capture_range_that_disagree_on_batch(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / SGLANG / "capture_traces" / CAPTURES[SGLANG]
    cap = _folder(tmp_path, src, [{"file": src.name, "batch_size": 64, "mode": "FULL"}])
    r = import_file(fixtures_dir / SGLANG / TRACES[SGLANG], capture=cap)
    assert _replayed(r)["flops"].isna().all()
    (line,) = [w for w in r.warnings if "graph replays" in w]
    assert "batch 64" in line and "capture_32_DECODE" in line


def test_a_capture_of_another_batch_size(fixtures_dir: Path, tmp_path: Path) -> None:
    """The same kernel names at batch 64: the step runs batch 32, so the replay is not joined."""
    src = fixtures_dir / SGLANG / "capture_traces" / CAPTURES[SGLANG]
    cap = _folder(tmp_path, src, [{"file": src.name, "batch_size": 64, "mode": "FULL"}],
                  rename=("capture_32_DECODE", "capture_64_DECODE"))
    r = import_file(fixtures_dir / SGLANG / TRACES[SGLANG], capture=cap)
    assert _replayed(r)["flops"].isna().all()
    (line,) = [w for w in r.warnings if "graph replays" in w]
    assert "runs batch 32" in line and "[64]" in line


def test_a_folder_without_execution_details(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / SGLANG / "capture_traces" / CAPTURES[SGLANG]
    cap = _folder(tmp_path, src, None)
    r = import_file(fixtures_dir / SGLANG / TRACES[SGLANG], capture=cap)
    assert _replayed(r)["op"].notna().all()  # batch size from the capture range, joined on the sequence
    assert any("has no execution_details.json" in w for w in r.warnings)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputFormatError, match="has no execution_details.json and no capture trace"):
        import_file(fixtures_dir / SGLANG / TRACES[SGLANG], capture=empty)


def test_bad_index_and_missing_files(fixtures_dir: Path, tmp_path: Path) -> None:
    trace = fixtures_dir / SGLANG / TRACES[SGLANG]
    cap = tmp_path / "caps"
    cap.mkdir()
    (cap / "execution_details.json").write_text("{not json")
    with pytest.raises(InputFormatError, match="execution_details.json: is not readable JSON"):
        import_file(trace, capture=cap)
    (cap / "execution_details.json").write_text(json.dumps([{"file": "gone.json.gz", "batch_size": 32}]))
    with pytest.raises(InputFormatError, match="gone.json.gz: listed in execution_details.json but missing"):
        import_file(trace, capture=cap)
    with pytest.raises(InputFormatError, match="no such capture trace or folder"):
        import_file(trace, capture=tmp_path / "nowhere")


def test_a_corrupt_capture_trace(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / SGLANG / "capture_traces" / CAPTURES[SGLANG]
    bad = tmp_path / "capture_traces"
    bad.mkdir()
    (bad / src.name).write_bytes(src.read_bytes()[: src.stat().st_size // 2])  # cut short
    (bad / "execution_details.json").write_text(json.dumps([{"file": src.name, "batch_size": 32, "mode": "FULL"}]))
    with pytest.raises(InputFormatError, match=re.escape(src.name)):
        import_file(fixtures_dir / SGLANG / TRACES[SGLANG], capture=bad)
    # beside the trace, a broken folder is a warning and the trace still imports
    trace = tmp_path / TRACES[SGLANG]
    shutil.copy(fixtures_dir / SGLANG / TRACES[SGLANG], trace)
    r = import_file(trace)
    assert _replayed(r)["flops"].isna().all()
    (line,) = [w for w in r.warnings if "capture_traces/" in w]
    assert "beside the trace not used" in line and src.name in line
    assert r.manifest["params"]["capture_traces"]["graphs"] == "0"


def test_capture_only_for_kineto(fixtures_dir: Path) -> None:
    with pytest.raises(UsageError, match="Kineto"):
        import_file(fixtures_dir / "nsys" / "aws_t4_softmax.sqlite", capture=fixtures_dir / VLLM / "capture_traces")


# ---------------------------------------------------------------------------- CLI
def test_cli_capture_flag_and_messages(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.cli import main

    trace = fixtures_dir / VLLM / TRACES[VLLM]
    code = main(["import", str(trace), "--capture", str(fixtures_dir / VLLM / "capture_traces"),
                 "--out", str(tmp_path / "a"), "--no-html"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "421 kernels take their captured op" in out.err
    # no roofs for this trace (an empty device name): the message names the CLI flag
    assert "--roofs" in out.err and "import_file(" not in out.err
    code = main(["import", str(trace), "--capture", str(tmp_path / "nowhere"), "--out", str(tmp_path / "b"),
                 "--no-html"])
    out = capsys.readouterr()
    assert code == 3
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "no such capture trace or folder" in lines[0] and "Traceback" not in out.err


def test_no_roofs_finding_names_the_cli_flag(fixtures_dir: Path) -> None:
    import dataclasses

    from perfscope.analysis.findings import run_rules

    # the trace's device is now matched to MI300X by its properties; without roofs the finding names the flag
    r0 = _report(fixtures_dir / VLLM / TRACES[VLLM])
    r = dataclasses.replace(r0, manifest={**r0.manifest, "device": None})
    assert r.device is None
    found = [f for f in run_rules(r) if "no device roofs" in f.title]
    assert found
    text = " ".join(f.recommendation for f in found)
    assert "--roofs" in text and "import_file(" not in text


def _replayed_again(fixtures_dir: Path, tmp_path: Path, step_name: Any) -> tuple[Path, int, int]:
    """The vLLM trace with its graph replay (launch, kernels) repeated after its step, inside a
    copy of the step range renamed by ``step_name(name)`` (None: no step range around it).
    Returns (the trace, the first replay's correlation id, the second's)."""
    ev = _events(fixtures_dir / VLLM / TRACES[VLLM])
    with gzip.open(fixtures_dir / VLLM / TRACES[VLLM]) as fh:
        doc = json.loads(fh.read())
    (launch,) = [e for e in ev if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e["name"]]
    (step,) = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("execute_")]
    corr = launch["args"]["correlation"]
    shift, new = step["dur"] + 1000.0, corr + 10_000_000
    copies = [e for e in ev if e is launch or (e is step and step_name(step["name"]) is not None)
              or (e.get("cat") in ("kernel", "ac2g") and e.get("args", {}).get("correlation") == corr)]
    for e in copies:
        c = json.loads(json.dumps(e))
        c["ts"] = c["ts"] + shift
        if "correlation" in c.get("args", {}):
            c["args"]["correlation"] = new
        if c.get("cat") == "user_annotation":
            c["name"] = step_name(c["name"])
        doc["traceEvents"].append(c)
    path = tmp_path / "two_steps.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    return path, corr, new


def test_each_replay_is_joined_at_its_own_batch_size(fixtures_dir: Path, tmp_path: Path) -> None:
    """The vLLM step replayed again inside a batch-16 step range: the capture holds only batch 32,
    so the first replay is joined and the second is not, and the report counts both."""
    path, corr, new = _replayed_again(fixtures_dir, tmp_path, lambda n: n.replace("execute_32_", "execute_16_"))
    r = import_file(path, capture=fixtures_dir / VLLM / "capture_traces")
    k = r.kernels
    first, second = k[k["correlation"] == corr], k[k["correlation"] == new]
    assert len(first) == len(second) == REPLAYED[VLLM]
    assert first["op"].notna().all() and second["op"].isna().all() and second["flops"].isna().all()
    (joined,) = [w for w in r.warnings if "joined to the capture trace" in w]
    (missed,) = [w for w in r.warnings if "match no graph" in w]
    assert "1 of 2 replays" in joined
    assert missed.startswith("1 of 2 graph replays") and "runs batch 16" in missed and "[32]" in missed


def test_each_replay_prices_its_attention_with_its_own_step(fixtures_dir: Path, tmp_path: Path) -> None:
    """The vLLM step replayed again at twice the context (generation sk 55,086 -> 110,172):
    the same graph, so every op but attention costs the same; attention's FLOPs double (one query
    a sequence: pairs = sum sk) and its KV bytes double. Replayed with no step range around it,
    attention stays missing and the rest is still joined."""
    def doubled(name: str) -> str:
        return name.replace("sk55086sqsq32sqsk55086", "sk110172sqsq32sqsk110172")

    path, corr, new = _replayed_again(fixtures_dir, tmp_path, doubled)
    k = import_file(path, capture=fixtures_dir / VLLM / "capture_traces").kernels
    first, second = k[k["correlation"] == corr], k[k["correlation"] == new]
    attn = first["op"].eq("vllm::unified_attention_with_output").to_numpy()
    assert attn.sum() == 36 and (second["op"].to_numpy() == first["op"].to_numpy()).all()
    f1, f2 = first["flops"].to_numpy(), second["flops"].to_numpy()
    b1, b2 = first["dram_bytes"].to_numpy(), second["dram_bytes"].to_numpy()
    assert f1[~attn] == pytest.approx(f2[~attn], nan_ok=True)
    assert f1[attn].sum() == pytest.approx(24 * 4 * 64 * 64 * 55086, rel=1e-12)  # 24 layers, 4 Hq D sum(sk)
    assert f2[attn].sum() == pytest.approx(2 * f1[attn].sum(), rel=1e-12)
    q_and_o = 24 * 2 * 32 * 64 * 64 * 2
    assert b2[attn].sum() - q_and_o == pytest.approx(2 * (b1[attn].sum() - q_and_o), rel=1e-12)

    path, corr, new = _replayed_again(fixtures_dir, tmp_path, lambda n: None)
    k = import_file(path, capture=fixtures_dir / VLLM / "capture_traces").kernels
    first, second = k[k["correlation"] == corr], k[k["correlation"] == new]
    assert second["op"].notna().all()  # one captured batch size: joined without the step's batch
    assert np.isnan(second["flops"].to_numpy()[attn]).all() and not np.isnan(first["flops"].to_numpy()[attn]).any()
    assert second["flops"].to_numpy()[~attn] == pytest.approx(first["flops"].to_numpy()[~attn], nan_ok=True)


def test_pieces_of_a_graph_join_as_contiguous_runs(fixtures_dir: Path, tmp_path: Path) -> None:
    """PIECEWISE replays launch parts of the captured sequence: the vLLM replay split into two
    graph launches at kernel 200 joins as two runs; an op cut by the split is left uncosted."""
    with gzip.open(fixtures_dir / VLLM / TRACES[VLLM]) as fh:
        doc = json.loads(fh.read())
    ev = doc["traceEvents"]
    (launch,) = [e for e in ev if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e["name"]]
    corr = launch["args"]["correlation"]
    kernels = sorted((e for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") == corr),
                     key=lambda e: e["ts"])
    new = corr + 10_000_000
    for e in kernels[200:]:
        e["args"]["correlation"] = new
    second = json.loads(json.dumps(launch))
    second["ts"] += launch["dur"] + 1.0
    second["args"]["correlation"] = new
    ev.append(second)
    path = tmp_path / "pieces.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    r = import_file(path, capture=fixtures_dir / VLLM / "capture_traces")
    whole = _replayed(_report(fixtures_dir / VLLM / TRACES[VLLM]))
    k = r.kernels
    parts = pd.concat([k[k["correlation"] == corr], k[k["correlation"] == new]])
    assert len(parts) == REPLAYED[VLLM] and parts["op"].notna().all()
    assert parts["op"].tolist() == whole["op"].tolist() and parts["op_shapes"].tolist() == whole["op_shapes"].tolist()
    (joined,) = [w for w in r.warnings if "joined to the capture trace" in w]
    assert "2 of 2 replays" in joined
    (graph,) = read_captures(fixtures_dir / VLLM / "capture_traces", found="--capture").graphs
    unit = graph.cols["unit"]
    cut = set(unit[:200]) & set(unit[200:])
    in_cut = np.isin(unit, list(cut))
    assert parts["flops"].isna().to_numpy()[in_cut].all()
    same = ~in_cut
    assert np.allclose(parts["flops"].to_numpy()[same], whole["flops"].to_numpy()[same], equal_nan=True)


def test_a_copy_kernel_beside_a_replayed_matmul_takes_none_of_its_ops_cost(fixtures_dir: Path, tmp_path: Path) -> None:
    """vLLM's MoE op launches two matmul kernels and a finalize kernel per call. With the finalize kernel
    renamed to an element-wise one (in the capture and in the replay, so the join still holds), it is set
    aside: its own category, no FLOPs or bytes, and the two matmul kernels carry the op's whole cost."""
    old, new = "_finalize_matmul_scatter_bf16", "_finalize_scatter_elementwise_bf16"
    captures = _folder(tmp_path, fixtures_dir / VLLM / "capture_traces" / CAPTURES[VLLM],
                       json.loads((fixtures_dir / VLLM / "capture_traces" / "execution_details.json").read_text()),
                       rename=(old, new))
    with gzip.open(fixtures_dir / VLLM / TRACES[VLLM], "rt") as fh:
        text = fh.read()
    assert text.count(old) > 0
    trace = tmp_path / TRACES[VLLM]
    with gzip.open(trace, "wt") as fh:
        fh.write(text.replace(old, new))
    (graph,) = read_captures(captures, found="--capture").graphs
    k, before = _replayed(import_file(trace, capture=captures)), _replayed(_report(fixtures_dir / VLLM / TRACES[VLLM]))
    moe = (k["op"] == "vllm::moe_forward").to_numpy()
    aside = moe & (k["name"] == new).to_numpy()
    assert aside.sum() > 1 and (k["category"][aside] == "elementwise").all()
    assert k["flops"][aside].isna().all() and k["dram_bytes"][aside].isna().all()
    assert (k["category"][moe & ~aside] == "gemm").all() and k["flops"][moe & ~aside].notna().all()
    # each MoE call's cost, whole, on its two matmul kernels; the same total as the unrenamed trace
    unit = graph.cols["unit"]
    for head in np.unique(unit[moe]):
        mine = (unit == head) & ~aside
        assert k["flops"].to_numpy()[mine].sum() == pytest.approx(graph.cols["flops"][head], rel=1e-9)
    assert k["flops"][moe].sum() == pytest.approx(before["flops"][moe].sum(), rel=1e-9)
    # the graph's other kernels are priced as before
    assert k["flops"][~moe].fillna(-1).tolist() == before["flops"][~moe].fillna(-1).tolist()
