"""Build a rank set from one real Kineto trace: tile it in time, give it a rank, make it slower.

Tests and benchmarks need jobs of many ranks and large traces, and only real traces may be used
(tests/fixtures). So a rank file here is a real trace, written ``copies`` times one after the
other (timestamps shifted by the trace's span, correlation / External ids and flow ids offset so
they stay unique, ``ProfilerStep#N`` renumbered so steps keep counting), with its
``distributedInfo`` rank and world size rewritten, and optionally stretched in time (every
timestamp and duration scaled about the trace's start) to make a straggler whose margin is known.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

ID_ARGS = ("correlation", "External id", "Ev Idx", "Record function id", "Python id", "Python parent id")
"""Integer ``args`` that identify an event (or link two) and must stay unique across copies."""
FLOW_PHASES = ("s", "t", "f")
"""Flow events, whose top-level ``id`` links a launch to its kernel."""
STEP = re.compile(r"^ProfilerStep#(\d+)$")
GAP_FRACTION = 0.01
"""Idle time between two copies, as a fraction of the trace's span."""


@dataclass(frozen=True)
class TileSpec:
    """How to turn the source trace into one rank's file.

    Attributes:
        rank: the rank written into ``distributedInfo``.
        world_size: the world size written into ``distributedInfo``.
        copies: how many times the events are repeated in time.
        stretch: factor applied to every timestamp offset and duration (1.25 = 25% slower).
        trace_id: a ``trace_id`` to write into the metadata (None keeps the source's).
    """

    rank: int
    world_size: int
    copies: int = 1
    stretch: float = 1.0
    trace_id: str | None = None


def load_trace(path: Path) -> dict[str, Any]:
    """A Kineto trace (``.json`` or ``.json.gz``) as one JSON object."""
    raw = Path(path).read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TypeError(f"{path}: not a Kineto trace object with traceEvents")
    return doc


@dataclass(frozen=True)
class _Layout:
    t0: float
    period: float
    id_span: dict[str, int]
    flow_span: int
    step_span: int


def _layout(events: list[dict[str, Any]]) -> _Layout:
    t0, t1 = float("inf"), float("-inf")
    id_span = dict.fromkeys(ID_ARGS, 0)
    flow, steps = 0, []
    for e in events:
        ts = e.get("ts")
        if isinstance(ts, (int, float)):
            t0 = min(t0, ts)
            t1 = max(t1, ts + (e.get("dur") or 0))
        args = e.get("args")
        if isinstance(args, dict):
            for key in ID_ARGS:
                v = args.get(key)
                if isinstance(v, int) and v > id_span[key]:
                    id_span[key] = v
        if e.get("ph") in FLOW_PHASES and isinstance(e.get("id"), int):
            flow = max(flow, e["id"])
        m = STEP.match(str(e.get("name", "")))
        if m:
            steps.append(int(m.group(1)))
    span = max(t1 - t0, 1.0)
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    return _Layout(t0, span * (1 + GAP_FRACTION), {k: v + 1 for k, v in id_span.items()}, flow + 1, step_span)


def _shift(e: dict[str, Any], c: int, lay: _Layout, stretch: float) -> dict[str, Any]:
    out = dict(e)
    ts = e.get("ts")
    if isinstance(ts, (int, float)):
        out["ts"] = round(lay.t0 + (ts - lay.t0 + c * lay.period) * stretch, 3)
    dur = e.get("dur")
    if isinstance(dur, (int, float)) and stretch != 1.0:
        out["dur"] = round(dur * stretch, 3)
    if c == 0:
        return out
    args = e.get("args")
    if isinstance(args, dict) and any(k in args for k in ID_ARGS):
        out["args"] = {k: (v + c * lay.id_span[k] if k in lay.id_span and isinstance(v, int) and v > 0 else v)
                       for k, v in args.items()}
    if e.get("ph") in FLOW_PHASES and isinstance(e.get("id"), int):
        out["id"] = e["id"] + c * lay.flow_span
    m = STEP.match(str(e.get("name", "")))
    if m:
        out["name"] = f"ProfilerStep#{int(m.group(1)) + c * lay.step_span}"
    return out


def tiled_events(doc: dict[str, Any], copies: int, stretch: float = 1.0) -> Iterator[dict[str, Any]]:
    """The events of ``doc`` repeated ``copies`` times in time (metadata events only once)."""
    events = doc["traceEvents"]
    lay = _layout(events)
    for c in range(copies):
        for e in events:
            if c and e.get("ph") == "M":
                continue
            yield _shift(e, c, lay, stretch)


def _header(doc: dict[str, Any], spec: TileSpec) -> bytes:
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    dist = dict(meta.get("distributedInfo") or {})
    dist.update(rank=spec.rank, world_size=spec.world_size)
    dist.setdefault("backend", "nccl")
    meta["distributedInfo"] = dist
    if spec.trace_id is not None:
        meta["trace_id"] = spec.trace_id
    body = orjson.dumps(meta, option=orjson.OPT_INDENT_2)[1:-1].rstrip()  # '"rank": 3', as Kineto writes
    return b"{" + body + (b"," if body else b"") + b'\n  "traceEvents": [\n'


