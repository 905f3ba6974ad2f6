"""Streaming parse of a PyTorch/Kineto chrome trace into compact per-kind columns.

:mod:`.events` hands over the ``traceEvents`` array block by block (about a MB of text at
a time); each block is decoded at once by msgspec into small structs that keep only the
fields the report needs (everything else in the JSON is skipped without being built), and
reduced to numpy columns and int32 string codes. So the whole JSON object tree never sits in
memory, and the per-event Python work is a handful of C-level maps over the events.

The fast decoder (:class:`_Decoder`) reads a block as a union tagged by ``ph``: flow, counter
and metadata events become empty structs, complete events get float ``ts``/``dur`` and keep
their ``args`` as raw text, decoded per kind once the events are routed (each kind's args at
once, into its own small struct). A block it refuses (an unknown phase, an event without
``ph``, a string ``ts``) goes, with the rest of the file, to the plain decoder (:class:`Event`:
every field as it is). Events that reach us as plain JSON values (the slow path over damaged or
unusual text, or the ijson path) are converted to :class:`Event`. The three give the same rows
(``tests/unit/test_kineto_fastpath.py``).

Both the current categories (``cpu_op``, ``kernel``, ``cuda_runtime``, ...) and the 2021
capitalised ones (``Operator``, ``Kernel``, ``Runtime``, ...) are understood. A trace cut
short (truncated or damaged file) keeps the events read so far and is marked partial.
"""

from __future__ import annotations

import gc
import re
from array import array
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Union

import msgspec
import numpy as np
import orjson

from perfscope.errors import InputFormatError

from .events import HEAD_KEEP, TAIL_KEEP, _meta_from_head, _meta_from_tail, _open, read_events

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["CPU_KINDS", "FIELDS", "HEAD_KEEP", "KIND_OF_CAT", "TAIL_KEEP", "ParsedTrace", "_meta_from_head",
           "_meta_from_tail", "_open", "kind_of", "parse_trace"]

KIND_OF_CAT = {
    "cpu_op": "op", "operator": "op",
    "user_annotation": "ann",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
    "cuda_runtime": "api", "runtime": "api",
    "cuda_driver": "api",
    "python_function": "py",
    "cpu_instant_event": "mem",
    "cuda_profiler_range": "prof",
}
"""Lower-cased ``cat`` -> the kind of row it feeds."""

CPU_KINDS = ("ann", "op", "api")
"""Kinds kept together in :attr:`ParsedTrace.cpu`; its ``kind`` column indexes this."""

STRING_FIELDS = ("name", "thread", "grid", "block", "kernel", "pg")
"""Fields holding codes into :attr:`ParsedTrace.strings` (-1: none)."""

TS_LIMIT = 9.0e15
"""|ts| and |dur| bound in microseconds: beyond it nanoseconds overflow int64."""

ID_LIMIT = float(2**53)
"""Ids (correlation, External id, stream, ...) beyond this are not exact in float64."""

FIELDS = {
    "op": ("name", "thread", "tid", "ts", "dur", "ext", "sig"),
    "ann": ("name", "thread", "tid", "ts", "dur"),
    "kernel": ("name", "device", "stream", "ts", "dur", "corr", "ext", "grid", "block",
               "regs", "smem", "occupancy", "pg"),
    "memcpy": ("name", "device", "stream", "ts", "dur", "corr", "bytes"),
    "memset": ("name", "device", "stream", "ts", "dur", "corr", "bytes"),
    "api": ("name", "thread", "tid", "ts", "dur", "corr", "ext", "driver", "kernel"),
    "py": ("name", "thread", "tid", "ts", "dur", "pyid", "pyparent"),
    "mem": ("tid", "ts", "mbytes", "total_alloc", "total_res", "addr", "dev_id", "dev_type"),
    "prof": ("name", "ts", "dur"),
}
"""Columns kept per kind: ``ts``/``dur`` in microseconds (float64), ids and sizes as float64
(NaN when absent or not an exact integer), names, thread keys (``pid:tid``), grid and block as
int32 codes into :attr:`ParsedTrace.strings`, ``kernel`` the kernel a launch call names in its
``args`` (ROCm traces; a CUDA-graph capture trace's only record of the kernels it captured),
``sig`` an index into :attr:`ParsedTrace.sigs` (-1 when the op recorded no inputs), ``pg`` the
process group a collective kernel names (``Process Group Name``, PyTorch 2.x NCCL kernels). ``py`` holds
the ``python_function`` events of traces recorded ``with_stack`` (``pyid``/``pyparent``: their
``Python id`` / ``Python parent id`` links), kept apart from the CPU nesting; the reader makes
module ranges of them. ``prof`` holds the ``cuda_profiler_range`` events of a trace whose profiler
collected hardware counters with CUPTI's range profiler (torch.profiler's ``experimental_config``
``profiler_metrics``): one per kernel launch, named by its kernel, each kernel replayed to count them;
their ``ts``/``dur`` are the profiler's, not the kernel's."""


