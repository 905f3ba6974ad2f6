"""The memory track: allocated and reserved bytes over time per device, on the timeline's time
axis, each point's hover naming the event (op, category, size) and what was live by category;
and the server's gauges beside the requests' TTFT (a load test with ``--metrics``)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.format import nbytes

from ..text import esc
from .messages import message_figure

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report

MAX_POINTS = 4000
"""Points drawn per device; beyond, each bin keeps its highest point (the peaks stay)."""

CATEGORY_ORDER = ("weights", "kv_cache", "activations", "workspace", "optimizer", "gradient", "cuda_graph_pool",
                  "before_recording", "unknown")


def _origin(report: Report) -> int:
    mem = report.memory
    if len(report.kernels) or len(report.ranges):
        from .timeline_data import timeline_index

        return int(timeline_index(report).origin_ns)
    return int(mem["t_ns"].min())


def category_levels(dev: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per category, the bytes live after each row of one device (running sums of its deltas)."""
    delta = dev["delta_bytes"].astype("float64").fillna(0.0).to_numpy()
    cats = dev["category"].astype("object").fillna("unknown").to_numpy()
    return {c: np.cumsum(np.where(cats == c, delta, 0.0)) for c in CATEGORY_ORDER if (cats == c).any()}


def _thin(n: int, values: np.ndarray) -> np.ndarray:
    """Row positions to draw: all, or per bin the highest."""
    if n <= MAX_POINTS:
        return np.arange(n)
    bins = np.linspace(0, n, MAX_POINTS + 1).astype(int)
    keep = [lo + int(np.nanargmax(values[lo:hi])) for lo, hi in itertools.pairwise(bins) if hi > lo]
    return np.unique(np.concatenate([keep, [0, n - 1]]))


def memory_timeline(report: Report) -> go.Figure:
    """Allocated (and reserved, where recorded) bytes per device over time (ms from the timeline's
    origin; a record without a clock, a snapshot without ``time_us``: over its events). Each point is
    one allocation event; ``customdata`` holds (device, event) for a click (what is live after it)."""
    from perfscope.analysis.summaries.memory import memory_clock

    mem = report.memory
    if not len(mem):
        return message_figure("no memory timeline in this report (perfscope profile --memory, or import a CUDA "
                              "memory snapshot, a profile_memory trace or an export_memory_timeline JSON)", "memory")
    by_event = memory_clock(report) == "events"
    origin = 0 if by_event else _origin(report)
    fig = go.Figure()
    for device in sorted(mem["device"].dropna().unique()):
        dev = mem[mem["device"] == device].reset_index(drop=True)
        alloc = dev["allocated_bytes"].astype("float64").to_numpy()
        pos = _thin(len(dev), alloc)
        events = dev["event"].to_numpy("float64", na_value=np.nan) if "event" in dev else np.arange(len(dev), dtype="float64")
        x = events[pos] + 1 if by_event else (dev["t_ns"].to_numpy("int64")[pos] - origin) / 1e6
        levels = category_levels(dev)
        by_cat = [" ".join(f"{c} {nbytes(v[i])}" for c, v in levels.items() if v[i] > 0) for i in pos]
        hover = [f"{esc(str(a))} {nbytes(s)} {esc(str(c))} {esc(str(o)) if isinstance(o, str) else ''}"
                 for a, s, c, o in zip(dev["action"].to_numpy()[pos], dev["size_bytes"].to_numpy("float64", na_value=np.nan)[pos],
                                       dev["category"].to_numpy()[pos], dev["op"].to_numpy()[pos])]
        text = [f"{h}<br>live: {esc(b)}" for h, b in zip(hover, by_cat)]
        custom = np.stack([np.full(len(pos), device, dtype=object), events[pos].astype("int64")], axis=1)
        where = "event %{x:,}" if by_event else "%{x:.3f} ms"
        fig.add_trace(go.Scatter(x=x, y=alloc[pos], mode="lines", line={"shape": "hv"}, name=f"{esc(device)} allocated",
                                 text=text, customdata=custom,
                                 hovertemplate=where + ": %{y:.4s}B allocated<br>%{text}<extra></extra>"))
        reserved = dev["reserved_bytes"].astype("float64").to_numpy()
        if np.isfinite(reserved).any():
            fig.add_trace(go.Scatter(x=x, y=reserved[pos], mode="lines", line={"shape": "hv", "dash": "dot"},
                                     name=f"{esc(device)} reserved", customdata=custom,
                                     hovertemplate=where + ": %{y:.4s}B reserved<extra></extra>"))
    fig.update_layout(template="plotly_white", title={"text": "Memory (click a point: what was live)"}, height=320,
                      xaxis_title="event (the record has no clock)" if by_event else "time since first event (ms)",
                      yaxis_title="bytes", meta={"kind": "memory"}, hovermode="closest")
    return fig


def gauges_beside_latency(report: Report) -> go.Figure:
    """The server's gauges (KV-cache usage, running and waiting requests) over the load test, above
    each request's TTFT at its arrival: a TTFT rise lines up with the queue or the KV cache filling."""
    g, req = report.gauges, report.requests
    if not len(g):
        return message_figure("no server gauges in this report (perfscope loadtest --endpoint URL --metrics)", "gauges")
    timed = bool(len(req)) and "arrival_s" in req and req["arrival_s"].notna().any()
    top = int(timed)  # the TTFT panel only where the client's requests have arrival times
    titles = ["TTFT by arrival (ms)"] * top + ["requests running / waiting", "KV-cache usage (%)"]
    fig = make_subplots(rows=2 + top, cols=1, shared_xaxes=True, vertical_spacing=0.05, subplot_titles=titles)
    if timed:
        ok = req[req["ttft_s"].notna()]
        fig.add_trace(go.Scatter(x=ok["arrival_s"], y=ok["ttft_s"] * 1e3, mode="markers", name="TTFT"), row=1, col=1)
    for metric, row in (("requests_running", 1 + top), ("requests_waiting", 1 + top), ("kv_cache_usage_pct", 2 + top),
                        ("preemptions_total", 1 + top)):
        s = g[g["metric"] == metric].sort_values("t_s")
        if len(s) and s["value"].notna().any():
            fig.add_trace(go.Scatter(x=s["t_s"], y=s["value"], mode="lines", line={"shape": "hv"}, name=metric),
                          row=row, col=1)
    fig.update_xaxes(title_text="s from the run's start", row=2 + top, col=1)
    fig.update_layout(template="plotly_white", title={"text": "Server gauges beside the latencies" if timed else
                                                      "Server gauges over the run"}, height=620 if timed else 440,
                      meta={"kind": "gauges"})
    return fig
