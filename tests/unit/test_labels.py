"""What the user reads is labelled and right: rows that span phases say so or are split per phase,
and a kernel above its roof carries a note that says whether the roof or the count is off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.costs.roofline import above_roof_note
from perfscope.analysis.summaries.hierarchy import SPANS_PHASES, hierarchy
from perfscope.analysis.summaries.kernels import (
    aggregate_by_name,
    limiter_notes,
    roof_notes,
    top_kernels,
)
from perfscope.device import DeviceSpec, Roof
from perfscope.report import Report
from perfscope.text_report import render_text

DEV = DeviceSpec("d", "cuda", {"fp32": Roof(100e9, "measured"), "bf16": Roof(400e9, "datasheet")},
                 {"dram": Roof(10e9, "measured")})


def _two_phase_kernels() -> pd.DataFrame:
    """One attention op called in prefill (compute-bound: 100 FLOP/B) and in decode (memory-bound:
    1 FLOP/B), the decode calls far more often: summed, the row would sit near the ridge."""
    n_pre, n_dec = 2, 40
    pre = {"flops": 100e6, "dram_bytes": 1e6, "duration_ns": 2_000_000, "phase": "prefill"}
    dec = {"flops": 1e6, "dram_bytes": 1e6, "duration_ns": 200_000, "phase": "decode"}
    rows = [pre] * n_pre + [dec] * n_dec
    k = pd.DataFrame(rows)
    k["name"] = "aten::scaled_dot_product_attention"
    k["device"] = "cuda:0"
    k["dtype"] = "float32"
    k["start_ns"] = np.cumsum(k["duration_ns"]) - k["duration_ns"]
    k["end_ns"] = k["start_ns"] + k["duration_ns"]
    return k


def test_a_row_spanning_phases_says_so_and_the_top_table_splits_it() -> None:
    report = Report.build({"kernels": _two_phase_kernels()}, {"name": "two-phase", "device": DEV.to_dict()})
    joint = aggregate_by_name(report.kernels, DEV)
    assert len(joint) == 1
    assert joint.loc[0, "phase"] == "decode+prefill"  # decode has the most time: 8 ms against 4 ms
    top = top_kernels(report).set_index("phase")
    assert sorted(top.index) == ["decode", "prefill"]
    assert top.loc["decode", "arith_intensity"] == pytest.approx(1.0)
    assert top.loc["decode", "bound"] == "memory"
    assert top.loc["prefill", "arith_intensity"] == pytest.approx(100.0)
    assert top.loc["prefill", "bound"] == "compute"
    assert int(top["count"].sum()) == 42


def test_the_tree_of_all_phases_gives_a_spanning_node_no_bound() -> None:
    report = Report.build({"kernels": _two_phase_kernels()}, {"name": "two-phase", "device": DEV.to_dict()})
    every = hierarchy(report).nodes
    assert set(every["bound"]) == {SPANS_PHASES}
    assert every["pct_of_roof"].isna().all()
    decode = hierarchy(report, phase="decode").nodes
    assert set(decode["bound"]) == {"memory"}


def test_above_roof_note_names_what_is_off() -> None:
    # memory-bound with compulsory (analytic) bytes: the data came from cache
    note = above_roof_note({"pct_of_roof": 169.0, "bound": "memory", "bytes_source": "analytic"}, DEV)
    assert note and "cache" in note and "169%" in note
    # memory-bound with measured DRAM bytes: the roof is low
    note = above_roof_note({"pct_of_roof": 110.0, "bound": "memory", "bytes_source": "ncu"}, DEV)
    assert note and "roof" in note and "too low" in note
    # compute-bound under a measured roof: re-measure
    note = above_roof_note({"pct_of_roof": 107.0, "bound": "compute", "precision": "fp32"}, DEV)
    assert note and "measured fp32 roof" in note and "--refresh" in note
    # under a datasheet roof: the FLOP count is suspect
    note = above_roof_note({"pct_of_roof": 120.0, "bound": "compute", "precision": "bf16"}, DEV)
    assert note and "FLOP count" in note and "datasheet" in note
    assert above_roof_note({"pct_of_roof": 99.0, "bound": "compute", "precision": "fp32"}, DEV) is None
    assert above_roof_note({"pct_of_roof": float("nan"), "bound": "memory"}, DEV) is None


def test_an_above_roof_row_of_a_real_report_carries_a_note(sample_reports_dir: Path) -> None:
    report = Report.load(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope")
    top = top_kernels(report, 200)
    above = top[top["pct_of_roof"] > 100]
    assert len(above), "the sample CPU report has operators above the DRAM roof (cache-resident tensors)"
    notes = roof_notes(top, report.device)
    assert len(notes) == len(above)
    text = render_text(report, top=200, findings=False)
    for name in above["name"]:
        assert f"above the roof: {name}" in text


def test_every_time_at_stake_of_an_engine_report_is_on_the_run_its_finding_names(sample_reports_dir: Path) -> None:
    """The engine report holds a warm unprofiled run (the headline) and the profiled run (the kernels):
    decode-mbu quotes the headline's decode steps and takes its time at stake from the same steps
    (issue 45: not from the profiled run's), the kernel rules stay on the profiled run, each finding
    names its run, and the header says so once."""
    from perfscope.analysis.findings import run_rules, stake_clock
    from perfscope.analysis.intervals import run_span_ns
    from perfscope.analysis.steps import headline_steps

    report = Report.load(sample_reports_dir / "cpu-small-compiled-b1-p128-g32.perfscope")
    found = {f.id: f for f in run_rules(report)}
    assert "decode-mbu" in found and found["decode-mbu"].run == "headline"
    steps = headline_steps(report.steps_unprofiled)
    steps = steps[(steps["phase"] == "decode") & steps["weight_bytes"].notna()]
    bw = report.device.peak_bandwidth("dram")
    floor_ns = (steps["weight_bytes"] + steps["kv_cache_bytes"]) / bw * 1e9
    want = float(np.clip(steps["duration_ns"] - floor_ns, 0, None).sum())
    assert found["decode-mbu"].time_at_stake_ns == pytest.approx(want, rel=1e-9)
    assert found["fp32-matmul"].run == "profiled"
    assert "the run it names" in stake_clock(report)
    assert "[headline run]" in render_text(report) and "[profiled run]" in render_text(report)
    assert all(f.time_at_stake_ns <= run_span_ns(report, f.run) for f in found.values()
               if f.time_at_stake_ns == f.time_at_stake_ns)


def test_an_existing_output_names_the_commands_own_option(sample_reports_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`perfscope export` and `perfscope report` write with -o: refusing to overwrite, they say -o, not --out."""
    from perfscope.cli import main

    report = str(sample_reports_dir / "h100-nvfuser-matmul-nsys.perfscope")
    for command, out in (("export", tmp_path / "t.pftrace"), ("report", tmp_path / "r.html")):
        out.write_text("keep me")
        assert main([command, report, "-o", str(out)]) == 7
        err = capsys.readouterr().err
        assert "choose another -o" in err and "--out" not in err
        assert out.read_text() == "keep me"


def test_a_limiter_note_names_its_row_not_a_thousand_character_mangled_name() -> None:
    """rocprof-compute's MI308X FlashMLA run: its kernels' names run to 1,000+ characters; the text report's
    notes clip each to 60 and give its row number in the kernel table (seen reading the run as a user)."""
    from perfscope.analysis.readers.detect import import_file

    report = import_file(Path(__file__).parents[1] / "fixtures/rocprof/aiter_fmla_MI308X_rocprof_compute")
    top = top_kernels(report, 12)
    full = limiter_notes(top)
    short = limiter_notes(top, width=60)
    assert len(full) == len(short) >= 5
    assert max(len(top["name"].iloc[i]) for i in range(len(top))) > 1000
    for f, s in zip(full, short, strict=True):
        name, why = s.split(" (#", 1)
        row = int(why.split(")", 1)[0].split(",")[0]) - 1
        assert len(name) <= 60
        assert top["name"].iloc[row].startswith(name.rstrip("…"))
        assert f.endswith(why.split("): ", 1)[1])
    text = render_text(report, top=12, findings=False)
    lines = [ln for ln in text.splitlines() if "measured limiter disagrees" in ln]
    assert len(lines) == len(short) and all(len(ln) < 400 for ln in lines)
