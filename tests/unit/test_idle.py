"""Why the GPU waits (analysis/idle.py, issue 29): each idle slice's cause, against traces whose truth is known.

- synthetic Kineto traces (tests/unit/idle_traces.py) written in the real file format, with an oracle
  that walks their host timeline one microsecond at a time;
- every committed Kineto and nsys fixture: the causes sum to the window's idle time;
- HTA's critical-path fixtures: the sync calls' share equals a plain sweep over the gaps;
- the engine on the CPU with a planted ``time.sleep`` in a named range and a planted ``.item()``.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.findings import RULES
from perfscope.analysis.idle import CAUSES, cause_totals, idle_of, idle_summary
from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.rules import timeline
from perfscope.analysis.rules._gaps import WAIT_CLASSES, graph_gap_advice, sync_advice, sync_groups
from perfscope.report import Report
from tests.unit.idle_traces import (
    NSYS_TEMPLATE,
    OSRT_TEMPLATE,
    copy_back,
    launch_bound,
    layer_streaming,
    profiler_flush,
    sync_bound,
    weight_streaming,
    write_nsys,
)
from tests.unit.ranks_support import union

FIXTURES = sorted([
    *(f"kineto/{p.name}" for p in (Path(__file__).parents[1] / "fixtures" / "kineto").iterdir()),
    *(f"nsys/{p.name}" for p in (Path(__file__).parents[1] / "fixtures" / "nsys").iterdir()),
    "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "thirdparty/tracelens_vllm_decode_full/graph_execution.json.gz",
    "h200/h200_llama1b_engine_eager.pt.trace.json.gz",
    "h200/h200_llama1b_engine_cudagraph.pt.trace.json.gz",
])
ALEXNET = "kineto/hta_critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
EVENT_SYNC = "kineto/hta_critical_path__cuda_event_sync_multi_stream__event_sync_trace.json.gz"
A100 = "kineto/hta_negative_queue_length_values_check__rank0.json.gz"
NANOVLLM = "kineto/nanovllm_cpu_kv_attention__forward_10.json.gz"
VLLM_GRAPH = "thirdparty/tracelens_vllm_decode_full/graph_execution.json.gz"
H200_GRAPH = "h200/h200_llama1b_engine_cudagraph.pt.trace.json.gz"
H200_EAGER = "h200/h200_llama1b_engine_eager.pt.trace.json.gz"
RECOMMENDS_GRAPHS = re.compile(
    r"reduce-overhead|torch\.cuda\.CUDAGraph|torch\.cuda\.graphs|capture repeated sequences in CUDA graphs|"
    r"(capture|run) the (steady-state |decode )?step (in|from) a CUDA graph|capture several steps in one graph|"
    r"cudagraph_capture_sizes|--cuda-graph-max-bs|--enforce-eager|--disable-cuda-graph", re.IGNORECASE)
"""Advice to capture CUDA graphs (or a framework's graph setting), in any finding's words."""


def by_cause_and_range(report: Report) -> Counter[tuple[str, str | None]]:
    idle = report.idle
    out: Counter[tuple[str, str | None]] = Counter()
    for cause, rng, ns in zip(idle["cause"], idle["range"], idle["duration_ns"]):
        out[(cause, None if pd.isna(rng) else rng)] += int(ns)
    return out


# ---------------------------------------------------------------------------- synthetic truth
@pytest.mark.parametrize("build", [weight_streaming, launch_bound, sync_bound, profiler_flush])
@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_causes_and_ranges_equal_the_oracle(tmp_path: Path, fixtures_dir: Path, build, fmt: str) -> None:
    """The same host timeline written as a Kineto trace and into a real nsys export's schema."""
    from perfscope.analysis.readers.nsys.reader import read_nsys_sqlite

    trace = build()
    r = read_kineto(trace.write(tmp_path / "t.json")) if fmt == "kineto" else \
        read_nsys_sqlite(write_nsys(trace, fixtures_dir / NSYS_TEMPLATE, tmp_path / "t.sqlite"))
    assert by_cause_and_range(r) == trace.truth()
    assert set(r.idle["cause"]) <= set(CAUSES)


def test_weight_streaming_is_copy_and_host_in_the_ensure_ranges_not_launch(tmp_path: Path) -> None:
    """The RTX 4060 Ti trace of issue 29, reproduced: the idle time is the weight staging inside
    ``ensure_layer_N_weights``; launch calls explain almost none of it, so no launch-bound finding
    and no CUDA-graph advice."""
    trace = weight_streaming()
    r = read_kineto(trace.write(tmp_path / "t.json"))
    truth = trace.truth()
    idle = sum(truth.values())
    in_ensure = sum(ns for (_, rng), ns in truth.items() if rng and rng.startswith("ensure_layer_"))
    assert in_ensure / idle > 0.9
    assert RULES["launch-overhead"](r) == []
    f = [f for f in RULES["gpu-idle"](r) if f.id == "gpu-idle"]
    assert len(f) == 1
    ev = f[0].evidence
    assert ev["idle_cause"] == "copy"
    assert ev["idle_copy_ns"] == sum(ns for (c, _), ns in truth.items() if c == "copy")
    assert ev["idle_host_ns"] == sum(ns for (c, _), ns in truth.items() if c == "host")
    # 16 copies; the first one's call runs before the first GPU work, outside the window
    assert ev["copies"] == 15 and ev["copy_bytes"] == 15 * (4 << 20) and ev["copies_pinned"] == "none"
    assert ev["copy_range1"] == "ensure_layer_N_weights"
    assert "mostly copy in ensure_layer_N_weights" in f[0].title
    text = f[0].recommendation
    assert "pinned" in text.lower() and "resident" in text and "reduce-overhead" not in text
    # the copies' direction is read from their transfers: to the device, and the trace cannot say whether it is the
    # same data each time (here: the same layer weights) or new data, so the advice says both
    assert "100% (15 copies, 62.9 MB) went to the device: if it is the same data each time" in text, text
    assert "came back to the host" not in text
    summary = idle_summary(r.idle)
    copy_rows = summary[summary["cause"] == "copy"]
    assert copy_rows["bytes"].sum() == 15 * (4 << 20) and set(copy_rows["pinned"]) == {"none"}


def test_launch_bound_trace_is_claimed_launch_bound(tmp_path: Path) -> None:
    trace = launch_bound()
    r = read_kineto(trace.write(tmp_path / "t.json"))
    truth = trace.truth()
    launch = sum(ns for (c, _), ns in truth.items() if c == "launch")
    assert launch / sum(truth.values()) > 0.9
    (f,) = RULES["launch-overhead"](r)
    assert f.evidence["idle_in_launch_calls_ns"] == launch and f.time_at_stake_ns == launch
    (idle,) = [g for g in RULES["gpu-idle"](r) if g.id == "gpu-idle"]
    assert idle.evidence["idle_cause"] == "launch" and "CUDA graph" in idle.recommendation


@pytest.mark.parametrize("kernel, ranges, says, not_says", [
    ("gemm_kernel", True, ("The trace's 3 'decode_step N' ranges launch about 40 of these kernels each",
                           "120 of the launches are matrix products (median 3 µs)"), ("fusing",)),
    ("vectorized_elementwise_kernel", True, ("120 of the 120 launches are elementwise", "fusing them"),
     ("matrix products",)),
    ("triton_poi_fused_add_mul_0", True, ("120 of the 120 launches are already Inductor's fused Triton kernels", "reduce-overhead"),
     ("ranges launch about", "fusing them")),
    ("gemm_kernel", False, ("marks no repeated range around these launches",), ("ranges launch about",)),
])
def test_launch_bound_advice_follows_what_the_launches_are(tmp_path: Path, kernel: str, ranges: bool,
                                                           says: tuple[str, ...], not_says: tuple[str, ...]) -> None:
    """The same launch-bound timeline with other kernels: the advice says what the launches are (matrix products:
    a larger batch; unfused elementwise kernels: fusion; Inductor's Triton kernels: a graph of the compiled step),
    and captures the repeated range the trace shows, or says that it shows none."""
    r = read_kineto(launch_bound(kernel=kernel, ranges=ranges).write(tmp_path / "t.json"))
    (f,) = RULES["launch-overhead"](r)
    text = f.recommendation
    assert text.startswith("Each launch call takes a median 20 µs and each kernel runs a median 3 µs")
    assert all(s in text for s in says) and not any(s in text for s in not_says), text
    assert f.evidence["launches_in_repeats" if ranges else "launches"] == 120


@pytest.mark.parametrize("nbytes, says, not_says", [
    (64, ("100% (3 copies, 192 B) came back to the host, 64 B each on average: the wait is for the device",),
     ("copy back only what the host reads", "went to the device")),
    (64 << 20, ("100% (3 copies, 201 MB) came back to the host: copy back only what the host reads",
                "pin the host memory"), ("the wait is for the device", "went to the device")),
])
def test_copy_advice_follows_the_copies_direction_and_size(tmp_path: Path, nbytes: int, says: tuple[str, ...],
                                                           not_says: tuple[str, ...]) -> None:
    """A GPU that waits inside copies to the host: small ones are waits for the device (read the value later),
    large ones are data (copy back less, pinned); neither is told to keep data resident."""
    r = read_kineto(copy_back(nbytes).write(tmp_path / "t.json"))
    (f,) = [g for g in RULES["gpu-idle"](r) if g.id == "gpu-idle"]
    assert f.evidence["idle_cause"] == "copy"
    text = f.recommendation
    assert all(s in text for s in says) and not any(s in text for s in not_says), text
    assert "resident" not in text and "reduce-overhead" not in text


def test_sync_bound_trace_names_the_sync_and_its_range(tmp_path: Path) -> None:
    trace = sync_bound()
    r = read_kineto(trace.write(tmp_path / "t.json"))
    truth = trace.truth()
    (f,) = [g for g in RULES["gpu-idle"](r) if g.id == "gpu-idle"]
    assert f.evidence["idle_cause"] == "sync"
    # the queue model: the postprocess after the sync returned is the sync's too (the GPU had drained)
    assert f.evidence["idle_sync_ns"] == truth[("sync", "sampler")] + truth[("sync", "postprocess")]
    assert f.evidence["sync_range1"] == "sampler"
    # the trace records no operators: what made the call is not shown, and the finding says so
    assert "the trace records no operators, so what made the call is not shown" in f.recommendation
    assert "reduce-overhead" not in f.recommendation
    assert {i.attrs.get("api") for i in f.items if i.attrs.get("kind") == "sync"} == {"cudaStreamSynchronize"}
    assert RULES["launch-overhead"](r) == []
    # every slice is inside the window and the slices do not overlap
    s = r.idle.sort_values("start_ns")
    assert (s["start_ns"].to_numpy()[1:] >= s["end_ns"].to_numpy()[:-1]).all()


SYNC_CASES = {
    # operator behind the sync, its copy, the sync call, operators elsewhere: what the advice must and must not say
    "item": ({"op": "aten::item"}, ("read a value to the host (aten::item", "keep the value on the device"),
             ("pin the source", "torch.cuda.synchronize()")),
    "if on a tensor": ({"op": "aten::is_nonzero", "copy": None},
                       ("branched on a device tensor (aten::is_nonzero", "torch._assert_async"), ("pin the source",)),
    "data-dependent size": ({"op": "aten::nonzero", "copy": None},
                            ("output size depends on the data (aten::nonzero", "nonzero_static"),
                            ("keep the value on the device",)),
    "copy to the host": ({"op": "aten::to"}, ("copied results to the host (aten::to", "pinned memory"),
                         ("pageable host memory to the device",)),
    "copy from pageable memory": ({"op": "aten::to", "copy": "HtoD"},
                                  ("copied data from pageable host memory to the device (aten::to", "pin_memory()"),
                                  ("results to the host",)),
    "explicit": ({"copy": None, "api": "cudaDeviceSynchronize", "ops_elsewhere": True},
                 ("called cudaDeviceSynchronize outside any operator (torch.cuda.synchronize()", "elapsed_time"),
                 ("keep the value on the device", "records no operators")),
    "unknown operator": ({"op": "fbgemm::permute_sparse_features", "copy": None},
                         ("behind fbgemm::permute_sparse_features in sampler",
                          "which synchronised for a reason the trace does not show"),
                         ("keep the value on the device", "pin the source")),
    "no operators recorded": ({"copy": None, "api": "cudaEventSynchronize"},
                              ("called cudaEventSynchronize, and the trace records no operators",),
                              ("outside any operator",)),
}


@pytest.mark.parametrize("case", list(SYNC_CASES))
def test_sync_advice_follows_the_operator_behind_the_sync(tmp_path: Path, case: str) -> None:
    """The same sync-bound timeline with another operator behind the sync: the advice is the one for what the
    host did there (read a value, branch on a tensor, a size that depends on the data, a copy each way, an explicit
    synchronize), an operator it cannot explain is said to be unexplained, and a trace without operators says
    that what made the call is not shown."""
    kwargs, says, not_says = SYNC_CASES[case]
    r = read_kineto(sync_bound(**kwargs).write(tmp_path / "t.json"))
    (f,) = [g for g in RULES["gpu-idle"](r) if g.id == "gpu-idle"]
    assert f.evidence["idle_cause"] == "sync"
    text = f.recommendation
    assert "CUDA graphs would not remove it" in text and "reduce-overhead" not in text
    assert all(s in text for s in says) and not any(s in text for s in not_says), text
    assert "Of it, 100% (2 gaps)" in text, text  # the gap after each step but the last: all of it one mechanism


def test_profiler_flush_is_the_profilers_own_time(tmp_path: Path) -> None:
    trace = profiler_flush()
    r = read_kineto(trace.write(tmp_path / "t.json"))
    (f,) = [g for g in RULES["gpu-idle"](r) if g.id == "gpu-idle"]
    assert f.evidence["idle_cause"] == "profiler"
    assert f.evidence["idle_profiler_ns"] == sum(ns for (c, _), ns in trace.truth().items() if c == "profiler")
    assert "measurement overhead" in f.recommendation


def test_a_trace_without_its_host_side_is_unknown(tmp_path: Path) -> None:
    trace = launch_bound()
    trace.events = [e for e in trace.events if e["cat"] == "kernel"]
    r = read_kineto(trace.write(tmp_path / "t.json"))
    assert set(r.idle["cause"]) == {"unknown"} and r.idle["range"].isna().all()
    (f,) = [g for g in RULES["gpu-idle"](r) if g.id == "gpu-idle"]
    assert f.evidence["idle_cause"] == "unknown" and "not recorded" in f.recommendation


# ---------------------------------------------------------------------------- every fixture
def _cpu_window_idle(r: Report) -> float:
    """Time outside the operators (the aten::item / _local_scalar_dense rows count as outside) from
    the first to the last other operator, by a plain sweep."""
    k = r.kernels[~r.kernels["name"].astype(str).isin(["aten::item", "aten::_local_scalar_dense"])]
    merged = union([(int(s), int(e)) for s, e in zip(k["start_ns"], k["end_ns"])])
    return float(merged[-1][1] - merged[0][0] - sum(e - s for s, e in merged))


@pytest.mark.parametrize("name", FIXTURES)
def test_causes_sum_to_the_idle_time_of_the_window(load, name: str) -> None:
    r = load(name)
    idle = idle_of(r)
    assert set(idle["cause"]) <= set(CAUSES)
    if r.device is not None and r.device.kind == "cpu":
        want = {"cpu": _cpu_window_idle(r)} if len(r.kernels) else {}
    else:
        want = {d.device: d.idle_ns for d in timeline.device_idle(r)}
    got = idle.groupby("device")["duration_ns"].sum().to_dict() if len(idle) else {}
    for device, ns in want.items():
        assert got.get(device, 0.0) == pytest.approx(ns, rel=0.01, abs=1)
    # the shares of the window add up too
    for device, rows in idle.groupby("device"):
        span = float(rows["window_ns"].iloc[0])
        assert rows["window_pct"].sum() == pytest.approx(100 * rows["duration_ns"].sum() / span)


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """ns where two unions of intervals overlap (a plain double loop)."""
    return sum(max(0, min(ae, be) - max(as_, bs)) for as_, ae in a for bs, be in b)


@pytest.mark.parametrize("name", [ALEXNET, A100, EVENT_SYNC])
def test_sync_share_equals_the_gaps_inside_sync_calls(load, name: str) -> None:
    """HTA's critical-path traces (event syncs) and the A100 training trace: the sync slices inside
    cuda*Synchronize calls equal a plain sweep of those calls over the gaps between the device's work
    (gaps between two kernels of one graph replay left out: the device ran the graph by itself); the rest of
    the sync time lies in gaps that opened inside a sync call or a copy to the host (the queue model)."""
    r = load(name)
    idle = idle_of(r)
    work = [*zip(r.kernels["start_ns"], r.kernels["end_ns"]), *zip(r.transfers["start_ns"], r.transfers["end_ns"])]
    merged = union([(int(s), int(e)) for s, e in work])
    graph_gaps = {(int(s), int(e)) for s, e in zip(idle.loc[idle["cause"] == "graph", "start_ns"],
                                                    idle.loc[idle["cause"] == "graph", "end_ns"])}
    gaps = [(merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)
            if (merged[i][1], merged[i + 1][0]) not in graph_gaps]
    syncs = union([(int(s), int(e)) for n, s, e in zip(r.api["name"], r.api["start_ns"], r.api["end_ns"])
                   if "Synchronize" in str(n) and e > s])
    sync_slices = [(int(s), int(e)) for s, e in zip(idle.loc[idle["cause"] == "sync", "start_ns"],
                                                     idle.loc[idle["cause"] == "sync", "end_ns"])]
    assert _overlap(sync_slices, syncs) == pytest.approx(_overlap(gaps, syncs), abs=1)
    # the queue model's part: each sync slice outside the calls sits in a gap that opened inside one
    # (or inside a copy call to the host: the .cpu() / .item() copy), and after that call returned
    openers = syncs + [(int(s), int(e)) for n, s, e in zip(r.api["name"], r.api["start_ns"], r.api["end_ns"])
                       if "emcpy" in str(n)]
    for (s, e), gap in zip(sync_slices, idle.loc[idle["cause"] == "sync", "gap"]):
        if _overlap([(s, e)], syncs) == 0:
            opened = int(idle.loc[idle["gap"] == gap, "start_ns"].min())
            assert any(os_ <= opened <= oe <= s for os_, oe in openers)


def test_event_sync_trace_waits_on_host_work_outside_any_range(load) -> None:
    """HTA's cuda_event_sync trace: the GPU waits 18 ms between the second and the third matmul while
    the host thread records nothing (host work, no range), not for launches."""
    r = load(EVENT_SYNC)
    idle = idle_of(r)
    big = idle.loc[idle["duration_ns"].idxmax()]
    assert big["cause"] == "host" and pd.isna(big["range"]) and big["duration_ns"] > 18_000_000
    assert big["host_kind"] == "host code" and pd.isna(big["op"]) and pd.isna(big["function"])
    totals = cause_totals(idle)
    assert totals["host"] / sum(totals.values()) > 0.99
    # no range, function, operator or call names that time: the finding says it is unexplained
    (f,) = RULES["gpu-idle"](r)
    assert f.unexplained_ns >= big["duration_ns"] and f.explained_share < 0.1
    assert not any(i.explains for i in f.items if i.attrs.get("kind") == "host code")


# ---------------------------------------------------------------------------- the engine on the CPU
def test_engine_on_cpu_planted_sleep_and_item(monkeypatch) -> None:
    """On a CPU report, idle is the time no operator runs (on any thread); ``aten::item`` counts as
    sync. A sleep planted in a named range is host time of that range; a planted .item() is sync."""
    torch = pytest.importorskip("torch")
    gen = importlib.import_module("perfscope.engine.decoding")  # where sampling is called
    from perfscope.sessions.profile import EngineRun, profile_engine

    sleep_s, sampled = 0.01, []
    original = gen.sample

    def planted(logits, params, g):
        with torch.profiler.record_function("planted_host_work"):
            time.sleep(sleep_s)
        with torch.profiler.record_function("planted_sync"):
            logits.sum().item()
        sampled.append(1)
        return original(logits, params, g)

    monkeypatch.setattr(gen, "sample", planted)
    r = profile_engine(EngineRun(model="tiny", batch=1, prompt_len=8, gen_len=4, device="cpu", compile=False),
                       model=gen.build_model("tiny"), baseline=0)
    idle = r.idle
    ranges = r.ranges[r.ranges["name"] == "planted_host_work"]
    first_op = int(r.kernels["start_ns"].min())
    inside = ranges[ranges["start_ns"] >= first_op]  # a sleep before the first operator is not in the window
    host = idle[(idle["cause"] == "host") & (idle["range"] == "planted_host_work")]
    assert len(inside) >= 1
    assert set(host["host_kind"]) == {"host code"}  # no Python stacks recorded: the named range is all we know
    # every nanosecond of the planted range is idle host time (it runs no operator), and no more
    assert host["duration_ns"].sum() == pytest.approx((inside["end_ns"] - inside["start_ns"]).sum(), rel=0.01)
    assert host["duration_ns"].sum() >= len(inside) * sleep_s * 1e9
    items = r.kernels[(r.kernels["name"] == "aten::item") & (r.kernels["range"].astype(str).str.endswith("planted_sync"))]
    sync = idle[(idle["cause"] == "sync") & (idle["range"] == "planted_sync")]
    assert len(items) and 0 < sync["duration_ns"].sum() <= items["duration_ns"].sum()
    monkeypatch.setattr(timeline, "IDLE_MIN_PCT", 0.0)  # the finding however small the idle share is on this machine
    (f,) = RULES["gpu-idle"](r)
    assert "planted_host_work" in f.title and f.evidence["idle_cause"] == "host"
    assert np.isfinite(f.evidence["idle_sync_ns"]) and f.evidence["idle_sync_ns"] > 0


# ---------------------------------------------------------------------------- outputs
def test_analyze_shows_the_split_in_text_and_json(tmp_path: Path, capsys) -> None:
    import json

    from perfscope.cli import main

    trace = weight_streaming().write(tmp_path / "t.json")
    assert main(["import", str(trace), "--out", str(tmp_path / "r.perfscope"), "--no-html"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "r.perfscope"), "--json"]) == 0
    (dev,) = json.loads(capsys.readouterr().out)["idle"]
    truth = weight_streaming().truth()
    causes = {c["cause"]: c["duration_ns"] for c in dev["causes"]}
    assert causes["copy"] == sum(ns for (c, _), ns in truth.items() if c == "copy")
    assert dev["idle_ns"] == sum(truth.values()) and set(causes) == set(CAUSES)
    assert main(["analyze", str(tmp_path / "r.perfscope")]) == 0
    text = capsys.readouterr().out
    assert "idle on cuda:0" in text and "copy 81%" in text and "ensure_layer_1_weights" in text


