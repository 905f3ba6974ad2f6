"""Which rank the others wait for, how long they wait, and why that rank is late.

From the collectives matched across each group of ranks (:mod:`.collectives`): in a group that
meets at its collectives, the rank that arrives last at most of them is the one the others wait
for. Ranks of a healthy group take turns arriving last (each about ``1/n`` of the time); a
straggler arrives last far more often and the others' wait in its collectives is its doing.

A rank is a straggler of its group when

- it arrived last at no fewer than :func:`last_share_needed` of the group's matched collectives
  (twice its fair share ``1/n``, and three binomial standard deviations above it, capped at 75%);
- the wait it caused, per other rank of the group, is at least :data:`MIN_WAIT_PCT` percent of
  the group's time (the steps' when the ranks have steps, else the active span);
- the group has at least :data:`MIN_INSTANCES` matched collectives.

Why it is late comes from its own evidence against the median of its group's other ranks: the
kernels it spends more time in, and the device idle time it has more of, by kind (the host's work:
dispatch, computation, waits, its own code; launches, synchronisation, copies:
:mod:`perfscope.analysis.idle`). Ranks are compared only with
the ranks they meet, so prefill and decode workers, or different tensor parallel groups, are never
held to each other's pace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import counted, duration

from .collectives import expected_ranks, match, rank_waits, step_waits, with_keys
from .stats import UNNAMED_HOST, format_ranks

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .stats import RankTables

MIN_WAIT_PCT = 5.0
"""The wait a straggler causes, per other rank of its group, as a share of the group's time: below
5%, run-to-run noise of a step on a busy node is of the same order (the margin of ``rank-imbalance``)."""
MIN_INSTANCES = 3
"""Matched collectives a group needs before its ranks' turns arriving last say anything."""
LAST_SHARE_CAP = 0.75
"""A rank that arrives last at 75% of its group's collectives is never a fair taker of turns."""
TOP_KERNELS = 5
TOP_STEPS = 3

RANK_COLUMNS = ("rank", "gkey", "kind", "role", "instances", "comm_transfer_ns", "comm_wait_ns", "last_count",
                "last_share", "caused_wait_ns", "wait_per_other_ns", "wait_pct", "threshold", "straggler")
GROUP_COLUMNS = ("gkey", "kind", "role", "ranks", "present", "missing", "instances", "wait_ns", "reference_ns",
                 "threshold", "top_rank", "top_share", "stragglers")


def last_share_needed(n: int, instances: int) -> float:
    """The share of a group's collectives a rank of ``n`` must arrive last at to be a straggler."""
    fair = 1.0 / n
    sd = math.sqrt(fair * (1.0 - fair) / max(instances, 1))
    return min(LAST_SHARE_CAP, max(2.0 * fair, fair + 3.0 * sd))


