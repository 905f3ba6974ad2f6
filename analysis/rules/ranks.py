"""Distributed-job rules: ranks that hold the others back, and communication that compute does not hide.

Both work on the per-rank analysis of :mod:`perfscope.analysis.ranks.stats` and say which ranks they
cover. ``rank-imbalance`` needs two ranks or more; ``exposed-comm`` also fires on a single rank's
trace that has collective kernels.

Collective kernels run while a rank waits for the others, so a rank's exposed communication time
includes waiting for the slowest rank: fix a straggler first, then look at overlap.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import clip, counted, duration

from ..ranks.partial_read import read_views
from ..ranks.stats import (
    UNNAMED_HOST,
    RankTables,
    comm_mask,
    format_ranks,
    rank_tables,
    report_ranks,
    stragglers,
)
from ..ranks.straggler import IDLE_WORDS, Excess, Stragglers, analyse, excess_of
from ._base import (
    Evidence,
    Finding,
    Item,
    covered_ns,
    explained_ns,
    merge_intervals,
    ranked,
    severity_for,
    top_groups,
)
from ._gaps import EXPLAINED
from .collectives import (
    WORDS,
    advice_for,
    collective_kind,
    collective_pass,
    passes_by_time,
    unreliable_names,
)
from .evidence import ITEMS_TOP, unexplained
from .timeline import launch_calls, launch_positions

if TYPE_CHECKING:
    from perfscope.report import Report

EXPOSED_COMM_MIN_PCT = 10.0
"""Exposed collective time (no compute beside it) worth a finding, as a share of the ranks' mean
active span: the same tenth as the idle rule, below which the overlap there is to win is small."""

METRIC_WORDS = {"step_mean_ns": "mean step time", "compute_per_step_ns": "compute time per step"}

IMBALANCE_WAIT = ("Every other rank waits for it at each collective, so its excess is lost on all ranks.")
EXPOSED_LEAD = ("Issue them early (async_op=True, or on a side stream) and wait as late as possible, so that "
                "compute runs beside them; by what they exchanged and in which pass: ")
"""The exposed-comm advice's lead; a clause per collective kind and pass follows (:mod:`.collectives`)."""
EXPOSED_TOP = 3
"""The exposed-comm advice names this many (kind, pass) groups, largest exposed time first."""
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
    groups = sorted((i for i in items if i.time_ns > 0), key=lambda i: -i.time_ns)
    total = sum(i.time_ns for i in groups)
    said: dict[str, list[str]] = {}  # one clause per advice, naming every group it covers
    for i in groups[:EXPOSED_TOP]:
        said.setdefault(advice_for(str(i.attrs["kind"]), str(i.attrs["pass"])), []).append(
            f"{100 * i.time_ns / total:.0f}% {i.attrs['collective']}")
    clauses = [f"{' and '.join(who)}: {text}" for text, who in said.items()] if total > 0 else []
    rest = sum(i.time_ns for i in groups[EXPOSED_TOP:])
    if rest > 0:
        clauses.append(f"{100 * rest / total:.0f}% in {len(groups) - EXPOSED_TOP} other kind(s) and pass(es) (the items)")
    advice = EXPOSED_LEAD + "; ".join(clauses) + "." if clauses else EXPOSED_LEAD.split(";")[0] + "."
    evidence["exposed_kinds"] = "; ".join(f"{i.attrs['kind']}/{i.attrs['pass']}" for i in groups[:EXPOSED_TOP])
    if n > 1 or len(report_ranks(report)) > 1:
        advice += " " + EXPOSED_WAIT
    return [ranked(report, "exposed-comm", title, evidence, advice, float(exposed.mean()),
                   kernels=_comm_kernel_names(report), items=items)]