def _open_out(dst: Path) -> IO[bytes]:
    if dst.name.endswith(".gz"):
        return gzip.open(dst, "wb", compresslevel=1)  # type: ignore[return-value]
    return open(dst, "wb")


def tile_trace(doc: dict[str, Any], dst: Path, spec: TileSpec) -> int:
    """Write one rank's file (``.json`` or ``.json.gz``) built from ``doc``; returns events written.

    The layout follows Kineto's: indented metadata (``"rank": 3``, which HTA looks for) and one
    event per line.
    """
    n = 0
    with _open_out(dst) as fh:
        fh.write(_header(doc, spec))
        buf: list[bytes] = []
        for e in tiled_events(doc, spec.copies, spec.stretch):
            buf.append(orjson.dumps(e))
            n += 1
            if len(buf) >= 4096:
                fh.write((b",\n" if n > len(buf) else b"") + b",\n".join(buf))
                buf = []
        if buf:
            fh.write((b",\n" if n > len(buf) else b"") + b",\n".join(buf))
        fh.write(b"\n  ]\n}\n")
    return n




# ---------------------------------------------------------------------------- synchronized jobs
@dataclass(frozen=True)
class SyncJob:
    """A job of ranks that meet at every collective, built from one real rank trace.

    Every rank runs the source trace's program (``copies`` times over). Between two collectives a
    rank works (its kernels, copies, idle gaps and host calls, as recorded); a collective ends on
    every rank of its group at the same moment: when the last rank of the group has arrived, plus
    the source's own collective time (the transfer). So a rank that works slower arrives last, its
    collectives are short, and every other rank of its group waits for it inside its collectives,
    as NCCL/RCCL ranks do.

    Attributes:
        world_size: ranks in the job.
        group_size: ranks per group that meet at the collectives (consecutive ranks: a tensor
            parallel group); each group keeps its own pace.
        copies: how many times the source's events are repeated in time.
        slow: rank -> factor on its work between collectives (1.12: 12% slower kernels and host).
        jitter: relative standard deviation of each rank's work between two collectives (seeded).
        seed: the jitter's seed.
        group_desc: ``pg_desc`` written for the groups in ``distributedInfo.pg_config``.
        drop_python: leave out the ``python_function`` events (as a trace recorded without
            ``with_stack``): smaller files for tests.
    """

    world_size: int
    group_size: int
    copies: int = 1
    slow: tuple[tuple[int, float], ...] = ()
    jitter: float = 0.0
    seed: int = 0
    group_desc: str = "tp"
    drop_python: bool = False

    def group_of(self, rank: int) -> list[int]:
        """The ranks of ``rank``'s group."""
        first = rank - rank % self.group_size
        return list(range(first, min(first + self.group_size, self.world_size)))


def _is_collective(e: dict[str, Any]) -> bool:
    from ..costs.operators import category_of

    return str(e.get("cat", "")).lower() == "kernel" and category_of(None, str(e.get("name", ""))) == "comm"


def sync_points(doc: dict[str, Any], copies: int) -> tuple[float, float, list[tuple[float, float]]]:
    """(start, end, collectives) of the tiled timeline in the source's microseconds: the
    collective kernels' intervals, overlapping ones merged, in time order."""
    events = doc["traceEvents"]
    lay = _layout(events)
    one = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0)) for e in events
                 if _is_collective(e) and isinstance(e.get("ts"), (int, float)))
    merged: list[list[float]] = []
    for s, e in one:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    points = [(s + c * lay.period, e + c * lay.period) for c in range(copies) for s, e in merged]
    return lay.t0, lay.t0 + copies * lay.period, points


def sync_schedule(doc: dict[str, Any], job: SyncJob) -> dict[int, tuple[list[float], list[float]]]:
    """Per rank: the breakpoints of its time map, (source times, its times), both increasing.

    The source times are the start, each collective's start and end, and the end of the tiled
    timeline; a rank's times are when it arrives at each collective and when the collective ends
    (the same on every rank of its group).
    """
    import random

    t0, t1, points = sync_points(doc, job.copies)
    slow = dict(job.slow)
    rng = random.Random(job.seed)
    out: dict[int, tuple[list[float], list[float]]] = {}
    for first in range(0, job.world_size, job.group_size):
        ranks = job.group_of(first)
        src, mine = [t0], {r: [t0] for r in ranks}
        leave, prev_end = t0, t0
        for s, e in points:
            work = s - prev_end
            arrive = {r: leave + work * slow.get(r, 1.0) * max(0.5, rng.gauss(1.0, job.jitter) if job.jitter else 1.0)
                      for r in ranks}
            leave = max(arrive.values()) + (e - s)
            for r in ranks:
                mine[r] += [arrive[r], leave]
            src += [s, e]
            prev_end = e
        src.append(t1)
        for r in ranks:
            mine[r].append(leave + (t1 - prev_end) * slow.get(r, 1.0))
            out[r] = (src, mine[r])
    return out


