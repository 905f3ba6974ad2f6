"""Many ranks, one view: per-rank statistics of a distributed job and their job-level reductions.

A multi-rank Report has the usual tables with a ``rank`` column (``perfscope import DIR --ranks``
writes them as Parquet datasets partitioned by rank). This module computes, per rank:

- steps: ``ProfilerStep#N`` ranges (torch.profiler's schedule), else the engine's ``steps`` table,
  else engine step annotations (vLLM's ``execute_context_N(..)_generation_M(..)`` ranges);
- communication vs computation: collective kernels (category ``comm``: NCCL, all-reduce, ...) and
  the other kernels, as unions of intervals per device, and their overlap (the time a collective
  runs while compute runs on another stream); ``exposed_comm_ns`` is the collective time with no
  compute beside it;
- idle time: the device's active span minus the union of its kernels and copies, and the idle
  time by kind (the report's ``idle`` table: its causes, the host's time split into what it did);
- per step: its compute, collectives and idle time;
- its collective kernels, each with the group of ranks it meets (the trace's process groups), for
  :mod:`.collectives` to match across the ranks (transfer and wait) and :mod:`.straggler` to tell who
  the others wait for;
- its role: prefill or decode worker from its steps' phases, and its group's parallelism (TP, EP,
  DP, PP) from the group's description;
- kernel time by category and by kernel name.

Then the job-level reductions: stragglers (ranks whose step time or compute per step is an outlier,
with their margin over the median of the other ranks), per-step spread, and the kernels whose time
differs most across ranks. Every job-level result names the ranks it covers.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.memo import memo
from perfscope.schema import column_codes, map_codes, text_of, value_mask, value_positions

from ..costs.operators import category_of
from ..idle import kinds_of
from ..intervals import covered_ns, merge_intervals
from ..steps import GPU_RANGE_SOURCES
from ..summaries.kernels import group_key

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from perfscope.report import Report

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
"""torch.profiler's step annotation (``prof.step()`` with a schedule)."""
ENGINE_STEP_NAME = re.compile(r"^execute_context_\d+\(.*\)_generation_\d+\(.*\)$")
"""One engine step of vLLM's model runner (context and generation requests and tokens)."""

STRAGGLER_MIN_MARGIN_PCT = 5.0
"""A rank is a straggler only when it is at least 5% above the median of the other ranks:
below that, run-to-run noise of a step on a busy node is of the same order."""
STRAGGLER_MIN_Z = 3.5
"""...and its modified z-score (0.6745 (x - median) / MAD, Iglewicz and Hoaglin) is 3.5 or more,
the usual outlier cut. With fewer than 3 ranks there is no spread to judge, so the margin alone
decides."""
STRAGGLER_METRICS = ("step_mean_ns", "compute_per_step_ns")
"""Per-rank quantities checked for stragglers: mean step time, and compute time per step (the
cause: in a synchronous job every rank's step ends at the same collective, and the ranks that
wait show it as communication time, not step time)."""

PER_RANK_COLUMNS = (
    "rank", "devices", "kernels", "span_ns", "busy_ns", "idle_ns", "idle_pct", "compute_ns", "comm_ns",
    "overlap_ns", "exposed_comm_ns", "overlap_pct", "comm_pct", "steps", "step_mean_ns", "step_median_ns",
    "compute_per_step_ns", "role", "sync_group", "group_kind",
)
STEP_COLUMNS = ("rank", "step", "name", "phase", "start_ns", "end_ns", "duration_ns", "source", "compute_ns",
                "comm_ns", "idle_ns")
COLLECTIVE_COLUMNS = ("rank", "group", "process_group", "name", "seq", "step", "start_ns", "end_ns", "duration_ns")
"""One row per collective kernel of a rank: ``group`` is the ranks it meets (``0-7``; "" when the
trace does not say: every rank of the job with the same role), ``seq`` its order among the rank's
collectives of the same group and name (the same collective has the same ``seq`` on every rank of
its group: NCCL/RCCL run a communicator's collectives in issue order)."""


