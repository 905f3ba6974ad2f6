"""Figures of a load-test report (``perfscope loadtest``).

- :func:`latency_cdf`: the distribution (empirical CDF) of TTFT, TPOT, ITL and E2E, one line per rate;
- :func:`load_over_time`: decode batch size, KV-cache slots and bytes in use, and queue length
  against time, per rate;
- :func:`decode_roofline`: decode steps grouped by batch size on the roofline (model FLOPs and
  the bytes the step reads: weights plus the KV cache at its real element size);
- :func:`rate_curve`: the throughput-latency curve of a rate sweep with the knee marked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from perfscope.analysis.summaries.loadtest import (
    is_loadtest,
    itl_values,
    rate_summary,
    run_tables,
    runs,
)

from ..text import esc
from . import roofline_data as rd
from .messages import message_figure
from .roofline import _roof_traces

if TYPE_CHECKING:
    from perfscope.report import Report

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
DTYPE_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values[~np.isnan(values)])
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def latency_cdf(report: Report) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT, ITL (every gap) and E2E in ms, one line per rate."""
    if not len(report.requests):
        return message_figure("no requests in this report", "load_latency_cdf")
    panels = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL (every gap)"), ("e2e_s", "E2E"))
    fig = make_subplots(rows=1, cols=4, subplot_titles=[t for _, t in panels], shared_yaxes=True)
    for i, run in enumerate(runs(report)):
        req = run_tables(report, run["run"], "requests")
        for col, (key, _) in enumerate(panels, start=1):
            values = itl_values(req) if key == "itl_s" else req[key].to_numpy(dtype=float, na_value=np.nan)
            x, y = _ecdf(np.asarray(values, dtype=float))
            fig.add_trace(go.Scatter(x=x * 1e3, y=y, mode="lines", line={"shape": "hv", "color": _color(i)},
                                     name=esc(run["run"]), legendgroup=esc(run["run"]), showlegend=col == 1,
                                     hovertemplate="%{x:.2f} ms: %{y:.0%} of values<extra>" + esc(run["run"]) + "</extra>"),
                          row=1, col=col)
            fig.update_xaxes(title_text="ms", type="log", row=1, col=col)
    fig.update_yaxes(title_text="fraction of values", row=1, col=1)
    fig.update_layout(template="plotly_white", title="Latency distributions (TTFT and E2E from arrival)",
                      height=380, meta={"kind": "load_latency_cdf"})
    return fig


def load_over_time(report: Report) -> go.Figure:
    """Decode batch size, KV slots in use, KV bytes in use and queue length over the run."""
    steps = report.steps
    if not len(steps) or "queue_len" not in steps.columns:
        return message_figure("no load-test steps in this report", "load_over_time")
    rows = (("decode_seqs", "decode batch (sequences)"), ("kv_slots_in_use", "KV slots in use"),
            ("kv_cache_size_bytes", "KV cache in use (MiB)"), ("queue_len", "queue length (requests)"))
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, subplot_titles=[t for _, t in rows],
                        vertical_spacing=0.06)
    for i, run in enumerate(runs(report)):
        s = run_tables(report, run["run"], "steps").sort_values("start_s")
        for r, (col, title) in enumerate(rows, start=1):
            sub = s[s["phase"] == "decode"] if col == "decode_seqs" else s
            y = sub[col].to_numpy(dtype=float, na_value=np.nan) / (2 ** 20 if col.endswith("_bytes") else 1)
            fig.add_trace(go.Scatter(x=sub["start_s"], y=y, mode="lines", line={"shape": "hv", "color": _color(i)},
                                     name=esc(run["run"]), legendgroup=esc(run["run"]), showlegend=r == 1,
                                     hovertemplate="t=%{x:.3f} s: %{y}<extra>" + esc(title) + "</extra>"),
                          row=r, col=1)
    fig.update_xaxes(title_text="time since the run's start (s)", row=4, col=1)
    fig.update_layout(template="plotly_white", title="Batch size, KV cache and queue over time", height=720,
                      meta={"kind": "load_over_time"})
    return fig


