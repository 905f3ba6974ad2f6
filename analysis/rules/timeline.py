"""Timeline rules: idle time and its gaps, many short kernels, launch overhead, streams that do not overlap.

Each works per device on the busy timeline (kernels and copies merged). Leading and trailing idle
(before the first and after the last piece of work) is not counted, as in ``nsys analyze``'s
``gpu_gaps`` rule. On a CPU report the rows are operators, so "idle" is the time outside them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfscope.memo import memo
from perfscope.report import Report

from ..ranks import comm_mask
from ._base import (
    Finding,
    activity,
    fmt_ns,
    gaps_before,
    group_key,
    is_cpu_report,
    merge_intervals,
    pct,
    ranked,
    severity_for,
    top_names,
)

IDLE_MIN_PCT = 10.0
"""Idle share of a device's active span that makes a finding. Below a tenth, gaps are the normal
slack of a launch queue and there is little to win."""
LARGEST_GAPS = 3
"""How many of the largest gaps the evidence lists."""
HOST_WAIT_MAJORITY_PCT = 50.0
"""When at least half of the idle time is spent waiting for launch calls, the advice is about CPU
overhead (CUDA graphs, fusion); otherwise about synchronisation and dependencies."""

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

STREAM_OUTSIDE_MIN_PCT = 5.0
"""Multi-stream work that runs outside the busiest stream's busy time for 5% or more of the busy
time is worth overlapping."""


@dataclass(frozen=True)
class DeviceIdle:
    """Idle time of one device between its first and last piece of work."""

    device: str
    first_ns: int
    span_ns: float
    busy_ns: float
    gaps: pd.DataFrame  # gap_ns, gap_start_ns (int64), next_name, launch_end_ns (Int64, <NA> when unknown)

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


def launch_ends(report: Report) -> pd.Series:
    """End time of the API call behind each correlation id (the launch of a kernel or copy)."""
    api = report.api
    api = api[api["correlation"].notna()].drop_duplicates("correlation")
    return pd.Series(api["end_ns"].astype("int64").to_numpy(), index=api["correlation"].astype("int64").to_numpy())


def device_idle(report: Report) -> list[DeviceIdle]:
    """Idle time and gaps per device, each gap tied to the work that ended it (computed once per
    Report object: ``gpu-idle`` and ``launch-overhead`` both read it)."""
    return memo(report, "rules:device_idle", lambda: _device_idle(report))


def _device_idle(report: Report) -> list[DeviceIdle]:
    acts = activity(report)
    ends = launch_ends(report)
    out = []
    for device, a in acts.groupby("device", sort=True):
        a = a.sort_values("start_ns", kind="stable")
        s, e = a["start_ns"].to_numpy(), a["end_ns"].to_numpy()
        ms, me = merge_intervals(s, e)
        gap = gaps_before(s, e)
        has_gap = gap > 0
        corr = pd.Series(a["correlation"].astype("Int64").to_numpy()[has_gap])
        gaps = pd.DataFrame({
            "gap_ns": gap[has_gap],
            "gap_start_ns": s[has_gap] - gap[has_gap],
            "next_name": pd.Series(a["name"].to_numpy()[has_gap], dtype="object"),
            "launch_end_ns": corr.map(ends).astype("Int64"),
        })
        out.append(DeviceIdle(str(device), int(ms[0]), float(me[-1] - ms[0]), float((me - ms).sum()), gaps))
    return out


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
    evidence: dict[str, float | int | str] = {}
    ranges: list[str] = []
    for i, row in enumerate(top.itertuples(index=False), start=1):
        evidence[f"gap{i}_ns"] = float(row.gap_ns)
        evidence[f"gap{i}_at_ms"] = (row.gap_start_ns - origin_ns) / 1e6
        evidence[f"gap{i}_before"] = str(row.next_name)[:80]
        where = _range_at(report, row.gap_start_ns + row.gap_ns / 2)
        if where and where not in ranges:
            ranges.append(where)
    return evidence, tuple(ranges)


def _idle_advice(cpu: bool, host_wait_pct: float) -> str:
    if cpu:
        return ("Time between operators is Python and framework overhead (dispatch, tensor bookkeeping, "
                "the profiler's own cost). Fuse operator chains with torch.compile, give each operator more "
                "work (larger batch), and move per-token Python work (sampling, logging) out of the loop.")
    if host_wait_pct >= HOST_WAIT_MAJORITY_PCT:
        return (f"The GPU waits for the CPU: in {host_wait_pct:.0f}% of the idle time the next launch call had "
                "not returned when the GPU ran dry. Capture the steady-state loop in a CUDA graph "
                "(torch.compile(mode='reduce-overhead') or torch.cuda.graphs), fuse small ops, put more work in "
                "each launch (larger batch), and keep Python work (.item(), logging, tensor creation) out of it.")
    cause = "" if math.isnan(host_wait_pct) else f"only {host_wait_pct:.0f}% of it is waiting for launch calls; "
    return (f"Most idle time is not launch latency ({cause}the work was queued and waited). Look at the "
            "largest gaps: synchronisations (torch.cuda.synchronize, .item(), .cpu(), cudaDeviceSynchronize), "
            "host-side data loading or preprocessing, events waited on from other streams, or collectives "
            "waiting for other ranks.")


def gpu_idle(report: Report) -> list[Finding]:
    """Idle share and the largest gaps per device (CPU reports: time outside operators)."""
    cpu = is_cpu_report(report)
    findings = []
    for idle in device_idle(report):
        share = pct(idle.idle_ns, idle.span_ns)
        if not share >= IDLE_MIN_PCT:
            continue
        host_wait = idle.host_wait_ns
        host_pct = pct(host_wait, idle.idle_ns)
        gap_ev, ranges = _largest_gaps(report, idle, idle.first_ns)
        evidence: dict[str, float | int | str] = {
            "device": idle.device, "span_ns": idle.span_ns, "busy_ns": idle.busy_ns,
            "idle_ns": idle.idle_ns, "idle_pct": share, "gaps": len(idle.gaps),
        }
        if not math.isnan(host_wait):
            evidence["idle_waiting_for_launch_ns"] = host_wait
            evidence["idle_waiting_for_launch_pct"] = host_pct
        evidence.update(gap_ev)
        what = "is outside operators" if cpu else f"{idle.device} is idle"
        title = (f"{share:.0f}% of the active span {what} ({fmt_ns(idle.idle_ns)} in {len(idle.gaps)} gaps "
                 f"over {fmt_ns(idle.span_ns)}; largest {fmt_ns(float(gap_ev.get('gap1_ns', math.nan)))})")
        findings.append(Finding(
            "time-outside-ops" if cpu else "gpu-idle", severity_for(idle.idle_ns, idle.span_ns), title,
            evidence, _idle_advice(cpu, host_pct), idle.idle_ns, ranges=ranges))
    return findings


# ---------------------------------------------------------------------------- short kernels
def short_kernels(report: Report) -> list[Finding]:
    """Many kernels (or CPU operators) under 5 µs, and the launch gaps in front of them."""
    cpu = is_cpu_report(report)
    acts = activity(report)  # kernel rows first, with the kernel table's own index
    findings = []
    for device, k in report.kernels.groupby(report.kernels["device"].astype("object"), sort=True):
        dur = k["duration_ns"].astype("float64")
        short = (dur < SHORT_KERNEL_NS).to_numpy()
        share = pct(float(short.sum()), float(len(k)))
        if short.sum() < SHORT_KERNEL_MIN_COUNT or not share >= SHORT_KERNEL_MIN_PCT:
            continue
        on_device = acts[acts["device"].astype("object") == device]
        gap_all = pd.Series(gaps_before(on_device["start_ns"].to_numpy(), on_device["end_ns"].to_numpy()),
                            index=on_device.index)
        gap = gap_all.loc[k.index].to_numpy()
        at_stake = float(np.minimum(gap[short], LAUNCH_GAP_CAP_NS).sum())
        names = group_key(k)[short]
        short_time = float(dur[short].sum())
        unit = "operators" if cpu else "kernels"
        evidence: dict[str, float | int | str] = {
            "device": str(device), unit: len(k), f"short_{unit}": int(short.sum()),
            f"short_{unit}_pct": share, "short_time_ns": short_time,
            "short_time_pct": pct(short_time, float(dur.sum())),
            "launch_gaps_before_short_ns": at_stake, "short_threshold_ns": SHORT_KERNEL_NS,
        }
        title = (f"{share:.0f}% of the {unit} on {device} run under {SHORT_KERNEL_NS / 1000:.0f} µs "
                 f"({int(short.sum())} of {len(k)}, {float(evidence['short_time_pct']):.3g}% of {unit[:-1]} time)")
        advice = ("Operators this short are mostly dispatch overhead: fuse chains of them with torch.compile and "
                  "avoid per-element tensor work in Python." if cpu else
                  "Kernels this short cost more to launch (5-20 µs of CPU each) than to run. Fuse them "
                  "(torch.compile, fused norms/activations, foreach ops), capture repeated sequences in CUDA "
                  "graphs, and avoid tiny tensor ops (scalar math, per-element indexing) in the loop.")
        findings.append(ranked(report, "short-kernels", title, evidence, advice,
                                at_stake, kernels=top_names(names, pd.Series(1, index=names.index))))
    return findings


# ---------------------------------------------------------------------------- launch overhead
def launch_overhead(report: Report) -> list[Finding]:
    """CPU time in launch calls against kernel time, and how often the GPU waited for a launch."""
    api = report.api
    k = report.kernels
    if not len(api) or not len(k) or is_cpu_report(report):
        return []
    api = api[api["correlation"].notna()].drop_duplicates("correlation")
    launch = api.set_index(api["correlation"].astype("int64"))
    corr = k["correlation"].astype("Float64")
    # only the columns the finding reads: copying all of a 1M-row kernel table costs a second
    matched = k.loc[corr.notna(), ["device", "start_ns", "duration_ns", "name", "short_name"]].copy()
    matched["corr"] = corr[corr.notna()].astype("int64")
    matched = matched[matched["corr"].isin(launch.index)]
    if not len(matched):
        return []
    findings = []
    idle = {i.device: i for i in device_idle(report)}
    for device, m in matched.groupby(matched["device"].astype("object"), sort=True):
        finding = _launch_finding(report, str(device), m, launch, idle.get(str(device)))
        if finding is not None:
            findings.append(finding)
    return findings


def _launch_finding(report: Report, device: str, m: pd.DataFrame, launch: pd.DataFrame,
                    idle: DeviceIdle | None) -> Finding | None:
    calls = launch.loc[m["corr"].to_numpy()]
    api_ns = float((calls["end_ns"] - calls["start_ns"]).sum())
    kernel_ns = float(m["duration_ns"].sum())
    delay = (m["start_ns"].to_numpy(np.int64) - calls["end_ns"].to_numpy(np.int64)).astype(np.float64)
    starved = pct(float((delay < STARVED_NS).sum()), float(len(m)))
    api_pct = pct(api_ns, kernel_ns)
    if len(m) < LAUNCH_MIN_KERNELS or not (starved >= STARVED_MIN_PCT and api_pct >= LAUNCH_API_MIN_PCT):
        return None
    at_stake = idle.host_wait_ns if idle is not None else math.nan
    evidence: dict[str, float | int | str] = {
        "device": device, "launches": len(m), "launch_api_ns": api_ns, "kernel_ns": kernel_ns,
        "launch_api_vs_kernel_pct": api_pct,
        "median_launch_api_ns": float(np.median((calls["end_ns"] - calls["start_ns"]).to_numpy())),
        "median_queue_delay_ns": float(np.median(np.clip(delay, 0, None))),
        "started_within_10us_of_launch_pct": starved,
        "idle_waiting_for_launch_ns": at_stake,
    }
    title = (f"Launch-bound on {device}: {starved:.0f}% of {len(m)} kernels start within "
             f"{STARVED_NS / 1000:.0f} µs of their launch returning; launch calls take {fmt_ns(api_ns)} "
             f"vs {fmt_ns(kernel_ns)} of kernels")
    advice = ("The CPU cannot launch kernels as fast as the GPU runs them, so the queue stays empty. Remove "
              "launches rather than speeding them up: CUDA graphs (torch.compile(mode='reduce-overhead'), "
              "torch.cuda.CUDAGraph) replay a whole step with one launch; fusion (torch.compile, fused "
              "kernels) cuts the kernel count; a larger batch gives each launch more work.")
    names = group_key(m)
    return ranked(report, "launch-overhead", title, evidence, advice,
                   at_stake, kernels=top_names(names, pd.Series(1, index=m.index)))


# ---------------------------------------------------------------------------- streams
def serialized_streams(report: Report) -> list[Finding]:
    """Kernels on several streams that mostly take turns instead of overlapping.

    Collective kernels (NCCL/RCCL) are left out: whether communication hides behind compute is
    the ``exposed-comm`` rule's question, and it accounts for waiting on other ranks.
    """
    k = report.kernels
    if not len(k) or is_cpu_report(report) or k["stream"].notna().sum() == 0:
        return []
    k = k[~comm_mask(k)]
    findings = []
    for device, kd in k[k["stream"].notna()].groupby(k["device"].astype("object"), sort=True):
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
    title = (f"Streams on {device} take turns: {fmt_ns(outside)} of kernel time ({float(evidence['outside_busiest_stream_pct']):.3g}%) "
             f"runs while stream {main} is idle; only {fmt_ns(overlapped)} overlaps")
    advice = (f"Work on the other streams runs while stream {main} is idle, so the GPU does one thing at a "
              "time. If it is independent (communication, side branches, prefetches), let it overlap: launch "
              "it earlier, drop the synchronisations and event waits that order it after the main stream "
              "(cudaStreamWaitEvent, torch.cuda.synchronize), and overlap collectives with the next layer's "
              "compute (async ops, bucketing/prefetch in DDP/FSDP).")
    return ranked(report, "serialized-streams", title, evidence, advice,
                   outside, kernels=top_names(group_key(others), others["duration_ns"]))