def _exposed_items(report: Report, n_ranks: int) -> tuple[Item, ...]:
    """The collective kernels' time with no compute beside it on their device, per collective kind and pass
    (:func:`.collectives.collective_kind`, :func:`.collectives.collective_pass`: what the ``nccl:`` ranges, c10d
    operators and kernel names say), averaged over the ranks (as the finding's stake is)."""
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

    def col(c: str) -> list[object]:
        return k[c].iloc[rows].astype(object).tolist() if c in k else [None] * len(rows)

    names, ops, paths = col("name"), col("op"), col("range")
    memo: dict[tuple[object, object, object], tuple[tuple[str, str], str]] = {}
    keys = [memo.setdefault((n, o, p), (collective_kind(n, o, p), collective_pass(o, p)))
            for n, o, p in zip(names, ops, paths)]
    doubtful = unreliable_names([kk for kk, _ in keys], names)  # names this trace shows running other collectives
    kinds = ["unknown" if source == "name" and n in doubtful else kind for ((kind, source), _), n in zip(keys, names)]
    phases = np.array([pp for _, pp in keys], dtype=object)
    by_time = np.zeros(len(rows), bool)
    unknown = phases == "unknown"
    if unknown.any():  # no pass on its own path: the step's pass range around it when it was launched
        timed = passes_by_time(report.ranges, _launched_ns(report, rows)[unknown],
                               rank[rows][unknown] if "rank" in k else None)
        by_time[np.flatnonzero(unknown)] = timed != "unknown"
        phases[unknown] = timed
    per = pd.DataFrame({"kind": kinds, "pass": phases, "by_time": by_time, "name": names,
                        "exposed": exposed / max(n_ranks, 1), "start": starts[rows], "end": ends[rows]})
    items = []
    for (kind, phase, timed_), g in per.groupby(["kind", "pass", "by_time"], sort=False):
        t = float(g["exposed"].sum())
        words = WORDS[str(kind)] + (f" in the {phase} pass" if phase != "unknown" else " (pass not recorded)") + \
            (" (by time: inside its range)" if timed_ else "")
        kernel = clip(str(g["name"].mode().iloc[0]), 60) if g["name"].notna().any() else "collective kernels"
        big = g["exposed"].idxmax()
        items.append(Item("kernels", f"{words}: {duration(t)} in {len(g)} collective(s) ({kernel}), with no compute "
                                     "beside it", t, kind != "unknown", float(g.at[big, "start"]),
                          float(g.at[big, "end"]),
                          attrs={"kind": str(kind), "pass": str(phase), "collective": words, "collectives": len(g),
                                 "name": kernel, "pass_by_time": bool(timed_)}))
    return tuple(sorted(items, key=lambda i: -i.time_ns))


def _launched_ns(report: Report, rows: np.ndarray) -> np.ndarray:
    """When each kernel of ``rows`` was launched: the start of the runtime call of its correlation id (on its rank,
    where the tables carry ranks), else the kernel's own start."""
    k, api = report.kernels, report.api
    out = k["start_ns"].to_numpy(np.float64, na_value=np.nan)[rows]
    if not len(api) or "correlation" not in k or "correlation" not in api:
        return out
    if "rank" in k and "rank" in api:  # correlation ids repeat across ranks: each rank's own calls
        calls = api.dropna(subset=["correlation"]).drop_duplicates(["rank", "correlation"])
        index = pd.MultiIndex.from_frame(calls[["rank", "correlation"]].astype("float64"))
        at = index.get_indexer(pd.MultiIndex.from_frame(k[["rank", "correlation"]].iloc[rows].astype("float64")))
        start = calls["start_ns"].to_numpy(np.float64, na_value=np.nan)
    else:  # the rules' one lookup of launch calls by correlation id
        at = launch_positions(report, k["correlation"].to_numpy(np.float64, na_value=np.nan)[rows])
        start = launch_calls(report)["start_ns"].to_numpy(np.float64, na_value=np.nan)
    ok = at >= 0
    out[ok] = start[at[ok]]
    return out


# ---------------------------------------------------------------------------- straggler
TOP_KERNELS = 5
TOP_STEPS = 3