def _pg_config(doc: dict[str, Any], rank: int, job: SyncJob) -> list[dict[str, Any]]:
    """``distributedInfo.pg_config`` for ``rank``: the world, and each of the source's groups that
    spanned its whole job, now ``rank``'s group (named as in the source, so that the kernels' own
    ``Process Group Name`` still points at it)."""
    info = doc.get("distributedInfo")
    dist: dict[str, Any] = info if isinstance(info, dict) else {}
    world_src = dist.get("world_size")
    group = job.group_of(rank)
    out = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": job.world_size,
            "ranks": list(range(job.world_size))}]
    for pg in dist.get("pg_config") or []:
        if not isinstance(pg, dict) or str(pg.get("pg_name")) == "0":
            continue
        size = pg.get("pg_size")
        ranks = group if size == world_src else [rank] if size == 1 else None
        if ranks is not None:
            out.append({**pg, "pg_desc": job.group_desc if len(ranks) > 1 else pg.get("pg_desc"),
                        "pg_size": len(ranks), "ranks": ranks})
    if len(out) == 1:
        out.append({"pg_name": "1", "pg_desc": job.group_desc, "backend_config": "cuda:nccl",
                    "pg_size": len(group), "ranks": group})
    return out


_GROUP_RANKS = ("Process Group Ranks",)


@dataclass(frozen=True)
class _Prepared:
    """The tiled source events of a job (shared by every rank) and their times."""

    events: list[dict[str, Any]]
    ts: Any
    end: Any


def _prepare(doc: dict[str, Any], job: SyncJob) -> _Prepared:
    import numpy as np

    events = [e for e in tiled_events(doc, job.copies) if not (job.drop_python and e.get("cat") == "python_function")]
    ts = np.array([float(e["ts"]) if isinstance(e.get("ts"), (int, float)) else np.nan for e in events])
    end = ts + np.array([float(e["dur"]) if isinstance(e.get("dur"), (int, float)) else 0.0 for e in events])
    return _Prepared(events, ts, end)


def write_sync_rank(doc: dict[str, Any], dst: Path, rank: int, job: SyncJob,
                    schedule: tuple[list[float], list[float]], prepared: _Prepared | None = None) -> int:
    """Write one rank of ``job`` (``.json`` or ``.json.gz``); returns the events written."""
    import numpy as np

    src, mine = (np.asarray(v, dtype="float64") for v in schedule)
    prep = prepared or _prepare(doc, job)
    ts, end = prep.ts, prep.end
    slope = dict(job.slow).get(rank, 1.0)

    def remap(t: np.ndarray) -> np.ndarray:
        out = np.interp(t, src, mine)
        out = np.where(t < src[0], t, out)
        return np.where(t > src[-1], mine[-1] + (t - src[-1]) * slope, out)

    new_ts = np.round(remap(ts), 3).tolist()
    new_dur = np.round(remap(end) - remap(ts), 3).tolist()
    timed = (~np.isnan(ts)).tolist()
    group = str(job.group_of(rank))
    spec = TileSpec(rank, job.world_size)
    out = []
    for i, e in enumerate(prep.events):
        e = dict(e)
        if timed[i]:
            e["ts"] = new_ts[i]
            if isinstance(e.get("dur"), (int, float)):
                e["dur"] = new_dur[i]
        args = e.get("args")
        if isinstance(args, dict) and any(k in args for k in _GROUP_RANKS):
            e["args"] = {**args, "Process Group Ranks": group, **({"Rank": rank} if "Rank" in args else {})}
        out.append(e)
    with _open_out(dst) as fh:
        header = {k: v for k, v in doc.items() if k != "traceEvents"}
        groups = _pg_config(doc, rank, job)
        header["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "pg_count": len(groups), "pg_config": groups}
        fh.write(_header(header, spec))
        fh.write(orjson.dumps(out)[1:-1])
        fh.write(b"\n  ]\n}\n")
    return len(out)


def write_sync_job(doc: dict[str, Any], folder: Path, job: SyncJob, *, ranks: Iterable[int] | None = None,
                   name: str = "rank-{rank}.pt.trace.json.gz") -> list[Path]:
    """Write the rank files of ``job`` (all ranks, or ``ranks``) into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    schedule = sync_schedule(doc, job)
    prepared = _prepare(doc, job)
    paths = []
    for rank in (range(job.world_size) if ranks is None else ranks):
        dst = folder / name.format(rank=rank)
        write_sync_rank(doc, dst, rank, job, schedule[rank], prepared)
        paths.append(dst)
    return paths


__all__ = ["SyncJob", "TileSpec", "load_trace", "sync_points", "sync_schedule", "tile_trace", "tiled_events",
           "write_sync_job", "write_sync_rank"]
