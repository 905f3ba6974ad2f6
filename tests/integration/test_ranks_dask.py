"""Multi-rank import on a real Dask LocalCluster (2 process workers) over the real multi-rank fixtures
and rank sets tiled from them, checked against direct computations on the trace JSON."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.ranks.dask_import import import_ranks
from perfscope.analysis.ranks.partial_read import load_ranks
from perfscope.analysis.ranks.stats import rank_summary
from perfscope.analysis.ranks.tiling import SyncJob, load_trace, write_sync_job
from perfscope.cli import main
from perfscope.errors import InputFormatError, OutputExistsError, UsageError
from perfscope.report import Report
from tests.unit.ranks_support import (
    B200,
    RANK0,
    RANK1,
    build_rank_set,
    collective_waits,
    intervals,
    load_json,
    rank_times,
    step_durations,
)

distributed = pytest.importorskip("dask.distributed")


@pytest.fixture(scope="module")
def scheduler():
    """One local cluster of 2 process workers, shared by the tests through its scheduler address."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                                  silence_logs=40) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def straggler_job(fixtures_dir, tmp_path_factory, scheduler):
    """4 ranks tiled twice from the two sampled ranks; rank 3 runs 25% slower."""
    folder = tmp_path_factory.mktemp("job")
    files = build_rank_set(fixtures_dir, folder / "traces",
                           [(RANK0, 1.0), (RANK1, 1.0), (RANK0, 1.0), (RANK1, 1.25)], copies=2)
    res = import_ranks(folder / "traces", folder / "job.perfscope", scheduler=scheduler, render=_render)
    return files, res, (res.path / "ranks.html").read_text()


def _render(tables, stragglers, manifest):
    """Run on a worker, from the views stored in the report (module-level: Dask pickles it by name)."""
    return {"ranks.html": f"<html>ranks {tables.ranks} of {manifest['params']['ranks']['world_size']}</html>"}


def test_every_rank_lands_in_its_partition_with_its_kernels(straggler_job):
    files, res, html = straggler_job
    report = Report.load(res.path)
    assert sorted(report.kernels["rank"].unique()) == [0, 1, 2, 3]
    for rank, f in enumerate(files):
        doc = load_json(f)
        assert (res.path / "kernels" / f"rank={rank}" / "part-0.parquet").is_file()
        assert int((report.kernels["rank"] == rank).sum()) == len(intervals(doc, ("kernel",)))
        one = load_ranks(res.path, "kernels", ranks=[rank], columns=["duration_ns"])
        assert one["duration_ns"].sum() == sum(e - s for s, e, _ in intervals(doc, ("kernel",)))
    assert res.manifest["params"]["ranks"]["ranks"] == [0, 1, 2, 3] and res.plan.skipped == []
    assert html == "<html>ranks [0, 1, 2, 3] of 4</html>"
    assert not list(res.path.parent.glob(".job.perfscope.tmp-*"))


def test_the_slow_rank_is_found_with_its_margin(straggler_job):
    files, res, _ = straggler_job
    means = [statistics.mean(step_durations(load_json(f)).values()) for f in files]
    margin = 100 * (means[3] - statistics.median(means[:3])) / statistics.median(means[:3])
    summary = rank_summary(Report.load(res.path))
    hits = [s for s in summary["stragglers"] if s["metric"] == "step_mean_ns"]
    assert [s["rank"] for s in hits] == [3]
    assert hits[0]["margin_pct"] == pytest.approx(margin, rel=1e-9)
    assert 24.0 < margin < 27.0  # 25% slower than rank 1, compared with the median of ranks 0-2
    finding = next(f for f in run_rules(Report.load(res.path)) if f.id == "rank-imbalance")
    assert finding.evidence["rank"] == 3 and finding.evidence["ranks_covered"] == "0-3"


def test_peak_memory_is_reported_per_worker(straggler_job):
    _, res, _ = straggler_job
    peaks = res.manifest["params"]["ranks"]["workers_peak_rss_bytes"]
    assert 1 <= len(peaks) <= 2 and all(v > 50 << 20 for v in peaks.values())
    assert {r.worker for r in res.results} == set(peaks)


def test_two_sampled_ranks_of_a_128_rank_job(fixtures_dir, tmp_path, scheduler):
    pattern = str(fixtures_dir / "kineto" / "hta_trace_filter__sampled_rank-*.json.gz")
    res = import_ranks(pattern, tmp_path / "sampled.perfscope", scheduler=scheduler)
    report = Report.load(res.path)
    ranks = res.manifest["params"]["ranks"]
    assert ranks["ranks"] == [0, 1] and ranks["world_size"] == 128 and ranks["missing"] == "2-127"
    assert report.manifest["partial"] is True
    assert any("126 of 128 ranks have no trace" in w for w in report.warnings)
    per = {r["rank"]: r for r in rank_summary(report)["per_rank"]}
    for rank, rel in ((0, RANK0), (1, RANK1)):
        want = rank_times(load_json(fixtures_dir / rel))
        assert per[rank]["comm_ns"] == want["comm_ns"] and per[rank]["overlap_ns"] == want["overlap_ns"]