_NO_RAW = msgspec.Raw()
"""An absent raw field: one shared empty value (a ``default_factory`` would call Python for every
field of every event: it was half the decode's time)."""


class Args(msgspec.Struct, gc=False):
    """The ``args`` fields any row reads (others are skipped while decoding)."""

    ext: Any = msgspec.field(default=None, name="External id")
    ext_lower: Any = msgspec.field(default=None, name="external id")
    corr: Any = msgspec.field(default=None, name="correlation")
    # kept as the raw JSON text: an op's inputs are read once per distinct signature, not per op
    dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    device: Any = None
    from_device: Any = msgspec.field(default=None, name="fromDevice")
    stream: Any = None
    grid: msgspec.Raw = msgspec.field(default=_NO_RAW)  # raw too: a few distinct launch shapes
    block: msgspec.Raw = msgspec.field(default=_NO_RAW)
    regs: Any = msgspec.field(default=None, name="registers per thread")
    smem: Any = msgspec.field(default=None, name="shared memory")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    nbytes: Any = msgspec.field(default=None, name="bytes")
    kernel: Any = None
    pg: Any = msgspec.field(default=None, name="Process Group Name")
    pyid: Any = msgspec.field(default=None, name="Python id")
    pyparent: Any = msgspec.field(default=None, name="Python parent id")
    mbytes: Any = msgspec.field(default=None, name="Bytes")
    total_alloc: Any = msgspec.field(default=None, name="Total Allocated")
    total_res: Any = msgspec.field(default=None, name="Total Reserved")
    addr: Any = msgspec.field(default=None, name="Addr")
    dev_id: Any = msgspec.field(default=None, name="Device Id")
    dev_type: Any = msgspec.field(default=None, name="Device Type")


class Event(msgspec.Struct, gc=False):
    """One trace event, reduced to the fields any row reads."""

    ph: Any = "X"
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Args | None = None


NO_ARGS = Args()
_ARG_KEYS = [(f.name, f.encode_name) for f in msgspec.structs.fields(Args)]
_DECODER = msgspec.json.Decoder(list[Event])


_ABSENT = msgspec.Raw(b"{}")
"""Absent ``args`` in the fast decoder's events: one shared empty object (so a kind's args join into
one array that decodes without a None; told from an explicit ``{}`` by identity where it matters)."""


class _Instants:
    """The ``cat`` of every instant event of the fast decoder (its own is ``icat``)."""

    def __repr__(self) -> str:
        return "INSTANT"


INSTANT = _Instants()


class Complete(msgspec.Struct, tag="X", tag_field="ph", gc=False):
    """A complete event (``"ph": "X"``) as the fast decoder builds it: ``ts``/``dur`` decoded
    straight to float (numpy takes a list of floats at once; big integers cost it a conversion
    each), ``args`` kept as raw JSON text until the event's kind is known (:func:`_kind_args`: a
    struct of every field any kind reads, built and freed for every event, was a third of the
    decode). Read like an :class:`Event` once its args are decoded."""

    ph: ClassVar[str] = "X"
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float | None = None
    args: msgspec.Raw = _ABSENT


class _Instant(msgspec.Struct, tag_field="ph", gc=False):
    """An instant event (memory events are read from them), as the fast decoder builds it. Its
    ``cat`` is read into ``icat``: ``cat`` says "an instant" to the routing (:func:`route_block`)."""

    dur: ClassVar[Any] = None
    cat: ClassVar[Any] = INSTANT
    icat: Any = msgspec.field(default=None, name="cat")
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    args: msgspec.Raw = _ABSENT


class InstantLower(_Instant, tag="i"):
    ph: ClassVar[str] = "i"


class InstantUpper(_Instant, tag="I"):
    ph: ClassVar[str] = "I"


def _skipped(ph: str) -> type:
    """An event no row reads (flow, counter, metadata, ...): nothing of it is built but its class."""
    return msgspec.defstruct(f"Skipped_{ord(ph)}", [], tag=ph, tag_field="ph", gc=False,
                             namespace={"ph": ph, "cat": None})


_SKIPPED = tuple(_skipped(ph) for ph in "BEbnestfPNODMVvRCc()")
"""Every other phase of the Trace Event Format: no row reads them."""
_FAST_TYPES = (Complete, InstantLower, InstantUpper, *_SKIPPED)
_FAST = msgspec.json.Decoder(list[Union[_FAST_TYPES]])  # type: ignore[valid-type]  # noqa: UP007
_DECODED = frozenset((Event, *_FAST_TYPES))
"""The classes a decoded block holds (the slow paths' plain values become :class:`Event`)."""
FAST = True
"""Whether blocks go to :data:`_FAST` first (tests turn it off to compare the two decoders)."""


