"""The rank view of a distributed job: plotly figures from the per-rank tables.

Every figure takes :class:`perfscope.analysis.ranks.stats.RankTables` (``rank_tables(report)``, or the
tables ``import_ranks`` returns without loading the job), so the Dash app, the HTML report and
``perfscope import --ranks`` draw the same thing:

- :func:`category_heatmap`: kernel time per rank and category (share of the rank's kernel time);
- :func:`step_times`: mean step time per rank with its min-max range, stragglers in red;
- :func:`overlap`: each rank's active span split into compute only, communication hidden behind
  compute, exposed communication, copies only and idle;
- :func:`kernel_spread`: the kernels whose time differs most across ranks, per rank relative to
  the kernel's median rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from perfscope.analysis.ranks.partial_read import STEP_METRICS, rank_steps
from perfscope.analysis.ranks.stats import RankTables, category_matrix, format_ranks, stragglers
from perfscope.analysis.ranks.stats import kernel_spread as spread_table
from perfscope.analysis.ranks.straggler import Stragglers, empty_stragglers

from ..text import duration, esc, pct
from .messages import message_figure

if TYPE_CHECKING:
    from collections.abc import Mapping

STRAGGLER_COLOR = "#d62728"
RANK_COLOR = "#1f77b4"
OVERLAP_PARTS = (
    ("compute only", "#1f77b4"), ("comm hidden by compute", "#9467bd"), ("exposed comm", "#e377c2"),
    ("copies only", "#7f7f7f"), ("idle", "#dddddd"),
)


def _rank_axis(ranks: pd.Series) -> list[str]:
    return [f"rank {int(r)}" for r in ranks]


def category_heatmap(t: RankTables) -> go.Figure:
    """Rank x kernel category: share of each rank's kernel time (colour) and the time (hover)."""
    wide = category_matrix(t.categories)
    if not len(wide):
        return message_figure("no kernels in these ranks", "rank_categories")
    share = wide.div(wide.sum(axis=1).where(lambda s: s > 0), axis=0) * 100.0
    hover = np.vectorize(duration, otypes=[object])(wide.to_numpy())
    fig = go.Figure(go.Heatmap(
        z=share.to_numpy(), x=[esc(c) for c in wide.columns], y=_rank_axis(wide.index.to_series()),
        customdata=hover, colorscale="Blues", colorbar={"title": "% of rank"},
        hovertemplate="%{y}, %{x}: %{customdata} (%{z:.1f}% of the rank's kernel time)<extra></extra>"))
    fig.update_layout(template="plotly_white", title="Kernel time by category per rank",
                      height=min(900, max(260, 24 * len(wide) + 120)), yaxis={"autorange": "reversed"},
                      meta={"kind": "rank_categories"})
    return fig


def _step_stats(t: RankTables) -> pd.DataFrame:
    if not len(t.steps):
        return pd.DataFrame()
    return t.steps.groupby("rank")["duration_ns"].agg(["mean", "min", "max", "count"]).reset_index()


def step_times(t: RankTables) -> go.Figure:
    """Mean step time per rank (bars, min-max whiskers), stragglers in red with their margin."""
    stats = _step_stats(t)
    if not len(stats):
        return message_figure("no steps (ProfilerStep#N ranges or engine steps) in these ranks", "rank_steps")
    flagged = stragglers(t.per_rank, ("step_mean_ns",)).set_index("rank")
    red = stats["rank"].isin(flagged.index)
    ms = stats["mean"] / 1e6
    fig = go.Figure(go.Bar(
        x=_rank_axis(stats["rank"]), y=ms, marker_color=np.where(red, STRAGGLER_COLOR, RANK_COLOR),
        error_y={"type": "data", "symmetric": False, "array": stats["max"] / 1e6 - ms, "arrayminus": ms - stats["min"] / 1e6},
        customdata=np.stack([stats["count"], stats["min"].map(duration), stats["max"].map(duration)], axis=1),
        hovertemplate="%{x}: mean %{y:.3f} ms over %{customdata[0]} steps (min %{customdata[1]}, "
                      "max %{customdata[2]})<extra></extra>"))
    fig.add_hline(y=float(ms.median()), line_dash="dot", line_color="#555", annotation_text="median")
    for rank, row in flagged.iterrows():
        fig.add_annotation(x=f"rank {int(rank)}", y=float(row["value_ns"]) / 1e6, text=f"+{row['margin_pct']:.1f}%",
                           showarrow=False, yshift=14, font={"color": STRAGGLER_COLOR})
    fig.update_layout(template="plotly_white", title="Step time per rank (stragglers in red)",
                      yaxis_title="ms", height=360, meta={"kind": "rank_steps", "stragglers": [int(r) for r in flagged.index]})
    return fig


