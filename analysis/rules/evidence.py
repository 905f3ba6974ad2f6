"""The items behind a finding's time at stake, built from the report's own tables (docs/findings.md,
"The evidence rule"): kernels from the kernels table, steps from the steps table, and the ``idle``
table cut to a finding's windows (:func:`idle_within`; its gaps become items, and advice, in
:mod:`._gaps`). Each builder groups like rows into a few items, largest first, with the time they
hold, whether their cause is known, where they lie (``spans``: the largest members) and what
identifies them; the rest goes into one item per known/unknown cause, so the items add up to the
rows they were given. Rules choose their advice from these items.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import counted, duration
from perfscope.schema import rows_where

from ._base import ITEM_SPANS, Item, group_key

if TYPE_CHECKING:
    from perfscope.report import Report

ITEMS_TOP = 5
"""Items a builder lists one by one before it folds the rest into one line (time-weighted: the
largest first)."""


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
    rows = idle if device is None else rows_where(idle, "device", device)
    i, s, e = clip_to(rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64), ws, we)
    cols = [c for c in ("device", "start_ns", "end_ns", "duration_ns", "cause", "host_kind", "range", "api", "op",
                        "op_shapes", "function", "wait", "gap", "correlation", "bytes", "pinned") if c in rows]
    out = rows[cols].iloc[i].copy()
    out["start_ns"], out["end_ns"], out["duration_ns"] = s, e, e - s
    return out.reset_index(drop=True)


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
            label = (f"{name}: {duration(t)} in {counted(len(part), what)}"
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


__all__ = ["ITEMS_TOP", "clip_to", "idle_in", "idle_within", "kernel_items", "largest", "largest_kernel",
           "on_stake_clock", "spans_of", "step_items", "time_in", "unexplained"]
