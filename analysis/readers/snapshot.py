"""CUDA memory snapshot (``torch.cuda.memory._dump_snapshot()`` pickle) -> the ``memory`` table.

A snapshot is a pickle, and a pickle can run code when it is loaded. This reader loads it with
Python's C unpickler (:class:`pickle.Unpickler`) whose ``find_class`` refuses every global the file
names (it resolves only this load's own :class:`_Sink`, below, under a random token): without a
global nothing callable ever reaches the pickle's stack, so REDUCE, BUILD, NEWOBJ, INST and OBJ
fail, and the file builds only dicts, lists, tuples, strings, bytes, numbers, booleans and None
(persistent ids and out-of-band buffers are refused by the unpickler itself). Anything else fails
with one line naming what the pickle asked for. Nothing in the file is ever called.

Speed and memory (docs/memory.md, "Large snapshots"): the C unpickler reads at its own speed, and
the trace is streamed rather than built. :class:`_Stream` feeds the file to the unpickler and, where
a list of dicts begins (``]`` MEMOIZE? ``(`` FRAME? ``}`` MEMOIZE? ``(``: how both of Python's
picklers write a list of two or more dicts), puts in its place a GLOBAL of this load's own
:class:`_Sink` (a list subclass, named by a random token the file cannot know) and an EMPTY_TUPLE
REDUCE. The unpickler then hands the sink each batch of items (APPENDS calls ``extend``, in batches
of 1000 as the pickler wrote them): a batch of trace events is read into columns, counted against the
import budget (:func:`perfscope.limits.take`) and emptied at once, so memory holds one batch, the
distinct frames and the kept columns, not the file; any other list (segments, blocks, tracebacks)
keeps its items, as a list would. A spot where those bytes happen to lie inside a string or a number
breaks the pickle and ends in the one-line error below; the bytes were never a global's name, so
nothing runs either way.

A hostile pickle ends in one :class:`~perfscope.errors.InputFormatError` line: an event referenced
twice (memo references that repeat one event or one segment), a list where a dict belongs, a number
that is not a byte count or an address (10**400, a string), past ``--max-events`` or
``PERFSCOPE_MAX_MEMORY``.
"""

from __future__ import annotations

import math
import pickle
import re
import secrets
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pandas as pd

from perfscope.errors import InputFormatError, PerfscopeError
from perfscope.limits import take
from perfscope.report import Report, source_info

from ..memory import (
    ALLOC,
    FREE,
    FREE_COMPLETED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    MemEvents,
    frames_summary,
    timeline,
)
from .finish import Imported, finish

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

ACTION_CODES = {"alloc": ALLOC, "free_requested": FREE, "free": FREE, "free_completed": FREE_COMPLETED,
                "segment_alloc": SEGMENT_ALLOC, "segment_free": SEGMENT_FREE, "segment_map": SEGMENT_ALLOC,
                "segment_unmap": SEGMENT_FREE, "oom": OOM}
"""Snapshot trace actions -> :mod:`..memory` codes (``snapshot`` markers and unknown actions are skipped)."""

BLOCK = 1 << 20
"""Bytes of the file read at a time (and the resident-memory check's period)."""

MEMO_OPS = {b"\x94": rb"\x94", b"q": rb"(?:q.|r.{4})", b"r": rb"(?:q.|r.{4})", b"(": b""}
"""How a pickler memoizes (MEMOIZE, BINPUT, LONG_BINPUT; ``(``: fast mode, not at all), by the byte
after the top-level EMPTY_DICT, and the pattern of that memo op."""


def list_of_dicts(memo: bytes) -> re.Pattern[bytes]:
    """EMPTY_LIST, the file's memo op, MARK, a frame header the Python pickler may put before an item,
    EMPTY_DICT, the memo op, MARK: where a list of dicts of two or more keys begins. With the memo op
    (``\\x94`` after ``]`` is never UTF-8 text) the bytes cannot come from a string."""
    return re.compile(rb"\]" + memo + rb"\((?:\x95.{8})?\}" + memo + rb"\(", re.DOTALL)
