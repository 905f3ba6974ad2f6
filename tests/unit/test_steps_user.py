"""Steps of any engine (issue 29): ``--steps REGEX`` / ``--phase-of REGEX=PHASE``, and the proposal made
when a trace has no framework's step annotation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.readers.finish import with_steps
from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.steps import StepRule, propose_steps
from perfscope.cli import main
from perfscope.errors import UsageError
from perfscope.report import Report
from tests.unit.idle_traces import launch_bound, sync_bound, weight_streaming

B200 = "kineto/tracelens_b200__eager_trace.json.gz"
SGLANG = "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz"


def _note(report: Report) -> list[str]:
    return [w for w in report.warnings if w.startswith("no step annotations found")]


@pytest.mark.parametrize(("build", "regex", "n", "phase"), [
    (weight_streaming, r"^token_\d+_processing$", 4, None),
    (launch_bound, r"^decode_step \d+$", 3, "decode"),  # the phase its name states
    (sync_bound, r"^iteration \d+$", 3, None),
])
def test_the_repeating_outermost_range_is_proposed_not_taken(tmp_path: Path, build, regex: str, n: int,
                                                              phase: str | None) -> None:
    r = read_kineto(build().write(tmp_path / "t.json"))
    assert len(r.steps) == 0  # nothing is guessed
    (note,) = _note(r)
    assert f"--steps '{regex}'" in note and f"({n} ranges" in note and "none is guessed" in note
    # the proposed regex, accepted, gives one step per range
    stepped = with_steps(r, StepRule.parse(regex))
    assert len(stepped.steps) == n and not _note(stepped)
    assert list(stepped.steps["phase"]) == [phase] * n and set(stepped.steps["framework"]) == {"user"}
    if phase is None:  # steps that name no phase are one row of the phase table, with their count
        from perfscope.analysis.summaries.serving import phase_summary

        (row,) = phase_summary(stepped).to_dict("records")
        assert row["phase"] == "all" and row["steps"] == n
        assert row["kernel_time_s"] * 1e9 == pytest.approx(float(
            stepped.kernels.loc[stepped.kernels["step"].notna(), "duration_ns"].sum()))


@pytest.mark.parametrize(("name", "phase"), [
    ("decode", "decode"), ("decode_step 12", "decode"), ("Prefill chunk", "prefill"), ("DECODE[bs=4]", "decode"),
    ("verify_3", "verify"), ("draft", "draft"), ("mixed step", "mixed"),
    ("decoder", None), ("predecode", None), ("prefill_and_decode", None), ("token_0_processing", None),
])
def test_the_phase_a_name_states(name: str, phase: str | None) -> None:
    from perfscope.analysis.steps import phase_in_name

    assert phase_in_name(name) == phase
    assert StepRule.parse(".").label(name).phase == phase
    assert StepRule.parse(".", [".=decode"]).label(name).phase == "decode"  # --phase-of says first


def test_the_engines_prefill_and_decode_are_proposed_together(load) -> None:
    """The reference engine's own trace on the H200 (one prefill, then 7 decode ranges of generate(..., 8)):
    the proposal takes both names, and its regex gives each range its phase from its name."""
    r = load("h200/h200_llama1b_engine_eager.pt.trace.json.gz")
    (note,) = _note(r)
    assert "--steps '^(?:prefill|decode)$'" in note and "(8 ranges" in note
    s = with_steps(r, StepRule.parse("^(?:prefill|decode)$"))
    assert list(s.steps["phase"]) == ["prefill"] + ["decode"] * 7
    from perfscope.analysis.summaries.serving import phase_summary

    table = phase_summary(s).set_index("phase")
    assert table.loc["prefill", "steps"] == 1 and table.loc["decode", "steps"] == 7


def test_steps_and_phases_from_the_flags(tmp_path: Path) -> None:
    trace = weight_streaming(tokens=4, layers=2)
    r = read_kineto(trace.write(tmp_path / "t.json"))
    rule = StepRule.parse(r"^token_(?P<tokens>\d+)_processing$", ["^token_0_=prefill", "token=decode"])
    s = with_steps(r, rule)
    assert list(s.steps["phase"]) == ["prefill", "decode", "decode", "decode"]
    assert list(s.steps["label"]) == [f"token_{i}_processing" for i in range(4)]
    # each kernel is in the step whose range holds its launch: 2 layers x 6 launches per token
    assert s.kernels.groupby("step").size().tolist() == [12] * 4
    assert (s.kernels.loc[s.kernels["step"] == 0, "phase"] == "prefill").all()
    want = [(st, en) for st, en, name in trace.ranges if re.match(r"token_\d+_processing", name)]
    assert list(zip(s.steps["start_ns"], s.steps["end_ns"])) == [(a * 1000, b * 1000) for a, b in sorted(want)]
    # the idle table now measures the inference window (first step to last) and the rules run
    assert s.idle["window_ns"].iloc[0] <= r.idle["window_ns"].iloc[0]
    assert not [f for f in run_rules(s) if f.id == "rule-error"]


def test_a_regex_that_matches_nothing_says_so(tmp_path: Path) -> None:
    r = read_kineto(launch_bound().write(tmp_path / "t.json"))
    s = with_steps(r, StepRule.parse("^nothing$"))
    assert len(s.steps) == 0 and any("matches no range" in w for w in s.warnings)


@pytest.mark.parametrize("args", [("(unclosed",), ("x", ["no-equals"]), ("x", ["=decode"])])
def test_bad_flags_are_usage_errors(args) -> None:
    with pytest.raises(UsageError):
        StepRule.parse(*args)


def test_framework_traces_keep_their_steps_and_get_no_proposal(load) -> None:
    for name in (B200, SGLANG):
        r = load(name)
        assert len(r.steps) and not _note(r)


def test_proposal_skips_module_ranges_and_profiler_steps(load) -> None:
    """HTA's traces mark iterations with ProfilerStep#N (the profiler's schedule) and a with_stack
    trace numbers nn.Module calls (Linear_3): neither is proposed."""
    for name in ("kineto/hta_trace_filter__sampled_rank-0.json.gz", "kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"):
        r = load(name)
        for note in _note(r):
            assert "ProfilerStep" not in note and "Linear" not in note


def test_cli_import_with_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = weight_streaming().write(tmp_path / "t.json")
    code = main(["import", str(trace), "--out", str(tmp_path / "a.perfscope"), "--no-html"])
    err = capsys.readouterr().err
    assert code == 0 and r"--steps '^token_\d+_processing$'" in err
    code = main(["import", str(trace), "--out", str(tmp_path / "b.perfscope"), "--no-html",
                 "--steps", r"^token_\d+_processing$", "--phase-of", "token_0_=prefill", "--phase-of", "token=decode"])
    out, err = capsys.readouterr()
    assert code == 0 and "steps: 4 ranges" in out and "no step annotations" not in err
    saved = Report.load(tmp_path / "b.perfscope")
    assert list(saved.steps["phase"]) == ["prefill", "decode", "decode", "decode"]
    assert len(saved.idle) and set(saved.idle["cause"]) <= {"copy", "host", "launch"}
    code = main(["import", str(trace), "--out", str(tmp_path / "c.perfscope"), "--phase-of", "a=b"])
    assert code != 0 and "--phase-of goes with --steps" in capsys.readouterr().err


def test_propose_steps_needs_repeats_around_the_gpu_work() -> None:
    import numpy as np
    import pandas as pd

    ranges = pd.DataFrame({"name": ["forward", "forward", "setup"], "start_ns": [0, 100, 300],
                           "end_ns": [90, 190, 400], "depth": [0, 0, 0], "source": "record_function"})
    assert propose_steps(ranges, np.array([10, 20, 110, 120])) == ("^forward$", "forward", 2)
    assert propose_steps(ranges, np.array([310, 320, 330, 10])) is None  # most launches are in setup, once


def test_nsys_export_with_steps(tmp_path: Path, fixtures_dir: Path) -> None:
    """The issue's trace is an nsys export: NVTX ranges take the same path."""
    from perfscope.analysis.readers.nsys.reader import read_nsys_sqlite
    from tests.unit.idle_traces import NSYS_TEMPLATE, write_nsys

    r = read_nsys_sqlite(write_nsys(weight_streaming(), fixtures_dir / NSYS_TEMPLATE, tmp_path / "t.sqlite"))
    (note,) = _note(r)
    assert r"--steps '^token_\d+_processing$'" in note
    s = with_steps(r, StepRule.parse(r"^token_\d+_processing$", ["token_0_=prefill", "token=decode"]))
    assert list(s.steps["phase"]) == ["prefill", "decode", "decode", "decode"]
    assert s.kernels.groupby("step").size().tolist() == [24] * 4


def test_cli_profile_of_a_script_with_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import textwrap

    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import torch
        x, w = torch.randn(16, 32), torch.randn(32, 32)
        for i in range(3):
            with torch.profiler.record_function(f"iteration {i}"):
                y = (x @ w).relu().sum()
    """))
    out = tmp_path / "p.perfscope"
    code = main(["profile", "--steps", r"^iteration \d+$", "--phase-of", "iteration 0=prefill", "--no-baseline",
                 "--no-html", "-q", "--out", str(out), "--", "python", str(script)])
    assert code == 0, capsys.readouterr().err
    r = Report.load(out)
    assert list(r.steps["label"]) == ["iteration 0", "iteration 1", "iteration 2"]
    assert list(r.steps["phase"].astype(object).where(r.steps["phase"].notna(), None)) == ["prefill", None, None]
    assert r.kernels["step"].notna().sum() >= 3  # the operators run inside the steps
    assert main(["profile", "--steps", "x", "--no-baseline", "-q"]) != 0  # the engine marks its own steps
    assert "--steps names the steps of a profiled command" in capsys.readouterr().err