def overlap_parts(per_rank: pd.DataFrame) -> pd.DataFrame:
    """Per rank, ns of: compute only, comm hidden by compute, exposed comm, copies only, idle.

    The five parts add up to the rank's active span.
    """
    p = per_rank.astype({c: "float64" for c in ("compute_ns", "overlap_ns", "exposed_comm_ns", "busy_ns", "idle_ns")})
    parts = pd.DataFrame({
        "compute only": p["compute_ns"] - p["overlap_ns"],
        "comm hidden by compute": p["overlap_ns"],
        "exposed comm": p["exposed_comm_ns"],
        "copies only": (p["busy_ns"] - p["compute_ns"] - p["exposed_comm_ns"]).clip(lower=0.0),
        "idle": p["idle_ns"],
    })
    parts.index = per_rank["rank"].astype("int64").to_numpy()
    return parts


def overlap(t: RankTables) -> go.Figure:
    """Stacked bars per rank: where its active span went (percent of the span, ns on hover)."""
    pr = t.per_rank
    if not len(pr) or pr["span_ns"].astype("float64").fillna(0).le(0).all():
        return message_figure("no GPU work in these ranks", "rank_overlap")
    parts = overlap_parts(pr)
    span = pr["span_ns"].astype("float64").to_numpy()
    fig = go.Figure()
    for name, color in OVERLAP_PARTS:
        ns = parts[name].to_numpy()
        fig.add_trace(go.Bar(
            name=name, x=_rank_axis(pd.Series(parts.index)), y=100.0 * ns / np.where(span > 0, span, np.nan),
            marker_color=color, customdata=[duration(v) for v in ns],
            hovertemplate=f"%{{x}}: {esc(name)} %{{customdata}} (%{{y:.1f}}% of the span)<extra></extra>"))
    fig.update_layout(template="plotly_white", barmode="stack", title="Communication vs computation per rank",
                      yaxis_title="% of the rank's active span", height=380, meta={"kind": "rank_overlap"})
    return fig


def kernel_spread(t: RankTables, top: int = 15) -> go.Figure:
    """Heatmap of the ``top`` kernels whose time differs most across ranks: time / median rank's time."""
    ranks = t.ranks
    table = spread_table(t.kernels, ranks, top)
    if not len(table):
        return message_figure("no kernels in these ranks", "rank_kernels")
    wide = t.kernels.pivot_table(index="kernel", columns="rank", values="time_ns", aggfunc="sum")
    wide = wide.reindex(index=table["kernel"], columns=ranks).fillna(0.0)
    median = table.set_index("kernel")["median_ns"].reindex(wide.index)
    ratio = wide.div(median.where(median > 0), axis=0)
    fig = go.Figure(go.Heatmap(
        z=ratio.to_numpy(), x=[f"rank {r}" for r in ranks], y=[esc(k, 60) for k in wide.index],
        customdata=np.vectorize(duration, otypes=[object])(wide.to_numpy()), colorscale="RdBu_r", zmid=1.0,
        colorbar={"title": "x median"},
        hovertemplate="%{y}<br>%{x}: %{customdata} (%{z:.2f} x the median rank)<extra></extra>"))
    fig.update_layout(template="plotly_white", title="Kernels whose time differs most across ranks",
                      height=max(300, 22 * len(wide) + 140), yaxis={"autorange": "reversed"}, meta={"kind": "rank_kernels"})
    return fig


