"""One run behind each number (issue 45): every finding of every committed report names the run its
numbers and its time at stake come from, and changing the other run changes nothing in it.

An engine report holds two runs of one workload: the warm unprofiled run (the headline) and the
profiled run. A finding that quotes the headline's step times but takes its stake from the profiled
run moves when the profiled run is slowed; one whose numbers all come from one run does not. So each
report with both runs is checked twice: its headline run slowed 3x (every finding on the profiled
run must stay the same) and its profiled run dilated 3x (every finding on the headline must).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.findings import run_rules, stake_clock
from perfscope.analysis.rules._base import RUNS
from perfscope.analysis.summaries.serving import has_unprofiled
from perfscope.report import Report
from perfscope.schema import TABLES
from perfscope.text_report import render_text
from tests.conftest import REPO, _fixtures_dir

COMMITTED = sorted([*(REPO / "sample_reports").glob("*.perfscope"), *_fixtures_dir().glob("**/*.perfscope")])
HEADLINE_TABLES = ("steps_unprofiled", "requests_unprofiled")
FACTOR = 3
STAKE_SHARES = ("idle_in_steps_ns", "kernel_time_above_roof_ns", "kernel_time_above_light_ns")
"""Evidence of a headline finding that only the profiled run can measure (its idle gaps and kernels
inside the steps), put on the headline's stake as shares of it (``rules.evidence.on_stake_clock``).
They move when the profiled run changes shape (a dilation moves which gaps the idle table counts),
so they are checked to lie within the stake of the finding's run instead of to stay put."""


def _scaled(df: pd.DataFrame, factor: int) -> pd.DataFrame:
    """``df`` with every time (``*_ns``, ``*_s``) times ``factor`` and every rate (``*_per_s``) over it
    (integer clocks in integers: a 1.8e18 ns timestamp has no exact float64)."""
    out = df.copy()
    for c in out.columns:
        if not pd.api.types.is_numeric_dtype(out[c]) or pd.api.types.is_bool_dtype(out[c]):
            continue
        if c.endswith("_per_s"):
            out[c] = out[c].astype("float64") / factor
        elif c.endswith(("_ns", "_s")):
            out[c] = out[c] * factor
    return out


def slowed_headline(report: Report, factor: int = FACTOR) -> Report:
    """The report with its warm unprofiled run ``factor`` times slower (a busy machine during it)."""
    return report.replace(**{t: _scaled(getattr(report, t), factor) for t in HEADLINE_TABLES})


def dilated_trace(report: Report, factor: int = FACTOR) -> Report:
    """The report with its profiled run (every table but the headline's and the GEMM curve) ``factor``
    times slower on every clock."""
    skip = {*HEADLINE_TABLES, "gemm_curve"}
    return report.replace(**{t: _scaled(getattr(report, t), factor) for t in TABLES if t not in skip})


def _key(f: object) -> tuple[object, ...]:
    return (f.id, f.ranges, f.kernels)  # type: ignore[attr-defined]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-6)


def _assert_unchanged(before: list, after: list, run: str, how: str) -> None:
    mine = {_key(f): f for f in after}
    for f in before:
        if f.run != run:
            continue
        assert _key(f) in mine, f"{f.id} ({run} run) vanished when the {how}"
        g = mine[_key(f)]
        assert g.title == f.title, f"{f.id}: title moved when the {how}: {f.title!r} -> {g.title!r}"
        assert _same(g.time_at_stake_ns, f.time_at_stake_ns), f"{f.id}: stake moved when the {how}"
        assert g.severity == f.severity, f"{f.id}: severity moved when the {how}"
        for k, v in f.evidence.items():
            w = g.evidence.get(k)
            if k in STAKE_SHARES:
                continue
            if isinstance(v, float) and isinstance(w, float):
                assert _same(w, v), f"{f.id}: evidence {k} moved when the {how}: {v} -> {w}"
            else:
                assert w == v, f"{f.id}: evidence {k} moved when the {how}: {v!r} -> {w!r}"


