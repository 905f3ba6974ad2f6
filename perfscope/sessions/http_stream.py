"""A small asyncio HTTP/1.1 client for OpenAI-compatible servers: JSON calls and streamed SSE.

Standard library only (``asyncio`` streams): one connection per request (``Connection: close``),
bodies framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the connection's end.
:func:`stream_events` yields each Server-Sent Event's ``data`` with the time it arrived
(``time.perf_counter_ns``) and tells a clean end (``data: [DONE]`` or the body's end) from a
broken one (:class:`BrokenStream`), and both from a response that is not a valid stream
(:class:`BadResponse`: a line over :data:`MAX_SSE_LINE`, a header over :data:`MAX_HEADER_LINE`).
The SSE parser (:class:`SseParser`) scans each byte once: its work is linear in the stream's size,
whatever the line lengths.

One client policy (:class:`HttpPolicy`, one per client in :data:`CLIENTS`) bounds every answer perfscope
reads from a server (``loadtest --endpoint``'s streams and ``/v1/models``, ``--metrics``, ``--profile``):

- a redirect is never followed (a 3xx is the answer, an :class:`HttpError` naming where it pointed), so
  the ``Authorization`` header, sent only with requests to the URL given, never reaches another origin;
- a cap on the body (``max_body``) and on one line of it (``max_line``), each a :class:`BadResponse`;
- a deadline for the whole response, head to last byte (``deadline_s``), not only for each read: a
  server that drips a byte a second ends at the deadline (``TimeoutError``).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

MAX_ERROR_BODY = 64 * 1024
MAX_SSE_LINE = 8 << 20
"""Bytes: an SSE line (or one event's data lines together) longer than this is a bad response."""
MAX_HEADER_LINE = 64 * 1024
"""Bytes: a response's status or header line longer than this is a bad response."""
MAX_HEADERS = 256
"""Header lines in one response; more is a bad response."""
MAX_JSON_BODY = 16 << 20
"""Bytes of a plain JSON answer (``/v1/models``) read at most."""
MAX_STREAM_BODY = 256 << 20
"""Bytes of one streamed completion read at most (a stream of small events that never ends)."""
MAX_METRICS_BODY = 16 << 20
"""Bytes of a ``/metrics`` answer read at most (vLLM's is about 50 KB)."""
MAX_METRICS_LINE = 1 << 20
"""Bytes of one line of a ``/metrics`` answer (a sample with its labels) read at most."""
READ_SIZE = 65536


@dataclass(frozen=True)
class HttpPolicy:
    """What one client accepts from a server (see the module doc).

    Attributes:
        name: the client (a key of :data:`CLIENTS`).
        max_body: bytes of a response body read at most; more is a :class:`BadResponse`.
        max_line: bytes of one line of the body (an SSE line, a Prometheus sample) at most.
        deadline_s: seconds for the whole response (None: the caller's own, ``--timeout``).
    """

    name: str
    max_body: int
    max_line: int
    deadline_s: float | None

    def with_deadline(self, deadline_s: float) -> HttpPolicy:
        return HttpPolicy(self.name, self.max_body, self.max_line, deadline_s)


CLIENTS: dict[str, HttpPolicy] = {
    "endpoint-stream": HttpPolicy("endpoint-stream", MAX_STREAM_BODY, MAX_SSE_LINE, None),
    "endpoint-models": HttpPolicy("endpoint-models", MAX_JSON_BODY, MAX_JSON_BODY, 30.0),
    "metrics": HttpPolicy("metrics", MAX_METRICS_BODY, MAX_METRICS_LINE, 2.0),
    "profile": HttpPolicy("profile", MAX_JSON_BODY, MAX_JSON_BODY, 120.0),
}
"""Every HTTP client perfscope runs, with its policy: ``loadtest --endpoint``'s streamed completions (the
deadline is ``--timeout``) and its ``/v1/models`` call, the ``--metrics`` scraper, the ``--profile``
calls (``/health``, ``/start_profile``, ``/stop_profile``). A new client is added here, and the hostile
server test (tests/unit/test_hostile_http.py) then fails until it drives that client too."""


class HttpError(Exception):
    """A response other than 2xx; ``message`` is the OpenAI error's message when the body has one."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(f"HTTP {status}: {message}")


def redirect_error(status: int, headers: dict[str, str]) -> HttpError:
    """The error of a redirect, which no client follows (its ``Location`` named, cut to 200 characters)."""
    where = headers.get("location", "")
    return HttpError(status, f"a redirect to {quote(where)} not followed (perfscope follows no redirect: give the "
                             "final URL)")


class BrokenStream(Exception):
    """The connection ended (or sent garbage) before the response was complete."""


class BadResponse(BrokenStream):
    """The server answered, but not with a valid OpenAI response: an event that is not JSON or not
    the schema's, a line over :data:`MAX_SSE_LINE`, a header over :data:`MAX_HEADER_LINE`."""


def quote(data: str | bytes, limit: int = 200) -> str:
    """``data`` quoted for an error message, cut to ``limit`` characters (and its full size said)."""
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(data)} {'bytes' if isinstance(data, (bytes, bytearray)) else 'characters'})"


