"""``perfscope export``: a report's timeline as a Perfetto trace (protobuf TrackEvent) or as
Chrome trace JSON, for ui.perfetto.dev, chrome://tracing and the tools that read those.

Tracks: per device, one track per stream with the kernels as slices (on CPU reports, one track
per thread with the operators); the host's ranges (NVTX / record_function, and nn.Module calls
of a with_stack trace) and launch calls on their threads; the engine's phases and steps; the
NVML samples as counter tracks (one per device and metric); a load test's requests on lanes of a
``requests`` group, each with its TTFT (queued, prefill) and decode parts, on the kernels' clock
(:func:`perfscope.analysis.summaries.server_timeline.request_times_ns`), and a flow (an arrow) from each
request to every step it ran in where the scheduler logged it (``request_steps``: the engine's load
test, ``perfscope serve`` under ``--profile``; a vLLM or SGLang step names no request, so none there). A
multi-rank report (``perfscope import --ranks``) gets one track group per rank, ``rank N (device)``,
holding that rank's streams, host threads, steps, idle causes and counters, each on the rank's own
clock. Each kernel slice's args carry its
phase, step, module path (:mod:`perfscope.analysis.summaries.hierarchy`), op, FLOPs, DRAM bytes, FLOP/B,
bound and % of roof; a value that was not measured is left out, never written as 0.

Both writers stream: tables are read in chunks of :data:`CHUNK` rows and each chunk is encoded
and written before the next, so memory stays that of the report plus one chunk. The protobuf is
encoded by :mod:`perfscope.dashboard.export.protobuf` (no runtime dependency); kernel names are interned
(written once, then referred to by id). Only the report's tables and its name and device reach
the file: no manifest block, no source path, no environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import orjson
import pandas as pd

from perfscope.errors import OutputExistsError, UsageError

from . import protobuf as pb

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from perfscope.analysis.findings import Finding
    from perfscope.report import Report

CHUNK = 50_000
"""Rows encoded per chunk."""

FORMATS = ("perfetto", "chrome")
SEQ = 1
"""The trusted_packet_sequence_id of every packet (one writer, one sequence)."""

COUNTER_METRICS = ("gpu_util_pct", "mem_util_pct", "sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c",
                   "mem_used_bytes")


@dataclass
class ExportStats:
    """What was written: slices per kind, counter samples, tracks."""

    path: Path
    format: str
    kernels: int = 0
    kernel_time_ns: int = 0
    slices: dict[str, int] = field(default_factory=dict)
    counter_samples: int = 0
    tracks: int = 0
    requests: int = 0
    request_lanes: int = 0
    flows: int = 0
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- rows to write
@dataclass
class _Slices:
    """One kind of slices: times, track index per row, names (codes + distinct), per-row args."""

    kind: str
    start: np.ndarray
    end: np.ndarray
    track: np.ndarray
    track_names: list[tuple[str, str]]  # (group, name) per track index
    name_codes: np.ndarray
    names: np.ndarray
    args: dict[str, tuple[str, np.ndarray, Any]] = field(default_factory=dict)  # name -> (kind, values, distinct)
    keys: list[tuple[str, int]] | None = None  # per row, what flows find it by: (run, step) of a step slice
    flows: dict[int, list[int]] = field(default_factory=dict)  # row -> flow ids it starts (or ends: ``ends_flows``)
    ends_flows: bool = False


def _codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    codes, distinct = pd.factorize(values.astype("object"))
    return codes.astype("int64"), np.asarray(distinct, dtype=object)


def _num(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy("float64", na_value=np.nan)


def _tracks(group: str, keys: list[np.ndarray], label: Callable[..., str],
            rank: np.ndarray | None = None) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Track index per row from the key columns ``keys`` (factorized together) and each track's name.

    With ``rank`` (a multi-rank report), every rank's tracks go under one group of their own,
    ``rank N``: one track group per rank."""
    if rank is None:
        codes, distinct = pd.MultiIndex.from_arrays(keys).factorize()
        return codes.astype("int64"), [(group, label(*d)) for d in distinct]
    codes, distinct = pd.MultiIndex.from_arrays([rank, *keys]).factorize()
    return codes.astype("int64"), [(f"rank {_int_text(d[0])}", label(*d[1:])) for d in distinct]


def _rank_of(df: pd.DataFrame) -> np.ndarray | None:
    """The ``rank`` column of a multi-rank report's table (None for one rank)."""
    if "rank" not in df.columns or not len(df):
        return None
    r = _num(df, "rank")
    return None if np.isnan(r).all() else r


def _int_text(x: Any) -> str:
    return "?" if pd.isna(x) else str(int(x))


