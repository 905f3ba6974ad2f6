"""Timeline rules: idle time and its gaps, many short kernels, launch overhead, streams that do not overlap.

Each works per device on the busy timeline (kernels and copies merged). Leading and trailing idle
(before the first and after the last piece of work) is not counted, as in ``nsys analyze``'s
``gpu_gaps`` rule. When the report has a framework's steps (vLLM, SGLang, HF, hand-marked), idle
time is measured inside the inference window only: the first step's start to the last step's end,
outlier steps cut out (:func:`..framework_steps.inference_windows`), so model loading, profiler lead-in and
teardown are not idle time (``inference-window`` reports them once). On a CPU report the rows are
operators, so "idle" is the time outside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import counted, duration
from perfscope.memo import memo
from perfscope.schema import map_distinct, rows_where, subset, value_mask, value_positions

from ..costs.compiled_steps import compiled_kernels
from ..idle import (
    cause_totals,
    first_launches,
    graphs_help,
    idle_of,
    idle_summary,
    kind_totals,
    kinds_of,
    unrecorded_facts,
)
from ..intervals import inside
from ..ranks.stats import comm_mask
from ..steps import has_framework_steps
from ..steps import inference_windows as step_inference_windows
from ._base import (
    Finding,
    Item,
    activity,
    covered_ns,
    explained_ns,
    gaps_before,
    group_key,
    is_cpu_report,
    merge_intervals,
    pct,
    ranked,
    severity_for,
    top_groups,
)
from ._gaps import (
    LONG_LAUNCH_NS,
    blocked_calls,
    blocked_launch_text,
    gap_table,
    graphs_remove,
    grouped_items,
    idle_advice,
    idle_items,
    kind_evidence,
    lead_names,
    range_family,
)
from .evidence import spans_of

if TYPE_CHECKING:
    from perfscope.report import Report

IDLE_MIN_PCT = 10.0
"""Idle share of a device's active span that makes a finding. Below a tenth, gaps are the normal
slack of a launch queue and there is little to win."""
LARGEST_GAPS = 3
"""How many of the largest gaps the evidence lists."""

SHORT_KERNEL_NS = 5_000
"""A kernel under 5 µs runs for less time than its launch costs on the CPU (5-20 µs per launch,
HTA's CUDA kernel launch statistics)."""
SHORT_KERNEL_MIN_PCT = 25.0
"""Fire when a quarter or more of the kernels are that short."""
SHORT_KERNEL_MIN_COUNT = 20
"""...and there are at least this many of them (a handful of tiny kernels is not a pattern)."""
LAUNCH_GAP_CAP_NS = 20_000
"""The gap before a short kernel is counted as launch overhead up to 20 µs, the upper end of the
CPU launch cost; longer gaps have other causes and are left to the idle rule."""

STARVED_NS = 10_000
"""A kernel that starts within 10 µs of its launch call returning found an empty queue: the GPU
was waiting for the CPU (the launch latency of the GPU itself is a few µs)."""
STARVED_MIN_PCT = 50.0
"""Launch overhead is the bottleneck when most kernels start that way..."""
LAUNCH_API_MIN_PCT = 25.0
"""...and the CPU spends at least a quarter of the kernel time inside launch calls..."""
LAUNCH_MIN_KERNELS = 20
"""...over at least 20 launches (one or two launches say nothing about a loop)."""

LAUNCH_EXPLAINS_PCT = 50.0
"""Launch-bound is claimed only when the host was inside launch calls for at least half of the idle
time (the ``launch`` cause of :mod:`..idle`): a GPU that waits while the host runs Python, copies or
synchronises is not helped by faster launches."""
TOP_CAUSE_RANGES = 3
"""How many ranges of the dominant cause the finding names."""

STREAM_OUTSIDE_MIN_PCT = 5.0
"""Multi-stream work that runs outside the busiest stream's busy time for 5% or more of the busy
time is worth overlapping."""


GRAPH_RUN_MIN_PCT = 25.0
"""A run is a CUDA-graph run when at least a quarter of its kernels are launched by graph replays
(``cudaGraphLaunch``), or when its manifest says it was compiled (``params.compile``): its launch and
short-kernel findings then point at what graphs leave, not at graphs."""


@dataclass(frozen=True)
class GraphMode:
    """How much of a run replays CUDA graphs."""

    kernels: int
    graph_kernels: int
    replays: int
    compiled: bool
    between_replays_ns: float  # time from the end of each replay to the start of the next (sum)
    idle_between_replays_ns: float  # of which the device ran no kernel or copy

    @property
    def is_graph_run(self) -> bool:
        return self.compiled or (self.replays > 0 and pct(self.graph_kernels, self.kernels) >= GRAPH_RUN_MIN_PCT)

    def evidence(self) -> dict[str, float | int | str]:
        return {"graph_replays": self.replays, "graph_launched_kernels": self.graph_kernels,
                "graph_launched_kernels_pct": pct(self.graph_kernels, self.kernels),
                "time_between_replays_ns": self.between_replays_ns,
                "idle_between_replays_ns": self.idle_between_replays_ns}


def graph_launched(report: Report) -> pd.Series:
    """Per kernel row: launched by a CUDA graph replay (its launch call is ``*GraphLaunch*``).

    Computed once per report (several rules ask, and it scans every API call's name)."""
    return memo(report, "graph_launched", lambda: _graph_launched(report)).copy()


def _graph_launched(report: Report) -> pd.Series:
    k = report.kernels
    out = pd.Series(False, index=k.index)
    api = report.api
    if len(k) and len(api) and "correlation" in k:
        calls = launch_calls(report)
        is_graph = map_distinct(calls["name"], lambda n: n is not None and "GraphLaunch" in str(n)).to_numpy(bool)
        graph_corr = calls.loc[is_graph, "correlation"]
        out |= k["correlation"].isin(graph_corr.to_numpy()).fillna(False).astype(bool)
    if "flops_source" in k:
        out |= value_mask(k, "flops_source", lambda s: isinstance(s, str) and s.startswith("graph-"))
    return out


def graph_mode(report: Report) -> GraphMode:
    """How the report's kernels were launched (graph replays or one by one); once per report."""
    return memo(report, "graph_mode", lambda: _graph_mode(report))


def _graph_mode(report: Report) -> GraphMode:
    k = report.kernels
    graph = graph_launched(report)
    g = k.loc[graph, ["correlation", "start_ns", "end_ns", "device"]]
    between = idle = math.nan
    replays = int(g["correlation"].nunique()) if len(g) else 0
    if replays > 1:
        spans = g.groupby("correlation")[["start_ns", "end_ns"]].agg({"start_ns": "min", "end_ns": "max"})
        spans = spans.sort_values("start_ns")
        ends, starts = spans["end_ns"].to_numpy(np.int64)[:-1], spans["start_ns"].to_numpy(np.int64)[1:]
        starts = np.maximum(starts, ends)
        between = float((starts - ends).sum())
        acts = activity(report)
        device = g["device"].astype("object").mode().iloc[0]
        acts = acts[acts["device"].astype("object") == device]
        merged = merge_intervals(acts["start_ns"].to_numpy(), acts["end_ns"].to_numpy())
        idle = between - float(covered_ns(merged, ends, starts).sum())
    compiled = bool((report.params or {}).get("compile")) and not is_cpu_report(report)
    return GraphMode(len(k), int(graph.sum()), replays, compiled, between, idle)


def largest_below_roof(report: Report, n: int = 3) -> str:
    """The ``n`` kernel groups with the most time and their share of the roof, as text."""
    k = report.kernels
    if not len(k) or "pct_of_roof" not in k:
        return ""
    rows = k.loc[k["pct_of_roof"].notna() & (k["duration_ns"] > 0), ["duration_ns", "pct_of_roof"]]
    if not len(rows):
        return ""
    key = group_key(k).loc[rows.index]
    time = rows["duration_ns"].astype("float64")
    g = pd.DataFrame({"time": time, "w": time * rows["pct_of_roof"].astype("float64"), "key": key})
    tot = g.groupby("key", sort=False)[["time", "w"]].sum().sort_values("time", ascending=False).head(n)
    share = tot["time"] / float(k["duration_ns"].sum()) * 100.0
    return "; ".join(f"{str(name)[:60]} ({share[name]:.0f}% of kernel time, {r.w / r.time:.0f}% of its roof)"
                     for name, r in tot.iterrows())


def compiled_cpu_run(report: Report) -> bool:
    """A CPU run whose decode step is compiled (compile=True): its kernels run inside one compiled call
    per step, so advice to compile does not apply."""
    return is_cpu_report(report) and bool((report.params or {}).get("compile"))


def graph_advice(report: Report, mode: GraphMode, *, graphs: bool = True) -> str:
    """What to do about overhead in a run that already replays CUDA graphs (``graphs``: whether the gaps'
    largest share is dispatch or launch, so that capturing more in one graph may still be advised)."""
    gaps = ""
    if mode.replays > 1 and not math.isnan(mode.between_replays_ns):
        gaps = (f" ({duration(mode.between_replays_ns / (mode.replays - 1))} from one replay's end to the next "
                f"one's start on average, the GPU idle for {pct(mode.idle_between_replays_ns, mode.between_replays_ns):.0f}% "
                "of it)")
    top = largest_below_roof(report)
    roof = f" Then the largest kernels, against their roof: {top}." if top else ""
    seen = (f"{counted(mode.replays, 'replay')}, {pct(mode.graph_kernels, mode.kernels):.0f}% of the kernels" if mode.replays
            else "compiled: compile=True")
    return (f"This run already replays CUDA graphs ({seen}), so each replay is one launch and more "
            f"graphs will not help. What is left is the host time between replays{gaps}: the step's Python, "
            "the copies into the graph's static inputs, sampling and stop checks, and synchronisations "
            "(.item(), .cpu()). Keep sampling on the device, drop the synchronisations, and prepare the next "
            "step while the GPU runs this one" + (" (or capture several steps in one graph)." if graphs else ".")
            + roof)


@dataclass(frozen=True)
class DeviceIdle:
    """Idle time of one device between its first and last piece of work."""

    device: str
    first_ns: int
    span_ns: float
    busy_ns: float
    gaps: pd.DataFrame  # gap_ns, gap_start_ns (int64), next_row (the work after it: a row of
    # intervals.activity(report)), launch_end_ns (Int64, <NA> when unknown)

    @property
    def idle_ns(self) -> float:
        return self.span_ns - self.busy_ns

    @property
    def host_wait_ns(self) -> float:
        """Idle ns where the launch call of the work ending the gap returned after the gap began."""
        known = self.gaps["launch_end_ns"].notna()
        if not known.any():
            return math.nan
        late = (self.gaps["launch_end_ns"] > self.gaps["gap_start_ns"]).fillna(False).astype(bool)
        return float(self.gaps.loc[late, "gap_ns"].sum())


def launch_calls(report: Report) -> pd.DataFrame:
    """The API calls with a correlation id, one per id (name, start_ns, end_ns, correlation):
    computed once per Report object, as three rules ask; do not modify it."""
    def build() -> pd.DataFrame:
        api = report.api[["name", "start_ns", "end_ns", "correlation"]]
        return api[api["correlation"].notna()].drop_duplicates("correlation")
    return memo(report, "rules:launch_calls", build)


def launch_positions(report: Report, correlation: np.ndarray) -> np.ndarray:
    """Row of :func:`launch_calls` for each correlation id (float, NaN for none), -1 where no call has it.

    A binary search in the ids sorted once per report: hashing 1M ids into an index per lookup
    (``Series.map``, ``.loc``, ``isin``) cost a tenth of a second each."""
    def build() -> tuple[np.ndarray, np.ndarray]:
        ids = launch_calls(report)["correlation"].to_numpy(np.float64, na_value=np.nan)
        order = np.argsort(ids, kind="stable")
        return ids[order], order
    ids, order = memo(report, "rules:launch_ids", build)
    values = np.asarray(correlation, dtype=np.float64)
    if not len(ids):
        return np.full(len(values), -1, dtype=np.int64)
    at = np.clip(np.searchsorted(ids, values), 0, len(ids) - 1)
    return np.where(ids[at] == values, order[at], -1)  # NaN equals nothing


def device_idle(report: Report) -> list[DeviceIdle]:
    """Idle time and gaps per device, each gap tied to the work that ended it (computed once per
    Report object: ``gpu-idle`` and ``launch-overhead`` both read it)."""
    return memo(report, "rules:device_idle", lambda: _device_idle(report))[0]


def activity_gaps(report: Report) -> np.ndarray:
    """Per row of :func:`..intervals.activity`: the idle ns on its device just before it started
    (0 when it overlaps earlier work), computed with :func:`device_idle`; do not modify it."""
    return memo(report, "rules:device_idle", lambda: _device_idle(report))[1]


def inference_windows(report: Report) -> tuple[np.ndarray, np.ndarray] | None:
    """The merged windows of the headline framework steps, or None when the report has none
    (engine reports and traces without step annotations: the whole active span counts)."""
    def build() -> tuple[np.ndarray, np.ndarray] | None:
        if not has_framework_steps(report.steps):
            return None
        return step_inference_windows(report.steps, report.kernels, report.transfers)
    return memo(report, "rules:inference_windows", build)


def _device_idle(report: Report) -> tuple[list[DeviceIdle], np.ndarray]:
    acts = activity(report)
    windows = inference_windows(report)
    gap_all = np.zeros(len(acts), np.int64)
    call_ends = np.append(launch_calls(report)["end_ns"].to_numpy(np.int64), 0)  # the last: for "no call" (-1)
    out = []
    starts, stops = acts["start_ns"].to_numpy(np.int64), acts["end_ns"].to_numpy(np.int64)
    correlation = acts["correlation"].to_numpy(np.float64, na_value=np.nan)
    for device, rows in value_positions(acts, "device"):
        # numeric columns only: sorting the text columns of 1M rows costs seconds
        rows = rows[np.argsort(starts[rows], kind="stable")]
        s, e = starts[rows], stops[rows]
        ms, me = merge_intervals(s, e)
        gap = gaps_before(s, e)
        gap_all[rows] = gap
        has_gap = gap > 0
        call = launch_positions(report, correlation[rows[has_gap]])
        launch_end = pd.arrays.IntegerArray(call_ends[call], call < 0)
        gaps = pd.DataFrame({
            "gap_ns": gap[has_gap],
            "gap_start_ns": s[has_gap] - gap[has_gap],
            "next_row": rows[has_gap],
            "launch_end_ns": launch_end,
        })
        if windows is not None:
            span = float((windows[1] - windows[0]).sum())
            busy = float(covered_ns(windows, ms, me).sum())
            inside = covered_ns(windows, gaps["gap_start_ns"].to_numpy(np.int64),
                                (gaps["gap_start_ns"] + gaps["gap_ns"]).to_numpy(np.int64))
            gaps = gaps.assign(gap_ns=inside.astype(np.int64))[inside > 0].reset_index(drop=True)
            if span > 0:
                out.append(DeviceIdle(str(device), int(windows[0][0]), span, busy, gaps))
            continue
        out.append(DeviceIdle(str(device), int(ms[0]), float(me[-1] - ms[0]), float((me - ms).sum()), gaps))
    return out, gap_all


def _range_at(report: Report, t_ns: float) -> str | None:
    """The innermost range around time ``t_ns`` (its path when known)."""
    r = report.ranges
    if not len(r):
        return None
    inside = r[(r["start_ns"] <= t_ns) & (r["end_ns"] >= t_ns)]
    if not len(inside):
        return None
    best = inside.sort_values("depth", ascending=False, kind="stable").iloc[0]
    path = best.get("path")
    return str(path) if isinstance(path, str) and path else str(best["name"])


def _largest_gaps(report: Report, idle: DeviceIdle, origin_ns: int) -> tuple[dict[str, float | int | str], tuple[str, ...]]:
    top = idle.gaps.nlargest(LARGEST_GAPS, "gap_ns")
    names = activity(report)["name"]
    evidence: dict[str, float | int | str] = {}
    ranges: list[str] = []
    for i, row in enumerate(top.itertuples(index=False), start=1):
        evidence[f"gap{i}_ns"] = float(row.gap_ns)
        evidence[f"gap{i}_at_ms"] = (row.gap_start_ns - origin_ns) / 1e6
        evidence[f"gap{i}_before"] = str(names.iloc[int(row.next_row)])[:80]
        where = _range_at(report, row.gap_start_ns + row.gap_ns / 2)
        if where and where not in ranges:
            ranges.append(where)
    return evidence, tuple(ranges)


def _idle_advice(cpu: bool, host_wait_pct: float, compiled: bool = False) -> str:
    """The advice when the report has no idle table to read the causes from (nothing but the gaps)."""
    if cpu and compiled:
        return ("Decode is compiled (compile=True): its kernels run inside one compiled call per step, so the "
                "time between operators is the host work around those calls: the guard check and launch code of "
                "the compiled graph, per-token Python (sampling, bookkeeping) and the eager prefill's dispatch.")
    if cpu:
        return ("Time between operators is Python and framework overhead (dispatch, tensor bookkeeping, the "
                "profiler's own cost): fuse operator chains with torch.compile and give each operator more work.")
    cause = "" if math.isnan(host_wait_pct) else f"In {host_wait_pct:.0f}% of the idle time the next launch call had not returned. "
    return (cause + "The host side of the gaps was not read, so their cause is unknown: record the CPU side "
            "(torch.profiler with ProfilerActivity.CPU, nsys with --trace=cuda,nvtx,osrt).")


def gpu_idle(report: Report) -> list[Finding]:
    """Idle share and the largest gaps per device (CPU reports: time outside operators), with the gaps
    grouped by what the host did in them (:mod:`._gaps`) and advice chosen from those groups. A report with
    a framework's steps has it measured inside its inference window."""
    cpu = is_cpu_report(report)
    mode = graph_mode(report)
    compiled_cpu = compiled_cpu_run(report)
    windows = inference_windows(report)
    idle_all = idle_of(report)
    findings = []
    for idle in device_idle(report):
        rows = rows_where(idle_all, "device", idle.device)
        # gaps over which the trace lacks dispatches are not idle time: left out of the share, said apart
        unrec = unrecorded_facts(rows)
        unrec_ns = float(unrec["ns"])
        measured_ns, measured_span = idle.idle_ns - unrec_ns, idle.span_ns - unrec_ns
        share = pct(measured_ns, measured_span)
        if not share >= IDLE_MIN_PCT:
            continue
        host_wait = idle.host_wait_ns
        host_pct = pct(host_wait, idle.idle_ns)
        gap_ev, ranges = _largest_gaps(report, _without_unrecorded(idle, rows) if unrec_ns else idle, idle.first_ns)
        gaps = len(idle.gaps) - int(unrec["gaps"])
        evidence: dict[str, float | int | str] = {
            "device": idle.device, "span_ns": idle.span_ns, "busy_ns": idle.busy_ns,
            "idle_ns": idle.idle_ns, "idle_pct": pct(idle.idle_ns, idle.span_ns), "gaps": len(idle.gaps),
        }
        if unrec_ns:
            evidence.update({"unrecorded_ns": unrec_ns, "unrecorded_gaps": int(unrec["gaps"]),
                             "unrecorded_dispatches": int(unrec["dispatches"]),
                             "unrecorded_first_id": int(unrec["first"]), "unrecorded_last_id": int(unrec["last"]),
                             "measured_idle_ns": measured_ns, "measured_span_ns": measured_span,
                             "measured_idle_pct": share})
        if not math.isnan(host_wait):
            evidence["idle_waiting_for_launch_ns"] = host_wait
            evidence["idle_waiting_for_launch_pct"] = host_pct
        evidence.update(gap_ev)
        if mode.is_graph_run and not cpu:
            evidence.update(mode.evidence())
        what = "is outside operators" if cpu else f"{idle.device} is idle"
        left_out = (f"; {duration(unrec_ns)} in {int(unrec['gaps'])} gaps over which the trace lacks "
                    f"{int(unrec['dispatches']):,} dispatches left out, not idle" if unrec_ns else "")
        title = (f"{share:.0f}% of the active span {what} ({duration(measured_ns)} in {gaps} gaps "
                 f"over {duration(measured_span)}; largest {duration(float(gap_ev.get('gap1_ns', math.nan)))}"
                 f"{left_out})")
        items: list[Item] = idle_items(rows) if len(rows) else []
        graphs = False
        if len(rows):
            totals = kind_totals(rows)
            graphs = graphs_remove(rows, totals)
            graph = graph_advice(report, mode, graphs=graphs) if mode.is_graph_run and not cpu else None
            advice, totals = idle_advice(rows, items, cpu=cpu, compiled_cpu=compiled_cpu, graph_run=graph)
            _cause_evidence(rows, evidence)
            evidence.update(kind_evidence(totals, rows))
            lead = str(evidence.get("idle_kind", ""))
            names = lead_names(items, lead)
            said = {"untraced": "host time whose calls the trace lacks"}.get(lead, lead)
            title += f"; mostly {said}" + (f" in {', '.join(names)}" if names and lead not in ("launch", "graph") else "")
            if "gap_sizes" in evidence:
                title += f"; {evidence['gap_sizes']}"
            ranges = tuple(dict.fromkeys([*_names_of(items, "range"), *ranges]))
        else:
            advice = _idle_advice(cpu, host_pct, compiled_cpu)
        if windows is not None:
            from .knobs import framework_of, knob

            fw = framework_of(report.steps)
            evidence["framework"] = fw
            evidence["measured_in"] = "inference window (first step to last, outlier steps cut out)"
            title = title.replace("of the active span", "of the inference window", 1)
            if graphs or mode.is_graph_run:
                advice += knob(fw, "graphs", graphs=mode.is_graph_run,
                               tokens=float(pd.to_numeric(report.steps["tokens"], errors="coerce").astype("float64").max()))
        # the time at stake is the measured idle: a gap over which the trace lacks dispatches is not idle time, so
        # it is neither at stake nor an item (the title, the advice, the evidence and the import's warning say it)
        items = [i for i in items if i.attrs.get("cause") != "unrecorded"]
        findings.append(Finding(
            "time-outside-ops" if cpu else "gpu-idle", severity_for(measured_ns, measured_span), title,
            evidence, advice, measured_ns, ranges=ranges, items=tuple(items),
            explained_ns=explained_ns(items, measured_ns)))
    return findings


def _without_unrecorded(idle: DeviceIdle, rows: pd.DataFrame) -> DeviceIdle:
    """``idle`` without the gaps that hold ``unrecorded`` slices (the trace lacks dispatches over them)."""
    slices = rows_where(rows, "cause", "unrecorded")
    held = merge_intervals(slices["start_ns"].to_numpy(np.int64), slices["end_ns"].to_numpy(np.int64))
    mid = idle.gaps["gap_start_ns"].to_numpy(np.int64) + idle.gaps["gap_ns"].to_numpy(np.int64) // 2
    return DeviceIdle(idle.device, idle.first_ns, idle.span_ns, idle.busy_ns,
                      idle.gaps[~inside(held, mid)].reset_index(drop=True))


def _names_of(items: list[Item], attr: str) -> list[str]:
    """The distinct ``attr`` values of ``items``, in order."""
    return list(dict.fromkeys(str(i.attrs[attr]) for i in items if i.attrs.get(attr)))


def _cause_evidence(idle: pd.DataFrame, evidence: dict[str, float | int | str]) -> None:
    """Add the idle time per cause (analysis/idle.py) to ``evidence``: ``idle_<cause>_ns`` / ``_pct``, the
    dominant cause (``unknown`` only when nothing else was seen), the ranges it fell in, its median slice,
    and for copies their count, bytes, rate and pinning."""
    totals = cause_totals(idle)
    total = sum(totals.values())
    for cause, ns in totals.items():
        evidence[f"idle_{cause}_ns"] = ns
        evidence[f"idle_{cause}_pct"] = pct(ns, total)
    known = {c: ns for c, ns in totals.items() if c not in ("unknown", "unrecorded") and ns > 0}  # measured idle's
    cause = max(known, key=lambda c: known[c]) if known else "unknown"
    evidence["idle_cause"] = cause
    summary = idle_summary(idle)
    mine = summary[(summary["cause"] == cause) & summary["range"].notna()]
    # ranges numbered per layer / token (ensure_layer_3_weights) are one family: ensure_layer_N_weights
    family = mine["range"].astype(str).str.replace(r"\d+", "N", regex=True)
    mine = (mine.assign(range=family).groupby("range", sort=False)[["duration_ns", "idle_pct"]].sum()
            .sort_values("duration_ns", ascending=False, kind="stable").head(TOP_CAUSE_RANGES).reset_index())
    for i, row in enumerate(mine.itertuples(index=False), start=1):
        evidence[f"{cause}_range{i}"] = str(row.range)
        evidence[f"{cause}_range{i}_ns"] = float(row.duration_ns)
        evidence[f"{cause}_range{i}_pct_of_idle"] = float(row.idle_pct)
    rows = idle[idle["cause"] == cause]
    evidence[f"{cause}_median_slice_ns"] = float(rows["duration_ns"].median())
    if cause == "copy":
        copies = rows[rows["correlation"].notna()].drop_duplicates("correlation")
        evidence["copies"] = len(copies)
        moved = float(copies["bytes"].sum()) if copies["bytes"].notna().any() else math.nan
        evidence["copy_bytes"] = moved
        evidence["copy_idle_rate_bytes_per_s"] = moved / (float(rows["duration_ns"].sum()) / 1e9)
        pin = copies["pinned"].dropna().astype(bool)
        evidence["copies_pinned"] = "unknown" if not len(pin) else "all" if pin.all() else \
            "none" if not pin.any() else f"{int(pin.sum())} of {len(pin)}"


# ---------------------------------------------------------------------------- short kernels
def short_kernels(report: Report) -> list[Finding]:
    """Many kernels (or CPU operators) under 5 µs, and the launch gaps in front of them."""
    cpu = is_cpu_report(report)
    mode = graph_mode(report)
    in_graph = graph_launched(report)
    findings = []
    kernels = report.kernels
    all_dur = kernels["duration_ns"].to_numpy("float64", na_value=np.nan)
    replayed_all = in_graph.to_numpy(bool)
    gap_all = activity_gaps(report)  # kernel rows of activity() keep the kernel positions
    for device, rows in value_positions(kernels, "device"):  # positions: no copy of the text columns
        dur = pd.Series(all_dur[rows], index=rows)
        short = (dur < SHORT_KERNEL_NS).to_numpy()
        share = pct(float(short.sum()), float(len(rows)))
        if short.sum() < SHORT_KERNEL_MIN_COUNT or not share >= SHORT_KERNEL_MIN_PCT:
            continue
        gap = gap_all[rows]
        replayed = replayed_all[rows]
        # a kernel replayed from a graph has no CPU launch of its own: its gap is not launch overhead
        at_stake = float(np.minimum(gap[short & ~replayed], LAUNCH_GAP_CAP_NS).sum())
        short_time = float(dur[short].sum())
        unit = "operators" if cpu else "kernels"
        evidence: dict[str, float | int | str] = {
            "device": str(device), unit: len(rows), f"short_{unit}": int(short.sum()),
            f"short_{unit}_pct": share, "short_time_ns": short_time,
            "short_time_pct": pct(short_time, float(dur.sum())),
            "launch_gaps_before_short_ns": at_stake, "short_threshold_ns": SHORT_KERNEL_NS,
        }
        title = (f"{share:.0f}% of the {unit} on {device} run under {SHORT_KERNEL_NS / 1000:.0f} µs "
                 f"({int(short.sum())} of {len(rows)}, {float(evidence['short_time_pct']):.3g}% of {unit[:-1]} time)")
        # what the host did in the gaps in front of them (analysis/idle.py), each gap's time capped as above
        front = short & ~replayed & (gap > 0)
        kinds, front_ns, g_start, g_end = _gaps_before(report, str(device), kernels["start_ns"].to_numpy(np.int64)[rows[front]],
                                                       np.minimum(gap[front], LAUNCH_GAP_CAP_NS).astype(np.float64))
        # a gap over which the trace lacks dispatches is not a launch gap: the device likely ran kernels there
        unrec = kinds == "unrecorded"
        if unrec.any():
            evidence["gaps_before_short_unrecorded"] = int(unrec.sum())
            evidence["gaps_before_short_unrecorded_ns"] = float(front_ns[unrec].sum())
            at_stake -= float(front_ns[unrec].sum())
            evidence["launch_gaps_before_short_ns"] = at_stake
            kinds, front_ns, g_start, g_end = kinds[~unrec], front_ns[~unrec], g_start[~unrec], g_end[~unrec]
        items = grouped_items(kinds, front_ns, g_start, g_end, f"short {unit}", {"device": str(device)})
        totals = {str(k): float(front_ns[kinds == k].sum()) for k in pd.unique(kinds)}
        graphs = graphs_help(totals)
        lead = max(totals, key=lambda k: totals[k]) if totals else None
        if lead is not None:
            evidence["gaps_before_short_kind"] = lead
            evidence["gaps_before_short_kind_pct"] = pct(totals[lead], at_stake)
        if cpu:
            names = _top_ops(kernels, rows[short], column="name")
            most = f" (most: {', '.join(names)})" if names else ""
            if lead == "dispatch":
                advice = (f"The gaps in front of them hold {duration(at_stake)}, {pct(totals[lead], at_stake):.0f}% of "
                          f"it per-operator dispatch: operators this short{most} cost more to dispatch than to run. "
                          "Fuse chains of them with torch.compile and avoid per-element tensor work in Python.")
            elif lead is None:
                advice = (f"These operators{most} run back to back, with no gap in front of them: their dispatch is "
                          "not what the time between operators is spent on.")
            else:
                advice = (f"The gaps in front of these operators{most} are mostly {lead} ({pct(totals[lead], at_stake):.0f}% "
                          "of their time), not dispatch, so fusing them would not close those gaps; the "
                          f"time-outside-ops finding names where the {lead} time goes.")
        elif graphs and lead is not None:
            ops = _top_ops(kernels, rows[short])
            from_ops = f" (most launched by {', '.join(ops)})" if ops else ""
            pos = rows[short & ~replayed]  # launched one by one; a kernel starts just after its launch when short
            tips = launch_tips(report, pos, kernels["start_ns"].to_numpy(np.int64)[pos],
                               all_dur[pos].astype(np.float64), evidence)
            if any("(most from " in t for t in tips):  # the fusion tip names the operators already
                from_ops = ""
            advice = " ".join([
                f"The gaps in front of them hold {duration(at_stake)}, {pct(totals[lead], at_stake):.0f}% of it "
                f"{GAP_WORDS.get(lead, lead)}: kernels this short cost more to launch than to run{from_ops}.", *tips])
        elif lead is None:
            advice = ("These kernels run back to back, with no idle gap in front of them: their launches are hidden "
                      "behind the queue and cost the GPU no time here.")
        else:
            advice = (f"The gaps in front of these kernels are mostly {lead} ({pct(totals[lead], at_stake):.0f}% of "
                      f"their time), not launch or dispatch work, so fusing them or capturing CUDA graphs would not "
                      f"close those gaps; the gpu-idle finding names where the {lead} time goes.")
        if unrec.any():
            n = int(unrec.sum())
            advice += (f" {counted(n, 'gap')} before short {unit} {'lie' if n != 1 else 'lies'} over "
                       "dispatches the trace lacks (the GPU likely ran kernels there): not counted as launch gaps.")
        if compiled_cpu_run(report):
            advice = _compiled_cpu_short_advice(kernels, rows[short], evidence)
        elif mode.is_graph_run and not cpu:
            evidence["graph_launched_short_kernels"] = int((short & replayed).sum())
            evidence.update(mode.evidence())
            advice = (f"{int((short & replayed).sum())} of the short kernels are replayed from CUDA graphs, where a "
                      "kernel costs about a microsecond of GPU scheduling rather than a CPU launch; the "
                      f"{int((short & ~replayed).sum())} others are launched one by one outside the graphs (move "
                      "that work into the compiled step)." + (" Fusing further (fewer, larger kernels) still "
                                                               "shortens the step. " if graphs else " ")
                      + graph_advice(report, mode, graphs=graphs))
        findings.append(ranked(report, "short-kernels", title, evidence, advice,
                                at_stake, kernels=top_groups(kernels, rows[short]), items=tuple(items)))
    return findings


GAP_WORDS = {"dispatch": "the framework's per-operator dispatch", "launch": "inside launch calls"}
"""How the kind of the gaps in front of short kernels reads in their advice."""


def _top_ops(kernels: pd.DataFrame, rows: np.ndarray, most: int = 3, column: str = "op") -> list[str]:
    """The operators that launched most of the kernels ``rows`` (``column`` ``name``: the CPU report's operators
    themselves), most first; none where the table has no such column."""
    if column not in kernels or not len(rows):
        return []
    ops = kernels[column].iloc[rows].dropna().astype(str)
    return [str(o) for o in ops.value_counts().head(most).index] if len(ops) else []


def _gaps_before(report: Report, device: str, starts: np.ndarray,
                 time_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For work starting at ``starts`` on ``device``: the kind of the idle gap that ends there (``unknown``
    where the idle table has none: outside the window), with ``time_ns`` per gap and the gaps' start and end."""
    idle = idle_of(report)
    gaps = gap_table(rows_where(idle, "device", device))
    kinds = np.full(len(starts), "unknown", dtype=object)
    g_start, g_end = starts.astype(np.float64) - time_ns, starts.astype(np.float64)
    if len(gaps) and len(starts):
        ends = gaps["end_ns"].to_numpy(np.int64)
        at = np.clip(np.searchsorted(ends, starts), 0, len(ends) - 1)
        hit = ends[at] == starts
        kinds[hit] = gaps["kind"].to_numpy(object)[at[hit]]
        g_start[hit] = gaps["start_ns"].to_numpy(np.float64, na_value=np.nan)[at[hit]]
    return kinds, time_ns, g_start, g_end


def _compiled_cpu_short_advice(kernels: pd.DataFrame, short_rows: np.ndarray,
                               evidence: dict[str, float | int | str]) -> str:
    """Where the short operators of a compiled CPU run are: the compiled step's work (inductor's
    kernels and the BLAS products it calls), the rest of decode (views, Dynamo's guard check and
    wrappers, sampling), or the eager phases (prefill)."""
    short = kernels.iloc[short_rows]
    decode = (short["phase"].astype("object") == "decode").to_numpy(bool)
    step_work = decode & (compiled_kernels(short["name"]) | (short["category"].astype("object") == "gemm").to_numpy(bool))
    counts = {"short_compiled_step_work": int(step_work.sum()),
              "short_other_decode": int((decode & ~step_work).sum()),
              "short_other_phases": int((~decode).sum())}
    evidence.update(counts)
    return (f"Decode is already compiled (compile=True). Of the short operators, {counts['short_compiled_step_work']} "
            "are the compiled step's own work (inductor's fused kernels and the matrix products it calls): short "
            f"because the model is small, and a larger batch gives each more; {counts['short_other_decode']} are "
            "other decode operators (views, Dynamo's guard check and wrappers, sampling: move per-token work into "
            f"the compiled step); {counts['short_other_phases']} run in the eager phases (prefill and setup: "
            "longer prompts or larger batches give each operator more work).")


# ---------------------------------------------------------------------------- launch overhead
def launch_overhead(report: Report) -> list[Finding]:
    """CPU time in launch calls against kernel time, and how often the GPU waited for a launch."""
    api = report.api
    k = report.kernels
    if not len(api) or not len(k) or is_cpu_report(report):
        return []
    calls = launch_calls(report)
    launch = (calls["start_ns"].to_numpy(np.int64), calls["end_ns"].to_numpy(np.int64))
    call = launch_positions(report, k["correlation"].to_numpy(np.float64, na_value=np.nan))
    # kernels replayed from a graph share one launch call: only kernels launched one by one count
    keep = (call >= 0) & ~graph_launched(report).to_numpy(bool)
    # only the columns the finding reads: copying all of a 1M-row kernel table costs a second
    matched = k.loc[keep, ["start_ns", "duration_ns"]].assign(call=call[keep])
    mode = graph_mode(report)
    if not len(matched):
        return []
    findings = []
    idle = {i.device: i for i in device_idle(report)}
    for device, m in _by_device(k, keep, matched):
        finding = _launch_finding(report, str(device), m, launch, idle.get(str(device)),
                                  mode if mode.is_graph_run else None)
        if finding is not None:
            findings.append(finding)
    return findings


def _launch_finding(report: Report, device: str, m: pd.DataFrame, launch: tuple[np.ndarray, np.ndarray],
                    idle: DeviceIdle | None, mode: GraphMode | None = None) -> Finding | None:
    """``m``: the device's kernels launched one by one, with ``call`` (a row of ``launch``: the
    launch calls' start and end ns)."""
    row = m["call"].to_numpy(np.int64)
    call_start, call_end = launch[0][row], launch[1][row]
    api_ns = float((call_end - call_start).sum())
    kernel_ns = float(m["duration_ns"].sum())
    delay = (m["start_ns"].to_numpy(np.int64) - call_end).astype(np.float64)
    starved = pct(float((delay < STARVED_NS).sum()), float(len(m)))
    api_pct = pct(api_ns, kernel_ns)
    if len(m) < LAUNCH_MIN_KERNELS or not (starved >= STARVED_MIN_PCT and api_pct >= LAUNCH_API_MIN_PCT):
        return None
    launch_idle, idle_ns = _launch_idle(report, device)
    if not pct(launch_idle, idle_ns) >= LAUNCH_EXPLAINS_PCT:
        return None  # the GPU does not wait (no idle time), or waits but not for launch calls: gpu-idle names the cause
    at_stake = launch_idle
    rows = idle_of(report)
    rows = rows_where(rows, "device", device)
    items = idle_items(subset(rows, kinds_of(rows) == "launch"))
    evidence: dict[str, float | int | str] = {
        "device": device, "launches": len(m), "launch_api_ns": api_ns, "kernel_ns": kernel_ns,
        "launch_api_vs_kernel_pct": api_pct,
        "median_launch_api_ns": float(np.median(call_end - call_start)),
        "median_queue_delay_ns": float(np.median(np.clip(delay, 0, None))),
        "started_within_10us_of_launch_pct": starved,
        "idle_waiting_for_launch_ns": idle.host_wait_ns if idle is not None else math.nan,
        "idle_in_launch_calls_ns": launch_idle, "idle_in_launch_calls_pct": pct(launch_idle, idle_ns),
    }
    title = (f"Launch-bound on {device}: {starved:.0f}% of {len(m)} kernels start within "
             f"{STARVED_NS / 1000:.0f} µs of their launch returning; launch calls take {duration(api_ns)} "
             f"vs {duration(kernel_ns)} of kernels")
    calls_ns = (call_end - call_start).astype(np.float64)
    long = calls_ns >= LONG_LAUNCH_NS
    evidence["long_launch_calls"] = int(long.sum())
    evidence["long_launch_calls_ns"] = float(calls_ns[long].sum())
    if blocked_calls(calls_ns) is not None:  # a few blocked calls, not the per-launch cost
        others = calls_ns[~long]
        rest = (f" The other {len(others):,} calls take a median {duration(float(np.median(others)))} each."
                if len(others) else "")
        blocked = blocked_launch_text(int(long.sum()), replays=int((report.params or {}).get("counter_replays") or 0),
                                      first=int(first_launches(report.kernels, m.index.to_numpy()[long]).sum()),
                                      queue_empty=bool((delay[long] < STARVED_NS).all()))
        advice = (f"{100 * calls_ns[long].sum() / api_ns:.0f}% of the launch-call time is in {int(long.sum())} call(s) "
                  f"of {duration(LONG_LAUNCH_NS)} or longer (the longest {duration(float(calls_ns.max()))}): "
                  f"{blocked}; CUDA graphs would not remove it." + rest)
    else:
        advice = _per_launch_advice(report, m, call_start, calls_ns, evidence)
    if mode is not None:
        evidence.update(mode.evidence())
        title = title.replace("kernels start", "kernels launched outside CUDA graphs start", 1)
        advice = (f"These {len(m)} kernels are launched one by one outside the CUDA graphs (input preparation, "
                  "sampling, copies): move that work into the compiled step or onto the device. "
                  + graph_advice(report, mode, graphs=graphs_help(kind_totals(rows))))
    return ranked(report, "launch-overhead", title, evidence, advice,  # m's index: kernel positions
                   at_stake, kernels=top_groups(report.kernels, m.index.to_numpy()), items=tuple(items))


FUSABLE = ("elementwise", "norm", "softmax", "reduction", "memory", "view")
"""Kernel categories that fusion merges into their neighbours (a matrix product or attention kernel stays one)."""


def _per_launch_advice(report: Report, m: pd.DataFrame, call_start: np.ndarray, calls_ns: np.ndarray,
                       evidence: dict[str, float | int | str]) -> str:
    """The per-launch cost of ``m`` (kernels launched one by one, index: kernel positions; their launch calls
    start at ``call_start`` and take ``calls_ns``), then what removes those launches (:func:`launch_tips`)."""
    head = (f"Each launch call takes a median {duration(float(np.median(calls_ns)))} and each kernel runs a median "
            f"{duration(float(np.median(m['duration_ns'])))}, so the CPU cannot keep the queue full: remove launches "
            "rather than speed them up.")
    return " ".join([head, *launch_tips(report, m.index.to_numpy(), call_start,
                                        m["duration_ns"].to_numpy(np.float64, na_value=np.nan), evidence)])


def launch_tips(report: Report, pos: np.ndarray, call_start: np.ndarray, dur_ns: np.ndarray,
                evidence: dict[str, float | int | str]) -> list[str]:
    """What removes the launches of the kernels at positions ``pos`` (launched at ``call_start``, running
    ``dur_ns``), chosen by what they are: elementwise and normalisation kernels not yet fused (fusion), kernels
    already compiled by Inductor (a CUDA graph of the compiled step), the launches of each repeated unit the trace
    marks (a CUDA graph of one), short matrix products (a larger batch)."""
    k = report.kernels
    cat = k["category"].iloc[pos].astype("object").to_numpy() if "category" in k else np.full(len(pos), None, object)
    names = k["name"].iloc[pos].astype("string")
    compiled = names.str.startswith("triton_").fillna(False).to_numpy(bool)
    fusable = np.isin(cat, FUSABLE) & ~compiled
    gemm = cat == "gemm"
    n = len(pos)
    evidence.update({"launches_fusable": int(fusable.sum()), "launches_compiled": int(compiled.sum()),
                     "launches_gemm": int(gemm.sum()), "median_kernel_ns": float(np.median(dur_ns))})
    tips = []
    if fusable.sum() >= 0.3 * n:
        ops = _top_ops(k, pos[fusable])
        tips.append(f"{int(fusable.sum()):,} of the {n:,} launches are elementwise, normalisation or copy kernels"
                    + (f" (most from {', '.join(ops)})" if ops else "")
                    + ": fusing them (torch.compile, fused kernels) removes most of those launches.")
    if compiled.sum() >= 0.3 * n:
        tips.append(f"{int(compiled.sum()):,} of the {n:,} launches are already Inductor's fused Triton kernels, so fusion is done: "
                    "torch.compile(mode='reduce-overhead') replays the compiled step as a CUDA graph, one launch.")
    unit = _repeated_unit(report, call_start)
    if unit is not None:
        evidence.update({"repeated_range": unit[0], "repeats": unit[1], "launches_in_repeats": unit[2]})
    if unit is not None and not compiled.sum() >= 0.3 * n:
        what = "steps" if unit[0] == STEP else f"'{unit[0]}' ranges"
        tips.append(f"The trace's {unit[1]:,} {what} launch about {unit[2] / unit[1]:,.0f} of these kernels each: "
                    "capture one in a CUDA graph (torch.cuda.CUDAGraph, torch.compile(mode='reduce-overhead')) and "
                    "replay it with one launch.")
    elif unit is None and not tips:
        tips.append("The trace marks no repeated range around these launches (a step, a layer) to tell whether one "
                    "CUDA graph could replay them: mark the step (torch.profiler.record_function, NVTX) and profile "
                    "again.")
    if gemm.sum() >= 0.5 * n:
        tips.append(f"{int(gemm.sum()):,} of the launches are matrix products (median "
                    f"{duration(float(np.median(dur_ns[gemm])))}): a larger batch gives each more work for the same "
                    "launch.")
    return tips


STEP = "(steps)"
""":func:`_repeated_unit`'s name for the report's own steps."""


def _repeated_unit(report: Report, call_start: np.ndarray) -> tuple[str, int, int] | None:
    """The coarsest repeated unit whose occurrences hold at least half the launch calls starting at
    ``call_start``: the report's steps, else a range family (its name with digits as ``N``: ``decode_step N``,
    ``layer_N``) that occurs at least twice; (name, occurrences, launches inside), None where none does."""
    n = len(call_start)
    families: list[tuple[str, np.ndarray, np.ndarray]] = []
    if len(report.steps) >= 2:
        families.append((STEP, report.steps["start_ns"].to_numpy(np.int64), report.steps["end_ns"].to_numpy(np.int64)))
    r = report.ranges
    if len(r):
        fam = map_distinct(r["name"], lambda x: range_family(x) or "").to_numpy(object)
        names, counts = np.unique(fam.astype(str), return_counts=True)
        counts[names == ""] = 0  # a range without a name is no family
        starts, ends = r["start_ns"].to_numpy(np.int64), r["end_ns"].to_numpy(np.int64)
        for i in np.argsort(counts, kind="stable")[(np.sort(counts) >= 2)][:REPEAT_CANDIDATES]:
            sel = fam == names[i]
            families.append((str(names[i]), starts[sel], ends[sel]))
    for name, s, e in families:
        hit = int(inside(merge_intervals(s, e), call_start).sum())
        if n and hit >= 0.5 * n:
            return name, len(s), hit
    return None


REPEAT_CANDIDATES = 20
"""Range families tried by :func:`_repeated_unit`, fewest occurrences first."""


def _launch_idle(report: Report, device: str) -> tuple[float, float]:
    """Idle ns of ``device`` with the host inside launch calls, and all its idle ns (analysis/idle.py)."""
    idle = idle_of(report)
    if not len(idle):
        return 0.0, 0.0
    totals = cause_totals(idle, device)
    return totals["launch"], sum(totals.values())


def _by_device(kernels: pd.DataFrame, keep: np.ndarray, kept: pd.DataFrame) -> list[tuple[object, pd.DataFrame]]:
    """``kept`` (the rows of ``kernels`` where ``keep``) split by device, devices sorted, through
    :func:`value_positions` (grouping by 1M device strings hashes them again)."""
    kept_at = np.cumsum(keep) - 1  # each kernel row's position in ``kept``
    parts = [(device, rows[keep[rows]]) for device, rows in value_positions(kernels, "device")]
    return [(device, kept.iloc[kept_at[rows]]) for device, rows in parts if len(rows)]


# ---------------------------------------------------------------------------- streams
def serialized_streams(report: Report) -> list[Finding]:
    """Kernels on several streams that mostly take turns instead of overlapping.

    Collective kernels (NCCL/RCCL) are left out: whether communication hides behind compute is
    the ``exposed-comm`` rule's question, and it accounts for waiting on other ranks.
    """
    k = report.kernels
    if not len(k) or is_cpu_report(report) or k["stream"].notna().sum() == 0:
        return []
    keep = ~comm_mask(k) & k["stream"].notna().to_numpy()
    kept = k.loc[keep, ["stream", "start_ns", "end_ns", "duration_ns"]]  # no copy of the text columns
    findings = []
    for device, kd in _by_device(k, keep, kept):
        finding = _stream_finding(report, str(device), kd)
        if finding is not None:
            findings.append(finding)
    return findings


def _stream_finding(report: Report, device: str, k: pd.DataFrame) -> Finding | None:
    busy = {}
    for stream, ks in k.groupby("stream", sort=True):
        ms, me = merge_intervals(ks["start_ns"].to_numpy(), ks["end_ns"].to_numpy())
        busy[int(stream)] = float((me - ms).sum())
    if len(busy) < 2:
        return None
    ms, me = merge_intervals(k["start_ns"].to_numpy(), k["end_ns"].to_numpy())
    union = float((me - ms).sum())
    main = max(busy, key=lambda s: busy[s])
    outside = union - busy[main]
    overlapped = sum(busy.values()) - union
    if not pct(outside, union) >= STREAM_OUTSIDE_MIN_PCT:
        return None
    others = k[k["stream"] != main]
    evidence: dict[str, float | int | str] = {
        "device": device, "streams": len(busy), "busiest_stream": main, "busiest_stream_busy_ns": busy[main],
        "kernel_busy_ns": union, "outside_busiest_stream_ns": outside,
        "outside_busiest_stream_pct": pct(outside, union), "overlapped_ns": overlapped,
        "overlapped_pct_of_other_streams": pct(overlapped, sum(busy.values()) - busy[main]),
    }
    for stream in sorted((s for s in busy if s != main), key=lambda s: -busy[s])[:3]:
        evidence[f"stream_{stream}_busy_ns"] = busy[stream]
    title = (f"Streams on {device} take turns: {duration(outside)} of kernel time ({float(evidence['outside_busiest_stream_pct']):.3g}%) "
             f"runs while stream {main} is idle; only {duration(overlapped)} overlaps")
    items = []
    main_busy = merge_intervals(k.loc[k["stream"] == main, "start_ns"].to_numpy(), k.loc[k["stream"] == main, "end_ns"].to_numpy())
    for stream, ks in others.groupby("stream", sort=True):
        alone = ks["duration_ns"].to_numpy(np.float64, na_value=np.nan) - covered_ns(main_busy, ks["start_ns"].to_numpy(), ks["end_ns"].to_numpy())
        big = int(np.argmax(alone))
        top = top_groups(report.kernels, ks.index.to_numpy(), alone)[:2]
        items.append(Item("kernels", f"{duration(float(alone.sum()))} of {len(ks)} kernels on stream {int(stream)} while "
                                     f"stream {main} is idle ({', '.join(str(t)[:60] for t in top)})",
                          float(alone.sum()), True, float(ks["start_ns"].iloc[big]), float(ks["end_ns"].iloc[big]),
                          {"stream": int(stream), "kernels": len(ks), "device": device},
                          spans=spans_of(ks["start_ns"].to_numpy(np.int64), ks["end_ns"].to_numpy(np.int64))))
    waits = _stream_orders(report)
    evidence.update({f"{name}_calls": n for name, n in waits.items()})
    order = (f" The trace shows what orders them: {', '.join(f'{n} {name}' for name, n in waits.items())}; drop the "
             "waits and synchronisations that the data does not need." if waits else "")
    advice = (f"Work on the other streams runs while stream {main} is idle, so the GPU does one thing at a "
              "time. If it is independent (side branches, prefetches), let it overlap: launch it earlier, on its "
              "own stream, and order it after the main stream only where it reads that stream's results." + order)
    return ranked(report, "serialized-streams", title, evidence, advice,
                   outside, kernels=top_groups(report.kernels, others.index.to_numpy(),
                                               others["duration_ns"].to_numpy(np.float64, na_value=np.nan)), items=tuple(items))


STREAM_ORDER_API = ("StreamWaitEvent", "EventSynchronize", "StreamSynchronize", "DeviceSynchronize")
"""Host calls that order streams: a wait on another stream's event, or a sync that drains them."""


def _stream_orders(report: Report) -> dict[str, int]:
    """How many calls of each :data:`STREAM_ORDER_API` kind the trace has (``cudaStreamWaitEvent``: 3)."""
    api = report.api
    if not len(api):
        return {}
    names = api["name"].astype("object")
    counts = names.value_counts()
    return {str(n): int(c) for n, c in counts.items() if any(w in str(n) for w in STREAM_ORDER_API)}
