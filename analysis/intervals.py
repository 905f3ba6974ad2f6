"""Interval algebra on the report's timeline: unions, coverage, gaps, and the profile's span.

Times are nanoseconds on the report's timeline. A "busy" timeline is the union of the intervals
of one device's work (kernels and copies), so overlapping streams count once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.memo import memo
from perfscope.schema import column_codes

from .steps import has_framework_steps, inference_windows

if TYPE_CHECKING:
    from perfscope.report import Report


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``[start, end)`` intervals as sorted, disjoint ``(starts, ends)`` arrays."""
    if not len(starts):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, np.int64)[order], np.asarray(ends, np.int64)[order]
    first = np.ones(len(s), bool)
    first[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    idx = np.flatnonzero(first)
    return s[idx], np.maximum.reduceat(e, idx)


def inside(sets: tuple[np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Whether each point ``x`` lies in the sorted, disjoint ``[start, end)`` intervals ``sets``
    (:func:`merge_intervals`)."""
    s, e = sets
    if not len(s):
        return np.zeros(len(x), bool)
    i = np.searchsorted(s, x, side="right") - 1
    j = np.maximum(i, 0)
    return (i >= 0) & (x < e[j])


def covered_ns(merged: tuple[np.ndarray, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each ``[start, end)``, how many ns of it the merged intervals cover."""
    ms, me = merged
    if not len(ms):
        return np.zeros(len(starts), np.float64)
    lengths = (me - ms).astype(np.float64)
    before = np.concatenate([[0.0], np.cumsum(lengths)])

    def busy_until(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ms, x, side="right") - 1
        j = np.maximum(i, 0)
        inside = np.clip(x - ms[j], 0, lengths[j])
        return np.where(i >= 0, before[j] + inside, 0.0)

    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    return busy_until(e) - busy_until(s)


def gaps_before(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Idle ns just before each interval (0 for the first and for overlapped ones), in input order.

    Timestamps stay int64 throughout: epoch nanoseconds (~1.8e18) do not fit a float64 exactly.

    The gap before an interval is how long nothing was running when it started: its start
    minus the latest end among the intervals that started before it.
    """
    if not len(starts):
        return np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, np.int64)[order], np.asarray(ends, np.int64)[order]
    gap = np.zeros(len(s), np.int64)
    gap[1:] = np.clip(s[1:] - np.maximum.accumulate(e)[:-1], 0, None)
    out = np.empty_like(gap)
    out[order] = gap
    return out


def activity(report: Report) -> pd.DataFrame:
    """Every kernel and copy as one table: device, stream, start_ns, end_ns, correlation, what, name.

    ``what`` is ``kernel`` or the copy kind (``HtoD``, ``memset``, ...). Kernel rows come first and
    keep the kernel table's index. Copies whose device is not recorded go to the report's only
    device, or are dropped when there are several.
    Computed once per Report object (the timeline rules share it); do not modify it.
    """
    return memo(report, ACTIVITY_KEY, lambda: _activity(report))


ACTIVITY_KEY = "intervals:activity"
"""The memo key of :func:`activity`."""


def _activity(report: Report) -> pd.DataFrame:
    cols = ["device", "stream", "start_ns", "end_ns", "correlation"]
    k = report.kernels[cols + ["name"]].assign(what="kernel")
    t = report.transfers
    devices = column_codes(report.kernels, "device")[1]  # the distinct recorded devices
    if len(t):
        t = t[cols[1:] + ["kind"]].assign(device=t["device"], name=t["kind"]).rename(columns={"kind": "what"})
        if len(devices) == 1:
            t["device"] = t["device"].where(t["device"].notna(), devices[0])
        t = t[t["device"].notna()]
    frames = [f for f in (k, t) if len(f)]
    if not frames:
        return pd.DataFrame(columns=cols + ["name", "what"])
    out = pd.concat(frames, ignore_index=True)  # kernels keep 0..n-1, the kernel table's RangeIndex
    out["start_ns"] = out["start_ns"].astype("int64")
    out["end_ns"] = out["end_ns"].astype("int64")
    return out


def profile_span_ns(report: Report) -> float:
    """Wall time the profile covers: first start to last end of any kernel, copy or step; with a
    framework's steps (vLLM, SGLang, ...), the inference window's length
    (:func:`.framework_steps.inference_windows`), so loading and the profiler's lead-in do not count."""
    if has_framework_steps(report.steps):
        ws, we = inference_windows(report.steps, report.kernels, report.transfers)
        if len(ws):
            return float((we - ws).sum())
    return trace_span_ns(report)


def headline_span_ns(report: Report) -> float:
    """Wall time of the headline (warm unprofiled) run: its first step's start to its last step's end;
    NaN when the report holds no unprofiled steps."""
    s = report.steps_unprofiled
    if not len(s):
        return math.nan
    return float(s["end_ns"].max() - s["start_ns"].min())


def run_span_ns(report: Report, run: str) -> float:
    """Wall time of the run a finding names (``headline``: :func:`headline_span_ns`; ``profiled`` or
    ``trace``: :func:`profile_span_ns`)."""
    if run == "headline":
        span = headline_span_ns(report)
        if math.isfinite(span) and span > 0:
            return span
    return profile_span_ns(report)


def trace_span_ns(report: Report) -> float:
    """First start to last end of any kernel, copy or step: the whole trace."""
    starts = [df["start_ns"].min() for df in (report.kernels, report.transfers, report.steps) if len(df)]
    ends = [df["end_ns"].max() for df in (report.kernels, report.transfers, report.steps) if len(df)]
    if not starts:
        return math.nan
    return float(max(ends) - min(starts))
