"""Host-device copy rules: copies that no kernel overlaps, and copies from pageable host memory.

Only copies across the host link count (``HtoD``, ``DtoH``); device-side copies and memsets are
kernels' business. A copy is "exposed" for the part of it during which no kernel runs on its device.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import duration, nbytes
from perfscope.memo import memo
from perfscope.schema import column_codes

from ..intervals import inside
from ._base import (
    HOST_COPY_KINDS,
    Finding,
    Item,
    covered_ns,
    merge_intervals,
    pct,
    ranked,
)
from .evidence import spans_of
from .timeline import launch_calls, launch_positions

if TYPE_CHECKING:
    from collections.abc import Callable

    from perfscope.report import Report

EXPOSED_MIN_PCT = 2.0
"""Exposed copy time, as a share of the device's busy time (kernels and copies), that makes a
finding: below 2% hiding the copies would not be noticed."""
PAGEABLE_MIN_PCT = 1.0
"""Pageable copy time, as a share of busy time, that makes a finding. Pageable copies are staged
through a pinned bounce buffer and block the CPU (``nsys analyze`` rule ``cuda_memcpy_async``), so
even a small share is worth the one-line fix."""


def host_copies(report: Report) -> pd.DataFrame:
    """The HtoD / DtoH copies, each with the ns of it that no kernel on its device overlaps
    (computed once per Report object: two rules read it)."""
    return memo(report, "rules:host_copies", lambda: _host_copies(report)).copy()


def _host_copies(report: Report) -> pd.DataFrame:
    t = report.transfers
    t = t[t["kind"].isin(HOST_COPY_KINDS)].copy()
    if not len(t):
        return t.assign(exposed_ns=pd.Series(dtype="float64"))
    codes, devices = column_codes(report.kernels, "device")  # per device on positions: no 1M-row compares
    if len(devices) == 1:
        t["device"] = t["device"].where(t["device"].notna(), devices[0])
    t["exposed_ns"] = t["duration_ns"].astype("float64")
    starts, ends = report.kernels["start_ns"].to_numpy(np.int64), report.kernels["end_ns"].to_numpy(np.int64)
    code_of = {d: i for i, d in enumerate(devices)}
    for device, idx in t.groupby(t["device"].astype("object"), sort=False).groups.items():
        on_device = np.flatnonzero(codes == code_of.get(device, -2))
        merged = merge_intervals(starts[on_device], ends[on_device])
        rows = t.loc[idx]
        cover = covered_ns(merged, rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy())
        t.loc[idx, "exposed_ns"] = rows["duration_ns"].to_numpy(np.float64, na_value=np.nan) - cover
    return t


def _busy_ns(report: Report) -> float:
    starts = np.concatenate([report.kernels["start_ns"].to_numpy(np.int64), report.transfers["start_ns"].to_numpy(np.int64)])
    ends = np.concatenate([report.kernels["end_ns"].to_numpy(np.int64), report.transfers["end_ns"].to_numpy(np.int64)])
    ms, me = merge_intervals(starts, ends)
    return float((me - ms).sum())


def _kernel_streams(report: Report) -> set[int]:
    s = report.kernels["stream"].dropna()
    return {int(v) for v in s.unique()}


def _gb_per_s(rows: pd.DataFrame) -> float:
    """Bytes per ns over the copies whose bytes the trace records (NaN where none does)."""
    sized = rows[rows["bytes"].notna()]
    ns = float(sized["duration_ns"].sum())
    return float(sized["bytes"].sum()) / ns if ns > 0 else math.nan


def _size(moved: float) -> str:
    """A copy size in words: its bytes, or that the trace does not record them."""
    return "a size the trace does not record" if math.isnan(moved) else nbytes(moved)


def _moved(rows: pd.DataFrame) -> float:
    """The bytes of ``rows``, NaN where no copy of them records its bytes (never 0)."""
    return float(rows["bytes"].astype("float64").sum(min_count=1))


def _unified(rows: pd.DataFrame) -> int:
    if "copy_kind" not in rows:
        return 0
    return int(rows["copy_kind"].astype("object").fillna("").str.contains("Unified", case=False).sum())


def copies_exposed(report: Report) -> list[Finding]:
    """Host-device copies during which no kernel runs (the GPU waits for the link)."""
    t = host_copies(report)
    if not len(t):
        return []
    exposed = float(t["exposed_ns"].sum())
    busy = _busy_ns(report)
    if not pct(exposed, busy) >= EXPOSED_MIN_PCT:
        return []
    on_compute = t["stream"].isin(list(_kernel_streams(report)))
    evidence: dict[str, float | int | str] = {
        "copies": len(t), "bytes": _moved(t), "copy_time_ns": float(t["duration_ns"].sum()),
        "exposed_ns": exposed, "exposed_pct_of_copy_time": pct(exposed, float(t["duration_ns"].sum())),
        "exposed_pct_of_busy_time": pct(exposed, busy),
        "median_copy_bytes": float(t["bytes"].astype("float64").median()),
        "copies_on_kernel_streams": int(on_compute.sum()),
        "pageable_copies": int((t["pinned"] == False).sum()),
        "unified_memory_copies": _unified(t),
    }
    by_kind = t.groupby("kind")["exposed_ns"].sum()
    for kind, ns in by_kind.items():
        evidence[f"exposed_{kind}_ns"] = float(ns)
    title = (f"{duration(exposed)} of host-device copies run with no kernel beside them "
             f"({len(t)} copies, {_size(float(evidence['bytes']))}, {float(evidence['exposed_pct_of_busy_time']):.3g}% of GPU busy time)")
    pin = t["pinned"].astype("object").map(lambda p: "pinned" if p is True else "pageable" if p is False else "unknown")
    groups = t.assign(memory=pin.to_numpy(), on_kernel_stream=on_compute.to_numpy())
    items = copy_items(groups, ["kind", "memory", "on_kernel_stream"], "exposed_ns",
                       lambda k, n, b: (f"{n} {k[0]} copies of {_size(b)} from {k[1]} host memory"
                                        + (", on a stream that runs kernels" if k[2] else "")
                                        + ": no kernel beside them"))
    return [ranked(report, "copies-exposed", title, evidence, _copy_advice(evidence), exposed, items=items)]


def copy_items(t: pd.DataFrame, keys: list[str], time_col: str, label: Callable[[tuple, int, float], str]) -> tuple[Item, ...]:
    """One item per group of copies (``keys``), with the time ``time_col`` sums to, largest first; each
    placed at its largest copy."""
    items = []
    for key, g in t.groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        total = float(g[time_col].sum())
        if not total > 0:
            continue
        big = g[time_col].astype("float64").idxmax()
        moved = _moved(g)
        items.append(Item("copy" if len(g) == 1 else "copies", f"{duration(total)}: " + label(key, len(g), moved),
                          total, True, float(g.at[big, "start_ns"]), float(g.at[big, "end_ns"]),
                          {**{k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in zip(keys, key)},
                           "copies": len(g), "bytes": moved},
                          spans=spans_of(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
                          if len(g) > 1 else ()))
    return tuple(sorted(items, key=lambda i: -i.time_ns))


def _copy_advice(ev: dict[str, float | int | str]) -> str:
    """What to do about exposed copies, from what they are: unified-memory migrations (prefetch), uploads (copy
    the next batch ahead), downloads (into pinned memory, read late), each with its share of the exposed time;
    then what keeps them from overlapping: a stream that runs kernels, pageable memory, small sizes."""
    exposed = float(ev["exposed_ns"])
    copies, unified = int(ev["copies"]), int(ev["unified_memory_copies"])
    tips = []
    if unified:
        tips.append(f"{unified} of the {copies} copies are unified-memory migrations (pages moved when a kernel or "
                    "the host touches them): prefetch the pages before the kernel (cudaMemPrefetchAsync) or use "
                    "explicit device buffers.")
    if unified < 0.5 * copies:
        said = {"HtoD": "uploads: copy the next input while the current step runs, from pinned memory with "
                        "non_blocking=True on a side stream (torch.cuda.Stream), with an event where it is used.",
                "DtoH": "downloads (results the host reads): copy them with non_blocking=True into pinned memory "
                        "and wait on an event only where they are read, or read them a step later."}
        share = {k: float(ev.get(f"exposed_{k}_ns", 0.0)) / exposed if exposed > 0 else 0.0 for k in said}
        for i, k in enumerate(sorted((k for k in said if share[k] >= COPY_SHARE), key=lambda k: -share[k])):
            tips.append(f"{share[k]:.0%} {'of the exposed time ' if not i else ''}is {said[k]}")
    n = int(ev["copies_on_kernel_streams"])
    if n:
        tips.append(f"{n} of the {copies} {'copy' if copies == 1 else 'copies'} {'runs' if n == 1 else 'run'} on a "
                    "stream that also runs kernels, so they wait for its kernels and its kernels for them, whatever "
                    "the memory type: issue them on a side stream.")
    if int(ev["pageable_copies"]):
        tips.append(f"{ev['pageable_copies']} are from or to pageable memory, which a copy cannot overlap from: pin "
                    "those buffers first (the pageable-copies finding measures them).")
    median = float(ev["median_copy_bytes"])
    if median < 64 * 1024 and unified < 0.5 * copies:  # migrations move pages, not the program's transfers
        tips.append(f"The median copy moves {nbytes(median)}, where a copy's fixed cost (a few µs) outweighs its "
                    "bytes: batch them into fewer, larger transfers.")
    return " ".join(tips) or ("Overlap the copies with compute: issue them on a side stream from pinned memory with "
                              "non_blocking=True, with an event where the data is used.")


COPY_SHARE = 0.1
"""The least share of the exposed copy time uploads or downloads need for their own advice."""


def pageable_copies(report: Report) -> list[Finding]:
    """Host-device copies from or to pageable (not pinned) host memory."""
    t = host_copies(report)
    pageable = t[t["pinned"] == False]
    if not len(pageable):
        return []
    ns = float(pageable["duration_ns"].sum())
    busy = _busy_ns(report)
    if not pct(ns, busy) >= PAGEABLE_MIN_PCT:
        return []
    pinned = t[t["pinned"] == True]
    evidence: dict[str, float | int | str] = {
        "pageable_copies": len(pageable), "pageable_bytes": _moved(pageable),
        "pageable_time_ns": ns, "pageable_pct_of_busy_time": pct(ns, busy),
        "pageable_bytes_per_s": _gb_per_s(pageable) * 1e9,
        "pinned_copies": len(pinned),
    }
    if len(pinned):
        evidence["pinned_bytes_per_s"] = _gb_per_s(pinned) * 1e9
    rate = f"{nbytes(float(evidence['pageable_bytes_per_s']))}/s"
    title = f"{len(pageable)} copies use pageable host memory: {duration(ns)} at {rate}"
    family = pageable["range"].astype("object").map(
        lambda r: re.sub(r"\d+", "N", str(r).rsplit("/", 1)[-1]) if isinstance(r, str) and r else "(no range)")
    stepped = _in_steps(report, pageable)
    items = copy_items(pageable.assign(where=family.to_numpy(), in_steps=stepped), ["kind", "where", "in_steps"],
                       "duration_ns", lambda k, n, b: f"{n} pageable {k[0]} copies of {_size(b)} in {k[1]}"
                       + {"yes": "", "no": ", outside the steps", "unknown": ""}[str(k[2])])
    evidence["pageable_outside_steps_ns"] = float(pageable["duration_ns"][stepped == "no"].sum())
    advice = " ".join([*_pageable_advice(items, ns), _pageable_seen(report, pageable, evidence)])
    return [ranked(report, "pageable-copies", title, evidence, advice, ns, items=items)]


PAGEABLE_SHARE = 0.1
"""A kind of pageable copy (upload or download, in or outside the steps) gets its own advice at this share of the
pageable copy time."""


def _in_steps(report: Report, t: pd.DataFrame) -> np.ndarray:
    """Per copy: ``yes`` where it starts inside a step of the report, ``no`` outside every step, ``unknown`` where the
    report has no steps."""
    steps = report.steps
    if not len(steps) or "start_ns" not in steps or "end_ns" not in steps:
        return np.full(len(t), "unknown", dtype=object)
    ok = steps["start_ns"].notna() & steps["end_ns"].notna()
    spans = merge_intervals(steps.loc[ok, "start_ns"].to_numpy(np.int64), steps.loc[ok, "end_ns"].to_numpy(np.int64))
    held = inside(spans, t["start_ns"].to_numpy(np.int64))
    return np.where(held, "yes", "no").astype(object)


def _pageable_seen(report: Report, pageable: pd.DataFrame, evidence: dict[str, float | int | str]) -> str:
    """What the trace shows the pageable copies cost: how much of their time kernels ran beside them, how much of
    it the CPU sat inside their calls (a pageable copy holds its call while it stages the data), and their rate
    against the pinned copies' in the same trace; what it does not record is said to be unknown."""
    total = float(pageable["duration_ns"].sum())
    overlapped = total - float(pageable["exposed_ns"].sum())
    evidence["pageable_overlapped_ns"] = overlapped
    said = [f"In this trace kernels ran beside them for {pct(overlapped, total):.0f}% of their {duration(total)}"]
    row = launch_positions(report, pageable["correlation"].to_numpy(np.float64, na_value=np.nan))
    seen = row >= 0  # the runtime call of each copy, by correlation id (every call that has one, not only launches)
    if seen.any():
        calls = launch_calls(report)
        firsts = calls["start_ns"].to_numpy(np.int64)[row[seen]]  # int64 ns: float64 rounds epoch times by 256 ns
        lasts = calls["end_ns"].to_numpy(np.int64)[row[seen]]
        start, end = pageable["start_ns"].to_numpy(np.int64)[seen], pageable["end_ns"].to_numpy(np.int64)[seen]
        held = int(np.clip(np.minimum(lasts, end) - np.maximum(firsts, start), 0, None).sum())
        seen_ns = float((end - start).sum())
        evidence.update({"pageable_calls_seen": int(seen.sum()), "pageable_time_in_call_ns": float(held)})
        said.append(f"the CPU sat inside the copy calls for {pct(float(held), seen_ns):.0f}% of the copy time"
                    + (f" ({int(seen.sum())} of {len(pageable)} calls recorded)" if seen.sum() < len(pageable) else ""))
    else:
        said.append("the trace records none of their calls, so whether the CPU waited on them is unknown")
    text = ", and ".join(said)
    if "pinned_bytes_per_s" in evidence:
        text += (f"; its pinned copies moved {nbytes(float(evidence['pinned_bytes_per_s']))}/s against these "
                 f"{nbytes(float(evidence['pageable_bytes_per_s']))}/s")
    return text + "."


