"""``perfscope analyze --memory``: the memory timeline (what is live at the peak, or at an instant the user
picks), the capacity section and the gauges as text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfscope.format import clip, nbytes, number, terminal_text
from perfscope.text_report import table

if TYPE_CHECKING:
    from perfscope.report import Report


def render_memory(report: Report, at: dict[str, Any] | None = None) -> str:
    """The memory summary; ``at`` (:func:`~perfscope.analysis.summaries.memory.parse_instant`) adds
    what is live at that instant on each device."""
    from perfscope.analysis.summaries.memory import (
        breakdown,
        capacity_section,
        gauge_summary,
        peak_by,
        peaks,
        resolve_instant,
        top_sources,
    )

    lines: list[str] = []
    mem = report.memory
    if not len(mem):
        lines.append("no memory timeline in this report (profile with --memory, or import a CUDA memory snapshot, "
                     "a profile_memory trace or an export_memory_timeline JSON)")
    for p in peaks(report):
        b = p["breakdown"]
        lines.append(f"{p['device']}: peak {nbytes(p['peak_allocated_bytes'])} allocated at {b['at']} "
                     f"({p['memory_source']})"
                     + (f", {nbytes(p['max_reserved_bytes'])} reserved at most" if p["max_reserved_bytes"] else ""))
        lines += _breakdown_lines(b, "at the peak")
        top = top_sources(report, p["device"], event=p["event"])
        if len(top):
            lines.append("  largest at the peak, by op and source line:")
            lines.append(table(["category", "op", "source / module", "bytes", "allocs"],
                               [[r.category, r.op or "", clip(r.source or r.module or "", 60), nbytes(r.bytes),
                                 str(r.allocations)] for r in top.itertuples()], indent="    "))
        if at is not None:
            b = breakdown(report, p["device"], resolve_instant(report, p["device"], at))
            lines.append(f"{p['device']} at {b['at']}: {nbytes(b['allocated_bytes'])} allocated")
            lines += _breakdown_lines(b, "there")
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
    return terminal_text("\n".join(lines)) + "\n"


def breakdown_tables(b: dict[str, Any]) -> tuple[list[dict[str, str]], str, list[dict[str, str]]]:
    """One instant's :func:`~perfscope.analysis.summaries.memory.breakdown` as the rows every output
    shows: live bytes by category (adding up to the allocated bytes) with the rules that gave them;
    the line beside it (reserved, reserved but unused, of which fragmentation); the largest live
    tensors (bytes, category, what it is, op, source, when made and freed)."""
    total = b["allocated_bytes"]
    cats = [{"category": k, "bytes": nbytes(v), "share": number(100 * v / total) + "%" if total else "",
             "rule": "; ".join(b["category_rules"].get(k, []))} for k, v in b["by_category"].items()]
    beside = ", ".join(f"{label} {nbytes(b[key])}" for key, label in (
        ("reserved_bytes", "reserved"), ("reserved_unused_bytes", "reserved but unused"),
        ("fragmentation_bytes", "of which fragmentation")) if b[key] is not None)
    if b["fragmentation_bytes"] is not None:
        beside += " (free space inside segments that hold live blocks)"
    tensors = [{"bytes": nbytes(t["bytes"]), "category": t["category"] or "", "what": t["role"], "op": t["op"] or "",
                "source": t["source"] or t["module"] or "",
                "made": "before the record" if t["alloc_event"] < 0 else f"event {t['alloc_event'] + 1:,}",
                "freed": "still live" if t["still_live"] else f"event {t['free_event'] + 1:,}"}
               for t in b["tensors"]]
    return cats, beside, tensors


def _breakdown_lines(b: dict[str, Any], where: str) -> list[str]:
    """One instant's breakdown as text (:func:`breakdown_tables`)."""
    cats, beside, tensors = breakdown_tables(b)
    lines = []
    if cats:
        lines.append(f"  live {where}, by category ({nbytes(b['allocated_bytes'])} allocated):")
        lines.append(table(list(cats[0]), [[*list(r.values())[:3], clip(r["rule"], 90)] for r in cats], indent="    "))
    if beside:
        lines.append("  beside it: " + beside)
    if tensors:
        lines.append(f"  largest live tensors ({b['live_tensors']:,} live):")
        lines.append(table(list(tensors[0]), [[*(clip(v, 48) for v in r.values())] for r in tensors], indent="    "))
    return lines
