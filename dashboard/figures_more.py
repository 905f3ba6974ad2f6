"""The smaller figures: phase breakdown, step times, latency distributions, counters, compare.

Re-exported by :mod:`perfscope.dashboard.figures`; import them from there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.analysis.compare import Comparison
from perfscope.analysis.compare import compare as compare_reports
from perfscope.format import MISSING, seconds, signed
from perfscope.report import Report
from perfscope.schema import column_codes

from .style import CATEGORY_COLORS
from .text import esc

PHASE_ORDER = ("prefill", "decode", "none")
COMPARE_TOP = 25
"""How many names the compare views (dashboard, HTML) show: the top of ``perfscope compare``'s movers."""
COUNTER_UNITS = {
    "gpu_util_pct": "%", "mem_util_pct": "%", "sm_clock_mhz": "MHz", "mem_clock_mhz": "MHz",
    "power_w": "W", "temp_c": "°C", "mem_used_bytes": "bytes",
}


def message_figure(text: str, kind: str = "message") -> go.Figure:
    """An empty figure that says why there is nothing to draw."""
    fig = go.Figure()
    fig.add_annotation(text=esc(text), xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font={"size": 14, "color": "#555"})
    # no styled template: axes are hidden, and copying one costs more than the rest of the figure
    fig.update_layout(template="none", paper_bgcolor="white", plot_bgcolor="white", xaxis={"visible": False},
                      yaxis={"visible": False}, height=260, meta={"kind": kind, "empty": True})
    return fig


def _phase_labels(series: pd.Series) -> pd.Series:
    return series.astype("object").where(series.notna(), "none").astype(str)


def phase_breakdown(report: Report) -> go.Figure:
    """Kernel time per phase (prefill, decode, none), stacked by kernel category."""
    k = report.kernels
    if not len(k):
        return message_figure("no kernels in this report", "phase_breakdown")
    # summed on the table's integer codes (a 1M-kernel table has a few phases and categories)
    p_codes, phases = column_codes(k, "phase")
    c_codes, cats = column_codes(k, "category")
    p_labels = [str(p) for p in phases] + ["none"]  # code -1 (missing) -> the last label
    c_labels = [str(c) for c in cats] + ["other"]
    cell = np.where(p_codes < 0, len(phases), p_codes) * len(c_labels) + np.where(c_codes < 0, len(cats), c_codes)
    shape = (len(p_labels), len(c_labels))
    ms = np.bincount(cell, weights=k["duration_ns"].to_numpy(np.float64) / 1e6, minlength=shape[0] * shape[1])
    seen = np.bincount(cell, minlength=shape[0] * shape[1]).reshape(shape) > 0
    table = pd.DataFrame(ms.reshape(shape), index=p_labels, columns=c_labels)
    table = table.loc[seen.any(axis=1), seen.any(axis=0)]
    table = table.T.groupby(level=0, sort=False).sum().T.groupby(level=0, sort=False).sum()  # a phase named "none"
    order = [p for p in PHASE_ORDER if p in table.index] + [p for p in table.index if p not in PHASE_ORDER]
    table = table.reindex(order)
    fig = go.Figure()
    for cat in table.sum().sort_values(ascending=False).index:
        fig.add_trace(go.Bar(y=[esc(p) for p in table.index], x=table[cat].to_numpy(), name=esc(cat),
                             marker={"color": CATEGORY_COLORS.get(str(cat), "#8c564b")},
                             orientation="h", hovertemplate="%{y}: %{x:.3f} ms<extra>" + esc(cat) + "</extra>"))
    fig.update_layout(barmode="stack", template="plotly_white", title={"text": "Kernel time per phase"},
                      xaxis={"title": "kernel time (ms)"}, height=200 + 50 * len(table),
                      meta={"kind": "phase_breakdown"})
    return fig


def step_times(report: Report) -> go.Figure:
    """Duration of each engine step, coloured by phase, with its batch and token counts."""
    s = report.steps
    if not len(s):
        return message_figure("no engine steps in this report (only `perfscope profile` records them)",
                              "step_times")
    fig = go.Figure()
    for phase, sub in s.groupby(_phase_labels(s["phase"]), sort=False):
        data = np.stack([sub["batch"].astype("object").to_numpy(), sub["tokens"].astype("object").to_numpy(),
                         sub["context_len"].astype("object").to_numpy()], axis=1)
        fig.add_trace(go.Scatter(
            x=sub["step"].to_numpy(), y=sub["duration_ns"].astype("float64").to_numpy() / 1e6,
            mode="markers+lines" if phase == "decode" else "markers", name=esc(phase), customdata=data,
            hovertemplate="step %{x}: %{y:.3f} ms<br>batch %{customdata[0]}, tokens %{customdata[1]}, "
                          "context %{customdata[2]}<extra>" + esc(phase) + "</extra>",
        ))
    fig.update_layout(template="plotly_white", title={"text": "Step times"}, xaxis={"title": "step"},
                      yaxis={"title": "duration (ms)"}, height=360, meta={"kind": "step_times"})
    return fig


LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_mean_s", "ITL (mean per request)"), ("e2e_s", "E2E"))


def latency_distributions(report: Report) -> go.Figure:
    """Per-request TTFT, TPOT, ITL and end-to-end latency distributions (ms)."""
    r = report.requests
    present = [(col, title) for col, title in LATENCIES if col in r and r[col].notna().any()]
    if not len(r) or not present:
        return message_figure("no request latencies in this report", "latency_distributions")
    fig = make_subplots(rows=1, cols=len(present), subplot_titles=[t for _, t in present])
    for i, (col, title) in enumerate(present, start=1):
        fig.add_trace(go.Box(y=r[col].astype("float64").to_numpy() * 1e3, name=title, boxpoints="all",
                             jitter=0.4, showlegend=False, hovertemplate="%{y:.3f} ms<extra>" + title + "</extra>"),
                      row=1, col=i)
        fig.update_yaxes(title_text="ms", row=1, col=i)
    fig.update_layout(template="plotly_white", title={"text": f"Request latencies ({len(r)} requests)"},
                      height=380, meta={"kind": "latency_distributions"})
    return fig


def counters(report: Report) -> go.Figure:
    """NVML counter series (one panel per metric present), on the timeline's time axis."""
    from .timeline_data import timeline_index

    c = report.counters
    metrics = [m for m in COUNTER_UNITS if m in c and c[m].notna().any()]
    if not len(c) or not metrics:
        return message_figure("no counter samples in this report (NVML sampling records them on GPUs)",
                              "counters")
    origin = timeline_index(report).origin_ns
    t_ms = (c["t_ns"].to_numpy(dtype="int64") - origin) / 1e6
    devices = c["device"].astype("object").fillna("gpu").astype(str) if "device" in c else pd.Series("gpu", c.index)
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=[f"{m} ({COUNTER_UNITS[m]})" for m in metrics])
    for i, metric in enumerate(metrics, start=1):
        for dev in sorted(devices.unique()):
            sel = (devices == dev).to_numpy()
            fig.add_trace(go.Scatter(x=t_ms[sel], y=c[metric].astype("float64").to_numpy()[sel], mode="lines",
                                     name=f"{esc(dev)} {metric}", showlegend=len(devices.unique()) > 1),
                          row=i, col=1)
    fig.update_xaxes(title_text="time since first event (ms)", row=len(metrics), col=1)
    fig.update_layout(template="plotly_white", title={"text": "Counters"}, height=150 + 140 * len(metrics),
                      meta={"kind": "counters"})
    return fig


def compare(a: Report, b: Report, top: int = COMPARE_TOP, comparison: Comparison | None = None) -> go.Figure:
    """Kernel time per name in two reports side by side, largest change first, with the delta and
    any bound shift: the rows of ``perfscope compare A B`` (:func:`perfscope.analysis.compare.compare`)."""
    c = comparison if comparison is not None else compare_reports(a, b)
    table = c.by_name.head(top)
    if not len(table):
        return message_figure("neither report has kernels to compare", "compare")
    names = [esc(n, 70) for n in table["name"]][::-1]
    shift = [f"{esc(x) if isinstance(x, str) else MISSING} → {esc(y) if isinstance(y, str) else MISSING}"
             for x, y in zip(table["bound_a"], table["bound_b"])][::-1]
    delta = [signed(seconds(d), d) for d in table["delta_s"]][::-1]
    data = np.stack([np.array(shift, dtype=object), np.array(delta, dtype=object)], axis=1)
    fig = go.Figure()
    for side, report, colr in (("a", a, "#1f77b4"), ("b", b, "#ff7f0e")):
        fig.add_trace(go.Bar(
            y=names, x=table[f"time_{side}_s"].to_numpy()[::-1] * 1e3, orientation="h",
            name=f"{side.upper()}: {esc(report.name)}", marker={"color": colr}, customdata=data,
            hovertemplate="%{y}<br>%{x:.3f} ms<br>delta B-A %{customdata[1]}<br>bound %{customdata[0]}<extra></extra>",
        ))
    fig.update_layout(barmode="group", template="plotly_white", height=220 + 26 * len(table),
                      title={"text": f"Kernel time per {esc(c.key)}, largest change first: "
                                     f"{esc(a.name)} (A) vs {esc(b.name)} (B)"},
                      xaxis={"title": "total kernel time (ms)"}, margin={"l": 360}, meta={"kind": "compare"})
    return fig
