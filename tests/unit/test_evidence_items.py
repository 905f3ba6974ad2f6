"""The item builders behind every finding's evidence (analysis/rules/evidence.py, and the idle gaps'
analysis/rules/_gaps.py), on small tables whose answers are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.findings import Item
from perfscope.analysis.idle import weighted_median
from perfscope.analysis.rules._gaps import idle_advice, idle_items, kind_advice
from perfscope.analysis.rules.evidence import clip_to, idle_in, on_stake_clock


def test_weighted_median_reads_the_time_not_the_count() -> None:
    """The issue's example: 64 gaps of 10 ms among 1,983 gaps under 5 us: the time is in the 10 ms gaps."""
    sizes = np.r_[np.full(64, 10e6), np.full(1983, 1e3)]
    assert weighted_median(sizes) == 10e6
    assert float(np.median(sizes)) == 1e3  # what a count median says
    assert math.isnan(weighted_median(np.zeros(0)))
    # with weights: the slices of a group, each weighing its own time, read by the gap they lie in
    assert weighted_median(np.array([10e6, 1e3]), np.array([1.0, 3.0])) == 1e3
    assert weighted_median(np.array([10e6, 1e3]), np.array([3.0, 1.0])) == 10e6


def test_clip_to_cuts_intervals_at_the_windows() -> None:
    row, s, e = clip_to(np.array([0, 50, 200]), np.array([100, 300, 210]), np.array([10, 250]), np.array([60, 400]))
    # [0,100) meets [10,60); [50,300) meets [10,60) and [250,400); [200,210) meets none
    assert row.tolist() == [0, 1, 1] and s.tolist() == [10, 50, 250] and e.tolist() == [60, 60, 300]


def _idle(rows: list[tuple[int, int, str, str | None, str | None]]) -> pd.DataFrame:
    """One slice per gap: (start, end, cause, range, api)."""
    return pd.DataFrame([{"device": "cuda:0", "start_ns": s, "end_ns": e, "duration_ns": e - s, "cause": c,
                          "range": r, "api": a, "gap": float(n)} for n, (s, e, c, r, a) in enumerate(rows)])


def test_idle_items_group_by_kind_and_subject_largest_first() -> None:
    idle = _idle([(0, 10_000_000, "host", "ensure_layer_3_weights", None),
                  (20_000_000, 30_000_000, "host", "ensure_layer_3_weights", None),
                  *[(40_000_000 + 10_000 * i, 40_000_000 + 10_000 * i + 2_000, "launch", "attn", "cudaLaunchKernel")
                    for i in range(100)],
                  (50_000_000, 50_500_000, "sync", "sampler", "cudaStreamSynchronize"),
                  (60_000_000, 60_300_000, "unknown", None, None),
                  (70_000_000, 70_100_000, "host", None, None)])
    items = idle_items(idle, where=" inside decode steps")
    assert [i.attrs["kind"] for i in items] == ["host code", "sync", "unknown", "launch", "host code"]
    assert all(" inside decode steps" in i.label for i in items)
    top = items[0]
    assert top.kind == "gaps" and top.time_ns == 20e6 and top.explains and top.attrs["gaps"] == 2
    # the range's family (its numbers as N) names the group; its size is the gaps' time-weighted length
    assert top.attrs["range"] == "ensure_layer_N_weights" and "20 ms in 2 gaps of 10 ms" in top.label
    assert len(top.spans) == 2 and top.places() == top.spans
    sync = items[1]
    assert sync.kind == "gap" and sync.start_ns == 50e6 and "cudaStreamSynchronize" in sync.label
    assert not items[2].explains  # no host activity recorded
    assert not items[4].explains  # host time in no range: where it was is not known
    # the rest past `top` folds into one item per kind (and known/unknown cause), adding up to the slices
    folded = idle_items(idle, top=2)
    assert [i.attrs["kind"] for i in folded[2:]] == ["unknown", "launch", "host code"]
    assert [i.explains for i in folded[2:]] == [False, True, False]
    assert sum(i.time_ns for i in folded) == pytest.approx(float(idle["duration_ns"].sum()))
    # the advice follows the largest kind: host code, named by its range, and no CUDA graphs
    advice, totals = idle_advice(idle, items)
    assert max(totals, key=lambda k: totals[k]) == "host code"
    assert "Move or overlap this host work" in advice and "ensure_layer_N_weights" in advice
    assert "reduce-overhead" not in advice and "capture" not in advice.lower()
    assert "cudaStreamSynchronize" in kind_advice("sync", 2.0, items, idle)