_OVERLAP = 1 + 5 + 1 + 9 + 1 + 5 + 1
"""Longest match of :func:`list_of_dicts` (kept over from one block to the next)."""

LINE_LIMIT = 1 << 26
"""Longest text line (protocol 0 opcodes) the stream hands the unpickler."""

ADDRESS_LIMIT = 1 << 64
"""Sizes and addresses are unsigned 64-bit numbers; anything else is not a snapshot's."""
TIME_LIMIT = 1 << 62
"""Microsecond timestamps past this (146,000 years) are not a clock's."""


class UnsafePickle(Exception):
    """The pickle asked for something other than plain data."""


class _Bad(Exception):
    """A snapshot whose plain data is not a snapshot's layout (one line, with what was found)."""


def looks_like_pickle(head: bytes) -> bool:
    """A pickle of protocol 2 or later (``\\x80`` then the protocol byte)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


class _Stream:
    """The file as the unpickler reads it, with this load's sink GLOBAL put in place of the EMPTY_LIST
    of each list of dicts (:func:`list_of_dicts`). ``peek`` lets the unpickler prefetch (its frames
    are then only read-ahead hints, so the longer bytes inside a frame are read right)."""

    def __init__(self, fh: BinaryIO, inject: bytes | None, path: Path) -> None:
        self.fh, self.inject, self.path = fh, inject, path
        self.pattern: re.Pattern[bytes] | None = None
        self.memo: bytes | None = None  # the file's memo op (b"(": none), known at the first read
        self.buf = b""
        self.pos = 0
        self.carry = b""
        self.eof = False
        self.read_bytes = 0
        self.injected = 0

    def _fill(self, n: int) -> None:
        while len(self.buf) - self.pos < n and not self.eof:
            raw = self.fh.read(BLOCK)
            self.read_bytes += len(raw)
            data = self.carry + raw
            if raw:
                limit = max(0, len(data) - _OVERLAP)
            else:
                self.eof, limit = True, len(data)
            if self.memo is None:
                self.memo = _memo_of(data)
                if self.inject is not None and self.memo in MEMO_OPS:
                    self.pattern = list_of_dicts(MEMO_OPS[self.memo])
            pieces: list[bytes] = []
            last = 0
            inject = self.inject or b""
            for m in self.pattern.finditer(data) if self.pattern is not None else ():
                at = m.start()
                if at >= limit:
                    break
                pieces += (data[last:at], inject)
                last = at + 1
                self.injected += 1
            pieces.append(data[last:limit])
            self.carry = data[limit:]
            self.buf = self.buf[self.pos:] + b"".join(pieces)
            self.pos = 0
            take(self.path, 0)  # the resident-memory check, once a block

    def peek(self, n: int = 1) -> bytes:
        self._fill(max(1, n))
        return self.buf[self.pos:self.pos + max(1, n)]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise UnsafePickle("a read of the whole file")
        self._fill(n)
        out = self.buf[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        scanned = 0  # bytes after pos already searched for the newline
        while True:
            i = self.buf.find(b"\n", self.pos + scanned)
            if i >= 0:
                return self.read(i + 1 - self.pos)
            have = len(self.buf) - self.pos
            if self.eof:
                return self.read(have)
            if have > LINE_LIMIT:
                raise _Bad(f"a text line longer than {LINE_LIMIT:,} bytes")
            scanned = have
            self._fill(have + 1)


def _memo_of(head: bytes) -> bytes:
    """The byte after the top-level EMPTY_DICT: the file's memo op (:data:`MEMO_OPS`; b"" not known)."""
    m = re.match(rb"\x80[\x02-\x05](?:\x95.{8})?\}(.)", head, re.DOTALL)
    return m.group(1) if m else b""


NAN = math.nan


def _columns() -> list[Any]:
    """A trace's columns: time_us, action code, size, addr, stream as typed arrays (8 bytes a value, no
    number objects), then op, source, hint, stack (shared strings)."""
    return [array("d"), array("b"), array("d"), array("d"), array("d"), [], [], [], []]