def decode_points(report: Report) -> pd.DataFrame:
    """Decode steps grouped by batch size: steps, time, FLOPs, bytes, intensity, achieved FLOP/s."""
    s = report.steps
    if not len(s) or "flops" not in s.columns:
        return pd.DataFrame()
    d = s[(s["phase"] == "decode") & s["flops"].notna()].copy()
    if not len(d):
        return pd.DataFrame()
    d["bytes"] = d["weight_bytes"] + d["kv_cache_bytes"]
    g = d.groupby("batch").agg(steps=("step", "size"), duration_ns=("duration_ns", "sum"), flops=("flops", "sum"),
                               bytes=("bytes", "sum")).reset_index()
    g["arith_intensity"] = g["flops"] / g["bytes"]
    g["achieved_flops_per_s"] = g["flops"] / (g["duration_ns"] / 1e9)
    g["achieved_bytes_per_s"] = g["bytes"] / (g["duration_ns"] / 1e9)
    return g


def decode_roofline(report: Report) -> go.Figure:
    """Decode steps of each batch size on the roofline: intensity grows with batch."""
    g = decode_points(report)
    if not len(g):
        return message_figure("no decode steps with model FLOPs in this report", "load_decode_roofline")
    dev = report.device
    prec = DTYPE_PRECISION.get(str(report.params.get("dtype")), "fp32")
    ridges = rd.ridge_points(dev, [prec] if dev else [])
    xs = g["arith_intensity"].to_numpy(dtype=float, na_value=np.nan)
    lo = min([*xs, *(r[1] for r in ridges)]) / 4
    hi = max([*xs, *(r[1] for r in ridges)]) * 4
    fig = go.Figure(_roof_traces(rd.roof_lines(dev, [prec], lo, hi), ridges) if dev else [])
    dur = g["duration_ns"].to_numpy(dtype=float, na_value=np.nan)
    top = np.nanmax(dur) if np.isfinite(dur).any() else 1.0
    sizes = 8 + 22 * np.sqrt(np.nan_to_num(dur, nan=0.0) / max(top, 1.0))  # an unmeasured step: the smallest mark
    fig.add_trace(go.Scatter(
        x=g["arith_intensity"], y=g["achieved_flops_per_s"], mode="markers+text", name="decode steps by batch size",
        text=[f"b{int(b)}" for b in g["batch"]], textposition="top center", marker={"size": sizes, "color": "#d62728"},
        customdata=np.stack([g["batch"], g["steps"], g["duration_ns"] / g["steps"] / 1e6,
                             g["achieved_bytes_per_s"] / 1e9], axis=1),
        hovertemplate="batch %{customdata[0]}: %{customdata[1]} steps, %{customdata[2]:.3f} ms each<br>"
                      "%{x:.3g} FLOP/B, %{y:.3s}FLOP/s, %{customdata[3]:.2f} GB/s<extra></extra>"))
    kv = esc(str(report.params.get("kv_dtype", "auto")) + ("" if report.params.get("kv_policy") in (None, "full")
                                                             else f", {report.params['kv_policy']}"))
    fig.update_layout(template="plotly_white", height=440, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                      title=f"Decode steps on the roofline, by batch size (model FLOPs; weights + KV bytes, KV {kv})",
                      legend={"orientation": "h", "y": -0.2}, meta={"kind": "load_decode_roofline"})
    fig.update_xaxes(title="arithmetic intensity (FLOP/byte)", type="log")
    fig.update_yaxes(title="achieved FLOP/s", type="log")
    return fig


