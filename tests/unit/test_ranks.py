"""Per-rank analysis, stragglers, rank identity, the job plan, tiling and partial loads, on real traces
(checked against direct computations on the same JSON)."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from perfscope.analysis.ranks.dask_import import (
    MEMORY_PER_TRACE_BYTE,
    WORKER_BASE_BYTES,
    default_workers,
    discover,
    uncompressed_size,
)
from perfscope.analysis.ranks.job import (
    RankIdentity,
    RankResult,
    plan_job,
    rank_identity,
    trace_meta,
)
from perfscope.analysis.ranks.partial_read import load_ranks, rank_tables_at
from perfscope.analysis.ranks.stats import (
    find_stragglers,
    format_ranks,
    one_rank,
    rank_summary,
    rank_tables,
    step_table,
)
from perfscope.analysis.ranks.tiling import TileSpec, load_trace, tile_trace
from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.errors import InputFormatError, UsageError
from perfscope.report import Report
from perfscope.schema import TABLES
from tests.unit.ranks_support import B200, RANK0, RANK1, load_json, rank_times, step_durations


def _one(path):
    report = read_kineto(path)
    return report, one_rank(0, {n: report.table(n) for n in TABLES})


@pytest.mark.parametrize("rel", [RANK0, RANK1, B200])
def test_comm_compute_overlap_and_idle_match_a_direct_scan(fixtures_dir, rel):
    _, t = _one(fixtures_dir / rel)
    row = t.per_rank.iloc[0]
    want = rank_times(load_json(fixtures_dir / rel))
    for key in ("compute_ns", "comm_ns", "overlap_ns", "busy_ns", "span_ns"):
        assert row[key] == want[key], key
    assert row["idle_ns"] == want["span_ns"] - want["busy_ns"]
    assert row["exposed_comm_ns"] == want["comm_ns"] - want["overlap_ns"]
    assert row["overlap_pct"] == pytest.approx(100 * want["overlap_ns"] / want["comm_ns"])


def test_b200_collectives_on_one_stream_are_all_exposed(fixtures_dir):
    _, t = _one(fixtures_dir / B200)
    row = t.per_rank.iloc[0]
    assert row["comm_ns"] > 0 and row["overlap_ns"] == 0 and row["exposed_comm_ns"] == row["comm_ns"]
    # the engine step annotation is the one step (read at import as a vLLM step, with its phase); its
    # duration is the annotation's
    doc = load_json(fixtures_dir / B200)
    ann = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("execute_context_")]
    assert len(t.steps) == 1 and t.steps["source"].iloc[0] == "engine" and t.steps["phase"].iloc[0] == "prefill"
    assert t.steps["duration_ns"].iloc[0] == round(ann[0]["dur"] * 1000)
    assert t.per_rank["role"].iloc[0] == "prefill"


def test_profiler_steps_and_kernel_time_by_category(fixtures_dir):
    report, t = _one(fixtures_dir / RANK0)
    want = step_durations(load_json(fixtures_dir / RANK0))
    assert dict(zip(t.steps["step"], t.steps["duration_ns"])) == want
    assert t.per_rank["step_mean_ns"].iloc[0] == pytest.approx(statistics.mean(want.values()))
    by_cat = report.kernels.groupby("category")["duration_ns"].sum()
    assert dict(zip(t.categories["category"], t.categories["time_ns"])) == pytest.approx(by_cat.to_dict())
    assert t.kernels["time_ns"].sum() == report.kernels["duration_ns"].sum()


def test_engine_steps_table_is_used_when_there_are_no_step_ranges():
    steps = pd.DataFrame({"step": [0, 1], "phase": ["prefill", "decode"], "start_ns": [10, 50], "end_ns": [40, 60]})
    out = step_table(pd.DataFrame(columns=["name", "start_ns", "end_ns"]), steps)
    assert out["duration_ns"].tolist() == [30, 10] and set(out["source"]) == {"engine"}


def test_stragglers_margin_over_the_median_of_the_other_ranks():
    per_rank = pd.DataFrame({"rank": [0, 1, 2, 3, 4], "step_mean_ns": [100.0, 102.0, 98.0, 100.0, 130.0]})
    out = find_stragglers(per_rank, "step_mean_ns").set_index("rank")
    assert out["straggler"].tolist() == [True, False, False, False, False]
    assert out.index[0] == 4
    assert out.loc[4, "margin_pct"] == pytest.approx(30.0)          # median of 100, 102, 98, 100
    assert out.loc[4, "robust_z"] == pytest.approx(0.6745 * 30 / 2)  # MAD of all five is 2
    quiet = pd.DataFrame({"rank": [0, 1, 2, 3], "step_mean_ns": [100.0, 103.0, 98.0, 101.0]})
    assert not find_stragglers(quiet, "step_mean_ns")["straggler"].any()
    two = pd.DataFrame({"rank": [0, 1], "step_mean_ns": [100.0, 120.0]})
    flagged = find_stragglers(two, "step_mean_ns").set_index("rank")
    assert flagged.loc[1, "straggler"] and flagged.loc[1, "margin_pct"] == pytest.approx(20.0)


def test_format_ranks():
    assert format_ranks([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert format_ranks([]) == ""


# ---------------------------------------------------------------------------- identity
def test_rank_identity_from_distributed_info(fixtures_dir):
    ident = rank_identity(fixtures_dir / RANK1)
    assert (ident.rank, ident.world_size, ident.backend, ident.source) == (1, 128, "nccl", "distributedInfo")
    b200 = rank_identity(fixtures_dir / B200)
    assert (b200.rank, b200.world_size) == (0, 8) and b200.trace_id == "77C6C16CEF784657A94763DE3FE086C3"


def test_rank_identity_disagreement_tail_metadata_and_file_name(fixtures_dir, tmp_path):
    doc = load_trace(fixtures_dir / RANK0)
    named = tmp_path / "job_rank-5.json.gz"
    tile_trace(doc, named, TileSpec(rank=2, world_size=8))
    ident = rank_identity(named)
    assert ident.rank == 2 and ident.name_rank == 5 and "rank 5" in (ident.disagreement or "")
    # distributedInfo written after the events (Kineto's on-demand traces do that)
    tail = tmp_path / "ondemand.json"
    meta = {"distributedInfo": {"rank": 6, "world_size": 8, "backend": "nccl"}}
    tail.write_text(json.dumps({"schemaVersion": 1, "traceEvents": doc["traceEvents"][:50], **meta}))
    assert trace_meta(tail)["distributedInfo"]["rank"] == 6 and rank_identity(tail).rank == 6
    bare = tmp_path / "worker_rank_7.json"
    bare.write_text(json.dumps({"traceEvents": doc["traceEvents"][:50]}))
    assert (rank_identity(bare).rank, rank_identity(bare).source) == (7, "file name")


# ---------------------------------------------------------------------------- plan
def _res(i, rank, world=8, tid=None, error=None):
    return RankResult(index=i, path=f"/t/f{i}.json", error=error,
                      identity=RankIdentity(rank=rank, world_size=world, trace_id=tid, source="distributedInfo"))


def test_plan_skips_duplicates_other_jobs_bad_ranks_and_unreadable_files():
    results = [_res(0, 0), _res(1, 1), _res(2, 1), _res(3, 2, world=16), _res(4, 9), _res(5, None),
               _res(6, 3, error="damaged JSON")]
    plan = plan_job(results)
    assert plan.ranks == [0, 1] and plan.world_size == 8 and plan.missing == [2, 3, 4, 5, 6, 7]
    reasons = {s["path"]: s["reason"] for s in plan.skipped}
    assert reasons["/t/f2.json"].startswith("duplicate rank 1")
    assert "world_size 16" in reasons["/t/f3.json"]
    assert "outside world_size 8" in reasons["/t/f4.json"]
    assert reasons["/t/f5.json"].startswith("no rank")
    assert reasons["/t/f6.json"] == "unreadable: damaged JSON"
    assert any("6 of 8 ranks have no trace (ranks 2-7)" in w for w in plan.warnings)
    assert plan.params()["skipped"] == plan.skipped


def test_plan_trace_ids_group_jobs_only_when_shared():
    distinct = [_res(i, i, world=4, tid=f"id{i}") for i in range(4)]
    assert plan_job(distinct).ranks == [0, 1, 2, 3]           # one id per process: no job signal
    mixed = [_res(0, 0, world=4, tid="A"), _res(1, 1, world=4, tid="A"), _res(2, 2, world=4, tid="A"),
             _res(3, 0, world=4, tid="B"), _res(4, 1, world=4, tid="B")]
    plan = plan_job(mixed)
    assert plan.ranks == [0, 1, 2]
    assert {s["reason"] for s in plan.skipped} == {"another job: trace_id B, the job's is A"}


# ---------------------------------------------------------------------------- tiling
def test_tiling_repeats_events_renumbers_steps_and_keeps_ids_unique(fixtures_dir, tmp_path):
    doc = load_trace(fixtures_dir / RANK0)
    dst = tmp_path / "r.json.gz"
    n = tile_trace(doc, dst, TileSpec(rank=3, world_size=4, copies=3))
    meta_events = sum(1 for e in doc["traceEvents"] if e.get("ph") == "M")
    assert n == 3 * len(doc["traceEvents"]) - 2 * meta_events
    tiled = load_json(dst)
    assert tiled["distributedInfo"]["rank"] == 3 and tiled["distributedInfo"]["world_size"] == 4
    assert sorted(step_durations(tiled)) == [551, 552, 553, 554, 555, 556]
    corr = [e["args"]["correlation"] for e in tiled["traceEvents"] if e.get("cat") == "kernel"]
    assert len(corr) == len(set(corr)) == 3 * 1154
    report = read_kineto(dst)
    assert len(report.kernels) == 3 * 1154 and report.kernels["op"].notna().sum() == 3 * read_kineto(
        fixtures_dir / RANK0).kernels["op"].notna().sum()


def test_stretch_scales_step_times(fixtures_dir, tmp_path):
    doc = load_trace(fixtures_dir / RANK0)
    tile_trace(doc, tmp_path / "slow.json", TileSpec(rank=0, world_size=1, stretch=1.25))
    base, slow = step_durations(load_json(fixtures_dir / RANK0)), step_durations(load_json(tmp_path / "slow.json"))
    for step, dur in base.items():
        assert slow[step] == pytest.approx(1.25 * dur, abs=2000)  # float ts of epoch microseconds


# ---------------------------------------------------------------------------- multi-rank reports
@pytest.fixture(scope="module")
def two_rank_report(fixtures_dir, tmp_path_factory):
    parts = []
    for rank, rel in enumerate((RANK0, RANK1)):
        r = read_kineto(fixtures_dir / rel)
        parts.append({n: r.table(n).assign(rank=rank) for n in TABLES})
    tables = {n: pd.concat([p[n] for p in parts], ignore_index=True) for n in TABLES}
    report = Report.build(tables, {"params": {"ranks": {"world_size": 128}}})
    path = report.save(tmp_path_factory.mktemp("two") / "job.perfscope")
    return report, path


def test_load_ranks_reads_one_rank_and_some_columns(two_rank_report):
    report, path = two_rank_report
    assert (path / "kernels" / "rank=1").is_dir()
    df = load_ranks(path, "kernels", ranks=[1], columns=["name", "duration_ns"])
    assert list(df.columns) == ["name", "duration_ns", "rank"] and set(df["rank"]) == {1}
    want = report.kernels[report.kernels["rank"] == 1]
    assert len(df) == len(want) and df["duration_ns"].sum() == want["duration_ns"].sum()
    assert len(load_ranks(path, "ranges", ranks=[0])) == int((report.ranges["rank"] == 0).sum())


def test_load_ranks_refuses_ranks_on_a_table_without_them(fixtures_dir, tmp_path):
    path = read_kineto(fixtures_dir / RANK0).save(tmp_path / "one.perfscope")
    assert len(load_ranks(path, "kernels", columns=["name"])) == 1154
    with pytest.raises(UsageError):
        load_ranks(path, "kernels", ranks=[0])


def test_rank_tables_from_disk_equal_the_in_memory_ones(two_rank_report):
    report, path = two_rank_report
    mem, disk = rank_tables(report), rank_tables_at(path, [0, 1])

    def text_as_objects(df: pd.DataFrame) -> pd.DataFrame:  # a report's text is shared str objects in memory
        return df.astype({c: object for c in df.columns if pd.api.types.is_string_dtype(df[c].dtype)})

    pd.testing.assert_frame_equal(text_as_objects(mem.per_rank), text_as_objects(disk.per_rank))
    pd.testing.assert_frame_equal(text_as_objects(mem.steps), text_as_objects(disk.steps))


def test_rank_summary_covers_ranks_and_reports_missing(two_rank_report, fixtures_dir):
    report, _ = two_rank_report
    s = rank_summary(report)
    assert s["coverage"]["ranks"] == [0, 1] and s["coverage"]["missing_ranks"] == "2-127"
    per = {r["rank"]: r for r in s["per_rank"]}
    want = rank_times(load_json(fixtures_dir / RANK1))
    assert per[1]["comm_ns"] == want["comm_ns"] and per[1]["overlap_ns"] == want["overlap_ns"]
    steps = {r["step"]: r for r in s["steps"]}
    d0, d1 = step_durations(load_json(fixtures_dir / RANK0)), step_durations(load_json(fixtures_dir / RANK1))
    assert steps[552]["max_ns"] == max(d0[552], d1[552]) and steps[552]["ranks"] == 2
    assert json.dumps(s)  # JSON-ready


# ---------------------------------------------------------------------------- inputs and sizing
def test_discover_folder_glob_and_file(fixtures_dir, tmp_path):
    (tmp_path / "a_rank-0.json.gz").write_bytes(b"x")
    (tmp_path / "b_rank-1.sqlite").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".hidden.json").write_text("x")
    assert [p.name for p in discover(tmp_path)] == ["a_rank-0.json.gz", "b_rank-1.sqlite"]
    pattern = str(fixtures_dir / "kineto" / "hta_trace_filter__sampled_rank-*.json.gz")
    assert [p.name for p in discover(pattern)] == [Path(RANK0).name, Path(RANK1).name]
    assert discover(fixtures_dir / B200) == [fixtures_dir / B200]
    with pytest.raises(InputFormatError, match="no rank trace files"):
        discover(tmp_path / "*.nothing")
    with pytest.raises(InputFormatError, match="no such file"):
        discover(tmp_path / "missing")


def test_default_workers_fit_cpus_files_and_memory(fixtures_dir):
    f = fixtures_dir / B200
    size = uncompressed_size(f)
    assert size == len(gzip.decompress(f.read_bytes()))
    files = [f] * 5
    assert default_workers(files, cpus=8, available_bytes=10**12) == 5
    assert default_workers(files[:2], cpus=1, available_bytes=10**12) == 1
    per_worker = WORKER_BASE_BYTES + MEMORY_PER_TRACE_BYTE * size
    assert default_workers(files, cpus=8, available_bytes=int(3.5 * per_worker)) == 3
    assert default_workers(files, cpus=8, available_bytes=0) == 1
