"""The HTML report's "Where the time goes" section: per phase, the icicle of the module -> op ->
kernel tree and the tree as an expandable table (nested ``<details>``: no script needed).
Every report string is escaped (:func:`.text.esc`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from perfscope.format import number

from .figures.tree import tree_figure
from .text import MISSING, duration, esc, pct, si

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report

MAX_TABLE_NODES = 1500
"""Nodes listed in the expandable table at most (the deepest levels go first beyond it)."""

OPEN_DEPTH = 1
"""Levels shown expanded when the page opens."""

STYLE = """<style>
.ptree{font-size:13px;margin:.5em 0 1.5em}
.ptree details>details,.ptree details>.leaf{margin-left:1.2em}
.ptree summary,.ptree .leaf,.ptree .head{display:grid;grid-template-columns:minmax(18em,1fr) 6em 4.5em 5em 6em 5em 5.5em 4.5em 16em;
gap:.4em;padding:1px 0;border-bottom:1px solid #eee}
.ptree .head{font-weight:bold;border-bottom:1px solid #999}
.ptree summary{cursor:pointer}
.ptree span{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.ptree span.num{text-align:right}
</style>"""

HEAD = ("node", "time", "share", "calls", "FLOPs", "FLOP/B", "bound", "% roof", "per instance (min–max)")


SMALLEST_PCT = 0.01
"""Shares below this (in %) are shown ``<0.01%``: ``0.00089%`` does not fit its column (it was cut to
``0.0008…``), and a share that small is not read for its digits."""


def _pct(value: Any) -> str:
    """A percentage that fits the tree's column: ``<0.01%`` below :data:`SMALLEST_PCT`."""
    v = float(value) if value is not None else float("nan")
    return f"<{SMALLEST_PCT:g}%" if np.isfinite(v) and 0 < abs(v) < SMALLEST_PCT else pct(value)


def _cells(r: Any) -> str:
    ai = MISSING if not np.isfinite(r.arith_intensity) else number(r.arith_intensity, digits=2)
    spread = (f"{duration(r.instance_mean_ns)} ({duration(r.instance_min_ns)}–{duration(r.instance_max_ns)})"
              if r.instances > 1 else "")
    slowest = f"slowest: {r.slowest}" if r.instances > 1 else ""
    values = (duration(r.time_ns), _pct(r.share_pct), f"{int(r.calls):,}", si(r.flops), ai, str(r.bound),
              _pct(r.pct_of_roof))
    name = f'<span title="{esc(r.path)}{(" — " + esc(slowest)) if slowest else ""}">{esc(r.name)}</span>'
    return name + "".join(f'<span class="num">{esc(v)}</span>' for v in values) + \
        f'<span title="{esc(slowest)}">{esc(spread)}</span>'


def tree_table(nodes: pd.DataFrame) -> str:
    """The nodes (depth-first, as :func:`perfscope.analysis.summaries.hierarchy.hierarchy` orders them) as
    nested ``<details>``: a node with children is a ``<details>`` whose summary holds its numbers."""
    while len(nodes) > MAX_TABLE_NODES and nodes["depth"].max() > 0:
        nodes = nodes[nodes["depth"] < nodes["depth"].max()]
    depths = nodes["depth"].to_numpy()
    has_kids = np.r_[depths[1:] > depths[:-1], False] if len(depths) else np.zeros(0, dtype=bool)
    out = ['<div class="ptree">', '<div class="head">' + "".join(f"<span>{esc(h)}</span>" for h in HEAD) + "</div>"]
    open_stack: list[int] = []
    for r, kids in zip(nodes.itertuples(index=False), has_kids.tolist()):
        while open_stack and open_stack[-1] >= r.depth:
            open_stack.pop()
            out.append("</details>")
        if kids:
            out.append(f'<details{" open" if r.depth < OPEN_DEPTH else ""}><summary>{_cells(r)}</summary>')
            open_stack.append(int(r.depth))
        else:
            out.append(f'<div class="leaf">{_cells(r)}</div>')
    out.extend("</details>" for _ in open_stack)
    out.append("</div>")
    return "".join(out)


def instances_table(report: Report, phase: str | None, collapsed: pd.DataFrame) -> str:
    """The repeated layers expanded: every instance's module (or range) levels, in a closed
    ``<details>`` (empty string when nothing repeats)."""
    from perfscope.analysis.summaries.hierarchy import hierarchy

    if not (collapsed["instances"] > 1).any():
        return ""
    nodes = hierarchy(report, phase=phase, collapse=False).nodes
    nodes = nodes[nodes["level"].isin(("module", "range"))]
    if not len(nodes):
        return ""
    return (f'<details class="instances"><summary>Every instance of the repeated layers ({len(nodes):,} '
            f"module levels, without their ops and kernels)</summary>{tree_table(nodes)}</details>")


def tree_section(page: Any, report: Report) -> str:
    """The section (empty string when the report has no kernels)."""
    from perfscope.analysis.summaries.hierarchy import by_phase

    if not len(report.kernels):
        return ""
    parts = [STYLE]
    trees = by_phase(report)
    first = next(iter(trees.values()))
    parts.append(f'<p class="muted">Levels from {esc(first.source)} '
                 f'{"(nn.Module calls)" if first.source == "module" else "(NVTX / record_function ranges)" if first.source == "range" else ""}'
                 ", then the launching op, then the kernel. Repeated layers of one class are one row "
                 "(×N) with their spread per instance; hover a name for its path and the slowest instance.</p>")
    if first.note:
        parts.append(f'<p class="warnings">{esc(first.note)}</p>')
    for phase, tree in trees.items():
        label = phase or "all kernels"
        parts.append(f"<h3>{esc(label)}</h3>")
        parts.append(page.figure(tree_figure(report, phase=phase), f"tree {label}"))
        parts.append(tree_table(tree.nodes))
        parts.append(instances_table(report, phase, tree.nodes))
    return f'<section id="tree"><h2>Where the time goes: module → op → kernel</h2>{"".join(parts)}</section>'