def test_perfetto_and_chrome_exports_have_an_idle_track_with_each_slice(tmp_path: Path) -> None:
    import json

    from perfscope.dashboard.export.perfetto import export_trace, lean_report
    from tests.unit.test_trace_export import _read_pftrace

    r = read_kineto(weight_streaming().write(tmp_path / "t.json"))
    export_trace(r, tmp_path / "t.pftrace")
    got = _read_pftrace(tmp_path / "t.pftrace")
    assert got["slices"]["idle"] == len(r.idle) and got["durations"]["idle"] == int(r.idle["duration_ns"].sum())
    assert {n for n, p in got["tracks"].values() if p and got["tracks"][p][0] == "idle"} == {"cuda:0 idle causes"}
    copies = [a for a in got["args"] if a["_name"] == "copy"]
    assert len(copies) == int((r.idle["cause"] == "copy").sum())
    assert all(a["range"].startswith("ensure_layer_") and a["bytes"] == 4 << 20 for a in copies)
    # the chrome JSON of the saved folder, read lean, holds the same slices
    folder = r.save(tmp_path / "r.perfscope")
    export_trace(lean_report(folder), tmp_path / "t.json.out", format="chrome")
    events = [e for e in json.loads((tmp_path / "t.json.out").read_text())["traceEvents"] if e.get("cat") == "idle"]
    assert Counter(e["name"] for e in events) == Counter(r.idle["cause"])