def test_b200_ranks_with_collectives(fixtures_dir, tmp_path, scheduler):
    build_rank_set(fixtures_dir, tmp_path / "b200", [(B200, 1.0)] * 3, world_size=8)
    res = import_ranks(tmp_path / "b200", tmp_path / "b200.perfscope", scheduler=scheduler)
    want = rank_times(load_json(fixtures_dir / B200))
    pr = res.tables.per_rank.set_index("rank")
    assert list(pr.index) == [0, 1, 2] and res.plan.missing == [3, 4, 5, 6, 7]
    assert (pr["comm_ns"] == want["comm_ns"]).all() and (pr["exposed_comm_ns"] == want["comm_ns"]).all()
    assert res.manifest["device"]["name"] == "NVIDIA B200"


def test_bad_rank_set_is_reported_file_by_file(fixtures_dir, tmp_path, scheduler):
    folder = tmp_path / "bad"
    build_rank_set(fixtures_dir, folder, [(RANK0, 1.0), (RANK1, 1.0)], world_size=4)
    shutil.copy(folder / "trace_rank-1.json.gz", folder / "trace_rank-1-again.json.gz")
    (folder / "trace_rank-2.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage, not a trace")
    (folder / "trace_rank-3.json").write_bytes(b"")
    other = build_rank_set(fixtures_dir, tmp_path / "other", [(B200, 1.0)], world_size=8)[0]
    shutil.copy(other, folder / "other_job_rank-0.json.gz")
    (folder / "notes.txt").write_text("not a trace")
    res = import_ranks(folder, tmp_path / "bad.perfscope", scheduler=scheduler)
    reasons = {Path(s["path"]).name: s["reason"] for s in res.plan.skipped}
    assert res.plan.ranks == [0, 1] and res.plan.missing == [2, 3]
    assert reasons["trace_rank-1.json.gz"].startswith("duplicate rank 1")  # sorted first: -again kept
    assert reasons["trace_rank-2.json.gz"].startswith("unreadable:")
    assert reasons["trace_rank-3.json"].startswith("unreadable:") and "empty" in reasons["trace_rank-3.json"]
    assert reasons["other_job_rank-0.json.gz"] == "another job: world_size 8, the job's is 4"
    assert "notes.txt" not in reasons and len(reasons) == 4
    report = Report.load(res.path)
    assert report.params["ranks"]["skipped"] == res.plan.skipped
    assert sum("skipped" in w for w in report.warnings) == 4
    assert rank_summary(report)["coverage"]["missing_ranks"] == "2-3"


def test_nsys_exports_take_their_rank_from_the_file_name(fixtures_dir, tmp_path, scheduler):
    src = fixtures_dir / "nsys" / "nvfuser_h100_matmul.sqlite"
    for rank in (0, 1):
        (tmp_path / f"job_rank{rank}.sqlite").symlink_to(src)  # read in place
    res = import_ranks(tmp_path, tmp_path / "nsys.perfscope", scheduler=scheduler)
    report = Report.load(res.path)
    assert res.plan.ranks == [0, 1] and res.plan.world_size is None and res.plan.missing == []
    assert res.manifest["params"]["ranks"]["rank_source"] == {"0": "file name", "1": "file name"}
    assert report.kernels.groupby("rank").size().tolist() == [19, 19]


def test_rocpd_databases_as_ranks(fixtures_dir, tmp_path, scheduler):
    src = fixtures_dir / "rocprof" / "llamacpp_r9700_rocpd" / "32432_results.db"
    for rank in (0, 1):
        (tmp_path / f"rank{rank}_results.db").symlink_to(src)  # read in place
    res = import_ranks(tmp_path, tmp_path / "rocpd.perfscope", scheduler=scheduler)
    report = Report.load(res.path)
    assert res.plan.ranks == [0, 1] and res.plan.skipped == []
    from perfscope.analysis.readers.detect import import_file

    assert report.kernels.groupby("rank").size().tolist() == [len(import_file(src).kernels)] * 2
    assert not res.summary["straggler"]["found"]  # no collectives: nothing to match


def test_nothing_readable_and_existing_outputs(fixtures_dir, tmp_path, scheduler):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a_rank-0.json").write_text("{not json")
    with pytest.raises(InputFormatError, match="no rank could be imported"):
        import_ranks(junk, tmp_path / "junk.perfscope", scheduler=scheduler)
    assert not (tmp_path / "junk.perfscope").exists() and not list(tmp_path.glob(".junk.perfscope*"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError):
        import_ranks(fixtures_dir / RANK0, tmp_path / "plain", scheduler=scheduler, force=True)
    existing = Report.load(import_ranks(fixtures_dir / RANK0, tmp_path / "one.perfscope", scheduler=scheduler).path)
    with pytest.raises(OutputExistsError):
        import_ranks(fixtures_dir / RANK1, tmp_path / "one.perfscope", scheduler=scheduler)
    assert Report.load(tmp_path / "one.perfscope").params["ranks"]["ranks"] == existing.params["ranks"]["ranks"] == [0]


def test_cli_on_its_own_local_cluster(fixtures_dir, tmp_path, capsys, monkeypatch):
    build_rank_set(fixtures_dir, tmp_path / "t", [(RANK0, 1.0), (RANK1, 1.0), (RANK0, 1.3)])
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(tmp_path / "t"), "--ranks", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "imported ranks 0-2 of world size 3" in out and "-> t.perfscope" in out
    assert "straggler: rank 2 step_mean_ns" in out
    assert (tmp_path / "t.perfscope" / "ranks.html").is_file()
    assert main(["import", str(tmp_path / "t"), "--ranks", "--scheduler", "tcp://127.0.0.1:9", "--out", "x"]) == 2
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "t"), "--workers", "2"]) == 2


