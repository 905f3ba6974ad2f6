"""The items behind a finding's time at stake, built from the report's own tables (docs/findings.md,
"The evidence rule"): idle gaps from the ``idle`` table, kernels from the kernels table, steps from
the steps table. Each builder groups like rows into a few items, largest first, with the time they
hold, whether their cause is known, where they lie (``spans``: the largest members) and what
identifies them; the rest goes into one item per known/unknown cause, so the items add up to the
rows they were given. Rules choose their advice from these items (:func:`dominant`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import duration

from ..idle import weighted_median
from ._base import ITEM_SPANS, Item, group_key

if TYPE_CHECKING:
    from perfscope.report import Report

ITEMS_TOP = 5
"""Items a builder lists one by one before it folds the rest into one line (time-weighted: the
largest first)."""

CAUSE_WORDS = {
    "launch": "launch calls: the host queues kernels one by one",
    "dispatch": "operator dispatch between launches",
    "sync": "a blocking sync: the host waited for the device, so the queue ran dry",
    "copy": "host<->device copy calls",
    "profiler": "the profiler's own work",
    "graph": "between the nodes of a graph replay",
    "host": "host code with no GPU call",
    "unknown": "no host activity recorded: cause unknown",
}
"""What an idle gap's cause (and host kind, h39a's ``host_kind``) means, in a user's words."""

FIX_OF_CAUSE = {"launch": "launch", "dispatch": "launch", "sync": "sync", "copy": "copy", "profiler": "profiler",
                "graph": "graph", "cpu compute": "host", "host code": "host", "waiting": "host", "host": "host",
                "unknown": "unknown"}
"""The fix each gap cause (or host kind) calls for: ``launch`` (graphs, fusion, compile), ``sync``
(remove or defer the sync), ``copy`` (pinned memory, overlap), ``host`` (move or overlap that host
work), ``graph`` (the graph's own gaps), ``profiler`` (profile less), ``unknown`` (none)."""


def _text(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def gap_cause(cause: object, host_kind: object = None) -> str:
    """The finest known cause of an idle gap: its host kind where the ``idle`` table has one
    (``dispatch``, ``cpu compute``, ``waiting``, ``host code``), else its cause."""
    return _text(host_kind) or _text(cause) or "unknown"


def gap_explained(cause: str, rng: str | None, api: str | None = None) -> bool:
    """Whether the trace says why a gap of ``cause`` is lost: every cause but ``unknown``; plain
    ``host`` time only when a named range (or call) says where the host was."""
    if cause == "unknown":
        return False
    return cause != "host" or bool(rng or api)


def spans_of(start: np.ndarray, end: np.ndarray) -> tuple[tuple[float, float], ...]:
    """The ``(start, end)`` of the largest pieces, at most :data:`ITEM_SPANS`, largest first."""
    if not len(start):
        return ()
    d = end - start
    top = np.argsort(-d, kind="stable")[:ITEM_SPANS]
    return tuple((float(start[i]), float(end[i])) for i in top)


def clip_to(start: np.ndarray, end: np.ndarray, ws: np.ndarray, we: np.ndarray) -> tuple[np.ndarray, ...]:
    """The parts of ``[start, end)`` intervals inside the merged windows ``(ws, we)``: (row of each
    part, its start, its end). An interval across two windows gives two parts."""
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    if not len(start) or not len(ws):
        z = np.zeros(0, np.int64)
        return z, z, z
    lo = np.searchsorted(we, start, side="right")
    hi = np.searchsorted(ws, end, side="left")
    n = np.maximum(hi - lo, 0)
    row = np.repeat(np.arange(len(start)), n)
    first = np.cumsum(n) - n  # each row's first part's position
    win = lo[row] + (np.arange(len(row)) - first[row])  # the windows lo..hi-1 of each row, in order
    s = np.maximum(start[row], ws[win]) if len(row) else np.zeros(0, np.int64)
    e = np.minimum(end[row], we[win]) if len(row) else np.zeros(0, np.int64)
    keep = e > s
    return row[keep], s[keep], e[keep]


def idle_in(idle: pd.DataFrame, ws: np.ndarray, we: np.ndarray, device: str | None = None) -> pd.DataFrame:
    """The rows of the ``idle`` table inside the merged windows ``(ws, we)`` (of one ``device``, or
    every device), each cut to the windows (``duration_ns`` the part inside)."""
    if not len(idle):
        return idle
    rows = idle if device is None else idle[idle["device"] == device]
    i, s, e = clip_to(rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64), ws, we)
    cols = [c for c in ("device", "start_ns", "end_ns", "duration_ns", "cause", "host_kind", "range", "api", "op",
                        "op_shapes", "function", "wait", "gap", "correlation", "bytes", "pinned") if c in rows]
    out = rows[cols].iloc[i].copy()
    out["start_ns"], out["end_ns"], out["duration_ns"] = s, e, e - s
    return out.reset_index(drop=True)