def test_idle_items_read_the_host_kind_when_the_idle_table_has_one() -> None:
    idle = _idle([(0, 1_000, "host", "attn", None), (2_000, 9_000, "host", "attention_cpu", None)])
    idle["host_kind"] = ["dispatch", "cpu compute"]
    items = idle_items(idle)
    assert [(i.attrs["kind"], i.attrs["host_kind"]) for i in items] == [("cpu compute", "cpu compute"),
                                                                         ("dispatch", "dispatch")]


def test_idle_in_keeps_the_part_inside_the_windows() -> None:
    idle = _idle([(0, 100, "host", "a", None), (150, 400, "launch", "b", None)])
    out = idle_in(idle, np.array([50, 300]), np.array([200, 350]))
    assert out["start_ns"].tolist() == [50, 150, 300] and out["duration_ns"].tolist() == [50, 50, 50]


def test_items_on_another_runs_clock_keep_their_share() -> None:
    items = [Item("gaps", "a", 60.0), Item("kernels", "b", 40.0), Item("metric", "c")]
    out = on_stake_clock(items, 50.0, 100.0)
    assert [i.time_ns for i in out[:2]] == [30.0, 20.0] and out[0].attrs["measured_ns"] == 60.0
    assert math.isnan(out[2].time_ns)
    assert on_stake_clock(items, 100.0, 100.0) is items


def test_item_labels_speak_the_devices_words(load) -> None:
    """On an AMD GPU the items' labels read CU, wavefront and gpu:N like the title and advice."""
    from perfscope.analysis.findings import Finding, _in_device_words

    report = load("thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz")
    f = Finding("x", "low", "on cuda:0", {}, "use every SM", 1.0,
                items=(Item("gaps", "1 ms idle on cuda:0 while 3 warps per SM ran", 1.0),))
    spoken = _in_device_words(f, report)
    assert spoken.items[0].label == "1 ms idle on gpu:0 while 3 wavefronts per CU ran"
    assert spoken.title == "on gpu:0" and spoken.recommendation == "use every CU"


def test_items_of_unknown_cause_leave_all_of_the_stake_unexplained() -> None:
    """Timed items none of which has a known cause explain 0% (not an unknown share): the whole
    stake is stated as unexplained; with no timed item at all the share is unknown."""
    from perfscope.analysis.findings import Finding
    from perfscope.analysis.rules._base import explained_ns

    items = (Item("kernels", "k: 10 ms, limiter not measured", 10e6, False),)
    assert explained_ns(items, 8e6) == 0.0
    f = Finding("x", "low", "t", {}, "a", 8e6, items=items, explained_ns=explained_ns(items, 8e6))
    assert f.explained_share == 0.0 and f.unexplained_ns == 8e6
    assert math.isnan(explained_ns((Item("metric", "m"),), 8e6)) and math.isnan(explained_ns((), 8e6))


