"""`perfscope sweep`: every combination profiled into one report, decode intensity rising with batch."""

from __future__ import annotations

import os

import pytest

from perfscope.analysis.summaries.sweep import is_sweep, split_runs, sweep_summary
from perfscope.cli import main
from perfscope.report import Report
from perfscope.sessions.profile import EngineRun, profile_sweep


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    os.environ.setdefault("PERFSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    return profile_sweep(EngineRun(model="tiny", gen_len=4, device="cpu"), [1, 8], [8, 32])


def test_sweep_holds_every_run(sweep_report):
    assert is_sweep(sweep_report)
    runs = split_runs(sweep_report)
    assert list(runs) == ["b1-p8", "b1-p32", "b8-p8", "b8-p32"]
    for run in runs.values():
        assert len(run.steps) == 4 and (run.steps["phase"] == ["prefill", "decode", "decode", "decode"]).all()
        assert len(run.requests) == run.params["batch"]
    assert sweep_report.ranges["id"].is_unique


def test_decode_intensity_rises_with_batch(sweep_report):
    s = sweep_summary(sweep_report).set_index("run")
    for p in (8, 32):
        assert s.loc[f"b8-p{p}", "decode_gemm_intensity"] > 4 * s.loc[f"b1-p{p}", "decode_gemm_intensity"]
    # independent check: total decode GEMM FLOPs / bytes of one run
    k = split_runs(sweep_report)["b8-p8"].kernels
    g = k[(k["phase"] == "decode") & (k["category"] == "gemm")]
    assert s.loc["b8-p8", "decode_gemm_intensity"] == pytest.approx(g["flops"].sum() / g["dram_bytes"].sum())
    assert (s["ttft_s"] > 0).all() and (s["tokens_per_s"] > 0).all()


def test_sweep_figures(sweep_report):
    from perfscope.dashboard.figures.sweep import sweep_figures

    roof, ttft, tput = sweep_figures(sweep_report)
    assert roof.layout.xaxis.type == "log"
    decode = [t for t in roof.data if (t.name or "").startswith("decode GEMMs")]
    assert len(decode) == 2 and all(len(t.x) == 2 for t in decode)
    assert len(ttft.data) == 2 and len(tput.data) == 2


def test_sweep_cli_round_trip(tmp_path):
    out = tmp_path / "s.perfscope"
    assert main(["sweep", "--model", "tiny", "--batch", "1,2", "--prompt-len", "8", "--gen-len", "2",
                 "--device", "cpu", "--out", str(out), "--no-html", "--json"]) == 0
    r = Report.load(out)
    assert is_sweep(r) and r.params["sweep"]["batch"] == [1, 2]
    assert main(["sweep", "--batch", "1,x"]) == 2
    assert main(["sweep", "--batch", "0"]) == 2


def test_sweep_html_shows_the_sweep_plots(sweep_report):
    from perfscope.dashboard.html_report import render_html

    html = render_html(sweep_report)
    assert "Sweep: batch size x prompt length" in html
    assert "Decode roofline trajectory as batch grows" in html
    assert "TTFT against prompt length" in html