def gap_items(idle: pd.DataFrame, *, where: str = "", top: int = ITEMS_TOP) -> list[Item]:
    """Idle gaps as items: one per (cause, host kind, range), the largest ``top`` by time, then one
    line for the rest of known cause and one for the rest of unknown cause. Each says how much time
    its gaps hold, how many there are and their time-weighted size ("669 ms in 35,641 gaps, half of
    it in gaps of 25 us or more, in attn: ..."), and carries the largest gaps' places."""
    if not len(idle):
        return []
    def text(col: str) -> np.ndarray:
        if col not in idle:
            return np.full(len(idle), "", dtype=object)
        v = idle[col].astype("object")
        return v.where(v.notna() & (v != ""), "").to_numpy(object)

    kind, cause = text("host_kind"), text("cause")
    cause = np.where(kind != "", kind, np.where(cause != "", cause, "unknown"))  # gap_cause, on the whole column
    df = pd.DataFrame({"cause": cause, "range": text("range"), "api": text("api"),
                       "start": idle["start_ns"].to_numpy(np.int64), "end": idle["end_ns"].to_numpy(np.int64),
                       "dur": idle["duration_ns"].to_numpy(np.float64)})
    # a sync's call names the sync; other causes group by range alone (one line per range)
    df["call"] = np.where(df["cause"].isin(["sync", "copy"]), df["api"], "")
    groups = sorted(df.groupby(["cause", "range", "call"], sort=False), key=lambda kv: -float(kv[1]["dur"].sum()))
    items: list[Item] = []
    rest: dict[bool, list[pd.DataFrame]] = {True: [], False: []}
    for (c, r, call), g in groups:
        known = gap_explained(str(c), r or None, call or None)
        if len(items) >= top:
            rest[known].append(g)
            continue
        items.append(_gap_item(g, str(c), r or None, call or None, known, where))
    for known, parts in rest.items():
        if parts:
            g = pd.concat(parts)
            n_groups = len(parts)
            t = float(g["dur"].sum())
            label = (f"{duration(t)} in {len(g):,} more gap(s){where} ({n_groups} other cause/range groups"
                     + ("" if known else ", cause unknown") + ")")
            items.append(Item("gaps", label, t, known, attrs={"count": len(g), "cause": "mixed" if known else "unknown"},
                              spans=spans_of(g["start"].to_numpy(), g["end"].to_numpy())))
    return items


def _gap_item(g: pd.DataFrame, cause: str, rng: str | None, call: str | None, known: bool, where: str) -> Item:
    t, n = float(g["dur"].sum()), len(g)
    size = (f" of {duration(t)}" if n == 1 else
            f", half of it in gaps of {duration(weighted_median(g['dur'].to_numpy()))} or more")
    place = f" in {rng}" if rng else ""
    words = CAUSE_WORDS.get(cause, cause)
    if call:
        words += f" ({call})"
    label = f"{duration(t)} in {n:,} gap{'s' if n != 1 else ''}{size}{where}{place}: {words}"
    attrs: dict[str, float | int | str | None] = {"cause": cause, "fix": FIX_OF_CAUSE.get(cause, "host"),
                                                  "range": rng, "api": call, "count": n,
                                                  "weighted_median_ns": weighted_median(g["dur"].to_numpy())}
    s, e = g["start"].to_numpy(), g["end"].to_numpy()
    if n == 1:
        return Item("gap", label, t, known, float(s[0]), float(e[0]), attrs)
    return Item("gaps", label, t, known, attrs=attrs, spans=spans_of(s, e))


