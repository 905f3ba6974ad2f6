"""Figures of the serving tails (:mod:`perfscope.analysis.summaries.tails`).

- :func:`tails_figure`: for TTFT, ITL, TPOT and E2E, the p50 and the p99 as stacked bars of their
  parts (queued, own prefill, head of line, decode, prefill stall, preemption, host), one pair per run;
- :func:`requests_figure`: every request by arrival and E2E, coloured by its largest part; a click on
  one (the dashboard) opens its timeline;
- :func:`request_timeline_figure`: one request over time: its pieces coloured by part, its tokens, and
  every step it waited through or took part in, each with its batch and the kernels that ran in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.analysis.summaries.tails import (
    PART_WORDS,
    PARTS,
    entry,
    request_timeline,
    splits,
    step_families,
)

from ..style import PHASE_COLORS
from ..text import esc
from .messages import message_figure

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report

PART_COLORS = {"queued": "#7f7f7f", "prefill": "#9467bd", "head_of_line": "#ff7f0e", "decode": "#2ca02c",
               "prefill_stall": "#d62728", "preemption": "#8c564b", "host": "#bcbd22", "unmeasured": "#d9d9d9"}
METRIC_TITLES = (("ttft", "TTFT"), ("itl", "ITL (every gap)"), ("tpot", "TPOT"), ("e2e", "E2E"))


def tails_figure(report: Report) -> go.Figure:
    """p50 and p99 of each latency, stacked by their parts (ms), per run."""
    found = splits(report)
    if not found:
        return message_figure("no load-test requests in this report", "tails")
    fig = make_subplots(rows=1, cols=4, subplot_titles=[t for _, t in METRIC_TITLES])
    shown: set[str] = set()
    for col, (metric, _) in enumerate(METRIC_TITLES, start=1):
        xs: list[str] = []
        parts: dict[str, list[float]] = {p: [] for p in PARTS}
        for split in found:
            for q, value in (("p50", 50.0), ("p99", 99.0)):
                e = entry(split, metric, value)
                xs.append(f"{split.run} {q}" if len(found) > 1 else q)
                for p in PARTS:
                    parts[p].append(e["parts"].get(p, 0.0) * 1e3)
        for p in PARTS:
            if not any(v > 0 for v in parts[p]):
                continue
            fig.add_trace(go.Bar(x=[esc(x) for x in xs], y=parts[p], name=esc(PART_WORDS[p]), legendgroup=p,
                                 marker_color=PART_COLORS[p], showlegend=p not in shown,
                                 hovertemplate="%{x}: %{y:.3f} ms<extra>" + esc(PART_WORDS[p]) + "</extra>"),
                          row=1, col=col)
            shown.add(p)
        fig.update_yaxes(title_text="ms" if col == 1 else None, row=1, col=col)
    src = ", ".join(sorted({s.source for s in found}))
    fig.update_layout(template="plotly_white", barmode="stack", height=420, legend={"orientation": "h", "y": -0.15},
                      title=f"Serving tails: p50 and p99 split into their causes (joined by {esc(src)})",
                      meta={"kind": "tails"})
    return fig


def _top_part(row: pd.Series) -> str:
    values = [row.get(f"e2e_{p}_s", 0.0) for p in PARTS]
    return PARTS[int(np.nanargmax(values))] if np.isfinite(values).any() else "unmeasured"


def requests_figure(report: Report) -> go.Figure:
    """Each request at its arrival, by E2E (ms), coloured by the part that holds most of it."""
    found = splits(report)
    if not found or not any(len(s.requests) for s in found):
        return message_figure("no load-test requests in this report", "tail_requests")
    fig = go.Figure()
    arrival = report.requests.set_index(["run", "request_id"]) if "run" in report.requests.columns else None
    seen: set[str] = set()
    for split in found:
        r = split.requests
        if not len(r):
            continue
        top = r.apply(_top_part, axis=1)
        for p in PARTS:
            sel = r[top == p]
            if not len(sel):
                continue
            if arrival is not None and split.run:
                x = [float(arrival.loc[(split.run, int(i)), "arrival_s"]) for i in sel["request_id"]]
            else:
                by_id = report.requests.set_index("request_id")["arrival_s"]
                x = [float(by_id.loc[int(i)]) for i in sel["request_id"]]
            custom = np.array([[split.run, int(i), float(t) * 1e3, float(e) * 1e3] for i, t, e in
                               zip(sel["request_id"], sel["ttft_s"], sel["e2e_s"])], dtype=object)
            fig.add_trace(go.Scatter(x=x, y=sel["e2e_s"].to_numpy(float, na_value=np.nan) * 1e3, mode="markers",
                                     marker={"color": PART_COLORS[p], "size": 8}, name=esc(PART_WORDS[p]),
                                     legendgroup=p, showlegend=p not in seen, customdata=custom,
                                     hovertemplate="request %{customdata[1]} (%{customdata[0]}): TTFT "
                                                   "%{customdata[2]:.2f} ms, E2E %{customdata[3]:.2f} ms"
                                                   "<extra>" + esc(PART_WORDS[p]) + "</extra>"))
            seen.add(p)
    fig.update_layout(template="plotly_white", height=380, legend={"orientation": "h", "y": -0.25},
                      title="Requests by arrival and E2E, coloured by their largest part: click one for its timeline",
                      meta={"kind": "tail_requests"})
    fig.update_xaxes(title="arrival (s from the run's start)")
    fig.update_yaxes(title="E2E (ms)", type="log")
    return fig


def _families_text(fam: pd.DataFrame, pos: int) -> str:
    if pos not in fam.index:
        return "no kernels recorded"
    row = fam.loc[pos]
    row = row[row > 0].sort_values(ascending=False)
    total = float(row.sum())
    if total <= 0:
        return "no kernels recorded"
    return ", ".join(f"{esc(c)} {v / 1e3:.1f} us ({100 * v / total:.0f}%)" for c, v in row.head(4).items())


def request_timeline_figure(report: Report, run: str | None, request_id: int) -> go.Figure:
    """One request from its arrival to its last token: its pieces by part, its tokens, and the steps."""
    split = next((s for s in splits(report) if (s.run or None) == (run or None)), None)
    if split is None:
        return message_figure(f"no run {run!r} in this report", "request_timeline")
    seg = request_timeline(split, int(request_id))
    if not len(seg):
        return message_figure(f"request {request_id} has no timeline (no token, or not sent)", "request_timeline")
    row = split.requests[split.requests["request_id"] == int(request_id)].iloc[0]
    t0 = float(seg["start_s"].min())
    # the parts of one piece of time (its own share of a shared prefill step, the others') side by side
    seg = seg.assign(at=seg["start_s"] + seg.groupby(["start_s", "end_s"], sort=False)["seconds"].cumsum()
                     - seg["seconds"])
    fig = go.Figure()
    seen: set[str] = set()
    for p in PARTS:
        sel = seg[seg["part"] == p]
        if not len(sel):
            continue
        base = (sel["at"].to_numpy(float, na_value=np.nan) - t0) * 1e3
        width = sel["seconds"].to_numpy(float, na_value=np.nan) * 1e3
        share = sel["seconds"].to_numpy(float, na_value=np.nan) / np.maximum(sel["end_s"].to_numpy(float, na_value=np.nan) - sel["start_s"].to_numpy(float, na_value=np.nan), 1e-12)
        custom = np.stack([sel["gap"].to_numpy(), sel["seconds"].to_numpy(float, na_value=np.nan) * 1e3, share * 100], axis=1)
        fig.add_trace(go.Bar(y=["this request"] * len(sel), x=width, base=base, orientation="h",
                             marker_color=PART_COLORS[p], opacity=0.9, name=esc(PART_WORDS[p]), legendgroup=p,
                             showlegend=p not in seen, customdata=custom,
                             hovertemplate=esc(PART_WORDS[p]) + ": %{customdata[1]:.3f} ms (%{customdata[2]:.0f}% of "
                                           "the piece), token gap %{customdata[0]}<extra></extra>"))
        seen.add(p)
    st = split.steps
    pos = sorted({int(x) for x in seg["step"] if int(x) >= 0})
    lo, hi = float(seg["start_s"].min()), float(seg["end_s"].max())
    near = st[(st["end_s"] > lo) & (st["start_s"] < hi)]
    pos = sorted(set(pos) | set(near["pos"].astype(int)))
    if pos:
        fam = step_families(report, split)
        links = report.request_steps
        if split.run and "run" in links.columns:
            links = links[links["run"].astype(object) == split.run]
        own = links[links["request_id"] == int(request_id)].set_index("step")["role"].to_dict() if len(links) else {}
        sub = st.set_index("pos").loc[pos]
        for phase in sorted(set(sub["phase"].astype(str))):
            ph = sub[sub["phase"].astype(str) == phase]
            texts = []
            for p_, r_ in ph.iterrows():
                role = own.get(int(r_["step"]), "not in it")
                texts.append(f"{esc(phase)} step {int(r_['step'])}: batch {_int(r_.get('batch'))}, "
                             f"{_int(r_.get('tokens'))} tokens ({_int(r_.get('prefill_tokens'))} prefill, "
                             f"{_int(r_.get('decode_seqs'))} decoding)"
                             + (f", {_int(r_.get('preempted'))} preempted before it" if _num(r_.get("preempted")) else "")
                             + f"<br>this request: {esc(role)}<br>kernels: {_families_text(fam, int(p_))}")
            fig.add_trace(go.Bar(y=["steps"] * len(ph), x=(ph["end_s"] - ph["start_s"]).to_numpy(float, na_value=np.nan) * 1e3,
                                 base=(ph["start_s"].to_numpy(float, na_value=np.nan) - t0) * 1e3, orientation="h",
                                 marker_color=PHASE_COLORS.get(phase, "#8c8c8c"), opacity=0.6,
                                 marker_line={"width": 1, "color": "white"}, name=f"{esc(phase)} steps",
                                 text=texts, hovertemplate="%{text}<extra></extra>", textposition="none"))
    tokens = [t for t in _tokens(report, split.run, int(request_id))]
    if tokens:
        fig.add_trace(go.Scatter(x=[(t - t0) * 1e3 for t in tokens], y=["this request"] * len(tokens), mode="markers",
                                 marker={"symbol": "line-ns-open", "size": 16, "color": "#000"}, name="tokens",
                                 hovertemplate="token at %{x:.3f} ms<extra></extra>"))
    fig.update_layout(template="plotly_white", barmode="overlay", height=300, legend={"orientation": "h", "y": -0.35},
                      title=(f"Request {int(request_id)}{f' ({esc(split.run)})' if split.run else ''}: TTFT "
                             f"{row['ttft_s'] * 1e3:.2f} ms, E2E {row['e2e_s'] * 1e3:.2f} ms, {int(row['output_tokens'])} "
                             f"tokens (joined by {esc(split.source)})"),
                      meta={"kind": "request_timeline"})
    span = (hi - lo) * 1e3
    fig.update_xaxes(title="ms from its arrival (steps that began before it are cut at its arrival)",
                     range=[-0.02 * span, 1.02 * span])
    return fig


def _tokens(report: Report, run: str, request_id: int) -> list[float]:
    import json

    r = report.requests
    sel = r["request_id"] == request_id
    if run and "run" in r.columns:
        sel &= r["run"].astype(object) == run
    rows = r[sel]
    if not len(rows) or not isinstance(rows["token_times_s"].iloc[0], str):
        return []
    return [float(x) for x in json.loads(rows["token_times_s"].iloc[0])]


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if np.isfinite(f) else 0.0


def _int(v: Any) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return "?"
    return str(int(f)) if np.isfinite(f) else "?"


__all__ = ["PART_COLORS", "request_timeline_figure", "requests_figure", "tails_figure"]
