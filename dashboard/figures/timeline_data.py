"""Timeline view-model: lanes of intervals and their level of detail.

Every interval is placed on one lane: a lane per device and stream (GPU kernels) or per thread
(CPU operators), one per device for memcpy/memset, one per range depth (NVTX /
record_function), and a phase lane (engine steps, or runs of kernels with the same phase).
Times are ns offsets from the report's first event (``origin_ns``), kept as int64 so the
epoch-scale timestamps of real traces lose no precision.

Level of detail: a window holding more than ``max_items`` kernels is drawn as per-lane busy
bins (share of each bin covered by intervals, computed exactly from prefix sums), so a
1M-kernel report costs O(lanes x bins) per update; a zoomed-in window gets exact intervals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.schema import column_codes, decode, map_distinct, text_of

from ..memo import memo

if TYPE_CHECKING:
    from perfscope.report import Report

MAX_RANGE_DEPTH = 4


@dataclass(frozen=True, eq=False)
class Lane:
    """Intervals of one lane, sorted by start.

    Attributes:
        label: the lane's name on the y axis (``cuda:0 stream 7``, ``memcpy cuda:0``, ...).
        kind: ``kernel``, ``memcpy``, ``range`` or ``phase``.
        starts, ends: int64 ns offsets from the report origin, sorted by start.
        rows: row positions in the source table (``kernels``, ``transfers``, ``ranges``, ``steps``).
        names: what each interval is called (kernel name, copy kind, range name, phase).
        groups: the colour group of each interval (kernel category, copy kind, phase ...).
    """

    label: str
    kind: str
    starts: np.ndarray
    ends: np.ndarray
    rows: np.ndarray
    names: np.ndarray
    groups: np.ndarray
    _prefix: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.starts)

    def span(self, t0: int, t1: int) -> slice:
        """Positions of the intervals that may intersect [t0, t1) (a superset, cheap)."""
        hi = int(np.searchsorted(self.starts, t1, side="left"))
        runmax = self._prefix_array("runmax", lambda: np.maximum.accumulate(self.ends))
        lo = int(np.searchsorted(runmax, t0, side="right"))
        return slice(min(lo, hi), hi)

    def busy_ns(self, edges: np.ndarray) -> np.ndarray:
        """Covered time in each bin between consecutive ``edges`` (overlaps counted twice)."""
        s_sorted = self.starts
        e_sorted = self._prefix_array("ends_sorted", lambda: np.sort(self.ends))
        cs = self._prefix_array("cs_starts", lambda: np.concatenate([[0], np.cumsum(s_sorted)]))
        ce = self._prefix_array("cs_ends", lambda: np.concatenate([[0], np.cumsum(e_sorted)]))
        ns = np.searchsorted(s_sorted, edges, side="left")
        ne = np.searchsorted(e_sorted, edges, side="left")
        covered = (ns * edges - cs[ns]) - (ne * edges - ce[ne])
        return np.diff(covered)

    def starts_in(self, edges: np.ndarray) -> np.ndarray:
        """How many intervals start in each bin."""
        return np.diff(np.searchsorted(self.starts, edges, side="left"))

    def _prefix_array(self, key: str, build: object) -> np.ndarray:
        if key not in self._prefix:
            self._prefix[key] = build()  # type: ignore[operator]
        return self._prefix[key]


@dataclass(frozen=True)
class TimelineIndex:
    """Every lane of a report and its time span (ns offsets from ``origin_ns``)."""

    origin_ns: int
    end_ns: int
    lanes: tuple[Lane, ...]


def _lane(label: str, kind: str, start: pd.Series, end: pd.Series, names: pd.Series, groups: pd.Series,
          origin: int) -> Lane:
    s = start.to_numpy(dtype="int64") - origin
    e = np.maximum(end.to_numpy(dtype="int64") - origin, s)
    order = np.argsort(s, kind="stable")
    return Lane(label, kind, s[order], e[order], start.index.to_numpy()[order],
                _objects(names)[order], _objects(groups)[order])


def _objects(values: pd.Series) -> np.ndarray:
    """``values`` as an object array, built per distinct value (a 1M-row Arrow string column has a
    few hundred names; converting it row by row is what took the time)."""
    if values.dtype == object:
        return values.to_numpy()
    return map_distinct(values, lambda v: v).to_numpy()


def _origin(report: Report) -> tuple[int, int]:
    starts, ends = [], []
    for table in (report.kernels, report.transfers, report.ranges, report.steps):
        if len(table):
            starts.append(int(table["start_ns"].min()))
            ends.append(int(table["end_ns"].max()))
    if not starts:
        return 0, 0
    return min(starts), max(ends)


def _kernel_lanes(k: pd.DataFrame, origin: int) -> list[Lane]:
    if not len(k):
        return []
    # one lane per (device, stream) or, on a CPU, (device, thread): grouped on integer codes (the
    # text columns' per-table codes, shared with the rules), the label text built once per lane
    raw_dev, dev_names = column_codes(k, "device")
    dev_labels = [str(d) for d in dev_names] + ["?"]
    dev_codes = np.where(raw_dev < 0, len(dev_names), raw_dev)
    cpu = np.array([d.startswith("cpu") for d in dev_labels], dtype=bool)[dev_codes]
    stream_codes = pd.factorize(k["stream"], use_na_sentinel=False)[0]
    thread_codes = pd.factorize(k["thread"], use_na_sentinel=False)[0]
    sub_codes = np.where(cpu, thread_codes, stream_codes)
    combined = (dev_codes.astype(np.int64) * 2 + cpu) * (int(sub_codes.max()) + 1) + sub_codes
    lane_of = pd.factorize(combined)[0]
    first = np.unique(lane_of, return_index=True)[1]
    thread, stream = text_of(k["thread"].iloc[first], "?"), text_of(k["stream"].iloc[first], "?")
    labels = [f"{dev_labels[dev_codes[i]]} " + (f"thread {thread.iloc[j]}" if cpu[i] else f"stream {stream.iloc[j]}")
              for j, i in enumerate(first)]
    busy = np.bincount(lane_of, weights=k["duration_ns"].to_numpy(np.float64, na_value=np.nan), minlength=len(labels))
    cat_codes, cats = column_codes(k, "category")
    groups = pd.Series(decode(cat_codes, cats, "other"), index=k.index, dtype="object")
    names = pd.Series(decode(*column_codes(k, "name")), index=k.index, dtype="object")
    members = np.argsort(lane_of, kind="stable")
    bounds = np.searchsorted(lane_of[members], np.arange(len(labels) + 1))
    order = sorted(range(len(labels)), key=lambda c: (labels[c].split(" ")[0], -busy[c]))
    out = []
    for c in order:
        rows = members[bounds[c]:bounds[c + 1]]
        out.append(_lane(labels[c], "kernel", k["start_ns"].iloc[rows], k["end_ns"].iloc[rows],
                         names.iloc[rows], groups.iloc[rows], origin))
    return out


def _transfer_lanes(t: pd.DataFrame, origin: int) -> list[Lane]:
    if not len(t):
        return []
    device = text_of(t["device"])
    lanes = []
    for dev in sorted(device.unique()):
        sel = device == dev
        label = f"memcpy {dev}".strip()
        names = text_of(t["kind"], "?")[sel] + " " + text_of(t["bytes"], "?")[sel] + " B"
        lanes.append(_lane(label, "memcpy", t["start_ns"][sel], t["end_ns"][sel], names, t["kind"][sel], origin))
    return lanes


def _range_lanes(r: pd.DataFrame, origin: int) -> list[Lane]:
    if not len(r):
        return []
    depth = r["depth"].astype("float64").fillna(0).astype("int64").clip(upper=MAX_RANGE_DEPTH)
    lanes = []
    for d in sorted(depth.unique()):
        sel = depth == d
        label = f"ranges depth {d}" + ("+" if d == MAX_RANGE_DEPTH else "")
        lanes.append(_lane(label, "range", r["start_ns"][sel], r["end_ns"][sel], r["name"][sel],
                           pd.Series("range", index=r.index[sel]), origin))
    return lanes


def _kernel_phase_runs(k: pd.DataFrame) -> pd.DataFrame:
    """Spans of consecutive kernels (by start) that share a phase."""
    sel = k.loc[k["phase"].notna(), ["phase", "start_ns", "end_ns"]].sort_values("start_ns", kind="stable")
    if not len(sel):
        return pd.DataFrame(columns=["phase", "start_ns", "end_ns"])
    phase = text_of(sel["phase"])
    run = (phase != phase.shift()).cumsum()
    spans = sel.groupby(run).agg(phase=("phase", "first"), start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    return spans.reset_index(drop=True)


def _phase_lane(report: Report, origin: int) -> list[Lane]:
    src = report.steps if len(report.steps) else _kernel_phase_runs(report.kernels)
    if not len(src):
        return []
    src = src.reset_index(drop=True)
    phase = text_of(src["phase"], "?")
    names = phase + (" step " + text_of(src["step"], "?") if "step" in src else "")
    return [_lane("phase", "phase", src["start_ns"], src["end_ns"], names, phase, origin)]


def timeline_index(report: Report) -> TimelineIndex:
    """The lanes of ``report`` (computed once per Report object)."""
    def build() -> TimelineIndex:
        origin, end = _origin(report)
        lanes = (_phase_lane(report, origin) + _range_lanes(report.ranges, origin)
                 + _kernel_lanes(report.kernels, origin) + _transfer_lanes(report.transfers, origin))
        return TimelineIndex(origin, end - origin, tuple(lanes))
    return memo(report, "timeline:index", build)


@dataclass(frozen=True, eq=False)
class LaneView:
    """What to draw for one lane in a window: exact intervals or busy bins."""

    lane: Lane
    exact: slice | None  # positions into the lane's arrays (exact mode)
    mask: np.ndarray | None  # within ``exact``: the intervals that really intersect the window
    busy_pct: np.ndarray | None  # per bin (binned mode)
    counts: np.ndarray | None  # intervals starting per bin (binned mode)


@dataclass(frozen=True, eq=False)
class TimelineView:
    """A window of the timeline at its level of detail."""

    t0_ns: int
    t1_ns: int
    binned: bool
    items_in_window: int
    edges_ns: np.ndarray
    lanes: tuple[LaneView, ...]


def _exact(lane: Lane, t0: int, t1: int) -> LaneView:
    sl = lane.span(t0, t1)
    mask = lane.ends[sl] > t0
    return LaneView(lane, sl, mask, None, None)


def _binned(lane: Lane, edges: np.ndarray) -> LaneView:
    width = np.diff(edges).astype("float64")
    busy = np.minimum(lane.busy_ns(edges) / width * 100.0, 100.0)
    return LaneView(lane, None, None, busy, lane.starts_in(edges))


def timeline_view(
    report: Report,
    *,
    t0_ns: int | None = None,
    t1_ns: int | None = None,
    max_items: int = 3000,
    bins: int = 800,
) -> TimelineView:
    """Choose, per lane, exact intervals or busy bins for the window [t0_ns, t1_ns).

    Args:
        report: the report.
        t0_ns, t1_ns: window as ns offsets from the report's first event (default: all).
        max_items: above this many kernels and copies in the window, kernel and copy lanes
            are drawn as ``bins`` busy bins; range and phase lanes too when they alone exceed it.
        bins: number of bins across the window in binned mode.
    """
    index = timeline_index(report)
    t0 = max(int(t0_ns) if t0_ns is not None else 0, 0)
    t1 = int(t1_ns) if t1_ns is not None else index.end_ns
    t1 = max(t1, t0 + 1)
    edges = np.linspace(t0, t1, bins + 1).round().astype("int64")
    edges = np.unique(edges)
    spans = {lane.label: lane.span(t0, t1) for lane in index.lanes}
    counts = {label: sl.stop - sl.start for label, sl in spans.items()}
    busy_items = sum(counts[lane.label] for lane in index.lanes if lane.kind in ("kernel", "memcpy"))
    binned = busy_items > max_items
    views = []
    for lane in index.lanes:
        heavy = lane.kind in ("kernel", "memcpy") and binned
        heavy = heavy or counts[lane.label] > max_items
        views.append(_binned(lane, edges) if heavy else _exact(lane, t0, t1))
    return TimelineView(t0, t1, binned, busy_items, edges, tuple(views))


def busy_share(report: Report, kind: str = "kernel") -> dict[str, float]:
    """Share (percent) of the report's span during which each ``kind`` lane is busy (union)."""
    index = timeline_index(report)
    span = max(index.end_ns, 1)
    out = {}
    for lane in index.lanes:
        if lane.kind == kind and len(lane):
            out[lane.label] = union_ns(lane.starts, lane.ends) / span * 100.0
    return out


def union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of intervals (``starts`` sorted ascending)."""
    if not len(starts):
        return 0
    reach = np.maximum.accumulate(ends)
    prev = np.concatenate([[starts[0]], reach[:-1]])
    gaps = np.maximum(starts - prev, 0)
    return int(reach[-1] - starts[0] - gaps.sum())
