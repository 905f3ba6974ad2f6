"""Figures of a sweep report (``perfscope sweep``): decode's roofline trajectory as batch grows,
TTFT against prompt length, and the throughput-latency curve.

All read :func:`perfscope.analysis.summaries.sweep.sweep_summary`, one row per (batch, prompt length) run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from perfscope.analysis.summaries.sweep import sweep_summary

from ..text import esc
from . import roofline_data as rd
from .roofline import _roof_traces

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report


def _layout(fig: go.Figure, title: str, x: str, y: str, *, log: bool = False) -> go.Figure:
    fig.update_layout(title=title, template="plotly_white", height=420, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                      legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(title=x, type="log" if log else "linear")
    fig.update_yaxes(title=y, type="log" if log else "linear")
    return fig


def sweep_roofline(report: Report, summary: pd.DataFrame | None = None) -> go.Figure:
    """Decode GEMMs of each run on the roofline: intensity rises with batch towards the ridge."""
    s = sweep_summary(report) if summary is None else summary
    s = s[s["decode_gemm_intensity"].notna() & (s["decode_gemm_intensity"] > 0)]
    dev = report.device
    xs = s["decode_gemm_intensity"].to_numpy(dtype=float, na_value=np.nan)
    ridges = rd.ridge_points(dev, ["fp32", "bf16", "fp16"] if dev else [])
    lo = min([*xs, *(r[1] for r in ridges)], default=0.1) / 4
    hi = max([*xs, *(r[1] for r in ridges)], default=10.0) * 4
    fig = go.Figure(_roof_traces(rd.roof_lines(dev, sorted({p for p in ("fp32", "bf16", "fp16") if dev and p in dev.compute}),
                                               lo, hi), ridges))
    for prompt_len, g in s.groupby("prompt_len"):
        g = g.sort_values("batch")
        fig.add_trace(go.Scatter(
            x=g["decode_gemm_intensity"], y=g["decode_gemm_flops_per_s"], mode="lines+markers+text",
            name=f"decode GEMMs, prompt {int(prompt_len)}", text=[f"b{int(b)}" for b in g["batch"]],
            textposition="top center",
            customdata=np.stack([g["run"].map(esc), g["decode_gemm_bound"].map(esc),
                                 g["decode_gemm_pct_of_roof"].round(1)], axis=1),
            hovertemplate="%{customdata[0]}<br>%{x:.3g} FLOP/B, %{y:.3s}FLOP/s<br>bound %{customdata[1]}, "
                          "%{customdata[2]}% of roof<extra></extra>",
        ))
    return _layout(fig, "Decode roofline trajectory as batch grows", "arithmetic intensity (FLOP/byte)",
                   "achieved FLOP/s", log=True)


def ttft_vs_prompt(report: Report, summary: pd.DataFrame | None = None) -> go.Figure:
    """Mean time to first token against prompt length, one line per batch size."""
    s = sweep_summary(report) if summary is None else summary
    fig = go.Figure()
    for batch, g in s.groupby("batch"):
        g = g.sort_values("prompt_len")
        fig.add_trace(go.Scatter(x=g["prompt_len"], y=g["ttft_s"] * 1e3, mode="lines+markers",
                                 name=f"batch {int(batch)}"))
    return _layout(fig, "TTFT against prompt length", "prompt length (tokens)", "TTFT (ms)")


def throughput_latency(report: Report, summary: pd.DataFrame | None = None) -> go.Figure:
    """The throughput-latency curve: tokens/s (system) against TPOT, one point per batch size."""
    s = sweep_summary(report) if summary is None else summary
    fig = go.Figure()
    for prompt_len, g in s.groupby("prompt_len"):
        g = g.sort_values("batch")
        fig.add_trace(go.Scatter(x=g["tpot_s"] * 1e3, y=g["tokens_per_s"], mode="lines+markers+text",
                                 text=[f"b{int(b)}" for b in g["batch"]], textposition="top center",
                                 name=f"prompt {int(prompt_len)}"))
    return _layout(fig, "Throughput against latency (TPOT and tokens/s by batch)", "TPOT (ms per token)",
                   "throughput (output tokens/s)")


def sweep_figures(report: Report) -> list[go.Figure]:
    """Every sweep figure, computing the summary once."""
    s = sweep_summary(report)
    return [sweep_roofline(report, s), ttft_vs_prompt(report, s), throughput_latency(report, s)]