def rate_curve(report: Report, summary: pd.DataFrame | None = None) -> go.Figure:
    """p50/p99 E2E and p99 TTFT against achieved request throughput, one point per rate; the knee starred."""
    s = rate_summary(report) if summary is None else summary
    s = s[s["rate_per_s"].notna()] if len(s) else s
    if len(s) < 2:
        return message_figure("one rate only: run --rate 1,2,4,8 for the throughput-latency curve", "load_rate_curve")
    fig = go.Figure()
    for col, name, dash in (("e2e_p99_s", "E2E p99", "solid"), ("e2e_p50_s", "E2E p50", "dot"),
                            ("ttft_p99_s", "TTFT p99", "dash")):
        fig.add_trace(go.Scatter(x=s["request_throughput_per_s"], y=s[col] * 1e3, mode="lines+markers+text",
                                 name=name, line={"dash": dash}, text=[f"{r:g}/s" for r in s["rate_per_s"]],
                                 textposition="top left",
                                 hovertemplate="offered %{text}: %{x:.2f} req/s, %{y:.1f} ms<extra>" + name + "</extra>"))
    k = s[s["knee"]] if "knee" in s.columns else s.iloc[0:0]
    if len(k):
        fig.add_trace(go.Scatter(x=k["request_throughput_per_s"], y=k["e2e_p99_s"] * 1e3, mode="markers",
                                 marker={"symbol": "star", "size": 18, "color": "#000"},
                                 name=f"knee: {float(k['rate_per_s'].iloc[0]):g} req/s offered",
                                 hovertemplate="p99 E2E leaves its floor beyond this rate<extra>knee</extra>"))
    fig.update_layout(template="plotly_white", height=420, title="Throughput against latency, by offered rate",
                      legend={"orientation": "h", "y": -0.2}, meta={"kind": "load_rate_curve"})
    fig.update_xaxes(title="achieved request throughput (requests/s)")
    fig.update_yaxes(title="latency (ms)", type="log")
    return fig


def load_figures(report: Report) -> dict[str, go.Figure]:
    """Every load-test figure by name ({} for other reports)."""
    if not is_loadtest(report):
        return {}
    figs = {"latency": latency_cdf(report), "over time": load_over_time(report),
            "decode roofline": decode_roofline(report)}
    if len(runs(report)) > 1:
        figs["rates"] = rate_curve(report)
    # a figure with nothing to draw (an endpoint load test has no engine steps for the load over time
    # nor kernels for the decode roofline) is left out, not drawn empty
    return {name: f for name, f in figs.items() if not (f.layout.meta or {}).get("empty")}


def load_notes(report: Report) -> list[str]:
    """One-line facts for the section: policy, slots, token budget, KV dtype and its logit error."""
    lt = report.params.get("loadtest", {})
    p = report.params
    notes = []
    if lt.get("policy") is not None:  # the engine's own scheduler (an endpoint's is the server's, unseen)
        budget = p.get("max_batched_tokens") or "none (whole prompts)"
        facts = [f"policy {lt.get('policy')}", f"{p['max_batch']} KV slots" if p.get("max_batch") else None,
                 f"token budget {budget}"]
        if lt.get("kv_dtype"):
            per_token = p.get("kv_cache_bytes_per_token")
            facts.append(f"KV cache {lt['kv_dtype']}" + (f" ({per_token} bytes per token)" if per_token else ""))
        if lt.get("kv_policy") not in (None, "full"):
            facts.append(f"KV policy {lt['kv_policy']}")
        notes.append(", ".join(f for f in facts if f))
    if p.get("endpoint"):
        conc = p.get("max_concurrency")
        notes.append(f"endpoint {p['endpoint']} ({p.get('api') or 'completions'} API, model {p.get('model')}), "
                     + (f"at most {conc} requests in flight" if conc else "open loop (no concurrency cap)"))
    err = lt.get("kv_logit_error")
    if err:
        what = " ".join(x for x in (err["kv_dtype"] if err["kv_dtype"] != "auto" else "",
                                    str(err.get("kv_policy") or "full") if err.get("kv_policy") not in (None, "full")
                                    else "") if x)
        notes.append(f"{what} KV cache vs the full {err.get('reference', p.get('dtype'))} cache on "
                     f"{err['model']}: logit max abs error "
                     f"{err['max_abs']:.3g}, mean {err['mean_abs']:.3g}, relative RMS {err['rel_rms']:.3g}, "
                     f"top-1 agreement {err['top1_agreement'] * 100:.1f}% over {int(err['positions'])} positions")
    if lt.get("knee_rate_per_s") is not None:
        notes.append(f"knee: p99 E2E stays within 1.5x its floor up to {lt['knee_rate_per_s']:g} requests/s offered")
    return notes


__all__ = ["decode_points", "decode_roofline", "latency_cdf", "load_figures", "load_notes", "load_over_time",
           "rate_curve", "rate_summary"]