def _shares_within_stake(found: list) -> None:
    """The profiled run's shares in a headline finding lie within its headline stake (they were put on it)."""
    for f in found:
        if f.run != "headline":
            continue
        shares = sum(float(f.evidence[k]) for k in STAKE_SHARES if k in f.evidence)
        assert math.isnan(f.time_at_stake_ns) or shares <= f.time_at_stake_ns * (1 + 1e-9) + 1e-6, \
            f"{f.id}: {shares} ns of its stake's shares over its {f.time_at_stake_ns} ns stake ({f.run} run)"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_finding_names_one_run_and_the_other_run_does_not_move_it(path: Path) -> None:
    report = Report.load(path)
    found = run_rules(report)  # an endpoint load test measures from outside: it may have none
    two_runs = has_unprofiled(report)
    for f in found:
        assert f.run in RUNS, f"{f.id}: run {f.run!r}"
        assert two_runs or f.run != "headline", f"{f.id} names the headline run of a report that has none"
    _shares_within_stake(found)
    if not two_runs:
        return
    _assert_unchanged(found, run_rules(slowed_headline(report)), "profiled", "headline run was slowed")
    dilated = run_rules(dilated_trace(report))
    _assert_unchanged(found, dilated, "headline", "profiled run was dilated")
    _shares_within_stake(dilated)


def test_the_committed_reports_hold_findings_of_both_runs() -> None:
    """The walk above checks findings of each run: the committed reports hold some of each."""
    runs = {f.run for p in COMMITTED for f in run_rules(Report.load(p))}
    assert {"headline", "profiled", "trace"} <= runs


def test_a_decode_finding_quotes_and_stakes_the_headline_steps() -> None:
    """The issue's case: decode-mbu quoted the headline's step time and took its stake from the
    profiled run. Both now come from the headline's steps: the stake is their time above the floor."""
    report = Report.load(REPO / "sample_reports" / "cpu-small-compiled-b1-p128-g32.perfscope")
    f = next(f for f in run_rules(report) if f.id == "decode-mbu")
    head = report.steps_unprofiled[report.steps_unprofiled["phase"] == "decode"]
    dur = head["duration_ns"].to_numpy(np.float64)
    floor = (head["weight_bytes"] + head["kv_cache_bytes"]).to_numpy(np.float64) / float(
        f.evidence["dram_roof_bytes_per_s"]) * 1e9
    assert f.run == "headline"
    assert f.evidence["decode_time_ns"] == pytest.approx(dur.sum())
    assert f.time_at_stake_ns == pytest.approx(np.clip(dur - floor, 0, None).sum())
    assert f.time_at_stake_ns < f.evidence["decode_time_ns"]


@pytest.mark.parametrize("path", [p for p in COMMITTED if has_unprofiled(Report.load(p))], ids=lambda p: p.name)
def test_the_timing_line_and_the_findings_header_give_one_overhead_figure(path: Path) -> None:
    report = Report.load(path)
    text = render_text(report)
    timing = next(line for line in text.splitlines() if line.startswith("timing:"))
    figure = f"profiler overhead x{report.params['profiler_overhead_ratio']:.2f}"
    assert figure in timing and figure in stake_clock(report)
    assert text.count("profiler overhead") == 2  # the timing line and the findings' header, the same words


def test_a_disturbed_baseline_gives_no_overhead_below_one_anywhere() -> None:
    """Profiled faster than the warm passes: no 'overhead x0.56' in the header while the timing line
    says it was not measured; both say the same words."""
    base = Report.load(REPO / "sample_reports" / "cpu-small-b1-p128-g32.perfscope")
    params = {**base.params, "unprofiled_wall_s": 1.75, "unprofiled_wall_s_passes": [1.75, 1.8],
              "profiler_overhead_ratio": 0.56}
    params.pop("baseline_verdict", None)
    report = base.with_manifest(params=params)
    text = render_text(report)
    assert "x0.56" not in text
    assert "profiler overhead not measured" in stake_clock(report)
    assert "profiler overhead not measured" in next(line for line in text.splitlines() if line.startswith("timing:"))