@dataclass(frozen=True)
class RankTables:
    """The per-rank analysis of a job, as small tables (one row per rank, step, category, kernel).

    Attributes:
        per_rank: one row per rank (:data:`PER_RANK_COLUMNS`).
        steps: one row per rank and step (:data:`STEP_COLUMNS`): its window, and the union of its
            compute kernels, of its collective kernels and the device's idle time inside it.
        categories: rank, category, time_ns, count (kernel time by category).
        kernels: rank, kernel, time_ns, count (kernel time by short name).
        collectives: one row per collective kernel (:data:`COLLECTIVE_COLUMNS`).
        idle: rank, kind, duration_ns: the device's idle time by kind (the ``idle`` table's causes,
            the host's split into what it did).
    """

    per_rank: pd.DataFrame
    steps: pd.DataFrame
    categories: pd.DataFrame
    kernels: pd.DataFrame
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)
    idle: pd.DataFrame = field(default_factory=pd.DataFrame)

    @classmethod
    def concat(cls, parts: Iterable[RankTables]) -> RankTables:
        """Stack the tables of several ranks (or several groups of ranks)."""
        parts = list(parts)
        if not parts:
            return empty_rank_tables()
        return cls(**{f.name: _stack([getattr(p, f.name) for p in parts]) for f in fields(cls)})

    @property
    def ranks(self) -> list[int]:
        """The ranks covered, sorted."""
        return sorted(int(r) for r in self.per_rank["rank"].unique())


def _stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def empty_rank_tables() -> RankTables:
    """Tables with no rank in them."""
    return RankTables(pd.DataFrame(columns=list(PER_RANK_COLUMNS)), pd.DataFrame(columns=list(STEP_COLUMNS)),
                      pd.DataFrame(), pd.DataFrame(), pd.DataFrame(columns=list(COLLECTIVE_COLUMNS)), pd.DataFrame())


# ---------------------------------------------------------------------------- steps
def _range_steps(ranges: pd.DataFrame) -> pd.DataFrame:
    names = text_of(ranges["name"])
    number = names.str.extract(STEP_NAME, expand=False)
    hit = number.notna()
    if hit.any():
        out = ranges.loc[hit, ["name", "start_ns", "end_ns"]].assign(step=number[hit].astype("int64"), source="ProfilerStep")
        return out.drop_duplicates("step", keep="first")
    engine = names.str.match(ENGINE_STEP_NAME)
    if "source" in ranges:  # the host's annotation, not its GPU-side twin
        engine &= ~ranges["source"].astype("object").isin(GPU_RANGE_SOURCES).to_numpy(bool)
    if engine.any():
        out = ranges.loc[engine, ["name", "start_ns", "end_ns"]].sort_values("start_ns", kind="stable")
        return out.assign(step=np.arange(len(out), dtype="int64"), source="engine annotation")
    return pd.DataFrame(columns=["name", "start_ns", "end_ns", "step", "source"])


