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

import io
import math
import pickle
import re
import secrets
from array import array
from itertools import compress, repeat
from operator import itemgetter
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


COLUMN_TYPES = ("float64", "int8", "float64", "float64", "float64", "int32")
"""The dtypes of :func:`_columns`."""


def _block(reading: tuple[Any, ...]) -> tuple[Any, ...]:
    """(op, module, source, hint, stack) of a block from a traceback's (op, source, hint, stack)."""
    op, src, hint, stack = reading
    return op, None, src, hint, stack


def _columns() -> list[Any]:
    """A trace's columns: time_us, action code, size, addr, stream as typed arrays (8 bytes a value, no
    number objects), then each event's traceback reading as a code into :attr:`_Reader.readings`."""
    return [array("d"), array("b"), array("d"), array("d"), array("d"), array("i")]


TRIM_EVENTS = 1 << 16
"""Trace events read between two trims of the unpickler's memo (:meth:`_Reader.trim`), at the least (and
an eighth of those read so far: each trim copies the whole memo, about 16 bytes an event read)."""

CACHED_FRAMES = 1 << 22
"""Frame references the traceback cache holds at most (:meth:`_Reader.code`)."""

STAND_INS = 1 << 18
"""Frame dicts stood in for at most (:class:`_Frame`)."""

SLOW_EVENTS = 4096
"""Events read with a frame not yet stood in for in the memo, past which the memo is trimmed sooner."""


class _Frame:
    """Stands for one frame dict of the file (:meth:`_Reader.trim` puts it in the dict's place in the
    memo, so later tracebacks hold it): hashed by identity, so a traceback of them is a dict key at C
    speed. The file cannot make one (no global is ever resolved)."""

    __slots__ = ("frame",)

    def __init__(self, frame: dict[str, Any]) -> None:
        self.frame = frame

_NONE = type(None)