def test_ttft_gauges_items_are_the_slowest_late_requests_and_the_gauges(tmp_path: object) -> None:
    """16 requests whose TTFT rises 4x while the server's queue fills: the items are the slowest
    requests of the last quarter (their TTFT, not placed: the client's clock) and the gauges at their
    peak, the waiting queue marked as the cause."""
    from perfscope.analysis.rules.memory import server_gauges
    from perfscope.report import Report

    arrival = np.arange(16) * 0.5
    ttft = np.r_[np.full(8, 0.1), np.full(8, 0.4)] + np.arange(16) * 0.001
    requests = pd.DataFrame({"request_id": range(16), "arrival_s": arrival, "ttft_s": ttft,
                             "e2e_s": ttft + 1.0, "output_tokens": 16})
    t = np.arange(0, 10, 0.5)
    gauges = pd.concat([pd.DataFrame({"t_s": t, "metric": "requests_waiting", "value": np.where(t > 4, 6.0, 0.0)}),
                        pd.DataFrame({"t_s": t, "metric": "requests_running", "value": 1.0}),
                        pd.DataFrame({"t_s": t, "metric": "kv_cache_usage_pct", "value": 30.0})])
    (f,) = server_gauges(Report.build({"requests": requests, "gauges": gauges}))
    reqs = [i for i in f.items if i.kind == "request"]
    assert [i.attrs["request_id"] for i in reqs] == ["15", "14", "13", "12"]
    assert math.isnan(reqs[0].start_ns) and reqs[0].time_ns == pytest.approx(ttft[15] * 1e9)
    gauges_seen = {i.attrs["gauge"]: i for i in f.items if i.kind == "metric"}
    assert gauges_seen["requests waiting"].explains and gauges_seen["requests waiting"].attrs["value"] == 6.0
    assert not gauges_seen["KV-cache usage"].explains  # 30%: not a cause
    assert "Queueing" in f.recommendation


def test_kv_capacity_items_are_its_budget(fixtures_dir: object) -> None:
    from pathlib import Path

    from perfscope.analysis.rules.memory import kv_capacity
    from perfscope.report import Report

    report = Report.load(Path(str(fixtures_dir)) / "h200" / "h200_llama1b_b1_p2048_g64.perfscope")
    (f,) = kv_capacity(report)
    assert [i.kind for i in f.items] == ["metric"] * 3
    assert f.items[2].attrs["max_sequences"] == f.evidence["max_sequences"]


def test_host_code_no_record_names_is_unexplained_in_the_advice_too() -> None:
    """Host code that no range, function or operator names: the trace does not show what the host did, so the advice
    says so and how to record it, instead of telling the user to move host work it cannot name; named host code beside
    it keeps its own sentence, each with its share."""
    named = [(0, 10_000_000, "host", "ensure_layer_3_weights", None)]
    unnamed = [(20_000_000, 38_000_000, "host", None, None)]
    for rows, moved, unrecorded in ((unnamed, None, 100), (named + unnamed, 36, 64), (named, 100, None)):
        idle = _idle(rows)
        items = idle_items(idle)
        text = kind_advice("host code", 100.0, items, idle)
        assert ("Move or overlap this host work" in text) == (moved is not None)
        assert ("no recorded operator, range, Python function or CUDA call" in text) == (unrecorded is not None)
        if moved is not None:
            assert f"For {moved}% of the idle time the host ran its own code in ensure_layer_N_weights" in text
        if unrecorded is not None:
            assert f"For {unrecorded}% of the idle time the host was in no recorded" in text
            assert "with_stack=True" in text and "CUDA graphs would not remove it" in text
    # a trace that recorded Python stacks, none of them over this time: not told to record them again
    idle = _idle(named + unnamed).assign(function=["step_loop (model.py:10)", None])
    text = kind_advice("host code", 100.0, idle_items(idle), idle)
    assert "with_stack=True" not in text and "Python stacks were recorded and none covers this time" in text


