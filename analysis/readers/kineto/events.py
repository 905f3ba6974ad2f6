"""The events array of a (gzipped) chrome-trace JSON file, block by block, in bounded memory.

The ``traceEvents`` array is read in blocks of about :data:`BLOCK` bytes: each block is cut after
a complete-looking event (a ``}`` followed by ``, {``) and handed whole to a fast decoder. A cut
is only trusted when ``[`` + block + ``]`` decodes: a cut inside a string or a nested object
cannot decode, so a decoded block always ends at a real event boundary. A block that does not
decode (lone surrogates, NaN, numbers the fast decoder rejects, damage) is re-read event by event
with orjson and the standard library's parser, which stops at real damage.

Top-level metadata (``deviceProperties``, ``baseTimeNanoseconds``, ``distributedInfo``) comes
from the text before and after the events array. Files whose layout the block reader does not
recognise (events array not near the start) go through ijson instead (its C backend when
installed). A file cut short keeps the events read so far; the damage is reported.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import ijson
import orjson

from perfscope.errors import InputFormatError

HEAD_KEEP = 4 << 20
TAIL_KEEP = 4 << 20
BLOCK = 1 << 20
"""Bytes of event text decoded at once (bounds the transient objects to ~10x this)."""

MAX_PIECE = 256 << 20
"""One event larger than this is treated as damage rather than grown further."""

Decode = Callable[[memoryview], "list[Any] | None"]
"""Decodes the text ``[ev, ev, ...]`` of one block, or returns None when it cannot."""

Take = Callable[[list[Any]], None]
"""Receives each batch of events: what ``Decode`` returned, or parsed JSON values."""


# ---------------------------------------------------------------------------- reading
class _Source:
    """Reads a stream; a read error (damaged gzip, I/O) ends the stream and is kept."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.error: BaseException | None = None
        self.eof = False

    def read(self, n: int) -> bytes:
        if self.eof:
            return b""
        try:
            data = self.raw.read(n)
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            self.error, data = exc, b""
        if not data:
            self.eof = True
        return data


class _Incomplete(Exception):
    """The text ends inside a JSON value (more text may complete it)."""


class _Damaged(Exception):
    """The text cannot be JSON however it continues."""


def _loads(piece: bytes) -> Any:
    """Parse one JSON value: orjson, else the standard library (NaN, lone surrogates, huge ints)."""
    try:
        return orjson.loads(piece)
    except orjson.JSONDecodeError as exc:
        if exc.msg == "unexpected end of data":
            raise _Incomplete from None
    text = piece.decode("utf-8", "replace")
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            raise _Incomplete from None
        raise _Damaged(f"{exc.msg} at byte {exc.pos}") from None
    except RecursionError:
        raise _Damaged("nesting too deep") from None


_SEP = re.compile(rb"\}\s*,\s*\{")
_END = re.compile(rb"\}\s*\]")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b"\xef\xbb\xbf \t\r\n"


class _Buffer:
    """The unread event text, after a ``[`` kept at index 0 so that blocks decode in place
    (no copy of the text per block: a ``]`` is written after the block while it decodes)."""

    def __init__(self, text: bytes) -> None:
        self.data = bytearray(b"[")
        self.data += text

    def __len__(self) -> int:
        return len(self.data) - 1

    def text(self) -> bytes:
        """A copy of the unread text (for the slow paths)."""
        return bytes(self.data[1:])

    def drop(self, n: int) -> None:
        """Forget the first ``n`` bytes of the text."""
        del self.data[1:1 + n]

    def last_sep(self) -> tuple[int, int] | None:
        """(end of the last complete-looking event, start of the next), in text offsets."""
        data, j = self.data, len(self.data)
        while j > 1:
            j = data.rfind(b"}", 1, j)
            if j < 0:
                return None
            m = _SEP.match(data, j)
            if m:
                return j, m.end() - 2
        return None

    def decode_upto(self, decode: Decode, end: int) -> list[Any] | None:
        """The events of ``text[:end]`` (``end`` just after a ``}`` followed by more text)."""
        data = self.data
        saved, data[end + 1] = data[end + 1], 0x5D  # "]"
        try:
            return self.decode_prefix(decode, end + 2)
        finally:
            data[end + 1] = saved

    def decode_prefix(self, decode: Decode, n: int) -> list[Any] | None:
        """The events of ``data[:n]``, which must end with the ``]`` of the array."""
        with memoryview(self.data) as whole, whole[:n] as view:
            return decode(view)


