"""Two reports side by side: per phase and per kernel name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from perfscope.analysis.summaries.compare import Comparison
from perfscope.analysis.summaries.compare import compare as compare_reports
from perfscope.format import MISSING, seconds, signed

from ..text import esc
from .messages import message_figure

if TYPE_CHECKING:
    from perfscope.report import Report

COMPARE_TOP = 25
"""How many names the compare views (dashboard, HTML) show: the top of ``perfscope compare``'s movers."""


def compare(a: Report, b: Report, top: int = COMPARE_TOP, comparison: Comparison | None = None) -> go.Figure:
    """Kernel time per name in two reports side by side, largest change first, with the delta and
    any bound shift: the rows of ``perfscope compare A B`` (:func:`perfscope.analysis.summaries.compare.compare`)."""
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
