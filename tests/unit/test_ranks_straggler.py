"""Who the ranks wait for: collectives matched across each group, the straggler finding and its
evidence, roles, on synchronized rank sets built from the real B200 TP-8 vLLM prefill trace (each
rank's timeline remapped so that a collective ends on every rank of its group when the last one
arrives); checked against the collective kernels' durations read directly from the JSON."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.ranks.collectives import TIE_NS
from perfscope.analysis.ranks.partial_read import job_summary, read_views, write_views
from perfscope.analysis.ranks.stats import (
    UNNAMED_HOST,
    group_kind,
    idle_rows,
    rank_tables,
    role_of,
    sync_group,
)
from perfscope.analysis.ranks.straggler import MIN_WAIT_PCT, analyse, last_share_needed
from perfscope.analysis.ranks.tiling import (
    SyncJob,
    TileSpec,
    load_trace,
    sync_points,
    tile_trace,
    write_sync_job,
)
from perfscope.analysis.rules.ranks import rank_findings, straggler_finding
from tests.unit.ranks_support import (
    B200,
    collective_waits,
    intervals,
    is_collective,
    load_json,
    multi_rank_report,
)

SGLANG_DECODE = "thirdparty/tracelens_sglang_decode/sglang_Qwen3-8B_decode.json.gz"


def _job(fixtures_dir, folder, **kw):
    doc = load_trace(fixtures_dir / B200)
    job = SyncJob(**{"world_size": 8, "group_size": 4, "drop_python": True, "seed": 3, **kw})
    files = write_sync_job(doc, folder, job)
    return doc, job, files


@pytest.fixture(scope="module")
def slow(fixtures_dir, tmp_path_factory):
    """8 ranks in two TP groups of 4; rank 2 works 20% slower between collectives."""
    doc, job, files = _job(fixtures_dir, tmp_path_factory.mktemp("slow"), slow=((2, 1.2),), jitter=0.01)
    report = multi_rank_report(files, world_size=8)
    return doc, job, files, report


def test_the_synchronized_ranks_meet_at_every_collective(slow):
    doc, _, files, _ = slow
    docs = [load_json(f) for f in files]
    n = len(sync_points(doc, 1)[2])
    for d in docs:
        assert sum(1 for _, _, name in intervals(d, ("kernel",)) if is_collective(name)) == n
        assert d["distributedInfo"]["pg_config"][1]["ranks"] in ([0, 1, 2, 3], [4, 5, 6, 7])
    ends = [[e for s, e, name in sorted(intervals(d, ("kernel",))) if is_collective(name)] for d in docs[:4]]
    # the same collective ends at the same time on every rank of the group (to the ns rounding of us)
    assert all(max(col) - min(col) <= 2 for col in zip(*ends))


def test_the_straggler_is_the_rank_that_arrives_last_and_its_wait_is_the_direct_one(slow):
    _, _, files, report = slow
    t = rank_tables(report)
    s = analyse(t)
    assert s.flagged["rank"].tolist() == [2]
    truth = collective_waits({r: load_json(files[r]) for r in range(4)})
    row = s.flagged.iloc[0]
    assert row["gkey"] == "0-3" and row["kind"] == "TP" and row["role"] == "prefill"
    assert row["caused_wait_ns"] == pytest.approx(truth["caused"][2], rel=1e-9)
    assert row["wait_per_other_ns"] == pytest.approx(truth["caused"][2] / 3, rel=1e-9)
    assert row["last_share"] == pytest.approx(truth["last"][2] / row["instances"], rel=1e-9) and row["last_share"] > 0.95
    waits = s.ranks.set_index("rank")
    for r in range(4):
        assert waits.loc[r, "comm_wait_ns"] == pytest.approx(truth["wait"][r], rel=1e-9)
    # transfer + wait is each rank's collective kernel time, exactly
    comm = {r: sum(e - s for s, e, name in intervals(load_json(files[r]), ("kernel",)) if is_collective(name))
            for r in range(8)}
    for r in range(8):
        assert waits.loc[r, "comm_transfer_ns"] + waits.loc[r, "comm_wait_ns"] == pytest.approx(comm[r], abs=1)
    # the other group keeps its own pace: no straggler there, its ranks take turns arriving last
    other = s.groups.set_index("gkey").loc["4-7"]
    assert other["stragglers"] == "" and other["top_share"] < other["threshold"]


def test_the_wait_is_the_straggler_extra_work(slow):
    """The model's truth: rank 2 works 20% longer between collectives, so the others wait about 0.2 x
    the work between collectives (their own 1% jitter aside)."""
    doc, _, _, report = slow
    t0, t1, points = sync_points(doc, 1)
    work = (t1 - t0 - sum(e - s for s, e in points)) * 1000.0  # ns
    found = next(f for f in rank_findings(report) if f.id == "straggler")
    assert found.evidence["wait_per_rank_ns"] == pytest.approx(0.2 * work, rel=0.1)
    assert found.evidence["wait_pct"] >= MIN_WAIT_PCT


def test_the_straggler_finding_names_the_rank_the_wait_and_why(slow):
    _, _, _, report = slow
    found = [f for f in rank_findings(report) if f.id == "straggler"]
    assert len(found) == 1
    f = found[0]
    assert f.evidence["rank"] == 2 and f.evidence["waiting_ranks"] == "0-1, 3" and f.evidence["group_kind"] == "TP"
    assert "Rank 2 is the straggler of its TP group (0-3, prefill)" in f.title
    kinds = {i.kind for i in f.items}
    assert {"rank", "kernel", "gaps", "step"} <= kinds
    # why: its kernels and its host time between launches are 20% longer; together they hold the wait
    # (the model: everything between collectives is stretched, so the excesses add up to the wait)
    kernel_ns = sum(i.time_ns for i in f.items if i.kind in ("kernel", "kernels"))
    gaps = {i.attrs["kind"]: i for i in f.items if i.kind == "gaps"}
    assert kernel_ns + sum(i.time_ns for i in gaps.values()) == pytest.approx(f.time_at_stake_ns, rel=0.1)
    assert kernel_ns > 0 and gaps["dispatch"].time_ns > 0 and gaps["dispatch"].explains
    # its host code between launches sits inside the trace's ranges: named, it explains
    assert gaps["host code"].time_ns > 0 and gaps["host code"].explains and UNNAMED_HOST not in gaps
    explained = kernel_ns + sum(i.time_ns for i in gaps.values() if i.explains)
    assert f.explained_ns == pytest.approx(min(explained, f.time_at_stake_ns))
    assert f.explained_share >= 0.9
    assert "clocks" in f.recommendation and "dispatch" in f.recommendation
    # the step items point at rank 2's steps on its own clock
    step = next(i for i in f.items if i.kind == "step")
    assert step.attrs["rank"] == 2 and step.end_ns > step.start_ns
    # the outlier rule does not repeat what the straggler finding says
    assert not [x for x in rank_findings(report) if x.id == "rank-imbalance" and x.evidence["rank"] == 2]
    d = f.to_dict()
    assert d["items"][0]["kind"] and d["explained_share"] >= 0.9


def test_host_code_nothing_names_explains_nothing(slow):
    """The same job with the names of its idle slices left out (a trace without ranges, Python
    functions or operators): its host code is unnamed, shown, and no longer explains the wait."""
    _, _, _, report = slow
    idle = report.table("idle")
    idle = idle[idle["rank"] == 2].reset_index(drop=True)
    named = idle_rows(2, idle)
    bare = idle_rows(2, idle.drop(columns=["range", "function", "op"]))
    assert UNNAMED_HOST not in set(named["kind"]) and "host code" not in set(bare["kind"])
    by = bare.set_index("kind")["duration_ns"]
    assert by[UNNAMED_HOST] == pytest.approx(named.set_index("kind")["duration_ns"]["host code"])
    assert bare["duration_ns"].sum() == pytest.approx(named["duration_ns"].sum())
    t = rank_tables(report)
    t = dataclasses.replace(t, idle=t.idle.replace({"kind": {"host code": UNNAMED_HOST}}))
    f = straggler_finding(t, analyse(t))
    assert f is not None and f.evidence["rank"] == 2
    unnamed = next(i for i in f.items if i.kind == "gaps" and i.attrs["kind"] == UNNAMED_HOST)
    assert not unnamed.explains and "no range, function or operator names it" in unnamed.label
    explained = sum(i.time_ns for i in f.items if i.explains)
    assert f.explained_ns == pytest.approx(min(explained, f.time_at_stake_ns))
    assert f.explained_share == pytest.approx(1 - unnamed.time_ns / f.time_at_stake_ns, abs=0.1)
    assert "with_stack" in f.recommendation


def test_no_straggler_among_ranks_that_take_turns(fixtures_dir, tmp_path):
    _, _, files = _job(fixtures_dir, tmp_path, jitter=0.02)
    report = multi_rank_report(files, world_size=8)
    t = rank_tables(report)
    s = analyse(t)
    assert not len(s.flagged)
    assert s.statement().startswith("no straggler: in each of the 2 groups")
    assert not [f for f in run_rules(report, rules=["ranks"]) if f.id in ("straggler", "rank-imbalance")]


def test_views_written_and_read_back_give_the_same_finding(slow, tmp_path):
    _, _, _, report = slow
    t = rank_tables(report)
    s = analyse(t)
    write_views(tmp_path, t, s)
    t2, s2 = read_views(tmp_path)
    assert s2.flagged["rank"].tolist() == [2]
    assert s2.steps["caused_ns"].sum() == pytest.approx(s.steps["caused_ns"].sum())
    summary = job_summary(t2, s2)
    assert summary["straggler"]["found"] and summary["roles"] == {"prefill": "0-7"}
    per = {r["rank"]: r for r in summary["per_rank"]}
    assert per[2]["straggler"] and per[2]["comm_wait_ns"] < per[0]["comm_wait_ns"]


def test_prefill_and_decode_workers_are_told_apart(fixtures_dir, tmp_path):
    """A disaggregated job: 4 prefill ranks (a TP group) and 2 decode workers (SGLang decode steps);
    only the prefill group meets at collectives, and nobody is held to another role's pace."""
    doc = load_trace(fixtures_dir / B200)
    files = write_sync_job(doc, tmp_path, SyncJob(world_size=6, group_size=4, drop_python=True, jitter=0.01),
                           ranks=range(4))
    decode = load_trace(fixtures_dir / SGLANG_DECODE)
    for rank in (4, 5):
        dst = tmp_path / f"rank-{rank}.pt.trace.json.gz"
        tile_trace(decode, dst, TileSpec(rank, 6, stretch=1.5 if rank == 5 else 1.0))
        files.append(dst)
    report = multi_rank_report(files, world_size=6)
    t = rank_tables(report)
    assert dict(zip(t.per_rank["rank"], t.per_rank["role"])) == {0: "prefill", 1: "prefill", 2: "prefill",
                                                                  3: "prefill", 4: "decode", 5: "decode"}
    s = analyse(t)
    assert s.groups["gkey"].tolist() == ["0-3"] and not len(s.flagged)
    assert job_summary(t, s)["roles"] == {"decode": "4-5", "prefill": "0-3"}