class _Reader:
    """One load: the sink's callbacks, the events read into columns, the time window."""

    def __init__(self, path: Path, start_us: float | None, end_us: float | None) -> None:
        self.path = path
        self.start_us, self.end_us = start_us, end_us
        self.token = "perfscope_snapshot_" + secrets.token_hex(12)
        reader = self

        class _Sink(list):  # type: ignore[type-arg]
            """A list of dicts being read: events go to the reader, anything else stays (see the module)."""

            __slots__ = ("trace",)

            def extend(self, items: Any) -> None:
                reader.take_items(self, items)

            def append(self, item: Any) -> None:
                reader.take_items(self, [item])

        self.sink = _Sink
        self.frame_cache: dict[Any, Any] = {}
        self.by_id = False  # frame dicts are kept alive by the unpickler's memo: known by their ids
        self.by_ids: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self.summaries: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.traces: list[_Sink] = []  # sinks (and plain lists) of trace events, in the order their events came
        self.cols: list[list[list[Any]]] = []
        self.pre_live: list[dict[Any, tuple[Any, ...]]] = []  # per trace: blocks live when the window starts
        self.allocated: list[set[Any]] = []  # per trace: addresses the history allocates
        self.live: list[set[Any]] = []  # per trace: addresses live so far in the history
        self.after: list[list[tuple[Any, ...]]] = []  # per trace: blocks from before the history freed after the window
        self.times: list[list[bool]] = []  # per trace: [some event had a time, some had none]
        self.seen = 0
        self.kept = 0

    # -- the unpickler's side
    def find_class(self, module: str, name: str) -> Any:
        if module == self.token and name == "Sink":
            return self.sink
        raise UnsafePickle(f"{module}.{name}")

    def take_items(self, target: Any, items: list[Any]) -> None:
        if not items:
            return
        k = getattr(target, "trace", None)
        if k is None:
            first = items[0]
            k = target.trace = self.new_trace(target) if first.__class__ is dict and "action" in first else -1
        if isinstance(k, int) and 0 <= k < len(self.cols) and self.traces[k] is target:
            self.events(k, items)
            return
        for x in items:
            if x.__class__ is dict and isinstance(x.get("frames"), list) and "action" not in x:
                x["frames"] = self.reading(x["frames"])  # a block's or a segment's traceback
        list.extend(target, items)

    def new_trace(self, target: Any) -> int:
        self.traces.append(target)
        self.cols.append(_columns())
        self.pre_live.append({})
        self.allocated.append(set())
        self.live.append(set())
        self.after.append([])
        self.times.append([False, False])
        return len(self.cols) - 1

    def reading(self, frames: Any) -> tuple[Any, ...]:
        """(op, source, hint, stack) of a traceback, once per distinct one; the list is emptied.

        In a file with a memo every frame dict stays alive until the load ends (the memo holds it),
        so a traceback is known by the ids of its frames: a torch snapshot's events share their frame
        dicts, and most tracebacks repeat."""
        if not isinstance(frames, list):
            return (None, None, None, None)
        if len(frames) == 1 and frames[0].__class__ is tuple and frames[0] in self.summaries:
            return frames[0]  # type: ignore[no-any-return]  # a traceback already read (a memo reference)
        key = tuple(map(id, frames)) if self.by_id else None
        s = self.by_ids.get(key) if key is not None else None
        if s is None:
            s = frames_summary(frames, self.frame_cache, by_id=self.by_id)
            s = self.summaries.setdefault(s, s) if len(self.summaries) < (1 << 20) else s
            if key is not None and len(self.by_ids) < (1 << 20):
                self.by_ids[key] = s
        frames[:] = (s,)  # emptied: a later reference to this list finds its reading
        return s

    def loaded(self) -> None:
        """The load ended: the memo is gone, and with it the frames the id caches name."""
        self.by_id = False
        self.by_ids.clear()
        self.frame_cache.clear()

    def events(self, k: int, items: list[Any]) -> None:
        """Trace events into the columns of trace ``k``, each checked and then emptied."""
        take(self.path, len(items))
        if self.start_us is not None or self.end_us is not None:
            self._window_events(k, items)
            return
        cols = self.cols[k]
        times = self.times[k]
        put_t, put_code, put_size, put_addr, put_stream, put_op, put_src, put_hint, put_stack = (c.append for c in cols)
        codes, reading = ACTION_CODES, self.reading
        first = self.seen
        kept = 0
        for n, e in enumerate(items, start=first + 1):
            action, t, size, addr, stream = _fields(e, n)
            code = codes.get(action) if action.__class__ is str else None
            if code is None:
                e.clear()
                continue
            if t is None:
                times[1] = True
                t = NAN
            else:
                times[0] = True
            op, src, hint, stack = reading(e.get("frames"))
            e.clear()
            put_t(t)
            put_code(code)
            put_size(size)
            put_addr(addr)
            put_stream(NAN if stream is None else stream)
            put_op(op)
            put_src(src)
            put_hint(hint)
            put_stack(stack)
            kept += 1
        self.seen = first + len(items)
        self.kept += kept

    def _window_events(self, k: int, items: list[Any]) -> None:
        """:meth:`events` with a time window: those before it leave only the blocks live when it starts,
        those after it only the blocks from before the history they free."""
        cols = self.cols[k]
        times = self.times[k]
        allocated, live, pre_live, after = self.allocated[k], self.live[k], self.pre_live[k], self.after[k]
        lo, hi = self.start_us, self.end_us
        for e in items:
            self.seen += 1
            action, t, size, addr, stream = _fields(e, self.seen)
            code = ACTION_CODES.get(action) if action.__class__ is str else None
            if code is None:
                e.clear()
                continue
            times[0 if t is not None else 1] = True
            op, src, hint, stack = self.reading(e.get("frames"))
            e.clear()
            unseen_free = False
            if code == ALLOC:
                allocated.add(addr)
                live.add(addr)
            elif code == FREE or code == FREE_COMPLETED:
                unseen_free = code == FREE and addr not in live and addr not in allocated
                live.discard(addr)
            if lo is not None and t is not None and t < lo:
                if code == ALLOC:  # before the window: only what is live when it starts is kept
                    pre_live[addr] = (addr, size, op, None, src, hint, stack)
                elif code == FREE or code == FREE_COMPLETED:
                    pre_live.pop(addr, None)
                continue
            if hi is not None and t is not None and t > hi:
                if unseen_free:  # allocated before the history, so live through the window
                    after.append((addr, size, op, None, src, hint, stack))
                continue
            for c, v in zip(cols, (NAN if t is None else t, code, size, addr, NAN if stream is None else stream,
                                   op, src, hint, stack)):
                c.append(v)
            self.kept += 1