def kernel_items(kernels: pd.DataFrame, rows: np.ndarray, time_ns: np.ndarray, *, explains: np.ndarray | None = None,
                 describe: Callable[[pd.DataFrame], str] | None = None, top: int = ITEMS_TOP,
                 what: str = "kernel") -> list[Item]:
    """Kernels as items, one per kernel group (:func:`group_key`): the rows at positions ``rows`` of
    ``kernels``, each holding ``time_ns`` (its part of the time at stake: its duration, or its time
    above its own floor), the largest ``top`` groups, then one line for the rest. ``explains``
    (per row) says whether the trace gives the row's cause (default: a bound was placed);
    ``describe(group rows)`` adds what is known of a group (its limiter, its % of roof)."""
    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return []
    time_ns = np.nan_to_num(np.asarray(time_ns, np.float64))
    cols = [c for c in ("start_ns", "end_ns", "duration_ns", "dram_bytes", "flops", "bound", "bound_level", "limiter",
                        "category", "pct_of_roof") if c in kernels]
    sub = kernels[cols].iloc[rows]  # the columns items read, not a copy of the whole table
    if explains is None:
        bound = sub["bound"].astype("object") if "bound" in sub else pd.Series(None, index=sub.index, dtype="object")
        explains = bound.isin(["memory", "compute", "latency"]).to_numpy(bool) | \
            bound.astype(str).str.startswith(("memory", "compute")).to_numpy(bool)
    names = group_key(kernels).iloc[rows].to_numpy(object)
    df = pd.DataFrame({"name": names, "t": time_ns, "known": np.asarray(explains, bool),
                       "start": sub["start_ns"].to_numpy(np.int64), "end": sub["end_ns"].to_numpy(np.int64),
                       "pos": np.arange(len(rows))})
    totals = df.groupby("name", sort=False)["t"].sum().sort_values(ascending=False, kind="stable")
    items: list[Item] = []
    for name in totals.index[:top]:
        g = df[df["name"] == name]
        g_rows = sub.iloc[g["pos"].to_numpy()]
        for known in (True, False):
            part = g[g["known"] == known]
            if not len(part) or not float(part["t"].sum()) > 0:
                continue
            t = float(part["t"].sum())
            extra = describe(g_rows.iloc[(g["known"] == known).to_numpy()]) if describe else ""
            label = (f"{name}: {duration(t)} in {len(part):,} {what}{'s' if len(part) != 1 else ''}"
                     + (f", {extra}" if extra else "") + ("" if known else " (no bound measured)"))
            s, e = part["start"].to_numpy(), part["end"].to_numpy()
            attrs: dict[str, float | int | str | None] = {"name": str(name), "count": len(part)}
            for col in ("bound", "bound_level", "limiter", "category"):
                if col in g_rows:
                    vals = g_rows[col].dropna().astype(str)
                    if len(vals):
                        attrs[col] = str(vals.mode().iloc[0])
            if len(part) == 1:
                items.append(Item("kernel", label, t, known, float(s[0]), float(e[0]), attrs))
            else:
                items.append(Item("kernels", label, t, known, attrs=attrs, spans=spans_of(s, e)))
    rest = df[~df["name"].isin(set(totals.index[:top]))]
    for known in (True, False):
        part = rest[rest["known"] == known]
        t = float(part["t"].sum())
        if len(part) and t > 0:
            label = (f"{duration(t)} in {len(part):,} more {what}s of {part['name'].nunique()} other names"
                     + ("" if known else " (no bound measured)"))
            items.append(Item("kernels", label, t, known, attrs={"count": len(part)},
                              spans=spans_of(part["start"].to_numpy(), part["end"].to_numpy())))
    return items