ADVICE = {
    "kernels": ("Rank {rank}'s kernels take longer than its group's ({top}): check that GPU's clocks, power and "
                "temperature (nvidia-smi -q -d CLOCK,POWER,TEMPERATURE, or rocm-smi) and its links, and whether "
                "it gets more work than its peers (MoE expert load, longer sequences, an uneven split)."),
    "dispatch": ("Rank {rank}'s host takes longer to dispatch operators between launches than its peers': its CPU "
                 "is slower or busier (check core pinning, other processes on its cores, NUMA placement, CPU "
                 "frequency); capturing the step in a CUDA graph removes the dispatch."),
    "cpu compute": ("Rank {rank}'s host computes more between launches than its peers': find that work (sampling, "
                    "tokenisation, scheduling done only on this worker) and move it off the critical path."),
    "waiting": ("Rank {rank}'s host waits more (sleeps, locks, I/O) between launches than its peers': find what it "
                "waits for (a queue, a lock shared with another thread, storage or the network)."),
    "host code": ("Rank {rank}'s host runs more of its own code between launches than its peers' (the ranges "
                  "and Python functions around its gaps name that code): check that rank's CPU (core pinning, other "
                  "processes, garbage collection) and the work only this worker does."),
    UNNAMED_HOST: ("Rank {rank}'s host runs more of its own code between launches than its peers', code nothing in "
                   "the trace names: profile that rank with with_stack (or NVTX ranges) to name it, and check its "
                   "CPU (core pinning, other processes, garbage collection)."),
    "graph": "Rank {rank}'s graph replays have longer gaps between their nodes than its peers': check that GPU.",
    "launch": ("Rank {rank} is launch-bound where its peers are not: its host issues kernels slower; capture the "
               "step in a CUDA/HIP graph, or check that rank's CPU for contention."),
    "sync": ("Rank {rank}'s host synchronises with its device more: remove host reads of device values "
             "(.item(), .cpu(), printing tensors) from that rank's step."),
    "copy": "Rank {rank} waits for host-device copies its peers do not make: pin the host buffers and overlap them.",
    "profiler": "Part of rank {rank}'s delay is the profiler's own work: trace fewer events on that rank.",
    "untraced": ("Rank {rank}'s trace lacks launch calls around its longer gaps (API records thinned, filtered or "
                 "lost): record that rank's full API trace to see what its host did."),
    "unrecorded": ("Rank {rank}'s trace lacks dispatches over its longer gaps (a kernel filter, sampling or lost "
                   "records): its device likely ran kernels there; re-profile that rank without the filter."),
    "unknown": ("Neither rank {rank}'s kernels nor its device idle time explain its lateness: compare its host "
                "side and its node (network, CPU, clocks) with a peer's."),
}