def _kernel_slices(report: Report | LeanReport) -> _Slices:
    from perfscope.analysis.summaries.hierarchy import kernel_paths

    k = report.kernels
    cpu = k["device"].astype("object").fillna("").astype(str).str.startswith("cpu").to_numpy()
    lane = np.where(cpu, _num(k, "thread"), _num(k, "stream"))
    track, names = _tracks("kernels", [k["device"].astype("object").fillna("?").to_numpy(object), cpu, lane],
                           lambda d, c, x: f"{d} {'thread' if c else 'stream'} {_int_text(x)}", _rank_of(k))
    name_codes, distinct = _codes(k["name"])
    paths, _, _ = kernel_paths(report)  # type: ignore[arg-type]  # a LeanReport has the tables it reads
    pcodes, pdistinct = pd.factorize(pd.Series(paths, dtype=object))
    ptext = np.array(["/".join(p) if p else None for p in pdistinct], dtype=object)
    s = _Slices("kernel", k["start_ns"].to_numpy("int64"), k["end_ns"].to_numpy("int64"), track, names,
                name_codes, distinct)
    for col in ("phase", "op", "bound", "precision", "limiter"):
        if col in k:
            s.args[col] = ("str", *_codes(k[col]))
    s.args["module"] = ("str", pcodes.astype("int64"), ptext)
    if "step" in k:
        s.args["step"] = ("int", _num(k, "step"), None)
    for col, label in (("flops", "flops"), ("dram_bytes", "dram_bytes"), ("arith_intensity", "flop_per_byte"),
                       ("pct_of_roof", "pct_of_roof"), ("limiter_pct", "limiter_pct")):
        s.args[label] = ("double", _num(k, col), None)
    return s


def _range_slices(report: Report | LeanReport) -> _Slices | None:
    r = report.ranges
    if not len(r):
        return None
    source = r["source"].astype("object").fillna("ranges") if "source" in r else pd.Series("ranges", index=r.index)
    track, names = _tracks("host", [source.to_numpy(object), _num(r, "thread")],
                           lambda s, t: f"{'nn.Module calls' if s == 'module' else f'{s} ranges'} (thread {_int_text(t)})",
                           _rank_of(r))
    codes, distinct = _codes(r["name"])
    s = _Slices("range", r["start_ns"].to_numpy("int64"), r["end_ns"].to_numpy("int64"), track, names, codes, distinct)
    if "path" in r:
        s.args["path"] = ("str", *_codes(r["path"]))
    return s


def _api_slices(report: Report | LeanReport) -> _Slices | None:
    a = report.api
    if not len(a):
        return None
    track, names = _tracks("host", [_num(a, "thread")], lambda t: f"launch calls (thread {_int_text(t)})", _rank_of(a))
    codes, distinct = _codes(a["name"])
    s = _Slices("api", a["start_ns"].to_numpy("int64"), a["end_ns"].to_numpy("int64"), track, names, codes, distinct)
    if "correlation" in a:
        s.args["correlation"] = ("int", _num(a, "correlation"), None)
    return s


def _step_slices(report: Report | LeanReport) -> list[_Slices]:
    st = report.steps
    if not len(st):
        return []
    rank = _rank_of(st)
    if rank is not None:  # a multi-rank report: each rank's steps and phases in its own group
        return [s for r in np.unique(rank[~np.isnan(rank)]).tolist()
                for s in _steps_of(st[rank == r], f"rank {int(r)}")]
    return _steps_of(st, "engine")


def _steps_of(st: pd.DataFrame, group: str) -> list[_Slices]:
    st = st.sort_values("start_ns", kind="stable")
    phase = st["phase"].astype("object").fillna("?").astype(str)
    label = phase + " step " + st["step"].astype("object").astype(str) + " bs=" + st["batch"].astype("object").astype(str)
    codes, distinct = _codes(label)
    steps = _Slices("step", st["start_ns"].to_numpy("int64"), st["end_ns"].to_numpy("int64"),
                    np.zeros(len(st), dtype="int64"), [(group, "steps")], codes, distinct)
    steps.args["tokens"] = ("int", _num(st, "tokens"), None)
    steps.args["context_len"] = ("int", _num(st, "context_len"), None)
    run = st["run"].astype(object).where(st["run"].notna(), "") if "run" in st else pd.Series("", index=st.index)
    steps.keys = list(zip(run.astype(str), pd.to_numeric(st["step"], errors="coerce").fillna(-1).astype("int64")))
    run = (phase != phase.shift()).cumsum().to_numpy()
    first = np.r_[0, np.flatnonzero(np.diff(run)) + 1]
    last = np.r_[first[1:] - 1, len(st) - 1]
    pcodes, pdistinct = _codes(phase.iloc[first].reset_index(drop=True))
    phases = _Slices("phase", st["start_ns"].to_numpy("int64")[first], st["end_ns"].to_numpy("int64")[last],
                     np.zeros(len(first), dtype="int64"), [(group, "phases")], pcodes, pdistinct)
    phases.args["steps"] = ("int", (last - first + 1).astype("float64"), None)
    return [phases, steps]