class _Decoder:
    """Decodes a block with :data:`_FAST` (a union tagged by ``ph``, ``ts``/``dur`` typed float), else
    with :data:`_DECODER` (every field as it is): the first block the fast one refuses (a phase outside
    the format, an event without ``ph``, a string ``ts``, a repeated key) sends the rest of the file
    to the plain one, so an odd trace pays for at most one refused block. Both give the same rows."""

    def __init__(self) -> None:
        self.fast = FAST

    def __call__(self, text: bytes) -> list[Any] | None:
        if self.fast:
            try:
                return _FAST.decode(text)
            except (msgspec.MsgspecError, RecursionError):
                self.fast = False
        return decode_block(text)


KIND_ARGS = {
    "op": ("ext", "ext_lower", "dims", "types", "concrete"),
    "api": ("ext", "ext_lower", "corr", "kernel"),
    "kernel": ("ext", "ext_lower", "corr", "device", "stream", "grid", "block", "regs", "smem", "occupancy", "pg"),
    "memcpy": ("device", "from_device", "stream", "corr", "nbytes"),
    "memset": ("device", "from_device", "stream", "corr", "nbytes"),
    "py": ("pyid", "pyparent"),
    "mem": ("mbytes", "total_alloc", "total_res", "addr", "dev_id", "dev_type"),
}
"""The :class:`Args` fields each kind's rows read (``ann`` reads none)."""


def _args_struct(kind: str) -> type:
    spec = {f.name: f for f in msgspec.structs.fields(Args)}
    return msgspec.defstruct(f"Args_{kind}", [(n, spec[n].type, msgspec.field(default=spec[n].default, name=spec[n].encode_name))
                                              for n in KIND_ARGS[kind]], gc=False)


_ARGS_TYPES = {kind: _args_struct(kind) for kind in KIND_ARGS}
_ARGS_DECODERS = {kind: msgspec.json.Decoder(list[t]) for kind, t in _ARGS_TYPES.items()}  # type: ignore[valid-type]
_ONE_ARGS = {kind: msgspec.json.Decoder(t | None) for kind, t in _ARGS_TYPES.items()}  # type: ignore[operator]


_NO_KIND_ARGS = {kind: t() for kind, t in _ARGS_TYPES.items()}


def _kind_args(kind: str, evs: list[Any]) -> list[Any]:
    """The args of ``evs`` (all of ``kind``, not ``mem``), all defaults where an event has none: the
    plain decoder's :class:`Args` (:data:`NO_ARGS`), or the fast decoder's raw text decoded here, the
    whole group at once, into the kind's own small struct. A group holding args that are no object
    (``null``, a number) is decoded one by one: those are all defaults, as on the slow path."""
    if not evs or evs[0].__class__ is Event:
        return [e.args or NO_ARGS for e in evs]
    raws = _col(evs, "args")
    try:
        return _ARGS_DECODERS[kind].decode(b"[" + b",".join(raws) + b"]")
    except (msgspec.MsgspecError, RecursionError):
        return [_one_args(kind, raw) or _NO_KIND_ARGS[kind] for raw in raws]


def _one_args(kind: str, raw: msgspec.Raw) -> Any:
    try:
        return _ONE_ARGS[kind].decode(raw)
    except (msgspec.MsgspecError, RecursionError):  # no object: none
        return None


def decode_block(text: bytes) -> list[Event] | None:
    """The events of the JSON array ``text``, or None when msgspec cannot decode it."""
    try:
        return _DECODER.decode(text)
    except (msgspec.MsgspecError, RecursionError):
        return None


_RAW_ARGS = frozenset(("dims", "types", "concrete", "grid", "block"))
"""The ``Args`` fields msgspec keeps as raw JSON text (:class:`msgspec.Raw`)."""


