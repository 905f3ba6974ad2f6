"""The roofline figure: kernel points (WebGL above WEBGL_ABOVE), roof lines and ridges.

The points and lines come from :mod:`.roofline_data` (a view-model tested on its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from perfscope.analysis.costs.limiter import bound_label, disagrees, limiter_note, limiter_words

from ..style import BOUND_COLORS, PHASE_COLORS, PHASE_SYMBOLS
from ..text import MISSING, duration, esc, pct, si
from . import roofline_data as rd

if TYPE_CHECKING:
    from perfscope.report import Report

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
        pd.Series(what, index=pts.index) + ", " + pd.Series(
            [esc(bound_label(b, lim)) for b, lim in zip(pts["bound"], pts["limiter"])], index=pts.index) + "-bound, "
        + pts["precision"].map(lambda p: esc(p or "unknown precision")) + ", phase "
        + pts["phase"].map(lambda p: esc(p or "none")) + pd.Series(_limiter_hover(pts), index=pts.index),
    ]
    return np.stack([c.to_numpy(dtype="object") for c in cols], axis=1)


def _limiter_hover(pts: pd.DataFrame) -> list[str]:
    """Per marker, the measured limiter (``<br>measured: the ALU pipe limits it ...``) and, where it disagrees
    with where the FLOPs and bytes put the point, the sentence that says so."""
    out = []
    for row in pts[["bound", "limiter", "limiter_pct", "roofline_bound", "pct_of_roof"]].to_dict("records"):
        if not isinstance(row["limiter"], str):
            out.append("")
            continue
        note = limiter_note(row)
        text = note if note else f"measured: {limiter_words(row['limiter'], row['limiter_pct'])}"
        out.append("<br>" + esc(text) + ("<br><b>the measured limiter disagrees with the roofline</b>" if note else ""))
    return out


def limiter_disagreements(points: pd.DataFrame) -> int:
    """How many markers' measured limiter contradicts the roofline's reading of their FLOPs and bytes."""
    if "roofline_bound" not in points:
        return 0
    return sum(disagrees(r, b) for r, b in zip(points["roofline_bound"], points["bound"]))


ROOFLINE_HOVER = (
    "<b>%{customdata[1]}</b><br>shapes: %{customdata[2]}<br>"
    "intensity %{x:.3g} FLOP/B<br>achieved %{y:.3s}FLOP/s of attainable %{customdata[3]} (%{customdata[4]})<br>"
    "time %{customdata[5]}, %{customdata[6]} of kernel time<br>%{customdata[7]}<extra></extra>"
)


def _marker_sizes(durations: pd.Series, dmax: float) -> np.ndarray:
    return 6.0 + 28.0 * np.sqrt(durations.to_numpy(dtype="float64", na_value=np.nan) / max(dmax, 1.0))


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


LEVEL_MARKERS = {"l2": "diamond-open", "l1": "square-open", "shared": "triangle-up-open"}
"""Hierarchical roofline: each kernel's point at a cache level's intensity (same FLOP/s, its FLOPs over
that level's bytes), drawn hollow beside the filled DRAM point, as Nsight Compute and rocprof-compute do."""


def _level_traces(report: Report, data: rd.RooflinePoints, per: str) -> list[go.Scatter]:
    """One hollow marker per kernel and cache level it has bytes for (L2, L1, shared/LDS), at the
    kernel's FLOP/s and its intensity against that level; only for per-kernel figures whose markers
    are single kernels."""
    k = report.kernels
    if per != "kernel" or data.merged or not len(data.points) or "flops" not in k:
        return []
    rows = pd.Index(data.points["key"]).intersection(k.index)
    flops = pd.to_numeric(k.loc[rows, "flops"], errors="coerce")
    seconds = pd.to_numeric(k.loc[rows, "duration_ns"], errors="coerce") * 1e-9
    traces = []
    for level, symbol in LEVEL_MARKERS.items():
        col = f"{level}_bytes"
        if col not in k:
            continue
        nbytes = pd.to_numeric(k.loc[rows, col], errors="coerce")
        ok = (nbytes > 0) & (flops > 0) & (seconds > 0)
        if not ok.any():
            continue
        names = k.loc[rows[ok.to_numpy()], "name"].astype(str).map(lambda n: esc(n, 80))
        traces.append(go.Scatter(
            x=(flops[ok] / nbytes[ok]).to_numpy(), y=(flops[ok] / seconds[ok]).to_numpy(), mode="markers",
            name=f"{level.upper()} intensity", legendgroup="levels", text=names.to_numpy(),
            hovertemplate=f"%{{text}}<br>{level.upper()}: %{{x:.3g}} FLOP/B, %{{y:.3g}} FLOP/s<extra></extra>",
            marker={"symbol": symbol, "size": 8, "color": "#555", "opacity": 0.7},
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
    differ = limiter_disagreements(data.points)
    if differ:
        parts.append(f"{differ:,} marker(s) sit where their FLOPs and bytes put them, but the limiter Nsight Compute "
                     "or rocprof-compute measured gives another bound (colour and hover say which)")
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
                    + _point_traces(data, color) + _level_traces(report, data, per))
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
