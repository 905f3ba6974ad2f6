"""Every perfscope figure: pure functions from a Report to a plotly ``Figure``.

The Dash app, the standalone HTML report and the notebook API (``report.roofline()``) all call
these, so a figure looks the same everywhere. Text that comes from a report (kernel names,
range names, device names) is HTML-escaped before it reaches plotly, which renders a subset of
HTML in hover labels, legends and annotations.

The data behind the two large figures lives in :mod:`.roofline_data` and :mod:`.timeline_data`
(view-models, tested on their own); the smaller figures are in :mod:`.figures_more`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.report import Report

from . import roofline_data as rd
from . import timeline_data as td
from .figures_more import (
    COMPARE_TOP,
    compare,
    counters,
    latency_distributions,
    message_figure,
    phase_breakdown,
    step_times,
)
from .style import BOUND_COLORS, CATEGORY_COLORS, PHASE_COLORS, PHASE_SYMBOLS
from .text import MISSING, duration, esc, pct, si

__all__ = [
    "BOUND_COLORS",
    "COMPARE_TOP",
    "PHASE_COLORS",
    "PHASE_SYMBOLS",
    "compare",
    "counters",
    "latency_distributions",
    "message_figure",
    "phase_breakdown",
    "roofline",
    "step_times",
    "timeline",
]

WEBGL_ABOVE = 2000
"""Scatter traces with more points than this use WebGL."""


# ====================================================================== roofline
def _phase_key(value: object) -> str:
    return value if isinstance(value, str) and value in PHASE_SYMBOLS else "none"


def _hover_data(pts: pd.DataFrame, merged: bool) -> np.ndarray:
    count = pts["count"].astype("int64")
    what = np.where(count > 1, count.astype(str) + (" kernels merged" if merged else " executions"), "1 kernel")
    cols = [
        pts["key"].astype("object"),
        pts["name"].map(lambda s: esc(s, 110)),
        pts["op_shapes"].map(lambda s: esc(s, 110) if isinstance(s, str) else MISSING),
        pts["roof_flops_per_s"].map(lambda v: si(v, "FLOP/s")),
        pts["pct_of_roof"].map(pct),
        pts["duration_ns"].map(duration),
        pts["share_pct"].map(lambda v: pct(v, 2)),
        pd.Series(what, index=pts.index) + ", " + pts["bound"].map(lambda b: esc(b or "unknown")) + "-bound, "
        + pts["precision"].map(lambda p: esc(p or "unknown precision")) + ", phase "
        + pts["phase"].map(lambda p: esc(p or "none")),
    ]
    return np.stack([c.to_numpy(dtype="object") for c in cols], axis=1)


ROOFLINE_HOVER = (
    "<b>%{customdata[1]}</b><br>shapes: %{customdata[2]}<br>"
    "intensity %{x:.3g} FLOP/B<br>achieved %{y:.3s}FLOP/s of attainable %{customdata[3]} (%{customdata[4]})<br>"
    "time %{customdata[5]}, %{customdata[6]} of kernel time<br>%{customdata[7]}<extra></extra>"
)


def _marker_sizes(durations: pd.Series, dmax: float) -> np.ndarray:
    return 6.0 + 28.0 * np.sqrt(durations.to_numpy(dtype="float64") / max(dmax, 1.0))


def _point_traces(data: rd.RooflinePoints, color: str) -> list[go.Scatter | go.Scattergl]:
    pts = data.points
    if not len(pts):
        return []
    pts = pts.assign(_phase=pts["phase"].map(_phase_key),
                     _bound=pts["bound"].map(lambda b: b if b in BOUND_COLORS else "unknown"))
    dmax = float(pts["duration_ns"].max())
    key = "_bound" if color == "bound" else "_phase"
    palette = BOUND_COLORS if color == "bound" else PHASE_COLORS
    traces: list[go.Scatter | go.Scattergl] = []
    for (group, phase), sub in pts.groupby([key, "_phase"], sort=True):
        kind = go.Scattergl if len(pts) > WEBGL_ABOVE else go.Scatter
        label = f"{group}-bound" if color == "bound" else str(group)
        if color == "bound":
            label += f" · {phase}" if phase != "none" else ""
        traces.append(kind(
            x=sub["x"].to_numpy(), y=sub["y"].to_numpy(), mode="markers", name=label,
            legendgroup="points", customdata=_hover_data(sub, data.merged), hovertemplate=ROOFLINE_HOVER,
            marker={"size": _marker_sizes(sub["duration_ns"], dmax), "color": palette[group],
                    "symbol": PHASE_SYMBOLS[phase], "opacity": 0.75, "line": {"width": 0.5, "color": "#333"}},
        ))
    return traces


ROOF_COLORS = {"fp64": "#6a3d9a", "fp64_tensor": "#6a3d9a", "fp32": "#1f4e79", "tf32": "#2c7fb8",
               "bf16": "#222222", "fp16": "#444444", "fp8": "#b15928", "fp6": "#e31a1c", "fp4": "#d62728",
               "int8": "#33a02c", "int4": "#1b7837"}
"""Line colour of each precision's compute roof (memory roofs are grey)."""