def test_group_kinds_roles_and_sync_groups():
    assert [group_kind(d) for d in ("tp", "TENSOR_MODEL_PARALLEL_GROUP", "ep:0", "dp", "pp", "undefined",
                                    "default_pg", "")] == ["TP", "TP", "EP", "DP", "PP", None, None, None]
    import pandas as pd

    assert role_of(pd.DataFrame({"phase": ["prefill", "prefill"]})) == "prefill"
    assert role_of(pd.DataFrame({"phase": ["decode", None]})) == "decode"
    assert role_of(pd.DataFrame({"phase": ["prefill", "decode"]})) == "mixed"
    assert role_of(pd.DataFrame({"phase": [None]})) is None
    groups = [{"name": "3", "desc": "tp", "ranks": [8, 9, 10, 11]}, {"name": "7", "desc": "dp", "ranks": [9, 13, 17]}]
    assert sync_group(9, "7", groups) == "9, 13, 17"  # the kernel names its group
    assert sync_group(9, None, groups) == "9, 13, 17"  # else the smallest group of several ranks
    assert sync_group(9, "99", []) == ""  # no group listed: every rank of its role
    # a rank must arrive last well above its fair share 1/n
    assert last_share_needed(8, 150) == pytest.approx(0.25)
    assert last_share_needed(2, 150) == pytest.approx(0.75) and TIE_NS == 2000
    assert statistics.mean([last_share_needed(64, 10_000), 1 / 64]) > 1 / 64


def test_point_to_point_kernels_are_not_matched(fixtures_dir):
    """Two real ranks of a 128-rank training job whose only NCCL kernels are SendRecv (pipeline sends):
    a send waits for its one peer, so nothing is matched and no straggler is claimed."""
    from tests.unit.ranks_support import RANK0, RANK1

    report = multi_rank_report([fixtures_dir / RANK0, fixtures_dir / RANK1], world_size=128)
    t = rank_tables(report)
    assert t.per_rank["comm_ns"].gt(0).all() and not len(t.collectives)
    s = analyse(t)
    assert not len(s.flagged) and s.statement().startswith("no straggler analysis")