def straggler_items(row: Any, t: RankTables, s: Stragglers, stake_ns: float) -> tuple[list[Item], Excess, list[int]]:
    """The evidence items of one straggler (a row of :attr:`Stragglers.flagged`)."""
    rank = int(row["rank"])
    gkey = str(row["gkey"])
    members = s.ranks.loc[s.ranks["gkey"] == gkey, "rank"].astype(int).tolist()
    peers = [r for r in members if r != rank]
    ex = excess_of(rank, peers, t)
    n_peers = len(peers)
    items: list[Item] = [Item("rank", f"rank {rank} arrives last at {100 * float(row['last_share']):.0f}% of the "
                          f"{int(row['instances'])} collectives of its group ({gkey}); ranks {format_ranks(peers)} wait "
                          f"{duration(float(row['wait_per_other_ns']))} each in them",
                  stake_ns, explains=False,
                  attrs={"rank": rank, "group": gkey, "last_share_pct": 100 * float(row["last_share"]),
                         "waiting_ranks": format_ranks(peers), "caused_wait_ns": float(row["caused_wait_ns"])})]
    shown = ex.kernels.head(TOP_KERNELS)
    for k in shown.itertuples(index=False):
        items.append(Item("kernel", f"{k.kernel}: {duration(float(k.rank_ns))} on rank {rank}, "
                                    f"{duration(float(k.peers_ns))} on the median of its group",
                          float(k.excess_ns), explains=True,
                          attrs={"rank": rank, "kernel": str(k.kernel), "rank_ns": float(k.rank_ns),
                                 "peers_median_ns": float(k.peers_ns)}))
    rest = ex.kernels.iloc[TOP_KERNELS:]
    if len(rest):
        items.append(Item("kernels", f"{len(rest)} more kernels slower on rank {rank}",
                          float(rest["excess_ns"].sum()), explains=True, attrs={"rank": rank, "count": len(rest)}))
    for c in ex.idle.itertuples(index=False):
        kind = str(c.kind)
        words = IDLE_WORDS.get(kind, "for a reason the trace does not record")
        items.append(Item("gaps", f"{duration(float(c.excess_ns))} more device idle time {words} than the "
                                  f"median of its group ({kind})",
                          float(c.excess_ns), explains=kind in EXPLAINED or kind == "host code",  # named host code explains
                          attrs={"rank": rank, "kind": kind, "rank_ns": float(c.rank_ns),
                                 "peers_median_ns": float(c.peers_ns)}))
    caused = s.steps[(s.steps["rank"] == rank)] if len(s.steps) else s.steps
    windows = t.steps[t.steps["rank"] == rank].set_index("step") if len(t.steps) else pd.DataFrame()
    for st in caused.sort_values("caused_ns", ascending=False, kind="stable").head(TOP_STEPS).itertuples(index=False):
        step = int(st.step)
        w = windows.loc[step] if step in windows.index else None
        items.append(Item("step", f"step {step}: the others wait {duration(float(st.caused_ns) / max(n_peers, 1))} "
                                  f"each for rank {rank}",
                          float(st.caused_ns) / max(n_peers, 1), explains=False,
                          start_ns=float(w["start_ns"]) if w is not None else math.nan,
                          end_ns=float(w["end_ns"]) if w is not None else math.nan,
                          attrs={"rank": rank, "step": step}))
    return items, ex, peers


def straggler_finding(t: RankTables, s: Stragglers) -> Finding | None:
    """The ``straggler`` finding of a job (None when it has no straggler): the rank the others wait
    for most, the wait, its evidence; the other stragglers named."""
    f = s.flagged
    if not len(f):
        return None
    row = f.iloc[0]
    rank, gkey = int(row["rank"]), str(row["gkey"])
    stake = float(row["wait_per_other_ns"])
    items, ex, peers = straggler_items(row, t, s, stake)
    for other in f.iloc[1:].itertuples(index=False):
        items.append(_other_straggler(other))
    items = sorted(items, key=lambda i: -i.time_ns if math.isfinite(i.time_ns) else math.inf)
    explained = explained_ns(tuple(items), stake)
    group = s.groups.set_index("gkey").loc[gkey]
    kind = f" {group['kind']}" if isinstance(group["kind"], str) else ""
    role = f", {group['role']}" if isinstance(group["role"], str) else ""
    others = f.iloc[1:]
    title = (f"Rank {rank} is the straggler of its{kind} group ({gkey}{role}): the other {len(peers)} ranks wait "
             f"{duration(stake)} each in their collectives for it ({float(row['wait_pct']):.1f}% of their time)"
             + (f"; {counted(len(others), 'more straggler')} in other groups "
                f"(ranks {format_ranks(others['rank'])})" if len(others) else ""))
    evidence: Evidence = {
        "rank": rank, "group": gkey, "group_kind": str(group["kind"] or ""), "role": str(group["role"] or ""),
        "waiting_ranks": format_ranks(peers), "wait_per_rank_ns": stake,
        "wait_pct": float(row["wait_pct"]), "gpu_time_waited_ns": float(row["caused_wait_ns"]),
        "last_share_pct": 100 * float(row["last_share"]), "collectives": int(row["instances"]),
        "excess_compute_ns": ex.compute_ns, "excess_idle_ns": float(ex.idle["excess_ns"].sum()) if len(ex.idle) else 0.0,
        "stragglers": format_ranks(f["rank"]), "groups": len(s.groups),
        "ranks_covered": format_ranks(s.ranks["rank"].unique()),
    }
    if isinstance(group["missing"], str) and group["missing"]:
        evidence["group_missing_ranks"] = group["missing"]
    advice = _advice(rank, ex)
    severity = severity_for(stake, float(group["reference_ns"]))
    return Finding("straggler", severity, title, evidence, advice, stake,
                   tuple(str(k) for k in ex.kernels["kernel"].head(3)), (), tuple(items), explained, "trace")


