"""Rules over the steps table of a framework's trace (vLLM, SGLang, HF generate(), hand-marked).

- ``inference-window``: time of the trace outside the first step's start .. last step's end
  (model loading, profiler lead-in, teardown), said once; it is not idle time anywhere else;
- ``step-outliers``: steps kept out of the headline numbers (a host stall, the profiler's first
  step, a slow step), each with its cause;
- ``steady-state``: the distribution of step times per phase and batch size, or, with one step,
  that the trace cannot show a steady state and which profiler setting records more steps;
- ``step-idle``: the GPU idle inside the headline steps (launch-bound decode), with CUDA graphs
  present or not and the framework's own knob;
- ``mixed-steps``: share and cost of steps that carry prefill and decode tokens together.

They read the steps table and the kernels' ``step`` column only, never a source's own shape.
Engine reports (perfscope's own steps) are left to :mod:`.llm`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import clip, duration

from ..idle import COPY_API, SYNC_API, graphs_help, idle_intervals, kind_totals, largest_kind
from ..intervals import trace_span_ns
from ..steps import has_framework_steps, headline_steps, step_windows
from ._base import (
    ITEM_SPANS,
    Finding,
    Item,
    activity,
    covered_ns,
    group_key,
    info,
    merge_intervals,
    pct,
    ranked,
)
from ._gaps import idle_advice, idle_items, kind_evidence
from .evidence import clip_to, idle_within, largest, spans_of, step_items
from .knobs import framework_of, knob
from .timeline import graph_launched

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.report import Report

STEP_IDLE_MIN_PCT = 30.0
"""GPU idle share of the headline steps' windows that makes a ``step-idle`` finding: beyond a
third, the host (launches, Python, scheduling) and not the kernels sets the step time."""
OUTSIDE_MIN_PCT = 5.0
"""Share of the trace outside the inference window worth saying."""
MIXED_MIN_PCT = 5.0
"""Share of step time in mixed steps worth a finding."""

PROFILER_SETTING = {
    "vllm": ("vLLM records one step per engine iteration while its torch profiler runs (VLLM_TORCH_PROFILER_DIR "
             "set, then POST /start_profile and /stop_profile around the requests): start it before, and stop it "
             "after, several iterations of the load you want to see"),
    "sglang": ("SGLang records the steps between /start_profile and its stop: pass num_steps (e.g. "
               '{"num_steps": 20}) to POST /start_profile, or start it after warm-up and stop it later'),
    "hf": "profile several generate() calls or more new tokens (max_new_tokens)",
    "user": "mark more steps (perfscope.annotate.step) inside the profiled region",
}
"""How each framework records more steps, for a trace that holds one."""


def _steps(report: Report) -> pd.DataFrame | None:
    s = report.steps
    return s if has_framework_steps(s) else None


def _graph_share_by_step(report: Report) -> pd.Series:
    """Per step: the share of its kernels launched by a graph replay (NaN for a step without kernels)."""
    k = report.kernels
    if not len(k) or "step" not in k:
        return pd.Series(dtype="float64")
    graph = graph_launched(report).to_numpy(bool)
    has = k["step"].notna().to_numpy()
    steps = k["step"].to_numpy(dtype="float64", na_value=np.nan)[has].astype(np.int64)
    return pd.Series(graph[has].astype(float)).groupby(steps).mean()


def inference_window(report: Report) -> list[Finding]:
    """Time of the trace before the first step and after the last, said once."""
    steps = _steps(report)
    if steps is None:
        return []
    span = trace_span_ns(report)
    ws, we = step_windows(steps, report.kernels)
    starts = [df["start_ns"].min() for df in (report.kernels, report.transfers) if len(df)]
    ends = [df["end_ns"].max() for df in (report.kernels, report.transfers) if len(df)]
    if not starts or not len(ws):
        return []
    first, last = float(min(min(starts), ws[0])), float(max(max(ends), we[-1]))
    before, after = max(float(ws[0]) - first, 0.0), max(last - float(we[-1]), 0.0)
    outside = before + after
    if not pct(outside, span) >= OUTSIDE_MIN_PCT:
        return []
    evidence: dict[str, float | int | str] = {
        "steps": len(steps), "window_ns": float(we[-1] - ws[0]), "before_first_step_ns": before,
        "after_last_step_ns": after, "outside_ns": outside, "outside_pct": pct(outside, span),
        "trace_span_ns": span,
    }
    title = (f"{duration(outside)} of the trace ({pct(outside, span):.0f}%) is outside the inference window "
             f"({duration(before)} before the first step, {duration(after)} after the last)")
    items = [_outside_item(report, "before the first step", first, float(ws[0])),
             _outside_item(report, "after the last step", float(we[-1]), last)]
    found = info("inference-window", title,
                 "Model loading, warm-up, the profiler's lead-in and teardown are not part of inference: idle time "
                 "and every other finding are measured inside the steps. Start the profiler after warm-up to keep "
                 "the trace small.", **evidence)
    return [dataclasses.replace(found, items=tuple(i for i in items if i.time_ns > 0))]


def _outside_item(report: Report, where: str, lo: float, hi: float) -> Item:
    """The part of the trace ``where`` (before the first step, after the last), with the kernels
    that ran in it (their time and the largest)."""
    k = report.kernels
    inside = k[(k["start_ns"] >= lo) & (k["end_ns"] <= hi)] if len(k) else k
    t = max(hi - lo, 0.0)
    ran = ""
    if len(inside):
        top = inside.groupby(group_key(inside).to_numpy(object))["duration_ns"].sum().sort_values().index[-1]
        ran = (f": {len(inside):,} kernels ran {duration(float(inside['duration_ns'].sum()))} of it "
               f"(most: {clip(str(top), 60)})")
    return Item("range", f"{duration(t)} {where}{ran or ': no kernel ran'}", t, True, lo, hi,
                {"where": where, "kernels": len(inside)})


def step_outliers(report: Report) -> list[Finding]:
    """Steps kept out of the headline numbers, with their cause."""
    steps = _steps(report)
    if steps is None or "outlier" not in steps:
        return []
    out = steps[steps["outlier"].notna()]
    if not len(out):
        return []
    kernel_ns = pd.to_numeric(out["kernel_time_ns"], errors="coerce").fillna(0).to_numpy(np.float64, na_value=np.nan)
    wall = out["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    at_stake = float(np.clip(wall - kernel_ns, 0, None).sum())
    first = out.iloc[0]
    evidence: dict[str, float | int | str] = {"outlier_steps": len(out), "steps": len(steps)}
    for i, row in enumerate(out.head(3).itertuples(index=False), start=1):
        evidence[f"step{i}"] = int(row.step)
        evidence[f"step{i}_phase"] = str(row.phase)
        evidence[f"step{i}_wall_ns"] = float(row.duration_ns)
        evidence[f"step{i}_kernel_time_ns"] = float(pd.to_numeric(row.kernel_time_ns, errors="coerce"))
        evidence[f"step{i}_cause"] = str(row.outlier)
    what = f"step {int(first['step'])} ({first['phase']}, batch {first['batch']})"
    more = f" and {len(out) - 1} more" if len(out) > 1 else ""
    title = (f"{what}{more} kept out of the headline numbers: {first['outlier']}; its kernels ran "
             f"{duration(float(kernel_ns[0]))} of its {duration(float(wall[0]))}")
    items = _outlier_items(report, out, kernel_ns)
    call = largest(items, "fix", "call")
    stall = str(first["outlier"]).startswith("host stall")
    if stall and call is not None and call.time_ns >= 0.5 * float(wall[0] - kernel_ns[0]):
        api = str(call.attrs.get("api"))
        what = ("a blocking copy: it waits for the stream's queued work and then copies" if COPY_API.search(api)
                else "a blocking sync: it waits until the device is done" if SYNC_API.search(api)
                else "the host was inside this call")
        advice = (f"The host spent {duration(call.time_ns)} of this step inside one call, {api} ({what}), while "
                  "the device ran nothing of this trace: the call waited for work this trace does not show (another "
                  "stream or process, a collective with other ranks) or for the profiler's start. Profile more "
                  "steps to see whether it recurs; if it does, make that call non-blocking or move it off the "
                  "step's path (a pinned, non_blocking copy; no sync per step).")
    else:
        advice = ("The host made no launch call for most of this step, so the step's wall time is that pause, not the "
              "model's work (its kernels' time is). A stall at the start of profiling is often the profiler itself or the "
              "scheduler waiting (for requests, for the previous batch's results, for other ranks); one that "
              "recurs in a longer trace is the serving loop's. Profile more steps to see whether it recurs."
              if stall else
              "These steps are slower than the others of their phase and batch size (warm-up, the profiler's start, "
              "a recompilation or allocation); the phase table and findings use the other steps.")
    return [ranked(report, "step-outliers", title, evidence, advice, at_stake,
                   ranges=tuple(dict.fromkeys(str(x) for x in out["label"].head(3))), items=tuple(items))]


def _outlier_items(report: Report, out: pd.DataFrame, kernel_ns: np.ndarray) -> list[Item]:
    """What each outlier step's time beyond its kernels was: the host calls the device's idle time
    inside the step fell in (the longest first: a 463 ms ``hipMemcpyWithStream``), and the rest of
    that idle with no call around it (of unknown cause unless a range names it)."""
    acts = activity(report)
    busy = merge_intervals(acts["start_ns"].to_numpy(np.int64), acts["end_ns"].to_numpy(np.int64))
    api = report.api
    items: list[Item] = []
    for row, k_ns in zip(out.itertuples(index=False), kernel_ns.tolist()):
        lo, hi = int(row.start_ns), int(row.end_ns)
        idle = idle_intervals(busy, (np.array([lo], np.int64), np.array([hi], np.int64)))
        stake = max(float(row.duration_ns) - float(k_ns), 0.0)
        left = float((idle[1] - idle[0]).sum())
        step = f"step {int(row.step)}"
        calls = api[(api["end_ns"] > lo) & (api["start_ns"] < hi)] if len(api) else api
        done: list[Item] = []
        for call in calls.assign(_d=calls["end_ns"] - calls["start_ns"]).sort_values("_d", ascending=False).head(20) \
                .itertuples(index=False):
            cs, ce = int(call.start_ns), int(call.end_ns)
            _, s0, e0 = clip_to(idle[0], idle[1], np.array([cs], np.int64), np.array([ce], np.int64))
            t = float((e0 - s0).sum())
            if not t > 0.01 * stake:
                continue
            idle = _minus(idle, cs, ce)
            left -= t
            t = min(t, stake - sum(i.time_ns for i in done))  # its part of the stake (wall - kernel time)
            if not t > 0:
                continue
            done.append(Item("gap", f"{step}: {duration(float((e0 - s0).sum()))} of device idle inside {call.name}",
                             t, True, float(cs),
                             float(ce), {"fix": "call", "api": str(call.name), "step": int(row.step)}))
        items += done
        rest = min(left, stake - sum(i.time_ns for i in done))
        if rest > 0:
            items.append(Item("gaps", f"{step}: {duration(rest)} of device idle outside any host call "
                              f"({row.outlier})", rest, False, attrs={"fix": "unknown", "step": int(row.step)},
                              spans=spans_of(*idle)))
    return items


def _minus(sets: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The merged intervals ``sets`` with ``[lo, hi)`` cut out."""
    s, e = sets
    keep_l = (s < lo)
    left = (s[keep_l], np.minimum(e[keep_l], lo))
    keep_r = (e > hi)
    right = (np.maximum(s[keep_r], hi), e[keep_r])
    ss, ee = np.concatenate([left[0], right[0]]), np.concatenate([left[1], right[1]])
    ok = ee > ss
    return merge_intervals(ss[ok], ee[ok])


