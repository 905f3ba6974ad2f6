"""The hierarchy (module -> op -> kernel) as a plotly icicle: one box per node, its width the
node's kernel time, its colour the node's bound. Shared by the HTML report, the dashboard's
tree tab and ``Report.hierarchy_figure()``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from ..style import BOUND_COLORS
from ..text import MISSING, duration, esc, pct, si
from .messages import message_figure

if TYPE_CHECKING:
    from perfscope.report import Report

MAX_NODES = 3000
"""Nodes drawn at most (the deepest levels are left out beyond it; the table keeps them all)."""


def tree_figure(report: Report, *, phase: str | None = None, depth: int | None = None,
                collapse: bool = True) -> go.Figure:
    """The icicle of ``report``'s tree for ``phase`` (all kernels when None), ``depth`` levels deep;
    ``collapse=False`` draws every instance of repeated layers."""
    from perfscope.analysis.summaries.hierarchy import hierarchy

    tree = hierarchy(report, phase=phase, collapse=collapse)
    nodes = tree.nodes
    if depth is not None:
        nodes = nodes[nodes["depth"] < depth]
    while len(nodes) > MAX_NODES and nodes["depth"].max() > 0:
        nodes = nodes[nodes["depth"] < nodes["depth"].max()]
    if not len(nodes):
        return message_figure(f"no kernels{' of phase ' + esc(phase) if phase else ''} in this report")
    hover = [
        f"<b>{esc(r.name)}</b><br>{esc(r.level)} · {duration(r.time_ns)} ({pct(r.share_pct)}) · {int(r.calls):,} calls"
        f"<br>FLOPs {si(r.flops)} · {si(r.dram_bytes, 'B')} · FLOP/B "
        f"{MISSING if not np.isfinite(r.arith_intensity) else f'{r.arith_intensity:.2f}'}"
        f"<br>{esc(r.bound)} bound · {pct(r.pct_of_roof)} of roof"
        + (f"<br>per instance {duration(r.instance_mean_ns)} ({duration(r.instance_min_ns)}–"
           f"{duration(r.instance_max_ns)}), slowest {esc(r.slowest, 80)}" if r.instances > 1 else "")
        for r in nodes.itertuples(index=False)
    ]
    fig = go.Figure(go.Icicle(
        ids=nodes["node"].astype(str), parents=[("" if p < 0 else str(p)) for p in nodes["parent"]],
        labels=[esc(n) for n in nodes["name"]], values=nodes["time_ns"].astype(float),
        branchvalues="total", customdata=nodes["node"].astype(int).tolist(),
        marker={"colors": [BOUND_COLORS.get(str(b), BOUND_COLORS["unknown"]) for b in nodes["bound"]]},
        hovertext=hover, hoverinfo="text", tiling={"orientation": "v"}, maxdepth=4,
    ))
    title = f"Where the time goes{' (' + esc(phase) + ')' if phase else ''}: {esc(tree.source)} → op → kernel"
    fig.update_layout(title=title, margin={"l": 10, "r": 10, "t": 40, "b": 10}, height=460)
    return fig