@pytest.mark.parametrize("ranges, says, not_says", [
    ({"warmup|forward": 9}, ("100% of it is warm-up (warmup|forward)", "torch.profiler.schedule"),
     ("Move or overlap", "fused=True")),
    ({"Optimizer.step#AdamW.step": 12, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__": 6,
      "train_step_N": 1},  # under a tenth: no clause of its own
     ("63% of it is the optimizer step (Optimizer.step#AdamW.step)", "fused=True",
      "32% of it is data loading", "num_workers"), ("foreach ops", "named only by where", "Move or overlap")),
    ({"## backward ##": 5, "## recmetrics_update ##": 3, "DistributedDataParallel.forward": 2},
     ("50% of it is backward", "with_stack=True", "30% of it is metrics, logging or checkpoints",
      "The other 20% is named only by where it ran (DistributedDataParallel.forward): make it faster"),
     ("Move or overlap",)),
    ({"ensure_layer_3_weights": 10}, ("Move or overlap this host work: make it faster",), ("of it is",)),
])
def test_named_host_code_takes_the_advice_of_what_it_is(ranges: dict[str, int], says: tuple[str, ...],
                                                         not_says: tuple[str, ...]) -> None:
    """Host code named by a range or function: the warm-up, the optimizer step, data loading, metrics or logging,
    backward each get their own advice with their share; what matches none is said to be named only by where it
    ran, and only that part gets the generic advice to move it."""
    rows, now = [], 0
    for name, ms in ranges.items():
        rows.append((now, now + ms * 1_000_000, "host", name, None))
        now += ms * 1_000_000 + 1_000_000
    idle = _idle(rows)
    text = kind_advice("host code", 100.0, idle_items(idle), idle)
    assert all(s in text for s in says) and not any(s in text for s in not_says), text
    assert text.endswith("Launch overhead is not the cause: CUDA graphs would not remove it.")


def test_an_optimizer_that_already_runs_foreach_ops_is_not_told_to_use_them() -> None:
    idle = _idle([(0, 10_000_000, "host", "Optimizer.step#Shampoo.step", None)]).assign(op=["aten::_foreach_mul_"])
    text = kind_advice("host code", 100.0, idle_items(idle), idle)
    assert "this one already runs foreach ops (aten::_foreach_mul_), so the rest is its own Python per step" in text



def test_ttft_gauges_names_a_queue_the_gauge_samples_missed() -> None:
    """A server that runs one request at a time, its queue gauge sampled where the queue happened to be empty:
    the client's own requests show it (three in flight where the server never ran more than one), so the
    rise is put down to queueing, said to be inferred, not to the server's step time."""
    from perfscope.analysis.rules.memory import server_gauges
    from perfscope.report import Report

    # 16 requests of 20 ms each on one slot; the last four arrive together and wait for each other
    arrival = np.r_[np.arange(12) * 0.05, np.full(4, 0.7)]
    ttft = np.r_[np.full(12, 0.005), 0.005, 0.025, 0.045, 0.065]
    e2e = ttft + 0.015
    requests = pd.DataFrame({"request_id": range(16), "arrival_s": arrival, "ttft_s": ttft, "e2e_s": e2e,
                             "end_s": arrival + e2e, "output_tokens": 16})
    t = np.arange(0, 1.0, 0.1)  # no sample falls in 0.7-0.78 s, while the queue held
    gauges = pd.concat([pd.DataFrame({"t_s": t, "metric": "requests_waiting", "value": 0.0}),
                        pd.DataFrame({"t_s": t, "metric": "requests_running", "value": 1.0}),
                        pd.DataFrame({"t_s": t, "metric": "kv_cache_usage_pct", "value": 5.0})])
    (f,) = server_gauges(Report.build({"requests": requests, "gauges": gauges}))
    assert f.evidence["requests_waiting_max"] == 0 and f.evidence["requests_in_flight_max"] == 4
    assert "up to 3 requests waited in the queue" in f.title and "samples missed it" in f.title
    assert "Queueing" in f.recommendation
    cause = [i for i in f.items if i.kind == "metric" and i.explains]
    assert [i.attrs["gauge"] for i in cause] == ["requests in flight at the client"]
    # the same requests one after another (none overlaps): no queue, the server's own step time
    alone = requests.assign(arrival_s=np.r_[np.arange(12) * 0.05, 0.7, 0.8, 0.9, 1.0])
    alone["end_s"] = alone["arrival_s"] + alone["e2e_s"]
    (g,) = server_gauges(Report.build({"requests": alone, "gauges": gauges}))
    assert "without queueing" in g.title and g.evidence["requests_in_flight_max"] == 1