def _per_device_series(table: pd.DataFrame, columns: Sequence[str], default_device: str,
                       label: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Counter tracks of ``table``'s ``columns`` over ``t_ns``, one per device and column with a value,
    named ``<device> <label><column>``."""
    out: list[tuple[str, np.ndarray, np.ndarray]] = []
    if not len(table):
        return out
    dev = (table["device"].astype("object").fillna(default_device).astype(str) if "device" in table
           else pd.Series(default_device, index=table.index))
    rank = _rank_of(table)
    if rank is not None:  # a multi-rank report: rank N's devices
        dev = pd.Series([f"rank {_int_text(r)} {d}" for r, d in zip(rank.tolist(), dev.tolist())], index=table.index)
    t = table["t_ns"].to_numpy("int64")
    for d in sorted(dev.unique()):
        rows = (dev == d).to_numpy()
        for col in columns:
            if col in table:
                v = _num(table, col)[rows]
                ok = ~np.isnan(v)
                if ok.any():
                    out.append((f"{d} {label}{col}", t[rows][ok], v[ok]))
    return out


def _counter_series(report: Report | LeanReport) -> list[tuple[str, np.ndarray, np.ndarray]]:
    return _per_device_series(report.counters, COUNTER_METRICS, "gpu", "")


def _idle_slices(report: Report | LeanReport) -> _Slices | None:
    """The device's idle slices (the ``idle`` table, docs/idle.md): one ``idle causes`` track per
    device, each slice named by its cause, with its host range, call and copy bytes as args."""
    idle = getattr(report, "idle", None)
    if idle is None or not len(idle):
        return None
    track, names = _tracks("idle", [idle["device"].astype("object").fillna("?").to_numpy(object)],
                           lambda d: f"{d} idle causes", _rank_of(idle))
    codes, distinct = _codes(idle["cause"])
    s = _Slices("idle", idle["start_ns"].to_numpy("int64"), idle["end_ns"].to_numpy("int64"), track, names,
                codes, distinct)
    for col in ("host_kind", "range", "api", "op", "function", "wait"):
        if col in idle:
            s.args[col] = ("str", *_codes(idle[col]))
    if "bytes" in idle:
        s.args["bytes"] = ("double", _num(idle, "bytes"), None)
    return s


def _memory_series(report: Report | LeanReport) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The memory timeline as counter tracks: allocated and reserved bytes per device, and the bytes
    live per category (``cuda:0 memory weights_bytes``, ...: at any instant they add up to the
    allocated bytes, as in ``analyze --memory``'s breakdown). A record without a clock (a snapshot
    without ``time_us``) is drawn over its events (t_ns counts them)."""
    m = getattr(report, "memory", None)
    if m is None or "allocated_bytes" not in m:
        return []
    out = _per_device_series(m, ("allocated_bytes", "reserved_bytes"), "?", "memory ")
    if not len(m) or "category" not in m or "delta_bytes" not in m:
        return out
    dev = m["device"].astype("object").fillna("?").astype(str).to_numpy()
    cats = m["category"].astype("object").to_numpy()
    delta = _num(m, "delta_bytes")
    t = m["t_ns"].to_numpy("int64")
    for d in sorted(set(dev.tolist())):
        rows = dev == d
        moves = rows & (delta != 0) & ~np.isnan(delta)
        for c in sorted({str(x) for x in cats[moves] if isinstance(x, str)}):
            level = np.cumsum(np.where(moves & (cats == c), delta, 0.0)[rows])
            out.append((f"{d} memory {c}_bytes", t[rows], level))
    return out


FINDINGS_GROUP = "findings"


def _finding_slices(findings: Sequence[Finding]) -> _Slices | None:
    """The findings' evidence on the timeline: under a ``findings`` group, one track per finding (more
    where its items overlap, :func:`lanes`), one slice per place of each timed item (a group item's
    largest members, ``Item.spans``), named ``finding id: item label``, with the item's kind, time,
    share of the finding's time at stake and whether its cause is known as args."""
    rows: list[tuple[int, int, str, str, str, float, float, str]] = []
    for f in findings:
        stake = float(f.time_at_stake_ns)
        for item in f.items:
            for s, e in item.places():
                share = 100.0 * item.time_ns / stake if stake > 0 and np.isfinite(item.time_ns) else np.nan
                rows.append((int(s), int(max(e, s)), f"{f.id}: {item.label}", f"{f.id}: {f.title}"[:120], item.kind,
                             float(item.time_ns), share, "known" if item.explains else "unknown"))
    if not rows:
        return None
    df = pd.DataFrame(rows, columns=["start", "end", "name", "finding", "kind", "time_ns", "share_pct", "cause"])
    df = df.sort_values("start", kind="stable").reset_index(drop=True)
    lane = np.zeros(len(df), dtype="int64")
    for idx in df.groupby("finding", sort=False).indices.values():
        lane[idx] = lanes(df["start"].to_numpy()[idx], df["end"].to_numpy()[idx])
    track, names = _tracks(FINDINGS_GROUP, [df["finding"].to_numpy(object), lane],
                           lambda f, n: f if n == 0 else f"{f} ({n + 1})")
    codes, distinct = _codes(df["name"])
    out = _Slices("finding", df["start"].to_numpy("int64"), df["end"].to_numpy("int64"), track, names, codes, distinct)
    out.args["item"] = ("str", *_codes(df["kind"]))
    out.args["cause"] = ("str", *_codes(df["cause"]))
    out.args["time_ms"] = ("double", df["time_ns"].to_numpy("float64", na_value=np.nan) / 1e6, None)
    out.args["share_of_stake_pct"] = ("double", df["share_pct"].to_numpy("float64", na_value=np.nan), None)
    return out


def _all_slices(report: Report | LeanReport, findings: Sequence[Finding] = ()) -> list[_Slices]:
    parts: list[_Slices | None] = [_kernel_slices(report) if len(report.kernels) else None,
                                   _range_slices(report), _api_slices(report), *_step_slices(report),
                                   _idle_slices(report), _finding_slices(findings)]
    return [p for p in parts if p is not None]


# ---------------------------------------------------------------- requests of a load test
REQUEST_GROUP = "requests"
REQUEST_PARTS = ("TTFT", "queued", "prefill", "decode")
"""A request slice's parts: TTFT (send to first token) holding queued (send to admission) and
prefill (admission to first token) where the engine recorded the admission; decode (first token to end)."""


@dataclass
class _Tree:
    """Slices nested within blocks: rows in pre-order (a request, then its parts), ``depth`` per row."""

    slices: _Slices
    depth: np.ndarray
    blocks: int
    lanes: int
    keys: list[tuple[str, int]] = field(default_factory=list)  # (run, request_id) of each block, in order
    parent_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, "int64"))  # row of each block's slice


def lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Interval partitioning: the lane of each interval [start, end], so that intervals on one lane
    never overlap nor touch (a lane is free once its last interval ended strictly before the next
    start); each interval, by start, takes the lowest free lane: as few lanes as the most intervals
    open at once."""
    import heapq

    lane = np.empty(len(start), dtype="int64")
    busy: list[tuple[int, int]] = []  # (end, lane)
    free: list[int] = []
    used = 0
    for i in np.lexsort((end, start)).tolist():
        s0 = int(start[i])
        while busy and busy[0][0] < s0:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            k = heapq.heappop(free)
        else:
            k, used = used, used + 1
        lane[i] = k
        heapq.heappush(busy, (int(end[i]), k))
    return lane


def _run_origins(report: Report | LeanReport) -> dict[str, int]:
    runs = (report.params.get("loadtest") or {}).get("runs") or []
    return {str(r["run"]): int(r["t0_perf_counter_ns"]) for r in runs
            if isinstance(r, dict) and isinstance(r.get("t0_perf_counter_ns"), int)}


def _int64(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    ok = values.notna().to_numpy()
    return values.to_numpy(dtype="int64", na_value=0), ok


def _request_tree(report: Report | LeanReport) -> tuple[_Tree | None, list[str]]:
    """The requests of a load test as nested slices on lanes (None without a placed request), and notes."""
    from perfscope.analysis.summaries.server_timeline import request_times_ns

    r = report.requests
    if not len(r):
        return None, []
    alone = not any(len(df) for df in (report.kernels, report.ranges, report.api, report.steps))
    times, notes = request_times_ns(r, report.steps, _run_origins(report), requests_only=alone)
    a, a_ok = _int64(times["arrival_ns"])
    e, e_ok = _int64(times["end_ns"])
    f, f_ok = _int64(times["first_token_ns"])
    m, m_ok = _int64(times["admitted_ns"])
    has_time = pd.to_numeric(r.get("arrival_s", pd.Series(np.nan, index=r.index)), errors="coerce").notna().to_numpy()
    keep = a_ok & e_ok & (e >= a)
    unsent, unended = int((~has_time).sum()), int((a_ok & ~keep).sum())
    if unsent:
        notes.append(f"{unsent} request(s) without a send time (not sent, or a batch generate() that records "
                     "none): not drawn")
    if unended:
        notes.append(f"{unended} request(s) sent but without an end (cancelled): not drawn")
    if not keep.any():
        return None, notes
    idx = np.flatnonzero(keep)
    idx = idx[np.lexsort((e[idx], a[idx]))]
    a, e, f, f_ok, m, m_ok = a[idx], e[idx], f[idx], f_ok[idx], m[idx], m_ok[idx]
    f = np.clip(f, a, e)
    m_ok &= f_ok
    m = np.clip(m, a, np.where(f_ok, f, e))
    n = len(idx)
    # candidate rows per request, in pre-order: request, TTFT, queued, prefill, decode
    starts = np.stack([a, a, a, m, f], axis=1)
    ends = np.stack([e, f, m, f, e], axis=1)
    valid = np.stack([np.ones(n, dtype=bool), f_ok, m_ok & (m > a), m_ok & (f > m), f_ok & (e > f)], axis=1)
    depth = np.broadcast_to(np.array([0, 1, 2, 2, 1]), (n, 5))
    lane = lanes(a, e)
    sub = r.iloc[idx].reset_index(drop=True)
    status = (sub["status"].astype(object).where(sub["status"].notna(), "ok") if "status" in sub
              else pd.Series("ok", index=sub.index)).astype(str)
    parent_name = np.where(status == "ok", "request", "request: " + status)
    names = np.empty((n, 5), dtype=object)
    names[:, 0] = parent_name
    names[:, 1:] = np.array(REQUEST_PARTS, dtype=object)
    flat = valid.ravel()
    rows = np.flatnonzero(flat)
    owner = rows // 5  # the request of each row
    is_parent = (rows % 5) == 0
    codes, distinct = _codes(pd.Series(names.ravel()[flat], dtype=object))
    s = _Slices("request", starts.ravel()[flat], ends.ravel()[flat], lane[owner],
                [(REQUEST_GROUP, f"lane {k + 1}") for k in range(int(lane.max()) + 1)], codes, distinct)

    def parent_only(values: np.ndarray) -> np.ndarray:
        return np.where(is_parent, np.asarray(values, dtype="float64")[owner], np.nan)

    def parent_str(values: pd.Series) -> tuple[str, np.ndarray, np.ndarray]:
        c, d = _codes(values)
        return "str", np.where(is_parent, c[owner], -1), d

    s.args["request_id"] = ("int", parent_only(_num(sub, "request_id")), None)
    for col in ("run", "status", "error", "finish_reason"):
        if col in sub:
            s.args[col] = parent_str(sub[col])
    for col in ("prompt_tokens", "output_tokens", "http_status"):
        if col in sub:
            s.args[col] = ("int", parent_only(_num(sub, col)), None)
    ms = {"ttft_ms": _num(sub, "ttft_s"), "tpot_ms": _num(sub, "tpot_s"), "e2e_ms": _num(sub, "e2e_s"),
          "queue_ms": _num(sub, "admitted_s") - _num(sub, "arrival_s"), "dispatch_delay_ms": _num(sub, "dispatch_delay_s")}
    for label, v in ms.items():
        s.args[label] = ("double", parent_only(v * 1e3), None)
    run = (sub["run"].astype(object).where(sub["run"].notna(), "") if "run" in sub else pd.Series("", index=sub.index))
    keys = list(zip(run.astype(str), pd.to_numeric(sub["request_id"], errors="coerce").fillna(-1).astype("int64")))
    return _Tree(s, depth.ravel()[flat].astype("int64"), n, int(lane.max()) + 1, keys,
                 np.flatnonzero(is_parent)), notes


def request_flows(report: Report | LeanReport, tree: _Tree | None, steps: _Slices | None) -> int:
    """Link each request's slice to the steps it took part in (the scheduler's ``request_steps``): one
    flow per request and step, starting on the request and ending on the step. Returns the flows made."""
    links = getattr(report, "request_steps", None)
    if tree is None or steps is None or steps.keys is None or links is None or not len(links):
        return 0
    run = (links["run"].astype(object).where(links["run"].notna(), "") if "run" in links
           else pd.Series("", index=links.index)).astype(str)
    step_row = {k: i for i, k in enumerate(steps.keys)}
    block_row = {k: int(r) for k, r in zip(tree.keys, tree.parent_rows)}
    made = 0
    for r_, rid, stp in zip(run.tolist(), pd.to_numeric(links["request_id"], errors="coerce").tolist(),
                            pd.to_numeric(links["step"], errors="coerce").tolist()):
        if not (np.isfinite(rid) and np.isfinite(stp)):
            continue
        src, dst = block_row.get((r_, int(rid))), step_row.get((r_, int(stp)))
        if src is None or dst is None:
            continue
        made += 1
        tree.slices.flows.setdefault(src, []).append(made)
        steps.flows.setdefault(dst, []).append(made)
    steps.ends_flows = True
    return made


def _group_title(name: str, device: str | None) -> str:
    """A track group's title: the kernels' and each rank's name their device."""
    return f"{name} ({device})" if device and (name == "kernels" or name.startswith("rank ")) else name


