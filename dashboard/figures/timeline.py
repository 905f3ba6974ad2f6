"""The timeline figure: lanes of GPU and CPU work at a level of detail that fits
the window, counters below.

The lanes come from :mod:`.timeline_data` (a view-model tested on its own).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..style import CATEGORY_COLORS
from ..text import duration, esc
from . import timeline_data as td
from .messages import message_figure

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perfscope.report import Report


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


def highlight(fig: go.Figure, spans_ms: Sequence[Sequence[float]], label: str, max_spans: int = 200) -> go.Figure:
    """``fig`` (a :func:`timeline`) with the places a finding selected (``[start, end]`` in ms from
    the timeline's origin, its x axis) shaded across every lane, those in the drawn window only;
    ``label`` (the finding's id) names them on hover of the first."""
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    t0, t1 = meta.get("t0_ns"), meta.get("t1_ns")
    lo = t0 / 1e6 if isinstance(t0, (int, float)) else -math.inf
    hi = t1 / 1e6 if isinstance(t1, (int, float)) else math.inf
    shown = [(float(s), float(e)) for s, e in spans_ms[:max_spans] if float(e) >= lo and float(s) <= hi]
    for s, e in shown:
        fig.add_vrect(x0=s, x1=max(e, s + 1e-6), fillcolor="#ff7f0e", opacity=0.25, line_width=0, layer="below",
                      row=1, col=1)
    fig.update_layout(meta={**meta, "selected": len(shown), "selected_label": label})
    return fig
