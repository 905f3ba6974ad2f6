"""perfscope loadtest: the continuous-batching scheduler, the slot KV cache, the serving metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfscope.analysis.summaries.loadtest import knee, load_metrics, parse_slo
from perfscope.engine.serving import LoadRequest, ServeConfig, SimClock, StepCost, serve
from perfscope.errors import InputFormatError, UsageError
from perfscope.sessions.loadtest import (
    LoadRun,
    build_workload,
    parse_dist,
    parse_rates,
    request_frame,
)

EOS = 0


class FakeEngine:
    """A model step without a model: checks the cache discipline, emits EOS where the test says.

    Prompts start with the request id, so the engine knows whose slot it is reading. Every
    forward must continue its slot exactly where the cache ends (start == filled positions), and
    ``move`` must carry a slot's contents; costs advance a virtual clock.
    """

    def __init__(self, clock: SimClock, n_slots: int, prompt_lens: dict[int, int], eos_at: dict[int, int],
                 static: bool = False) -> None:
        self.clock, self.n_slots, self.static = clock, n_slots, static
        self.prompt_lens, self.eos_at = prompt_lens, eos_at
        self.owner: dict[int, int] = {}
        self.filled: dict[int, int] = {}

    def forward(self, slots, chunks, starts):
        assert len(set(slots)) == len(slots), "a slot twice in one forward"
        out = []
        for slot, chunk, start in zip(slots, chunks, starts):
            assert 0 <= slot < self.n_slots
            if start == 0:
                self.owner[slot], self.filled[slot] = chunk[0], 0
            rid = self.owner[slot]
            # a finished row of a static batch keeps rewriting its last position
            rewrite = self.static and len(chunk) == 1 and start == self.filled[slot] - 1
            assert self.filled[slot] == start or rewrite, f"slot {slot} holds {self.filled[slot]} positions, asked at {start}"
            self.filled[slot] = start + len(chunk)
            if rewrite:
                out.append(1)
                continue
            k = start + len(chunk) - self.prompt_lens[rid]  # index of the token this forward produces
            out.append(EOS if k == self.eos_at.get(rid, -1) else 1 + (rid + k) % 7)
        self.clock.advance(1e-3 + 1e-5 * sum(len(c) for c in chunks))
        return out

    def move(self, src, dst, length):
        assert self.filled.get(src, 0) >= length
        self.owner[dst], self.filled[dst] = self.owner.pop(src, None), length
        self.filled.pop(src, None)

    def cost(self, rows, width, context, last_only):
        return StepCost(weight_bytes=1.0, kv_cache_bytes=float(rows * context), flops=float(rows * width))

    def kv_bytes(self, positions):
        return float(positions)


def _requests(arrivals, prompts, outputs):
    return [LoadRequest(i, a, (i + 100,) + (5,) * (p - 1), o) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


workloads = st.integers(min_value=1, max_value=14).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 0.05), min_size=n, max_size=n),
    st.lists(st.integers(1, 12), min_size=n, max_size=n),
    st.lists(st.integers(1, 9), min_size=n, max_size=n),
    st.lists(st.integers(-1, 9), min_size=n, max_size=n)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, st.integers(1, 5), st.sampled_from([None, 5, 8, 40]), st.booleans(),
       st.sampled_from(["continuous", "static"]), st.sampled_from([None, None, 24, 40]))
def test_no_request_lost_or_counted_twice(work, max_batch, budget, use_eos, policy, kv_capacity):
    gaps, prompts, outputs, eos_at = work
    if budget is not None and budget < max_batch:
        budget = max_batch
    if policy == "static":
        kv_capacity = None  # preemption is continuous batching's
    arrivals = np.cumsum(gaps).tolist()
    reqs = _requests(arrivals, prompts, outputs)
    eos = {i + 100: e for i, e in enumerate(eos_at)} if use_eos else {}
    clock = SimClock()
    engine = FakeEngine(clock, max_batch, {i + 100: p for i, p in enumerate(prompts)}, eos,
                        policy == "static")
    result = serve(engine, reqs, ServeConfig(max_batch, budget, EOS if use_eos else None, policy, kv_capacity), clock)

    assert [t.request_id for t in result.requests] == list(range(len(reqs)))  # each once
    for r, t in zip(reqs, result.requests):
        e = eos.get(r.request_id + 100, -1)
        expected = min(r.max_output_tokens, e + 1) if 0 <= e else r.max_output_tokens
        assert t.output_tokens == expected
        assert t.finish_reason == ("eos" if expected == e + 1 and 0 <= e else "length")
        assert t.arrival_s <= t.admitted_s <= t.token_times_s[0]
        assert t.token_times_s == sorted(t.token_times_s)
    steps = pd.DataFrame([s.__dict__ for s in result.steps])
    assert (steps["kv_slots_in_use"] <= max_batch).all() and (steps["batch"] <= max_batch).all()
    # the scheduler's log: each step's rows are its requests, each once, with their tokens
    assert all(len(set(s.request_ids)) == len(s.request_ids) == s.batch == len(s.request_roles) for s in result.steps)
    assert all(sum(s.request_tokens) == s.tokens for s in result.steps)
    assert all(t.arrival_s <= t.considered_s <= t.admitted_s for t in result.requests)
    frame = request_frame(result)
    assert frame["request_id"].is_unique and len(frame) == len(reqs)
    if kv_capacity is not None:  # the cache never holds more than its capacity; every preempted request came back
        assert (steps["kv_cache_size_bytes"] <= kv_capacity).all()  # FakeEngine: one byte per position
        assert all(len(t.preempted_s) == len(t.readmitted_s) for t in result.requests)
        assert steps["preempted"].sum() == sum(len(t.preempted_s) for t in result.requests)
        return
    assert steps["prefill_tokens"].sum() == sum(prompts)  # every prompt token prefilled exactly once
    first_tokens = len(reqs)
    if policy == "continuous":
        assert steps["decode_seqs"].sum() + first_tokens == sum(t.output_tokens for t in result.requests)
    else:
        assert steps["decode_seqs"].sum() + first_tokens >= sum(t.output_tokens for t in result.requests)
    if budget is not None:
        per_iter = steps.groupby("iteration")["tokens"].sum()
        assert (per_iter <= budget).all()


def test_continuous_beats_static_on_p99_ttft_in_simulation():
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(0.004, 60)).tolist()
    outputs = rng.integers(2, 40, 60).tolist()
    reqs = _requests(arrivals, [8] * 60, outputs)
    out = {}
    for policy in ("continuous", "static"):
        clock = SimClock()
        engine = FakeEngine(clock, 8, {i + 100: 8 for i in range(60)}, {}, policy == "static")
        res = serve(engine, reqs, ServeConfig(8, None, None, policy), clock)
        out[policy] = load_metrics(request_frame(res))
    assert out["continuous"]["ttft_s"]["p99"] < out["static"]["ttft_s"]["p99"]
    assert out["continuous"]["request_throughput_per_s"] > out["static"]["request_throughput_per_s"]


def test_idle_engine_waits_for_arrivals():
    clock = SimClock()
    reqs = _requests([1.0, 5.0], [3, 3], [2, 2])
    res = serve(FakeEngine(clock, 2, {100: 3, 101: 3}, {}), reqs, ServeConfig(2), clock)
    assert res.requests[0].admitted_s == pytest.approx(1.0)
    assert res.requests[1].admitted_s == pytest.approx(5.0)
    assert res.requests[1].token_times_s[0] > 5.0


# ---------------------------------------------------------------- the real engine
@pytest.fixture(scope="module")
def tiny():
    from perfscope.engine.generate import build_model

    return build_model("tiny", seed=0)


@pytest.mark.parametrize("config", [ServeConfig(3), ServeConfig(4, 6), ServeConfig(2, None, policy="static")])
def test_continuous_batching_matches_each_request_alone(tiny, config):
    from perfscope.engine.generate import generate
    from perfscope.engine.serving import SlotEngine

    rng = np.random.default_rng(3)
    reqs = [LoadRequest(i, 0.001 * i, tuple(rng.integers(0, 512, int(rng.integers(1, 20))).tolist()),
                        int(rng.integers(1, 9))) for i in range(7)]
    clock = SimClock()
    with SlotEngine(tiny, config.max_batch, 32) as engine:
        res = serve(engine, reqs, config, clock)
    for r, t in zip(reqs, res.requests):
        assert t.output_ids == generate(tiny, [list(r.prompt)], r.max_output_tokens).generated_ids[0]
    # the model's own caches are back: generate() still works on a larger batch
    assert len(generate(tiny, [[1, 2, 3]] * 2, 2).generated_ids) == 2


def test_eos_stops_a_real_model(tiny):
    from perfscope.engine.generate import generate
    from perfscope.engine.serving import SlotEngine

    prompt = (7, 8, 9)
    ref = generate(tiny, [list(prompt)], 6).generated_ids[0]
    eos = ref[-1]
    with SlotEngine(tiny, 2, 16) as engine:
        res = serve(engine, [LoadRequest(0, 0.0, prompt, 6)], ServeConfig(2, eos_id=eos), SimClock())
    assert res.requests[0].output_ids == ref[:ref.index(eos) + 1]
    assert res.requests[0].finish_reason == "eos"


@pytest.mark.parametrize("kind,bound", [("int8", 0.02), ("fp8", 0.08)])
def test_quantized_kv_cache_logit_error_is_small(tiny, kind, bound):
    from perfscope.engine.serving import kv_bytes_per_position, kv_logit_error

    err = kv_logit_error(tiny, kind, [list(range(1, 20)), list(range(30, 45))], 6)
    assert 0 < err["rel_rms"] < bound
    a = tiny.args
    assert kv_bytes_per_position(tiny, "auto") == 2 * a.n_layer * a.n_kv_head * a.head_dim * 4
    assert kv_bytes_per_position(tiny, kind) == 2 * a.n_layer * a.n_kv_head * (a.head_dim + 4)


# ---------------------------------------------------------------- workload and metrics
def test_length_distributions(tmp_path: Path):
    rng = np.random.default_rng(0)
    assert parse_dist("12", "--prompt-len").sample(3, rng).tolist() == [12, 12, 12]
    u = parse_dist("uniform:3,5", "--prompt-len").sample(500, rng)
    assert u.min() == 3 and u.max() == 5
    assert parse_dist("normal:10,3", "--prompt-len").sample(500, rng).min() >= 1
    f = tmp_path / "lens.txt"
    f.write_text("4\n# comment\n6\n")
    assert parse_dist(str(f), "--prompt-len").sample(5, rng).tolist() == [4, 6, 4, 6, 4]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(InputFormatError, match="empty"):
        parse_dist(str(empty), "--prompt-len")
    for bad in ("0", "uniform:5,3", "normal:x", "nope/none.txt"):
        with pytest.raises(UsageError):
            parse_dist(bad, "--prompt-len")


def test_rates_and_slo_parsing():
    assert parse_rates("4,1,2") == [1.0, 2.0, 4.0]
    for bad in ("0", "-1", "1,0", "abc", ""):
        with pytest.raises(UsageError):
            parse_rates(bad)
    assert parse_slo("ttft=0.5,tpot=0.05") == {"ttft_s": 0.5, "tpot_s": 0.05}
    for bad in ("ttft", "foo=1", "ttft=-1", "ttft=x"):
        with pytest.raises(UsageError):
            parse_slo(bad)


def test_workload_same_lengths_at_every_rate_and_context_check():
    a = build_workload(LoadRun(requests=20, prompt_len="uniform:2,9"), 2.0, 512, 512)
    b = build_workload(LoadRun(requests=20, prompt_len="uniform:2,9"), 8.0, 512, 512)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.arrival_s / 4 for r in a] == pytest.approx([r.arrival_s for r in b])
    with pytest.raises(UsageError, match="context"):
        build_workload(LoadRun(requests=5, prompt_len="normal:400,200", output_len="100"), 1.0, 512, 512)
    d = build_workload(LoadRun(requests=None, duration_s=2.0), 10.0, 512, 512)
    assert all(r.arrival_s < 2.0 for r in d) and 5 < len(d) < 60


def test_metrics_follow_vllm_definitions():
    times = [[1.0, 1.5, 2.5], [2.0], [3.0, 3.1]]
    req = pd.DataFrame({"request_id": [0, 1, 2], "prompt_tokens": [4, 4, 4], "output_tokens": [3, 1, 2],
                        "arrival_s": [0.5, 1.0, 2.0], "end_s": [2.5, 2.0, 3.1],
                        "token_times_s": [json.dumps(t) for t in times]})
    req["ttft_s"] = [0.5, 1.0, 1.0]
    req["e2e_s"] = req["end_s"] - req["arrival_s"]
    m = load_metrics(req, {"ttft_s": 1.0, "tpot_s": 0.5})
    assert m["duration_s"] == 3.1
    assert m["request_throughput_per_s"] == pytest.approx(3 / 3.1)
    assert m["output_tokens_per_s"] == pytest.approx(6 / 3.1)
    assert m["tpot_s"]["mean"] == pytest.approx((0.75 + 0.1) / 2)  # single-token requests have no TPOT
    assert m["itl_s"]["p50"] == pytest.approx(np.percentile([0.5, 1.0, 0.1], 50))
    # request 0 misses the TPOT target; request 1 (one token) counts TPOT 0, as vLLM does
    assert m["good_requests"] == 2 and m["goodput_per_s"] == pytest.approx(2 / 3.1)
    assert math.isnan(load_metrics(req.iloc[1:2])["tpot_s"]["p99"])


def test_knee_is_the_last_rate_on_the_latency_floor():
    rates = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    assert knee(rates, np.array([1.0, 1.1, 1.3, 4.0, 9.0])) == 4.0
    assert knee(rates, np.array([1.0, 3.0, 1.0, 1.0, 1.0])) == 1.0
    assert knee(rates[:1], np.array([1.0])) is None


# ---------------------------------------------------------------- report, HTML and dashboard
@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory, tiny):
    from perfscope.sessions.loadtest import run_loadtest

    run = LoadRun(model="tiny", rates=(5.0, 200.0), requests=8, prompt_len="uniform:4,16", output_len="uniform:1,6",
                  max_batch=4, profile=False, kv_dtype="int8", slo={"ttft_s": 0.5})
    report = run_loadtest(run, model=tiny)
    folder = report.save(tmp_path_factory.mktemp("lt") / "sweep.perfscope")
    return folder


def test_report_round_trip_and_figures(sweep_report):
    from perfscope.analysis.summaries.loadtest import is_loadtest, rate_summary
    from perfscope.dashboard.figures.loadtest import decode_points, load_figures
    from perfscope.dashboard.html_report import render_html
    from perfscope.engine.serving import kv_bytes_per_position
    from perfscope.report import Report

    report = Report.load(sweep_report)
    assert is_loadtest(report)
    summary = rate_summary(report)
    assert summary["rate_per_s"].tolist() == [5.0, 200.0] and summary["knee"].sum() <= 1
    assert summary["requests"].tolist() == [8, 8]
    figs = load_figures(report)
    assert set(figs) == {"latency", "over time", "decode roofline", "rates"}
    assert not any((f.layout.meta or {}).get("empty") for f in figs.values())
    points = decode_points(report)
    assert points["batch"].is_unique and (points["arith_intensity"] > 0).all()
    # the KV bytes behind the roofline use int8 codes + one float32 scale per head
    s = report.steps[report.steps["phase"] == "decode"].iloc[0]
    from perfscope.engine.generate import build_model

    per_pos = kv_bytes_per_position(build_model("tiny"), "int8")
    assert s["kv_cache_bytes"] == per_pos * s["batch"] * s["context_len"]
    html = render_html(report)
    assert "Serving under load" in html and "int8 KV cache" in html


def test_dashboard_phases_tab_shows_load_figures(sweep_report):
    import dash

    from perfscope.dashboard import callbacks as cb
    from perfscope.dashboard.store import ReportStore

    store = ReportStore([sweep_report.parent])
    key = store.entries()[0].key
    graphs = cb.on_load(store, key, "phases")
    assert len(graphs) == 4
    assert cb.on_load(store, key, "overview") is dash.no_update


def test_model_eos_from_checkpoint_config(tmp_path, tiny):
    from perfscope.sessions.loadtest import model_eos

    assert model_eos("tiny", tiny) is None  # random weights: no EOS stop
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 7]}')
    assert model_eos(str(tmp_path), tiny) == 2


def test_bad_requests_are_refused_with_what_is_wrong():
    from perfscope.engine.serving import check_requests

    check_requests([LoadRequest(0, 0.0, (1, 2), 3)], vocab_size=10)
    for reqs, message in (([], "no requests"),
                          ([LoadRequest(4, 0.0, (1, 12, -1), 3)], r"request 4 has token ids \[-1, 12\] outside"),
                          ([LoadRequest(5, 0.0, (), 3)], "request 5 needs a prompt"),
                          ([LoadRequest(6, -1.0, (1,), 3)], "arrivals must be >= 0")):
        with pytest.raises(UsageError, match=message):
            check_requests(reqs, vocab_size=10)