def steady_state(report: Report) -> list[Finding]:
    """Step times per phase and batch size; a one-step trace says it cannot show a steady state."""
    steps = _steps(report)
    if steps is None:
        return []
    fw = framework_of(steps)
    graphs = _graph_share_by_step(report)
    graph_pct = float(100 * graphs.mean()) if len(graphs) else math.nan
    seen = "no kernel in steps" if math.isnan(graph_pct) else (
        "CUDA graphs replayed" if graph_pct >= 50 else "kernels launched one by one (no CUDA graphs)"
        if graph_pct == 0 else "CUDA graphs in part of the steps")
    if len(steps) == 1:
        s = steps.iloc[0]
        one = info("steady-state", f"One {s['phase']} step in this trace ({seen}): it cannot show a steady state "
                   "(nor tell a stall of the first profiled step from the serving loop's)",
                   f"Record more steps: {PROFILER_SETTING.get(fw, PROFILER_SETTING['user'])}.",
                   framework=fw, steps=1, step_wall_ns=float(s["duration_ns"]), graph_launched_pct=graph_pct)
        return [dataclasses.replace(one, items=tuple(step_items(steps, steps["duration_ns"].to_numpy(np.float64, na_value=np.nan))))]
    head = headline_steps(steps)
    if not len(head):
        return []
    rows = []
    evidence: dict[str, float | int | str] = {"steps": len(steps), "headline_steps": len(head),
                                              "graph_launched_pct": graph_pct, "cuda_graphs": seen}
    groups = head.groupby([head["phase"].astype("object"), head["batch"].astype("object").fillna(-1)], sort=True)
    items = []
    for i, ((phase, batch), g) in enumerate(groups, start=1):
        d = g["duration_ns"].to_numpy(np.float64, na_value=np.nan)
        p50, p90 = np.percentile(d, [50, 90])
        rows.append(f"{phase} bs={batch}: {len(g)} steps, p50 {duration(float(p50))}, p90 {duration(float(p90))}")
        slow = g.nlargest(min(len(g), ITEM_SPANS), "duration_ns")
        items.append(Item("step", f"{phase} bs={batch}: {len(g)} steps, {duration(float(d.sum()))} (p50 "
                          f"{duration(float(p50))}, p90 {duration(float(p90))}, max {duration(float(d.max()))})",
                          float(d.sum()), True, attrs={"phase": str(phase), "batch": str(batch), "count": len(g)},
                          spans=tuple(zip(slow["start_ns"].astype(float), slow["end_ns"].astype(float)))))
        if i <= 6:
            evidence.update({f"group{i}": f"{phase} bs={batch}", f"group{i}_steps": len(g),
                             f"group{i}_p50_ns": float(p50), f"group{i}_p90_ns": float(p90),
                             f"group{i}_max_ns": float(d.max())})
    found = info("steady-state", f"Step times ({seen}): " + "; ".join(rows[:4]) + ("; ..." if len(rows) > 4 else ""),
                 "Outlier steps are left out (step-outliers); compare a phase's p90 with its p50 to see jitter.",
                 **evidence)
    return [dataclasses.replace(found, items=tuple(sorted(items, key=lambda i: -i.time_ns)))]