def _fields(e: Any, n: int) -> tuple[Any, Any, float, float, Any]:
    """(action, time_us, size, addr, stream) of trace event ``n``, each checked: one line when the event
    is not a dict, repeats one already read, or holds what is not a time, a byte count or a stream."""
    if e.__class__ is not dict:
        raise _Bad(f"trace event {n:,} is a {type(e).__name__}, not a dict")
    get = e.get
    action, t, size, addr, stream = get("action"), get("time_us"), get("size"), get("addr"), get("stream")
    if action is None:
        raise _Bad(f"trace event {n:,} " + ("refers back to an event already read (a memo reference repeating it)"
                                            if not e else "has no 'action'"))
    if t is not None and not ((t.__class__ is int or t.__class__ is float) and -TIME_LIMIT < t < TIME_LIMIT):
        raise _Bad(f"trace event {n:,}: time_us {_shown(t)} is not a time in microseconds")
    if stream is not None and not (stream.__class__ is int and -ADDRESS_LIMIT < stream < ADDRESS_LIMIT):
        raise _Bad(f"trace event {n:,}: stream {_shown(stream)} is not a CUDA stream")
    size = float(size) if size.__class__ is int and 0 <= size < ADDRESS_LIMIT else _count(size, "size", n)
    addr = float(addr) if addr.__class__ is int and 0 <= addr < ADDRESS_LIMIT else _count(addr, "addr", n)
    return action, t, size, addr, stream