def test_html_report_and_dashboard_show_a_bar_per_cause_and_click_lists_the_gaps(tmp_path: Path) -> None:
    from perfscope.dashboard import callbacks as cb
    from perfscope.dashboard import figures
    from perfscope.dashboard.html_report import render_html
    from perfscope.dashboard.store import ReportStore

    r = read_kineto(weight_streaming().write(tmp_path / "t.json"))
    fig = figures.idle_causes(r)
    bars = {t.customdata[0][1]: t.x[0] for t in fig.data}
    totals = cause_totals(r.idle)
    assert set(bars) == {c for c in CAUSES if totals.get(c, 0) > 0}  # a cause with no idle time is no empty row
    assert bars["copy"] * 1e6 == pytest.approx(cause_totals(r.idle)["copy"])
    assert "Why the GPU waits" in render_html(r)
    r.save(tmp_path / "runs" / "ws.perfscope")
    store = ReportStore([tmp_path / "runs"])
    (key,) = [e.key for e in store.entries()]
    assert cb.on_idle(store, key, "timeline").data  # the figure, on the timeline tab
    click = {"points": [{"customdata": ["cuda:0", "copy"]}]}
    listed = cb.on_idle_click(store, key, click)
    text = " ".join(str(t) for t in _strings(listed))
    n = int((r.idle["cause"] == "copy").sum())
    assert f"{n} copy gaps on cuda:0" in text and "ensure_layer_" in text and "cudaMemcpyAsync" in text