def step_items(steps: pd.DataFrame, time_ns: np.ndarray, *, explains: bool | np.ndarray = True,
               describe: Callable[[Mapping[str, Any]], str] | None = None, top: int = ITEMS_TOP,
               placed: bool = True) -> list[Item]:
    """Steps as items: the ``top`` steps with the most ``time_ns`` (their part of the time at stake),
    each a step on the timeline (unless ``placed`` is false: steps of a run with its own clock, an
    engine report's unprofiled run), then one line for the rest."""
    if not len(steps):
        return []
    t = np.nan_to_num(np.asarray(time_ns, np.float64))
    known = np.broadcast_to(np.asarray(explains, bool), t.shape)
    order = np.argsort(-t, kind="stable")
    recs = steps.to_dict("records")
    items = []
    for i in order[:top]:
        r = recs[int(i)]
        if not t[i] > 0:
            continue
        label = f"step {int(r['step'])} ({r['phase']}"
        if pd.notna(r.get("batch")):
            label += f", batch {int(r['batch'])}"
        label += f"): {duration(float(t[i]))}"
        if describe:
            label += f", {describe(r)}"
        at = (float(r["start_ns"]), float(r["end_ns"])) if placed else (math.nan, math.nan)
        items.append(Item("step", label, float(t[i]), bool(known[i]), *at,
                          {"step": int(r["step"]), "phase": str(r["phase"])}))
    rest = order[top:]
    for flag in (True, False):
        sel = [i for i in rest if bool(known[i]) == flag and t[i] > 0]
        if sel:
            tot = float(t[sel].sum())
            spans = spans_of(steps["start_ns"].to_numpy(np.int64)[sel], steps["end_ns"].to_numpy(np.int64)[sel]) \
                if placed else ()
            items.append(Item("step", f"{len(sel):,} more steps: {duration(tot)}", tot, flag,
                              attrs={"count": len(sel)}, spans=spans))
    return items


def unexplained(time_ns: float, label: str, **attrs: float | str | None) -> list[Item]:
    """The time at stake no item accounts for, as one item of unknown cause (none when there is none)."""
    if not (math.isfinite(time_ns) and time_ns > 0):
        return []
    return [Item("metric", label, float(time_ns), False, attrs=attrs)]


def on_stake_clock(items: list[Item], stake_ns: float, measured_stake_ns: float) -> list[Item]:
    """Items measured on one run (the profiled run: its kernels and idle gaps are the only ones
    recorded) put on the clock of a time at stake measured on another (the headline run's steps):
    each timed item keeps its share of the measured run's stake (``attrs['measured_ns']`` keeps its
    own time). The items unchanged when both stakes are one."""
    if not (math.isfinite(stake_ns) and math.isfinite(measured_stake_ns) and measured_stake_ns > 0) or \
            math.isclose(stake_ns, measured_stake_ns, rel_tol=1e-9):
        return items
    scale = stake_ns / measured_stake_ns
    return [dataclasses.replace(i, time_ns=i.time_ns * scale, attrs={**i.attrs, "measured_ns": i.time_ns})
            if math.isfinite(i.time_ns) else i for i in items]


def dominant(items: Iterable[Item], key: str = "fix", kinds: tuple[str, ...] = ("gap", "gaps")) -> str | None:
    """The value of ``attrs[key]`` that holds the most time among ``items`` of ``kinds`` (the advice a
    finding gives follows it); None when no such item has a time."""
    totals: dict[str, float] = {}
    for i in items:
        v = i.attrs.get(key)
        if i.kind in kinds and isinstance(v, str) and math.isfinite(i.time_ns):
            totals[v] = totals.get(v, 0.0) + i.time_ns
    return max(totals, key=lambda k: totals[k]) if totals else None


def time_of(items: Iterable[Item], key: str, value: str) -> float:
    """The time the items whose ``attrs[key]`` is ``value`` hold."""
    return float(sum(i.time_ns for i in items if i.attrs.get(key) == value and math.isfinite(i.time_ns)))


