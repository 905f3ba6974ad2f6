"""``perfscope export`` of an endpoint load test with ``--profile`` against ``perfscope serve``: the
client's requests and the server's kernels in one trace, on the server trace's clock (the client's
run clock moved by the server steps' two clocks, which the clock offset from ``/health`` joined)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfscope.dashboard.export.perfetto import export_trace, lean_report
from tests.integration.test_serve import _loadtest, _stopped_cleanly, served
from tests.unit.test_trace_export_requests import _check_lanes, _request_slices_proto

pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def test_profiled_endpoint_requests_sit_next_to_the_servers_steps(tmp_path: Path) -> None:
    with served("--model", "tiny", "--max-batch", "4", "--profile-dir", str(tmp_path / "traces"),
                cwd=tmp_path) as (url, proc):
        res = _loadtest("--endpoint", url, "--rate", "20", "--requests", "8", "--output-len", "6", "--profile",
                        "--json", "--no-html", "--out", str(tmp_path / "lt"), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        _stopped_cleanly(proc)
    folder = Path(json.loads(res.stdout)["report_path"])
    report = lean_report(folder)
    assert len(report.kernels) and len(report.steps)
    stats = export_trace(report, tmp_path / "t.pftrace")
    assert stats.requests == len(report.requests) == 8 and not stats.notes
    slices, _ = _request_slices_proto(tmp_path / "t.pftrace")
    parents = [s for s in slices if s["depth"] == 0]
    _check_lanes(parents)
    steps = report.steps
    prefill_end = steps.loc[steps["phase"] == "prefill", "end_ns"].to_numpy("int64")
    k0, k1 = int(report.kernels["start_ns"].min()), int(report.kernels["end_ns"].max())
    for s in parents:
        row = report.requests[report.requests["request_id"] == s["args"]["request_id"]].iloc[0]
        ttft = next(c for c in slices if c["parent"] == s["i"] and c["name"] == "TTFT")
        assert abs((ttft["end"] - ttft["start"]) - row["ttft_s"] * 1e9) <= 2
        # the first token reaches the client shortly after a prefill step of the server ended: on
        # the same clock, within the HTTP hop and the offset's uncertainty (a wrong clock would be
        # seconds or years off)
        # (here 0.2 to 0.9 ms after the step's end)
        lag = ttft["end"] - prefill_end
        assert ((lag > -1_000_000) & (lag < 20_000_000)).any()
        assert k0 - 1_000_000_000 < s["start"] < k1 + 1_000_000_000
