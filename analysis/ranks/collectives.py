"""Collective time split into transfer and wait, by matching each collective across the ranks that run it.

A collective (NCCL / RCCL all-reduce, all-gather, ...) ends on every rank of its group at about the
same moment: when the last rank has arrived and the data has moved. So on each rank its kernel
lasts the time it waited for the last rank plus the transfer itself, and the last rank to arrive
has the shortest kernel. Matching the same collective on every rank of its group (the ``seq``-th
collective of that name the rank ran in that group: a communicator runs its collectives in issue
order) gives, per collective and rank:

- ``transfer_ns``: the shortest of the group's kernels for it (the last rank's: it did not wait);
- ``wait_ns``: the rank's kernel time above that, the time it waited for the last rank;
- ``last``: whether the rank was the last to arrive (within :data:`TIE_NS` of the shortest); the
  waits of the other ranks are that rank's doing (``caused_ns``, shared when several tie).

No clock is compared across ranks, only durations on each rank's own clock, so the split holds
for traces of different hosts whose clocks disagree. A collective that some rank of the group did
not record (a missing or truncated rank) is left unmatched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .stats import parse_ranks

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

TIE_NS = 2_000
"""Kernels of one collective within 2 us of the shortest count as arriving last together (a
launch's own jitter is of that order)."""
TIE_SHARE = 0.02
"""...or within 2% of the shortest, for long transfers."""

MATCHED_COLUMNS = ("gkey", "rank", "name", "seq", "step", "start_ns", "duration_ns", "present", "expected",
                   "transfer_ns", "wait_ns", "last", "caused_ns")
WAIT_COLUMNS = ("rank", "gkey", "instances", "comm_transfer_ns", "comm_wait_ns", "last_count", "last_share",
                "caused_wait_ns")
STEP_WAIT_COLUMNS = ("rank", "step", "wait_ns", "caused_ns")


def group_key(group: str, role: str | None) -> str:
    """The key of the ranks a collective meets: its group (``0-7``), or, when the trace does not
    say, every rank of the job with the same role (``all prefill ranks``)."""
    if group:
        return group
    return f"all {role} ranks" if role else "all ranks"


def with_keys(coll: pd.DataFrame, roles: Mapping[int, str | None]) -> pd.DataFrame:
    """``coll`` with ``gkey`` (:func:`group_key`) from each rank's role."""
    role = coll["rank"].map(lambda r: roles.get(int(r))).astype("object")
    keys = [group_key(str(g or ""), r) for g, r in zip(coll["group"].tolist(), role.tolist())]
    return coll.assign(gkey=pd.Series(keys, index=coll.index, dtype="object"))


def expected_ranks(gkey: str, keyed: pd.DataFrame, job_ranks: Sequence[int]) -> list[int]:
    """The ranks of the job that run the collectives of ``gkey``: the group's ranks that the job
    holds, or the ranks whose collectives have that key."""
    if gkey.startswith("all "):
        return sorted(int(r) for r in keyed.loc[keyed["gkey"] == gkey, "rank"].unique())
    held = {int(r) for r in job_ranks}
    return [r for r in parse_ranks(gkey) if r in held]


def match(keyed: pd.DataFrame, job_ranks: Sequence[int]) -> pd.DataFrame:
    """Every collective row of ``keyed`` (one group or several, with ``gkey``) matched across its
    group: :data:`MATCHED_COLUMNS`. ``transfer_ns``, ``wait_ns`` and ``caused_ns`` are NaN for a
    collective not every rank of the group recorded."""
    if not len(keyed):
        return pd.DataFrame(columns=list(MATCHED_COLUMNS))
    df = keyed[["gkey", "rank", "name", "seq", "step", "start_ns", "duration_ns"]].copy()
    df["duration_ns"] = df["duration_ns"].astype(np.float64)
    expected = {g: len(expected_ranks(g, keyed, job_ranks)) for g in df["gkey"].unique().tolist()}
    df["expected"] = df["gkey"].map(expected).astype(np.int64)
    g = df.groupby(["gkey", "name", "seq"], sort=False)["duration_ns"]
    df["present"] = g.transform("size").astype(np.int64)
    complete = (df["present"] >= df["expected"]) & (df["expected"] >= 2)
    shortest = g.transform("min")
    transfer = shortest.where(complete)
    wait = (df["duration_ns"] - transfer).clip(lower=0.0)
    tol = np.maximum(TIE_NS, TIE_SHARE * transfer.to_numpy(np.float64, na_value=np.nan))
    last = complete.to_numpy(bool) & (wait.to_numpy(np.float64, na_value=np.nan) <= tol)
    df["transfer_ns"], df["wait_ns"], df["last"] = transfer, wait, last
    inst = df.groupby(["gkey", "name", "seq"], sort=False)
    total_wait = inst["wait_ns"].transform("sum")
    n_last = inst["last"].transform("sum").astype(np.float64)
    df["caused_ns"] = np.where(last, total_wait / np.where(n_last > 0, n_last, np.nan), 0.0)
    df.loc[~complete, "caused_ns"] = np.nan
    return df[list(MATCHED_COLUMNS)]


def rank_waits(matched: pd.DataFrame) -> pd.DataFrame:
    """Per rank and group: matched collectives, their transfer and wait time, how often the rank
    arrived last (ties shared), and the other ranks' wait it caused (:data:`WAIT_COLUMNS`)."""
    m = matched[matched["transfer_ns"].notna()]
    if not len(m):
        return pd.DataFrame(columns=list(WAIT_COLUMNS))
    inst = m.groupby(["gkey", "name", "seq"], sort=False)["last"]
    share = m["last"].astype(np.float64) / inst.transform("sum").astype(np.float64).where(lambda s: s > 0)
    m = m.assign(last_w=share.fillna(0.0))
    out = m.groupby(["rank", "gkey"], sort=True).agg(
        instances=("seq", "size"), comm_transfer_ns=("transfer_ns", "sum"), comm_wait_ns=("wait_ns", "sum"),
        last_count=("last_w", "sum"), caused_wait_ns=("caused_ns", "sum")).reset_index()
    out["last_share"] = out["last_count"] / out["instances"]
    return out[list(WAIT_COLUMNS)]


def step_waits(matched: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: the time it waited in its collectives, and the wait of the other ranks
    it caused (:data:`STEP_WAIT_COLUMNS`); collectives outside every step are left out."""
    m = matched[matched["transfer_ns"].notna() & (matched["step"] >= 0)]
    if not len(m):
        return pd.DataFrame(columns=list(STEP_WAIT_COLUMNS))
    out = m.groupby(["rank", "step"], sort=True).agg(wait_ns=("wait_ns", "sum"), caused_ns=("caused_ns", "sum"))
    return out.reset_index()[list(STEP_WAIT_COLUMNS)]


__all__ = ["MATCHED_COLUMNS", "STEP_WAIT_COLUMNS", "TIE_NS", "WAIT_COLUMNS", "expected_ranks", "group_key",
           "match", "rank_waits", "step_waits", "with_keys"]