def _other_straggler(row: Any) -> Item:
    return Item("rank", f"rank {int(row.rank)} is the straggler of its group ({row.gkey}): the others wait "
                        f"{duration(float(row.wait_per_other_ns))} each", float(row.wait_per_other_ns), explains=False,
                attrs={"rank": int(row.rank), "group": str(row.gkey), "last_share_pct": 100 * float(row.last_share)})


def _advice(rank: int, ex: Excess) -> str:
    """Advice picked from the evidence: the kernels when they hold most of the excess, each idle cause
    that holds a tenth of it or more; 'cannot see why' when nothing known explains it."""
    parts: list[tuple[float, str]] = []
    kernel_ns = float(ex.kernels["excess_ns"].sum()) if len(ex.kernels) else 0.0
    total = kernel_ns + (float(ex.idle["excess_ns"].sum()) if len(ex.idle) else 0.0)
    if total <= 0:
        return ADVICE["unknown"].format(rank=rank)
    if kernel_ns >= 0.1 * total:
        top = ", ".join(f"{clip(str(k.kernel), 48)} +{100 * k.excess_ns / k.peers_ns:.0f}%" if k.peers_ns > 0
                        else clip(str(k.kernel), 48)
                        for k in ex.kernels.head(2).itertuples(index=False))
        parts.append((kernel_ns, ADVICE["kernels"].format(rank=rank, top=top)))
    for c in ex.idle.itertuples(index=False):
        if float(c.excess_ns) >= 0.1 * total and str(c.kind) in ADVICE:
            parts.append((float(c.excess_ns), ADVICE[str(c.kind)].format(rank=rank)))
    known = sum(ns for ns, _ in parts)
    if known < 0.5 * total:
        parts.append((0.0, ADVICE["unknown"].format(rank=rank)))
    return " ".join(text for _, text in sorted(parts, key=lambda p: -p[0]))



def job_views(report: Report) -> tuple[RankTables, Stragglers] | None:
    """The report's per-rank tables and straggler analysis: those ``perfscope import --ranks`` stored
    beside the tables (computed on the cluster), else computed here; None when no rank view applies
    (no kernels; or one rank without collectives)."""
    if not len(report.kernels):
        return None
    stored = read_views(report.path) if report.path is not None else None
    if stored is not None:
        return stored
    if len(report_ranks(report)) < 2 and not comm_mask(report.kernels).any():
        return None  # one rank and no collectives: no rank finding can apply (skip the per-rank tables)
    t = rank_tables(report)
    return t, analyse(t)


def rank_findings(report: Report) -> list[Finding]:
    """``straggler`` (the rank its group waits for, from the collectives matched across ranks),
    ``rank-imbalance`` (outliers of step or compute time per step) and ``exposed-comm``
    (collectives not hidden by compute)."""
    views = job_views(report)
    if views is None:
        return []
    t, s = views
    if not len(t.per_rank) or pd.isna(t.per_rank["span_ns"]).all() or not math.isfinite(
            float(t.per_rank["span_ns"].astype("float64").max())):
        return []
    found = straggler_finding(t, s)
    named = set(s.flagged["rank"].astype(int).tolist()) if found is not None else set()
    imbalance = [f for f in _imbalance(report, t) if int(f.evidence["rank"]) not in named]  # said better above
    return ([found] if found is not None else []) + imbalance + _exposed(report, t)


__all__ = ["EXPOSED_COMM_MIN_PCT", "job_views", "rank_findings", "straggler_finding"]