def _roof_traces(lines: list[rd.RoofLine], ridges: list[tuple[str, float, float]]) -> list[go.Scatter]:
    traces = []
    for line in lines:
        color = ROOF_COLORS.get(line.label, "#222") if line.kind == "compute" else "#555"
        traces.append(go.Scatter(
            x=list(line.x), y=list(line.y), mode="lines", name=esc(rd.roof_label(line)), legendgroup="roofs",
            line={"color": color, "dash": "solid" if line.label in ("dram",) or line.kind == "compute" else "dot",
                  "width": 2},
            hovertemplate=f"{esc(rd.roof_label(line))}<br>{esc(line.method, 160)}<extra></extra>",
        ))
    tags = {line.label: rd.roof_tag(line) for line in lines if line.kind == "compute"}
    traces.extend(_roof_tags([x for x in lines if x.kind == "memory" or x.label not in {r[0] for r in ridges}]))
    if ridges:
        traces.append(go.Scatter(
            x=[r[1] for r in ridges], y=[r[2] for r in ridges], mode="markers+text", name="ridge points",
            text=[f"{esc(tags.get(p, p))}, ridge {r:,.0f} FLOP/B" if r >= 100 else f"{esc(tags.get(p, p))}, ridge "
                  f"{r:.3g} FLOP/B" for p, r, _ in ridges], textposition="middle left",
            textfont={"size": 10}, marker={"symbol": "x", "size": 10, "color": "#000"}, legendgroup="roofs",
            hovertemplate="%{text}<extra></extra>",
        ))
    return traces


def _roof_tags(lines: list[rd.RoofLine]) -> list[go.Scatter]:
    """Roof names and values written on the figure where no ridge point carries them: at the
    middle (in log space) of a memory slope, at the right end of a compute roof without a ridge
    (no DRAM bandwidth). A compute roof's name and value are the text of its ridge point."""
    if not lines:
        return []
    xs, ys, texts, colors = [], [], [], []
    for line in lines:
        if line.kind == "compute":
            xs.append(line.x[1])
            ys.append(line.y[1])
        else:
            xs.append(float(np.sqrt(line.x[0] * line.x[1])))
            ys.append(float(np.sqrt(line.y[0] * line.y[1])))
        texts.append(esc(rd.roof_tag(line)))
        colors.append(ROOF_COLORS.get(line.label, "#222") if line.kind == "compute" else "#555")
    return [go.Scatter(x=xs, y=ys, mode="text", text=texts, textposition="top left", showlegend=False,
                       textfont={"size": 11, "color": colors}, legendgroup="roofs", hoverinfo="skip",
                       name="roof labels")]


def _unplaced_note(data: rd.RooflinePoints) -> str:
    u, total = data.unplaced, max(data.total_ns, 1)
    parts = []
    if u.unknown_count:
        parts.append(f"{u.unknown_count:,} kernels with unknown FLOPs or bytes ({duration(u.unknown_ns)}, "
                     f"{pct(u.unknown_ns / total * 100)} of kernel time) cannot be placed")
    if u.zero_flops_count:
        parts.append(f"{u.zero_flops_count:,} with zero FLOPs (data movement, {duration(u.zero_flops_ns)}) "
                     "are off the log axis")
    if data.merged:
        parts.append(f"kernels within {rd.CELL_DECADES} decade merged into {len(data.points):,} markers")
    if data.hidden:
        parts.append(f"{data.hidden:,} smallest markers hidden")
    return "<br>".join(parts)


