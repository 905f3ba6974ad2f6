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

import io
import json
import re
import zlib
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

import orjson

from perfscope.errors import InputFormatError
from perfscope.inputs import DAMAGED, open_input

if TYPE_CHECKING:
    from pathlib import Path

HEAD_KEEP = 4 << 20
TAIL_KEEP = 4 << 20
BLOCK = 1 << 20
"""Bytes of event text decoded at once (bounds the transient objects to ~10x this)."""

MAX_PIECE = 256 << 20
"""One event larger than this is treated as damage rather than grown further."""

Decode = Callable[[bytes], "list[Any] | None"]
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
        except DAMAGED as exc:  # a damaged gzip, bzip2, xz or zstd stream, an I/O error
            self.error, data = exc, b""
        if not data:
            self.eof = True
        return data

    def readinto(self, view: memoryview) -> int:
        """Like :meth:`read`, into ``view``: the bytes read (0 at the end)."""
        if self.eof:
            return 0
        try:
            n = self.raw.readinto(view)  # type: ignore[attr-defined]
        except DAMAGED as exc:  # a damaged gzip, bzip2, xz or zstd stream, an I/O error
            self.error, n = exc, 0
        if not n:
            self.eof = True
        return n or 0


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
    """The unread event text, in ``mem[1:end]`` after a ``[`` kept at ``mem[0]``, so that a block is
    cut without joining text (a ``]`` is written after the block while it decodes).

    ``mem`` is allocated once and written over in place (text is read straight into it, and the
    unread rest moved to its front): it is never resized, only replaced by a bigger one when an
    event does not fit. Growing and shrinking one buffer by a MB per block made the C allocator
    hand its pages back and fault them in again (about 50,000 page faults on a 200 MB trace, a
    quarter of the parse's system time). Decoded values may keep views of their text (msgspec.Raw)
    and see it written over: they must not outlive the batch they came in (the parse keeps copies
    of the raw text it needs)."""

    def __init__(self, text: bytes) -> None:
        self.mem = bytearray(max(2 * BLOCK + 2, len(text) + 2))
        self.mem[0] = 0x5B  # "["
        self.end = 1
        self.append(text)

    def __len__(self) -> int:
        return self.end - 1

    def _room(self, n: int) -> None:
        """Make room for ``n`` more bytes and a ``]`` after them (a new, bigger buffer if needed)."""
        if self.end + n + 1 > len(self.mem):
            mem = bytearray(max(self.end + n + 1, 2 * len(self.mem)))
            mem[:self.end] = memoryview(self.mem)[:self.end]
            self.mem = mem

    def append(self, chunk: bytes) -> None:
        self._room(len(chunk))
        self.mem[self.end:self.end + len(chunk)] = chunk  # same length: written in place
        self.end += len(chunk)

    def read(self, src: _Source, n: int) -> None:
        """Up to ``n`` more bytes of ``src``, read into the buffer."""
        self._room(n)
        with memoryview(self.mem) as whole:
            self.end += src.readinto(whole[self.end:self.end + n])

    def text(self) -> bytes:
        """A copy of the unread text (for the slow paths)."""
        return bytes(self.mem[1:self.end])

    def tail(self, start: int) -> bytes:
        """A copy of the text from offset ``start`` of :attr:`mem`."""
        return bytes(self.mem[start:self.end])

    def drop(self, n: int) -> None:
        """Forget the first ``n`` bytes of the text (the rest moves to the front, in place)."""
        rest = self.end - 1 - n
        self.mem[1:1 + rest] = self.mem[1 + n:self.end]
        self.end = 1 + rest

    def last_sep(self) -> tuple[int, int] | None:
        """(end of the last complete-looking event, start of the next), in text offsets."""
        data, j = self.mem, self.end
        while j > 1:
            j = data.rfind(b"}", 1, j)
            if j < 0:
                return None
            m = _SEP.match(data, j, self.end)
            if m:
                return j, m.end() - 2
        return None

    def decode_upto(self, decode: Decode, end: int) -> list[Any] | None:
        """The events of ``text[:end]`` (``end`` just after a ``}`` followed by more text)."""
        data = self.mem
        saved, data[end + 1] = data[end + 1], 0x5D  # "]"
        try:
            return self.decode_prefix(decode, end + 2)
        finally:
            data[end + 1] = saved

    def decode_prefix(self, decode: Decode, n: int) -> list[Any] | None:
        """The events of ``mem[:n]``, which must end with the ``]`` of the array (decoded in place)."""
        return decode(memoryview(self.mem)[:n])  # type: ignore[arg-type]


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
    for k, m in enumerate(_END.finditer(buf.mem, 1, buf.end)):
        if k >= 64:
            break
        events = buf.decode_prefix(decode, m.end())
        if events is not None:
            return events, buf.tail(m.end()), None
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
            buf.read(src, BLOCK)
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
    """``path`` for reading, decompressed by its content (gzip, zstd, bzip2, xz: :func:`perfscope.inputs.open_input`);
    the caller closes it. Damaged compressed data ends the stream (:class:`_Source` keeps the error)."""
    return open_input(path, strict=False)  # type: ignore[return-value]


