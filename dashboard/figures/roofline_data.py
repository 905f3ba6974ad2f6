"""Roofline view-model: which points to draw, the roof lines, and what could not be placed.

Pure functions of a Report; :mod:`perfscope.dashboard.figures` turns them into plotly traces.
A point needs a positive arithmetic intensity and a positive achieved FLOP/s (log axes);
everything else is counted in :class:`Unplaced` so the figure can say how much time it misses.
Large reports keep the figure small by merging kernels that land on the same screen pixel
(a grid of ``CELL_DECADES`` in log space), per name, range, phase and bound, so filters stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.analysis.costs.limiter import UNIT_COLUMNS
from perfscope.schema import column_codes, decode, rows_at

from ..memo import memo
from ..text import si

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec
    from perfscope.report import Report

CELL_DECADES = 0.01
"""Grid step (in decades of intensity and FLOP/s) under which kernels merge in large reports."""

MAX_POINTS = 20_000
"""Most markers one roofline draws; above it points are merged per screen cell."""

ALL = (None, "", "all")


@dataclass(frozen=True)
class Unplaced:
    """Kernels the roofline cannot draw, with the time they stand for."""

    unknown_count: int
    unknown_ns: int
    zero_flops_count: int
    zero_flops_ns: int


@dataclass(frozen=True)
class RooflinePoints:
    """What one roofline figure draws.

    Attributes:
        points: one row per marker: key (row index or name), name, x (FLOP/byte), y (FLOP/s),
            duration_ns, share_pct, count (kernels behind the marker), bound, phase, precision,
            op_shapes, roof_flops_per_s, pct_of_roof, and the measured limiter (limiter, limiter_pct,
            roofline_bound: the roofline's own reading, which the bound overrides where a limiter was measured).
        unplaced: kernels without a position on log axes.
        total_ns: total kernel time of the whole report (the base of share_pct).
        merged: True when markers stand for several kernels (large reports).
        hidden: markers left out because even merged there were more than the cap.
    """

    points: pd.DataFrame
    unplaced: Unplaced
    total_ns: int
    merged: bool = False
    hidden: int = 0


@dataclass(frozen=True)
class RoofLine:
    """One roof segment: a compute ceiling or a memory slope, with its provenance."""

    kind: str  # "compute" or "memory"
    label: str  # fp32, bf16, dram, l2, ...
    value: float
    x: tuple[float, float]
    y: tuple[float, float]
    provenance: str
    method: str
    clock: str | None
    dense: bool | None
    serves: tuple[str, ...] = ()
    """Kernel precisions placed against this roof that are not its own (fp4 kernels on an H100
    are placed against its fp8 roof: ``perfscope.device.DeviceSpec.roof_precision``)."""


# ------------------------------------------------------------------ filters
def _codes(report: Report, column: str) -> tuple[np.ndarray, pd.Index]:
    """The kernel table's memoized codes of ``column`` (:func:`perfscope.schema.column_codes`)."""
    codes, uniques = column_codes(report.kernels, column)
    return codes, pd.Index(uniques, dtype=object)


def _match_codes(uniques: pd.Index, needle: str, *, exact: bool = False) -> np.ndarray:
    texts = uniques.astype(str)
    if exact:
        return np.flatnonzero(texts == needle)
    return np.flatnonzero(texts.str.contains(needle, case=False, regex=False))


def filter_mask(
    report: Report,
    *,
    phase: str | None = None,
    range_filter: str | None = None,
    name_filter: str | None = None,
) -> np.ndarray:
    """Boolean mask over ``report.kernels`` for a phase (exact; ``none`` = no phase), a range
    substring and a name substring (both case-insensitive)."""
    mask = np.ones(len(report.kernels), dtype=bool)
    if phase not in ALL:
        codes, uniques = _codes(report, "phase")
        if phase == "none":
            mask &= codes < 0
        else:
            mask &= np.isin(codes, _match_codes(uniques, str(phase), exact=True))
    for column, needle in (("range", range_filter), ("name", name_filter)):
        if needle:
            codes, uniques = _codes(report, column)
            mask &= np.isin(codes, _match_codes(uniques, needle.strip()))
    return mask


# ------------------------------------------------------------------ points
def _total_ns(report: Report) -> int:
    return int(report.kernels["duration_ns"].sum()) if len(report.kernels) else 0


def _placeable(df: pd.DataFrame) -> np.ndarray:
    x = pd.to_numeric(df["arith_intensity"], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    y = pd.to_numeric(df["achieved_flops_per_s"], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    with np.errstate(invalid="ignore"):
        return (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)


def _placement(report: Report) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel row: placeable, zero FLOPs (pure data movement), duration in ns."""
    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = report.kernels
        flops = pd.to_numeric(k["flops"], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
        placed = _placeable(k)
        return placed, ~placed & (flops == 0), k["duration_ns"].to_numpy(dtype="float64", na_value=0.0)
    return memo(report, "roofline:placement", build)


def unplaced_in(report: Report, mask: np.ndarray) -> Unplaced:
    """Kernels selected by ``mask`` that the roofline cannot draw, and their time."""
    placed, zero, dur = _placement(report)
    zero = zero & mask
    unknown = ~placed & ~zero & mask
    return Unplaced(int(unknown.sum()), int(dur[unknown].sum()), int(zero.sum()), int(dur[zero].sum()))


def _kernel_frame(df: pd.DataFrame, total_ns: int) -> pd.DataFrame:
    out = pd.DataFrame({
        "key": df.index.astype("int64"),
        "name": df["name"].astype("object"),
        "x": df["arith_intensity"].astype("float64"),
        "y": df["achieved_flops_per_s"].astype("float64"),
        "duration_ns": df["duration_ns"].astype("float64"),
        "count": 1,
    })
    for col in ("bound", "phase", "precision", "op_shapes", "range", "limiter", "roofline_bound"):
        out[col] = df[col].astype("object").where(df[col].notna(), None) if col in df else None
    out["limiter_pct"] = df["limiter_pct"].astype("float64") if "limiter_pct" in df else np.nan
    out["roof_flops_per_s"] = df["roof_flops_per_s"].astype("float64")
    out["pct_of_roof"] = df["pct_of_roof"].astype("float64")
    out["share_pct"] = out["duration_ns"] / max(total_ns, 1) * 100.0
    return out.reset_index(drop=True)


KERNEL_POINT_COLUMNS = ("name", "arith_intensity", "achieved_flops_per_s", "duration_ns", "bound", "phase",
                        "precision", "op_shapes", "range", "roof_flops_per_s", "pct_of_roof", "limiter",
                        "limiter_pct", "roofline_bound")
"""The kernel columns a per-kernel marker reads."""


def _cells(report: Report, frame: pd.DataFrame) -> pd.DataFrame:
    """Merge the per-kernel markers ``frame`` (of ``report``) that share a screen cell and every
    filterable attribute (time-weighted). Cells are grouped on the kernel table's memoized codes
    of the text columns, not on the text itself."""
    at = report.kernels.index.get_indexer(frame["key"].to_numpy())
    codes = {col: (column_codes(report.kernels, col)[0][at], column_codes(report.kernels, col)[1])
             for col in ("name", "range", "phase", "bound", "precision", "op_shapes", "limiter", "roofline_bound")}
    lx, ly = np.log10(frame["x"].to_numpy("float64", na_value=np.nan)), np.log10(frame["y"].to_numpy("float64", na_value=np.nan))
    order = np.argsort(-frame["duration_ns"].to_numpy("float64", na_value=np.nan), kind="stable")  # longest first
    group = np.zeros(len(frame), dtype="int64")
    keys = [np.floor(lx / CELL_DECADES).astype("int64"), np.floor(ly / CELL_DECADES).astype("int64"),
            *(codes[c][0] for c in ("name", "range", "phase", "bound", "precision", "limiter", "roofline_bound"))]
    for key in keys:  # one integer per distinct key, folded a column at a time
        group = pd.factorize(group * (int(key.max(initial=0)) - int(key.min(initial=0)) + 2)
                             + (key - int(key.min(initial=0)) + 1))[0].astype("int64")
    shapes = codes["op_shapes"][0].astype("float64")
    f = pd.DataFrame({
        "row": np.arange(len(frame)), "key": frame["key"].to_numpy(), "shape": np.where(shapes >= 0, shapes, np.nan),
        "duration_ns": frame["duration_ns"].to_numpy("float64", na_value=np.nan), "count": frame["count"].to_numpy(),
        "lx": lx, "ly": ly, "roof_flops_per_s": frame["roof_flops_per_s"].to_numpy("float64", na_value=np.nan),
        "pct_of_roof": frame["pct_of_roof"].to_numpy("float64", na_value=np.nan), "share_pct": frame["share_pct"].to_numpy("float64", na_value=np.nan),
        "limiter_pct": frame["limiter_pct"].to_numpy("float64", na_value=np.nan),
    }).iloc[order]
    out = f.groupby(group[order], sort=False).agg(
        row=("row", "first"), key=("key", "first"), shape=("shape", "first"), duration_ns=("duration_ns", "sum"),
        count=("count", "sum"), lx=("lx", "mean"), ly=("ly", "mean"),
        roof_flops_per_s=("roof_flops_per_s", "first"), pct_of_roof=("pct_of_roof", "mean"),
        share_pct=("share_pct", "sum"), limiter_pct=("limiter_pct", "mean")).reset_index(drop=True)
    rows = out["row"].to_numpy()
    for col in ("name", "range", "phase", "bound", "precision", "limiter", "roofline_bound"):  # constant in a cell
        out[col] = decode(codes[col][0][rows], codes[col][1])
    shape = out["shape"].to_numpy("float64", na_value=np.nan)
    out["op_shapes"] = decode(np.where(np.isnan(shape), -1, np.nan_to_num(shape)).astype("int64"), codes["op_shapes"][1])
    out["x"], out["y"] = 10 ** out["lx"], 10 ** out["ly"]
    return out.drop(columns=["row", "shape", "lx", "ly"])


def _filter_cells(cells: pd.DataFrame, phase: str | None, range_filter: str | None,
                  name_filter: str | None) -> pd.DataFrame:
    """The merged cells a filter keeps (cells never straddle a filter: their key holds its columns)."""
    keep = np.ones(len(cells), dtype=bool)
    if phase not in ALL:
        keep &= cells["phase"].isna().to_numpy() if phase == "none" else (cells["phase"] == phase).to_numpy()
    for column, needle in (("range", range_filter), ("name", name_filter)):
        if needle:
            text = cells[column].astype(str).str.contains(needle.strip(), case=False, regex=False)
            keep &= (text & cells[column].notna()).to_numpy(dtype=bool)
    return cells[keep]


def _kernel_points(report: Report) -> tuple[pd.DataFrame, np.ndarray]:
    """Every placeable kernel as a marker row, and the kernel row positions behind them."""
    def build() -> tuple[pd.DataFrame, np.ndarray]:
        rows = np.flatnonzero(_placement(report)[0])
        return _kernel_frame(rows_at(report.kernels, rows, KERNEL_POINT_COLUMNS), _total_ns(report)), rows
    return memo(report, "roofline:kernels", build)


NAME_AGG_TEXT = ("name", "precision", "phase", "category", "device", "op", "short_name")
"""The kernel text columns the per-name aggregate reads (it also sums time, FLOPs and bytes)."""


@dataclass(frozen=True)
class _NameGroups:
    """The kernels grouped by every column the per-name aggregate reads, and by whether their
    work is known: summing a selection's kernels per group first gives the same aggregate as
    the selection itself, from a table of a few thousand rows instead of a million."""

    code: np.ndarray  # per kernel, its group
    table: pd.DataFrame  # per group, the values of NAME_AGG_TEXT
    duration_ns: np.ndarray  # per kernel
    flops: np.ndarray  # per kernel, 0 where its work is not known
    dram_bytes: np.ndarray
    known: np.ndarray  # per group
    units: dict[str, tuple[np.ndarray, np.ndarray]]  # per measured unit column: per kernel, time x % and time


def _name_groups(report: Report) -> _NameGroups:
    def build() -> _NameGroups:
        k = report.kernels
        flops = pd.to_numeric(k["flops"], errors="coerce").to_numpy("float64", na_value=np.nan)
        nbytes = pd.to_numeric(k["dram_bytes"], errors="coerce").to_numpy("float64", na_value=np.nan)
        known = ~np.isnan(flops) & ~np.isnan(nbytes)
        code = known.astype("int64")
        columns = [c for c in NAME_AGG_TEXT if c in k]
        for col in columns:  # one integer per distinct combination, folded a column at a time
            codes, uniques = column_codes(k, col)
            code = pd.factorize(code * (len(uniques) + 1) + (codes + 1))[0].astype("int64")
        first = np.flatnonzero(~pd.Series(code).duplicated().to_numpy())  # codes number groups by first row
        table = pd.DataFrame({col: decode(column_codes(k, col)[0][first], column_codes(k, col)[1]) for col in columns})
        dur = k["duration_ns"].to_numpy("float64", na_value=0.0)
        units = {}
        for col in UNIT_COLUMNS:  # each measured unit's time-weighted share, so a selection's totals get a limiter
            if col in k:
                v = pd.to_numeric(k[col], errors="coerce").to_numpy("float64", na_value=np.nan)
                units[col] = (np.where(np.isnan(v), 0.0, v * dur), np.where(np.isnan(v), 0.0, dur))
        return _NameGroups(code, table, dur, np.where(known, flops, 0.0), np.where(known, nbytes, 0.0), known[first],
                           units)
    return memo(report, "roofline:name-groups", build)


def _aggregate_rows(report: Report, mask: np.ndarray) -> pd.DataFrame:
    """``aggregate_by_name`` of the kernels ``mask`` selects, summed per :class:`_NameGroups` group first."""
    from perfscope.analysis.summaries.kernels import aggregate_by_name

    g = _name_groups(report)
    code, n = g.code[mask], len(g.table)
    calls = np.bincount(code, minlength=n)
    keep = np.flatnonzero(calls)
    sums = {col: np.bincount(code, weights=w[mask], minlength=n)[keep]
            for col, w in (("duration_ns", g.duration_ns), ("flops", g.flops), ("dram_bytes", g.dram_bytes))}
    known = g.known[keep]
    grouped = g.table.iloc[keep].reset_index(drop=True).assign(
        duration_ns=np.rint(sums["duration_ns"]).astype("int64"),
        flops=np.where(known, sums["flops"], np.nan), dram_bytes=np.where(known, sums["dram_bytes"], np.nan))
    for col, (weighted, weight) in g.units.items():
        total = np.bincount(code, weights=weight[mask], minlength=n)[keep]
        with np.errstate(invalid="ignore", divide="ignore"):
            grouped[col] = np.where(total > 0, np.bincount(code, weights=weighted[mask], minlength=n)[keep] / total,
                                    np.nan)
    return aggregate_by_name(grouped, report.device, calls=calls[keep])


def _name_points(report: Report, mask: np.ndarray) -> pd.DataFrame:
    from ..views import name_aggregate

    agg = name_aggregate(report) if mask.all() else _aggregate_rows(report, mask)
    if not len(agg):
        return _kernel_frame(report.kernels.iloc[:0], 1)
    frame = agg[_placeable(agg)]
    points = pd.DataFrame({
        "key": frame["name"].astype("object"), "name": frame["name"].astype("object"),
        "x": frame["arith_intensity"].astype("float64"), "y": frame["achieved_flops_per_s"].astype("float64"),
        "duration_ns": frame["duration_ns"].astype("float64"), "count": frame["count"].astype("int64"),
    })
    for col in ("bound", "phase", "precision", "limiter", "roofline_bound"):
        points[col] = frame[col].astype("object").where(frame[col].notna(), None) if col in frame else None
    points["limiter_pct"] = frame["limiter_pct"].astype("float64") if "limiter_pct" in frame else np.nan
    points["op_shapes"], points["range"] = None, None
    points["roof_flops_per_s"] = frame["roof_flops_per_s"].astype("float64")
    points["pct_of_roof"] = frame["pct_of_roof"].astype("float64")
    points["share_pct"] = points["duration_ns"] / max(_total_ns(report), 1) * 100.0
    return points.reset_index(drop=True)


def roofline_points(
    report: Report,
    *,
    per: str = "kernel",
    phase: str | None = None,
    range_filter: str | None = None,
    name_filter: str | None = None,
    max_points: int = MAX_POINTS,
    rows: np.ndarray | None = None,
) -> RooflinePoints:
    """The markers of a roofline: one per kernel (``per="kernel"``) or per name (``"name"``).

    Args:
        report: the report to draw.
        per: ``kernel`` (one marker per execution, key = row index in ``report.kernels``) or
            ``name`` (aggregated per kernel name, re-classified on totals; key = the name).
        phase: keep one phase (``prefill``, ``decode``, ``none``); None keeps all.
        range_filter: keep kernels whose range path contains this text.
        name_filter: keep kernels whose name contains this text.
        max_points: above this, markers on the same screen cell merge.
        rows: a boolean mask over ``report.kernels`` to keep as well (the tree tab's node); with
            it, a per-kernel roofline shows the ``max_points`` longest kernels, unmerged.
    """
    if per not in ("kernel", "name"):
        raise ValueError(f"per must be 'kernel' or 'name', not {per!r}")
    mask = filter_mask(report, phase=phase, range_filter=range_filter, name_filter=name_filter)
    if rows is not None:
        mask &= rows
    total, unplaced = _total_ns(report), unplaced_in(report, mask)
    if rows is not None:
        if per == "name":
            return RooflinePoints(_name_points(report, mask), unplaced, total)
        frame, at = _kernel_points(report)
        chosen = frame.take(np.flatnonzero(mask[at]))
        hidden = max(len(chosen) - max_points, 0)
        chosen = chosen.nlargest(max_points, "duration_ns") if hidden else chosen
        return RooflinePoints(chosen.reset_index(drop=True), unplaced, total, False, hidden)
    if per == "name":
        points = memo(report, f"roofline:name:{phase}|{range_filter}|{name_filter}",
                      lambda: _name_points(report, mask))
        return RooflinePoints(points, unplaced, total)
    frame, rows = _kernel_points(report)
    selected = mask[rows]
    if int(selected.sum()) <= max_points:
        return RooflinePoints(frame.take(np.flatnonzero(selected)).reset_index(drop=True), unplaced, total)
    cells = _filter_cells(memo(report, "roofline:cells", lambda: _cells(report, frame)), phase, range_filter, name_filter)
    cells = cells.sort_values("duration_ns", ascending=False, kind="stable")
    hidden = max(len(cells) - max_points, 0)
    return RooflinePoints(cells.head(max_points).reset_index(drop=True), unplaced, total, True, hidden)


# ------------------------------------------------------------------ roofs
def _roof_text(kind: str, label: str, roof_value: float, provenance: str, clock: str | None,
               dense: bool | None) -> str:
    unit = "FLOP/s" if kind == "compute" else "B/s"
    extras = [provenance]
    if dense is not None:
        extras.append("dense" if dense else "sparse")
    if clock:
        extras.append(f"clock {clock}")
    return f"{label} {si(roof_value, unit)} ({', '.join(extras)})"


def roof_lines(device: DeviceSpec | None, precisions: list[str], x_min: float, x_max: float) -> list[RoofLine]:
    """Compute ceilings for ``precisions`` (all of the device's when empty) and memory slopes.

    Each compute roof runs flat from its DRAM ridge point to ``x_max``; each memory level runs
    from ``x_min`` up to where it meets the highest drawn compute roof.
    """
    if device is None:
        return []
    served = _served(device, precisions)
    wanted = list(served) or list(device.compute)
    lines: list[RoofLine] = []
    dram = device.peak_bandwidth("dram")
    top = max((device.compute[p].value for p in wanted), default=None)
    for prec in wanted:
        roof = device.compute[prec]
        start = roof.value / dram if dram else x_min
        lines.append(RoofLine("compute", prec, roof.value, (max(start, x_min), x_max), (roof.value, roof.value),
                              roof.provenance, roof.method, roof.clock, roof.dense,
                              tuple(p for p in served.get(prec, ()) if p != prec)))
    for level, roof in device.memory.items():
        end = (top / roof.value) if top else x_max
        end = min(max(end, x_min), x_max)
        lines.append(RoofLine("memory", level, roof.value, (x_min, end), (roof.value * x_min, roof.value * end),
                              roof.provenance, roof.method, roof.clock, roof.dense))
    return lines


def _served(device: DeviceSpec, precisions: list[str]) -> dict[str, list[str]]:
    """Roof precision -> the kernel ``precisions`` placed against it, in the order met (a narrow
    format without a roof of its own goes to the nearest wider one; precisions with no roof at
    all are left out)."""
    out: dict[str, list[str]] = {}
    for prec in precisions:
        roof = device.roof_precision(prec)
        if roof is not None:
            out.setdefault(roof, []).append(prec)
    return out


def roof_label(line: RoofLine) -> str:
    """Legend text of a roof: label, value, provenance, dense/sparse and clock."""
    text = _roof_text(line.kind, line.label, line.value, line.provenance, line.clock, line.dense)
    return text + (f", also for {', '.join(line.serves)} kernels" if line.serves else "")


def roof_tag(line: RoofLine) -> str:
    """The short text drawn on the figure beside a roof: ``bf16 989 TFLOP/s``, ``DRAM 3.35 TB/s``."""
    unit = "FLOP/s" if line.kind == "compute" else "B/s"
    name = line.label.upper() if line.kind == "memory" else line.label
    serves = f" (+{', '.join(line.serves)})" if line.serves else ""
    return f"{name}{serves} {si(line.value, unit)}"


def ridge_points(device: DeviceSpec | None, precisions: list[str]) -> list[tuple[str, float, float]]:
    """(precision, ridge FLOP/byte, peak FLOP/s) of each drawn compute roof against DRAM."""
    if device is None:
        return []
    wanted = list(_served(device, precisions)) or list(device.compute)
    out = []
    for prec in wanted:
        ridge = device.ridge(prec)
        if ridge:
            out.append((prec, ridge, device.compute[prec].value))
    return out


def x_extent(points: pd.DataFrame, ridges: list[tuple[str, float, float]]) -> tuple[float, float]:
    """Intensity range (FLOP/byte) that shows every point and ridge with a decade of margin."""
    values = list(points["x"]) + [r[1] for r in ridges]
    if not values:
        return 0.01, 1000.0
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    return 10 ** np.floor(np.log10(lo) - 0.5), 10 ** np.ceil(np.log10(hi) + 0.5)