def step_heatmap(t: RankTables, s: Stragglers | None = None, metric: str = "caused") -> go.Figure:
    """Rank x step heat map of one of :data:`STEP_METRICS` (default: the wait each rank causes the
    other ranks of its group, so the rank they wait for stands out); x is the step number, y the
    rank (a click gives both: the dashboard then draws that rank's step)."""
    label, column = STEP_METRICS.get(metric, STEP_METRICS["caused"])
    steps = rank_steps(t, s if s is not None else empty_stragglers())
    if not len(steps) or column not in steps or steps[column].isna().all():
        why = "no steps in these ranks" if not len(steps) else f"no {label} in these ranks (no collective matched)"
        return message_figure(why, "rank_step_heatmap")
    wide = steps.pivot_table(index="rank", columns="step", values=column, aggfunc="sum")
    ranks, step_numbers = wide.index.astype("int64").tolist(), wide.columns.astype("int64").tolist()
    ms = wide.to_numpy(np.float64, na_value=np.nan) / 1e6
    flagged = [] if s is None or not len(s.ranks) else [int(r) for r in s.flagged["rank"]]
    fig = go.Figure(go.Heatmap(
        z=ms, x=step_numbers, y=ranks, colorscale="Reds" if metric == "caused" else "Blues",
        colorbar={"title": "ms"},
        hovertemplate=f"rank %{{y}}, step %{{x}}: {esc(label)} %{{z:.3f}} ms<extra></extra>"))
    title = f"Per rank and step: {label}"
    if flagged:
        title += f" (straggler{'s' if len(flagged) > 1 else ''}: rank {format_ranks(flagged)})"
    fig.update_layout(template="plotly_white", title=esc(title), xaxis_title="step", yaxis_title="rank",
                      height=min(900, max(300, 14 * len(ranks) + 160)),
                      yaxis={"autorange": "reversed", "type": "linear"}, xaxis={"type": "linear"},
                      meta={"kind": "rank_step_heatmap", "metric": metric, "stragglers": flagged})
    return fig


def rank_figures(t: RankTables, s: Stragglers | None = None) -> dict[str, go.Figure]:
    """Every rank-view figure, by name, in the order a page shows them."""
    return {"waits": step_heatmap(t, s), "steps": step_times(t), "overlap": overlap(t),
            "categories": category_heatmap(t), "kernels": kernel_spread(t)}


def _coverage_text(manifest: Mapping[str, Any], t: RankTables) -> str:
    info = (manifest.get("params") or {}).get("ranks") or {}
    text = f"ranks {format_ranks(t.ranks)}"
    if info.get("world_size"):
        text += f" of world size {info['world_size']}"
    if info.get("missing_count"):
        text += f"; {info['missing_count']} ranks have no trace"
    if info.get("skipped"):
        text += f"; {len(info['skipped'])} files skipped"
    return text


def rank_view_html(t: RankTables, manifest: Mapping[str, Any], s: Stragglers | None = None) -> str:
    """A standalone, offline HTML page of the rank view (plotly.js inlined once)."""
    figs = rank_figures(t, s)
    blocks = [fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False)
              for i, fig in enumerate(figs.values())]
    warnings = "".join(f"<li>{esc(w, 300)}</li>" for w in (manifest.get("warnings") or [])[:50])
    pr = t.per_rank
    job = (f"mean exposed communication {pct(100 * pr['exposed_comm_ns'].mean() / pr['span_ns'].mean())} of the span; "
           f"mean idle {pct(pr['idle_pct'].mean())}") if len(pr) else ""
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>perfscope ranks: {esc(manifest.get('name'))}</title></head>"
            "<body style='font-family:sans-serif;margin:1.5em'>"
            f"<h1>{esc(manifest.get('name'))}: rank view</h1><p>{esc(_coverage_text(manifest, t))}. {esc(job)}</p>"
            f"<p>{esc(s.statement() if s is not None else '')}</p>"
            + "".join(blocks) + (f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else "") + "</body></html>")


__all__ = ["category_heatmap", "kernel_spread", "overlap", "overlap_parts", "rank_figures", "rank_view_html",
           "step_heatmap", "step_times"]
