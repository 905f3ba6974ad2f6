"""Sampled counters (NVML: power, clocks, utilisation) over time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..text import esc
from .messages import message_figure

if TYPE_CHECKING:
    from perfscope.report import Report

COUNTER_UNITS = {
    "gpu_util_pct": "%", "mem_util_pct": "%", "sm_clock_mhz": "MHz", "mem_clock_mhz": "MHz",
    "power_w": "W", "temp_c": "°C", "mem_used_bytes": "bytes",
}


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
