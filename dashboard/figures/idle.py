"""Why the GPU (on a CPU run: the cores) waits: the device's idle time split by cause (docs/idle.md), one bar
per cause."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from perfscope.analysis.idle import CAUSES, idle_of, idle_overview

from ..text import duration, esc
from .messages import message_figure

if TYPE_CHECKING:
    from perfscope.report import Report

CAUSE_COLORS = {"launch": "#d62728", "host": "#1f77b4", "sync": "#9467bd", "copy": "#ff7f0e", "graph": "#2ca02c",
                "profiler": "#7f7f7f", "unrecorded": "#bcbd22", "unknown": "#c7c7c7"}


def idle_causes(report: Report) -> go.Figure:
    """Per device, a horizontal bar per idle cause: its ms and share of the idle time, with the
    largest ranges of that cause in the hover. Each bar's ``customdata`` is (device, cause), so a
    click can select that cause's gaps (the dashboard's timeline does)."""
    overview = idle_overview(idle_of(report), top=50)
    if not overview:
        return message_figure("no idle time inside the window (or no device timeline in this report)", "idle")
    fig = go.Figure()
    drawn: list[str] = []  # the (device, cause) rows with idle time: a cause with none is no empty row
    for dev in overview:
        ranges = dev["ranges"]
        for c in dev["causes"]:  # type: ignore[attr-defined]
            cause = str(c["cause"])
            if not float(c["duration_ns"] or 0) > 0:
                continue
            row = f"{esc(str(dev['device']))} {cause}"
            shown = any(d.endswith(f" {cause}") for d in drawn)
            drawn.append(row)
            mine = [r for r in ranges if r["cause"] == cause][:3]  # type: ignore[attr-defined,index]
            where = "<br>".join(f"{esc(r['range'] or '(no range)')}: {r['duration_ns'] / 1e6:.2f} ms" for r in mine)
            share = c["idle_pct"] if c["idle_pct"] is not None else 0.0
            facts = dev.get("unrecorded")
            if cause == "unrecorded" and isinstance(facts, dict):  # dispatches the trace lacks: the device likely ran kernels there
                where = (f"the trace lacks {int(facts.get('dispatches', 0)):,} dispatches over these "
                         f"{int(facts.get('gaps', 0))} gaps: the GPU likely ran kernels it does not hold; not idle")
            fig.add_trace(go.Bar(
                y=[row], x=[float(c["duration_ns"]) / 1e6], orientation="h",
                name=cause, marker_color=CAUSE_COLORS.get(cause, "#333"), legendgroup=cause,
                showlegend=not shown, customdata=[[str(dev["device"]), cause]],
                text=[f"{duration(float(c['duration_ns']))}, {'<0.1' if 0 < share < 0.1 else f'{share:.1f}'}%"],
                textposition="auto",
                hovertemplate=(f"<b>{cause}</b> on {esc(str(dev['device']))}: %{{x:.2f}} ms, {share:.1f}% of the idle time"
                               + (f"<br>{where}" if where else "") + "<extra></extra>")))
    n = len(drawn)
    if not n:
        return message_figure("no idle time inside the window", "idle")
    from perfscope.analysis.summaries.kernels import is_cpu_report

    who = "Why the cores wait: time outside operators" if is_cpu_report(report) else "Why the GPU waits: idle time"
    left = 0.0
    for d in overview:
        unrec = d.get("unrecorded")
        left += float(unrec.get("ns", 0.0)) if isinstance(unrec, dict) else 0.0
    note = (f"<br><sub>{duration(left)} of it lies over dispatches the trace lacks ('unrecorded': a kernel filter "
            "or lost records): not idle</sub>" if left > 0 else "")
    fig.update_layout(template="plotly_white", title={"text": f"{who} per cause{note}"},
                      xaxis_title="idle ms inside the window", height=max(240, 140 + 34 * n), barmode="overlay",
                      yaxis={"categoryorder": "array", "categoryarray": [
                          r for r in (f"{esc(str(d['device']))} {c}" for d in overview for c in reversed(CAUSES))
                          if r in drawn]},
                      meta={"kind": "idle"})
    return fig
