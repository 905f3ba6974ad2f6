"""The distributed-job findings (rank-imbalance, exposed-comm) on real traces and tiled rank sets."""

from __future__ import annotations

import statistics

import pytest

from perfscope.analysis.findings import RULES, run_rules
from perfscope.analysis.ranks.stats import find_stragglers, rank_tables
from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.rules.ranks import EXPOSED_COMM_MIN_PCT, rank_findings
from tests.unit.ranks_support import (
    B200,
    RANK0,
    RANK1,
    build_rank_set,
    load_json,
    multi_rank_report,
    rank_times,
    step_durations,
)


@pytest.fixture(scope="module")
def job(fixtures_dir, tmp_path_factory):
    files = build_rank_set(fixtures_dir, tmp_path_factory.mktemp("rules"),
                           [(RANK0, 1.0), (RANK1, 1.0), (RANK0, 1.0), (RANK0, 1.2)])
    return files, multi_rank_report(files)


def test_rank_imbalance_names_the_slow_rank_and_its_margin(job):
    files, report = job
    found = [f for f in rank_findings(report) if f.id == "rank-imbalance"]
    step = next(f for f in found if f.evidence["metric"] == "step_mean_ns")
    means = [statistics.mean(step_durations(load_json(f)).values()) for f in files]
    others = statistics.median(means[:3])
    assert step.evidence["rank"] == 3 and step.evidence["ranks_covered"] == "0-3"
    assert step.evidence["margin_pct"] == pytest.approx(100 * (means[3] - others) / others)
    assert step.time_at_stake_ns == pytest.approx((means[3] - others) * 2)  # two steps lost on every rank
    assert "Rank 3 is a straggler" in step.title
    # its items: the kernels that take longer on rank 3 than the others' median, then what they leave
    kernels = [i for i in step.items if i.kind == "kernels"]
    assert kernels and all(i.attrs["rank"] == 3 and i.time_ns > 0 and i.explains for i in kernels)
    rest = [i for i in step.items if not i.explains]
    assert sum(i.time_ns for i in step.items) == pytest.approx(step.time_at_stake_ns) or not rest
    assert step.explained_share >= 0.9 or step.unexplained_ns == pytest.approx(sum(i.time_ns for i in rest))
    assert ("kernels take longer" in step.recommendation) == (step.evidence["kernel_excess_ns"]
                                                              >= 0.5 * step.time_at_stake_ns)


def test_exposed_comm_is_the_mean_over_ranks_of_the_direct_computation(job):
    files, report = job
    f = next(f for f in rank_findings(report) if f.id == "exposed-comm")
    times = [rank_times(load_json(p)) for p in files]
    exposed = [t["comm_ns"] - t["overlap_ns"] for t in times]
    assert f.evidence["mean_exposed_comm_ns"] == pytest.approx(statistics.mean(exposed))
    assert f.evidence["worst_rank"] == max(range(4), key=lambda i: exposed[i])
    share = 100 * statistics.mean(exposed) / statistics.mean(t["span_ns"] for t in times)
    assert f.evidence["mean_exposed_comm_pct"] == pytest.approx(share) and share >= EXPOSED_COMM_MIN_PCT
    assert f.kernels and all("nccl" in k.lower() for k in f.kernels)
    # its items: the collectives' time with no compute beside it, per name, averaged over the ranks
    assert f.items and all("nccl" in i.attrs.get("name", "nccl").lower() for i in f.items)
    assert sum(i.time_ns for i in f.items) >= 0.9 * f.time_at_stake_ns and f.explained_share >= 0.9
    assert "backward pass" in f.recommendation and "slowest rank" in f.recommendation  # 4 ranks, DDP training


def test_single_rank_reports(fixtures_dir):
    hta = read_kineto(fixtures_dir / RANK0)
    ids = [f.id for f in rank_findings(hta)]
    assert ids == ["exposed-comm"]  # one rank: no imbalance to judge
    b200 = read_kineto(fixtures_dir / B200)
    t = rank_tables(b200).per_rank.iloc[0]
    assert 100 * t["exposed_comm_ns"] / t["span_ns"] < EXPOSED_COMM_MIN_PCT
    assert rank_findings(b200) == []


def test_registered_and_serialisable(job):
    _, report = job
    assert RULES["ranks"] is rank_findings
    found = run_rules(report, rules=["ranks"])
    assert {f.id for f in found} >= {"rank-imbalance", "exposed-comm"}
    assert all(f.to_dict()["evidence"]["ranks_covered"] == "0-3" for f in found)


def test_no_straggler_among_equal_ranks(fixtures_dir, tmp_path):
    files = build_rank_set(fixtures_dir, tmp_path, [(RANK0, 1.0)] * 3)
    report = multi_rank_report(files)
    assert not [f for f in rank_findings(report) if f.id == "rank-imbalance"]
    assert not find_stragglers(rank_tables(report).per_rank, "step_mean_ns")["straggler"].any()