def _pageable_advice(items: tuple[Item, ...], total_ns: float) -> list[str]:
    """What to pin, from what the pageable copies are: uploads, downloads, and copies outside the steps (set-up)."""
    share: dict[str, float] = {}
    where: dict[str, list[str]] = {}
    for i in items:
        what = "setup" if i.attrs.get("in_steps") == "no" else "up" if i.attrs.get("kind") == "HtoD" else "down"
        share[what] = share.get(what, 0.0) + i.time_ns / total_ns
        name = str(i.attrs.get("where"))
        if name != "(no range)" and name not in where.setdefault(what, []):
            where[what].append(name)
    out = []
    for what in sorted(share, key=lambda w: -share[w]):
        if share[what] < PAGEABLE_SHARE:
            continue
        inside = f" in {', '.join(where[what][:2])}" if where.get(what) else ""
        if what == "up":
            out.append(f"{share[what]:.0%} are uploads{inside}: allocate their source pinned (DataLoader(pin_memory="
                       "True) for input batches, tensor.pin_memory() or a pinned staging buffer reused every step), "
                       "then copy with .to(device, non_blocking=True).")
        elif what == "down":
            out.append(f"{share[what]:.0%} are downloads{inside} (results the host reads): copy them into a pinned "
                       "buffer (torch.empty(..., pin_memory=True)) with non_blocking=True and wait on an event only "
                       "where the values are used.")
        else:
            out.append(f"{share[what]:.0%} run outside the steps{inside} (set-up, such as loading weights): they do "
                       "not recur per step, so pinning them saves that once; pin what recurs first.")
    return out or ["Pin the host side of the copies that recur (tensor.pin_memory(), DataLoader(pin_memory=True)), "
                   "then copy with non_blocking=True."]
