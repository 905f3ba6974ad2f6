"""``perfscope export`` of a load test's requests: one ``requests`` track group, each request a slice
from its send to its end on as few lanes as overlapping requests need, with TTFT (send to first
token, holding queued and prefill where the engine recorded the admission) and decode parts.

Real load tests: the reference engine served on the CPU under torch.profiler (requests and kernels
on one clock), an endpoint load test against the fault-injecting server of
test_endpoint_loadtest (requests only, failures among them), transformers ``generate()``. The
protobuf is read back with Perfetto's own ``perfetto_trace_pb2`` and the slices rebuilt per track
as Perfetto does (packets sorted by time, stably: a begin opens a slice, an end closes the last open
one of its track); the Chrome JSON is read as JSON.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfscope.analysis.summaries.server_timeline import request_times_ns
from perfscope.cli import main
from perfscope.dashboard.export.perfetto import export_trace, lanes, lean_report
from perfscope.device import DeviceSpec
from perfscope.report import Report
from tests.unit.test_endpoint_loadtest import KINDS, _dataset, fault_server  # noqa: F401 - a fixture

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

CPU = DeviceSpec("cpu", "cpu")


# ---------------------------------------------------------------- reading the files back
def _proto_slices(path: Path) -> tuple[dict[int, tuple[str, int]], list[dict]]:
    """Tracks (uuid -> (name, parent uuid)) and every slice: name, track, start, end, depth, parent
    index, args; rebuilt per track from the time-sorted packets, as the trace processor does."""
    trace = pb.Trace.FromString(path.read_bytes())
    tracks: dict[int, tuple[str, int]] = {}
    names: dict[int, str] = {}
    events = []
    for i, p in enumerate(trace.packet):
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = (p.track_descriptor.name, p.track_descriptor.parent_uuid)
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        if p.HasField("track_event") and p.track_event.type in (pb.TrackEvent.TYPE_SLICE_BEGIN,
                                                                 pb.TrackEvent.TYPE_SLICE_END):
            events.append((p.timestamp, i, p.track_event))
    events.sort(key=lambda e: (e[0], e[1]))  # stable on ties: the file's order
    slices: list[dict] = []
    open_: dict[int, list[int]] = defaultdict(list)
    for ts, _, ev in events:
        stack = open_[ev.track_uuid]
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            args = {a.name: (a.string_value if a.HasField("string_value") else
                             a.int_value if a.HasField("int_value") else a.double_value) for a in ev.debug_annotations}
            slices.append({"i": len(slices), "name": names[ev.name_iid], "track": ev.track_uuid, "start": ts, "end": None,
                           "depth": len(stack), "parent": stack[-1] if stack else None, "args": args})
            stack.append(len(slices) - 1)
        else:
            slices[stack.pop()]["end"] = ts
    assert all(not s for s in open_.values())
    return tracks, slices


def _request_slices_proto(path: Path) -> tuple[list[dict], dict[int, str]]:
    tracks, slices = _proto_slices(path)
    group = [u for u, (name, parent) in tracks.items() if name == "requests" and not parent]
    lanes_ = {u: name for u, (name, parent) in tracks.items() if group and parent == group[0]}
    assert len(group) <= 1
    return [s for s in slices if s["track"] in lanes_], lanes_


def _chrome_request_slices(path: Path) -> tuple[list[dict], dict]:
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    pids = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    req_pid = [p for p, n in pids.items() if n == "requests"]
    assert len(req_pid) <= 1
    out = [e for e in events if e["ph"] == "X" and req_pid and e["pid"] == req_pid[0]]
    assert all(e["cat"] == "request" for e in out)
    return out, doc


def _check_lanes(parents: list[dict], key: str = "track") -> None:
    """No two requests on one lane overlap (nor touch)."""
    by_lane = defaultdict(list)
    for s in parents:
        by_lane[s[key]].append((s["start"], s["end"]))
    for spans in by_lane.values():
        spans.sort()
        assert all(a_end < b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def _max_open(start: np.ndarray, end: np.ndarray) -> int:
    """The most intervals [start, end] open at one instant (touching ends count as open together)."""
    events = sorted([(int(s), 0) for s in start] + [(int(e), 1) for e in end])  # a start before an end at a tie
    best = cur = 0
    for _, kind in events:
        cur += 1 if kind == 0 else -1
        best = max(best, cur)
    return best


# ---------------------------------------------------------------- lanes
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=60))
def test_lanes_never_overlap_and_are_as_few_as_the_most_requests_open_at_once(spans: list[tuple[int, int]]) -> None:
    start = np.array([s for s, _ in spans], dtype="int64")
    end = start + np.array([d for _, d in spans], dtype="int64")
    lane = lanes(start, end)
    _check_lanes([{"track": int(k), "start": int(s), "end": int(e)} for k, s, e in zip(lane, start, end)])
    assert lane.max() + 1 == _max_open(start, end)
    # lowest free lane: lane k > 0 is taken only while lanes 0 .. k-1 are all busy
    for i in range(len(start)):
        busy = {int(lane[j]) for j in range(len(start)) if j != i and start[j] <= start[i] <= end[j]
                and (start[j], end[j], j) < (start[i], end[i], i)}
        assert all(k in busy for k in range(int(lane[i])))


# ---------------------------------------------------------------- the engine's load test, profiled
@pytest.fixture(scope="module")
def engine_lt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profiled load test of the tiny engine at two rates (the second one queues: 8 requests
    arrive at once for 4 KV slots), saved."""
    from perfscope.engine.generate import build_model
    from perfscope.sessions.loadtest import LoadRun, run_loadtest

    run = LoadRun(model="tiny", rates=(5.0, 200.0), requests=8, prompt_len="uniform:4,16", output_len="uniform:1,6",
                  max_batch=4, profile=True)
    report = run_loadtest(run, model=build_model("tiny", seed=0), roofs=CPU)
    return report.save(tmp_path_factory.mktemp("lt") / "engine-lt.perfscope")