def roofline(
    report: Report,
    *,
    per: str = "kernel",
    color: str = "bound",
    phase: str | None = None,
    range_filter: str | None = None,
    name_filter: str | None = None,
    max_points: int = rd.MAX_POINTS,
    rows: np.ndarray | None = None,
) -> go.Figure:
    """Log-log roofline: compute roofs per precision, memory roofs per level, ridge points and
    one marker per kernel (or per name), sized by time, coloured by bound or phase, with the
    phase as the marker symbol.

    Args:
        report: the report to draw.
        per: ``kernel`` or ``name`` (aggregated per kernel name).
        color: ``bound`` or ``phase``.
        phase, range_filter, name_filter, rows: see :func:`.roofline_data.roofline_points`.
        max_points: markers above this merge per screen cell.

    Each marker's ``customdata[0]`` is its key (kernel row index, or name) for click-through.
    """
    if color not in ("bound", "phase"):
        raise ValueError(f"color must be 'bound' or 'phase', not {color!r}")
    data = rd.roofline_points(report, per=per, phase=phase, range_filter=range_filter,
                              name_filter=name_filter, max_points=max_points, rows=rows)
    device = report.device
    precisions = sorted({p for p in data.points["precision"] if isinstance(p, str)})  # one roof each
    ridges = rd.ridge_points(device, precisions)
    x_min, x_max = rd.x_extent(data.points, ridges)
    fig = go.Figure(_roof_traces(rd.roof_lines(device, precisions, x_min, x_max), ridges)
                    + _point_traces(data, color))
    what = "each kernel execution" if per == "kernel" else "kernel names (totals)"
    title = f"Roofline of {what}: {esc(report.name)} on {esc(device.name if device else 'unknown device (no roofs)')}"
    fig.update_layout(
        title={"text": title}, xaxis={"type": "log", "title": "arithmetic intensity (FLOP/byte)",
                                      "range": [np.log10(x_min), np.log10(x_max)]},
        yaxis={"type": "log", "title": "performance (FLOP/s)"}, template="plotly_white",
        legend={"groupclick": "toggleitem"}, margin={"t": 90}, height=560, clickmode="event",
        meta={"kind": "roofline", "per": per, "points": len(data.points)},
    )
    note = _unplaced_note(data)
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=1.0, yanchor="bottom",
                           xanchor="left", showarrow=False, align="left", font={"size": 11, "color": "#444"})
    if device is None:
        fig.add_annotation(text="no device roofs in this report: bounds are unknown", xref="paper",
                           yref="paper", x=0.5, y=0.5, showarrow=False)
    return fig


# ====================================================================== timeline
def _bar_traces(views: list[td.LaneView]) -> list[go.Bar]:
    rows: dict[str, list[tuple[str, float, float, str, str]]] = {}
    for view in views:
        lane, sl = view.lane, view.exact
        assert sl is not None and view.mask is not None
        pos = np.arange(sl.start, sl.stop)[view.mask]
        label = esc(lane.label)
        for i in pos:
            start, end = int(lane.starts[i]), int(lane.ends[i])
            group = str(lane.groups[i])
            rows.setdefault(group, []).append((label, start / 1e6, (end - start) / 1e6,
                                               esc(lane.names[i], 120), duration(end - start)))
    traces = []
    for group, items in sorted(rows.items()):
        labels, base, width, names, durs = zip(*items)
        traces.append(go.Bar(
            y=list(labels), base=list(base), x=list(width), orientation="h", name=esc(group),
            marker={"color": CATEGORY_COLORS.get(group, "#8c564b")}, legendgroup="items",
            customdata=np.stack([np.array(names, dtype=object), np.array(durs, dtype=object)], axis=1),
            hovertemplate="%{customdata[0]}<br>%{y}<br>start %{base:.4f} ms, %{customdata[1]}<extra></extra>",
        ))
    return traces