def step_table(ranges: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The steps of one rank: step, name, phase, start_ns, end_ns, duration_ns, source.

    ``ProfilerStep#N`` ranges come first (their N is the step number, comparable across ranks);
    then the report's ``steps`` table (the engine's, or a framework's step annotations read at
    import, with their phase); then vLLM step annotations among the ranges, numbered in time order.
    """
    out = _range_steps(ranges) if len(ranges) else pd.DataFrame()
    profiler = len(out) and (out["source"] == "ProfilerStep").all()
    if not profiler and len(steps):
        label = steps["label"].astype("object") if "label" in steps else pd.Series(None, index=steps.index)
        out = steps[["phase", "start_ns", "end_ns", "step"]].assign(
            name=label.where(label.notna(), steps["phase"].astype("object")), source="engine")
    if not len(out):
        return pd.DataFrame(columns=["step", "name", "phase", "start_ns", "end_ns", "duration_ns", "source"])
    if "phase" not in out:
        out = out.assign(phase=None)
    out = out.astype({"start_ns": "int64", "end_ns": "int64", "step": "int64"})
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    out["phase"] = out["phase"].astype("object").where(out["phase"].notna(), None)
    cols = ["step", "name", "phase", "start_ns", "end_ns", "duration_ns", "source"]
    return out[cols].sort_values("step", kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------- one rank
def comm_mask(kernels: pd.DataFrame) -> np.ndarray:
    """True for collective kernels: category ``comm``, or a collective name where no category is set.

    Computed once per table object (the rank view and the stream rule ask for the same one)."""
    return memo(kernels, "comm_mask", lambda: _comm_mask(kernels)).copy()


def _comm_mask(kernels: pd.DataFrame) -> np.ndarray:
    if "category" not in kernels.columns:
        kernels = kernels.assign(category=None)
    out = value_mask(kernels, "category", lambda c: c == "comm")  # a fresh array: writable
    missing = value_mask(kernels, "category", lambda c: c is None)
    if missing.any():
        # once per distinct name (hashing 1M long names twice, as unique() + map() do, costs seconds)
        codes, names = column_codes(kernels, "name")
        out[missing] = map_codes(codes[missing], names, lambda n: category_of(None, str(n)) == "comm").astype(bool)
    return out


def _union_ns(merged: tuple[np.ndarray, np.ndarray]) -> float:
    return float((merged[1] - merged[0]).sum())


def _device_times(s: np.ndarray, e: np.ndarray, comm: np.ndarray, t: pd.DataFrame) -> dict[str, float]:
    """compute, comm, overlap, busy and span ns of one device's kernels (starts ``s``, ends ``e``,
    collective or not ``comm``) and copies ``t``."""
    comp_u = merge_intervals(s[~comm], e[~comm])
    comm_u = merge_intervals(s[comm], e[comm])
    overlap = float(covered_ns(comp_u, comm_u[0], comm_u[1]).sum())
    all_s = np.concatenate([s, t["start_ns"].to_numpy("int64")])
    all_e = np.concatenate([e, t["end_ns"].to_numpy("int64")])
    busy = merge_intervals(all_s, all_e)
    span = float(busy[1][-1] - busy[0][0]) if len(busy[0]) else 0.0
    return {"compute_ns": _union_ns(comp_u), "comm_ns": _union_ns(comm_u), "overlap_ns": overlap,
            "busy_ns": _union_ns(busy), "span_ns": span}


def _copies_by_device(transfers: pd.DataFrame, devices: Sequence[str]) -> dict[str, pd.DataFrame]:
    t = transfers[["device", "start_ns", "end_ns"]]
    if len(devices) == 1:
        t = t.assign(device=t["device"].astype("object").where(t["device"].notna(), devices[0]))
    return {str(d): g for d, g in t.groupby(t["device"].astype("object"), sort=False)}


def _times(kernels: pd.DataFrame, transfers: pd.DataFrame) -> dict[str, float]:
    # per device on positions (the table's device codes): no copy of the kernel table, one
    # collective mask for all devices
    by_device = value_positions(kernels, "device")
    devices = [str(d) for d, _ in by_device]
    copies = _copies_by_device(transfers, devices)
    empty = transfers.iloc[:0][["start_ns", "end_ns"]]
    totals = dict.fromkeys(("compute_ns", "comm_ns", "overlap_ns", "busy_ns", "span_ns"), 0.0)
    comm = comm_mask(kernels)
    starts, ends = kernels["start_ns"].to_numpy("int64"), kernels["end_ns"].to_numpy("int64")
    for device, rows in by_device:
        for key, value in _device_times(starts[rows], ends[rows], comm[rows],
                                        copies.get(str(device), empty)).items():
            totals[key] += value
    totals["devices"] = float(len(devices))
    return totals


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else math.nan


def per_rank_row(rank: int, kernels: pd.DataFrame, transfers: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any]:
    """The headline numbers of one rank (the columns of :data:`PER_RANK_COLUMNS`)."""
    t = _times(kernels, transfers)
    n_steps = len(steps)
    step_ns = steps["duration_ns"].astype("float64") if n_steps else pd.Series(dtype="float64")
    has_work = len(kernels) > 0
    row: dict[str, Any] = {
        "rank": int(rank), "devices": int(t["devices"]), "kernels": len(kernels),
        "span_ns": t["span_ns"] if has_work else math.nan, "busy_ns": t["busy_ns"] if has_work else math.nan,
        "compute_ns": t["compute_ns"] if has_work else math.nan, "comm_ns": t["comm_ns"] if has_work else math.nan,
        "overlap_ns": t["overlap_ns"] if has_work else math.nan,
        "steps": n_steps,
        "step_mean_ns": float(step_ns.mean()) if n_steps else math.nan,
        "step_median_ns": float(step_ns.median()) if n_steps else math.nan,
    }
    row["idle_ns"] = row["span_ns"] - row["busy_ns"]
    row["idle_pct"] = _pct(row["idle_ns"], row["span_ns"])
    row["exposed_comm_ns"] = row["comm_ns"] - row["overlap_ns"]
    row["overlap_pct"] = _pct(row["overlap_ns"], row["comm_ns"])
    row["comm_pct"] = _pct(row["comm_ns"], row["span_ns"])
    row["compute_per_step_ns"] = row["compute_ns"] / n_steps if n_steps else math.nan
    return {c: row.get(c) for c in PER_RANK_COLUMNS}


def _kernel_times(rank: int, kernels: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    dur = kernels["duration_ns"].astype("float64")
    cat = kernels["category"].astype("object").fillna("other") if "category" in kernels else pd.Series(
        ["other"] * len(kernels), index=kernels.index)
    by_cat = dur.groupby(cat).agg(["sum", "count"]).reset_index()
    by_cat.columns = ["category", "time_ns", "count"]
    by_name = dur.groupby(text_of(group_key(kernels))).agg(["sum", "count"]).reset_index()
    by_name.columns = ["kernel", "time_ns", "count"]
    return by_cat.assign(rank=int(rank)), by_name.assign(rank=int(rank))


def _step_work(steps: pd.DataFrame, s: np.ndarray, e: np.ndarray, comm: np.ndarray,
               busy: tuple[np.ndarray, np.ndarray]) -> pd.DataFrame:
    """``steps`` with compute_ns, comm_ns (unions of its compute / collective kernels inside each
    step's window) and idle_ns (the window minus the device's kernels and copies)."""
    if not len(steps):
        return steps.assign(compute_ns=pd.Series(dtype="float64"), comm_ns=pd.Series(dtype="float64"),
                            idle_ns=pd.Series(dtype="float64"))
    a, b = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    comp_u, comm_u = merge_intervals(s[~comm], e[~comm]), merge_intervals(s[comm], e[comm])
    return steps.assign(compute_ns=covered_ns(comp_u, a, b), comm_ns=covered_ns(comm_u, a, b),
                        idle_ns=(b - a).astype(np.float64) - covered_ns(busy, a, b))


def step_at(steps: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """The step (number) whose window holds each time ``t``; -1 outside every step."""
    if not len(steps) or not len(t):
        return np.full(len(t), -1, np.int64)
    order = np.argsort(steps["start_ns"].to_numpy(np.int64), kind="stable")
    a = steps["start_ns"].to_numpy(np.int64)[order]
    b = steps["end_ns"].to_numpy(np.int64)[order]
    n = steps["step"].to_numpy(np.int64)[order]
    i = np.searchsorted(a, t, side="right") - 1
    j = np.maximum(i, 0)
    return np.where((i >= 0) & (t < b[j]), n[j], -1)


POINT_TO_POINT = re.compile(r"send|recv", re.IGNORECASE)
"""Point-to-point kernels (NCCL's SendRecv, Send, Recv): a send waits for its one peer, not for the
last rank of a group, so they are not matched across a group (NCCL runs all-to-all as grouped
sends too: an MoE all-to-all is left out with them)."""


def collective_rows(rank: int, kernels: pd.DataFrame, comm: np.ndarray, steps: pd.DataFrame,
                    groups: Sequence[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """The collective kernels of one rank (:data:`COLLECTIVE_COLUMNS`), each with the group of ranks
    it meets (:func:`sync_group`); point-to-point kernels (:data:`POINT_TO_POINT`) are left out."""
    rows = np.flatnonzero(comm)
    if len(rows):
        codes, names = column_codes(kernels, "name")
        p2p = map_codes(codes[rows], names, lambda n: bool(POINT_TO_POINT.search(str(n or "")))).astype(bool)
        rows = rows[~p2p]
    if not len(rows):
        return pd.DataFrame(columns=list(COLLECTIVE_COLUMNS))
    s = kernels["start_ns"].to_numpy(np.int64)[rows]
    order = np.argsort(s, kind="stable")
    rows, s = rows[order], s[order]
    name = map_codes(*_codes_at(kernels, "short_name" if "short_name" in kernels else "name", rows),
                     lambda v: "" if v is None else str(v))
    pg = (map_codes(*_codes_at(kernels, "process_group", rows), lambda v: None if v is None else str(v))
          if "process_group" in kernels else np.full(len(rows), None, dtype=object))
    group = np.array([sync_group(rank, p, groups) for p in pg.tolist()], dtype=object) if len(groups) else \
        np.full(len(rows), "", dtype=object)
    df = pd.DataFrame({"rank": int(rank), "group": group, "process_group": pg, "name": name,
                       "step": step_at(steps, s), "start_ns": s,
                       "end_ns": kernels["end_ns"].to_numpy(np.int64)[rows]})
    df["duration_ns"] = df["end_ns"] - df["start_ns"]
    df["seq"] = df.groupby(["group", "name"], sort=False).cumcount().astype("int64")
    return df[list(COLLECTIVE_COLUMNS)]


def _codes_at(table: pd.DataFrame, column: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    codes, distinct = column_codes(table, column)
    return codes[rows], distinct


def group_ranks(groups: Sequence[Mapping[str, Any]], name: str | None) -> list[int] | None:
    """The ranks of process group ``name`` in ``distributedInfo.pg_config`` (None: not listed)."""
    for g in groups:
        if name is not None and str(g.get("name")) == name:
            return [int(r) for r in g.get("ranks") or []]
    return None


def sync_group(rank: int, process_group: str | None, groups: Sequence[Mapping[str, Any]]) -> str:
    """The ranks a collective of ``rank`` meets, as text (``0-7``): its process group's ranks when
    the kernel names its group (NCCL kernels in recent PyTorch traces), else the rank's smallest
    group of several ranks (in inference the collectives on the critical path are the tensor
    parallel group's all-reduces, the smallest group); "" when the trace lists no group."""
    ranks = group_ranks(groups, process_group)
    if ranks is None:
        several = [g for g in groups if len(g.get("ranks") or []) > 1 and rank in (g.get("ranks") or [])]
        if not several:
            return ""
        ranks = [int(r) for r in min(several, key=lambda g: len(g.get("ranks") or []))["ranks"]]
    return format_ranks(ranks) if len(ranks) > 1 else ""


GROUP_KINDS = (("TP", ("tp", "tensor")), ("EP", ("ep", "expert", "moe")), ("DP", ("dp", "data")),
               ("PP", ("pp", "pipeline")), ("CP", ("cp", "context")))
"""Parallelism named by a process group's ``pg_desc`` (Megatron's TENSOR_MODEL_PARALLEL_GROUP, vLLM and
SGLang's tp / ep / dp / pp groups, torchtitan's mesh dims)."""


def group_kind(desc: object) -> str | None:
    """TP, EP, DP, PP or CP when a group's description says so, else None (``undefined``, ``default_pg``)."""
    words = re.split(r"[^a-z]+", str(desc or "").lower())
    for kind, keys in GROUP_KINDS:
        if any(w == k or w.startswith(k + "_") or (len(k) > 2 and k in w) for w in words for k in keys):
            return kind
    return None


def role_of(steps: pd.DataFrame) -> str | None:
    """``prefill`` or ``decode`` when every step of the rank with a phase is one of them, ``mixed`` when
    both occur (a worker that does both), None when its steps carry no phase."""
    if "phase" not in steps or not len(steps):
        return None
    phases = {str(p) for p in steps["phase"].dropna().tolist()} - {"idle"}
    if not phases:
        return None
    if phases <= {"prefill"}:
        return "prefill"
    if phases <= {"decode", "draft", "verify"}:
        return "decode"
    return "mixed"


UNNAMED_HOST = "host code (unnamed)"
"""The rank view's kind for ``host code`` that no range, Python function or operator names (the
``gpu-idle`` finding's rule: such time explains nothing); named host code stays ``host code``."""


def idle_rows(rank: int, idle: pd.DataFrame | None) -> pd.DataFrame:
    """rank, kind, duration_ns: the idle time of the rank's devices by kind (the cause, with the host's
    time split into what it did: dispatch, cpu compute, waiting, host code; :func:`..idle.kinds_of`),
    host code that nothing names apart (:data:`UNNAMED_HOST`)."""
    if idle is None or not len(idle) or "cause" not in idle:
        return pd.DataFrame(columns=["rank", "kind", "duration_ns"])
    kinds = kinds_of(idle)
    named = np.zeros(len(idle), dtype=bool)
    for c in ("range", "function", "op"):
        if c in idle:
            named |= value_mask(idle, c, lambda v: isinstance(v, str) and bool(v))
    kinds = np.where((kinds == "host code") & ~named, UNNAMED_HOST, kinds)
    by = pd.Series(idle["duration_ns"].to_numpy(np.float64, na_value=np.nan)).groupby(kinds, sort=True).sum()
    return pd.DataFrame({"rank": int(rank), "kind": by.index.astype(object), "duration_ns": by.to_numpy(np.float64, na_value=np.nan)})


def one_rank(rank: int, tables: Mapping[str, pd.DataFrame], groups: Sequence[Mapping[str, Any]] = ()) -> RankTables:
    """The analysis of one rank from its report tables (``kernels``, ``transfers``, ``ranges``,
    ``steps``, and ``idle`` when given), with its process groups (``distributedInfo.pg_config``:
    name, desc, ranks) to tell which ranks its collectives meet."""
    steps = step_table(tables["ranges"], tables["steps"]).assign(rank=int(rank))
    kernels = tables["kernels"]
    per_rank = per_rank_row(rank, kernels, tables["transfers"], steps)
    comm = comm_mask(kernels) if len(kernels) else np.zeros(0, bool)
    s, e = kernels["start_ns"].to_numpy(np.int64), kernels["end_ns"].to_numpy(np.int64)
    t = tables["transfers"]
    busy = merge_intervals(np.concatenate([s, t["start_ns"].to_numpy(np.int64)]),
                           np.concatenate([e, t["end_ns"].to_numpy(np.int64)]))
    steps = _step_work(steps, s, e, comm, busy)
    collectives = collective_rows(rank, kernels, comm, steps, groups)
    sync = [g for g in collectives["group"].unique().tolist() if g] if len(collectives) else []
    kinds = {group_kind(g.get("desc")) for g in groups if format_ranks(g.get("ranks") or []) in sync}
    per_rank.update(role=role_of(steps), sync_group=", ".join(sorted(sync)) or None,
                    group_kind=", ".join(sorted(k for k in kinds if k)) or None)
    categories, names = _kernel_times(rank, kernels)
    return RankTables(pd.DataFrame([per_rank]), steps[list(STEP_COLUMNS)], categories, names, collectives,
                      idle_rows(rank, tables.get("idle")))


# ---------------------------------------------------------------------------- report -> ranks
def report_ranks(report: Report) -> list[int]:
    """The ranks a report holds: its ``rank`` column, else the one rank its manifest names, else [0]."""
    if "rank" in report.kernels.columns and report.kernels["rank"].notna().any():
        return sorted(int(r) for r in report.kernels["rank"].dropna().unique())
    info = report.params.get("ranks") or {}
    covered = info.get("ranks") if isinstance(info, dict) else None
    return [int(covered[0])] if covered and len(covered) == 1 else [0]


def _rank_rows(df: pd.DataFrame) -> dict[int, np.ndarray]:
    """Row positions of each rank of ``df`` (one sort, not one scan per rank)."""
    if "rank" not in df.columns or not len(df):
        return {}
    r = df["rank"].to_numpy(np.float64, na_value=np.nan)
    order = np.argsort(r, kind="stable")
    r_sorted = r[order]
    keep = ~np.isnan(r_sorted)
    order, r_sorted = order[keep], r_sorted[keep]
    if not len(order):
        return {}
    cuts = [0, *(np.flatnonzero(np.diff(r_sorted)) + 1).tolist(), len(order)]
    return {int(r_sorted[a]): order[a:b] for a, b in itertools.pairwise(cuts)}


def parse_ranks(text: object) -> list[int]:
    """``"0-2, 5"`` -> ``[0, 1, 2, 5]`` (the inverse of :func:`format_ranks`); a list is taken as is."""
    if isinstance(text, (list, tuple)):
        return [int(r) for r in text]
    out: list[int] = []
    for part in str(text or "").split(","):
        lo, sep, hi = part.strip().partition("-")
        if lo.strip().isdigit():
            out += list(range(int(lo), int(hi) + 1)) if sep and hi.strip().isdigit() else [int(lo)]
    return out


def groups_of(rank: int, groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The process groups (name, desc, ranks) of ``groups`` that hold ``rank``, ranks as lists."""
    out = []
    for g in groups:
        ranks = parse_ranks(g.get("ranks"))
        if rank in ranks:
            out.append({**g, "ranks": ranks})
    return out


def report_groups(report: Report) -> list[dict[str, Any]]:
    """The process groups a multi-rank report's manifest lists (``params.ranks.groups``)."""
    info = report.params.get("ranks")
    groups = info.get("groups") if isinstance(info, dict) else None
    return [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []


TABLES_PER_RANK = ("kernels", "transfers", "ranges", "steps", "idle")


def rank_tables(report: Report) -> RankTables:
    """The per-rank analysis of a report (one rank when it has no ``rank`` column)."""
    ranks = report_ranks(report)
    groups = report_groups(report)
    if "rank" not in report.kernels.columns:
        return RankTables.concat([one_rank(ranks[0], {n: report.table(n) for n in TABLES_PER_RANK},
                                           groups_of(ranks[0], groups))])
    tables = {n: report.table(n) for n in TABLES_PER_RANK}
    rows = {n: _rank_rows(df) for n, df in tables.items()}
    empty = np.zeros(0, np.int64)

    def part(r: int) -> dict[str, pd.DataFrame]:
        return {n: df.iloc[rows[n].get(r, empty)] if "rank" in df.columns else df for n, df in tables.items()}

    return RankTables.concat(one_rank(r, part(r), groups_of(r, groups)) for r in ranks)


# ---------------------------------------------------------------------------- job level
def find_stragglers(per_rank: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Ranks whose ``metric`` is an outlier above the others.

    Returns rank, metric, value_ns, median_others_ns, margin_pct, robust_z, straggler (bool) for
    every rank with a value (so the margins of all ranks can be shown), largest margin first.
    """
    v = per_rank.set_index("rank")[metric].astype("float64").dropna()
    cols = ["rank", "metric", "value_ns", "median_others_ns", "margin_pct", "robust_z", "straggler"]
    if len(v) < 2:
        return pd.DataFrame(columns=cols)
    others = np.array([np.median(np.delete(v.to_numpy(), i)) for i in range(len(v))])
    margin = 100.0 * (v.to_numpy() - others) / np.where(others > 0, others, np.nan)
    med = float(v.median())
    mad = float((v - med).abs().median())
    dev = v.to_numpy() - med
    z = 0.6745 * dev / mad if mad > 0 else np.where(dev > 0, np.inf, 0.0)
    flagged = margin >= STRAGGLER_MIN_MARGIN_PCT
    if len(v) >= 3:
        flagged &= z >= STRAGGLER_MIN_Z
    out = pd.DataFrame({"rank": v.index.astype("int64"), "metric": metric, "value_ns": v.to_numpy(),
                        "median_others_ns": others, "margin_pct": margin, "robust_z": z, "straggler": flagged})
    return out.sort_values("margin_pct", ascending=False, kind="stable").reset_index(drop=True)


def stragglers(per_rank: pd.DataFrame, metrics: Sequence[str] = STRAGGLER_METRICS) -> pd.DataFrame:
    """The flagged rows of :func:`find_stragglers` over ``metrics`` (rank, metric, margin, ...)."""
    parts = [find_stragglers(per_rank, m) for m in metrics if m in per_rank.columns]
    parts = [p[p["straggler"]] for p in parts if len(p)]
    if not parts or not any(len(p) for p in parts):
        return pd.DataFrame(columns=["rank", "metric", "value_ns", "median_others_ns", "margin_pct", "robust_z"])
    return pd.concat([p for p in parts if len(p)], ignore_index=True).drop(columns="straggler")


def step_spread(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step number: ranks, min/median/max duration across ranks, the slowest rank, spread %."""
    if not len(steps):
        return pd.DataFrame(columns=["step", "ranks", "min_ns", "median_ns", "max_ns", "slowest_rank", "spread_pct"])
    g = steps.groupby("step")["duration_ns"]
    out = g.agg(ranks="count", min_ns="min", median_ns="median", max_ns="max").reset_index()
    slowest = steps.loc[g.idxmax().to_numpy(), ["step", "rank"]].rename(columns={"rank": "slowest_rank"})
    out = out.merge(slowest, on="step")
    out["spread_pct"] = 100.0 * (out["max_ns"] - out["min_ns"]) / out["median_ns"].where(out["median_ns"] > 0)
    return out


def kernel_spread(kernels: pd.DataFrame, ranks: Sequence[int], top: int = 20) -> pd.DataFrame:
    """Kernels whose total time differs most across ranks (a rank without the kernel counts 0 ns).

    Columns: kernel, ranks_with, total_ns, min_ns, median_ns, max_ns, cv (std/mean), slowest_rank,
    fastest_rank; the ``top`` kernels by max - min.
    """
    if not len(kernels):
        return pd.DataFrame(columns=["kernel", "ranks_with", "total_ns", "min_ns", "median_ns", "max_ns", "cv",
                                     "slowest_rank", "fastest_rank"])
    wide = kernels.pivot_table(index="kernel", columns="rank", values="time_ns", aggfunc="sum")
    wide = wide.reindex(columns=list(ranks)).fillna(0.0)
    mean = wide.mean(axis=1)
    out = pd.DataFrame({
        "kernel": wide.index, "ranks_with": (wide > 0).sum(axis=1).to_numpy(), "total_ns": wide.sum(axis=1).to_numpy(),
        "min_ns": wide.min(axis=1).to_numpy(), "median_ns": wide.median(axis=1).to_numpy(),
        "max_ns": wide.max(axis=1).to_numpy(), "cv": (wide.std(axis=1, ddof=0) / mean.where(mean > 0)).to_numpy(),
        "slowest_rank": wide.idxmax(axis=1).to_numpy(), "fastest_rank": wide.idxmin(axis=1).to_numpy(),
    })
    out = out.assign(_spread=out["max_ns"] - out["min_ns"]).sort_values("_spread", ascending=False, kind="stable")
    return out.drop(columns="_spread").head(top).reset_index(drop=True)


def category_matrix(categories: pd.DataFrame) -> pd.DataFrame:
    """Kernel time (ns) with one row per rank and one column per category (0 where absent)."""
    if not len(categories):
        return pd.DataFrame()
    wide = categories.pivot_table(index="rank", columns="category", values="time_ns", aggfunc="sum").fillna(0.0)
    order = wide.sum(axis=0).sort_values(ascending=False).index
    return wide[order]


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    values = sorted({int(r) for r in ranks})
    runs: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        runs.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(runs)


def coverage(report: Report, ranks: Sequence[int]) -> dict[str, Any]:
    """Which ranks the results cover, of which world size, and what the import skipped."""
    info = report.params.get("ranks")
    info = info if isinstance(info, dict) else {}
    world = info.get("world_size")
    missing = sorted(set(range(int(world))) - set(ranks)) if isinstance(world, int) else []
    return {"ranks": list(ranks), "ranks_text": format_ranks(ranks), "world_size": world,
            "missing_ranks": format_ranks(missing), "skipped": list(info.get("skipped") or [])}


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _plain(v: Any) -> Any:
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def job_overview(per_rank: pd.DataFrame) -> dict[str, Any]:
    """Job-level totals: mean comm/exposed/idle shares over the ranks, and the worst rank of each."""
    def worst(col: str) -> Any:
        v = per_rank[col].astype("float64")
        return None if v.isna().all() else int(per_rank.loc[v.idxmax(), "rank"])

    mean = {c: _plain(float(per_rank[c].astype("float64").mean())) for c in
            ("span_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "idle_ns", "step_mean_ns")}
    return {**{f"mean_{k}": v for k, v in mean.items()},
            "mean_overlap_pct": _plain(float(per_rank["overlap_pct"].astype("float64").mean())),
            "most_exposed_comm_rank": worst("exposed_comm_ns"), "most_idle_rank": worst("idle_ns"),
            "slowest_step_rank": worst("step_mean_ns")}


def rank_summary(report: Report, *, tables: RankTables | None = None, top: int = 10) -> dict[str, Any]:
    """The multi-rank section of ``perfscope analyze`` (JSON-ready).

    Keys: coverage (ranks, world_size, missing_ranks, skipped), job (mean shares, worst ranks),
    per_rank, stragglers, steps (spread per step), categories (rank x category ns), kernels (the
    ``top`` kernels whose time differs most across ranks).
    """
    t = tables or rank_tables(report)
    ranks = t.ranks
    return {
        "coverage": coverage(report, ranks),
        "job": job_overview(t.per_rank) if len(t.per_rank) else {},
        "per_rank": _records(t.per_rank),
        "stragglers": _records(stragglers(t.per_rank)),
        "steps": _records(step_spread(t.steps)),
        "categories": _records(category_matrix(t.categories).reset_index()),
        "kernels": _records(kernel_spread(t.kernels, ranks, top)),
    }


__all__ = [
    "UNNAMED_HOST", "RankTables", "category_matrix", "find_stragglers", "format_ranks", "kernel_spread", "one_rank",
    "rank_summary", "rank_tables", "report_ranks", "step_spread", "step_table", "stragglers",
]