def step_idle(report: Report) -> list[Finding]:
    """GPU idle inside the headline decode steps: the host sets the step time (launch-bound
    decode), with CUDA graphs replayed or not and the framework's knob. (Idle over the whole
    inference window is ``gpu-idle``'s.)"""
    steps = _steps(report)
    if steps is None:
        return []
    head = headline_steps(steps)
    if not len(head) or not len(report.kernels):
        return []
    acts = activity(report)
    ms, me = merge_intervals(acts["start_ns"].to_numpy(np.int64), acts["end_ns"].to_numpy(np.int64))
    findings = []
    shares = _graph_share_by_step(report)
    fw = framework_of(steps)
    for phase in ("decode",):  # idle of the whole window is gpu-idle's; decode is where launches bind
        ph = head[head["phase"] == phase]
        if not len(ph):
            continue
        ws, we = step_windows(ph, report.kernels)
        span = float((we - ws).sum())
        busy = float(covered_ns((ms, me), ws, we).sum())
        idle_pct = pct(span - busy, span)
        if not idle_pct >= STEP_IDLE_MIN_PCT:
            continue
        g = shares.reindex(ph["step"].astype("int64").to_numpy())
        graphs = bool((g > 0.5).mean() >= 0.5) if g.notna().any() else False
        n_kernels = int(report.kernels["step"].isin(ph["step"].astype("int64").to_numpy()).sum())
        evidence: dict[str, float | int | str] = {
            "phase": phase, "steps": len(ph), "window_ns": span, "gpu_busy_ns": busy, "gpu_idle_pct": idle_pct,
            "kernels_per_step": n_kernels / len(ph), "cuda_graphs": "yes" if graphs else "no",
            "graph_launched_pct": float(100 * g.mean()) if g.notna().any() else math.nan, "framework": fw,
        }
        title = (f"The GPU is idle {idle_pct:.0f}% of the {phase} steps' time ({duration(span - busy)} of "
                 f"{duration(span)} over {len(ph)} step(s)); CUDA graphs {'replayed' if graphs else 'not used'}")
        # what the host did in those gaps (analysis/idle.py): the slices inside the steps' windows
        rows = idle_within(report, ws, we)
        items = idle_items(rows)
        totals = kind_totals(rows)
        lead = largest_kind(totals)
        evidence.update(kind_evidence(totals, rows))
        if lead is not None:
            title += f"; mostly {lead}"
        tokens = float(pd.to_numeric(ph["tokens"], errors="coerce").max())
        if graphs:
            left = ("the kernels are already replayed from graphs, so what is left is the host work around each "
                    "replay (input preparation, sampling, scheduling).")
            advice = ("The host, not the kernels, sets the step time. "
                      + (idle_advice(rows, items, graph_run=left[0].upper() + left[1:])[0] if len(rows)
                         else left[0].upper() + left[1:])
                      + (knob(fw, "graphs", graphs=True, tokens=tokens) if lead is None or graphs_help(totals) else ""))
        elif lead is None:  # no idle slice says what the host did
            advice = ("The host, not the kernels, sets the step time, but the trace records nothing of what the host "
                      "did between the kernels (no CPU events or API calls in the gaps): record the host side too "
                      "(torch.profiler with ProfilerActivity.CPU, nsys --trace=cuda,nvtx,osrt) before changing it.")
        elif graphs_help(totals):
            advice = ("The host, not the kernels, sets the step time: " + idle_advice(rows, items)[0]
                      + knob(fw, "graphs", graphs=False, tokens=tokens))
        else:
            advice = ("The host, not the kernels, sets the step time, and not by launching: "
                      + idle_advice(rows, items)[0])
        findings.append(ranked(report, "step-idle", title, evidence, advice, span - busy, ranges=(phase,),
                               items=tuple(items)))
    return findings