def _strings(component: object) -> list[str]:
    if isinstance(component, str):
        return [component]
    if isinstance(component, (list, tuple)):
        return [t for c in component for t in _strings(c)]
    if isinstance(component, dict):
        return [t for v in component.values() for t in _strings(v)]
    out = []
    for attr in ("children", "data", "rowData"):
        value = getattr(component, attr, None)
        if value is not None:
            out += _strings(value)
    return out


# ---------------------------------------------------------------------------- what the host did (issue 39)
def test_kinds_split_host_and_only_host(load) -> None:
    """Every host slice has one host kind and no other slice has one; the kinds add up to the causes."""
    from perfscope.analysis.idle import HOST_KINDS, kind_totals

    for name in (NANOVLLM, H200_EAGER, ALEXNET):
        idle = idle_of(load(name))
        host = idle["cause"] == "host"
        assert idle.loc[host, "host_kind"].isin(HOST_KINDS).all() and idle.loc[~host, "host_kind"].isna().all()
        kinds, causes = kind_totals(idle), cause_totals(idle)
        assert sum(kinds[k] for k in HOST_KINDS) == causes["host"]
        assert sum(kinds.values()) == sum(causes.values())
        # the gaps are numbered: slices of one gap lie between one piece of work and the next
        per_gap = idle.groupby("gap").agg(lo=("start_ns", "min"), hi=("end_ns", "max"), ns=("duration_ns", "sum"))
        assert (per_gap["hi"] - per_gap["lo"] == per_gap["ns"]).all()