def test_64_ranks_with_a_planted_straggler(fixtures_dir, tmp_path, scheduler):
    """Eight TP-8 groups of the real B200 vLLM prefill rank, synchronized at every collective; rank 37
    works 15% slower. Every kernel is kept, the straggler and the wait it causes are found on the
    cluster, and the finding comes from the views stored in the report."""
    doc = load_trace(fixtures_dir / B200)
    files = write_sync_job(doc, tmp_path / "t", SyncJob(world_size=64, group_size=8, slow=((37, 1.15),),
                                                        jitter=0.01, seed=7, drop_python=True))
    res = import_ranks(tmp_path / "t", tmp_path / "job.perfscope", scheduler=scheduler)
    kernels = len(intervals(load_json(files[0]), ("kernel",)))
    assert res.manifest["tables"]["kernels"] == 64 * kernels and res.plan.ranks == list(range(64))
    straggler = res.summary["straggler"]
    assert straggler["found"] and [r["rank"] for r in straggler["stragglers"]] == [37]
    truth = collective_waits({r: load_json(files[r]) for r in range(32, 40)})
    row = straggler["stragglers"][0]
    assert row["gkey"] == "32-39" and row["kind"] == "TP"
    assert row["wait_per_other_ns"] == pytest.approx(truth["caused"][37] / 7, rel=1e-9)
    assert len(straggler["groups"]) == 8 and res.summary["roles"] == {"prefill": "0-63"}
    assert res.manifest["params"]["ranks"]["straggler"]["found"]
    # perfscope analyze: the finding, from the stored views
    report = Report.load(res.path)
    found = [f for f in run_rules(report, rules=["ranks"]) if f.id == "straggler"]
    assert len(found) == 1 and found[0].evidence["rank"] == 37 and found[0].explained_share >= 0.9
    steps = load_ranks(res.path, "kernels", ranks=[37], columns=["step"])
    assert len(steps) == kernels


def test_a_job_without_straggler_gets_no_straggler_finding(fixtures_dir, tmp_path, scheduler):
    doc = load_trace(fixtures_dir / B200)
    write_sync_job(doc, tmp_path / "t", SyncJob(world_size=16, group_size=8, jitter=0.02, seed=5, drop_python=True))
    res = import_ranks(tmp_path / "t", tmp_path / "job.perfscope", scheduler=scheduler)
    assert not res.summary["straggler"]["found"]
    assert res.summary["straggler"]["statement"].startswith("no straggler: in each of the 2 groups")
    found = run_rules(Report.load(res.path), rules=["ranks"])
    assert not [f for f in found if f.id in ("straggler", "rank-imbalance")]


def test_cli_names_the_straggler_and_a_rank_that_failed(fixtures_dir, tmp_path, capsys, monkeypatch):
    doc = load_trace(fixtures_dir / B200)
    write_sync_job(doc, tmp_path / "t", SyncJob(world_size=8, group_size=4, slow=((6, 1.2),), jitter=0.01,
                                                drop_python=True), ranks=range(7))
    (tmp_path / "t" / "rank-7.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00damaged")
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(tmp_path / "t"), "--ranks", "--workers", "2", "--no-html"]) == 0
    captured = capsys.readouterr()
    assert "imported ranks 0-6 of world size 8" in captured.out and "prefill ranks: 0-6" in captured.out
    assert "1 straggler: rank 6 (4-7: last at 100% of its collectives" in captured.out
    assert "rank-7.pt.trace.json.gz) failed: " in captured.err  # named as it fails
    assert "missing: 1 ranks have no trace (7)" in captured.err
    report = Report.load(tmp_path / "t.perfscope")
    assert sorted(report.kernels["rank"].unique()) == list(range(7))
    groups = {g["gkey"]: g for g in report.params["ranks"]["straggler"]["stragglers"]}
    assert set(groups) == {"4-7"}
    assert main(["analyze", str(tmp_path / "t.perfscope"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    straggler = next(f for f in doc["findings"] if f["id"] == "straggler")
    assert straggler["evidence"]["rank"] == 6 and straggler["evidence"]["group_missing_ranks"] == "7"
    assert doc["ranks"]["straggler"]["found"] and doc["ranks"]["roles"] == {"prefill": "0-6"}