def _count(v: Any, what: str, n: int) -> float:
    """A byte count or an address as a float (NaN when absent); one line when it is not one."""
    if v is None:
        return math.nan
    if v.__class__ is int and 0 <= v < ADDRESS_LIMIT:
        return float(v)
    raise _Bad(f"trace event {n:,}: {what} {_shown(v)} is not a byte count or an address")


def _shown(v: Any) -> str:
    """A value as an error line names it: short, never a 4,300-digit number."""
    if isinstance(v, int) and not isinstance(v, bool):
        return f"of {v.bit_length()} bits" if abs(v) >= 1 << 64 else str(v)
    return f"of type {type(v).__name__}" if not isinstance(v, (float, str)) else repr(v)[:40]


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream: _Stream, reader: _Reader) -> None:
        super().__init__(stream)  # type: ignore[arg-type]
        self.reader = reader

    def find_class(self, module: str, name: str) -> Any:
        return self.reader.find_class(module, name)


def load_snapshot(path: str | Path, *, start_us: float | None = None,
                  end_us: float | None = None) -> tuple[dict[str, Any], _Reader]:
    """The snapshot's top-level dict (its trace lists emptied, tracebacks read) and the events read.

    Raises:
        InputFormatError: not a pickle, a pickle of something other than plain data (one line
            naming what it asked for), or not a memory snapshot's layout.
    """
    p = Path(path)
    try:
        return _load(p, start_us, end_us, stream=True)
    except _Retry:
        # the pickle broke where the sink went in: a list's bytes inside a string or a number (a file
        # written without a memo); read it again as it is, the events counted once read
        return _load(p, start_us, end_us, stream=False)


class _Retry(Exception):
    """The streamed load failed in the unpickler: read the file again without the sinks."""


def _load(p: Path, start_us: float | None, end_us: float | None, *, stream: bool) -> tuple[dict[str, Any], _Reader]:
    got = _Reader(p, start_us, end_us)
    inject = b"c" + got.token.encode() + b"\nSink\n)R"
    source = None
    try:
        with open(p, "rb") as fh:
            source = _Stream(fh, inject if stream else None, p)
            source.peek(1)  # the first block: the file's memo style
            got.by_id = source.memo not in (b"(", b"")
            top = _Unpickler(source, got).load()
        got.loaded()
        if not isinstance(top, dict) or not isinstance(top.get("segments"), list):
            raise _Bad("is a pickle but not a CUDA memory snapshot (no 'segments' list)")
        _check_layout(top, got)
    except PerfscopeError:
        raise
    except UnsafePickle as exc:
        raise InputFormatError(p, f"refused: the pickle asks for {exc}, not plain data; a memory snapshot holds "
                               "only dicts, lists, strings and numbers, and perfscope never runs code from a file",
                               hint="only import snapshots written by torch.cuda.memory._dump_snapshot()") from None
    except _Bad as exc:
        raise InputFormatError(p, f"not a memory snapshot's layout: {exc}",
                               hint="give the file torch.cuda.memory._dump_snapshot() wrote") from None
    except RecursionError:
        raise InputFormatError(p, "nested too deeply to be a memory snapshot",
                               hint="give the file torch.cuda.memory._dump_snapshot() wrote") from None
    except MemoryError:
        raise InputFormatError(p, "needs more memory than this machine has to read",
                               hint="import it with PERFSCOPE_MAX_MEMORY set, on a larger machine") from None
    except Exception as exc:  # noqa: BLE001 - the C unpickler raises UnpicklingError, EOFError, ValueError, KeyError, ...
        if stream and source is not None and source.pattern is not None and source.injected:
            raise _Retry from None
        raise InputFormatError(p, f"damaged or not a pickle ({type(exc).__name__}: {str(exc)[:200]})",
                               hint="re-dump it with torch.cuda.memory._dump_snapshot()") from None
    return top, got


