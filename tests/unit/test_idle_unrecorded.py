"""Idle cause ``unrecorded``: AMD traces number every dispatch of a process (rocprofv3 ``Dispatch_Id``, rocpd
``dispatch_id``, rocprof v1/v2 ``Index`` / ``Dispatch_ID``); a gap whose neighbouring kernels enclose ids the whole
trace lacks held kernels the trace does not hold (a kernel filter, sampling, lost records): not idle, not host work.

Checked on the real captures: the gfx1151 decode trace its author thinned (ids counted here with the csv module,
independently of the reader), the same run's prefill (contiguous ids), the R9700 rocpd DB and rocprof v1 results
(contiguous), a Kineto and an nsys capture (no ids: no change), and the prefill trace with a kernel filter applied
here (a file the mechanism was not tuned on)."""

from __future__ import annotations

import csv
import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.idle import (
    CAUSES,
    KINDS,
    dispatch_ids,
    idle_of,
    idle_overview,
    missing_between,
    unrecorded_facts,
    unrecorded_gaps,
    unrecorded_summary,
)
from perfscope.analysis.readers.detect import import_file
from perfscope.text_report import render_text

RUN = Path("rocprof") / "rocprofv3_llamacpp_gfx1151_trimmed"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _truth(path: Path) -> tuple[set[int], list[tuple[int, int]], dict[int, tuple[int, int]]]:
    """From the CSV alone: the ids missing between the first and last kernel, the runs of them (id before, id
    after), and each kernel's (start, end) by id."""
    rows = _rows(path)
    times = {int(r["Dispatch_Id"]): (int(r["Start_Timestamp"]), int(r["End_Timestamp"])) for r in rows}
    ids = sorted(times)
    missing = set(range(ids[0], ids[-1] + 1)) - set(ids)
    runs = [(a, b) for a, b in itertools.pairwise(ids) if b - a > 1]
    return missing, runs, times


@pytest.fixture(scope="module")
def decode(fixtures_dir: Path):  # type: ignore[no-untyped-def]
    return import_file(fixtures_dir / RUN / "decode_kernel_trace.csv")


def test_decode_gaps_over_missing_ids_are_unrecorded(fixtures_dir: Path, decode) -> None:  # type: ignore[no-untyped-def]
    missing, runs, times = _truth(fixtures_dir / RUN / "decode_kernel_trace.csv")
    assert len(missing) == 4590 and len(runs) == 5  # the fixture's README: ~24 dispatches kept per token
    # the reader keeps every dispatch id, and the import says what the trace lacks
    assert sorted(decode.kernels["dispatch_id"].astype(int).tolist()) == sorted(times)
    got = unrecorded_summary(decode.kernels)
    assert got is not None and got["missing"] == len(missing) and got["runs"] == len(runs)
    assert any(f"lacks {len(missing):,} of the" in w for w in decode.manifest["warnings"])
    idle = idle_of(decode)
    unrec = idle[idle["cause"] == "unrecorded"]
    gaps = unrec.groupby("gap").agg(start=("start_ns", "min"), end=("end_ns", "max"),
                                    n=("unrecorded_dispatches", "first"), lo=("dispatch_before", "first"),
                                    hi=("dispatch_after", "first"))
    # one unrecorded gap per run of missing ids, from the end of the kernel before it to the start of the one after
    assert sorted(zip(gaps["lo"].astype(int), gaps["hi"].astype(int), strict=True)) == runs
    for row in gaps.itertuples():
        assert row.n == row.hi - row.lo - 1
        assert row.start == times[int(row.lo)][1] and row.end == times[int(row.hi)][0]
    facts = unrecorded_facts(idle)
    assert facts["dispatches"] == len(missing) and facts["gaps"] == len(runs)
    assert facts["first"] == min(missing) and facts["last"] == max(missing)
    # every other slice keeps its cause; none of the unrecorded gaps is host time
    assert set(idle["cause"]) <= set(CAUSES) and "unrecorded" in KINDS
    assert unrec["host_kind"].isna().all() and unrec["api"].isna().all()
    other = idle[idle["cause"] != "unrecorded"]
    assert other["unrecorded_dispatches"].isna().all()


