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
    from collections.abc import Iterator

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


__all__ = ["TileSpec", "load_trace", "tile_trace", "tiled_events"]
