"""Every output of the memory timeline: the HTML's memory track and capacity, the dashboard's track
and its click-to-list of live allocations, the Perfetto/Chrome counter tracks, analyze --memory
and --json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.summaries.memory import by_category, live_at, peaks
from perfscope.cli import main
from perfscope.dashboard import figures

SNAPSHOT = "memory/cs336_notHanmin_xl_forward/memory_snapshot_forward_without_mixed.pickle"


@pytest.fixture(scope="module")
def snapshot_report(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mem") / "snap.perfscope"
    assert main(["import", str(fixtures_dir / SNAPSHOT), "--out", str(out)]) == 0
    return out


def test_live_at_the_peak_sums_to_the_peak(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / SNAPSHOT)
    p = peaks(report)[0]
    live = live_at(report, "cuda:0", p["event"])
    assert float(live["size_bytes"].sum()) == p["peak_allocated_bytes"]
    cats = by_category(report, "cuda:0", p["event"])
    assert sum(cats.values()) == p["peak_allocated_bytes"] and "fragmentation" not in cats
    assert p["breakdown"]["reserved_unused_bytes"] >= p["breakdown"]["fragmentation_bytes"] >= 0


def test_html_and_json_and_text(snapshot_report: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = (snapshot_report / "report.html").read_text()
    assert 'id="memory"' in html and "Memory peak" in html and "what was live" in html
    capsys.readouterr()
    assert main(["analyze", str(snapshot_report), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["memory"]["peaks"][0]["device"] == "cuda:0" and doc["memory"]["peaks"][0]["by_category"]["weights"] > 0
    assert any(f["id"] == "memory-peak" for f in doc["findings"])
    assert main(["analyze", str(snapshot_report), "--memory"]) == 0
    text = capsys.readouterr().out
    assert "live at the peak, by category" in text and "weights" in text and ".py:" in text
    assert "largest live tensors" in text and "beside it: reserved" in text


def test_dashboard_track_and_click(snapshot_report: Path) -> None:
    from perfscope.dashboard.callbacks import on_memory, on_memory_click
    from perfscope.dashboard.store import ReportStore

    store = ReportStore([snapshot_report.parent])
    key = store.entries()[0].key
    fig = on_memory(store, key, "timeline")
    trace = fig.data[0]
    assert len(trace.x) > 100 and trace.customdata is not None
    i = int(max(range(len(trace.y)), key=lambda k: trace.y[k]))
    out = on_memory_click(store, key, {"points": [{"customdata": list(trace.customdata[i])}]})
    peak = peaks(store.load(key))[0]
    assert int(trace.customdata[i][1]) == peak["event"]  # the highest point is the peak event
    assert f"live on cuda:0 at {peak['at']}" in str(out) and "largest live tensors" in str(out)
    assert figures.memory_timeline(store.load(key)).layout.meta["kind"] == "memory"


def test_perfetto_counter_tracks(snapshot_report: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["export", str(snapshot_report), "-o", str(out), "--format", "chrome"]) == 0
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {e["name"] for e in events if e.get("ph") == "C"}
    assert {"cuda:0 memory allocated_bytes", "cuda:0 memory reserved_bytes", "cuda:0 memory weights_bytes",
            "cuda:0 memory activations_bytes"} <= names
    # the category counters add up to the allocated bytes at every sample
    series = {n: [e["args"] for e in events if e.get("ph") == "C" and e["name"] == n] for n in names}
    cats = [n for n in names if n.endswith("_bytes") and n.split()[-1] not in ("allocated_bytes", "reserved_bytes")]
    total = np.sum([[next(iter(a.values())) for a in series[n]] for n in cats], axis=0)
    np.testing.assert_allclose(total, [next(iter(a.values())) for a in series["cuda:0 memory allocated_bytes"]])
    assert main(["export", str(snapshot_report), "-o", str(tmp_path / "t.pftrace")]) == 0