def largest(items: Iterable[Item], key: str, value: str) -> Item | None:
    """The item with the most time among those whose ``attrs[key]`` is ``value``."""
    hits = [i for i in items if i.attrs.get(key) == value and math.isfinite(i.time_ns)]
    return max(hits, key=lambda i: i.time_ns) if hits else None


def time_in(items: Iterable[Item], kinds: tuple[str, ...]) -> float:
    """The time the items of ``kinds`` hold (explained or not)."""
    return float(sum(i.time_ns for i in items if i.kind in kinds and math.isfinite(i.time_ns)))


def largest_kernel(items: Iterable[Item]) -> str | None:
    """The label of the kernel item holding the most time (None: no kernel item)."""
    ks = [i for i in items if i.kind in ("kernel", "kernels") and i.explains and math.isfinite(i.time_ns)
          and i.attrs.get("name")]
    return max(ks, key=lambda i: i.time_ns).label if ks else None


def gap_advice(fix: str | None, items: Iterable[Item], what: str) -> str:
    """The advice for the gaps of ``what`` (a decode step, the run) that the largest gaps' fix calls
    for, naming the range, call and time of its largest item: never CUDA graphs (a caller gives those
    for ``launch`` only, the one fix they help)."""
    items = list(items)
    top = largest(items, "fix", fix or "")
    total = time_of(items, "fix", fix or "")
    t = duration(total)
    where = ""
    if top is not None and top.attrs.get("range"):
        where = (f" in {top.attrs['range']}" if top.time_ns >= 0.9 * total else
                 f" (the most, {duration(top.time_ns)}, in {top.attrs['range']})")
    call = f" ({top.attrs['api']})" if top is not None and top.attrs.get("api") else ""
    if fix == "sync":
        return (f"The device waits on blocking syncs{call}{where} ({t} of idle): the host blocks until the device "
                f"runs dry, so it cannot queue the next work ahead. Remove the sync from the {what} or defer it: "
                "keep the value on the device (no .item()/.cpu() per step), read it a step later, or copy it "
                "with non_blocking=True and wait on an event.")
    if fix == "copy":
        return (f"Host<->device copies{where} hold the device idle ({t}): copy from pinned memory "
                "(pin_memory=True) with non_blocking=True, and overlap the copies with compute on another stream.")
    if fix == "host":
        return (f"The host runs its own code with no GPU call for {t} of the gaps{where}: move or overlap this "
                f"host work: do it before or after the {what}, on another thread, or on the device.")
    if fix == "profiler":
        return (f"The profiler's own work{where} holds the device idle ({t}): this time is not in an unprofiled "
                "run; profile fewer steps, or without with_stack/record_shapes, to see the run's own gaps.")
    if fix == "graph":
        return (f"The idle is between the nodes of a graph replay ({t}): the graph's kernels are too short for "
                "the device's per-node cost; fuse them (torch.compile) so the graph has fewer, longer nodes.")
    return (f"The trace records no host activity during these gaps ({t}): profile with the host side (the "
            "CUDA/HIP API calls and CPU operators) to see what the host did.")


def idle_within(report: Report, ws: np.ndarray, we: np.ndarray) -> pd.DataFrame:
    """The ``idle`` rows inside the windows, on the device that ran the most kernel time (the
    device the steps' kernels run on; a CPU report's operators are on ``cpu``)."""
    from ..idle import idle_of

    idle = idle_of(report)
    if not len(idle):
        return idle
    k = report.kernels
    device = str(k.groupby(k["device"].astype("object"))["duration_ns"].sum().idxmax()) if len(k) else None
    return idle_in(idle, ws, we, device if device in set(idle["device"].astype(str)) else None)


__all__ = ["CAUSE_WORDS", "FIX_OF_CAUSE", "ITEMS_TOP", "clip_to", "dominant", "gap_advice", "gap_cause",
           "gap_explained", "gap_items", "idle_in", "idle_within", "kernel_items", "largest", "largest_kernel",
           "on_stake_clock", "spans_of", "step_items", "time_in", "time_of", "unexplained", "weighted_median"]