class EndedWithoutDone(BrokenStream):
    """The body ended cleanly but without ``data: [DONE]`` (transformers serve's completions do):
    complete when the last event had a ``finish_reason``, the caller decides."""


@dataclass(frozen=True)
class Url:
    scheme: str
    host: str
    port: int
    path: str  # the base path, no trailing slash (``/v1``)

    @classmethod
    def parse(cls, text: str) -> Url:
        parts = urlsplit(text.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{text!r} is not an http:// or https:// URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def join(self, path: str) -> str:
        return f"{self.path}/{path.lstrip('/')}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"


def error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI error body, else the body's first line."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text.splitlines()[0][:200] if text else "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
        if obj.get("detail"):
            return str(obj["detail"])[:500]
    return text[:200]


class _Response:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int,
                 headers: dict[str, str]) -> None:
        self.reader, self.writer, self.status, self.headers = reader, writer, status, headers

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come; :class:`BrokenStream` when cut short."""
        r = self.reader
        try:
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                while True:
                    line = await _line(r)
                    if not line:
                        raise BrokenStream("connection closed inside a chunked body")
                    try:
                        size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                    except ValueError:
                        raise BadResponse(f"bad chunk size line {quote(line, 40)}") from None
                    if size == 0:
                        await _line(r)
                        return
                    while size > 0:  # a chunk of any size, read in pieces as it comes
                        data = await r.read(min(size, READ_SIZE))
                        if not data:
                            raise BrokenStream("connection closed inside a chunk")
                        size -= len(data)
                        yield data
                    await r.readexactly(2)
            elif "content-length" in self.headers:
                try:
                    left = int(self.headers["content-length"])
                except ValueError:
                    raise BadResponse(f"bad Content-Length {quote(self.headers['content-length'], 40)}") from None
                while left > 0:
                    data = await r.read(min(left, READ_SIZE))
                    if not data:
                        raise BrokenStream(f"connection closed with {left} body bytes missing")
                    left -= len(data)
                    yield data
            else:
                while True:
                    data = await r.read(READ_SIZE)
                    if not data:
                        return
                    yield data
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise BrokenStream(f"connection lost: {exc.__class__.__name__}") from None

    async def body(self, limit: int | None = None, *, policy: HttpPolicy | None = None) -> bytes:
        """The body: up to ``limit`` bytes, or under ``policy`` (past its ``max_body`` or ``max_line``, a
        :class:`BadResponse`)."""
        out = bytearray()
        line = 0  # bytes since the last newline
        async for c in self.chunks():
            out += c
            if policy is not None:
                parts = c.split(b"\n")
                longest = line + len(parts[0])
                if len(parts) > 1:
                    longest = max(longest, *(len(x) for x in parts[1:-1])) if len(parts) > 2 else longest
                    line = len(parts[-1])
                else:
                    line = longest
                if len(out) > policy.max_body:
                    raise BadResponse(f"a body over {policy.max_body} bytes (the {policy.name} limit)")
                if max(longest, line) > policy.max_line:
                    raise BadResponse(f"a line over {policy.max_line} bytes (the {policy.name} limit)")
            if limit is not None and len(out) >= limit:
                break
        return bytes(out)

    def close(self) -> None:
        self.writer.close()


async def _line(reader: asyncio.StreamReader) -> bytes:
    """One line of a response's head (or a chunk size line); :class:`BadResponse` when it is over
    :data:`MAX_HEADER_LINE` bytes."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    except asyncio.LimitOverrunError:
        raise BadResponse(f"a response line over {MAX_HEADER_LINE} bytes") from None