def _check_layout(top: dict[str, Any], got: _Reader) -> None:
    """Segments and blocks are dicts seen once each; the traces are ``device_traces``' lists, each
    once (a memo reference repeating a segment or a trace is refused); a trace list the sink did not
    see (one event, or an old protocol) is read here."""
    seen: set[int] = set()
    for n, s in enumerate(top["segments"]):
        if s.__class__ is not dict:
            raise _Bad(f"segment {n + 1:,} is a {type(s).__name__}, not a dict")
        blocks = s.get("blocks") or []
        if not isinstance(blocks, list):
            raise _Bad(f"segment {n + 1:,}: blocks is a {type(blocks).__name__}, not a list")
        for obj in (s, *blocks):
            if obj.__class__ is not dict:
                raise _Bad(f"segment {n + 1:,} holds a {type(obj).__name__} where a block's dict belongs")
            if id(obj) in seen:
                raise _Bad("a segment or block appears twice (a memo reference repeating it)")
            seen.add(id(obj))
            if isinstance(obj.get("frames"), list):
                obj["frames"] = got.reading(obj["frames"])
        take(got.path, len(blocks) + 1)
    traces = top.get("device_traces")
    if traces is None:
        return
    if not isinstance(traces, list):
        raise _Bad(f"device_traces is a {type(traces).__name__}, not a list")
    ids = {id(t) for t in got.traces}
    for t in traces:
        if not isinstance(t, list):
            raise _Bad(f"device_traces holds a {type(t).__name__} where a device's list of events belongs")
        if id(t) in seen:
            raise _Bad("a device's trace appears twice (a memo reference repeating it)")
        seen.add(id(t))
        if id(t) not in ids and len(t):
            got.events(got.new_trace(t), list(t))
            t.clear()
    if any(id(t) not in seen for t in got.traces):
        raise _Bad("trace events outside device_traces")


def import_snapshot(path: str | Path, *, device: DeviceSpec | None = None, start_us: float | None = None,
                    end_us: float | None = None) -> Imported:
    """A snapshot as an :class:`Imported` with a ``memory`` table (one device per trace list)."""
    p = Path(path)
    top, got = load_snapshot(p, start_us=start_us, end_us=end_us)
    found = top.get("device_traces")
    traces: list[Any] = found if isinstance(found, list) else []
    position = {id(x): i for i, x in enumerate(traces)}  # which device each trace list is
    segments = [s for s in top["segments"] if isinstance(s, dict)]
    tables = []
    warnings: list[str] = []
    clock = "time"
    for k, cols in enumerate(got.cols):
        dev_index = position.get(id(got.traces[k]), k)
        has_time, lacks_time = got.times[k]
        if lacks_time:
            clock = "events"
            warnings.append(f"cuda:{dev_index}: {'some' if has_time else 'no'} trace events have time_us: "
                            "the memory timeline's clock is the order of the events (t_ns counts events)")
        segs = [s for s in segments if s.get("device", dev_index) == dev_index]
        windowed = start_us is not None or end_us is not None
        allocated = got.allocated[k] if windowed else {a for a, c in zip(cols[3], cols[1]) if c == ALLOC}
        tables.append(_device_table(dev_index, cols, segs, warnings, [*got.pre_live[k].values(), *got.after[k]],
                                    allocated, windowed=windowed, by_order=lacks_time))
    if not got.cols and segments:  # no history recorded: the segments' live blocks at the dump
        for dev_index in sorted({_int(s.get("device"), 0) for s in segments}):
            segs = [s for s in segments if _int(s.get("device"), 0) == dev_index]
            tables.append(_device_table(dev_index, _columns(), segs, warnings, [], set(),
                                        windowed=False, by_order=True))
        clock = "events"
        warnings.append("the snapshot has no allocation history (record_memory_history was off): "
                        "the memory table holds the blocks live at the dump")
    memory = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    manifest: dict[str, Any] = {
        "name": p.name.split(".")[0],
        "source": source_info("memory-snapshot", p, "torch.cuda.memory._dump_snapshot", None),
        "warnings": warnings,
        "params": {"snapshot_events": got.seen, "snapshot_events_kept": got.kept,
                   "snapshot_segments": len(segments), "memory_clock": clock,
                   "memory_window_us": [start_us, end_us] if start_us is not None or end_us is not None else None},
        "unavailable_metrics": ["flops", "dram_bytes"],
    }
    return Imported({"memory": memory}, manifest, device, origin=str(p))