def test_decode_gpu_idle_says_what_the_trace_shows(decode) -> None:  # type: ignore[no-untyped-def]
    idle = idle_of(decode)
    unrec_ns = float(idle.loc[idle["cause"] == "unrecorded", "duration_ns"].sum())
    f = next(f for f in run_rules(decode) if f.id == "gpu-idle")
    ev = f.evidence
    assert ev["unrecorded_dispatches"] == 4590 and ev["unrecorded_gaps"] == 5 and ev["unrecorded_ns"] == unrec_ns
    assert ev["measured_idle_ns"] == pytest.approx(float(ev["idle_ns"]) - unrec_ns)
    assert ev["measured_span_ns"] == pytest.approx(float(ev["span_ns"]) - unrec_ns)
    assert f"{ev['measured_idle_pct']:.0f}% of the active span" in f.title and "left out, not idle" in f.title
    # the advice starts with what the trace lacks; the host share is of the idle time as measured, not 91% of it all
    assert f.recommendation.startswith(f"{unrec_ns / 1e6:.0f} ms of the idle span lies in 5 gaps over which the trace "
                                       "lacks 4,590 dispatches (ids 188..4873)")
    assert "Re-profile without the kernel filter" in f.recommendation
    assert "For 91% of the idle time the host ran its own code" not in f.recommendation
    # that time is not at stake (it is not idle): the finding's time at stake is the measured idle, and no item is
    # an unrecorded gap, nor host code over it
    assert f.time_at_stake_ns == pytest.approx(float(ev["measured_idle_ns"]))
    assert not any(i.attrs.get("kind") == "unrecorded" for i in f.items)
    assert not any(i.attrs.get("kind") == "host code" and i.time_ns >= unrec_ns for i in f.items)
    assert f.explained_ns <= f.time_at_stake_ns
    # the largest gap named is the largest measured one, not an unrecorded one
    measured = idle[idle["cause"] != "unrecorded"].groupby("gap")["duration_ns"].sum()
    assert ev["gap1_ns"] == pytest.approx(float(measured.max()))


def test_decode_short_kernel_gaps_leave_unrecorded_out(decode) -> None:  # type: ignore[no-untyped-def]
    f = next(f for f in run_rules(decode) if f.id == "short-kernels")
    assert f.evidence["gaps_before_short_unrecorded"] >= 1
    assert not any(i.attrs.get("kind") == "unrecorded" for i in f.items)
    assert f.time_at_stake_ns == pytest.approx(sum(i.time_ns for i in f.items))
    assert "over dispatches the trace lacks" in f.recommendation


def test_decode_idle_section_and_json(decode) -> None:  # type: ignore[no-untyped-def]
    (dev,) = idle_overview(idle_of(decode))
    unrec = dev["unrecorded"]
    assert unrec["dispatches"] == 4590 and unrec["gaps"] == 5  # type: ignore[index]
    assert dev["measured_idle_ns"] == pytest.approx(dev["idle_ns"] - unrec["ns"])  # type: ignore[index, operator]
    text = render_text(decode)
    line = next(ln for ln in text.splitlines() if ln.startswith("idle on gpu:1"))
    assert "as measured" in line and "4,590 dispatches left out" in line and "unrecorded 73%" in line


@pytest.mark.parametrize("rel", [str(RUN / "prefill_kernel_trace.csv"), "rocprof/llamacpp_r9700_rocpd/32432_results.db",
                                 "rocprof/llamacpp_r9700_rocprof_v1/results.csv",
                                 "rocprof/llamacpp_r9700_rocprof_v1/results.db",
                                 "rocprof/aiter_fmla_MI308X_rocprofv2_trace/results_430889.csv"])
def test_contiguous_ids_give_no_unrecorded_gap(fixtures_dir: Path, rel: str) -> None:
    """These captures hold every dispatch between their first and last (checked from the source here)."""
    path = fixtures_dir / rel
    if path.suffix == ".csv":
        rows = _rows(path)
        col = next(c for c in ("Dispatch_Id", "Dispatch_ID", "Index") if c in rows[0])
        src = sorted(int(r[col]) for r in rows)
    else:
        import sqlite3

        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        sql = "SELECT dispatch_id FROM kernels" if "rocpd" in rel else "SELECT \"Index\" FROM KERN"
        src = sorted(int(r[0]) for r in db.execute(sql))
        db.close()
    assert src[-1] - src[0] + 1 == len(set(src))  # contiguous at the source
    report = import_file(path)
    assert sorted(report.kernels["dispatch_id"].astype(int).tolist()) == src
    got = unrecorded_summary(report.kernels)
    assert got is not None and got["missing"] == 0
    assert not any("dispatch ids" in w for w in report.manifest["warnings"])
    idle = idle_of(report)
    assert "unrecorded" not in set(idle["cause"]) and idle["unrecorded_dispatches"].isna().all()


