"""CUDA memory snapshot (``torch.cuda.memory._dump_snapshot()`` pickle) -> the ``memory`` table.

A snapshot is a pickle, and a pickle can run code when it is loaded. :class:`SnapshotUnpickler`
is :class:`pickle._Unpickler` (the pure-Python one) with ``find_class`` refusing every global
and every opcode that could call one removed: it builds only dicts, lists, tuples, strings,
bytes, numbers, booleans and None, and anything else fails with one line naming what the
pickle asked for. Nothing in the file is ever called.

It also streams: each trace event (a dict with ``action`` appended to a device's trace list) is
handed to a callback as soon as it is complete and is not kept, and each traceback (``frames``,
a list of frame dicts) is reduced at once to (op, source line, category hint); so memory grows
with the distinct frames and the kept events (a time window keeps only its own), not with the
file.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pandas as pd

from perfscope.errors import InputFormatError
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
    from collections.abc import Callable

    from perfscope.device import DeviceSpec

ACTION_CODES = {"alloc": ALLOC, "free_requested": FREE, "free": FREE, "free_completed": FREE_COMPLETED,
                "segment_alloc": SEGMENT_ALLOC, "segment_free": SEGMENT_FREE, "segment_map": SEGMENT_ALLOC,
                "segment_unmap": SEGMENT_FREE, "oom": OOM}
"""Snapshot trace actions -> :mod:`..memory` codes (``snapshot`` markers and unknown actions are skipped)."""

_SAFE_OPS = {
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_SET", "ADDITEMS", "FROZENSET", "DICT", "LIST",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
    "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE",
    "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "SETITEM", "SETITEMS", "APPEND", "APPENDS",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
    "GLOBAL", "STACK_GLOBAL",  # kept only to name what was asked for: find_class refuses them all
}
"""Opcodes the unpickler runs. Every other one (REDUCE, BUILD, INST, OBJ, NEWOBJ, PERSID, EXT*,
BYTEARRAY8, NEXT_BUFFER, ...) is refused as it is read."""

_OPCODE_NAME = {op.code.encode("latin-1")[0]: op.name for op in __import__("pickletools").opcodes}


class UnsafePickle(Exception):
    """The pickle asked for something other than plain data."""


class _Dispatch(dict):  # type: ignore[type-arg]
    def __missing__(self, key: int) -> Any:
        raise UnsafePickle(f"opcode {_OPCODE_NAME.get(key, hex(key))}")


class _Dropped:
    """A memo slot whose object was handed on (an event) and is no longer kept."""


DROPPED = _Dropped()


class _Memo(dict):  # type: ignore[type-arg]
    """The unpickler's memo, remembering where each list and dict went so that a reduced
    traceback or a handed-on event replaces its slot (and is freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.slot_of: dict[int, int] = {}

    def __setitem__(self, key: int, value: Any) -> None:
        if value.__class__ is list or value.__class__ is dict:
            self.slot_of[id(value)] = key
        super().__setitem__(key, value)

    def replace(self, obj: Any, new: Any) -> None:
        key = self.slot_of.pop(id(obj), None)
        if key is not None:
            super().__setitem__(key, new)

    def __getitem__(self, key: int) -> Any:
        value = super().__getitem__(key)
        if value is DROPPED:
            raise UnsafePickle("a reference to a trace event already read (not a memory snapshot's layout)")
        return value


class SnapshotUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """Builds plain data only (see the module's docstring); ``on_event(trace_list, event)`` gets
    each trace event."""

    dispatch = _Dispatch({k: v for k, v in pickle._Unpickler.dispatch.items()  # type: ignore[attr-defined]
                          if _OPCODE_NAME.get(k) in _SAFE_OPS})

    def __init__(self, file: BinaryIO, on_event: Callable[[list[Any], dict[str, Any]], None]) -> None:
        super().__init__(file)
        self.memo = _Memo()
        self.on_event = on_event
        self.summaries: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.frame_cache: dict[int, tuple[Any, ...]] = {}

    def load(self) -> Any:
        """The pickle's object. Frames (protocol 4) are only length hints over contiguous data,
        so opcodes are read straight from the buffered file (pickle's own unframer costs a
        Python call per read)."""
        self.metastack: list[Any] = []
        self.stack: list[Any] = []
        self.append = self.stack.append
        self.proto = 0
        self.read = self._file_read  # type: ignore[attr-defined]  # pickle._Unpickler's own
        self.readline = self._file_readline  # type: ignore[attr-defined]
        read, dispatch = self.read, self.dispatch
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError
                dispatch[key[0]](self)
        except pickle._Stop as stop:  # type: ignore[attr-defined]
            return stop.value

    def load_frame(self) -> None:
        self.read(8)

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickle(f"{module}.{name}")

    def _reduce(self, value: Any) -> Any:
        if value.__class__ is list:
            s = frames_summary(value, self.frame_cache)
            s = self.summaries.setdefault(s, s)
            self.memo.replace(value, s)
            return s
        return value

    def _take(self, target: list[Any], items: list[Any]) -> None:
        for x in items:
            if x.__class__ is dict and "action" in x:
                self.on_event(target, x)
                self.memo.replace(x, DROPPED)
            else:
                target.append(x)

    def load_append(self) -> None:
        value = self.stack.pop()
        self._take(self.stack[-1], [value])

    def load_appends(self) -> None:
        items = self.pop_mark()  # type: ignore[attr-defined]  # pickle._Unpickler's own
        self._take(self.stack[-1], items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self.stack[-1][key] = self._reduce(value) if key == "frames" else value

    def load_setitems(self) -> None:
        items = self.pop_mark()  # type: ignore[attr-defined]  # pickle._Unpickler's own
        d = self.stack[-1]
        for i in range(0, len(items), 2):
            key, value = items[i], items[i + 1]
            d[key] = self._reduce(value) if key == "frames" else value


for _name, _fn in (("FRAME", SnapshotUnpickler.load_frame), ("APPEND", SnapshotUnpickler.load_append), ("APPENDS", SnapshotUnpickler.load_appends),
                   ("SETITEM", SnapshotUnpickler.load_setitem), ("SETITEMS", SnapshotUnpickler.load_setitems)):
    SnapshotUnpickler.dispatch[getattr(pickle, _name)[0]] = _fn


def looks_like_pickle(head: bytes) -> bool:
    """A pickle of protocol 2 or later (``\\x80`` then the protocol byte)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


class _Collector:
    """Trace events reduced to columns as they arrive; those outside ``[start_us, end_us]`` are
    not kept, only their net effect on the allocated and reserved bytes before the window."""

    def __init__(self, start_us: float | None, end_us: float | None) -> None:
        self.start_us, self.end_us = start_us, end_us
        self.lists: dict[int, int] = {}  # id(trace list) -> ordinal
        self.keep: list[list[list[Any]]] = []
        self.pre_live: list[dict[Any, tuple[Any, ...]]] = []  # per trace: blocks live when the window starts
        self.allocated: list[set[Any]] = []  # per trace: addresses the history allocates
        self.live: list[set[Any]] = []  # per trace: addresses live so far in the history
        self.after: list[list[tuple[Any, ...]]] = []  # per trace: blocks from before the history freed after the window
        self.seen = 0
        self.kept = 0

    def __call__(self, target: list[Any], e: dict[str, Any]) -> None:
        self.seen += 1
        k = self.lists.get(id(target))
        if k is None:
            k = self.lists[id(target)] = len(self.keep)
            self.keep.append([[] for _ in range(8)])
            self.pre_live.append({})
            self.allocated.append(set())
            self.live.append(set())
            self.after.append([])
            self._targets = getattr(self, "_targets", []) + [target]
        code = ACTION_CODES.get(e.get("action"))  # type: ignore[arg-type]
        if code is None:
            return
        t = e.get("time_us")
        size = e.get("size")
        size = float(size) if isinstance(size, (int, float)) else np.nan
        frames = e.get("frames")
        op, src, hint = frames if isinstance(frames, tuple) else (None, None, None)
        addr = e.get("addr")
        unseen_free = False
        if code == ALLOC:
            self.allocated[k].add(addr)
            self.live[k].add(addr)
        elif code == FREE or code == FREE_COMPLETED:
            unseen_free = code == FREE and addr not in self.live[k] and addr not in self.allocated[k]
            self.live[k].discard(addr)
        if self.start_us is not None and isinstance(t, (int, float)) and t < self.start_us:
            if code == ALLOC:  # before the window: only what is live when it starts is kept
                self.pre_live[k][addr] = (_num(addr), size, op, None, src, hint)
            elif code in (FREE, FREE_COMPLETED):
                self.pre_live[k].pop(addr, None)
            return
        if self.end_us is not None and isinstance(t, (int, float)) and t > self.end_us:
            if unseen_free:  # allocated before the history, so live through the window
                self.after[k].append((_num(addr), size, op, None, src, hint))
            return
        cols = self.keep[k]
        for c, v in zip(cols, (t, code, size, e.get("addr"), e.get("stream"), op, src, hint)):
            c.append(v)
        self.kept += 1


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan


def load_snapshot(path: str | Path, *, start_us: float | None = None,
                  end_us: float | None = None) -> tuple[dict[str, Any], _Collector]:
    """The snapshot's top-level dict (its trace lists emptied, tracebacks reduced) and the kept
    events.

    Raises:
        InputFormatError: not a pickle, a pickle of something other than plain data (one line
            naming what it asked for), or not a memory snapshot.
    """
    p = Path(path)
    got = _Collector(start_us, end_us)
    try:
        with open(p, "rb") as fh:
            top = SnapshotUnpickler(io.BufferedReader(fh, 1 << 20), got).load()
    except UnsafePickle as exc:
        raise InputFormatError(p, f"refused: the pickle asks for {exc}, not plain data; a memory snapshot holds "
                               "only dicts, lists, strings and numbers, and perfscope never runs code from a file",
                               hint="only import snapshots written by torch.cuda.memory._dump_snapshot()") from None
    except (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError, TypeError,
            AttributeError, MemoryError) as exc:
        raise InputFormatError(p, f"damaged or not a pickle ({type(exc).__name__}: {exc})",
                               hint="re-dump it with torch.cuda.memory._dump_snapshot()") from None
    if not isinstance(top, dict) or not isinstance(top.get("segments"), list):
        raise InputFormatError(p, "is a pickle but not a CUDA memory snapshot (no 'segments' list)",
                               hint="give the file torch.cuda.memory._dump_snapshot() wrote")
    return top, got


def import_snapshot(path: str | Path, *, device: DeviceSpec | None = None, start_us: float | None = None,
                    end_us: float | None = None) -> Imported:
    """A snapshot as an :class:`Imported` with a ``memory`` table (one device per trace list)."""
    p = Path(path)
    top, got = load_snapshot(p, start_us=start_us, end_us=end_us)
    found = top.get("device_traces")
    traces: list[Any] = found if isinstance(found, list) else []
    # which device each kept trace list is: its position in device_traces
    position = {id(x): i for i, x in enumerate(traces)}
    targets = getattr(got, "_targets", [])
    segments = [s for s in top["segments"] if isinstance(s, dict)]
    tables = []
    warnings: list[str] = []
    base_us = 0.0  # snapshot times are epoch microseconds, kept as they are
    for k, cols in enumerate(got.keep):
        dev_index = position.get(id(targets[k]), k) if k < len(targets) else k
        segs = [s for s in segments if s.get("device", dev_index) == dev_index]
        tables.append(_device_table(dev_index, cols, segs, base_us, warnings, [*got.pre_live[k].values(), *got.after[k]], got.allocated[k],
                                    windowed=start_us is not None or end_us is not None))
    if not got.keep and segments:  # no history recorded: the segments' live blocks at the dump
        for dev_index in sorted({s.get("device", 0) for s in segments}):
            segs = [s for s in segments if s.get("device", 0) == dev_index]
            tables.append(_device_table(dev_index, [[] for _ in range(8)], segs, base_us, warnings, [], set(),
                                        windowed=False))
        warnings.append("the snapshot has no allocation history (record_memory_history was off): "
                        "the memory table holds the blocks live at the dump")
    memory = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    manifest: dict[str, Any] = {
        "name": p.name.split(".")[0],
        "source": source_info("memory-snapshot", p, "torch.cuda.memory._dump_snapshot", None),
        "warnings": warnings,
        "params": {"snapshot_events": got.seen, "snapshot_events_kept": got.kept,
                   "snapshot_segments": len(segments),
                   "memory_window_us": [start_us, end_us] if start_us is not None or end_us is not None else None},
        "unavailable_metrics": ["flops", "dram_bytes"],
    }
    return Imported({"memory": memory}, manifest, device, origin=str(p))


def read_snapshot(path: Path, *, device: DeviceSpec | None = None) -> Report:
    """Read a CUDA memory snapshot pickle into a Report (its ``memory`` table)."""
    return finish(import_snapshot(path, device=device))


read = read_snapshot


def _device_table(dev_index: int, cols: list[list[Any]], segs: list[dict[str, Any]], base_us: float,
                  warnings: list[str], pre_live: list[tuple[Any, ...]], allocated: set[Any], *,
                  windowed: bool) -> pd.DataFrame:
    t_us = np.array([_num(x) for x in cols[0]], dtype="float64")
    t_ns = np.rint(t_us * 1000.0).astype("int64") if len(t_us) else np.zeros(0, dtype="int64")
    action = np.array(cols[1], dtype="int8")
    size = np.array(cols[2], dtype="float64")
    addr = np.array([_num(x) for x in cols[3]], dtype="float64")
    stream = np.array([_num(x) for x in cols[4]], dtype="float64")
    # the blocks live at the dump, and the segments' bytes
    live_blocks = []
    reserved_end = 0.0
    for s in segs:
        reserved_end += _num(s.get("total_size")) if s.get("total_size") is not None else 0.0
        pool = s.get("segment_pool_id")
        graph_pool = isinstance(pool, tuple) and any(isinstance(x, int) and x != 0 for x in pool)
        for b in s.get("blocks") or []:
            if isinstance(b, dict) and b.get("state") == "active_allocated" and b.get("address") not in allocated:
                op, src, hint = b["frames"] if isinstance(b.get("frames"), tuple) else (None, None, None)
                live_blocks.append((_num(b.get("address")), _num(b.get("size")), op, None, src,
                                    "cuda_graph_pool" if graph_pool else hint))
    seg_net = float(np.sum(np.where(action == SEGMENT_ALLOC, size, 0.0)) - np.sum(np.where(action == SEGMENT_FREE, size, 0.0)))
    ev = MemEvents(device=f"cuda:{dev_index}", t_ns=t_ns, action=action, size=size, addr=addr, stream=stream,
                   op=np.array(cols[5] + [None], dtype=object)[:-1], source=np.array(cols[6] + [None], dtype=object)[:-1],
                   hint=np.array(cols[7] + [None], dtype=object)[:-1], preexisting=[*pre_live, *live_blocks],
                   reserved_start=reserved_end - seg_net)
    df = timeline(ev, "snapshot")
    live_end = set(df.loc[(df["action"] == "alloc") & df["free_t_ns"].isna(), "addr"].tolist())
    dumped = {_num(b.get("address")) for sg in segs for b in sg.get("blocks") or []
              if isinstance(b, dict) and b.get("state") == "active_allocated"}
    if not windowed and live_end != dumped:
        warnings.append(f"cuda:{dev_index}: {len(live_end ^ dumped)} block(s) live at the end of the replay and "
                        "live at the dump differ: the record lost events")
    return df