def test_host_kv_attention_is_cpu_compute_in_attention_cpu_not_graphs(load) -> None:
    """nano-vllm with its KV cache in host memory (issue 39's second trace): the largest idle is the host
    computing attention on host tensors (aten::matmul / bmm in attention_cpu, the host-to-host copy_ in
    load_kvcache_cpu); the advice is to keep it on the GPU or overlap it, never CUDA graphs."""
    r = load(NANOVLLM)
    idle = idle_of(r)
    from perfscope.analysis.idle import kind_totals, largest_kind

    kinds = kind_totals(idle)
    assert largest_kind(kinds) == "cpu compute"
    compute = idle[idle["host_kind"] == "cpu compute"]
    by_fn = compute.groupby(compute["function"].astype(str).str.rsplit(": ", n=1).str[-1])["duration_ns"].sum()
    assert {"attention_cpu", "load_kvcache_cpu"} <= set(by_fn.index)
    assert by_fn["attention_cpu"] + by_fn["load_kvcache_cpu"] > 0.9 * kinds["cpu compute"]
    ops = set(compute.loc[compute["function"].astype(str).str.endswith("attention_cpu"), "op"])
    assert "aten::matmul" in ops
    # the host ops behind it ran on host tensors: no device call under them, and bmm inside matmul
    h = r.host[(r.host["kind"] == "op") & (r.host["name"] == "aten::matmul")]
    assert len(h) and (h["device_calls"] == 0).all() and h["host_compute"].all() and set(h["inner_op"]) == {"aten::bmm"}
    (f,) = RULES["gpu-idle"](r)
    assert f.evidence["idle_kind"] == "cpu compute"
    assert "mostly cpu compute in attention_cpu, load_kvcache_cpu" in f.title
    text = f.recommendation
    assert text.startswith("For") and "keep the tensors and the math on the GPU" in text and "overlap" in text
    assert not RECOMMENDS_GRAPHS.search(text)
    top = f.items[0] if f.items[0].attrs.get("kind") == "cpu compute" else f.items[1]
    assert top.attrs["kind"] == "cpu compute" and top.explains and np.isfinite(top.start_ns)
    assert f.explained_share > 0.9


def test_a_gap_that_opens_inside_cudaStreamSynchronize_is_that_syncs(load) -> None:
    """HTA's critical-path AlexNet trace: each copy of a batch from pageable host memory to the device (aten::to,
    16 HtoD transfers of 15 MB) ends in a cudaStreamSynchronize that returns after the GPU drained; the host then
    loads the next batch for up to ms while nothing is queued. That whole gap is ``sync``: it names the call, the
    direction of the copy it waited for, and the operator behind it, and the advice is to pin the batch."""
    r = load(ALEXNET)
    idle = idle_of(r)
    sync = idle[idle["cause"] == "sync"]
    big = sync.loc[sync["duration_ns"].idxmax()]
    assert big["api"] == "cudaStreamSynchronize (HtoD)" and big["op"] in ("aten::to", "aten::_to_copy")
    calls = r.api[r.api["name"] == "cudaStreamSynchronize"]
    gap = idle[idle["gap"] == big["gap"]]
    opened = int(gap["start_ns"].min())
    call = calls[(calls["start_ns"] <= opened) & (calls["end_ns"] >= opened)]
    assert len(call) == 1 and big["end_ns"] > int(call["end_ns"].iloc[0]) + 1_000_000  # long after it returned
    (f,) = RULES["gpu-idle"](r)
    items = [i for i in f.items if i.attrs.get("kind") == "sync"]
    assert items and items[0].attrs["api"] == "cudaStreamSynchronize (HtoD)"
    assert items[0].attrs["op"] in ("aten::to", "aten::_to_copy") and "could not queue ahead" in items[0].label
    # the sync is under 1% of this trace's idle time, so the finding does not advise on it; what it would say:
    text = sync_advice(1.0, idle)
    assert "100% (16 gaps) copied data from pageable host memory to the device (aten::to, aten::_to_copy" in text
    assert "results to the host" not in text


@pytest.mark.parametrize("name, says", [
    (A100, ("87% (829 gaps) called cudaDeviceSynchronize outside any operator (torch.cuda.synchronize()",
            "the other 13% (83 gaps) behind aten::to, aten::_to_copy.")),
    (H200_GRAPH, ("79% (4 gaps) copied data from pageable host memory to the device (aten::to", "in prefill",
                  "21% (24 gaps) called cudaDeviceSynchronize outside any operator", "in decode")),
    ("kineto/tracelens_h100__gaunernst_bert-small-uncased__1016001.json.gz",
     ("100% (2 gaps) branched on a device tensor (aten::is_nonzero",)),
    ("kineto/hta_rank_non_gpu__rank_non_gpu.json.gz", ("99% (4 gaps) read a value to the host (aten::item",)),
    ("kineto/tracelens_mi210__gpu_only_trace__gpu_only_trace.json.gz",
     ("100% (86 gaps) called hipDeviceSynchronize, and the trace records no operators",)),
    ("nsys/aws_t4_softmax.sqlite", ("called cudaDeviceSynchronize, and the trace records no operators",)),
])
def test_real_traces_sync_time_is_told_by_the_operator_behind_it(load, name: str, says: tuple[str, ...]) -> None:
    """Each real trace's sync time by the operator behind its calls: TorchRec's explicit synchronizes and a
    remainder under 10% named; the engine's pageable HtoD copies of its prefill inputs beside its per-step
    synchronize; a Python branch on a tensor (BERT-small); a value read (a non-GPU rank's .item()); and two traces
    that record no operators, which say so instead of guessing."""
    text = sync_advice(10.0, idle_of(load(name)))
    assert all(s in text for s in says), text