def _as_raw(value: Any) -> msgspec.Raw:
    """A plain JSON value (the slow path's) as raw JSON text, like msgspec's own for these fields."""
    if value is None:
        return msgspec.Raw()
    try:
        return msgspec.Raw(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return msgspec.Raw(orjson.dumps(repr(value)))


def as_events(items: list[Any]) -> list[Event]:
    """Events from plain JSON values (dicts become events; anything else is skipped)."""
    out = []
    for x in items:
        if x.__class__ is Event:
            out.append(x)
        elif isinstance(x, dict):
            a = x.get("args")
            fields: dict[str, Any] = {k: _as_raw(a.get(key)) if k in _RAW_ARGS else a.get(key)
                                      for k, key in _ARG_KEYS} if isinstance(a, dict) else {}
            args = Args(**fields) if isinstance(a, dict) else None
            out.append(Event(ph=x.get("ph", "X"), cat=x.get("cat"), name=x.get("name"), pid=x.get("pid"),
                             tid=x.get("tid"), ts=x.get("ts"), dur=x.get("dur"), args=args))
    return out


@dataclass
class ParsedTrace:
    """Columns per kind (arrays of equal length), the top-level metadata and parse notes.

    Attributes:
        cols: GPU kind (kernel, memcpy, memset) and ``py`` -> column -> numpy array (see :data:`FIELDS`).
        meta: the trace's top-level keys other than ``traceEvents``.
        sigs: distinct ``(Input Dims, Input type, Concrete Inputs)`` of the ops.
        strings: the text of every string code (``name``, ``thread``, ``grid``, ``block``).
        cpu: the CPU kinds' events (annotations, ops, calls) in one set of columns, the union
            of their :data:`FIELDS` (missing values where a kind has no such field), in the
            order read, with a ``kind`` column (index in :data:`CPU_KINDS`).
        n_events: events read (of every kind).
        warnings: what was skipped or damaged.
        partial: the file ended or broke before the events array did.
    """

    cols: dict[str, dict[str, np.ndarray]]
    meta: dict[str, Any]
    sigs: list[tuple[Any, Any, Any]] = field(default_factory=list)
    strings: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    cpu: dict[str, np.ndarray] = field(default_factory=dict)
    n_events: int = 0
    warnings: list[str] = field(default_factory=list)
    partial: bool = False

    def count(self, kind: str) -> int:
        if kind in CPU_KINDS:
            return int(np.count_nonzero(self.cpu["kind"] == CPU_KINDS.index(kind))) if self.cpu else 0
        return len(self.cols[kind]["ts"]) if kind in self.cols else 0


# ---------------------------------------------------------------------------- values
def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _floats(values: list[Any]) -> np.ndarray:
    """float64 array of ``values``; anything that is not a number becomes NaN."""
    try:
        arr = np.array(values, dtype="float64")
        if arr.ndim == 1:
            return arr
    except (TypeError, ValueError, OverflowError):
        pass
    out = [_num(v) for v in values]
    return np.array([np.nan if v is None else v for v in out], dtype="float64")


def _text(v: Any) -> str:
    """``str(v)``, or a placeholder for values that cannot print (huge ints, deep nesting)."""
    if v.__class__ is str:
        return v
    try:
        return str(v)
    except (RecursionError, ValueError):
        return f"<{type(v).__name__}>"


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate (from a ``\\ud800`` escape; not storable as UTF-8)
    replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _floats_of(items: list[Any], name: str) -> np.ndarray:
    """:func:`_floats` of the attribute ``name`` of ``items``, read straight from them (no list in
    between: about 30% less time); through the list when a value is no plain number (numpy converts
    what both ways convert alike, None to NaN included)."""
    try:
        return np.fromiter(map(attrgetter(name), items), dtype=np.float64, count=len(items))
    except (TypeError, ValueError, OverflowError):
        return _floats(_col(items, name))


def _ids(values: list[Any]) -> np.ndarray:
    """Like :func:`_floats`, but only exact integers below 2**53 survive (others are NaN)."""
    return _exact(_floats(values))


def _ids_of(items: list[Any], name: str) -> np.ndarray:
    """:func:`_ids` of the attribute ``name`` of ``items`` (read as :func:`_floats_of` reads it)."""
    return _exact(_floats_of(items, name))


def _exact(arr: np.ndarray) -> np.ndarray:
    """``arr`` with every value that is no exact integer below 2**53 made NaN (in place)."""
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(arr) < ID_LIMIT) | (arr != np.round(arr))
    arr[bad] = np.nan
    return arr


_PID_TID = attrgetter("pid", "tid")
_NAME = attrgetter("name")


