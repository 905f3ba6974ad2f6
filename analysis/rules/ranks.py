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

from perfscope.format import clip, duration
from perfscope.schema import value_mask

from ..ranks.stats import RankTables, comm_mask, format_ranks, rank_tables, report_ranks, stragglers
from ._base import Evidence, Finding, Item, covered_ns, merge_intervals, ranked, top_groups
from .evidence import ITEMS_TOP, kernel_items, unexplained

if TYPE_CHECKING:
    from perfscope.report import Report

EXPOSED_COMM_MIN_PCT = 10.0
"""Exposed collective time (no compute beside it) worth a finding, as a share of the ranks' mean
active span: the same tenth as the idle rule, below which the overlap there is to win is small."""

METRIC_WORDS = {"step_mean_ns": "mean step time", "compute_per_step_ns": "compute time per step"}

IMBALANCE_WAIT = ("Every other rank waits for it at each collective, so its excess is lost on all ranks.")
EXPOSED_ADVICE = (
    "Hide the collectives behind compute: issue them with async_op=True (or on a side stream) and wait "
    "as late as possible, and reduce their volume (bf16 or compressed data, fewer and larger messages).")
EXPOSED_TRAINING = (
    "This trace has a backward pass: in DDP let gradient all-reduce run during backward (tune "
    "bucket_cap_mb, static_graph=True, avoid find_unused_parameters); in FSDP enable forward and "
    "backward prefetch.")
EXPOSED_WAIT = (
    "Collective kernels also count the time spent waiting for the slowest rank: fix a straggler "
    "(rank-imbalance) first.")


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
        items = _imbalance_items(t, rank, at_stake)
        kernel_ns = sum(i.time_ns for i in items if i.explains)
        evidence["kernel_excess_ns"] = kernel_ns
        if kernel_ns >= 0.5 * at_stake:
            top = max((i for i in items if i.explains), key=lambda i: i.time_ns)
            advice = (f"Rank {rank}'s kernels take longer than the other ranks' (the most: {top.label}). Find out "
                      "why this rank does more or slower work: uneven data (sequence lengths, samples per batch, MoE "
                      "expert load), or a slower or throttled GPU (check its clocks and temperature). " + IMBALANCE_WAIT)
        else:
            advice = (f"Most of rank {rank}'s extra time is not in its kernels: look at its host (data loading, CPU "
                      "contention, a noisy neighbour) and what it waits for outside the GPU. " + IMBALANCE_WAIT)
        out.append(ranked(report, "rank-imbalance", title, evidence, advice, at_stake, items=items))
    return out


def _imbalance_items(t: RankTables, rank: int, at_stake: float) -> tuple[Item, ...]:
    """What the straggler's excess is: each kernel that takes longer on it than the median of the
    other ranks (by how much), then the rest of the excess, of unknown cause (not in its kernels)."""
    k = t.kernels
    if not len(k):
        return tuple(unexplained(at_stake, f"rank {rank}: its excess is not in its kernels' time", rank=rank))
    wide = k.pivot_table(index="kernel", columns="rank", values="time_ns", aggfunc="sum").fillna(0.0)
    if rank not in wide.columns or wide.shape[1] < 2:
        return tuple(unexplained(at_stake, f"rank {rank}: no other rank to compare its kernels with", rank=rank))
    others = wide.drop(columns=rank).median(axis=1)
    excess = (wide[rank] - others).clip(lower=0).sort_values(ascending=False)
    excess = excess[excess > 0]
    items = [Item("kernels", f"{clip(str(name), 80)}: {duration(float(x))} more on rank {rank} than the other ranks' "
                  f"median ({duration(float(others[name]))})", float(x), True,
                  attrs={"name": str(name), "rank": rank, "median_others_ns": float(others[name])})
             for name, x in excess.head(ITEMS_TOP).items()]
    rest = float(excess.iloc[ITEMS_TOP:].sum())
    if rest > 0:
        items.append(Item("kernels", f"{duration(rest)} more in {len(excess) - ITEMS_TOP} other kernels on rank {rank}",
                          rest, True, attrs={"rank": rank}))
    left = at_stake - float(excess.sum())
    items += unexplained(left, f"rank {rank}: {duration(left)} of its excess is not in its kernels' time (host, "
                         "data loading, waiting)", rank=rank)
    return tuple(items)


def _comm_kernel_names(report: Report) -> tuple[str, ...]:
    k = report.kernels
    if not len(k):
        return ()
    mask = comm_mask(k)
    if not mask.any():
        return ()
    rows = np.flatnonzero(mask)
    return top_groups(k, rows, k["duration_ns"].to_numpy(np.float64, na_value=np.nan)[rows])


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
    items = _exposed_items(report, n)
    advice = EXPOSED_ADVICE
    if _training(report):
        advice += " " + EXPOSED_TRAINING
    if n > 1 or len(report_ranks(report)) > 1:
        advice += " " + EXPOSED_WAIT
    return [ranked(report, "exposed-comm", title, evidence, advice, float(exposed.mean()),
                   kernels=_comm_kernel_names(report), items=items)]


def _exposed_items(report: Report, n_ranks: int) -> tuple[Item, ...]:
    """The collective kernels' time with no compute beside it on their device, per kernel name,
    averaged over the ranks (as the finding's stake is)."""
    k = report.kernels
    comm = comm_mask(k)
    rows = np.flatnonzero(comm)
    if not len(rows):
        return ()
    exposed = np.zeros(len(rows))
    starts, ends = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
    dev = k["device"].astype("object").to_numpy()
    rank = k["rank"].to_numpy() if "rank" in k else np.zeros(len(k))
    for key in {(d, r) for d, r in zip(dev[rows].tolist(), rank[rows].tolist())}:
        same = (dev == key[0]) & (rank == key[1])
        comp = same & ~comm
        merged = merge_intervals(starts[comp], ends[comp])
        sel = same[rows]
        exposed[sel] = (ends[rows][sel] - starts[rows][sel]) - covered_ns(merged, starts[rows][sel], ends[rows][sel])
    return tuple(kernel_items(k, rows, exposed / max(n_ranks, 1), explains=np.ones(len(rows), bool),
                              describe=lambda g: "with no compute beside it", what="collective"))


def _training(report: Report) -> bool:
    """Whether the trace shows a backward pass (the DDP/FSDP advice applies to training only)."""
    k = report.kernels
    for col in ("op", "range", "name"):
        if col in k and value_mask(k, col, lambda v: isinstance(v, str) and "backward" in v.lower()).any():
            return True
    r = report.ranges
    return bool(len(r) and value_mask(r, "name", lambda v: isinstance(v, str) and "backward" in v.lower()).any())


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