def test_a_part_of_the_gaps_without_operators_still_knows_the_trace_records_them(load) -> None:
    """A phase's gaps (idle_within) can hold syncs with no operator around them while the trace records operators
    elsewhere: those are explicit synchronisations, not a trace without operators."""
    idle = idle_of(load("kineto/hta_ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"))
    part = idle[(idle["cause"] == "sync").to_numpy() & idle["op"].isna().to_numpy()].iloc[:50]
    assert len(part) == 50 and part["op"].isna().all()
    labels = {g[0] for g in sync_groups(part)}
    assert labels == {"explicit"}, labels
    assert "outside any operator" in sync_advice(10.0, part) and "records no operators" not in sync_advice(10.0, part)
    # a trace that records none (a GPU-only trace) still says so
    bare = idle_of(load("kineto/tracelens_mi210__gpu_only_trace__gpu_only_trace.json.gz"))
    assert {g[0] for g in sync_groups(bare)} == {"unattributed"}


@pytest.mark.parametrize("name, says, not_says", [
    (VLLM_GRAPH, ("(1 replay), 100% in 420 gaps of 5 µs or less (median 1 ns), the device's own cost per node",),
     ("waited inside itself",)),
    (H200_GRAPH, ("(7 replays), 100% in 1,386 gaps of 5 µs or less (median 448 ns)", "fewer, larger nodes"),
     ("waited inside itself",)),
    (A100, ("(39 replays), 100% in 163 gaps over 5 µs (median 513 µs, the largest 6.28 ms)",
            "the graph waited inside itself on something the trace does not show", "debug_dump(path)"),
     ("fewer, larger nodes",)),
])
def test_graph_gaps_are_told_by_their_length(load, name: str, says: tuple[str, ...], not_says: tuple[str, ...]) -> None:
    """The time between a replay's nodes: sub-µs gaps (vLLM's FULL graph on the MI300X, the engine's on the H200)
    are the device's cost per node, which fewer nodes shorten; TorchRec's replays (HTA) wait 0.5-6 ms between
    nodes on one stream, which no per-node cost explains: a dependency inside the graph the trace does not show."""
    text = graph_gap_advice(10.0, idle_of(load(name)))
    assert all(s in text for s in says) and not any(s in text for s in not_says), text


@pytest.mark.parametrize("name", [VLLM_GRAPH, H200_GRAPH])
def test_gaps_inside_a_graph_replay_are_graph(load, name: str) -> None:
    """vLLM's FULL graph decode on MI300X (its host clock does not cover the GPU work, so the rest is
    unknown) and the engine's CUDA-graph run on H200: a gap between two kernels of one replay is ``graph``
    whatever the host does meanwhile; every graph gap has replay kernels of one correlation on both sides."""
    r = load(name)
    idle = idle_of(r)
    graph = idle[idle["cause"] == "graph"]
    assert len(graph)
    k = r.kernels.sort_values("start_ns")
    starts, ends, corr = k["start_ns"].to_numpy(), k["end_ns"].to_numpy(), k["correlation"].to_numpy()
    for s, e, c in zip(graph["start_ns"], graph["end_ns"], graph["correlation"]):
        before = corr[(ends <= s)][np.argmax(ends[ends <= s])]
        after = corr[starts >= e][0]
        assert before == after == c
    assert graph["api"].str.contains("GraphLaunch").all()
    # every gap inside the span of the largest replay is the graph's (the reading of the vLLM trace,
    # which called them unknown: the host clock of that trace does not cover the GPU work)
    replay = k[k["correlation"] == k["correlation"].value_counts().idxmax()]
    inside = idle[(idle["start_ns"] >= replay["start_ns"].min()) & (idle["end_ns"] <= replay["end_ns"].max())]
    assert len(inside) and (inside["cause"] == "graph").all()


def _layer_streaming_report(tmp_path: Path, fixtures_dir: Path, *, osrt: bool) -> Report:
    from perfscope.analysis.readers.nsys.reader import read_nsys_sqlite

    trace = layer_streaming(waits=("futex", "nanosleep"))
    out = write_nsys(trace, fixtures_dir / NSYS_TEMPLATE, tmp_path / "t.sqlite",
                     fixtures_dir / OSRT_TEMPLATE if osrt else None)
    return read_nsys_sqlite(out)


def test_weight_staging_with_os_waits_is_waiting_in_ensure_layer_not_graphs(tmp_path: Path, fixtures_dir: Path) -> None:
    """Issue 39's first trace, built as an nsys export (the real schema, plus an OSRT_API table of the real
    schema): per layer a 10 ms futex / nanosleep inside ``ensure_layer_N_weights`` with no CUDA call, among
    ~2,000 gaps of 1 µs between back-to-back launches. The gap sizes are weighted by time, the finding says
    waiting in ensure_layer_N_weights, and it does not recommend CUDA graphs."""
    r = _layer_streaming_report(tmp_path, fixtures_dir, osrt=True)
    assert set(r.host["kind"]) == {"wait"} and set(r.host["name"]) == {"futex", "nanosleep"}
    (f,) = RULES["gpu-idle"](r)
    ev = f.evidence
    assert ev["idle_kind"] == "waiting" and ev["idle_waiting_pct"] > 95
    assert "mostly waiting in ensure_layer_N_weights" in f.title
    # 63 gaps of 10 ms (the first layer's staging comes before the first GPU work), 1,984 gaps of 1 µs
    assert ev["gap_sizes"] == "631 ms in 63 gaps of 10 ms; 1,984 gaps under 5 µs add 1.98 ms"
    waits = [i for i in f.items if i.attrs.get("kind") == "waiting"]
    assert {i.attrs["wait"] for i in waits} == {"futex", "nanosleep"}
    assert all(i.attrs["range"] == "ensure_layer_N_weights" and i.attrs["gaps"] >= 31 for i in waits)
    assert "futex" in f.recommendation and "ensure_layer_N_weights" in f.recommendation
    assert not RECOMMENDS_GRAPHS.search(f.recommendation) and RULES["launch-overhead"](r) == []
    assert f.explained_share > 0.99