class _Interner:
    """Distinct strings (names, thread keys, grid and block text) and their int32 codes."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []
        self.thread_codes: dict[tuple[Any, Any], int] = {}
        self.dims_codes: dict[bytes, int] = {}

    def threads_of(self, evs: list[Any]) -> np.ndarray:
        """:meth:`threads` of the events ``evs``: the known keys straight from the events, their
        ``(pid, tid)`` made by one C call each."""
        try:
            return _codes(map(self.thread_codes.get, map(_PID_TID, evs)), len(evs))
        except TypeError:  # a key not seen yet (None is no code), or an unhashable pid or tid
            return self.threads(_col(evs, "pid"), _col(evs, "tid"))

    def names_of(self, evs: list[Any]) -> np.ndarray:
        """:meth:`names` of the ``name`` of ``evs`` (the known ones without a list in between)."""
        try:
            return _codes(map(self.codes.get, map(_NAME, evs)), len(evs))
        except TypeError:  # a value not seen yet (None is no code), or an unhashable one
            return self.names(_col(evs, "name"))

    def threads(self, pids: list[Any], tids: list[Any]) -> np.ndarray:
        """Codes of the ``pid:tid`` keys."""
        try:
            return _codes(map(self.thread_codes.get, zip(pids, tids)), len(pids))
        except TypeError:  # a key not seen yet (None is no code), or an unhashable pid or tid
            pass
        try:
            out = list(map(self.thread_codes.get, zip(pids, tids)))
        except TypeError:  # an unhashable pid or tid
            return self.names([f"{_text(p)}:{_text(t)}" for p, t in zip(pids, tids)])
        for i in _nones(out):
            out[i] = self._thread((pids[i], tids[i]))
        return np.array(out, dtype="int32")

    def _thread(self, key: tuple[Any, Any]) -> int:
        code = self.thread_codes.get(key)
        if code is None:
            code = self.thread_codes[key] = self._new(f"{_text(key[0])}:{_text(key[1])}")
        return code

    def names(self, values: list[Any]) -> np.ndarray:
        """Codes of ``values``: one C-level dict lookup each (only str are keys), the new ones added."""
        try:
            return _codes(map(self.codes.get, values), len(values))
        except TypeError:  # a value not seen yet (None is no code), or an unhashable one
            pass
        out = self._known(values)
        for i in _nones(out):
            out[i] = self._new(values[i])
        return np.array(out, dtype="int32")

    def _known(self, values: list[Any]) -> list[int | None]:
        """The codes of the strings seen before, None for the others."""
        get = self.codes.get
        try:
            return list(map(get, values))
        except TypeError:  # an unhashable value
            return [get(v) if v.__class__ is str else None for v in values]

    def _new(self, value: Any) -> int:
        text = _text(value)
        text = text if text.isascii() else clean_text(text)
        code = self.codes.get(text)
        if code is None:
            code = self.codes[text] = len(self.values)
            self.values.append(text)
        if value.__class__ is str:
            self.codes[value] = code
        return code

    def optional(self, values: list[Any]) -> np.ndarray:
        """Codes of ``values`` (-1 for None)."""
        if values.count(None) == len(values):  # the usual case (an identity test per item)
            return np.full(len(values), -1, dtype="int32")
        out = self._known(values)
        for i in _nones(out):
            out[i] = -1 if values[i] is None else self._new(values[i])
        return np.array(out, dtype="int32")

    def dims3(self, values: list[Any]) -> np.ndarray:
        """Codes of ``(x, y, z)`` texts of grid / block values (raw JSON, or lists on the slow path)."""
        memo = self.dims_codes
        keys = list(map(bytes, values))  # raw JSON on every path (:func:`as_events`)
        try:
            return _codes(map(memo.get, keys), len(keys))
        except TypeError:  # a value not seen yet
            out = list(map(memo.get, keys))
        for i in _nones(out):
            code = memo.get(keys[i])
            if code is None:
                value = _raw_value(keys[i])
                text = _dims3(value) if isinstance(value, list) and value else None
                code = memo[keys[i]] = -1 if text is None else self._new(text)
            out[i] = code
        return np.array(out, dtype="int32")


def _codes(codes: Iterable[Any], n: int) -> np.ndarray:
    """``n`` codes as int32; TypeError when one is None (not known yet)."""
    return np.fromiter(codes, dtype=np.int32, count=n)


def _nones(values: list[Any]) -> list[int]:
    """Indices of the None in ``values``."""
    return [i for i, v in enumerate(values) if v is None]


_RAW = msgspec.Raw


def _raw_value(v: Any) -> Any:
    """The value of a raw JSON field (None when absent, ``null`` or not JSON orjson reads)."""
    text = bytes(v)
    if not text or text == b"null":
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return msgspec.json.decode(text)  # NaN / Infinity, which msgspec accepted in the block


def _dims3(v: list[Any]) -> str | None:
    try:
        return "(" + ", ".join(str(int(x)) for x in v) + ")"
    except (TypeError, ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------------- routing

class _Columns:
    """Growing columns (``array.array``: amortised growth, no per-block chunks to join)."""

    def __init__(self) -> None:
        cpu_fields = sorted({f for k in CPU_KINDS for f in FIELDS[k]}) + ["kind"]
        self.cpu = {f: array(_TYPECODE[_dtype(f)]) for f in cpu_fields}
        self.gpu = {k: {f: array(_TYPECODE[_dtype(f)]) for f in FIELDS[k]} for k in ("kernel", "memcpy", "memset", "py", "mem", "prof")}
        self.strings = _Interner()
        self.sig_index: dict[Any, int] = {}
        self.sigs: list[tuple[Any, Any, Any]] = []
        self.skipped = 0
        self.negative = 0
        self.codes: dict[tuple[Any, Any], int] = {}  # (ph, cat) -> routing code
        self.cat_codes: dict[Any, int] = {}  # cat -> routing code, of the fast decoder's events

    def add(self, kind: str, **cols: np.ndarray) -> None:
        if kind not in CPU_KINDS:
            for name, values in cols.items():
                self.gpu[kind][name].frombytes(_raw(values, name))
            return
        n = len(cols["ts"])
        cols["kind"] = np.full(n, CPU_KINDS.index(kind), dtype="int8")
        for name, column in self.cpu.items():
            values = cols[name] if name in cols else _missing(name, n)
            column.frombytes(_raw(values, name))

    def finish(self, trace: ParsedTrace) -> None:
        """The columns as numpy arrays (views of the grown buffers), into ``trace``."""
        def view(arr: array, name: str) -> np.ndarray:
            return np.frombuffer(arr, dtype=_dtype(name)) if len(arr) else np.empty(0, dtype=_dtype(name))

        trace.cpu = {name: view(arr, name) for name, arr in self.cpu.items()}
        trace.cols = {k: {name: view(arr, name) for name, arr in cols.items()} for k, cols in self.gpu.items()}
        trace.strings = np.array(self.strings.values + [None], dtype=object)[:-1]
        trace.sigs = self.sigs


_TYPECODE = {"float64": "d", "int32": "i", "int8": "b", "bool": "b"}


def _raw(values: np.ndarray, name: str) -> memoryview:
    """The bytes of ``values`` as the column ``name`` stores them."""
    return np.ascontiguousarray(values, dtype=_dtype(name)).data.cast("B")


def _dtype(name: str) -> str:
    if name in STRING_FIELDS or name == "sig":
        return "int32"
    return "bool" if name == "driver" else "int8" if name == "kind" else "float64"


def _missing(name: str, n: int) -> np.ndarray:
    fill = -1 if _dtype(name) == "int32" else False if name == "driver" else np.nan
    return np.full(n, fill, dtype=_dtype(name))


def kind_of(cat: Any) -> str | None:
    """The row kind a ``cat`` feeds, or None."""
    return KIND_OF_CAT.get(cat.lower()) if isinstance(cat, str) else None


_PH_CAT = attrgetter("ph", "cat")
_CAT = attrgetter("cat")
_KINDS = (None, "op", "ann", "kernel", "memcpy", "memset", "api", "py", "mem", "prof", "op", None)
"""Kind of each routing code (0: skipped); then an op filed as ``Operator`` (2021 traces, which
file ranges as ``Operator`` too); last, an instant of the fast decoder, routed by its own cat."""
_OPERATOR = len(_KINDS) - 2
_INSTANT = len(_KINDS) - 1


def _code(ph: Any, cat: Any) -> int:
    """The routing code of an event's ``(ph, cat)``: rows are complete events ("X"); memory events
    are instants, filtered by their reader."""
    kind = kind_of(cat)
    if kind is None or not (ph == "X" or kind == "mem"):
        return 0
    return _OPERATOR if cat == "Operator" else _KINDS.index(kind)


def route_block(events: list[Any], cols: _Columns) -> None:
    """Reduce one block of events into ``cols`` (other categories are skipped).

    Each event's ``(ph, cat)`` becomes a routing code through one dict (a C-level ``map``, no Python
    frame per event); the events of each kind are then gathered by index, kinds in the order they
    first appear in the block (the rows' order)."""
    codes = _route_codes(events, cols)
    if codes is None:
        _route_unhashable(events, cols)
        return
    present, first = np.unique(codes, return_index=True)
    groups: dict[str, list[Any]] = {}
    operator = _OPERATOR in present
    for code in present[np.argsort(first, kind="stable")].tolist():
        kind = _KINDS[code]
        if kind is None or kind in groups:  # skipped; or ops, gathered with the Operator ones
            continue
        rows = (np.flatnonzero((codes == code) | (codes == _OPERATOR)) if kind == "op" and operator
                else np.flatnonzero(codes == code))
        groups[kind] = list(map(events.__getitem__, rows.tolist()))
    _route_groups(groups, cols, operator=operator)


def _route_codes(events: list[Any], cols: _Columns) -> np.ndarray | None:
    """Each event's routing code (:data:`_KINDS`), None when a ``ph`` or ``cat`` is unhashable.

    The plain decoder's events are keyed by ``(ph, cat)``; the fast decoder's by ``cat`` alone (its
    complete events are all "X", its skipped ones have no cat, and its instants say so, each then
    routed by its own ``(ph, icat)``)."""
    fast = bool(events) and events[0].__class__ is not Event
    codes_of, key = (cols.cat_codes, _CAT) if fast else (cols.codes, _PH_CAT)
    try:
        codes = np.fromiter(map(codes_of.get, map(key, events)), dtype=np.int8, count=len(events))
    except TypeError:  # a key not seen yet (None is no int8), or an unhashable ph or cat
        try:
            for k in set(map(key, events)) - codes_of.keys():
                codes_of[k] = (_INSTANT if k is INSTANT else _code("X", k)) if fast else _code(*k)
        except TypeError:
            return None
        codes = np.fromiter(map(codes_of.__getitem__, map(key, events)), dtype=np.int8, count=len(events))
    if fast:
        for i in np.flatnonzero(codes == _INSTANT).tolist():
            codes[i] = _code(events[i].ph, events[i].icat)
    return codes


def _route_unhashable(events: list[Any], cols: _Columns) -> None:
    """:func:`route_block` for a block with an unhashable ``ph`` or ``cat`` (no such cat is read)."""
    groups: dict[str, list[Any]] = {}
    for e in events:
        cat = e.icat if e.cat is INSTANT else e.cat
        try:
            hash(cat)
        except TypeError:
            continue
        kind = _KINDS[_code(e.ph, cat)]
        if kind is not None:
            groups.setdefault(kind, []).append(e)
    _route_groups(groups, cols)


def _route_groups(groups: dict[str, list[Any]], cols: _Columns, *, operator: bool | None = None) -> None:
    """Route each kind's events; ``operator``: whether any op is filed as ``Operator`` (None: look)."""
    ops = groups.get("op", [])
    if operator is None:
        operator = any(e.cat == "Operator" for e in ops)
    if operator:  # 2021 traces file ranges as Operator too
        is_range = [e.cat == "Operator" and "::" not in _text(e.name) for e in ops]
        groups["op"] = [e for e, r in zip(ops, is_range) if not r]
        groups.setdefault("ann", []).extend(e for e, r in zip(ops, is_range) if r)
    for kind, evs in groups.items():
        _route_kind(kind, evs, cols)


def _col(items: list[Any], name: str) -> list[Any]:
    """The attribute ``name`` of every item (a C-level map: no Python frame per item)."""
    return list(map(attrgetter(name), items))


def _route_kind(kind: str, evs: list[Event], cols: _Columns) -> None:
    if kind == "mem":
        _route_memory(evs, cols)
        return
    ts, dur = _floats_of(evs, "ts"), _floats_of(evs, "dur")
    with np.errstate(invalid="ignore"):
        ok = (np.abs(ts) < TS_LIMIT) & (np.abs(dur) < TS_LIMIT)
        negative = ok & (dur < 0)  # an event cannot end before it starts
    if negative.any():
        cols.negative += int(negative.sum())
        ok &= ~negative
    if not ok.all():
        cols.skipped += int((~ok).sum())
        evs = list(compress(evs, ok.tolist()))
        ts, dur = ts[ok], dur[ok]
    if not evs:
        return
    names = cols.strings.names_of(evs)
    if kind == "prof":  # a counter range: its kernel's name (its args are counters no row reads)
        cols.add(kind, name=names, ts=ts, dur=dur)
        return
    args = [] if kind == "ann" else _kind_args(kind, evs)  # an annotation reads no args
    if kind == "py":
        cols.add(kind, name=names, ts=ts, dur=dur, thread=cols.strings.threads_of(evs),
                 tid=_ids_of(evs, "tid"), pyid=_ids_of(args, "pyid"), pyparent=_ids_of(args, "pyparent"))
    elif kind in ("op", "ann", "api"):
        _route_cpu(kind, evs, args, cols, name=names, ts=ts, dur=dur)
    else:
        _route_gpu(kind, evs, args, cols, name=names, ts=ts, dur=dur)


def _route_memory(evs: list[Any], cols: _Columns) -> None:
    """``[memory]`` instant events (``profile_memory=True``): Bytes (negative for a free), the
    allocator's Total Allocated / Total Reserved after it, Addr, Device Id / Type."""
    evs = [e for e in evs if e.name == "[memory]" and e.ph in ("i", "I")]
    if evs and evs[0].__class__ is not Event:  # raw args: absent ones are None, as on the other paths
        found: list[Any] = [None if e.args is _ABSENT else _one_args("mem", e.args) for e in evs]
    else:
        found = _col(evs, "args")
    kept: list[tuple[Any, Any]] = [(e, a) for e, a in zip(evs, found) if a is not None]
    evs, found = [e for e, _ in kept], [a for _, a in kept]
    ts = _floats([e.ts for e in evs])
    with np.errstate(invalid="ignore"):
        ok = np.abs(ts) < TS_LIMIT
    if not ok.all():
        cols.skipped += int((~ok).sum())
        evs = [e for e, keep in zip(evs, ok) if keep]
        found = [a for a, keep in zip(found, ok) if keep]
        ts = ts[ok]
    if not evs:
        return
    args = found
    cols.add("mem", tid=_ids([e.tid for e in evs]), ts=ts, mbytes=_ids([a.mbytes for a in args]),
             total_alloc=_ids([a.total_alloc for a in args]), total_res=_ids([a.total_res for a in args]),
             addr=_ids([a.addr for a in args]), dev_id=_ids([a.dev_id for a in args]),
             dev_type=_ids([a.dev_type for a in args]))


def _route_cpu(kind: str, evs: list[Event], args: list[Args], cols: _Columns, **common: Any) -> None:
    common["thread"] = cols.strings.threads_of(evs)
    common["tid"] = _ids_of(evs, "tid")
    if kind == "ann":
        cols.add(kind, **common)
        return
    ext = _ext_ids(args)
    if kind == "op":
        cols.add(kind, ext=ext, sig=_signatures(args, cols), **common)
        return
    cats = _col(evs, "cat")
    is_driver = {c: _text(c).lower() == "cuda_driver" for c in set(cats)}  # cats here are hashable: routed by them
    driver = np.fromiter(map(is_driver.__getitem__, cats), dtype=bool, count=len(cats))
    cols.add(kind, corr=_ids_of(args, "corr"), ext=ext, driver=driver,
             kernel=cols.strings.optional(_col(args, "kernel")), **common)


def _ext_ids(args: list[Args]) -> np.ndarray:
    """:func:`_ids` of the :func:`_external_ids` (read from the args while none is missing)."""
    arr = _floats_of(args, "ext")
    if np.isnan(arr).any():  # a None (or a value no number): the lower-case spelling may hold it
        return _ids(_external_ids(args))
    return _exact(arr)


def _external_ids(args: list[Args]) -> list[Any]:
    ext = _col(args, "ext")
    if None in ext:  # some writers spell it in lower case
        ext = [a.ext_lower if x is None else x for x, a in zip(ext, args)]
    return ext


_SIG_FIELDS = attrgetter("dims", "types", "concrete")
_NUL_JOIN = b"\0".join


def _signatures(args: list[Args], cols: _Columns) -> np.ndarray:
    """Index of each op's (Input Dims, Input type, Concrete Inputs) in ``cols.sigs``: keyed by their
    raw JSON text, each distinct one decoded once."""
    index, sigs = cols.sig_index, cols.sigs
    raw = _RAW
    # one bytes per op, the three raw JSON texts (on every path) joined by NUL, which JSON text cannot
    # hold (a control character is escaped in a string, and no token has one): a third of the time of
    # a tuple of three bytes
    keys = list(map(_NUL_JOIN, map(_SIG_FIELDS, args)))
    try:
        return _codes(map(index.get, keys), len(keys))
    except TypeError:  # a signature not seen yet
        codes = list(map(index.get, keys))
    for i in _nones(codes):
        key = keys[i]
        j = index.get(key)
        if j is None:
            a = args[i]
            sig = tuple(_raw_value(v) if v.__class__ is raw else v for v in (a.dims, a.types, a.concrete))
            j = index[key] = -1 if sig == (None, None, None) else len(sigs)
            if j >= 0:
                sigs.append(sig)  # type: ignore[arg-type]
        codes[i] = j
    return np.array(codes, dtype="int32")


def _route_gpu(kind: str, evs: list[Event], args: list[Args], cols: _Columns, **common: Any) -> None:
    if kind == "kernel":
        device = [e.pid if a.device is None else a.device for e, a in zip(evs, args)]
    else:
        device = [a.device if a.device is not None else e.pid if a.from_device is None else a.from_device
                  for e, a in zip(evs, args)]
    common.update(device=_ids(device), stream=_ids([e.tid if a.stream is None else a.stream for e, a in zip(evs, args)]),
                  corr=_ids_of(args, "corr"))
    if kind != "kernel":
        cols.add(kind, bytes=_ids_of(args, "nbytes"), **common)
        return
    cols.add(kind, ext=_ext_ids(args),
             grid=cols.strings.dims3(_col(args, "grid")),
             block=cols.strings.dims3(_col(args, "block")),
             regs=_ids_of(args, "regs"),
             smem=_ids_of(args, "smem"),
             occupancy=_floats_of(args, "occupancy"),
             pg=cols.strings.optional(_col(args, "pg")), **common)


# ---------------------------------------------------------------------------- entry
def parse_trace(path: Path) -> ParsedTrace:
    """Stream ``path`` (JSON or gzipped JSON) into a :class:`ParsedTrace`.

    Raises:
        InputFormatError: not JSON, JSON that is not a trace, or damaged before any event.
    """
    from perfscope.limits import counting
    from perfscope.limits import take as take_budget

    path = Path(path)
    cols = _Columns()
    trace = ParsedTrace(cols={}, meta={})

    def take(items: list[Any]) -> None:
        trace.n_events += len(items)
        take_budget(path, len(items))
        # a block msgspec decoded is all events; the slow paths' lists are all plain values
        route_block(items if not items or items[0].__class__ in _DECODED else as_events(items), cols)

    collecting = gc.isenabled()
    gc.disable()  # millions of short-lived containers: the cyclic GC would only rescan them
    try:
        with counting():
            trace.meta, damage = read_events(path, _Decoder(), take)
    finally:
        if collecting:
            gc.enable()
    if damage is not None:
        if trace.n_events == 0:
            raise InputFormatError(path, f"damaged or truncated JSON ({damage})", hint="re-export the trace")
        trace.partial = True
        trace.warnings.append(f"trace is truncated or damaged after {trace.n_events} events ({damage}); "
                              "the report holds what was read")
    if cols.skipped:
        negative = f" ({cols.negative} of them with a negative dur)" if cols.negative else ""
        trace.warnings.append(f"{cols.skipped} events with a missing, non-numeric, negative or out-of-range "
                              f"ts/dur were skipped{negative}")
    cols.finish(trace)
    return trace