def _pieces(buf: bytes, stop: int) -> tuple[list[Any], int, str | None]:
    """Events of ``buf`` one at a time, up to the separator at or before ``stop``.

    Returns:
        The events, the offset where the unread rest starts, and the damage found (or None).
    """
    events: list[Any] = []
    start = 0
    for m in _SEP.finditer(buf, 0, min(len(buf), stop + 8)):
        end = m.start() + 1
        if end <= start or end > stop:
            continue
        try:
            events.append(_loads(buf[start:end]))
        except _Incomplete:
            if end - start > MAX_PIECE:
                return events, start, "one event is larger than 256 MB"
            continue
        except _Damaged as exc:
            return events, start, str(exc)
        start = m.end() - 1
    return events, start, None


def _close(buf: bytes, start: int) -> tuple[list[Any], bytes | None]:
    """The last event(s) from ``start`` if the events array closes there: (events, text after ``]``)."""
    text = buf[start:].lstrip(_WS)
    if text[:1] == b"]":
        return [], text[1:]
    for k, m in enumerate(_END.finditer(buf, start)):
        if k >= 64:
            break
        try:
            event = _loads(buf[start:m.start() + 1])
        except _Incomplete:
            continue
        except _Damaged:
            break
        return [event], buf[m.end():]
    return [], None


def _final(decode: Decode, buf: _Buffer) -> tuple[list[Any], bytes | None, str | None]:
    """The events left at the end of the stream, up to the ``]`` that closes the array.

    Returns:
        (events, tail, damage): ``tail`` is the text after ``]``, None when the array never
        closed (``damage`` then says why, or is None for a plain truncation).
    """
    for k, m in enumerate(_END.finditer(buf.data, 1)):
        if k >= 64:
            break
        events = buf.decode_prefix(decode, m.end())
        if events is not None:
            return events, bytes(buf.data[m.end():]), None
    text = buf.text()
    events, start, damage = _pieces(text, len(text))
    last, tail = _close(text, start)
    return events + last, tail, None if tail is not None else damage


def _meta_from_rest(rest: bytes) -> dict[str, Any]:
    """Top-level keys after the events array (``, "traceName": ...}``)."""
    rest = rest.strip(_WS)
    if rest[:1] != b",":
        return {}
    try:
        meta = _loads(b"{" + rest[1:])
    except (_Incomplete, _Damaged):
        return {}
    return meta if isinstance(meta, dict) else {}


def _read_blocks(src: _Source, text: bytes, decode: Decode, take: Take) -> tuple[bytes | None, str | None]:
    """Feed every event of the array to ``take``, block by block, from ``text`` and ``src``.

    Returns:
        (tail, damage) as :func:`_final`.
    """
    buf, want = _Buffer(text), BLOCK
    while True:
        while not src.eof and len(buf) < want:
            buf.data += src.read(BLOCK)
        if src.eof:
            break
        sep = buf.last_sep()
        if sep is None:  # one event bigger than the buffer: read on, up to a limit
            if len(buf) > MAX_PIECE:
                return None, "no event boundary in 256 MB of text"
            want = len(buf) + BLOCK
            continue
        events = buf.decode_upto(decode, sep[0])
        if events is not None:
            take(events)
            buf.drop(sep[1])
            want = BLOCK
            continue
        events, start, damage = _pieces(buf.text(), sep[0])
        take(events)
        buf.drop(start)
        want = BLOCK if start else len(buf) + BLOCK
        if damage:
            break
    events, tail, damage = _final(decode, buf)
    take(events)
    if tail is not None and not src.eof:
        tail += src.read(TAIL_KEEP)
    return tail, damage


