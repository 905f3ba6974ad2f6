"""A small protobuf encoder for the few Perfetto messages perfscope writes (TrackEvent traces).

A Perfetto trace file is a ``Trace`` message: ``repeated TracePacket packet = 1``, so it can be
written one packet at a time (field 1, length, bytes) and never held whole in memory. The field
numbers below are those of Perfetto's ``protos/perfetto/trace/*.proto`` (the ``perfetto`` PyPI
package ships them as ``perfetto_trace_pb2``; the tests decode perfscope's output with it).

Messages written: TracePacket (timestamp 8, trusted_packet_sequence_id 10, track_event 11,
interned_data 12, sequence_flags 13, track_descriptor 60), TrackDescriptor (uuid 1, name 2,
parent_uuid 5, counter 8), TrackEvent (debug_annotations 4, type 9, name_iid 10, track_uuid 11,
name 23, double_counter_value 44), DebugAnnotation (int_value 4, double_value 5, string_value 6,
name 10), InternedData (event_names 2) and EventName (iid 1, name 2).
"""

from __future__ import annotations

import struct
from functools import cache

import numpy as np

SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
"""TrackEvent.Type values."""

SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
"""TracePacket.SequenceFlags values."""

_DOUBLE = struct.Struct("<d")


def varint(n: int) -> bytes:
    """``n`` (>= 0; a negative int64 as its 64-bit two's complement) as a protobuf varint."""
    if n < 0:
        n += 1 << 64
    if n < _TABLE:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_TABLE = 1 << 14
_SMALL = [bytes([i]) if i < 0x80 else bytes([(i & 0x7F) | 0x80, i >> 7]) for i in range(_TABLE)]
"""The varints of 0 .. 2**14 - 1 (lengths and small ids), ready-made."""


@cache
def tag(field: int, wire: int) -> bytes:
    """The key of field ``field`` with wire type ``wire`` (0 varint, 1 fixed64, 2 length-delimited)."""
    return varint(field << 3 | wire)


def f_varint(field: int, n: int) -> bytes:
    return tag(field, 0) + varint(n)


def f_double(field: int, x: float) -> bytes:
    return tag(field, 1) + _DOUBLE.pack(x)


def f_bytes(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def f_string(field: int, text: str) -> bytes:
    return f_bytes(field, text.encode("utf-8", "replace"))


# ---------------------------------------------------------------- messages
def packet(payload: bytes) -> bytes:
    """One ``Trace.packet`` entry (field 1 of Trace) around a TracePacket's bytes."""
    return b"\x0a" + varint(len(payload)) + payload


def track_descriptor(uuid: int, name: str, parent: int | None = None, counter: bool = False) -> bytes:
    body = f_varint(1, uuid) + f_string(2, name)
    if parent is not None:
        body += f_varint(5, parent)
    if counter:
        body += f_bytes(8, b"")
    return f_bytes(60, body)


_U64 = struct.Struct("<Q")


def flow_ids(ids: list[int], terminating: bool = False) -> bytes:
    """A TrackEvent's ``flow_ids`` (47; ``terminating_flow_ids``, 48): fixed64 ids that link slices
    with arrows (a flow starts at the first slice naming its id and ends at the one terminating it)."""
    head = tag(48 if terminating else 47, 1)
    return b"".join(head + _U64.pack(i) for i in ids)


def annotation_str(name: str, value: str) -> bytes:
    return f_bytes(4, f_string(10, name) + f_string(6, value))


def annotation_int(name: str, value: int) -> bytes:
    return f_bytes(4, f_string(10, name) + f_varint(4, value))


def annotation_double(name: str, value: float) -> bytes:
    return f_bytes(4, f_string(10, name) + f_double(5, value))


def varints(values: np.ndarray) -> list[bytes]:
    """The varint of each value of a non-negative int64 array, encoded with numpy (one bytes per value)."""
    v = np.asarray(values, dtype="uint64")
    n = len(v)
    if not n:
        return []
    shifts = (np.arange(10, dtype="uint64") * np.uint64(7))
    groups = (v[:, None] >> shifts[None, :]) & np.uint64(0x7F)
    length = np.ones(n, dtype="int64")
    for k in range(1, 10):
        length += (v >> np.uint64(7 * k)) > 0
    more = np.arange(10)[None, :] < (length[:, None] - 1)
    mat = (groups | np.where(more, np.uint64(0x80), np.uint64(0))).astype("uint8")
    blob = mat.tobytes()
    return [blob[i * 10: i * 10 + int(m)] for i, m in enumerate(length.tolist())]


def int_annotations(name: str, values: np.ndarray) -> list[bytes]:
    """DebugAnnotation(name, int_value) fields for each value (>= 0; NaN: empty bytes)."""
    vals = np.asarray(values, dtype="float64")
    ok = ~np.isnan(vals)
    name_field = f_string(10, name)
    out = [b""] * len(vals)
    encoded = varints(vals[ok].astype("int64"))
    for i, vb in zip(np.flatnonzero(ok).tolist(), encoded):
        inner_len = len(name_field) + 1 + len(vb)
        out[i] = b"".join((b"\x22", _SMALL[inner_len], name_field, b"\x20", vb))
    return out


def double_annotations(name: str, values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """DebugAnnotation(name, double_value) fields (``track_event.debug_annotations``) for each
    value, NaN left out: (one blob, per-value end offsets into it, NaN values empty)."""
    inner = f_string(10, name) + tag(5, 1)
    prefix = tag(4, 2) + varint(len(inner) + 8) + inner
    vals = np.asarray(values, dtype="<f8")
    ok = ~np.isnan(vals)
    width = len(prefix) + 8
    mat = np.empty((int(ok.sum()), width), dtype="uint8")
    mat[:, : len(prefix)] = np.frombuffer(prefix, dtype="uint8")
    mat[:, len(prefix):] = vals[ok].view("uint8").reshape(-1, 8)
    return mat.tobytes(), np.cumsum(np.where(ok, width, 0))


def interned_names(pairs: list[tuple[int, str]]) -> bytes:
    """TracePacket.interned_data with EventName entries (iid, name)."""
    return f_bytes(12, b"".join(f_bytes(2, f_varint(1, iid) + f_string(2, name)) for iid, name in pairs))
