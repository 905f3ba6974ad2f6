"""Time per phase and category, and the step times of an engine run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from perfscope.schema import column_codes

from ..style import CATEGORY_COLORS
from ..text import duration, esc
from .messages import message_figure

if TYPE_CHECKING:
    from perfscope.report import Report

PHASE_ORDER = ("prefill", "decode", "none")
NONE_ROW_MIN_SHARE = 0.005
"""The time outside any phase (``none``) gets a bar from this share of the plotted time on; below it
the bar would be an empty row, so the title says its time instead."""


def _phase_labels(series: pd.Series) -> pd.Series:
    return series.astype("object").where(series.notna(), "none").astype(str)


def phase_breakdown(report: Report) -> go.Figure:
    """Kernel time per phase (prefill, decode, none: outside any phase, drawn when it is at least
    :data:`NONE_ROW_MIN_SHARE` of the time), stacked by kernel category; operator time on a CPU run."""
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
    ms = np.bincount(cell, weights=k["duration_ns"].to_numpy(np.float64, na_value=np.nan) / 1e6, minlength=shape[0] * shape[1])
    seen = np.bincount(cell, minlength=shape[0] * shape[1]).reshape(shape) > 0
    table = pd.DataFrame(ms.reshape(shape), index=p_labels, columns=c_labels)
    table = table.loc[seen.any(axis=1), seen.any(axis=0)]
    table = table.T.groupby(level=0, sort=False).sum().T.groupby(level=0, sort=False).sum()  # a phase named "none"
    order = [p for p in PHASE_ORDER if p in table.index] + [p for p in table.index if p not in PHASE_ORDER]
    table = table.reindex(order)
    total = float(table.to_numpy().sum())
    outside = float(table.loc["none"].sum()) if "none" in table.index else 0.0
    hidden = ""
    if "none" in table.index and len(table) > 1 and outside < NONE_ROW_MIN_SHARE * total:
        table = table.drop(index="none")  # a bar too thin to see: said in the title instead
        hidden = f" ({duration(outside * 1e6)} outside any phase, {100 * outside / total:.2g}%, not drawn)"
    from perfscope.analysis.summaries.kernels import is_cpu_report

    what = "Operator time (summed over threads)" if is_cpu_report(report) else "Kernel time"
    fig = go.Figure()
    for cat in table.sum().sort_values(ascending=False).index:
        fig.add_trace(go.Bar(y=[esc(p) for p in table.index], x=table[cat].to_numpy(), name=esc(cat),
                             marker={"color": CATEGORY_COLORS.get(str(cat), "#8c564b")},
                             orientation="h", hovertemplate="%{y}: %{x:.3f} ms<extra>" + esc(cat) + "</extra>"))
    fig.update_layout(barmode="stack", template="plotly_white", title={"text": f"{what} per phase{hidden}"},
                      xaxis={"title": f"{what.split(' (')[0].lower()} (ms)"}, height=200 + 50 * len(table),
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