def _open(path: Path) -> IO[bytes]:
    """``path`` for reading, gunzipped when it is gzip; the caller closes it (which closes the file
    too: a ``GzipFile`` wrapped around an open file object would leave that file open)."""
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    if gzipped:
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _read_head(src: _Source) -> bytes:
    """The first bytes, up to the events key (or HEAD_KEEP bytes, or the end)."""
    head = b""
    while len(head) < HEAD_KEEP:
        chunk = src.read(1 << 20)
        if not chunk:
            break
        head += chunk
        if head.lstrip(_WS)[:1] == b"[" or _EVENTS_KEY.search(head):
            break
    return head


def _events_start(head: bytes) -> tuple[int, dict[str, Any]] | None:
    """Where the events array's content starts in ``head`` and the keys before it, if the
    text before it is a well-formed object start; else None (the ijson path then reads it)."""
    text = head.lstrip(_WS)
    offset = len(head) - len(text)
    if text[:1] == b"[":
        return offset + 1, {}
    m = _EVENTS_KEY.search(text)
    if not m:
        return None
    try:
        meta = _loads(text[: m.start()].rstrip(_WS).rstrip(b",") + b"}")
    except (_Incomplete, _Damaged):
        return None
    return (offset + m.end(), meta) if isinstance(meta, dict) else None


# ---------------------------------------------------------------------------- ijson path
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


def _batches(items: Iterator[Any], size: int = 4096) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _parse_ijson(path: Path, first: bytes, take: Take) -> tuple[dict[str, Any], bool, str | None]:
    """The ijson path: (meta, whether the head names an events array, damage or None)."""
    damage = None
    with _open(path) as raw:
        keeper = _Keeper(raw)
        reader = io.BufferedReader(keeper, buffer_size=1 << 20)
        prefix = "item" if first == b"[" else "traceEvents.item"
        seen = 0
        try:
            for batch in _batches(ijson.items(reader, prefix, use_float=True)):
                seen += len(batch)
                take(batch)
        except (ijson.JSONError, ValueError, EOFError, OSError, zlib.error, RecursionError) as exc:
            damage = _short(exc)
        if first != b"{":
            return {}, True, damage
        meta = {**_meta_from_tail(bytes(keeper.tail)), **_meta_from_head(bytes(keeper.head))}
        is_trace = seen > 0 or bool(_EVENTS_KEY.search(bytes(keeper.head))) or "traceEvents" in meta
        return meta, is_trace, damage




# ---------------------------------------------------------------------------- entry
def read_events(path: Path, decode: Decode, take: Take) -> tuple[dict[str, Any], str | None]:
    """Stream the events of the trace at ``path`` (JSON or gzipped JSON) to ``take``.

    Args:
        path: the file.
        decode: the fast decoder of a block's text (see :data:`Decode`).
        take: receives each batch of events.

    Returns:
        The top-level metadata and the damage found (None when the file is whole).

    Raises:
        InputFormatError: not JSON, or JSON without a ``traceEvents`` array.
    """
    with _open(path) as raw:
        src = _Source(raw)
        head = _read_head(src)
        first = head.lstrip(_WS)[:1]
        if first not in (b"{", b"["):
            if src.error is not None and not head:
                return {}, f"damaged compressed data: {_short(src.error)}"
            raise InputFormatError(path, "not JSON", hint="give a torch.profiler / Kineto trace (.json or .json.gz)")
        start = _events_start(head)
        if start is not None:
            tail, damage = _read_blocks(src, head[start[0]:], decode, take)
            if src.error is not None and tail is None:
                damage = f"damaged compressed data: {_short(src.error)}"
            elif tail is None and damage is None:
                damage = "the file ends inside the events array"
            return {**_meta_from_rest(tail or b""), **start[1]}, damage
    meta, is_trace, damage = _parse_ijson(path, first, take)
    if not is_trace and damage is None:
        raise InputFormatError(path, "JSON, but not a trace (no traceEvents array)",
                               hint="give a torch.profiler / Kineto trace")
    return meta, damage


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]

