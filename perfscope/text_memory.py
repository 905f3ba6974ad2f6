"""``perfscope analyze --memory``: the memory timeline, the capacity section and the gauges as text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfscope.format import duration, nbytes, number
from perfscope.text_report import table

if TYPE_CHECKING:
    from perfscope.report import Report


def render_memory(report: Report) -> str:
    from perfscope.analysis.summaries.memory import (
        capacity_section,
        gauge_summary,
        peak_by,
        peaks,
        top_sources,
    )

    lines: list[str] = []
    mem = report.memory
    if not len(mem):
        lines.append("no memory timeline in this report (profile with --memory, or import a CUDA memory snapshot, "
                     "a profile_memory trace or an export_memory_timeline JSON)")
    for p in peaks(report):
        dev = mem[mem["device"] == p["device"]]
        t0 = int(dev["t_ns"].min())
        lines.append(f"{p['device']}: peak {nbytes(p['peak_allocated_bytes'])} allocated at "
                     f"+{duration(p['t_ns'] - t0)} ({p['events']} events, {p['memory_source']})"
                     + (f", {nbytes(p['max_reserved_bytes'])} reserved at most" if p["max_reserved_bytes"] else ""))
        cats = p["by_category"]
        rows = [[k, nbytes(v), number(100 * v / p["peak_allocated_bytes"]) + "%" if k != "fragmentation" else ""]
                for k, v in cats.items()]
        if rows:
            lines.append("  held at the peak:")
            lines.append(table(["category", "bytes", "share"], rows, indent="    "))
        top = top_sources(report, p["device"])
        if len(top):
            lines.append("  largest at the peak:")
            lines.append(table(["category", "op", "source / module", "bytes", "allocs"],
                               [[r.category, r.op or "", (r.source or r.module or "")[:60], nbytes(r.bytes),
                                 str(r.allocations)] for r in top.itertuples()], indent="    "))
    for key in ("phase", "step"):
        got = peak_by(report, key)
        if len(got):
            lines.append(f"peak per {key}:")
            lines.append(table(["device", key, "peak"], [[r.device, str(getattr(r, key)), nbytes(r.peak_allocated_bytes)]
                                                         for r in got.head(20).itertuples()]))
    sec = capacity_section(report)
    if sec is not None:
        lines.append("capacity: " + sec["finding"])
    g = gauge_summary(report)
    if len(g):
        lines.append("server gauges (/metrics):")
        lines.append(table(["gauge", "samples", "min", "max", "last"],
                           [[r.metric, str(r.count), number(r.min), number(r.max), number(r.last)]
                            for r in g.itertuples()]))
    return "\n".join(lines) + "\n"