@pytest.mark.parametrize("waits, says", [
    (("futex", "nanosleep"), ("57% slept (nanosleep): a sleep in the loop", "43% waited on a lock, another thread or "
                              "a process (futex)")),
    (("read",), ("100% did file or network I/O (read): read ahead or cache it",)),
    (("ioctl",), ("100% was in driver calls (ioctl)", "the trace does not say which")),
    (("epoll_wait",), ("100% waited for a file or socket to be ready (epoll_wait)",)),
    (("weird_call",), ("100% blocked in weird_call, a blocking call perfscope does not classify",)),
])
def test_wait_advice_follows_the_call_the_host_blocked_in(tmp_path: Path, fixtures_dir: Path, waits: tuple[str, ...],
                                                          says: tuple[str, ...]) -> None:
    """Issue 39's weight staging with the host blocked in other OS calls: the advice is the one for what it blocked
    in (a sleep, a lock or another thread, a file or socket, I/O, the driver), by share, and a call it does not
    know is named as such, not given another's advice."""
    from perfscope.analysis.readers.nsys.reader import read_nsys_sqlite

    out = write_nsys(layer_streaming(layers=8, waits=waits), fixtures_dir / NSYS_TEMPLATE, tmp_path / "t.sqlite",
                     fixtures_dir / OSRT_TEMPLATE)
    (f,) = RULES["gpu-idle"](read_nsys_sqlite(out))
    text = f.recommendation
    assert f.evidence["idle_kind"] == "waiting" and "in ensure_layer_N_weights" in text
    assert all(s in text for s in says), text
    others = [adv for lab, pat, _, adv in WAIT_CLASSES if not any(pat.match(w) for w in waits)]
    assert not any(adv in text for adv in others), text
    assert not RECOMMENDS_GRAPHS.search(text)


def test_weight_staging_without_os_runtime_rows_is_host_code_in_the_range(tmp_path: Path, fixtures_dir: Path) -> None:
    """The same export recorded without --trace=osrt: the host's time in ensure_layer_N_weights is its own
    code, named by the range only; still no CUDA-graph advice."""
    r = _layer_streaming_report(tmp_path, fixtures_dir, osrt=False)
    assert not len(r.host)
    (f,) = RULES["gpu-idle"](r)
    assert f.evidence["idle_kind"] == "host code" and "mostly host code in ensure_layer_N_weights" in f.title
    assert "Move or overlap this host work" in f.recommendation and not RECOMMENDS_GRAPHS.search(f.recommendation)


PLANTED = """\
import time

import numpy as np
import torch

import perfscope.engine.decoding as decoding
from perfscope.engine.generate import build_model, generate

original = decoding.sample


def planted(logits, params, gen):
    with torch.profiler.record_function("planted_wait"):
        time.sleep(0.004)
    with torch.profiler.record_function("planted_math"):
        host = np.random.default_rng(0).random((48, 48))
        np.linalg.svd(host @ host.T)
    with torch.profiler.record_function("planted_sync"):
        logits.sum().item()
    return original(logits, params, gen)


decoding.sample = planted
try:
    generate(build_model("tiny"), [[1, 2, 3, 4, 5, 6, 7, 8]], 3)
finally:
    decoding.sample = original  # the script runs in the test's process: leave the engine as it was
"""


def test_engine_script_with_planted_wait_math_and_sync(tmp_path: Path) -> None:
    """The reference engine run on the CPU by a small script under ``perfscope profile --stack -- python
    script.py`` (profile_script), with host work planted around each sampling: a ``time.sleep`` in a named
    range is waiting (the sleep and the range named), numpy math on host arrays between the operators is cpu
    compute, and a ``.item()`` is sync."""
    pytest.importorskip("torch")
    from perfscope.device import DeviceSpec
    from perfscope.sessions.profile import profile_script

    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    r = profile_script([sys.executable, str(script)], device="cpu", roofs=DeviceSpec(name="cpu", kind="cpu"),
                       baseline=False, stack=True)
    from perfscope.engine import decoding

    assert decoding.sample.__name__ == "sample"  # the script put the engine back as it found it
    idle = idle_of(r)
    sleeps = r.ranges[r.ranges["name"] == "planted_wait"]
    assert len(sleeps) == 3
    waited = idle[(idle["range"] == "planted_wait") & (idle["host_kind"] == "waiting")]
    assert set(waited["wait"]) == {"sleep"} and waited["duration_ns"].sum() >= 3 * 0.004e9 * 0.99
    # against the trace's own record of the numpy calls, not against how long they took beside the rest of the
    # range (a loaded machine, or BLAS threads, make the 48 x 48 svd take 0.1-50 ms): every idle slice inside an
    # svd call is cpu compute, and those slices hold the svd calls' whole time
    h = r.host
    svd = h[(h["kind"].astype(str) == "math") & h["name"].astype(str).str.match(r"numpy\.linalg\.(_linalg|linalg)\.svd$")]
    assert len(svd) == 3
    s0, s1 = svd["start_ns"].to_numpy(np.int64), svd["end_ns"].to_numpy(np.int64)
    mid = (idle["start_ns"].to_numpy(np.int64) + idle["end_ns"].to_numpy(np.int64)) // 2
    in_svd = ((mid[:, None] >= s0) & (mid[:, None] < s1)).any(axis=1)
    inside = idle[in_svd]
    assert set(inside["range"]) == {"planted_math"} and set(inside["host_kind"]) == {"cpu compute"}
    assert inside["duration_ns"].sum() >= 0.99 * float((s1 - s0).sum())
    math = idle[(idle["range"] == "planted_math") & (idle["host_kind"] == "cpu compute")]  # numpy < 2: linalg.linalg
    assert {"numpy.linalg._linalg.svd", "numpy.linalg.linalg.svd"} & set(math["op"])
    sync = idle[(idle["range"] == "planted_sync") & (idle["cause"] == "sync")]
    assert len(sync) and set(sync["op"]) == {"aten::item"}
    # the functions the host was in are the script's own
    assert waited["function"].astype(str).str.contains("planted").all()