def _attention_split(report: Report, steps: pd.DataFrame) -> dict[str, float]:
    """The attention kernels' time of ``steps`` split between their prefilling and decoding
    requests by each step's ``attention_prefill_share`` (its label's sum of new tokens x context
    of the prefilling requests over that of all): attention work grows with q x k per request."""
    k = report.kernels
    if "category" not in k or not len(k):
        return {}
    share = pd.to_numeric(steps["attention_prefill_share"], errors="coerce")
    share.index = steps["step"].astype("int64").to_numpy()
    attn = k[(k["category"] == "attention") & k["step"].isin(share.index[share.notna()])]
    if not len(attn):
        return {}
    per_step = attn.groupby(attn["step"].astype("int64"))["duration_ns"].sum()
    pre = float((per_step * share.reindex(per_step.index)).sum())
    total = float(per_step.sum())
    return {"attention_ns": total, "attention_prefill_ns": pre, "attention_decode_ns": total - pre}


def mixed_steps(report: Report) -> list[Finding]:
    """Share and cost of mixed steps (chunked prefill riding with decodes)."""
    steps = _steps(report)
    if steps is None:
        return []
    head = headline_steps(steps)
    mixed = head[head["phase"] == "mixed"]
    if not len(mixed):
        return []
    total = float(head["duration_ns"].sum())
    t = float(mixed["duration_ns"].sum())
    share = pct(t, total)
    if not share >= MIXED_MIN_PCT:
        return []
    decode = head[head["phase"] == "decode"]
    fw = framework_of(steps)
    evidence: dict[str, float | int | str] = {
        "mixed_steps": len(mixed), "steps": len(head), "mixed_time_ns": t, "mixed_time_pct": share,
        "prefill_tokens": float(pd.to_numeric(mixed["prefill_tokens"], errors="coerce").sum()),
        "decode_seqs": float(pd.to_numeric(mixed["decode_seqs"], errors="coerce").sum()),
        "mixed_step_p50_ns": float(mixed["duration_ns"].median()),
    }
    cost = math.nan
    if len(decode):
        d50 = float(decode["duration_ns"].median())
        evidence["decode_step_p50_ns"] = d50
        cost = float(np.clip(mixed["duration_ns"].to_numpy(np.float64, na_value=np.nan) - d50, 0, None).sum())
        evidence["extra_over_decode_ns"] = cost
    share_attn = pd.to_numeric(mixed["attention_prefill_share"], errors="coerce")
    if share_attn.notna().any():
        evidence["attention_prefill_share_mean"] = float(share_attn.mean())
        evidence.update(_attention_split(report, mixed))
    title = (f"{len(mixed)} mixed step(s) (prefill and decode together) take {share:.0f}% of step time"
             + (f"; each {duration(float(mixed['duration_ns'].median()))} vs {duration(evidence['decode_step_p50_ns'])} "
                "for a decode step" if len(decode) else ""))
    advice = ("In a mixed step every decoding sequence waits for the prefill riding with it, so its inter-token "
              "latency is the mixed step's time." + knob(fw, "batch_tokens"))
    if math.isnan(cost):
        found = info("mixed-steps", title, advice, **evidence)
        return [dataclasses.replace(found, items=tuple(step_items(mixed, mixed["duration_ns"].to_numpy(np.float64, na_value=np.nan),
                                                                  describe=_mixed_words)))]
    extra = np.clip(mixed["duration_ns"].to_numpy(np.float64, na_value=np.nan) - evidence["decode_step_p50_ns"], 0, None)
    items = step_items(mixed, extra, describe=lambda r: "over a decode step (p50); " + _mixed_words(r))
    return [ranked(report, "mixed-steps", title, evidence, advice, cost, ranges=("mixed",), items=tuple(items))]


def _mixed_words(row: Mapping[str, Any]) -> str:
    """What a mixed step carried: its prefill tokens and the decodes riding with them."""
    pre, dec = pd.to_numeric(row.get("prefill_tokens"), errors="coerce"), pd.to_numeric(row.get("decode_seqs"),
                                                                                       errors="coerce")
    parts = ([f"{int(pre):,} prefill tokens"] if pd.notna(pre) else []) + \
        ([f"{int(dec):,} decoding sequences waiting on them"] if pd.notna(dec) else [])
    return " with ".join(parts) if parts else "prefill and decode tokens together"