def _expected(report: Report) -> pd.DataFrame:
    """The report's requests with their times in ns on the trace (object columns of Python ints:
    epoch ns do not fit a float): the run's offset measured here from its steps' two clocks."""
    r = report.requests.copy()
    offset = {}
    for run, g in report.steps.groupby("run"):
        offsets = [int(e) - round(float(s) * 1e9) for e, s in zip(g["end_ns"], g["end_s"])]
        d, n = sorted(o - offsets[0] for o in offsets), len(offsets)
        offset[run] = offsets[0] + round(d[n // 2] if n % 2 else (d[n // 2 - 1] + d[n // 2]) / 2)
    for col in ("arrival", "admitted", "first_token", "end"):
        r[f"{col}_ns"] = pd.Series([offset[run] + round(float(x) * 1e9) for run, x in zip(r["run"], r[f"{col}_s"])],
                                   index=r.index, dtype=object)
    return r


def test_engine_requests_in_the_pftrace_are_the_reports_on_the_kernels_clock(engine_lt: Path, tmp_path: Path) -> None:
    report = Report.load(engine_lt)
    req = _expected(report)
    out = tmp_path / "lt.pftrace"
    stats = export_trace(report, out)
    slices, lane_names = _request_slices_proto(out)
    parents = [s for s in slices if s["depth"] == 0]
    assert len(parents) == len(req) == stats.requests == stats.slices["request"] == 16
    assert len(lane_names) == stats.request_lanes
    _check_lanes(parents)
    # as few lanes as the most requests open at once
    assert stats.request_lanes == _max_open(req["arrival_ns"].to_numpy(), req["end_ns"].to_numpy())
    by_id = {(s["args"]["run"], s["args"]["request_id"]): s for s in parents}
    assert len(by_id) == len(req)
    steps_end = report.steps["end_ns"].to_numpy("int64")
    k0, k1 = int(report.kernels["start_ns"].min()), int(report.kernels["end_ns"].max())
    queued = 0
    for row in req.itertuples():
        s = by_id[(row.run, row.request_id)]
        assert s["name"] == "request"
        assert abs(s["start"] - row.arrival_ns) <= 1
        assert abs((s["end"] - s["start"]) - row.e2e_s * 1e9) <= 2
        assert s["args"]["prompt_tokens"] == row.prompt_tokens and s["args"]["output_tokens"] == row.output_tokens
        assert s["args"]["ttft_ms"] == pytest.approx(row.ttft_s * 1e3, rel=1e-12)
        parts = {c["name"]: c for c in slices if c["parent"] == s["i"]}
        ttft = parts["TTFT"]
        assert ttft["start"] == s["start"] and abs((ttft["end"] - ttft["start"]) - row.ttft_s * 1e9) <= 2
        if row.output_tokens > 1:
            assert parts["decode"]["start"] == ttft["end"] and parts["decode"]["end"] == s["end"]
        else:
            assert set(parts) == {"TTFT"}
        inner = {c["name"]: c for c in slices if c["parent"] == ttft["i"]}
        if row.admitted_s > row.arrival_s:
            queued += 1
            assert abs((inner["queued"]["end"] - inner["queued"]["start"]) - (row.admitted_s - row.arrival_s) * 1e9) <= 2
            assert inner["prefill"]["start"] == inner["queued"]["end"] and inner["prefill"]["end"] == ttft["end"]
        # the same clock as the kernels: the first token is made at the end of a step (the engine's
        # own clock and the trace's agree to well under a millisecond), inside the kernels' span
        assert np.abs(steps_end - ttft["end"]).min() < 1_000_000
        assert k0 <= ttft["end"] <= k1 + 1_000_000
    assert queued >= 4  # rate=200: 8 requests at once for 4 slots


def test_engine_requests_in_chrome_json(engine_lt: Path, tmp_path: Path) -> None:
    report = Report.load(engine_lt)
    req = _expected(report)
    out = tmp_path / "lt.json"
    export_trace(report, out, format="chrome")
    events, doc = _chrome_request_slices(out)
    origin = doc["otherData"]["origin_ns"]
    parents = [e for e in events if e["name"].startswith("request")]
    assert len(parents) == len(req)
    _check_lanes([{"track": e["tid"], "start": e["ts"], "end": e["ts"] + e["dur"]} for e in parents])
    children = defaultdict(list)
    for e in events:
        if not e["name"].startswith("request"):
            children[e["tid"]].append(e)
    for row in req.itertuples():
        e = next(p for p in parents if p["args"]["run"] == row.run and p["args"]["request_id"] == row.request_id)
        assert e["ts"] * 1000 == pytest.approx(row.arrival_ns - origin, abs=2)
        assert e["dur"] * 1000 == pytest.approx(row.e2e_s * 1e9, abs=2)
        ttft = next(c for c in children[e["tid"]] if c["name"] == "TTFT" and c["ts"] == e["ts"])
        assert ttft["dur"] * 1000 == pytest.approx(row.ttft_s * 1e9, abs=2)
        assert e["args"]["e2e_ms"] == pytest.approx(row.e2e_s * 1e3, rel=1e-12)
    # every part lies inside a request of its lane
    for tid, parts in children.items():
        spans = [(p["ts"], p["ts"] + p["dur"]) for p in parents if p["tid"] == tid]
        assert all(any(a - 1e-3 <= c["ts"] and c["ts"] + c["dur"] <= b + 1e-3 for a, b in spans) for c in parts)


def test_folder_export_reads_the_requests_lean_and_writes_the_same_file(engine_lt: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.analysis.findings import run_rules

    found = run_rules(Report.load(engine_lt))  # the rules read the loaded report; the lean one is given them
    for fmt in ("perfetto", "chrome"):
        a = export_trace(Report.load(engine_lt), tmp_path / f"a.{fmt}", format=fmt)
        b = export_trace(lean_report(engine_lt), tmp_path / f"b.{fmt}", format=fmt, findings=found)
        assert a.slices == b.slices and a.requests == b.requests == 16
        assert (tmp_path / f"a.{fmt}").read_bytes() == (tmp_path / f"b.{fmt}").read_bytes()
    assert main(["export", str(engine_lt), "-o", str(tmp_path / "c.pftrace")]) == 0
    assert f"requests: 16 on {a.request_lanes} lane(s)" in capsys.readouterr().out


# ---------------------------------------------------------------- an endpoint load test: requests only, failures
def test_endpoint_requests_only_with_failures(tmp_path: Path, fault_server: str,  # noqa: F811 - the fixture
                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = _dataset(tmp_path, KINDS)
    folder = tmp_path / "ep.perfscope"
    assert main(["loadtest", "--endpoint", fault_server, "--dataset", str(data), "--rate", "40", "--requests", "14",
                 "--timeout", "1", "--json", "--no-html", "--out", str(folder)]) == 0
    capsys.readouterr()
    report = Report.load(folder)
    req = report.requests
    assert len(report.kernels) == 0 and len(report.steps) == 0 and (req["status"] != "ok").sum() == 8
    t0 = report.params["loadtest"]["runs"][0]["t0_perf_counter_ns"]
    out = tmp_path / "ep.pftrace"
    stats = export_trace(lean_report(folder), out)
    tracks, all_slices = _proto_slices(out)
    assert {name for name, parent in tracks.values() if not parent} == {"requests"}  # nothing but requests
    slices, _ = _request_slices_proto(out)
    assert len(all_slices) == len(slices)
    parents = [s for s in slices if s["depth"] == 0]
    assert len(parents) == len(req) == stats.requests == 14
    _check_lanes(parents)
    for row in req.itertuples():
        s = next(p for p in parents if p["args"]["request_id"] == row.request_id)
        assert s["start"] == t0 + round(row.arrival_s * 1e9)
        assert abs((s["end"] - s["start"]) - (row.end_s - row.arrival_s) * 1e9) <= 2
        parts = {c["name"]: c for c in slices if c["parent"] == s["i"]}
        if row.status == "ok":
            assert s["name"] == "request" and "error" not in s["args"]
            assert abs((parts["TTFT"]["end"] - parts["TTFT"]["start"]) - row.ttft_s * 1e9) <= 2
            assert s["args"]["e2e_ms"] == pytest.approx(row.e2e_s * 1e3)
        else:  # failed: named and argued by its kind, with the error; no latency args
            assert s["name"] == f"request: {row.status}" and s["args"]["status"] == row.status
            assert s["args"]["error"] == row.error
            assert "ttft_ms" not in s["args"] and "e2e_ms" not in s["args"]
            assert ("TTFT" in parts) == (row.first_token_s == row.first_token_s)  # a token came before the failure
        assert s["args"]["dispatch_delay_ms"] == pytest.approx(row.dispatch_delay_s * 1e3)
    kinds = {p["args"]["status"] for p in parents}
    assert kinds == {"ok", "http_error", "broken_stream", "empty_output", "timeout"}
    # Chrome: the same requests, named by status
    export_trace(report, tmp_path / "ep.json", format="chrome")
    events, _ = _chrome_request_slices(tmp_path / "ep.json")
    chrome_parents = [e for e in events if e["name"].startswith("request")]
    assert sorted(e["name"] for e in chrome_parents) == sorted(p["name"] for p in parents)
    # Ctrl-C: a request never sent and one in flight (cancelled, no end) have no interval: counted in notes
    cut = req.copy()
    cut.loc[0, ["arrival_s", "first_token_s", "end_s"]] = np.nan
    cut.loc[0, "status"] = "not_sent"
    cut.loc[1, ["end_s"]] = np.nan
    cut.loc[1, "status"] = "cancelled"
    stats = export_trace(report.replace(requests=cut), tmp_path / "cut.pftrace")
    assert stats.requests == 12
    assert stats.notes == ["1 request(s) without a send time (not sent, or a batch generate() that records none): "
                           "not drawn", "1 request(s) sent but without an end (cancelled): not drawn"]


# ---------------------------------------------------------------- reports without requests on the timeline
def test_no_requests_no_request_group(sample_reports_dir: Path, tmp_path: Path) -> None:
    h200 = Report.load(sample_reports_dir / "h200-llama1b-cudagraph-kineto.perfscope")
    assert len(h200.requests) == 0 and len(h200.kernels)
    stats = export_trace(h200, tmp_path / "a.pftrace")
    assert stats.requests == 0 and "request" not in stats.slices and not stats.notes
    tracks, _ = _proto_slices(tmp_path / "a.pftrace")
    assert "requests" not in {name for name, _ in tracks.values()}
    export_trace(h200, tmp_path / "a.json", format="chrome")
    assert _chrome_request_slices(tmp_path / "a.json")[0] == []
    # a batch generate() of the engine: a request row without times on the run's clock
    engine = Report.load(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope")
    assert len(engine.requests) == 1 and engine.requests["arrival_s"].isna().all()
    stats = export_trace(engine, tmp_path / "b.pftrace")
    assert stats.requests == 0 and "request" not in stats.slices
    assert stats.notes == ["1 request(s) without a send time (not sent, or a batch generate() that records none): "
                           "not drawn"]


def test_steps_without_the_runs_clock_leave_requests_off_the_timeline() -> None:
    """Server steps whose clock offset to the client was unknown (start_s/end_s NaN): the requests
    cannot be put next to the kernels, and the note says so."""
    requests = pd.DataFrame({"run": ["rate=1"] * 2, "arrival_s": [0.1, 0.2], "first_token_s": [0.15, 0.3],
                             "end_s": [0.2, 0.4]})
    steps = pd.DataFrame({"run": ["rate=1"], "start_ns": [10**18], "end_ns": [10**18 + 5000],
                          "start_s": [np.nan], "end_s": [np.nan]})
    times, notes = request_times_ns(requests, steps)
    assert times["arrival_ns"].isna().all()
    assert notes == ["2 request(s) of run rate=1 not placed on the timeline: no step holds both the run's clock and "
                     "the trace's (end_s and end_ns)"]


# ---------------------------------------------------------------- transformers generate()
def test_hf_generate_requests_sit_on_their_calls_steps(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import perfscope
    from tests.integration.test_hf_generate import _generate, tiny

    model = tiny("qwen2")
    with perfscope.profile(roofs=CPU) as run:
        _generate(model, new=4, min_new_tokens=4)
        _generate(model, new=3, min_new_tokens=3)
    report = run.report
    assert len(report.requests) == 4 and set(report.requests["generate_call"]) == {0, 1}
    stats = export_trace(report, tmp_path / "hf.pftrace")
    slices, _ = _request_slices_proto(tmp_path / "hf.pftrace")
    parents = [s for s in slices if s["depth"] == 0]
    assert len(parents) == stats.requests == 4
    _check_lanes(parents)
    steps = report.steps
    calls = dict(zip(report.requests["request_id"], report.requests["generate_call"]))
    for s in parents:
        call = steps[steps["generate_call"] == calls[s["args"]["request_id"]]]
        ttft = next(c for c in slices if c["parent"] == s["i"] and c["name"] == "TTFT")
        assert ttft["end"] == int(call["end_ns"].iloc[0])  # the first token: the end of the call's prefill
        # the last token: the end of the call's last step, within the host's jitter of the two clocks
        assert abs(s["end"] - int(call["end_ns"].iloc[-1])) < 0.05 * (s["end"] - s["start"])