class _Read:
    """What a traceback list holds once read: the code of its reading (:meth:`_Reader.code`). The
    file cannot make one."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code


class _MemoHolder(pickle.Unpickler):
    """An unpickler whose memo is filled from this reader's own bytes (never the file's): each GLOBAL
    of its pickle resolves to the object of that place in :attr:`objects`, then LONG_BINPUT puts it at
    its index. The main unpickler then takes a copy of this memo (the one way to set memo entries)."""

    def __init__(self, objects: list[Any], data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.objects = objects

    def find_class(self, module: str, name: str) -> Any:
        return self.objects[int(name)]


class _Reader:
    """One load: the sink's callbacks, the events read into columns, the time window."""

    def __init__(self, path: Path, start_us: float | None, end_us: float | None, *, trim: bool = True) -> None:
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
        self.unpickler: pickle.Unpickler | None = None  # set while loading with a memo: what trim() trims
        self.trimmed = trim  # this load trims the memo (False: a second read, untrimmed)
        self.trims = 0
        self.since_trim = 0
        self.kept_memo = 0
        self.slow = 0  # events since the last trim whose traceback held a frame dict not stood in for
        self.frame_cache: dict[Any, Any] = {}
        self.by_id = False  # the file has a memo: its frame dicts are shared, known by identity
        self.stand_ins: dict[int, _Frame] = {}  # id of a frame dict -> its stand-in (which keeps it alive)
        self.cached_frames = 0
        # traceback lists later events may refer to, kept in the memo by trim(): the blocks' (an alloc
        # event shares its block's), those of frees awaiting their free_completed (which shares it),
        # the last batch's (a neighbour in the next batch may share one)
        self.held: dict[int, list[Any]] = {}
        self.pending: dict[float, Any] = {}
        self.recent: list[Any] = []
        self.readings: list[tuple[Any, ...]] = [(None, None, None, None)]  # code -> (op, source, hint, stack)
        self.codes: dict[tuple[Any, ...], int] = {self.readings[0]: 0}
        self.marks = [_Read(0)]  # code -> what a traceback list read holds in its place
        self.tracebacks: dict[tuple[Any, ...], int] = {(self.marks[0],): 0}  # frames (stand-ins) -> code
        self.traces: list[_Sink] = []  # sinks (and plain lists) of trace events, in the order their events came
        self.cols: list[list[Any]] = []
        self.pre_live: list[list[tuple[Any, ...]]] = []  # per trace: blocks live when the window starts
        self.allocated: list[np.ndarray] = []  # per trace: addresses the history allocates (with a window)
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
                frames = x["frames"]
                x["frames"] = self.reading(frames)  # a block's or a segment's traceback
                if self.unpickler is not None:
                    self.held[id(frames)] = frames
        list.extend(target, items)

    def new_trace(self, target: Any) -> int:
        self.traces.append(target)
        self.cols.append(_columns())
        self.pre_live.append([])
        self.allocated.append(np.empty(0))
        self.after.append([])
        self.times.append([False, False])
        return len(self.cols) - 1

    def reading(self, frames: Any) -> tuple[Any, ...]:
        """(op, source, hint, stack) of a traceback (:meth:`code`)."""
        return self.readings[self.code(frames)]

    def code(self, frames: Any) -> int:
        """The code of a traceback's reading (op, source, hint, stack), read once per distinct one; the
        list then holds its reading alone, so a later reference to it finds that.

        In a file with a memo a traceback is known by its frames' identities (a torch snapshot's events
        share their frame dicts, and most tracebacks repeat): each frame dict gets a :class:`_Frame`
        stand-in (the memo gets it too, at the next trim), and the tuple of stand-ins is the key."""
        if not isinstance(frames, list):
            return 0
        if len(frames) == 1 and frames[0].__class__ is _Read:
            return frames[0].code  # type: ignore[no-any-return]  # a traceback already read (a memo reference)
        key: tuple[Any, ...] | None = None
        c = None
        if self.by_id:
            try:
                key = tuple(frames)
                c = self.tracebacks.get(key)
            except TypeError:  # a frame dict not stood in for yet
                self.slow += 1
                key = self._stood(frames)
                c = self.tracebacks.get(key) if key is not None else None
        if c is None:
            s = frames_summary([f.frame if f.__class__ is _Frame else f for f in frames] if self.trims else frames,
                               self.frame_cache)  # stand-ins are in the file's objects only once the memo was trimmed
            c = self.codes.get(s)
            if c is None:
                c = self.codes[s] = len(self.readings)
                self.readings.append(s)
                self.marks.append(_Read(c))
                self.tracebacks[(self.marks[c],)] = c  # a list read before, referred to again
            if key is not None and self.cached_frames + len(frames) <= CACHED_FRAMES:
                self.tracebacks[key] = c
                self.cached_frames += len(frames)
        frames[:] = (self.marks[c],)  # emptied: a later reference to this list finds its reading
        return c

    def _stood(self, frames: list[Any]) -> tuple[Any, ...] | None:
        """The traceback with a stand-in for each frame dict (made on first sight); None when it cannot
        be a key (more frame dicts than :data:`STAND_INS`, or an item that is not hashable)."""
        stand_ins = self.stand_ins
        out = []
        for f in frames:
            if f.__class__ is dict:
                got = stand_ins.get(id(f))
                if got is None:
                    if len(stand_ins) >= STAND_INS:
                        return None
                    got = stand_ins[id(f)] = _Frame(f)
                f = got
            out.append(f)
        key = tuple(out)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def loaded(self) -> None:
        """The load ended: nothing more is read by identity."""
        self.unpickler = None
        self.by_id = False
        self.stand_ins.clear()
        self.tracebacks.clear()
        self.frame_cache.clear()
        self.held.clear()
        self.pending.clear()
        self.recent = []

    def events(self, k: int, items: list[Any]) -> None:
        """Trace events into the columns of trace ``k``, each checked and then emptied; then, every
        :data:`TRIM_EVENTS` or so, the memo trimmed of the events read (:meth:`trim`)."""
        take(self.path, len(items))
        if not self._batch(k, items):
            self._each_event(k, items)
        self.since_trim += len(items)
        if self.unpickler is not None and (self.since_trim >= max(TRIM_EVENTS, self.kept_memo, self.seen // 8) or (
                self.slow >= SLOW_EVENTS and self.since_trim >= self.kept_memo // 4)):
            self.trim()

    def _batch(self, k: int, items: list[Any]) -> bool:
        """A batch of events read column by column at C speed; False (nothing read) when any event is
        odd (not a dict, twice in the batch, an unknown action, a value that is not a plain number of
        its range, a missing one where others have it): :meth:`_each_event` then reads it and names what."""
        n = len(items)
        get: Any = dict.get  # the C-speed calls below, untyped
        code_of: Any = ACTION_CODES.get
        try:
            actions = list(map(get, items, repeat("action")))
            codes = list(map(code_of, actions))
        except TypeError:  # an event that is not a dict, an action that is not hashable
            return False
        if None in codes or len(set(map(id, items))) != n:
            return False
        times = list(map(get, items, repeat("time_us")))
        t = _plain_numbers(times, float, TIME_LIMIT, signed=True)
        s = _plain_numbers(list(map(get, items, repeat("size"))), int, ADDRESS_LIMIT)
        a = _plain_numbers(list(map(get, items, repeat("addr"))), int, ADDRESS_LIMIT)
        st = _plain_numbers(list(map(get, items, repeat("stream"))), int, ADDRESS_LIMIT, signed=True)
        if t is None or s is None or a is None or st is None or s is _ABSENT or a is _ABSENT:
            return False
        frames: list[Any] = list(map(get, items, repeat("frames")))
        got: list[Any]
        if self.by_id and set(map(type, frames)) == {list}:
            known: Any = self.tracebacks.get
            as_key: Any = tuple
            try:
                got = list(map(known, map(as_key, frames)))
            except TypeError:  # a frame dict not stood in for yet
                got = [None] * n
            if None in got:
                got = [self.code(f) if c is None else c for f, c in zip(frames, got)]
            put: Any = list.__setitem__
            reading_of: Any = self.marks.__getitem__
            list(map(put, frames, repeat(slice(None)), zip(map(reading_of, got))))
        else:
            got = [self.code(f) for f in frames]
        list(map(dict.clear, items))
        code = np.array(codes, dtype="int8")
        if self.unpickler is not None:
            self._awaited(frames, code, a)
        times_seen = self.times[k]
        if t is _ABSENT:
            times_seen[1] = True
            t = np.full(n, NAN)
        else:
            times_seen[0] = True
        cols = self.cols[k]
        for col, values in zip(cols, (t, code, s, a,
                                      np.full(n, NAN) if st is _ABSENT else st, np.array(got, dtype="int32"))):
            col.frombytes(values.tobytes())
        self.seen += n
        self.kept += n
        return True

    def _awaited(self, frames: list[Any], code: np.ndarray, addr: np.ndarray) -> None:
        """Note the traceback lists of this batch a later event may share (:attr:`held`): the batch's
        own, and each free's until its free_completed."""
        self.recent = frames
        rows = np.flatnonzero((code == FREE) | (code == FREE_COMPLETED))
        rows = rows[np.lexsort((rows, addr[rows]))]
        last = np.ones(len(rows), dtype=bool)  # each address's last free or free_completed here decides
        last[:-1] = addr[rows[1:]] != addr[rows[:-1]]
        rows = rows[last]
        awaiting = code[rows] == FREE
        pending = self.pending
        pending.update(zip(addr[rows[awaiting]].tolist(), map(frames.__getitem__, rows[awaiting].tolist())))
        drop: Any = pending.pop
        list(map(drop, addr[rows[~awaiting]].tolist(), repeat(None)))

    def _each_event(self, k: int, items: list[Any]) -> None:
        """:meth:`_batch`, event by event: an unknown action is skipped, anything odd named."""
        cols = self.cols[k]
        times = self.times[k]
        put_t, put_code, put_size, put_addr, put_stream, put_reading = (c.append for c in cols)
        codes, code_of = ACTION_CODES, self.code
        first = self.seen
        kept = 0
        seen: list[tuple[Any, int, float]] = []  # (frames, action code, addr) of each event read, for trim()
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
            frames = e.get("frames")
            reading = code_of(frames)
            e.clear()
            seen.append((frames, code, addr))
            put_t(t)
            put_code(code)
            put_size(size)
            put_addr(addr)
            put_stream(NAN if stream is None else stream)
            put_reading(reading)
            kept += 1
        self.seen = first + len(items)
        self.kept += kept
        if self.unpickler is not None and seen:
            self._awaited([f for f, _, _ in seen], np.array([c for _, c, _ in seen], dtype="int8"),
                          np.array([a for _, _, a in seen], dtype="float64"))

    def window(self) -> None:
        """Keep the events of each trace inside the time window: those before it leave only the blocks
        live when it starts (an address whose last event before it is an alloc, in the order a dict of
        them would hold), those after it only the blocks from before the history they free (a free at an
        address no earlier event allocated). Events without a time stay."""
        lo, hi = self.start_us, self.end_us
        if lo is None and hi is None:
            return
        self.kept = 0
        for k, cols in enumerate(self.cols):
            t, code, size, addr, stream, reading = (np.frombuffer(c, dtype=d) for c, d in zip(cols, COLUMN_TYPES))
            n = len(code)
            key = np.where(np.isnan(addr), -1.0, addr)  # no address: one key, as the read's dict had
            is_alloc = code == ALLOC
            pairs = is_alloc | (code == FREE) | (code == FREE_COMPLETED)
            before = t < lo if lo is not None else np.zeros(n, dtype=bool)
            after = t > hi if hi is not None else np.zeros(n, dtype=bool)
            self.allocated[k] = np.unique(addr[is_alloc])
            # before: the last event at each address, when an alloc; its place, the first alloc of its run
            rows = np.flatnonzero(before & pairs)
            order = rows[np.lexsort((rows, key[rows]))]
            start = np.ones(len(order), dtype=bool)
            start[1:] = key[order][1:] != key[order][:-1]
            last = np.ones(len(order), dtype=bool)
            last[:-1] = start[1:]
            freed = ~is_alloc[order]
            at = np.maximum.accumulate(np.where(freed | start, np.arange(len(order)), -1)) if len(order) else order
            run = at + freed[at] if len(order) else order
            live = np.flatnonzero(last & ~freed)
            readings = self.readings
            self.pre_live[k] = [(addr[i], size[i], *_block(readings[reading[i]])) for i in
                                order[live][np.argsort(order[run[live]], kind="stable")].tolist()]
            # after: frees of blocks no earlier event allocated
            alloc_rows = np.flatnonzero(is_alloc)
            keys, first = np.unique(key[alloc_rows], return_index=True)
            frees = np.flatnonzero(after & (code == FREE))
            j = np.minimum(np.searchsorted(keys, key[frees]), max(len(keys) - 1, 0))
            seen = (keys[j] == key[frees]) & (alloc_rows[first[j]] < frees) if len(keys) else np.zeros(len(frees), bool)
            self.after[k] = [(addr[i], size[i], *_block(readings[reading[i]])) for i in frees[~seen].tolist()]
            inside = ~before & ~after
            self.cols[k] = [np.ascontiguousarray(c[inside]) for c in (t, code, size, addr, stream, reading)]
            self.kept += int(inside.sum())

    @staticmethod
    def _read_lists(lists: list[list[Any]]) -> np.ndarray:
        """Which of these lists are tracebacks read here (each holds its :class:`_Read` alone)."""
        size = np.fromiter(map(len, lists), dtype="int64", count=len(lists))
        one = np.flatnonzero(size == 1)
        first: Any = itemgetter(0)
        kind = np.fromiter(map(id, map(type, map(first, [lists[i] for i in one.tolist()]))), dtype="int64",
                           count=len(one))
        out = np.zeros(len(lists), dtype=bool)
        out[one[kind == id(_Read)]] = True
        return out

    def trim(self) -> None:
        """Drop from the unpickler's memo the events read and their emptied tracebacks.

        The memo keeps every object the file memoized until the load ends: a torch snapshot's event
        dicts and traceback lists (its frames are shared, so it has a memo), about 200 bytes an event
        once emptied. Here the memo is replaced by one that holds all else at the same indices (the
        frames and strings later events refer to): an event dict emptied here (an empty dict) and a
        traceback list read here (its reading alone) are left out. A later reference to one of them
        (no pickler writes one: each was a distinct object) fails in the unpickler ("memo value not
        found"), and the file is read again untrimmed (:func:`load_snapshot`). The unpickler keeps its
        count of memo entries, so the file's later MEMOIZE ops number theirs as before."""
        u = self.unpickler
        assert u is not None
        memo: dict[int, Any] = u.memo.copy()
        index = np.fromiter(memo, dtype="int64", count=len(memo))
        values: list[Any] = list(memo.values())
        del memo
        kind = np.fromiter(map(id, map(type, values)), dtype="int64", count=len(values))
        awaited = np.fromiter((*self.held, *map(id, self.pending.values()), *map(id, self.recent)), dtype="int64")
        # an empty dict (an event read here), a traceback list read here (its reading alone) that no
        # later event is expected to share
        drop = (kind == id(dict)) & ~np.fromiter(map(bool, values), dtype=bool, count=len(values))
        lists = np.flatnonzero(kind == id(list))
        read = lists[self._read_lists([values[i] for i in lists.tolist()])]
        drop[read[~np.isin(np.fromiter(map(id, [values[i] for i in read.tolist()]), dtype="int64", count=len(read)),
                           awaited)]] = True
        stand_ins = self.stand_ins
        keep = [(i, stand_ins.get(id(v), v) if v.__class__ is dict else v)  # a frame dict: its stand-in from now on
                for i, v in zip(index[~drop].tolist(), compress(values, (~drop).tolist()))]
        del values
        if keep and max(i for i, _ in keep) >= 1 << 32:  # past LONG_BINPUT's reach: no more trims
            self.unpickler = None
            return
        objects = [v for _, v in keep]
        data = b"".join(b"c_\n%d\nr%s0" % (j, i.to_bytes(4, "little")) for j, (i, _) in enumerate(keep))
        holder = _MemoHolder(objects, b"\x80\x02" + data + b"N.")
        holder.load()
        u.memo = {}  # the old memo freed first (a dict sets an empty one), then the holder's copied
        u.memo = holder.memo
        self.trims += 1
        self.since_trim = self.slow = 0
        self.kept_memo = len(keep)


_ABSENT: Any = np.empty(0)
"""What :func:`_plain_numbers` returns for a column of events none of which holds that value."""


def _plain_numbers(values: list[Any], kind: type, limit: int, *, signed: bool = False) -> np.ndarray | None:
    """A batch's values of one field as float64, when every one is a plain number of ``kind`` (ints;
    ``float``: ints or floats) in ``[0, limit)`` (``signed``: ``(-limit, limit)``); :data:`_ABSENT`
    when none has one; None when anything else (:func:`_fields` then names it)."""
    types = set(map(type, values))
    if types == {_NONE}:
        return _ABSENT
    if not (types == {int} or (kind is float and types <= {int, float})):
        return None
    try:
        if types == {int} and not signed:
            out = np.array(values, dtype=np.uint64).astype(np.float64)  # a negative or too large: OverflowError
            return out if not len(out) or out.max() < limit else None
        out = np.array(values, dtype=np.float64)
    except OverflowError:
        return None
    return out if not len(out) or np.abs(out).max() < limit else None  # NaN compares False: None


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
        return _load(p, start_us, end_us, stream=True, trim=True)
    except _Untrimmed:
        pass  # it failed after the memo was trimmed: read it again with every memo entry kept
    except _Retry:
        # the pickle broke where the sink went in: a list's bytes inside a string or a number (a file
        # written without a memo); read it again as it is, the events counted once read
        return _load(p, start_us, end_us, stream=False, trim=False)
    try:
        return _load(p, start_us, end_us, stream=True, trim=False)
    except _Retry:
        return _load(p, start_us, end_us, stream=False, trim=False)


class _Retry(Exception):
    """The streamed load failed in the unpickler: read the file again without the sinks."""


class _Untrimmed(Exception):
    """The load failed after its memo was trimmed (:meth:`_Reader.trim`): read the file again untrimmed,
    so whatever is wrong with it is named as it is."""


def _load(p: Path, start_us: float | None, end_us: float | None, *, stream: bool,
          trim: bool) -> tuple[dict[str, Any], _Reader]:
    got = _Reader(p, start_us, end_us, trim=trim)
    inject = b"c" + got.token.encode() + b"\nSink\n)R"
    source = None
    try:
        with open(p, "rb") as fh:
            source = _Stream(fh, inject if stream else None, p)
            source.peek(1)  # the first block: the file's memo style
            got.by_id = source.memo not in (b"(", b"")
            unpickler = _Unpickler(source, got)
            if got.trimmed and got.by_id:
                got.unpickler = unpickler
            top = unpickler.load()
            del unpickler
        got.loaded()
        if not isinstance(top, dict) or not isinstance(top.get("segments"), list):
            raise _Bad("is a pickle but not a CUDA memory snapshot (no 'segments' list)")
        _check_layout(top, got)
        got.window()
    except PerfscopeError:
        raise
    except UnsafePickle as exc:
        raise InputFormatError(p, f"refused: the pickle asks for {exc}, not plain data; a memory snapshot holds "
                               "only dicts, lists, strings and numbers, and perfscope never runs code from a file",
                               hint="only import snapshots written by torch.cuda.memory._dump_snapshot()") from None
    except Exception as exc:  # noqa: BLE001 - the C unpickler raises UnpicklingError, EOFError, ValueError, KeyError, ...
        if got.trims and not isinstance(exc, MemoryError):
            raise _Untrimmed from None
        raise _refused(p, exc, sinks=stream and source is not None and source.pattern is not None
                       and source.injected > 0) from None
    return top, got


def _refused(p: Path, exc: Exception, *, sinks: bool) -> Exception:
    """The one line for a load that failed, or :class:`_Retry` (read it again without the sinks) when
    the unpickler failed on a file the sinks went into."""
    if isinstance(exc, _Bad):
        return InputFormatError(p, f"not a memory snapshot's layout: {exc}",
                                hint="give the file torch.cuda.memory._dump_snapshot() wrote")
    if isinstance(exc, RecursionError):
        return InputFormatError(p, "nested too deeply to be a memory snapshot",
                                hint="give the file torch.cuda.memory._dump_snapshot() wrote")
    if isinstance(exc, MemoryError):
        return InputFormatError(p, "needs more memory than this machine has to read",
                                hint="import it with PERFSCOPE_MAX_MEMORY set, on a larger machine")
    if sinks:
        return _Retry()
    return InputFormatError(p, f"damaged or not a pickle ({type(exc).__name__}: {str(exc)[:200]})",
                            hint="re-dump it with torch.cuda.memory._dump_snapshot()")


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
        if windowed:
            allocated = got.allocated[k]
        else:
            allocated = np.frombuffer(cols[3], dtype="float64")[np.frombuffer(cols[1], dtype="int8") == ALLOC]
        got.cols[k] = []  # _device_table takes them (and lets go of them once its table holds its own)
        tables.append(_device_table(dev_index, cols, got.readings, segs, warnings,
                                    [*got.pre_live[k], *got.after[k]], allocated, windowed=windowed,
                                    by_order=lacks_time))
        del cols, allocated
    if not got.cols and segments:  # no history recorded: the segments' live blocks at the dump
        for dev_index in sorted({_int(s.get("device"), 0) for s in segments}):
            segs = [s for s in segments if _int(s.get("device"), 0) == dev_index]
            tables.append(_device_table(dev_index, _columns(), got.readings, segs, warnings, [],
                                        np.empty(0), windowed=False, by_order=True))
        clock = "events"
        warnings.append("the snapshot has no allocation history (record_memory_history was off): "
                        "the memory table holds the blocks live at the dump")
    memory = (tables[0] if len(tables) == 1 else pd.concat(tables, ignore_index=True)) if tables else pd.DataFrame()
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


def _device_table(dev_index: int, cols: list[Any], readings: list[tuple[Any, ...]], segs: list[dict[str, Any]],
                  warnings: list[str], pre_live: list[tuple[Any, ...]], allocated: np.ndarray, *, windowed: bool,
                  by_order: bool) -> pd.DataFrame:
    n = len(cols[1])
    if by_order:  # no clock: the order of the events is the clock
        t_ns = np.arange(n, dtype="int64")
    else:
        t_ns = np.rint(np.frombuffer(cols[0], dtype="float64") * 1000.0).astype("int64")
    action = np.frombuffer(cols[1], dtype="int8")
    size = np.frombuffer(cols[2], dtype="float64")
    addr = np.frombuffer(cols[3], dtype="float64")
    stream = np.frombuffer(cols[4], dtype="float64")
    code = np.frombuffer(cols[5], dtype="int32")
    cols[:] = []  # the views above hold them now, and timeline() lets go of those
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
            if b.get("state") == "active_allocated":
                op, src, hint, stack = _reading(b)
                live_blocks.append((_num(b.get("address")), _num(b.get("size")), op, None, src,
                                    "cuda_graph_pool" if graph_pool else hint, stack, _num(b.get("requested_size"))))
    made = np.isin(np.array([b[0] for b in live_blocks], dtype="float64"), allocated)  # allocated in the history
    live_blocks = [b for b, m in zip(live_blocks, made.tolist()) if not m]
    seg_net = float(np.sum(np.where(action == SEGMENT_ALLOC, size, 0.0)) - np.sum(np.where(action == SEGMENT_FREE, size, 0.0)))
    ev = MemEvents(device=f"cuda:{dev_index}", t_ns=t_ns, action=action, size=size, addr=addr, stream=stream,
                   texts=[(op, None, src, hint, stack) for op, src, hint, stack in readings], text_code=code,
                   preexisting=[*pre_live, *live_blocks], reserved_start=reserved_end - seg_net,
                   segments_end=None if windowed else segments)
    del t_ns, action, size, addr, stream, code
    df = timeline(ev, "snapshot")
    live_end = set(df.loc[(df["action"] == "alloc") & df["free_t_ns"].isna(), "addr"].tolist())
    dumped = {_num(b.get("address")) for sg in segs for b in sg.get("blocks") or []
              if isinstance(b, dict) and b.get("state") == "active_allocated"}
    if not windowed and live_end != dumped:
        warnings.append(f"cuda:{dev_index}: {len(live_end ^ dumped)} block(s) live at the end of the replay and "
                        "live at the dump differ: the record lost events")
    return df
