"""The hierarchy (module -> op -> kernel) as an indented text tree, for ``perfscope analyze --tree``.

Formatting goes through :mod:`perfscope.format`; the numbers come from
:func:`perfscope.analysis.summaries.hierarchy.hierarchy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfscope import format as fmt

if TYPE_CHECKING:
    from perfscope.report import Report

HEADERS = ("node", "time", "share", "calls", "FLOPs", "FLOP/B", "bound", "% roof", "per instance (min-max)", "slowest")


def tree_rows(nodes: Any, depth: int | None = None, name_width: int = 60) -> list[list[str]]:
    """The text cells of each node down to ``depth`` levels (all when None)."""
    rows = []
    for r in nodes.itertuples(index=False):
        if depth is not None and r.depth >= depth:
            continue
        label = fmt.clip("  " * int(r.depth) + str(r.name), name_width)
        spread = (f"{fmt.duration(r.instance_mean_ns)} ({fmt.duration(r.instance_min_ns)}-"
                  f"{fmt.duration(r.instance_max_ns)})" if r.instances > 1 else "")
        slowest = str(r.slowest).split("/")[-1] if r.instances > 1 and r.per_parent > 1 else ""
        rows.append([label, fmt.duration(r.time_ns), fmt.pct(r.share_pct), f"{int(r.calls):,}",
                     fmt.si(r.flops), fmt.number(r.arith_intensity, digits=2), str(r.bound),
                     fmt.pct(r.pct_of_roof), spread, fmt.clip(slowest, 30)])
    return rows


def render_tree(report: Report, *, phase: str | None = None, depth: int | None = None, expand: bool = False) -> str:
    """The tree of every phase (or of ``phase``), as text; ``expand`` lists every instance of
    repeated layers instead of one collapsed row."""
    from perfscope.analysis.summaries.hierarchy import by_phase, hierarchy
    from perfscope.text_report import table

    trees = {phase: hierarchy(report, phase=phase, collapse=not expand)} if phase else \
        by_phase(report, collapse=not expand)
    out: list[str] = []
    for ph, tree in trees.items():
        title = f"Where the time goes ({ph})" if ph else "Where the time goes"
        out.append(f"{title}: {tree.source} -> op -> kernel, {fmt.duration(tree.nodes['time_ns'].where(tree.nodes['depth'] == 0).sum())} of kernel time")
        if tree.note:
            out.append(f"  note: {tree.note}")
        if not len(tree.nodes):
            out.append("  (no kernels)")
            continue
        out.append(table(HEADERS, tree_rows(tree.nodes, depth)))
        out.append("")
    return fmt.terminal_text("\n".join(out) + "\n")


def tree_payload(report: Report, *, phase: str | None = None, depth: int | None = None,
                 expand: bool = False) -> dict[str, Any]:
    """The ``tree`` key of ``perfscope analyze --json``: source, note and the nodes per phase."""
    from perfscope.analysis.summaries.hierarchy import by_phase, hierarchy

    trees = {phase: hierarchy(report, phase=phase, collapse=not expand)} if phase else \
        by_phase(report, collapse=not expand)
    first = next(iter(trees.values()))
    return {"source": first.source, "note": first.note, "collapsed": not expand,
            "phases": {str(ph) if ph else "all": t.to_records(depth) for ph, t in trees.items()}}