def _heat_trace(views: list[td.LaneView], edges: np.ndarray) -> go.Heatmap:
    """Busy bins of the binned lanes, as one heatmap row per lane of the figure.

    The heatmap carries a row for every lane (all-NaN for lanes drawn as exact bars): plotly.js
    reorders a heatmap's rows by the category axis' ``categoryarray`` and reads a row for each
    category, so a heatmap whose ``y`` lacks some categories throws in the browser ("Cannot read
    properties of undefined (reading 'length')") and stops every figure after it.
    """
    centers = (edges[:-1] + edges[1:]) / 2e6
    blank = np.full(len(centers), np.nan)
    z = np.vstack([np.where(v.busy_pct > 0, v.busy_pct, np.nan) if v.busy_pct is not None else blank
                   for v in views])
    counts = np.vstack([v.counts if v.counts is not None else np.zeros(len(centers), dtype="int64")
                        for v in views])
    return go.Heatmap(
        x=centers, y=[esc(v.lane.label) for v in views], z=np.round(z, 2), customdata=counts,
        zmin=0, zmax=100, colorscale="Blues", colorbar={"title": {"text": "busy %"}, "len": 0.6},
        hovertemplate="%{y}<br>t %{x:.4f} ms<br>busy %{z:.1f}%<br>%{customdata} starting here<extra></extra>",
        name="busy share", showscale=True, xgap=0, ygap=2, hoverongaps=False,
    )


def _counter_traces(report: Report, origin: int, t0: int, t1: int) -> list[go.Scatter]:
    c = report.counters
    if not len(c):
        return []
    t = c["t_ns"].to_numpy(dtype="int64") - origin
    sel = (t >= t0) & (t <= t1)
    traces = []
    for col in ("gpu_util_pct", "mem_util_pct"):
        values = c[col].to_numpy(dtype="float64", na_value=np.nan)[sel]
        if np.isfinite(values).any():
            traces.append(go.Scatter(x=t[sel] / 1e6, y=values, mode="lines", name=col, legendgroup="counters"))
    return traces


def _lod_note(view: td.TimelineView) -> str:
    if not view.binned:
        return f"{view.items_in_window:,} kernels and copies in view, drawn individually"
    width = (view.t1_ns - view.t0_ns) / max(len(view.edges_ns) - 1, 1)
    return (f"{view.items_in_window:,} kernels and copies in view: showing the busy share of each "
            f"{duration(width)} bin; zoom in to see individual kernels")


def timeline(
    report: Report,
    *,
    t0_ns: int | None = None,
    t1_ns: int | None = None,
    max_items: int = 3000,
    bins: int = 800,
) -> go.Figure:
    """Timeline with a lane per device/stream (or CPU thread), range and phase lanes, memcpy
    lanes and GPU utilisation counters, with level of detail.

    Args:
        report: the report to draw.
        t0_ns, t1_ns: window in ns from the report's first event (default: everything).
        max_items: above this many kernels and copies in the window, lanes show busy bins.
        bins: bins across the window in binned mode.
    """
    view = td.timeline_view(report, t0_ns=t0_ns, t1_ns=t1_ns, max_items=max_items, bins=bins)
    if not view.lanes:
        return message_figure("nothing to draw: the report has no kernels, copies or ranges", "timeline")
    exact = [v for v in view.lanes if v.exact is not None]
    heat = [v for v in view.lanes if v.busy_pct is not None]
    counters_ = _counter_traces(report, td.timeline_index(report).origin_ns, view.t0_ns, view.t1_ns)
    rows = 2 if counters_ else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, row_heights=[0.8, 0.2][:rows] if rows == 2 else None,
                        vertical_spacing=0.04)
    for trace in _bar_traces(exact) + ([_heat_trace(list(view.lanes), view.edges_ns)] if heat else []):
        fig.add_trace(trace, row=1, col=1)
    for trace in counters_:
        fig.add_trace(trace, row=2, col=1)
    labels = [esc(v.lane.label) for v in view.lanes]
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=labels[::-1], row=1, col=1)
    fig.update_xaxes(range=[view.t0_ns / 1e6, view.t1_ns / 1e6], row=rows, col=1,
                     title_text="time since first event (ms)")
    fig.update_layout(
        title={"text": f"Timeline: {esc(report.name)}"}, barmode="overlay", template="plotly_white",
        height=max(160 + 30 * len(labels), 380) + (120 if rows == 2 else 0), bargap=0.25,
        margin={"l": 160, "t": 80},
        meta={"kind": "timeline", "binned": view.binned, "t0_ns": view.t0_ns, "t1_ns": view.t1_ns,
              "items": view.items_in_window},
    )
    fig.add_annotation(text=_lod_note(view), xref="paper", yref="paper", x=0, y=1.0, yanchor="bottom",
                       xanchor="left", showarrow=False, font={"size": 11, "color": "#444"})
    return fig