# ---------------------------------------------------------------- Perfetto protobuf
class _ProtoWriter:
    def __init__(self, out: IO[bytes], report: Report | LeanReport) -> None:
        self.out = out
        self.next_uuid = 1
        self.iids: dict[str, int] = {}
        self.first = True
        self.track_uuids: dict[tuple[str, str], int] = {}
        self.group_uuids: dict[str, int] = {}
        self.device = report.device.name if report.device else None

    def _uuid(self) -> int:
        self.next_uuid += 1
        return self.next_uuid

    def write(self, body: bytes) -> None:
        self.out.write(pb.packet(body))

    def group(self, name: str) -> int:
        if name not in self.group_uuids:
            u = self.group_uuids[name] = self._uuid()
            title = _group_title(name, self.device)
            self.write(pb.f_varint(10, SEQ) + pb.track_descriptor(u, title))
        return self.group_uuids[name]

    def track(self, group: str, name: str, counter: bool = False) -> int:
        key = (group, name)
        if key not in self.track_uuids:
            parent = self.group(group)
            u = self.track_uuids[key] = self._uuid()
            self.write(pb.f_varint(10, SEQ) + pb.track_descriptor(u, name, parent, counter))
        return self.track_uuids[key]

    def flags(self) -> bytes:
        if self.first:
            self.first = False
            return pb.f_varint(13, pb.SEQ_INCREMENTAL_STATE_CLEARED | pb.SEQ_NEEDS_INCREMENTAL_STATE)
        return pb.f_varint(13, pb.SEQ_NEEDS_INCREMENTAL_STATE)

    def slices(self, s: _Slices, depth: np.ndarray | None = None) -> int:
        """Write ``s``: each row's begin and end packets, one after the other; with ``depth`` (rows in
        pre-order within nested blocks), a row's end waits until the next row at its depth or above
        begins (or the last row is written)."""
        uuids = [self.track(g, n) for g, n in s.track_names]
        track_bytes = [pb.f_varint(11, u) for u in uuids]
        name_iid: list[bytes | None] = [None] * (len(s.names) + 1)  # the last answers code -1
        str_cache: dict[str, dict[int, bytes]] = {a: {} for a in s.args}
        seq = pb.f_varint(10, SEQ)
        begin_t, end_t = pb.f_varint(9, pb.SLICE_BEGIN), pb.f_varint(9, pb.SLICE_END)
        ts_tag, ev_tag = pb.tag(8, 0), pb.tag(11, 2)
        varint = pb.varint
        first = self.first  # the first packet of the sequence clears the incremental state
        self.first = False
        flags = pb.f_varint(13, pb.SEQ_NEEDS_INCREMENTAL_STATE)
        first_flags = pb.f_varint(13, pb.SEQ_INCREMENTAL_STATE_CLEARED | pb.SEQ_NEEDS_INCREMENTAL_STATE)
        strs = [(a, vals, distinct) for a, (kind, vals, distinct) in s.args.items() if kind == "str"]
        ints = [(a, vals) for a, (kind, vals, _) in s.args.items() if kind == "int"]
        dbls = [(a, vals) for a, (kind, vals, _) in s.args.items() if kind == "double"]
        small, limit = pb._SMALL, len(pb._SMALL)
        end_tails = []
        for tb in track_bytes:
            end_ev = end_t + tb
            end_tails.append(seq + ev_tag + pb.varint(len(end_ev)) + end_ev + flags)
        written = 0
        stack: list[tuple[int, bytes]] = []  # with depth: the open slices' (depth, end packet)
        for lo in range(0, len(s.start), CHUNK):
            hi = min(lo + CHUNK, len(s.start))
            depths = None if depth is None else depth[lo:hi].tolist()
            t0s = pb.varints(s.start[lo:hi])
            t1s = pb.varints(np.maximum(s.end[lo:hi], s.start[lo:hi]))
            dblobs = [pb.double_annotations(a, v[lo:hi]) for a, v in dbls]
            str_codes = [(a, vals[lo:hi].tolist(), distinct, str_cache[a]) for a, vals, distinct in strs]
            int_anns = [pb.int_annotations(a, v[lo:hi]) for a, v in ints]
            buf = []
            for j, (tr, nc) in enumerate(zip(s.track[lo:hi].tolist(), s.name_codes[lo:hi].tolist())):
                intern = b""
                iid_b = name_iid[nc]
                if iid_b is None:
                    name = "?" if nc < 0 else str(s.names[nc])
                    iid = self.iids.get(name, 0)
                    if not iid:
                        iid = self.iids[name] = len(self.iids) + 1
                        intern = pb.interned_names([(iid, name)])
                    iid_b = name_iid[nc] = pb.f_varint(10, iid)
                parts = [begin_t, track_bytes[tr], iid_b]
                for a, codes, distinct, cache in str_codes:
                    code = codes[j]
                    if code >= 0:
                        b = cache.get(code)
                        if b is None:
                            value = distinct[code]
                            b = cache[code] = b"" if value is None else pb.annotation_str(a, str(value))
                        parts.append(b)
                for anns in int_anns:
                    parts.append(anns[j])
                fl = s.flows.get(lo + j) if s.flows else None
                if fl:
                    parts.append(pb.flow_ids(fl, s.ends_flows))
                for blob, ends in dblobs:
                    e0 = int(ends[j - 1]) if j else 0
                    e1 = int(ends[j])
                    if e1 > e0:
                        parts.append(blob[e0:e1])
                ev = b"".join(parts)
                head = first_flags if first and not written else flags
                p1 = b"".join((ts_tag, t0s[j], seq, intern, ev_tag, small[len(ev)] if len(ev) < limit else varint(len(ev)),
                               ev, head))
                t1 = t1s[j]
                tail = end_tails[tr]
                end_packet = b"".join((b"\x0a", small[1 + len(t1) + len(tail)], ts_tag, t1, tail))
                if depths is not None:
                    d = depths[j]
                    while stack and stack[-1][0] >= d:
                        buf.append(stack.pop()[1])
                    stack.append((d, end_packet))
                    end_packet = b""
                buf.append(b"\x0a" + (small[len(p1)] if len(p1) < limit else varint(len(p1))) + p1)
                buf.append(end_packet)
                written += 1
            self.out.write(b"".join(buf))
        self.out.write(b"".join(e for _, e in reversed(stack)))
        return written

    def nested(self, tree: _Tree) -> int:
        """Slices nested in blocks (a request and its parts): each begin comes after the ends of the
        open slices at its depth or deeper, so every slice closes inside its parent."""
        self.slices(tree.slices, tree.depth)
        return tree.blocks

    def counters(self, name: str, t: np.ndarray, v: np.ndarray) -> int:
        u = self.track("counters", name, counter=True)
        head = pb.f_bytes  # local alias
        tb = pb.f_varint(11, u) + pb.f_varint(9, pb.COUNTER)
        seq = pb.f_varint(10, SEQ)
        for lo in range(0, len(t), CHUNK):
            self.out.write(b"".join(pb.packet(pb.f_varint(8, ts) + seq + head(11, tb + pb.f_double(44, x)) + self.flags())
                                    for ts, x in zip(t[lo:lo + CHUNK].tolist(), v[lo:lo + CHUNK].tolist())))
        return len(t)


