"""Why the device waits: every idle interval of the inference window, with a cause read from the host side.

A pure analysis step (:func:`idle_slices`, stored by the import pipeline as the ``idle`` table).
Idle time is the time inside the window when the device runs no kernel and no copy (the busy
timeline of :func:`.intervals.activity`, streams merged). The window is the inference window
when the report has a framework's steps (:func:`.steps.inference_windows`), else the device's
first to last piece of work (the leading and trailing gaps of ``nsys analyze``'s gpu_gaps rule
are not idle time). On a CPU report the rows are operators: idle is the time when no operator runs
on any thread, and the host-to-device synchronisation operators (``aten::item``,
``aten::_local_scalar_dense``) count as idle time of cause ``sync``, not as work: on a GPU they
are the host waiting for the device.

Each idle nanosecond gets one cause, from what the host was doing at that moment (the first that
applies, in this order):

- ``profiler``: inside the profiler's own calls (CUPTI / roctracer / cudaProfilerStart, buffer
  flushes) or a range the profiler itself records;
- ``sync``: inside a blocking synchronisation (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, their ``hip``/``cu`` forms; ``aten::item`` on a CPU report);
- ``copy``: inside a host<->device copy call (``cudaMemcpy*``, ``hipMemcpy*``, ``cuMemcpy*``) whose
  copy is HtoD, DtoH or HtoH (pageable copies stage through the host first; the copy's bytes,
  rate and pinned/pageable come with it);
- ``launch``: inside a launch call (``cudaLaunchKernel``, ``cuLaunchKernel``, ``hipLaunchKernel``,
  ``cudaGraphLaunch``... any runtime or driver call named ``*Launch*``; a memset or device-to-device
  copy call too: they only queue device work);
- ``host``: the host side is recorded then but in none of those calls: user code (Python, the
  framework, I/O, sleeping). The range column names the innermost NVTX / ``record_function`` /
  ``nn.Module`` range around it (on the thread that launched the most work first);
- ``unknown``: the trace has no host side for that moment (a GPU-only trace, or before the first
  / after the last recorded host event).

Every slice also carries the innermost range around it, whatever its cause, so a ``sync`` inside
``sampler`` says so.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.memo import memo
from perfscope.schema import conform, map_distinct

from .intervals import activity, merge_intervals
from .steps import GPU_RANGE_SOURCES, has_framework_steps, inference_windows
from .summaries.kernels import is_cpu_report

if TYPE_CHECKING:
    from perfscope.report import Report

CAUSES = ("launch", "host", "sync", "copy", "profiler", "unknown")
"""Every cause an idle slice can have (``idle.cause``)."""

PRIORITY = ("profiler", "sync", "copy", "launch")
"""The host-call causes, first wins where calls overlap (a sync inside a profiler flush is the profiler's)."""

PROFILER_API = re.compile(r"cupti|profiler|roctracer|rocprof|activity ?buffer", re.IGNORECASE)
PROFILER_RANGE = re.compile(r"^\s*\[?(cupti|kineto|profiler overhead|activity buffer)", re.IGNORECASE)
SYNC_API = re.compile(r"synchroni[sz]e", re.IGNORECASE)
SYNC_OPS = re.compile(r"^aten::(item|_local_scalar_dense)$")
COPY_API = re.compile(r"memcpy", re.IGNORECASE)
LAUNCH_API = re.compile(r"launch", re.IGNORECASE)
MEMSET_API = re.compile(r"memset", re.IGNORECASE)
HOST_DEVICE_COPIES = ("HtoD", "DtoH", "HtoH")

IDLE_TABLE = "idle"


# ---------------------------------------------------------------------------- interval sets
def _inside(sets: tuple[np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Whether each point ``x`` lies in the sorted, disjoint ``[start, end)`` intervals ``sets``."""
    s, e = sets
    if not len(s):
        return np.zeros(len(x), bool)
    i = np.searchsorted(s, x, side="right") - 1
    j = np.maximum(i, 0)
    return (i >= 0) & (x < e[j])


def _merged(df: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = df[mask]
    keep = (rows["end_ns"].to_numpy(np.int64) > rows["start_ns"].to_numpy(np.int64))
    return merge_intervals(rows["start_ns"].to_numpy(np.int64)[keep], rows["end_ns"].to_numpy(np.int64)[keep])


def idle_intervals(busy: tuple[np.ndarray, np.ndarray],
                   window: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The parts of ``window`` (merged intervals) that ``busy`` (merged intervals) does not cover."""
    ws, we = window
    bs, be = busy
    points = np.unique(np.concatenate([ws, we, bs, be]))
    if len(points) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    a, b = points[:-1], points[1:]
    mid = a + (b - a) // 2
    keep = _inside(window, mid) & ~_inside(busy, mid)
    return merge_intervals(a[keep], b[keep])


# ---------------------------------------------------------------------------- ranges
def _range_chains(ranges: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per thread (the thread of the most ranges first): (starts sorted, ends, parent position or -1,
    depth, names) of its host ranges, nested by time (a range inside another on its thread is its child)."""
    if not len(ranges):
        return []
    r = ranges
    if "source" in r:
        r = r[~r["source"].astype("object").isin(GPU_RANGE_SOURCES).to_numpy(bool)]
    r = r[(r["end_ns"] > r["start_ns"]).to_numpy(bool)]
    if not len(r):
        return []
    thread = r["thread"].astype("float64").fillna(-1.0).to_numpy() if "thread" in r else np.full(len(r), -1.0)
    out = []
    threads, counts = np.unique(thread, return_counts=True)
    for t in threads[np.argsort(-counts, kind="stable")]:
        sub = r[thread == t]
        s, e = sub["start_ns"].to_numpy(np.int64), sub["end_ns"].to_numpy(np.int64)
        order = np.lexsort((-e, s))
        s, e = s[order], e[order]
        names = sub["name"].astype("object").to_numpy()[order]
        parent = np.full(len(s), -1, np.int64)
        depth = np.zeros(len(s), np.int64)
        stack: list[int] = []
        for i, (si, ei) in enumerate(zip(s.tolist(), e.tolist())):
            while stack and e[stack[-1]] <= si:
                stack.pop()
            if stack and ei <= e[stack[-1]]:
                parent[i] = stack[-1]
                depth[i] = depth[stack[-1]] + 1
            stack.append(i)
        out.append((s, e, parent, depth, names))
    return out


def innermost_ranges(ranges: pd.DataFrame, x: np.ndarray) -> np.ndarray:
    """The name of the innermost host range around each time ``x`` (None where none is), looked up
    on the thread with the most ranges first, then the others."""
    names = np.full(len(x), None, dtype=object)
    todo = np.ones(len(x), bool)
    for s, e, parent, _depth, rnames in _range_chains(ranges):
        if not todo.any():
            break
        at = np.flatnonzero(todo)
        cur = np.searchsorted(s, x[at], side="right") - 1
        cur = np.where(cur >= 0, cur, -1)
        for _ in range(int(_depth.max()) + 2 if len(_depth) else 1):
            out = (cur >= 0) & (e[np.maximum(cur, 0)] <= x[at])
            if not out.any():
                break
            cur = np.where(out, parent[np.maximum(cur, 0)], cur)
        found = cur >= 0
        names[at[found]] = rnames[cur[found]]
        todo[at[found]] = False
    return names


# ---------------------------------------------------------------------------- the table
def idle_slices(report: Report) -> pd.DataFrame:
    """Every idle slice of every device's window with its cause (the ``idle`` table, conformed).

    Columns: device, start_ns, end_ns, duration_ns, cause (:data:`CAUSES`), range (the innermost
    host range around it), api (the host call it fell in: launch, sync, copy or profiler),
    correlation and bytes / pinned (copies: the copy the call made), window_ns (the device's
    window) and window_pct (the slice's share of it)."""
    return conform(idle_rows(report), IDLE_TABLE, source="<idle>")


def idle_of(report: Report) -> pd.DataFrame:
    """The report's ``idle`` table: the stored one, else computed (reports written before it existed,
    or built without the import pipeline), once per Report object."""
    if len(report.idle):
        return report.idle
    return memo(report, "idle:slices", lambda: idle_slices(report))


def _host_calls(report: Report) -> tuple[pd.DataFrame, np.ndarray]:
    """The host's API calls (name, start_ns, end_ns, correlation) and the cause each one stands for
    (None: a call that is none of them, such as cudaEventRecord)."""
    api = report.api[["name", "start_ns", "end_ns", "correlation"]]
    if not len(api):
        return api, np.zeros(0, dtype=object)
    copy_kind = _copy_kinds(report)
    corr = api["correlation"].to_numpy(np.float64, na_value=np.nan)

    def cause_of(name: object) -> str | None:
        text = "" if name is None else str(name)
        if PROFILER_API.search(text):
            return "profiler"
        if SYNC_API.search(text):
            return "sync"
        if COPY_API.search(text):
            return "copy"
        if LAUNCH_API.search(text) or MEMSET_API.search(text):
            return "launch"
        return None

    cause = map_distinct(api["name"], cause_of).to_numpy(object).copy()
    is_copy = cause == "copy"
    if is_copy.any() and len(copy_kind):
        kind = pd.Series(corr[is_copy]).map(copy_kind).to_numpy(object)
        device_side = np.array([k is not None and not (isinstance(k, float)) and k not in HOST_DEVICE_COPIES
                                for k in kind])
        idx = np.flatnonzero(is_copy)[device_side]
        cause[idx] = "launch"  # a device-to-device copy call only queues work, like a launch
    return api, cause


def _copy_kinds(report: Report) -> dict[float, str]:
    t = report.transfers
    if not len(t) or "correlation" not in t:
        return {}
    t = t[t["correlation"].notna()]
    return dict(zip(t["correlation"].astype("float64").tolist(), t["kind"].astype("object").tolist()))


def _windows(report: Report) -> tuple[np.ndarray, np.ndarray] | None:
    if has_framework_steps(report.steps):
        return inference_windows(report.steps, report.kernels, report.transfers)
    return None


def idle_rows(report: Report) -> pd.DataFrame:
    """The rows of :func:`idle_slices`, not yet conformed (``Report.replace(idle=...)`` conforms them)."""
    acts = activity(report)
    if not len(acts):
        return pd.DataFrame()
    cpu = is_cpu_report(report)
    windows = _windows(report)
    api, api_cause = _host_calls(report)
    host_sets: dict[str, tuple[np.ndarray, np.ndarray]] = {
        c: _merged(api, api_cause == c) for c in PRIORITY}
    ranges = report.ranges
    host_ranges = ranges
    if len(ranges) and "source" in ranges:
        host_ranges = ranges[~ranges["source"].astype("object").isin(GPU_RANGE_SOURCES).to_numpy(bool)]
    if len(host_ranges):
        prof = map_distinct(host_ranges["name"], lambda n: bool(PROFILER_RANGE.search(str(n)))).to_numpy(bool)
        ps, pe = host_sets["profiler"]
        rs, re_ = _merged(host_ranges, prof)
        host_sets["profiler"] = merge_intervals(np.concatenate([ps, rs]), np.concatenate([pe, re_]))
    sync_op = np.zeros(len(acts), bool)
    if cpu:
        sync_op = map_distinct(acts["name"], lambda n: bool(SYNC_OPS.match(str(n)))).to_numpy(bool)
        host_sets["sync"] = _merged(acts, sync_op)
    # the span over which the host side is recorded: outside it, idle time's cause is unknown
    spans = [(df["start_ns"].min(), df["end_ns"].max()) for df in (api, host_ranges) if len(df)]
    if cpu:
        spans.append((acts["start_ns"].min(), acts["end_ns"].max()))
    recorded = (np.array([min(int(s) for s, _ in spans)], np.int64), np.array([max(int(e) for _, e in spans)], np.int64)) \
        if spans else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    copies = _copy_calls(report, api, api_cause)
    calls = {c: _sorted_calls(api, api_cause == c) for c in ("profiler", "sync", "launch")}
    frames = []
    starts, ends = acts["start_ns"].to_numpy(np.int64), acts["end_ns"].to_numpy(np.int64)
    devices = acts["device"].astype("object").to_numpy()
    for device in sorted({d for d in devices.tolist() if d is not None}, key=str):
        on = (devices == device) & ~sync_op
        if not on.any():
            continue
        busy = merge_intervals(starts[on], ends[on])
        window = windows if windows is not None else (busy[0][:1], busy[1][-1:])
        if not len(window[0]):
            continue
        frames.append(_classify(device, idle_intervals(busy, window), window, host_sets, recorded,
                                host_ranges, copies, calls))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _sorted_calls(api: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts sorted, ends, names) of the calls ``mask`` selects."""
    rows = api[mask].sort_values("start_ns", kind="stable")
    return (rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64),
            rows["name"].astype("object").to_numpy())


def _copy_calls(report: Report, api: pd.DataFrame, cause: np.ndarray) -> pd.DataFrame:
    """The copy calls sorted by start, with their copy's bytes and pinned flag (by correlation)."""
    calls = api[cause == "copy"].sort_values("start_ns", kind="stable")
    t = report.transfers
    if len(calls) and len(t) and "correlation" in t:
        t = t[t["correlation"].notna()].drop_duplicates("correlation")
        info = t.set_index(t["correlation"].astype("float64"))[["bytes", "pinned"]]
        corr = calls["correlation"].astype("float64")
        calls = calls.assign(bytes=corr.map(info["bytes"]).to_numpy(), pinned=corr.map(info["pinned"]).to_numpy())
    else:
        calls = calls.assign(bytes=np.nan, pinned=None)
    return calls.reset_index(drop=True)


def _classify(device: str, idle: tuple[np.ndarray, np.ndarray], window: tuple[np.ndarray, np.ndarray],
              host_sets: dict[str, tuple[np.ndarray, np.ndarray]], recorded: tuple[np.ndarray, np.ndarray],
              ranges: pd.DataFrame, copies: pd.DataFrame,
              calls: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> pd.DataFrame:
    """Cut the idle intervals at every host-call boundary, give each piece its cause and range, and
    join neighbouring pieces that agree."""
    ist, ien = idle
    if not len(ist):
        return pd.DataFrame()
    lo, hi = int(ist[0]), int(ien[-1])
    cuts = [ist, ien]
    for s, e in [*host_sets.values(), recorded]:
        sel_s, sel_e = s[(s > lo) & (s < hi)], e[(e > lo) & (e < hi)]
        cuts += [sel_s, sel_e]
    if len(ranges):
        rs, re_ = ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64)
        cuts += [rs[(rs > lo) & (rs < hi)], re_[(re_ > lo) & (re_ < hi)]]
    points = np.unique(np.concatenate(cuts))
    a, b = points[:-1], points[1:]
    mid = a + (b - a) // 2
    keep = _inside(idle, mid)
    a, b, mid = a[keep], b[keep], mid[keep]
    cause = np.full(len(a), "host", dtype=object)
    cause[~_inside(recorded, mid)] = "unknown"
    done = cause == "unknown"
    for c in PRIORITY:
        hit = ~done & _inside(host_sets[c], mid)
        cause[hit] = c
        done |= hit
    names = innermost_ranges(ranges, mid)
    names[cause == "unknown"] = None
    corr = np.full(len(a), np.nan)
    nbytes = np.full(len(a), np.nan)
    pinned = np.full(len(a), None, dtype=object)
    api_name = np.full(len(a), None, dtype=object)
    is_copy = np.flatnonzero(cause == "copy")
    if len(is_copy) and len(copies):
        cs, ce = copies["start_ns"].to_numpy(np.int64), copies["end_ns"].to_numpy(np.int64)
        i = np.searchsorted(cs, mid[is_copy], side="right") - 1
        ok = (i >= 0) & (ce[np.maximum(i, 0)] > mid[is_copy])
        at, row = is_copy[ok], i[ok]
        corr[at] = copies["correlation"].to_numpy(np.float64, na_value=np.nan)[row]
        nbytes[at] = pd.to_numeric(copies["bytes"], errors="coerce").to_numpy(np.float64)[row]
        pinned[at] = copies["pinned"].astype("object").to_numpy()[row]
        api_name[at] = copies["name"].astype("object").to_numpy()[row]
    for c, (cs, ce, cn) in calls.items():
        at = np.flatnonzero(cause == c)
        if len(at) and len(cs):
            i = np.searchsorted(cs, mid[at], side="right") - 1
            ok = (i >= 0) & (ce[np.maximum(i, 0)] > mid[at])
            api_name[at[ok]] = cn[i[ok]]
    # join neighbours with the same cause, range and copy call
    key_change = np.ones(len(a), bool)
    if len(a) > 1:
        same = (a[1:] == b[:-1]) & (cause[1:] == cause[:-1]) & (names[1:] == names[:-1]) & \
            ((corr[1:] == corr[:-1]) | (np.isnan(corr[1:]) & np.isnan(corr[:-1])))
        key_change[1:] = ~same
    first = np.flatnonzero(key_change)
    last = np.append(first[1:] - 1, len(a) - 1)
    span = float((window[1] - window[0]).sum())
    start, end = a[first], b[last]
    dur = end - start
    return pd.DataFrame({
        "device": device, "start_ns": start, "end_ns": end, "duration_ns": dur,
        "cause": cause[first], "range": names[first], "api": api_name[first],
        "correlation": corr[first], "bytes": nbytes[first], "pinned": pinned[first],
        "window_ns": span, "window_pct": dur / span * 100.0 if span > 0 else np.nan,
    })


# ---------------------------------------------------------------------------- summaries
def idle_summary(idle: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, cause, range): duration_ns, slices, window_pct, idle_pct (share of the
    device's idle time) and, for copies, bytes (each copy once), copies and pinned (all / none / some)."""
    cols = ["device", "cause", "range", "duration_ns", "slices", "window_pct", "idle_pct", "bytes", "copies", "pinned"]
    if not len(idle):
        return pd.DataFrame(columns=cols)
    df = idle.assign(range=idle["range"].astype("object").where(idle["range"].notna(), ""))
    rows = []
    for (device, cause, rng), g in df.groupby(["device", "cause", "range"], sort=False, dropna=False):
        total_idle = float(df.loc[df["device"] == device, "duration_ns"].sum())
        window = float(g["window_ns"].iloc[0])
        once = g[g["correlation"].notna()].drop_duplicates("correlation")
        nbytes = float(once["bytes"].sum()) if len(once) and once["bytes"].notna().any() else np.nan
        pin = once["pinned"].dropna().astype(bool)
        pinned = None if not len(pin) else "all" if pin.all() else "none" if not pin.any() else "some"
        dur = float(g["duration_ns"].sum())
        rows.append({"device": device, "cause": cause, "range": rng or None, "duration_ns": dur,
                     "slices": len(g), "window_pct": dur / window * 100 if window > 0 else np.nan,
                     "idle_pct": dur / total_idle * 100 if total_idle > 0 else np.nan,
                     "bytes": nbytes, "copies": len(once) if cause == "copy" else np.nan, "pinned": pinned})
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["device", "duration_ns"], ascending=[True, False], kind="stable").reset_index(drop=True)


def cause_totals(idle: pd.DataFrame, device: str | None = None) -> dict[str, float]:
    """Idle ns per cause (every cause of :data:`CAUSES`, 0 where none), for one device or all."""
    df = idle if device is None else idle[idle["device"] == device]
    by = df.groupby("cause")["duration_ns"].sum() if len(df) else pd.Series(dtype="float64")
    return {c: float(by.get(c, 0.0)) for c in CAUSES}


def idle_overview(idle: pd.DataFrame, top: int = 8) -> list[dict[str, object]]:
    """Per device: its window and idle ns, the idle ns and share per cause (every cause listed), and
    the ``top`` rows of :func:`idle_summary` (the ``--json`` key ``idle``, the text and HTML sections)."""
    out: list[dict[str, object]] = []
    if not len(idle):
        return out
    summary = idle_summary(idle)
    for device, rows in idle.groupby("device", sort=True):
        total = float(rows["duration_ns"].sum())
        window = float(rows["window_ns"].iloc[0])
        totals = cause_totals(rows)
        out.append({
            "device": device, "window_ns": window, "idle_ns": total,
            "idle_pct": total / window * 100 if window > 0 else None,
            "causes": [{"cause": c, "duration_ns": ns, "idle_pct": ns / total * 100 if total > 0 else None}
                       for c, ns in sorted(totals.items(), key=lambda kv: -kv[1])],
            "ranges": summary[summary["device"] == device].head(top).drop(columns="device").to_dict(orient="records"),
        })
    return out


__all__ = ["CAUSES", "cause_totals", "idle_intervals", "idle_of", "idle_overview", "idle_rows", "idle_slices", "idle_summary", "innermost_ranges"]