def test_no_finding_recommends_cuda_graphs_unless_dispatch_or_launch_leads(fixtures_dir: Path) -> None:
    """Every committed trace and report: a finding whose advice captures CUDA graphs (or names a framework's
    graph setting) has gaps whose largest share is dispatch or launch (its own gap items, else its device's)."""
    from perfscope.analysis.findings import run_rules
    from perfscope.analysis.idle import GRAPH_KINDS, kind_totals, largest_kind
    from perfscope.analysis.readers.detect import import_file

    names = [*FIXTURES, NANOVLLM, *(f"crossgpu/{p.relative_to(fixtures_dir / 'crossgpu')}"
                                    for p in sorted((fixtures_dir / "crossgpu").rglob("*.json.gz")))]
    reports = [import_file(fixtures_dir / n) for n in dict.fromkeys(names)]
    reports += [Report.load(p) for p in sorted(fixtures_dir.rglob("*.perfscope")) if (p / "manifest.json").is_file()]
    checked = 0
    for r in reports:
        idle = idle_of(r)
        for f in run_rules(r):
            if not RECOMMENDS_GRAPHS.search(f.recommendation):
                continue
            mine: dict[str, float] = {}
            for i in f.items:
                if i.attrs.get("kind") and np.isfinite(i.time_ns):
                    mine[str(i.attrs["kind"])] = mine.get(str(i.attrs["kind"]), 0.0) + i.time_ns
            device = f.evidence.get("device")
            totals = mine or kind_totals(idle, str(device) if device else None)
            assert largest_kind(totals) in GRAPH_KINDS, (r.name, f.id, totals, f.recommendation[:200])
            checked += 1
    assert checked  # the eager traces (B200 vLLM, the H200 engine) do get graph advice


def test_gap_sizes_are_weighted_by_time() -> None:
    from perfscope.analysis.idle import gap_size_buckets, gap_sizes_text

    lengths = np.array([10_000_000] * 64 + [1_000] * 1983, dtype=float)
    assert gap_sizes_text(lengths) == "640 ms in 64 gaps of 10 ms; 1,983 gaps under 5 µs add 1.98 ms"
    (big, small) = gap_size_buckets(lengths)
    assert big["gaps"] == 64 and big["time_ns"] == 640e6 and small["gaps"] == 1983 and small["hi_ns"] == 5_000
    # the last bucket has no upper edge: "of 50 ms or longer", never "50 ms-n/a" (the T4 nsys export's 277 ms gap)
    lengths = np.array([2_000_000] * 300 + [277_000_000], dtype=float)
    assert gap_sizes_text(lengths) == "600 ms in 300 gaps of 2 ms; 1 gap of 50 ms or longer add 277 ms"


# ---------------------------------------------------------------------------- the other timeline and copy findings' items
def _kinds_of_items(f) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in f.items:
        if i.attrs.get("kind"):
            out[str(i.attrs["kind"])] = out.get(str(i.attrs["kind"]), 0.0) + i.time_ns
    return out


def test_copy_findings_list_their_copies_and_explain_their_time(load) -> None:
    """copies-exposed and pageable-copies on AlexNet (16 pageable copies) and the T4 export: one item per group
    of copies (kind, host memory), their times add up to the time at stake, each placed at its largest copy."""
    for name in (ALEXNET, "nsys/aws_t4_softmax.sqlite"):
        r = load(name)
        for rule in ("copies-exposed", "pageable-copies"):
            for f in RULES[rule](r):
                assert f.items and sum(i.time_ns for i in f.items) == pytest.approx(f.time_at_stake_ns, rel=1e-9)
                assert f.explained_share == pytest.approx(1.0)
                assert all(i.kind in ("copy", "copies") and np.isfinite(i.start_ns) and i.end_ns > i.start_ns
                           for i in f.items)
    (page,) = RULES["pageable-copies"](load(ALEXNET))
    assert sum(int(i.attrs["copies"]) for i in page.items) == 16 and "pageable" in page.items[0].label


def test_serialized_streams_list_each_stream_and_name_the_event_waits(load) -> None:
    """HTA's multi-stream event-sync trace: one item per stream other than the busiest, with its kernel time
    while the busiest idles; the advice names the cudaStreamWaitEvent calls the trace shows."""
    (f,) = RULES["serialized-streams"](load(EVENT_SYNC))
    assert {i.attrs["stream"] for i in f.items} == {s for s in (20, 24, 28) if s != f.evidence["busiest_stream"]}
    assert sum(i.time_ns for i in f.items) >= f.time_at_stake_ns and f.explained_share == pytest.approx(1.0)
    assert "cudaStreamWaitEvent" in f.recommendation and f.evidence["cudaStreamWaitEvent_calls"] == 1


def test_launch_bound_items_are_the_launch_slices(tmp_path: Path) -> None:
    r = read_kineto(launch_bound().write(tmp_path / "t.json"))
    (f,) = RULES["launch-overhead"](r)
    assert set(_kinds_of_items(f)) == {"launch"} and f.explained_share == pytest.approx(1.0)
    assert RECOMMENDS_GRAPHS.search(f.recommendation)


@pytest.mark.parametrize("name, lead", [(H200_EAGER, "dispatch"), (A100, "copy")])
def test_short_kernels_weigh_the_gaps_in_front_of_them(load, name: str, lead: str) -> None:
    """The gaps in front of the short kernels, by kind: on the eager H200 engine they are dispatch, and the
    advice fuses and captures graphs; on the A100 training trace they are mostly copies, and neither is
    advised."""
    fs = RULES["short-kernels"](load(name))
    assert fs
    for f in fs:
        kinds = _kinds_of_items(f)
        assert sum(kinds.values()) == pytest.approx(f.time_at_stake_ns)
        top = max(kinds, key=lambda k: kinds[k])
        assert f.evidence["gaps_before_short_kind"] == top
        assert bool(RECOMMENDS_GRAPHS.search(f.recommendation)) == (top in ("dispatch", "launch"))
        assert top == lead


def test_launch_time_in_a_few_blocked_calls_is_not_sent_to_cuda_graphs(load) -> None:
    """TraceLens's MI300X normalization test: launch calls take 1.09 s against 992 µs of kernels, but ten calls of
    1 ms or more (the longest 332 ms) hold nearly all of it: blocked calls (module loading), not the per-launch cost.
    The advice says so, with the other calls' median, and does not recommend CUDA graphs."""
    from perfscope.analysis.rules._gaps import LONG_LAUNCH_NS

    r = load("memory/tracelens_mi300x_normalization_profile_memory/normalization_layer_test.json.gz")
    (f,) = RULES["launch-overhead"](r)
    assert f.evidence["long_launch_calls"] == 10
    assert f.evidence["long_launch_calls_ns"] >= 0.5 * f.evidence["launch_api_ns"]
    assert f"call(s) of {LONG_LAUNCH_NS // 1_000_000} ms or longer" in f.recommendation
    assert "these calls were blocked" in f.recommendation and not RECOMMENDS_GRAPHS.search(f.recommendation)
