"""Distributed-job rules: ranks that hold the others back, and communication that compute does not hide.

Both work on the per-rank analysis of :mod:`perfscope.analysis.ranks.stats` and say which ranks they
cover. ``rank-imbalance`` needs two ranks or more; ``exposed-comm`` also fires on a single rank's
trace that has collective kernels.

Collective kernels run while a rank waits for the others, so a rank's exposed communication time
includes waiting for the slowest rank: fix a straggler first, then look at overlap.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import duration

from ..ranks.stats import RankTables, comm_mask, format_ranks, rank_tables, report_ranks, stragglers
from ._base import Evidence, Finding, ranked, top_groups

if TYPE_CHECKING:
    from perfscope.report import Report

EXPOSED_COMM_MIN_PCT = 10.0
"""Exposed collective time (no compute beside it) worth a finding, as a share of the ranks' mean
active span: the same tenth as the idle rule, below which the overlap there is to win is small."""

METRIC_WORDS = {"step_mean_ns": "mean step time", "compute_per_step_ns": "compute time per step"}

IMBALANCE_ADVICE = (
    "Find out why this rank does more or slower work: uneven data (sequence lengths, samples per "
    "batch, MoE expert load), a slower or throttled GPU (check its clocks and temperature), a noisy "
    "host (data loading, CPU contention), or a different kernel mix (compare its kernel times with "
    "the median rank's). Every other rank waits for it at each collective, so its excess is lost on "
    "all ranks.")
EXPOSED_ADVICE = (
    "Hide collectives behind compute: in DDP let gradient all-reduce run during backward (tune "
    "bucket_cap_mb, static_graph=True, avoid find_unused_parameters); in FSDP enable forward and "
    "backward prefetch; issue collectives with async_op=True and wait as late as possible. Reduce "
    "their volume (bf16 or compressed gradients, fewer and larger buckets). Collective kernels also "
    "count the time spent waiting for the slowest rank: fix a straggler (rank-imbalance) first.")


def _imbalance(report: Report, t: RankTables) -> list[Finding]:
    out = []
    flagged = stragglers(t.per_rank)
    covered = format_ranks(t.ranks)
    steps = t.per_rank.set_index("rank")["steps"]
    for metric, rows in flagged.groupby("metric", sort=False):
        worst = rows.iloc[0]
        rank = int(worst["rank"])
        excess = float(worst["value_ns"] - worst["median_others_ns"])
        at_stake = excess * max(int(steps.get(rank, 1)), 1)
        word = METRIC_WORDS.get(str(metric), str(metric))
        others = ", ".join(str(int(r)) for r in rows["rank"].iloc[1:4])
        title = (f"Rank {rank} is a straggler: {word} {duration(float(worst['value_ns']))}, "
                 f"{worst['margin_pct']:.1f}% above the median of the other ranks "
                 f"({duration(float(worst['median_others_ns']))})" + (f"; also ranks {others}" if others else ""))
        evidence: Evidence = {
            "rank": rank, "metric": str(metric), "value_ns": float(worst["value_ns"]),
            "median_others_ns": float(worst["median_others_ns"]), "margin_pct": float(worst["margin_pct"]),
            "robust_z": float(worst["robust_z"]), "stragglers": format_ranks(rows["rank"]),
            "ranks_covered": covered, "excess_per_step_ns": excess,
        }
        out.append(ranked(report, "rank-imbalance", title, evidence, IMBALANCE_ADVICE, at_stake))
    return out


def _comm_kernel_names(report: Report) -> tuple[str, ...]:
    k = report.kernels
    if not len(k):
        return ()
    mask = comm_mask(k)
    if not mask.any():
        return ()
    rows = np.flatnonzero(mask)
    return top_groups(k, rows, k["duration_ns"].to_numpy(np.float64)[rows])


def _exposed(report: Report, t: RankTables) -> list[Finding]:
    pr = t.per_rank
    comm = pr["comm_ns"].astype("float64")
    if not len(pr) or not (comm > 0).any():
        return []
    exposed = pr["exposed_comm_ns"].astype("float64")
    share = float(exposed.mean()) / float(pr["span_ns"].astype("float64").mean()) * 100.0
    if not share >= EXPOSED_COMM_MIN_PCT:
        return []
    worst = pr.loc[exposed.idxmax()]
    hidden = float(pr["overlap_ns"].astype("float64").sum()) / float(comm.sum()) * 100.0
    n = len(pr)
    who = f"rank {int(pr['rank'].iloc[0])}" if n == 1 else f"the {n} ranks"
    title = (f"Communication is exposed: {duration(float(exposed.mean()))} per rank of collectives run with no "
             f"compute beside them ({share:.0f}% of the active span, {100 - hidden:.0f}% of collective time, "
             f"mean over {who})")
    evidence: Evidence = {
        "mean_exposed_comm_ns": float(exposed.mean()), "mean_exposed_comm_pct": share,
        "mean_comm_ns": float(comm.mean()), "overlap_pct": hidden,
        "worst_rank": int(worst["rank"]), "worst_rank_exposed_comm_ns": float(worst["exposed_comm_ns"]),
        "ranks_covered": format_ranks(t.ranks),
    }
    return [ranked(report, "exposed-comm", title, evidence, EXPOSED_ADVICE, float(exposed.mean()),
                   kernels=_comm_kernel_names(report))]


def rank_findings(report: Report) -> list[Finding]:
    """``rank-imbalance`` (stragglers) and ``exposed-comm`` (collectives not hidden by compute)."""
    if not len(report.kernels):
        return []
    if len(report_ranks(report)) < 2 and not comm_mask(report.kernels).any():
        return []  # one rank and no collectives: neither finding can apply (skip the per-rank tables)
    t = rank_tables(report)
    if not len(t.per_rank) or pd.isna(t.per_rank["span_ns"]).all() or not math.isfinite(
            float(t.per_rank["span_ns"].astype("float64").max())):
        return []
    return _imbalance(report, t) + _exposed(report, t)


__all__ = ["EXPOSED_COMM_MIN_PCT", "rank_findings"]