def _read_head(src: _Source) -> bytes:
    """The first bytes, up to the events key (or HEAD_KEEP bytes, or the end)."""
    head = b""
    while len(head) < HEAD_KEEP:
        chunk = src.read(BLOCK)
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


# ---------------------------------------------------------------------------- top-level scan
KEY_LIMIT = 4096
META_VALUE_LIMIT = 1 << 20
"""Top-level values before the events array larger than this are skipped, not kept as metadata."""

_NONWS = re.compile(rb"[^ \t\r\n]")
_ESCAPES = re.compile(rb'(?:\\.[^"\\]{0,256})+', re.DOTALL)
_STRING = re.compile(rb'"[^"\\]{0,4096}(?:\\.[^"\\]{0,4096}){0,64}"', re.DOTALL)
"""A short string, matched whole in one step (a long one, or one cut by the block's end, is walked)."""
_NEST = re.compile(rb'["{}\[\]]')
_DELIM = re.compile(rb"[,}\] \t\r\n]")


class _Scan:
    """A forward-only cursor over the stream: every byte is looked at once, through regular
    expressions that skip runs of ordinary bytes in C (so a 500 MB string costs one pass), and
    only a bounded window is held (the unread rest of one block, and a capped capture)."""

    def __init__(self, src: _Source, head: bytes) -> None:
        self.src, self.buf, self.pos = src, head, 0
        self.capture: bytearray | None = None
        self.limit = 0
        self.found: dict[bytes, int] = {}

    def more(self) -> bool:
        chunk = self.src.read(BLOCK)
        if not chunk:
            return False
        self.buf, self.pos, self.found = self.buf[self.pos:] + chunk, 0, {}
        return True

    def advance(self, to: int) -> None:
        if self.capture is not None:
            if len(self.capture) + to - self.pos > self.limit:
                self.capture = None  # too long to keep: skipped
            else:
                self.capture += self.buf[self.pos:to]
        self.pos = to

    def byte(self) -> int | None:
        while self.pos >= len(self.buf):
            if not self.more():
                return None
        return self.buf[self.pos]

    def find(self, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
        """The next match of ``pattern``, reading on as needed (None at the end of the stream)."""
        while True:
            m = pattern.search(self.buf, self.pos)
            if m:
                return m
            self.advance(len(self.buf))
            if not self.more():
                return None

    def ws(self) -> None:
        m = self.find(_NONWS)
        if m:
            self.advance(m.start())

    def next_of(self, byte: bytes) -> int:
        """Index of the next ``byte`` at or after the cursor in this block, -1 when none: found with
        ``bytes.find`` (memchr speed) and searched for again only once the cursor has passed it,
        so each block is scanned once per byte looked for however many strings it holds."""
        at = self.found.get(byte, -2)
        if at == -2 or 0 <= at < self.pos:
            at = self.found[byte] = self.buf.find(byte, self.pos)
        return at

    def string(self) -> bool:
        """Past the string at the cursor (on its ``"``); False at the end of the stream."""
        m = _STRING.match(self.buf, self.pos)
        if m:  # whole in this block: one step
            self.advance(m.end())
            return True
        self.advance(self.pos + 1)
        while True:
            quote, slash = self.next_of(b'"'), self.next_of(b"\\")
            if quote < 0 and slash < 0:
                self.advance(len(self.buf))
                if not self.more():
                    return False
                continue
            if quote >= 0 and (slash < 0 or quote < slash):
                self.advance(quote + 1)
                return True
            m = _ESCAPES.match(self.buf, slash)  # a run of escapes and the short text between them
            if m:
                self.advance(m.end())
                continue
            self.advance(slash + 1)  # the block ends on the backslash
            if self.byte() is None:
                return False
            self.advance(self.pos + 1)

    def value(self) -> bool:
        """Past the JSON value at the cursor; False at the end of the stream."""
        c = self.byte()
        if c is None:
            return False
        if c == 0x22:
            return self.string()
        if c not in (0x7B, 0x5B):  # a number, true, false, null
            m = self.find(_DELIM)
            if m:
                self.advance(m.start())
            return True
        depth = 0
        while True:
            m = self.find(_NEST)
            if m is None:
                return False
            if m.group() == b'"':
                self.advance(m.start())
                if not self.string():
                    return False
                continue
            self.advance(m.end())
            depth += 1 if m.group() in b"{[" else -1
            if depth == 0:
                return True

    def take(self, limit: int, step: Callable[[], bool]) -> tuple[bool, bytes | None]:
        """Run ``step`` while capturing what it passes over (None when over ``limit`` bytes)."""
        self.capture, self.limit = bytearray(), limit
        ok = step()
        kept, self.capture = self.capture, None
        return ok, None if kept is None else bytes(kept)


def _scan_top(src: _Source, head: bytes) -> tuple[str, Any, dict[str, Any]]:
    """Walk a top-level object, key by key, to its ``"traceEvents": [``, in one linear pass.

    Returns:
        ``("events", text after the [, keys before it)``; ``("damage", why, keys)`` when the
        stream ends first; ``("none", None, keys)`` when the object closes without an events
        array; ``("odd", None, {})`` for any other layout (the ijson path reads those).
    """
    scan = _Scan(src, head.lstrip(_WS))
    meta: dict[str, Any] = {}
    if scan.byte() != 0x7B:
        return "odd", None, {}
    scan.advance(1)
    while True:
        scan.ws()
        c = scan.byte()
        if c is None:
            return "damage", "the file ends before its events array", meta
        if c == 0x7D:
            return ("odd" if "traceEvents" in meta else "none"), None, meta
        if c != 0x22:
            return "odd", None, {}
        ok, key = scan.take(KEY_LIMIT, scan.string)
        scan.ws()
        if not ok or scan.byte() != 0x3A:
            return ("damage", "the file ends before its events array", meta) if scan.byte() is None else ("odd", None, {})
        scan.advance(scan.pos + 1)
        scan.ws()
        if key == b'"traceEvents"' and scan.byte() == 0x5B:
            return "events", scan.buf[scan.pos + 1:], meta
        ok, value = scan.take(META_VALUE_LIMIT, scan.value)
        if not ok:
            return "damage", "the file ends before its events array", meta
        if key is not None and value is not None:
            try:
                name, parsed = _loads(key), _loads(value)
            except (_Incomplete, _Damaged):
                return "odd", None, {}
            if isinstance(name, str):
                meta[name] = parsed
        scan.ws()
        c = scan.byte()
        if c == 0x2C:
            scan.advance(scan.pos + 1)
        elif c != 0x7D:
            return ("damage", "the file ends before its events array", meta) if c is None else ("odd", None, {})


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
    import ijson  # only a trace the block reader cannot cut comes here: not loaded for the others

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
        if start is None and first == b"{":  # the array is not in the first MBs, or text before it fooled the search
            kind, found, keys = _scan_top(src, head)
            if kind == "none":
                raise InputFormatError(path, "JSON, but not a trace (no traceEvents array)",
                                       hint="give a torch.profiler / Kineto trace")
            if kind == "damage":
                return keys, f"damaged compressed data: {_short(src.error)}" if src.error is not None else found
            if kind == "events":
                head, start = found, (0, keys)
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