@pytest.mark.parametrize("rel", ["kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                                 "nsys/aws_t4_softmax.sqlite", "rocprof/llamacpp_r9700_rocprof_v1/results.json"])
def test_traces_without_dispatch_ids_are_unchanged(fixtures_dir: Path, rel: str) -> None:
    """Kineto and nsys number no dispatch; rocprof v1's JSON trace writes no Index in its events' args."""
    report = import_file(fixtures_dir / rel)
    assert "dispatch_id" not in report.kernels or report.kernels["dispatch_id"].isna().all()
    idle = idle_of(report)
    assert len(idle) and "unrecorded" not in set(idle["cause"])
    for col in ("unrecorded_dispatches", "dispatch_before", "dispatch_after"):
        assert idle[col].isna().all()
    assert unrecorded_summary(report.kernels) is None
    assert all("unrecorded" not in f.title for f in run_rules(report))


def test_a_kernel_filter_applied_to_prefill(fixtures_dir: Path, tmp_path: Path) -> None:
    """The prefill trace (contiguous ids, not the file the mechanism was written on) with every mul_mat_vec /
    mul_mat kernel dropped, as ``--kernel-exclude-regex mul_mat`` would: every dropped kernel lies in an unrecorded
    gap or beside kept work, and the ids the trace lacks are the kernels dropped."""
    src = fixtures_dir / RUN / "prefill_kernel_trace.csv"
    rows = _rows(src)
    drop = [r for r in rows if re.search("mul_mat", r["Kernel_Name"])]
    keep = [r for r in rows if not re.search("mul_mat", r["Kernel_Name"])]
    assert drop and keep
    out = tmp_path / "prefill_kernel_trace.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), quoting=csv.QUOTE_ALL)
        w.writeheader()
        w.writerows(keep)
    report = import_file(out)
    kept_ids = sorted(int(r["Dispatch_Id"]) for r in keep)
    inner = [int(r["Dispatch_Id"]) for r in drop if kept_ids[0] < int(r["Dispatch_Id"]) < kept_ids[-1]]
    got = unrecorded_summary(report.kernels)
    assert got is not None and got["missing"] == len(inner)
    idle = idle_of(report)
    unrec = idle[idle["cause"] == "unrecorded"]
    assert len(unrec)
    s, e = unrec["start_ns"].to_numpy(np.int64), unrec["end_ns"].to_numpy(np.int64)
    ks = np.array([int(r["Start_Timestamp"]) for r in keep]); ke = np.array([int(r["End_Timestamp"]) for r in keep])
    origin = min(int(r["Start_Timestamp"]) for r in keep)  # the report's timeline starts at the first kept kernel
    shift = int(report.kernels["start_ns"].min()) - origin
    for r in drop:
        if not kept_ids[0] < int(r["Dispatch_Id"]) < kept_ids[-1]:
            continue
        mid = (int(r["Start_Timestamp"]) + int(r["End_Timestamp"])) // 2 + shift
        in_unrec = bool(((s <= mid) & (mid < e)).any())
        under_kept = bool(((ks + shift <= mid) & (mid < ke + shift)).any())
        assert in_unrec or under_kept, r["Dispatch_Id"]
    # where no id is missing, nothing is unrecorded: the unrecorded gaps' counts add up to the dropped kernels
    facts = unrecorded_facts(idle)
    assert facts["dispatches"] == len(inner)


def test_unrecorded_gaps_mechanism() -> None:
    """Queues out of order, ids on another device (held: not missing), ids missing at the ends (no gap there)."""
    # one device: kernels started at 0, 10, 20, 30 with ids 1, 3, 2, 9 (two queues: 3 before 2); gaps after each
    starts = np.array([0, 10, 20, 30], np.int64)
    ids = np.array([1.0, 3.0, 2.0, 9.0])
    held = np.array([1, 2, 3, 5, 9], np.int64)  # id 5 is another device's kernel: not missing
    ist, ien = np.array([5, 15, 25], np.int64), np.array([10, 20, 30], np.int64)
    n, lo, hi = unrecorded_gaps(starts, ids, held, ist, ien)
    # gap 1: highest id before 1, lowest after 2: nothing between; gap 2: 3 before, 2 after: none; gap 3: 3..9
    assert n.tolist() == [0, 0, 4] and lo.tolist() == [1.0, 3.0, 3.0] and hi.tolist() == [2.0, 2.0, 9.0]
    assert missing_between(held, np.array([np.nan, 1.0]), np.array([4.0, 2.0])).tolist() == [0, 0]


def test_damaged_ids_read_as_missing() -> None:
    k = pd.DataFrame({"dispatch_id": pd.array(["7", "x", "-3", str(1 << 60), "2.5", None, "8"], dtype=object)})
    got = dispatch_ids(k)
    assert got[0] == 7 and got[-1] == 8 and np.isnan(got[1:6]).all()
    dup = pd.DataFrame({"dispatch_id": [4, 4, 4, 6]})
    assert unrecorded_summary(dup) == {"missing": 1, "ids": 3, "first": 4, "last": 6, "runs": 1, "largest_run": 1}


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_host_code_before_kernels_without_their_launch_call_is_untraced(fixtures_dir: Path, phase: str) -> None:
    """The same run's API file was thinned too (every 20th row): a gap before a kernel whose Correlation_Id has no
    HIP API row (checked here with the csv module) is not "host code", it is host time the trace does not cover."""
    kernels = _rows(fixtures_dir / RUN / f"{phase}_kernel_trace.csv")
    calls = {r["Correlation_Id"] for r in _rows(fixtures_dir / RUN / f"{phase}_hip_api_trace.csv")}
    no_call = {int(r["Start_Timestamp"]) for r in kernels if r["Correlation_Id"] not in calls}
    assert 0 < len(no_call) < len(kernels)
    report = import_file(fixtures_dir / RUN / f"{phase}_kernel_trace.csv")
    shift = int(report.kernels["start_ns"].min()) - min(int(r["Start_Timestamp"]) for r in kernels)
    idle = idle_of(report)
    untraced = idle[idle["host_kind"] == "untraced"]
    assert len(untraced) and not (idle["host_kind"] == "host code").any()
    gap_end = idle.groupby("gap")["end_ns"].max()
    for g in untraced["gap"].unique():
        assert int(gap_end[g]) - shift in no_call  # the kernel after the gap has no launch call in the trace
    f = next(f for f in run_rules(report) if f.id == "gpu-idle") if phase == "decode" else None
    if f is not None:
        assert "host time whose calls the trace lacks" in f.title
        assert "Record the full API trace" in f.recommendation and "Move or overlap this host work" not in f.recommendation
        item = next(i for i in f.items if i.attrs.get("kind") == "untraced")
        assert not item.explains  # what the host did there is unknown


def test_complete_api_trace_has_no_untraced_time(fixtures_dir: Path, tmp_path: Path) -> None:
    """The decode run cut to the kernels whose launch call its API file holds (no committed AMD capture has a
    complete API trace: the R9700 rocpd DB keeps no regions): no gap is untraced; what the host did stays read."""
    kernels = _rows(fixtures_dir / RUN / "decode_kernel_trace.csv")
    api = fixtures_dir / RUN / "decode_hip_api_trace.csv"
    calls = {r["Correlation_Id"] for r in _rows(api)}
    keep = [r for r in kernels if r["Correlation_Id"] in calls]
    out = tmp_path / "decode_kernel_trace.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(kernels[0]), quoting=csv.QUOTE_ALL)
        w.writeheader()
        w.writerows(keep)
    (tmp_path / "decode_hip_api_trace.csv").write_bytes(api.read_bytes())
    report = import_file(out)
    assert len(report.api) and report.kernels["correlation"].isin(report.api["correlation"]).all()
    idle = idle_of(report)
    assert len(idle) and not (idle["host_kind"] == "untraced").any()
