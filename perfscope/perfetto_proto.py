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

SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
"""TrackEvent.Type values."""

SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2
"""TracePacket.SequenceFlags values."""

_DOUBLE = struct.Struct("<d")


def varint(n: int) -> bytes:
    """``n`` (>= 0; a negative int64 as its 64-bit two's complement) as a protobuf varint."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]


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


def annotation_str(name: str, value: str) -> bytes:
    return f_bytes(4, f_string(10, name) + f_string(6, value))


def annotation_int(name: str, value: int) -> bytes:
    return f_bytes(4, f_string(10, name) + f_varint(4, value))


def annotation_double(name: str, value: float) -> bytes:
    return f_bytes(4, f_string(10, name) + f_double(5, value))


def interned_names(pairs: list[tuple[int, str]]) -> bytes:
    """TracePacket.interned_data with EventName entries (iid, name)."""
    return f_bytes(12, b"".join(f_bytes(2, f_varint(1, iid) + f_string(2, name)) for iid, name in pairs))
