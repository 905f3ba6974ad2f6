"""What every rule shares: the Finding record, severity from the time at stake, interval algebra.

Times are nanoseconds on the report's timeline. A "busy" timeline is the union of the intervals
of one device's work (kernels and copies), so overlapping streams count once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perfscope.memo import memo
from perfscope.report import Report
from perfscope.schema import map_distinct

SEVERITIES = ("high", "medium", "low", "info")

HIGH_SHARE = 0.25
"""A fix that could give back a quarter or more of the profiled time is ``high``."""
MEDIUM_SHARE = 0.05
"""One that could give back 5% or more is ``medium`` (below that, run-to-run noise on a busy
machine is of the same order); anything smaller is ``low``."""

HOST_COPY_KINDS = ("HtoD", "DtoH")
"""Copies that cross the host link (PCIe / C2C); device-side copies (DtoD, memset) do not."""

Evidence = dict[str, float | int | str]


@dataclass(frozen=True)
class Finding:
    """One thing to fix, with the numbers behind it.

    Attributes:
        id: stable rule id (``gpu-idle``, ``short-kernels``, ``decode-mbu``, ...).
        severity: ``high``, ``medium``, ``low`` or ``info``.
        title: one line with the key number.
        evidence: the numbers behind it; units are in the keys (``_ns``, ``_pct``, ``_bytes``).
        recommendation: what to change, concretely.
        time_at_stake_ns: the time a fix could save at best (the ranking key); NaN when unknown.
        kernels: affected kernel or operator names (the top few).
        ranges: affected NVTX / record_function ranges.
    """

    id: str
    severity: str
    title: str
    evidence: Mapping[str, float | int | str]
    recommendation: str
    time_at_stake_ns: float
    kernels: tuple[str, ...] = ()
    ranges: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None, numpy numbers plain Python numbers)."""
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": {k: plain(v) for k, v in self.evidence.items()},
            "recommendation": self.recommendation,
            "time_at_stake_ns": plain(self.time_at_stake_ns),
            "kernels": list(self.kernels),
            "ranges": list(self.ranges),
        }


def plain(value: Any) -> Any:
    """A JSON-ready scalar: numpy numbers become Python numbers, NaN and inf become None."""
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def severity_for(at_stake_ns: float, reference_ns: float) -> str:
    """``high`` / ``medium`` / ``low`` from the share of ``reference_ns`` a fix could save."""
    if not (reference_ns > 0) or not math.isfinite(at_stake_ns):
        return "low"
    share = at_stake_ns / reference_ns
    if share >= HIGH_SHARE:
        return "high"
    return "medium" if share >= MEDIUM_SHARE else "low"


def ranked(report: Report, rule_id: str, title: str, evidence: Evidence, recommendation: str,
           time_at_stake_ns: float, *, kernels: tuple[str, ...] = (), ranges: tuple[str, ...] = ()) -> Finding:
    """A Finding whose severity is its time at stake against the profile's span."""
    severity = severity_for(time_at_stake_ns, profile_span_ns(report))
    return Finding(rule_id, severity, title, evidence, recommendation, time_at_stake_ns, kernels, ranges)


def info(rule_id: str, title: str, recommendation: str, **evidence: float | str) -> Finding:
    """An ``info`` finding: something a rule could not check, and how to make it checkable."""
    return Finding(rule_id, "info", title, dict(evidence), recommendation, math.nan)


# ---------------------------------------------------------------------------- formatting
def fmt_ns(ns: float) -> str:
    """A duration for a title: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    if not math.isfinite(ns):
        return "n/a"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float) -> str:
    """A byte count for a title: ``512 B``, ``16.4 kB``, ``537 MB``, ``1.2 GB`` (powers of 1000)."""
    if not math.isfinite(n):
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def pct(part: float, whole: float) -> float:
    """``part / whole`` in percent; NaN when ``whole`` is not positive."""
    return 100.0 * part / whole if whole > 0 else math.nan


def top_names(names: pd.Series, weights: pd.Series, n: int = 3) -> tuple[str, ...]:
    """The ``n`` names carrying the most weight (time), heaviest first."""
    totals = weights.groupby(names.astype("object"), sort=False).sum().sort_values(ascending=False, kind="stable")
    return tuple(str(name) for name in totals.index[:n])


DEGENERATE_SHORT_NAME = r"void|\d*|std"
"""Short names that are a C++ keyword or a number are a short-name parser's slip on names such as
``void (anonymous namespace)::kernel<...>(...)``; the full name is used instead."""


def group_key(kernels: pd.DataFrame) -> pd.Series:
    """The name rules group kernels by: ``short_name`` (no template arguments), else ``name``.

    Computed once per table object (several rules group the report's kernels)."""
    return memo(kernels, "group_key", lambda: _group_key(kernels)).copy()


def _group_key(kernels: pd.DataFrame) -> pd.Series:
    short = kernels["short_name"].astype("object")
    degenerate = re.compile(DEGENERATE_SHORT_NAME)
    # once per distinct short name: a 1M-kernel report has a few hundred
    usable = map_distinct(short, lambda v: v is not None and degenerate.fullmatch(str(v)) is None)
    return short.where(usable.astype(bool), kernels["name"].astype("object"))


# ---------------------------------------------------------------------------- intervals
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
    """
    cols = ["device", "stream", "start_ns", "end_ns", "correlation"]
    k = report.kernels[cols + ["name"]].assign(what="kernel")
    t = report.transfers
    devices = k["device"].dropna().unique()
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
    """Wall time the profile covers: first start to last end of any kernel, copy or step."""
    starts = [df["start_ns"].min() for df in (report.kernels, report.transfers, report.steps) if len(df)]
    ends = [df["end_ns"].max() for df in (report.kernels, report.transfers, report.steps) if len(df)]
    if not starts:
        return math.nan
    return float(max(ends) - min(starts))


def is_cpu_report(report: Report) -> bool:
    """True when the rows are CPU operators (a CPU run, or a trace without GPU kernels)."""
    dev = report.device
    if dev is not None and dev.kind == "cpu":
        return True
    k = report.kernels
    return bool(len(k)) and bool((k["device"].astype("object") == "cpu").all())