@dataclass(frozen=True)
class Stragglers:
    """The straggler analysis of a job.

    Attributes:
        ranks: one row per rank and group it meets (:data:`RANK_COLUMNS`): its collective time
            split into transfer and wait, how often it arrived last, the wait it caused.
        groups: one row per group (:data:`GROUP_COLUMNS`).
        steps: rank, step, wait_ns (its own wait in collectives), caused_ns (the others' wait it caused).
    """

    ranks: pd.DataFrame
    groups: pd.DataFrame
    steps: pd.DataFrame

    @property
    def flagged(self) -> pd.DataFrame:
        """The stragglers, the one causing the most wait first."""
        if not len(self.ranks):
            return self.ranks
        f = self.ranks[self.ranks["straggler"].astype(bool)]
        return f.sort_values("caused_wait_ns", ascending=False, kind="stable").reset_index(drop=True)

    def statement(self) -> str:
        """One sentence: the stragglers, or why there is none."""
        if not len(self.groups):
            return "no straggler analysis: no collective is matched across ranks (one rank, or no collectives)"
        f = self.flagged
        if len(f):
            parts = [f"rank {int(r.rank)} ({r.gkey}: last at {100 * r.last_share:.0f}% of its collectives, "
                     f"the others wait {duration(float(r.wait_per_other_ns))} each)" for r in f.head(3).itertuples()]
            more = f"; {len(f) - 3} more" if len(f) > 3 else ""
            return f"{counted(len(f), 'straggler')}: " + "; ".join(parts) + more
        g = self.groups.sort_values("top_share", ascending=False, kind="stable").iloc[0]
        top = "" if pd.isna(g["top_rank"]) else (
            f"; the most often last is rank {int(g['top_rank'])} at {100 * float(g['top_share']):.0f}% of the "
            f"collectives of {g['gkey']} (a straggler needs {100 * float(g['threshold']):.0f}% and a wait of "
            f"{MIN_WAIT_PCT:.0f}% of the time)")
        return (f"no straggler: in each of the {counted(len(self.groups), 'group')} "
                f"the rank that arrives last at the collectives changes from one collective to the next{top}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the statement, the stragglers, the groups (bounded: no per-step rows)."""
        from perfscope.format import records

        return {"statement": self.statement(), "found": bool(len(self.flagged)),
                "stragglers": records(self.flagged.drop(columns=["straggler"], errors="ignore")),
                "groups": records(self.groups)}


def empty_stragglers() -> Stragglers:
    return Stragglers(pd.DataFrame(columns=list(RANK_COLUMNS)), pd.DataFrame(columns=list(GROUP_COLUMNS)),
                      pd.DataFrame(columns=["rank", "step", "wait_ns", "caused_ns"]))


def _reference(per_rank: pd.DataFrame, steps: pd.DataFrame, ranks: Sequence[int]) -> float:
    """The group's time: the mean over its ranks of their steps' total, else of their active span."""
    if len(steps):
        s = steps[steps["rank"].isin(ranks)]
        if len(s):
            return float(s.groupby("rank")["duration_ns"].sum().mean())
    pr = per_rank[per_rank["rank"].isin(ranks)]
    return float(pr["span_ns"].astype(np.float64).mean()) if len(pr) else math.nan


def decide(waits: pd.DataFrame, per_rank: pd.DataFrame, steps: pd.DataFrame, step_wait: pd.DataFrame,
           job_ranks: Sequence[int], group_ranks: dict[str, list[int]]) -> Stragglers:
    """The straggler decision per group, from the per-rank waits of every group (:func:`.rank_waits`)."""
    if not len(waits):
        return empty_stragglers()
    held = {int(r) for r in job_ranks}
    roles = per_rank.set_index("rank")["role"].to_dict() if "role" in per_rank else {}
    kinds = per_rank.set_index("rank")["group_kind"].to_dict() if "group_kind" in per_rank else {}
    rows, groups = [], []
    for gkey, w in waits.groupby("gkey", sort=True):
        ranks = group_ranks.get(str(gkey), sorted(int(r) for r in w["rank"]))
        present = sorted(int(r) for r in w["rank"])
        n, inst = len(present), int(w["instances"].max())
        ref = _reference(per_rank, steps, present)
        thr = last_share_needed(n, inst) if n >= 2 else math.inf
        w = w.assign(wait_per_other_ns=w["caused_wait_ns"] / max(n - 1, 1))
        w = w.assign(wait_pct=100.0 * w["wait_per_other_ns"] / ref if ref > 0 else np.nan, threshold=thr)
        flag = (w["last_share"] >= thr) & (w["wait_pct"] >= MIN_WAIT_PCT) & (inst >= MIN_INSTANCES) & (n >= 2)
        w = w.assign(straggler=flag.to_numpy(bool), kind=kinds.get(present[0]), role=roles.get(present[0]))
        rows.append(w)
        top = w.sort_values("last_share", ascending=False, kind="stable").iloc[0]
        missing = [r for r in ranks if r not in held]
        groups.append({"gkey": gkey, "kind": kinds.get(present[0]), "role": roles.get(present[0]),
                       "ranks": format_ranks(ranks), "present": n, "missing": format_ranks(missing),
                       "instances": inst, "wait_ns": float(w["comm_wait_ns"].sum()), "reference_ns": ref,
                       "threshold": thr, "top_rank": int(top["rank"]), "top_share": float(top["last_share"]),
                       "stragglers": format_ranks(w.loc[w["straggler"], "rank"])})
    ranks_df = pd.concat(rows, ignore_index=True)[list(RANK_COLUMNS)]
    return Stragglers(ranks_df, pd.DataFrame(groups, columns=list(GROUP_COLUMNS)), step_wait)


def analyse(t: RankTables, job_ranks: Sequence[int] | None = None) -> Stragglers:
    """The straggler analysis of a job's rank tables, in this process (the Dask import runs the same
    steps: :func:`.collectives.match` per group on the workers, then :func:`decide`)."""
    ranks = list(job_ranks) if job_ranks is not None else t.ranks
    if not len(t.collectives) or len(ranks) < 2:
        return empty_stragglers()
    roles = t.per_rank.set_index("rank")["role"].to_dict() if "role" in t.per_rank else {}
    keyed = with_keys(t.collectives, roles)
    matched = match(keyed, ranks)
    groups = {g: expected_ranks(g, keyed, ranks) for g in keyed["gkey"].unique().tolist()}
    return decide(rank_waits(matched), t.per_rank, t.steps, step_waits(matched), ranks, groups)


# ---------------------------------------------------------------------------- why it is late
@dataclass(frozen=True)
class Excess:
    """What a rank spends more time on than the median of its group's other ranks."""

    kernels: pd.DataFrame  # kernel, rank_ns, peers_ns, excess_ns (largest first, positive only)
    idle: pd.DataFrame  # kind, rank_ns, peers_ns, excess_ns
    compute_ns: float  # excess of all kernel time but the collectives'


def excess_of(rank: int, peers: Sequence[int], t: RankTables) -> Excess:
    """``rank``'s kernel time (by short name) and device idle time (by kind) above the median of ``peers``."""
    def versus(df: pd.DataFrame, key: str, value: str) -> pd.DataFrame:
        cols = ["rank_ns", "peers_ns", "excess_ns"]
        if not len(df):
            return pd.DataFrame(columns=[key, *cols])
        sub = df[df["rank"].isin([rank, *peers])]
        wide = sub.pivot_table(index=key, columns="rank", values=value, aggfunc="sum").reindex(
            columns=[rank, *peers]).fillna(0.0)
        out = pd.DataFrame({key: wide.index, "rank_ns": wide[rank].to_numpy(np.float64, na_value=np.nan),
                            "peers_ns": wide[list(peers)].median(axis=1).to_numpy(np.float64, na_value=np.nan)})
        out["excess_ns"] = out["rank_ns"] - out["peers_ns"]
        return out[out["excess_ns"] > 0].sort_values("excess_ns", ascending=False, kind="stable").reset_index(drop=True)

    kernels = t.kernels
    comm = set()
    if len(t.collectives):
        comm = set(t.collectives.loc[t.collectives["rank"] == rank, "name"].unique().tolist())
    k = versus(kernels, "kernel", "time_ns") if len(kernels) else versus(pd.DataFrame(), "kernel", "time_ns")
    k = k[~k["kernel"].isin(comm)].reset_index(drop=True)  # its collectives are short: it did not wait
    pr = t.per_rank.set_index("rank")["compute_ns"].astype(np.float64)
    compute = float(pr.get(rank, np.nan) - pr.reindex(list(peers)).median())
    return Excess(k, versus(t.idle, "kind", "duration_ns"), compute)


IDLE_WORDS = {
    "dispatch": "while its host dispatched operators (per-operator Python and framework work between launches)",
    "cpu compute": "while its host computed between launches",
    "waiting": "while its host waited (sleep, locks, I/O)",
    "host code": "while its host ran its own code between launches (its ranges and functions name it)",
    UNNAMED_HOST: "while its host ran its own code between launches (no range, function or operator names it)",
    "launch": "while its host launched kernels",
    "sync": "while its host synchronised with the device",
    "copy": "waiting for host-device copies",
    "graph": "between the nodes of its graph replays",
    "profiler": "inside the profiler's own work",
}

__all__ = ["IDLE_WORDS", "MIN_INSTANCES", "MIN_WAIT_PCT", "Excess", "Stragglers", "analyse", "decide",
           "empty_stragglers", "excess_of", "last_share_needed"]