def read_snapshot(path: Path, *, device: DeviceSpec | None = None) -> Report:
    """Read a CUDA memory snapshot pickle into a Report (its ``memory`` table)."""
    return finish(import_snapshot(path, device=device))


read = read_snapshot


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < ADDRESS_LIMIT else default


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int) and not isinstance(v, bool) and abs(v) < ADDRESS_LIMIT else math.nan


def _reading(b: dict[str, Any]) -> tuple[Any, ...]:
    r = b.get("frames")
    return r if isinstance(r, tuple) and len(r) == 4 else (None, None, None, None)


def _device_table(dev_index: int, cols: list[Any], segs: list[dict[str, Any]], warnings: list[str],
                  pre_live: list[tuple[Any, ...]], allocated: set[Any], *, windowed: bool,
                  by_order: bool) -> pd.DataFrame:
    n = len(cols[1])
    if by_order:  # no clock: the order of the events is the clock
        t_ns = np.arange(n, dtype="int64")
    else:
        t_ns = np.rint(np.frombuffer(cols[0], dtype="float64") * 1000.0).astype("int64")
    action = np.frombuffer(cols[1], dtype="int8").copy()
    size = np.frombuffer(cols[2], dtype="float64").copy()
    addr = np.frombuffer(cols[3], dtype="float64").copy()
    stream = np.frombuffer(cols[4], dtype="float64").copy()
    # the blocks live at the dump, and the segments' bytes
    live_blocks = []
    reserved_end = 0.0
    segments = []
    for s in segs:
        total = _num(s.get("total_size"))
        reserved_end += 0.0 if math.isnan(total) else total
        segments.append((_num(s.get("address")), total))
        pool = s.get("segment_pool_id")
        graph_pool = isinstance(pool, tuple) and any(isinstance(x, int) and x != 0 for x in pool)
        for b in s.get("blocks") or []:
            if b.get("state") == "active_allocated" and _num(b.get("address")) not in allocated:
                op, src, hint, stack = _reading(b)
                live_blocks.append((_num(b.get("address")), _num(b.get("size")), op, None, src,
                                    "cuda_graph_pool" if graph_pool else hint, stack, _num(b.get("requested_size"))))
    seg_net = float(np.sum(np.where(action == SEGMENT_ALLOC, size, 0.0)) - np.sum(np.where(action == SEGMENT_FREE, size, 0.0)))
    ev = MemEvents(device=f"cuda:{dev_index}", t_ns=t_ns, action=action, size=size, addr=addr, stream=stream,
                   op=_objects(cols[5]), source=_objects(cols[6]), hint=_objects(cols[7]), stack=_objects(cols[8]),
                   preexisting=[*pre_live, *live_blocks], reserved_start=reserved_end - seg_net,
                   segments_end=None if windowed else segments)
    df = timeline(ev, "snapshot")
    live_end = set(df.loc[(df["action"] == "alloc") & df["free_t_ns"].isna(), "addr"].tolist())
    dumped = {_num(b.get("address")) for sg in segs for b in sg.get("blocks") or []
              if isinstance(b, dict) and b.get("state") == "active_allocated"}
    if not windowed and live_end != dumped:
        warnings.append(f"cuda:{dev_index}: {len(live_end ^ dumped)} block(s) live at the end of the replay and "
                        "live at the dump differ: the record lost events")
    return df


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