# ---------------------------------------------------------------- Chrome JSON
class _ChromeWriter:
    def __init__(self, out: IO[bytes], report: Report | LeanReport, origin_ns: int) -> None:
        self.out = out
        self.origin = origin_ns
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple[str, str], tuple[int, int]] = {}
        self.first = True
        self.device = report.device.name if report.device else None

    def emit(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        text = orjson.dumps(events, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        self.out.write((b"" if self.first else b",\n") + text)
        self.first = False

    def track(self, group: str, name: str) -> tuple[int, int]:
        if (group, name) not in self.tids:
            if group not in self.pids:
                pid = self.pids[group] = len(self.pids) + 1
                title = _group_title(group, self.device)
                self.emit([{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": title}}])
            pid = self.pids[group]
            tid = len([k for k in self.tids if k[0] == group]) + 1
            self.tids[(group, name)] = (pid, tid)
            self.emit([{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}])
        return self.tids[(group, name)]

    def slices(self, s: _Slices, depth: np.ndarray | None = None) -> int:
        """Write ``s``: each row's begin and end packets, one after the other; with ``depth`` (rows in
        pre-order within nested blocks), a row's end waits until the next row at its depth or above
        begins (or the last row is written)."""
        ids = [self.track(g, n) for g, n in s.track_names]
        names = np.array([str(n) for n in s.names] + ["?"], dtype=object)
        arg_names = list(s.args)
        for lo in range(0, len(s.start), CHUNK):
            hi = min(lo + CHUNK, len(s.start))
            ts = ((s.start[lo:hi] - self.origin) / 1000.0).tolist()
            dur = (np.maximum(s.end[lo:hi] - s.start[lo:hi], 0) / 1000.0).tolist()
            columns = []
            for kind, vals, distinct in s.args.values():
                v = vals[lo:hi]
                if kind == "str":
                    table = np.array(list(distinct) + [None], dtype=object)
                    columns.append(table[v].tolist())
                else:
                    nan = np.isnan(v)
                    obj = np.full(len(v), None, dtype=object)
                    obj[~nan] = v[~nan].astype("int64") if kind == "int" else v[~nan]
                    columns.append(obj.tolist())
            rows = zip(*columns) if columns else ((),) * (hi - lo)
            track = s.track[lo:hi].tolist()
            label = names[s.name_codes[lo:hi]].tolist()
            kind = s.kind
            self.emit([{"ph": "X", "cat": kind, "name": n, "pid": ids[tr][0], "tid": ids[tr][1], "ts": t, "dur": d,
                        "args": {a: x for a, x in zip(arg_names, row) if x is not None}}
                       for n, tr, t, d, row in zip(label, track, ts, dur, rows)])
            if s.flows:  # arrows: a flow starts inside its request's slice and ends on the step's ("bp": "e")
                ph = "f" if s.ends_flows else "s"
                self.emit([{"ph": ph, "cat": "flow", "name": "ran in", "id": f, "pid": ids[track[j]][0],
                            "tid": ids[track[j]][1], "ts": ts[j], **({"bp": "e"} if s.ends_flows else {})}
                           for j in range(hi - lo) for f in s.flows.get(lo + j, ())])
        return len(s.start)

    def nested(self, tree: _Tree) -> int:
        """Complete events nest by time on their lane: each parent is written before its parts."""
        self.slices(tree.slices)
        return tree.blocks

    def counters(self, name: str, t: np.ndarray, v: np.ndarray) -> int:
        pid = self.pids.setdefault("counters", len(self.pids) + 1)
        if (("counters", "")) not in self.tids:
            self.tids[("counters", "")] = (pid, 0)
            self.emit([{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "counters"}}])
        for lo in range(0, len(t), CHUNK):
            ts = ((t[lo:lo + CHUNK] - self.origin) / 1000.0).tolist()
            self.emit([{"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": a, "args": {"value": x}}
                       for a, x in zip(ts, v[lo:lo + CHUNK].tolist())])
        return len(t)


# ---------------------------------------------------------------- a report folder, read lean
@dataclass(frozen=True, eq=False)
class LeanReport:
    """The tables an export reads, straight from a report folder: only the columns it uses,
    text as Arrow dictionaries (pandas categoricals: one copy of each distinct string), so a
    1M-kernel report takes a fraction of a loaded :class:`~perfscope.report.Report`'s memory.
    Same attribute names as a Report for what the export and the hierarchy read."""

    name: str
    device: Any
    kernels: pd.DataFrame
    ranges: pd.DataFrame
    api: pd.DataFrame
    steps: pd.DataFrame
    counters: pd.DataFrame
    requests: pd.DataFrame
    params: dict[str, Any]
    idle: pd.DataFrame = field(default_factory=pd.DataFrame)
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    request_steps: pd.DataFrame = field(default_factory=pd.DataFrame)


LEAN_COLUMNS = {
    "kernels": ("name", "device", "stream", "thread", "start_ns", "end_ns", "duration_ns", "correlation", "op",
                "range", "phase", "step", "precision", "bound", "flops", "dram_bytes", "arith_intensity",
                "pct_of_roof", "limiter", "limiter_pct", "rank"),
    "ranges": ("id", "name", "start_ns", "end_ns", "depth", "parent", "path", "thread", "source", "rank"),
    "api": ("name", "start_ns", "end_ns", "thread", "correlation", "rank"),
    "idle": ("device", "start_ns", "end_ns", "cause", "host_kind", "range", "api", "op", "function", "wait", "bytes",
             "rank"),
    "steps": ("step", "phase", "batch", "tokens", "context_len", "start_ns", "end_ns", "label", "start_s", "end_s", "run",
              "generate_call", "rank"),
    "counters": ("t_ns", "device", *COUNTER_METRICS, "rank"),
    "memory": ("t_ns", "device", "allocated_bytes", "reserved_bytes", "delta_bytes", "category", "rank"),
    "request_steps": ("request_id", "step", "role", "run"),
    "requests": ("request_id", "run", "generate_call", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s",
                 "scheduled_s", "arrival_s", "admitted_s", "first_token_s", "end_s", "dispatch_delay_s", "status",
                 "error", "http_status", "finish_reason"),
}


def _lean_table(folder: Path, name: str) -> pd.DataFrame:
    import pyarrow.dataset as ds

    from perfscope.errors import ReportFormatError

    file, dataset = folder / f"{name}.parquet", folder / name
    source = file if file.exists() else dataset
    if not source.exists():
        return pd.DataFrame({c: pd.Series(dtype="object") for c in LEAN_COLUMNS[name]})
    import pyarrow as pa
    import pyarrow.compute as pc

    partitioning = "hive" if source.is_dir() else None
    try:
        schema = ds.dataset(source, format="parquet", partitioning=partitioning).schema
        cols = [c for c in LEAN_COLUMNS[name] if c in schema.names]
        text = [c for c in cols if pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type)]
        # text read straight into dictionaries: a million long kernel names are never materialised
        fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=text))
        table = ds.dataset(source, format=fmt, partitioning=partitioning).to_table(columns=cols)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for damaged files
        raise ReportFormatError(source, f"damaged table ({str(exc).splitlines()[0] if str(exc) else exc})",
                                hint="re-create the report") from None
    arrays = {}
    for col in table.column_names:
        arr = table.column(col)
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            arr = pc.dictionary_encode(arr)  # a column the reader kept plain (one without a dictionary page)
        arrays[col] = arr
    del table
    return pa.table(arrays).to_pandas(split_blocks=True, self_destruct=True)


def lean_report(folder: str | os.PathLike[str]) -> LeanReport:
    """The tables of the report folder ``folder`` that an export needs, read lean.

    Raises:
        ReportFormatError: not a report folder, or a damaged table.
    """
    from perfscope.device import DeviceSpec
    from perfscope.report import read_manifest

    path = Path(folder)
    manifest = read_manifest(path)
    device = DeviceSpec.from_dict(manifest["device"]) if manifest.get("device") else None
    name = str(manifest.get("name") or path.name.removesuffix(".perfscope"))
    runs = (manifest.get("params") or {}).get("loadtest", {}).get("runs") or []
    kernels, ranges, api, steps, counters, requests = (
        _lean_table(path, t) for t in ("kernels", "ranges", "api", "steps", "counters", "requests"))
    return LeanReport(name, device, kernels, ranges, api, steps, counters, requests,
                      params={"loadtest": {"runs": runs}} if runs else {}, idle=_lean_table(path, "idle"),
                      memory=_lean_table(path, "memory"), request_steps=_lean_table(path, "request_steps"))


# ---------------------------------------------------------------- entry point
def _origin(report: Report | LeanReport, tree: _Tree | None) -> int:
    starts = [int(df["start_ns"].min()) for df in (report.kernels, report.ranges, report.api, report.steps)
              if len(df) and "start_ns" in df]
    if len(report.counters):
        starts.append(int(report.counters["t_ns"].min()))
    mem = getattr(report, "memory", None)
    if mem is not None and len(mem) and "t_ns" in mem:
        starts.append(int(mem["t_ns"].min()))
    if tree is not None:
        starts.append(int(tree.slices.start.min()))
    return min(starts) if starts else 0


def _stream(report: Report | LeanReport, writer: Any, stats: ExportStats, tree: _Tree | None,
            findings: Sequence[Finding] = ()) -> None:
    slices = _all_slices(report, findings)
    steps = next((s for s in slices if s.kind == "step"), None)
    stats.flows = request_flows(report, tree, steps)
    for s in slices:
        n = writer.slices(s)
        stats.slices[s.kind] = stats.slices.get(s.kind, 0) + n
        del s
    if tree is not None:
        stats.requests = writer.nested(tree)
        stats.request_lanes = tree.lanes
        stats.slices["request"] = tree.blocks
        stats.slices["request part"] = len(tree.depth) - tree.blocks
    for name, t, v in [*_counter_series(report), *_memory_series(report)]:
        stats.counter_samples += writer.counters(name, t, v)


def export_trace(report: Report | LeanReport, path: str | os.PathLike[str], *, format: str = "perfetto",
                 force: bool = False, findings: Sequence[Finding] | None = None) -> ExportStats:
    """Write ``report``'s timeline to ``path`` as a Perfetto trace (``perfetto``) or Chrome trace
    JSON (``chrome``), atomically (a temp file renamed into place).

    ``findings`` (:func:`perfscope.analysis.findings.run_rules` of the report) draw the ``findings``
    tracks; None runs the rules on a loaded Report, and draws none for a :class:`LeanReport` (its
    lean tables are not what the rules read: pass the findings of the loaded report).

    Raises:
        UsageError: an unknown format.
        OutputExistsError: ``path`` exists and ``force`` is false.
    """
    if format not in FORMATS:
        raise UsageError(f"unknown export format {format!r}", hint=f"use one of {', '.join(FORMATS)}")
    target = Path(path)
    if target.exists() and not force:
        raise OutputExistsError(target, flag="-o")
    stats = ExportStats(target, format, kernels=len(report.kernels),
                        kernel_time_ns=int(report.kernels["duration_ns"].sum()) if len(report.kernels) else 0)
    tree, stats.notes = _request_tree(report)
    if findings is None and not isinstance(report, LeanReport):
        from perfscope.analysis.findings import run_rules

        findings = run_rules(report)
    findings = list(findings or [])
    from perfscope.report import writing

    with writing(target) as tmp:
        with open(tmp, "wb", buffering=1 << 20) as out:
            if format == "perfetto":
                w: Any = _ProtoWriter(out, report)
                _stream(report, w, stats, tree, findings)
                stats.tracks = len(w.track_uuids)
            else:
                origin = _origin(report, tree)
                out.write(b'{"displayTimeUnit": "ns", "otherData": ' + orjson.dumps(
                    {"perfscope_report": report.name, "device": report.device.name if report.device else None,
                     "origin_ns": origin}) + b', "traceEvents": [\n')
                w = _ChromeWriter(out, report, origin)
                _stream(report, w, stats, tree, findings)
                stats.tracks = len(w.tids)
                out.write(b"\n]}\n")
        os.replace(tmp, target)
    return stats

