"""Streaming parse of a PyTorch/Kineto chrome trace into compact per-kind columns.

The ``traceEvents`` array is streamed with ijson (its C backend when installed), so the whole
JSON object tree never sits in memory: each event is reduced at once to the few fields the
report needs. Top-level keys (``deviceProperties``, ``baseTimeNanoseconds``,
``distributedInfo``) are read from the text before and after the events array, which is kept
while streaming. Both the current categories (``cpu_op``, ``kernel``, ``cuda_runtime``, ...)
and the 2021 capitalised ones (``Operator``, ``Kernel``, ``Runtime``, ...) are understood.

A trace cut short (truncated file) keeps the events read so far and is marked partial.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import orjson

from perfscope.errors import InputFormatError

KIND_OF_CAT = {
    "cpu_op": "op", "operator": "op",
    "user_annotation": "ann",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_runtime": "api", "runtime": "api",
    "cuda_driver": "api",
}
"""Lower-cased ``cat`` -> the kind of row it feeds."""

HEAD_KEEP = 4 << 20
TAIL_KEEP = 4 << 20

FIELDS = {
    "op": ("name", "pid", "tid", "ts", "dur", "ext", "dims", "types", "concrete"),
    "ann": ("name", "pid", "tid", "ts", "dur"),
    "kernel": ("name", "device", "stream", "ts", "dur", "corr", "ext", "grid", "block",
               "regs", "smem", "occupancy"),
    "memcpy": ("name", "device", "stream", "ts", "dur", "corr", "bytes"),
    "memset": ("name", "device", "stream", "ts", "dur", "corr", "bytes"),
    "api": ("name", "pid", "tid", "ts", "dur", "corr", "ext", "driver"),
}


@dataclass
class ParsedTrace:
    """Columns per kind (lists of equal length), the top-level metadata and parse notes."""

    cols: dict[str, dict[str, list[Any]]]
    meta: dict[str, Any]
    n_events: int = 0
    warnings: list[str] = field(default_factory=list)
    partial: bool = False

    def count(self, kind: str) -> int:
        return len(self.cols[kind]["ts"])


class _Keeper(io.RawIOBase):
    """A read-through wrapper that keeps the first and last few MB of what was read."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.head = bytearray()
        self.tail = bytearray()
        self.nread = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.nread += len(data)
        if len(self.head) < HEAD_KEEP:
            self.head += data[: HEAD_KEEP - len(self.head)]
        self.tail += data
        if len(self.tail) > 2 * TAIL_KEEP:
            del self.tail[: len(self.tail) - TAIL_KEEP]
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _open(path: Path) -> IO[bytes]:
    fh = open(path, "rb")
    if fh.read(2) == b"\x1f\x8b":
        fh.seek(0)
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    fh.seek(0)
    return fh


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def _meta_from_head(head: bytes) -> dict[str, Any]:
    m = _EVENTS_KEY.search(head)
    if not m:
        return {}
    text = head[: m.start()].rstrip().rstrip(b",") + b"}"
    try:
        meta = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}


_EVENTS_END = re.compile(rb"\}\s*\]\s*([,}])")


def _meta_from_tail(tail: bytes) -> dict[str, Any]:
    """Top-level keys after the events array: the first ``}]`` whose remainder parses."""
    for m in _EVENTS_END.finditer(tail):
        rest = tail[m.start(1):]
        candidate = b"{" + rest[1:] if rest[:1] == b"," else b"{}"
        try:
            meta = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        if isinstance(meta, dict):
            return meta
    return {}


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _append(cols: dict[str, list[Any]], values: tuple[Any, ...], names: tuple[str, ...]) -> None:
    for key, value in zip(names, values):
        cols[key].append(value)


def _dims3(v: Any) -> str | None:
    if isinstance(v, list) and v:
        return "(" + ", ".join(str(int(x)) for x in v) + ")"
    return None


def _route(e: dict[str, Any], cols: dict[str, dict[str, list[Any]]]) -> None:
    cat = e.get("cat")
    kind = KIND_OF_CAT.get(cat.lower()) if isinstance(cat, str) else None
    if kind is None or e.get("ph", "X") != "X":
        return
    ts, dur = _num(e.get("ts")), _num(e.get("dur"))
    if ts is None or dur is None:
        return
    name = e.get("name")
    name = name if isinstance(name, str) else str(name)
    args = e.get("args") or {}
    if not isinstance(args, dict):
        args = {}
    ext = args.get("External id", args.get("external id"))
    if kind == "op" and cat == "Operator" and "::" not in name:
        kind = "ann"  # 2021 traces file record_function ranges as Operator
    if kind == "op":
        vals = (name, e.get("pid"), e.get("tid"), ts, dur, ext, args.get("Input Dims"),
                args.get("Input type"), args.get("Concrete Inputs"))
    elif kind == "ann":
        vals = (name, e.get("pid"), e.get("tid"), ts, dur)
    elif kind == "kernel":
        occ = args.get("est. achieved occupancy %")
        vals = (name, args.get("device", e.get("pid")), args.get("stream", e.get("tid")), ts, dur,
                args.get("correlation"), ext, _dims3(args.get("grid")), _dims3(args.get("block")),
                args.get("registers per thread"), args.get("shared memory"), _num(occ))
    elif kind in ("memcpy", "memset"):
        vals = (name, args.get("device", args.get("fromDevice", e.get("pid"))),
                args.get("stream", e.get("tid")), ts, dur, args.get("correlation"), args.get("bytes"))
    else:
        vals = (name, e.get("pid"), e.get("tid"), ts, dur, args.get("correlation"), ext,
                str(cat).lower() == "cuda_driver")
    _append(cols[kind], vals, FIELDS[kind])


def _events(keeper: _Keeper, first: bytes) -> Iterator[Any]:
    prefix = "item" if first == b"[" else "traceEvents.item"
    return ijson.items(keeper, prefix, use_float=True)


def parse_trace(path: Path) -> ParsedTrace:
    """Stream ``path`` (JSON or gzipped JSON) into a :class:`ParsedTrace`.

    Raises:
        InputFormatError: not JSON, JSON that is not a trace, or damaged before any event.
    """
    cols = {kind: {f: [] for f in names} for kind, names in FIELDS.items()}
    trace = ParsedTrace(cols=cols, meta={})
    with _open(path) as raw:
        keeper = _Keeper(raw)
        reader = io.BufferedReader(keeper, buffer_size=1 << 20)
        first = reader.peek(64).lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
        if first not in (b"{", b"["):
            raise InputFormatError(path, "not JSON", hint="give a torch.profiler / Kineto trace (.json or .json.gz)")
        try:
            for e in _events(reader, first):  # type: ignore[arg-type]
                trace.n_events += 1
                if isinstance(e, dict):
                    _route(e, cols)
        except (ijson.JSONError, EOFError, gzip.BadGzipFile, OSError) as exc:
            if trace.n_events == 0:
                raise InputFormatError(path, f"damaged or truncated JSON ({_short(exc)})",
                                       hint="re-export the trace") from None
            trace.partial = True
            trace.warnings.append(
                f"trace is truncated or damaged after {trace.n_events} events ({_short(exc)}); "
                "the report holds what was read"
            )
        if first == b"{":
            trace.meta = {**_meta_from_tail(bytes(keeper.tail)), **_meta_from_head(bytes(keeper.head))}
            if trace.n_events == 0 and not _EVENTS_KEY.search(bytes(keeper.head)) and "traceEvents" not in trace.meta:
                raise InputFormatError(path, "JSON, but not a trace (no traceEvents array)",
                                       hint="give a torch.profiler / Kineto trace")
    return trace


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]
