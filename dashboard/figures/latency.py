"""Distributions of the per-request latencies (TTFT, TPOT, ITL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .messages import message_figure

if TYPE_CHECKING:
    from perfscope.report import Report

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_mean_s", "ITL (mean per request)"), ("e2e_s", "E2E"))


def latency_distributions(report: Report) -> go.Figure:
    """Per-request TTFT, TPOT, ITL and end-to-end latency distributions (ms), of the headline run (the
    warm unprofiled one when the report holds it, as the request table beside it), the run said in the title."""
    headline = len(report.requests_unprofiled) > 0
    r = report.requests_unprofiled if headline else report.requests
    run = "headline: warm run without the profiler" if headline else (
        "the profiled run" if len(report.steps_unprofiled) else "")
    present = [(col, title) for col, title in LATENCIES if col in r and r[col].notna().any()]
    if not len(r) or not present:
        return message_figure("no request latencies in this report", "latency_distributions")
    fig = make_subplots(rows=1, cols=len(present), subplot_titles=[t for _, t in present])
    for i, (col, title) in enumerate(present, start=1):
        fig.add_trace(go.Box(y=r[col].astype("float64").to_numpy() * 1e3, name=title, boxpoints="all",
                             jitter=0.4, showlegend=False, hovertemplate="%{y:.3f} ms<extra>" + title + "</extra>"),
                      row=1, col=i)
        fig.update_yaxes(title_text="ms", row=1, col=i)
    what = f"{len(r)} requests" + (f"; {run}" if run else "")
    fig.update_layout(template="plotly_white", title={"text": f"Request latencies ({what})"},
                      height=380, meta={"kind": "latency_distributions"})
    return fig
