"""Why the GPU waits (analysis/idle.py, issue 29): each idle slice's cause, against traces whose truth is known.

- synthetic Kineto traces (tests/unit/idle_traces.py) written in the real file format, with an oracle
  that walks their host timeline one microsecond at a time;
- every committed Kineto and nsys fixture: the causes sum to the window's idle time;
- HTA's critical-path fixtures: the sync calls' share equals a plain sweep over the gaps;
- the engine on the CPU with a planted ``time.sleep`` in a named range and a planted ``.item()``.
"""

from __future__ import annotations

import importlib
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
from perfscope.report import Report
from tests.unit.idle_traces import (
    NSYS_TEMPLATE,
    launch_bound,
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


def test_sync_bound_trace_names_the_sync_and_its_range(tmp_path: Path) -> None:
    trace = sync_bound()
    r = read_kineto(trace.write(tmp_path / "t.json"))
    truth = trace.truth()
    (f,) = [g for g in RULES["gpu-idle"](r) if g.id == "gpu-idle"]
    assert f.evidence["idle_cause"] == "sync"
    assert f.evidence["idle_sync_ns"] == truth[("sync", "sampler")]
    assert f.evidence["sync_range1"] == "sampler"
    assert "Remove the sync" in f.recommendation and "reduce-overhead" not in f.recommendation
    assert RULES["launch-overhead"](r) == []
    # every slice is inside the window and the slices do not overlap
    s = r.idle.sort_values("start_ns")
    assert (s["start_ns"].to_numpy()[1:] >= s["end_ns"].to_numpy()[:-1]).all()


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


@pytest.mark.parametrize("name", [ALEXNET, A100, EVENT_SYNC])
def test_sync_share_equals_the_gaps_inside_sync_calls(load, name: str) -> None:
    """HTA's critical-path traces (event syncs) and the A100 training trace: the idle time inside
    cuda*Synchronize calls, by a plain sweep over the gaps between the device's work."""
    r = load(name)
    work = [*zip(r.kernels["start_ns"], r.kernels["end_ns"]), *zip(r.transfers["start_ns"], r.transfers["end_ns"])]
    merged = union([(int(s), int(e)) for s, e in work])
    gaps = [(merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)]
    syncs = union([(int(s), int(e)) for n, s, e in zip(r.api["name"], r.api["start_ns"], r.api["end_ns"])
                   if "Synchronize" in str(n) and e > s])
    inside = 0
    for gs, ge in gaps:
        for ss, se in syncs:
            inside += max(0, min(ge, se) - max(gs, ss))
    assert cause_totals(idle_of(r))["sync"] == pytest.approx(inside, abs=1)


def test_event_sync_trace_waits_on_host_work_outside_any_range(load) -> None:
    """HTA's cuda_event_sync trace: the GPU waits 18 ms between the second and the third matmul while
    the host thread records nothing (host work, no range), not for launches."""
    r = load(EVENT_SYNC)
    idle = idle_of(r)
    big = idle.loc[idle["duration_ns"].idxmax()]
    assert big["cause"] == "host" and pd.isna(big["range"]) and big["duration_ns"] > 18_000_000
    totals = cause_totals(idle)
    assert totals["host"] / sum(totals.values()) > 0.99


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
