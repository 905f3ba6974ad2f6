"""Serving tails (issue 42): each request's latency split into the causes that made it, checked
against the engine scheduler's own log, and the tail finding's decisions on planted workloads.

The engine runs for real (the tiny model, its slot KV cache, its scheduler) on a virtual clock that a
cost model advances by each forward's padded tokens (:class:`TimedExecutor`: 2 ms plus 50 us per padded
token), so every time, and every decision, is the same on any machine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.device import DeviceSpec
from perfscope.engine.serving import LoadRequest, ServeConfig, SimClock, TimedExecutor, serve

CPU = DeviceSpec("cpu", "cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: the times are the cost model's, and on a shared machine two threads of a tiny
    model's forward spin against each other (30x slower here under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    from perfscope.engine.generate import build_model

    return build_model("tiny", seed=0)


@pytest.fixture(scope="module")
def planted_lengths(tmp_path_factory) -> str:
    """Every tenth prompt 480 tokens long among 16-token prompts (the issue's workload)."""
    path = tmp_path_factory.mktemp("tails") / "lens.txt"
    path.write_text("\n".join(["16"] * 9 + ["480"]) + "\n")
    return str(path)


def _loadtest(tiny, **opts):
    from perfscope.sessions.loadtest import LoadRun, run_loadtest

    run = LoadRun(model="tiny", **{"profile": False, **opts})
    return run_loadtest(run, model=tiny, roofs=CPU, clock_factory=SimClock,
                        executor_wrap=lambda engine, clock: TimedExecutor(engine, clock))


@pytest.fixture(scope="module")
def planted(tiny, planted_lengths):
    return _loadtest(tiny, rates=(100.0,), requests=50, prompt_len=planted_lengths, output_len="32", max_batch=16)


@pytest.fixture(scope="module")
def chunked(tiny, planted_lengths):
    return _loadtest(tiny, rates=(100.0,), requests=50, prompt_len=planted_lengths, output_len="32", max_batch=16,
                     max_batched_tokens=64)


def _top(entry: dict) -> str:
    return max(entry["parts"], key=entry["parts"].get)


# ---------------------------------------------------------------- additivity against the scheduler's log
@pytest.mark.parametrize("config", [ServeConfig(8), ServeConfig(8, 40), ServeConfig(4, kv_capacity=70),
                                    ServeConfig(3, None, policy="static")])
def test_parts_add_up_to_each_latency_against_the_schedulers_log(tiny, config):
    from perfscope.analysis.summaries.tails import PARTS, split_run
    from perfscope.engine.serving import SlotEngine
    from perfscope.report import Report
    from perfscope.sessions.loadtest import request_frame, request_steps_frame, step_frame

    rng = np.random.default_rng(4)
    reqs = [LoadRequest(i, float(t), tuple(rng.integers(0, 512, int(n)).tolist()), int(o))
            for i, (t, n, o) in enumerate(zip(np.cumsum(rng.exponential(0.004, 24)), rng.choice([4, 12, 40], 24),
                                              rng.integers(2, 14, 24)))]
    clock = SimClock()
    with SlotEngine(tiny, config.max_batch, 64) as engine:
        result = serve(TimedExecutor(engine, clock), reqs, config, clock)
    steps = step_frame(result).assign(framework="engine")
    report = Report.build({"requests": request_frame(result), "steps": steps,
                           "request_steps": request_steps_frame(result.steps)},
                          {"source": {"kind": "engine-loadtest"}, "params": {"loadtest": {"runs": []}}})
    split = split_run(report, None)
    assert split.source == "scheduler"
    by_id = split.requests.set_index("request_id")
    gaps = split.gaps.set_index(["request_id", "gap"])
    for t in result.requests:  # the scheduler's own log, not the report's tables
        ttft, e2e = t.token_times_s[0] - t.arrival_s, t.token_times_s[-1] - t.arrival_s
        row = by_id.loc[t.request_id]
        assert sum(row[f"ttft_{p}_s"] for p in PARTS) == pytest.approx(ttft, rel=0.01)
        assert sum(row[f"e2e_{p}_s"] for p in PARTS) == pytest.approx(e2e, rel=0.01)
        for k, gap in enumerate(np.diff(t.token_times_s), start=1):
            assert sum(gaps.loc[(t.request_id, k), f"{p}_s"] for p in PARTS) == pytest.approx(gap, rel=0.01)
        # every piece is placed: the engine's own steps cover all but the scheduler's time between them
        assert row["ttft_unmeasured_s"] == 0 and row["e2e_unmeasured_s"] == 0
        # queued exactly as the scheduler logged it: from its first look to its admission
        assert row["ttft_queued_s"] == pytest.approx(t.admitted_s - t.considered_s, abs=1e-9)
        assert row["e2e_preemption_s"] > 0 if t.preempted_s else row["e2e_preemption_s"] == 0
    assert split.additivity_error_pct < 1e-6
    # known truth: the cost model's time of each forward (2 ms + 50 us x rows x the longest chunk). Inside an
    # inter-token gap of a continuous batch, the decode part is the decode forwards in it (the one that made
    # the token; after the first token also the others' decode of that iteration), the stall every prefill
    # forward in it (none holds this request's rows once it decodes)
    if config.policy == "continuous" and not config.kv_capacity:
        cost = {s.step: 2e-3 + 5e-5 * s.batch * max(s.request_tokens) for s in result.steps}
        for t in result.requests:
            for k in range(1, len(t.token_times_s)):
                g = gaps.loc[(t.request_id, k)]
                inside = [s for s in result.steps if t.token_times_s[k - 1] <= s.start_s < t.token_times_s[k]]
                assert [s.phase for s in inside][-1] == "decode" and t.request_id in inside[-1].request_ids
                for phase, part in (("decode", "decode_s"), ("prefill", "prefill_stall_s")):
                    want = sum(cost[s.step] for s in inside if s.phase == phase)
                    assert g[part] == pytest.approx(want, rel=1e-6, abs=1e-12)
    if config.kv_capacity:
        assert any(t.preempted_s for t in result.requests)  # the capacity does preempt


# ---------------------------------------------------------------- the planted workloads
def test_prefill_stall_is_the_p99_itl_and_chunking_shrinks_it(planted, chunked):
    from perfscope.analysis.findings import run_rules
    from perfscope.analysis.summaries.tails import tails_payload

    whole, chunk = tails_payload(planted), tails_payload(chunked)
    assert whole["source"] == "scheduler" and whole["additivity_max_error_pct"] < 1e-6
    p99 = whole["itl"]["p99"]
    assert _top(p99) == "prefill_stall"
    assert sum(p99["parts"].values()) == pytest.approx(p99["value_s"], rel=1e-9)
    assert p99["value_s"] > 4 * whole["itl"]["p50"]["value_s"]
    # chunked prefill caps the prompt tokens beside the decodes: the stall in the p99 gap shrinks
    assert chunk["itl"]["p99"]["parts"]["prefill_stall"] < 0.5 * p99["parts"]["prefill_stall"]
    assert chunk["itl"]["p99"]["value_s"] < p99["value_s"]
    f = next(f for f in run_rules(planted, rules=["serving-tail"]) if f.evidence["metric"] == "itl")
    assert f.evidence["top_part"] == "prefill_stall" and "--max-batched-tokens" in f.recommendation
    assert f.time_at_stake_ns == pytest.approx((p99["value_s"] - whole["itl"]["p50"]["value_s"]) * 1e9)
    assert f.items and f.items[0].kind == "step" and f.items[0].attrs["phase"] == "prefill"
    assert "480 tokens" in f.items[0].label  # the long prompt behind the stall, named by the scheduler's log
    assert f.explained_share > 0.5
    # a report written before the scheduler's log: the same steps joined by time find the same stall
    from perfscope.schema import empty_table

    old = tails_payload(planted.replace(request_steps=empty_table("request_steps")))
    assert old["source"] == "steps by time" and _top(old["itl"]["p99"]) == "prefill_stall"
    g = next((f for f in run_rules(chunked, rules=["serving-tail"]) if f.evidence["metric"] == "itl"), None)
    if g is not None:  # the chunked run's tail, if it still has one, says what chunking left of the stall
        assert "chunked prefill (--max-batched-tokens 64)" in g.title


def test_queueing_puts_queued_first(tiny):
    from perfscope.analysis.findings import run_rules
    from perfscope.analysis.summaries.tails import tails_payload

    report = _loadtest(tiny, rates=(2000.0,), requests=40, prompt_len="16", output_len="16", max_batch=2)
    tails = tails_payload(report)
    assert _top(tails["ttft"]["p99"]) == "queued" and _top(tails["e2e"]["p99"]) == "queued"
    f = next(f for f in run_rules(report, rules=["serving-tail"]) if f.evidence["metric"] == "ttft")
    assert f.evidence["top_part"] == "queued" and "--max-batch" in f.recommendation
    assert any(i.kind == "request" and i.attrs["part"] == "queued" for i in f.items)


def test_too_little_kv_puts_preemption_first(tiny):
    from perfscope.analysis.findings import run_rules
    from perfscope.analysis.summaries.tails import tails_payload

    # a burst the slots admit at once (12 prompts of 16 tokens fit the 240 positions), whose caches then
    # outgrow the capacity: the newest requests are preempted and recomputed, none waits for a slot
    report = _loadtest(tiny, rates=(2000.0,), requests=12, prompt_len="16", output_len="48", max_batch=12,
                       kv_capacity=240)
    assert report.params["loadtest"]["runs"][0]["preemptions"] > 0
    tails = tails_payload(report)
    assert _top(tails["e2e"]["p99"]) == "preemption"
    f = next(f for f in run_rules(report, rules=["serving-tail"]) if f.evidence["top_part"] == "preemption")
    assert "--kv-capacity" in f.recommendation and f.evidence["preemptions"] > 0


def test_preempted_requests_make_the_same_tokens(tiny):
    from perfscope.engine.generate import generate
    from perfscope.engine.serving import SlotEngine

    rng = np.random.default_rng(7)
    reqs = [LoadRequest(i, 0.0005 * i, tuple(rng.integers(0, 512, 10).tolist()), 12) for i in range(6)]
    clock = SimClock()
    with SlotEngine(tiny, 6, 24) as engine:
        res = serve(TimedExecutor(engine, clock), reqs, ServeConfig(6, kv_capacity=48), clock)
    assert sum(len(t.preempted_s) for t in res.requests) > 0
    for r, t in zip(reqs, res.requests):
        assert t.output_ids == generate(tiny, [list(r.prompt)], r.max_output_tokens).generated_ids[0]
        assert len(t.readmitted_s) == len(t.preempted_s)
    roles = {role for s in res.steps for role in s.request_roles}
    assert {"prefill", "recompute", "decode"} <= roles


def test_kv_capacity_errors_are_one_line():
    from perfscope.errors import UsageError

    with pytest.raises(UsageError, match="--kv-capacity must be at least 1"):
        ServeConfig(4, kv_capacity=0).check()
    with pytest.raises(UsageError, match="static"):
        ServeConfig(4, kv_capacity=64, policy="static").check()

    class Tiny:
        n_slots = 2

    with pytest.raises(UsageError, match="beyond --kv-capacity 10"):
        serve(Tiny(), [LoadRequest(0, 0.0, (1,) * 8, 4)], ServeConfig(2, kv_capacity=10), SimClock())  # type: ignore[arg-type]


# ---------------------------------------------------------------- percentiles and their parts
def test_percentile_parts_interpolate_like_numpy():
    from perfscope.analysis.summaries.tails import percentile_parts

    rng = np.random.default_rng(1)
    parts = rng.random((37, 4))
    values = parts.sum(axis=1)
    for q in (50.0, 90.0, 99.0):
        v, mix, made = percentile_parts(values, parts, q)
        assert v == pytest.approx(float(np.percentile(values, q)))
        assert mix.sum() == pytest.approx(v)
        assert sum(w for _, w in made) == pytest.approx(1.0)
    assert math.isnan(percentile_parts(np.array([np.nan]), np.zeros((1, 4)), 50.0)[0])


def test_tails_json_text_and_html(planted, tmp_path: Path):
    from perfscope.cli.analyze import analysis_payload
    from perfscope.dashboard.html_report import render_html
    from perfscope.format import dumps
    from perfscope.text_report import render_text

    payload = json.loads(dumps(analysis_payload(planted, 5)))
    tails = payload["tails"]
    for metric in ("ttft", "itl", "tpot", "e2e"):
        for q in ("p50", "p99"):
            e = tails[metric][q]
            assert set(e) >= {"value_s", "parts", "from"}
            assert sum(e["parts"].values()) == pytest.approx(e["value_s"], rel=1e-6)
    text = render_text(planted)
    assert "tails (p50 -> p99" in text and "prefill stall" in text
    html = render_html(planted)
    assert "Serving tails" in html and "prefill_stall" in html


def test_split_of_a_report_without_steps_says_what_it_could_not_measure():
    from perfscope.analysis.summaries.tails import tails_payload
    from perfscope.report import Report

    req = pd.DataFrame({"request_id": [0, 1, 2], "output_tokens": [3, 3, 3], "ttft_s": [0.1, 0.2, 0.3],
                        "e2e_s": [0.3, 0.4, 0.5], "arrival_s": [0.0, 0.1, 0.2], "first_token_s": [0.1, 0.3, 0.5],
                        "end_s": [0.3, 0.5, 0.7], "status": ["ok"] * 3,
                        "token_times_s": [json.dumps([0.1, 0.2, 0.3]), json.dumps([0.3, 0.4, 0.5]),
                                          json.dumps([0.5, 0.6, 0.7])]})
    tails = tails_payload(Report.build({"requests": req}, {"source": {"kind": "endpoint-loadtest"},
                                                          "params": {"loadtest": {"runs": []}}}))
    assert tails["source"] == "none"
    assert tails["ttft"]["p50"]["parts"] == {"unmeasured": pytest.approx(0.2)}
    assert "queued" in tails["unmeasured"] and tails["notes"]


# ---------------------------------------------------------------- a server's trace: vLLM, SGLang (joined by time)
@pytest.mark.parametrize("trace,host_stall", [
    ("thirdparty/tracelens_vllm_decode_full/graph_execution.json.gz", False),
    ("thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz", True)])
def test_a_servers_step_annotations_split_the_gaps_they_hold(fixtures_dir, trace, host_stall):
    """The committed vLLM and SGLang traces imported as an endpoint load test's server profile (the
    endpoint session's own report path): their one decode step (32 sequences) lands in the client's
    gap around it by wall time; the split says decode at its batch (SGLang's 463 ms host stall inside its
    step is host time), what it could not join (no request identity, no queueing), and time outside the
    profile as unmeasured."""
    from perfscope.analysis.readers.kineto.reader import import_kineto
    from perfscope.analysis.summaries.tails import splits, tails_payload
    from perfscope.sessions.endpoint import EndpointRun, _report, parse_endpoint

    imported = import_kineto(fixtures_dir / trace)
    start = int(imported.tables["ranges"]["start_ns"].min())
    t0 = start - 100_000_000  # the client's run began 100 ms before the profiled window
    label = "rate=1"
    run = EndpointRun("http://127.0.0.1:1/v1", rates=(1.0,))
    # three requests as the client saw them: one whose inter-token gap holds the step, one whose TTFT
    # window does, one entirely before the profile
    req = pd.DataFrame({
        "request_id": [0, 1, 2], "status": ["ok"] * 3, "output_tokens": [2, 2, 2], "prompt_tokens": [8, 8, 8],
        "arrival_s": [0.0, 0.09, 0.0], "first_token_s": [0.05, 2.0, 0.01], "end_s": [2.0, 2.01, 0.02],
        "token_times_s": [json.dumps([0.05, 2.0]), json.dumps([2.0, 2.01]), json.dumps([0.01, 0.02])],
        "scheduled_s": [0.0, 0.09, 0.0], "chunks": [2, 2, 2], "token_source": ["usage"] * 3,
        "done_marker": [True] * 3, "max_output_tokens": [2, 2, 2]})
    req["ttft_s"] = req["first_token_s"] - req["arrival_s"]
    req["e2e_s"] = req["end_s"] - req["arrival_s"]
    req = req.assign(run=label, rate_per_s=1.0)
    meta = [{"run": label, "rate_per_s": 1.0, "requests": 3, "duration_s": 2.01, "wall_s": 2.01,
             "t0_perf_counter_ns": 0, "t0_epoch_ns": t0}]
    tables = {k: v.assign(run=label) if len(v) else v for k, v in imported.tables.items()}
    report = _report(run, parse_endpoint(run.endpoint), "served", req, meta, [], False, None, {"tables": tables})
    split = splits(report)[0]
    assert split.source == "steps by time" and len(split.steps) == 1
    step = split.steps.iloc[0]
    dur = float(step["end_s"] - step["start_s"])
    assert any("no request identity" in n for n in split.notes)
    assert set(split.unmeasured) == {"queued", "preemption"}
    gap = split.gaps[split.gaps["request_id"] == 0].iloc[0]
    assert gap["itl_s"] == pytest.approx(1.95)
    assert gap[[c for c in gap.index if c.endswith("_s") and c not in ("itl_s", "start_s", "end_s")]].sum() \
        == pytest.approx(1.95, rel=1e-9)
    if host_stall:  # SGLang's step: 463 ms without a launch, then its decode
        assert gap["host_s"] > 0.9 * dur and 0 < gap["decode_s"] < 0.1 * dur
    else:
        assert gap["decode_s"] == pytest.approx(dur, rel=1e-6) and gap["host_s"] == 0
    assert gap["prefill_stall_s"] == 0  # the label says 0 prefill tokens: no stall in this step
    assert gap["unmeasured_s"] == pytest.approx(1.95 - dur, rel=1e-6)  # outside the profiled window
    # request 1 waited through the step before its first token; no prefill step to call its own
    first = split.requests.set_index("request_id").loc[1]
    assert first["ttft_prefill_s"] == 0 and first["ttft_decode_s"] + first["ttft_host_s"] == pytest.approx(dur, rel=1e-6)
    assert split.requests.set_index("request_id").loc[2, "e2e_unmeasured_s"] == pytest.approx(0.02)
    payload = tails_payload(report)
    assert payload["source"] == "steps by time" and "queued" not in payload["ttft"]["p99"]["parts"]


# ---------------------------------------------------------------- the dashboard and the Perfetto export
def test_dashboard_click_on_a_request_shows_its_timeline(planted, tmp_path: Path):
    from perfscope.dashboard import callbacks as cb
    from perfscope.dashboard.store import ReportStore

    planted.save(tmp_path / "runs" / "planted.perfscope")
    store = ReportStore([tmp_path])
    key = store.entries()[0].key
    table, bars, points = cb.on_tails(store, key, "phases")
    assert "Serving tails: p50 and p99 split into their causes" in str(table)
    assert bars.layout.meta["kind"] == "tails" and points.layout.meta["kind"] == "tail_requests"
    assert any(t.name == "other requests&#x27; prefill inside the gap (stall)" for t in bars.data)
    # the request the p99 ITL comes from: its timeline has its pieces, its tokens and the steps it waited through
    from perfscope.analysis.summaries.tails import tails_payload

    rid = tails_payload(planted)["itl"]["p99"]["from"][0]["request_id"]
    fig = cb.on_request_click(store, key, {"points": [{"customdata": ["rate=100", rid, 1.0, 2.0]}]})
    assert fig.layout.meta["kind"] == "request_timeline" and f"Request {rid}" in fig.layout.title.text
    steps = [t for t in fig.data if getattr(t, "y", None) is not None and set(t.y) == {"steps"}]
    texts = [x for t in steps for x in t.text]
    assert any("prefill step" in x and "this request: not in it" in x for x in texts)  # the stall
    assert any("decode step" in x and "this request: decode" in x for x in texts)
    assert any(t.name == "tokens" for t in fig.data)
    for click in (None, {"points": "x"}, {"points": [{"customdata": ["x" * 5000, 1]}]},
                  {"points": [{"customdata": ["rate=100", "not a number"]}]}):
        assert cb.on_request_click(store, key, click).layout.meta["kind"] == "request_timeline"


def test_perfetto_export_links_each_request_to_the_steps_it_ran_in(planted, tmp_path: Path):
    pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    from perfscope.dashboard.export.perfetto import export_trace

    out = tmp_path / "t.pftrace"
    stats = export_trace(planted, out)
    assert stats.flows == len(planted.request_steps)
    trace = pb.Trace.FromString(out.read_bytes())
    names, starts, ends = {}, {}, {}
    for p in trace.packet:
        for n in p.interned_data.event_names:
            names[n.iid] = n.name
        ev = p.track_event
        if p.HasField("track_event") and ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            for f in ev.flow_ids:
                starts[f] = (names.get(ev.name_iid), p.timestamp)
            for f in ev.terminating_flow_ids:
                ends[f] = (names.get(ev.name_iid), p.timestamp)
    assert set(starts) == set(ends) and len(starts) == stats.flows
    assert {n for n, _ in starts.values()} == {"request"}
    assert all(n.split(" step ")[0] in ("prefill", "decode") for n, _ in ends.values())
    assert all(starts[f][1] <= ends[f][1] for f in starts)  # a request reaches the server before its steps
    chrome = tmp_path / "t.json"
    export_trace(planted, chrome, format="chrome")
    events = json.loads(chrome.read_text())["traceEvents"]
    assert sum(e["ph"] == "s" for e in events) == sum(e["ph"] == "f" for e in events) == stats.flows


def test_compare_says_how_each_part_of_the_p99_moved(planted, chunked):
    from perfscope.analysis.summaries.compare import compare, tail_view

    c = compare(planted, chunked)
    stall = c.by_tail[(c.by_tail["metric"] == "itl") & (c.by_tail["part"] == "prefill_stall")].iloc[0]
    assert stall["change_s"] < 0 and stall["p99_b_s"] < 0.5 * stall["p99_a_s"]
    assert any(v.startswith("p99 ITL") and "stall" in v for v in c.verdict)
    assert "tails" in c.to_dict() and len(tail_view(c)) == len(c.by_tail)


def test_gauges_only_estimate_the_queue_and_say_what_they_cannot_split():
    """Three requests sent to a one-slot server 0.1 s apart, each served for 1 s; /metrics scraped with
    its waiting count: first come first served, the second waited from its send to the first's end
    (0.1 -> 1.0 s), the third until the second's (0.2 -> 2.0 s); the scrapes see it up to their sampling."""
    from perfscope.analysis.summaries.tails import split_run, tails_payload
    from perfscope.report import Report

    req = pd.DataFrame({"request_id": [0, 1, 2], "status": ["ok"] * 3, "output_tokens": [2] * 3,
                        "arrival_s": [0.0, 0.1, 0.2], "first_token_s": [0.5, 1.5, 2.5], "end_s": [1.0, 2.0, 3.0],
                        "token_times_s": [json.dumps([0.5, 1.0]), json.dumps([1.5, 2.0]), json.dumps([2.5, 3.0])],
                        "run": ["r"] * 3})
    req["ttft_s"], req["e2e_s"] = req["first_token_s"] - req["arrival_s"], req["end_s"] - req["arrival_s"]
    t = np.arange(0.05, 3.0, 0.1)
    waiting = np.select([t < 0.1, t < 0.2, t < 1.0, t < 2.0], [0, 1, 2, 1], 0)
    gauges = pd.DataFrame({"t_s": t, "metric": "requests_waiting", "value": waiting.astype(float), "run": "r"})
    report = Report.build({"requests": req, "gauges": gauges},
                          {"source": {"kind": "endpoint-loadtest"}, "params": {"loadtest": {"runs": [{"run": "r"}]}}})
    split = split_run(report, "r")
    assert split.source == "gauges"
    q = split.requests.set_index("request_id")["ttft_queued_s"]
    assert q[0] == 0
    assert q[1] == pytest.approx(0.9, abs=0.1) and q[2] == pytest.approx(1.8, abs=0.1)
    tails = tails_payload(report)
    assert set(tails["ttft"]["p99"]["parts"]) == {"queued", "unmeasured"}
    assert set(tails["unmeasured"]) == {"prefill", "head_of_line", "decode", "prefill_stall", "preemption", "host"}
    assert any("--profile" in n for n in tails["notes"])


def test_a_profiled_run_names_the_kernel_family_of_its_steps(tiny, planted_lengths):
    """Profiled, the same simulated run keeps its clock and gets the real kernels: each step's kernel
    families (launched in the step's window on the trace), shown in the request timeline and named by the
    finding when a step's own time is what grows."""
    from perfscope.analysis.rules.tails import _advice, _items
    from perfscope.analysis.summaries.tails import entry, splits, step_families
    from perfscope.dashboard.figures.tails import request_timeline_figure

    report = _loadtest(tiny, rates=(100.0,), requests=10, prompt_len=planted_lengths, output_len="4", max_batch=4,
                       profile=True)
    split = splits(report)[0]
    fam = step_families(report, split)
    assert len(fam) == len(split.steps)  # every forward launched its operators inside its own step
    assert "gemm" in fam.columns and (fam["gemm"] > 0).all()
    fig = request_timeline_figure(report, split.run, 0)
    texts = [x for t in fig.data if getattr(t, "text", None) is not None for x in t.text]
    assert any("kernels: gemm" in x or ", gemm" in x for x in texts)
    # the decode part of the p99 gap: the finding's items point at its decode steps, whose family it names
    p99 = entry(split, "itl", 99.0)
    items = _items(report, split, "itl", p99["from"], [(p99["parts"]["decode"], "decode")])
    assert items and all(i.kind == "step" and i.attrs["phase"] == "decode" for i in items)
    advice, facts = _advice(report, split, "itl", "decode", p99, items)
    assert facts["slow_step_kernel_family"] in fam.columns and "kernels hold" in advice


def test_a_mixed_step_splits_into_decode_at_its_batch_and_the_prefill_riding_with_it():
    """vLLM's chunked prefill runs prefill tokens in the decode step (a mixed step, read from its own
    annotation by the import pipeline): the decode part is the pure decode step at that batch (median),
    the rest is the other requests' prefill that stalled the gap."""
    from perfscope.analysis.readers.finish import Imported, finish
    from perfscope.analysis.summaries.tails import splits

    t0 = 1_700_000_000_000_000_000
    ms = 1_000_000
    dec = "execute_1_context_0(sq0sk0sqsq0sqsk0)_generation_1(sq1sk9sqsq1sqsk9)"
    mixed = "execute_65_context_1(sq64sk64sqsq4096sqsk4096)_generation_1(sq1sk10sqsq1sqsk10)"
    spans = [(dec, 100, 110), (dec, 110, 120), (dec, 120, 130), (mixed, 130, 160), (dec, 160, 170)]
    ranges = pd.DataFrame({"id": range(5), "name": [n for n, _, _ in spans], "thread": 1, "source": "user_annotation",
                           "start_ns": [t0 + a * ms for _, a, _ in spans], "end_ns": [t0 + b * ms for _, _, b in spans]})
    times = [0.11, 0.12, 0.13, 0.16, 0.17]
    req = pd.DataFrame({"request_id": [0], "status": ["ok"], "output_tokens": [5], "arrival_s": [0.105],
                        "first_token_s": [0.11], "end_s": [0.17], "token_times_s": [json.dumps(times)], "run": ["r"],
                        "ttft_s": [0.005], "e2e_s": [0.065]})
    manifest = {"source": {"kind": "endpoint-loadtest"},
                "params": {"loadtest": {"runs": [{"run": "r", "t0_epoch_ns": t0, "wall_s": 1.0}]}}}
    report = finish(Imported({"ranges": ranges, "requests": req}, manifest, None, origin="test"))
    assert report.steps["phase"].tolist() == ["decode"] * 3 + ["mixed", "decode"]
    split = splits(report)[0]
    assert split.source == "steps by time" and any("mixed steps" in n for n in split.notes)
    gap = split.gaps.set_index("gap").loc[3]  # tokens 3 -> 4: the mixed step
    assert gap["itl_s"] == pytest.approx(0.03)
    assert gap["decode_s"] == pytest.approx(0.010) and gap["prefill_stall_s"] == pytest.approx(0.020)
    assert split.gaps.set_index("gap").loc[1, "decode_s"] == pytest.approx(0.010)


def test_ttft_steps_end_with_the_step_that_made_the_first_token() -> None:
    """A request sent at 0.100 s: its prefill runs 0.101-0.110 s and makes its first token, which reaches the
    client at 0.115 s; another request's decode starts at 0.112 s while the token is on its way. Without the
    links (request_steps) the decode counts towards the TTFT (a step that started before the token arrived);
    with them the window ends with the request's own prefill, so its steps' time is not more than its TTFT."""
    from perfscope.analysis.summaries.server_timeline import ttft_steps

    requests = pd.DataFrame({"request_id": [0], "arrival_s": [0.100], "first_token_s": [0.115], "run": ["r"]})
    steps = pd.DataFrame({"step": [0, 1], "phase": ["prefill", "decode"], "start_s": [0.101, 0.112],
                          "end_s": [0.110, 0.120], "run": ["r", "r"]})
    links = pd.DataFrame({"request_id": [0], "step": [0], "role": ["prefill"], "run": ["r"]})
    blind = ttft_steps(requests, steps).iloc[0]
    assert (blind["ttft_prefill_steps"], blind["ttft_decode_steps"]) == (1, 1)
    assert blind["ttft_steps_s"] == pytest.approx(0.017)
    seen = ttft_steps(requests, steps, links).iloc[0]
    assert (seen["ttft_prefill_steps"], seen["ttft_decode_steps"]) == (1, 0)
    assert seen["ttft_steps_s"] == pytest.approx(0.009) and seen["ttft_steps_s"] <= 0.115 - 0.100
    # a request the links do not name keeps the window to its first token
    other = ttft_steps(requests, steps, links.assign(request_id=[7])).iloc[0]
    assert other["ttft_steps_s"] == pytest.approx(0.017)