async def _open(url: Url, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> _Response:
    ctx = ssl.create_default_context() if url.scheme == "https" else None
    reader, writer = await asyncio.open_connection(url.host, url.port, ssl=ctx, limit=MAX_HEADER_LINE)
    head = [f"{method} {path} HTTP/1.1", f"Host: {url.host}:{url.port}", "Connection: close",
            "User-Agent: perfscope-loadtest", *(f"{k}: {v}" for k, v in headers.items())]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
    await writer.drain()
    try:
        return await _head(reader, writer)
    except BaseException:
        writer.close()
        raise


async def _head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Response:
    status_line = await _line(reader)
    if not status_line:
        writer.close()
        raise BrokenStream("the server closed the connection without a response")
    try:
        status = int(status_line.split()[1])
    except (IndexError, ValueError):
        writer.close()
        raise BadResponse(f"bad status line {quote(status_line, 60)}") from None
    hdrs: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = await _line(reader)
        if not line:
            writer.close()
            raise BrokenStream("connection closed inside the response headers")
        if line in (b"\r\n", b"\n"):
            break
        k, _, v = line.decode("latin-1").partition(":")
        hdrs[k.strip().lower()] = v.strip()
    else:
        raise BadResponse(f"more than {MAX_HEADERS} response headers")
    return _Response(reader, writer, status, hdrs)


async def fetch(url: Url, method: str, path: str, policy: HttpPolicy, payload: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One call under ``policy``: (status, body). A redirect is not followed (:func:`redirect_error`);
    the whole response is read within ``policy.deadline_s`` (``TimeoutError`` past it).

    Raises:
        HttpError: a 3xx answer. BadResponse: a body or line past the policy's caps.
        BrokenStream: the connection ended inside the response. TimeoutError: past the deadline.
    """
    body = None if payload is None else json.dumps(payload).encode()

    async def call() -> tuple[int, bytes]:
        resp = await _open(url, method, path, body, headers or {})
        try:
            if 300 <= resp.status < 400:
                raise redirect_error(resp.status, resp.headers)
            return resp.status, await resp.body(policy=policy)
        finally:
            resp.close()

    if policy.deadline_s is None:
        return await call()
    async with asyncio.timeout(policy.deadline_s):
        return await call()


async def request_json(url: Url, method: str, path: str, payload: Any = None,
                       headers: dict[str, str] | None = None, *, policy: HttpPolicy | None = None) -> tuple[int, Any]:
    """One JSON call under ``policy`` (default: ``/v1/models``'): (status, decoded body or None when the
    body is not JSON)."""
    status, data = await fetch(url, method, path, policy or CLIENTS["endpoint-models"], payload, headers)
    try:
        return status, json.loads(data) if data else None
    except ValueError:
        return status, None


class SseParser:
    """Server-Sent Events from a byte stream fed in pieces: :meth:`feed` returns the ``data`` of
    each event completed (its ``data:`` lines joined by newlines; other fields are ignored).

    Each byte is scanned for a newline once (``scanned`` counts them) and the consumed part of
    the buffer is dropped once it is the larger half, so the work is linear in the stream's size.
    A line, or an event's data, over ``limit`` bytes raises :class:`BadResponse`, before the
    rest of it is read.
    """

    def __init__(self, limit: int = MAX_SSE_LINE) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.pos = 0  # the start of the line being read
        self.scan = 0  # where the search for its end goes on
        self.data: list[str] = []
        self.size = 0  # bytes of the event's data so far
        self.scanned = 0

    def feed(self, chunk: bytes) -> list[str]:
        self.buf += chunk
        out: list[str] = []
        while True:
            nl = self.buf.find(b"\n", self.scan)
            end = len(self.buf) if nl < 0 else nl + 1
            self.scanned += end - self.scan
            self.scan = end
            if nl < 0:
                if len(self.buf) - self.pos > self.limit:
                    raise BadResponse(f"an SSE line over {self.limit} bytes (the limit): "
                                      f"{quote(bytes(self.buf[self.pos:self.pos + 200]))}...")
                break
            line = bytes(self.buf[self.pos:nl]).rstrip(b"\r")
            self.pos = end
            if len(line) > self.limit:
                raise BadResponse(f"an SSE line of {len(line)} bytes, over the limit of {self.limit}: "
                                  f"{quote(line)}")
            if not line:  # a blank line ends the event
                if self.data:
                    out.append("\n".join(self.data))
                self.data, self.size = [], 0
            elif line.startswith(b"data:"):
                value = line[5:].lstrip()
                self.size += len(value)
                if self.size > self.limit:
                    raise BadResponse(f"an SSE event over {self.limit} bytes (the limit), in several data lines")
                self.data.append(value.decode("utf-8", "replace"))
        if self.pos > READ_SIZE and 2 * self.pos > len(self.buf):
            del self.buf[:self.pos]
            self.scan -= self.pos
            self.pos = 0
        return out

    def pending(self) -> bool:
        """An event begun but not ended (data lines without their blank line, or a partial line)."""
        return bool(self.data) or bool(bytes(self.buf[self.pos:]).strip())


async def stream_events(url: Url, path: str, payload: Any,
                        headers: dict[str, str] | None = None) -> AsyncIterator[tuple[int, str]]:
    """POST ``payload`` and yield ``(perf_counter_ns, data)`` for each SSE event until ``[DONE]``.

    Raises :class:`HttpError` for a non-2xx answer, :class:`BrokenStream` when the stream is cut.
    """
    policy = CLIENTS["endpoint-stream"]
    resp = await _open(url, "POST", path, json.dumps(payload).encode(),
                       {"Accept": "text/event-stream", **(headers or {})})
    try:
        if 300 <= resp.status < 400:
            raise redirect_error(resp.status, resp.headers)
        if not 200 <= resp.status < 300:
            try:
                body = await resp.body(MAX_ERROR_BODY)
            except BrokenStream:
                body = b""
            raise HttpError(resp.status, error_message(body))
        parser = SseParser(policy.max_line)
        read = 0
        async for chunk in resp.chunks():
            now = time.perf_counter_ns()
            read += len(chunk)
            if read > policy.max_body:
                raise BadResponse(f"a stream over {policy.max_body} bytes (the {policy.name} limit)")
            for text in parser.feed(chunk):
                if text.strip() == "[DONE]":
                    return
                yield now, text
        if parser.pending():
            raise BrokenStream("the stream ended inside an event")
        raise EndedWithoutDone("the stream ended without data: [DONE]")
    finally:
        resp.close()


__all__ = ["CLIENTS", "MAX_SSE_LINE", "BadResponse", "BrokenStream", "EndedWithoutDone", "HttpError", "HttpPolicy",
           "SseParser", "Url", "error_message", "fetch", "quote", "redirect_error", "request_json", "stream_events"]
