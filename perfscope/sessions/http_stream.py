"""A small asyncio HTTP/1.1 client for OpenAI-compatible servers: JSON calls and streamed SSE.

Standard library only (``asyncio`` streams): one connection per request (``Connection: close``),
bodies framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the connection's end.
:func:`stream_events` yields each Server-Sent Event's ``data`` with the time it arrived
(``time.perf_counter_ns``) and tells a clean end (``data: [DONE]`` or the body's end) from a
broken one (:class:`BrokenStream`).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_ERROR_BODY = 64 * 1024


class HttpError(Exception):
    """A response other than 2xx; ``message`` is the OpenAI error's message when the body has one."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(f"HTTP {status}: {message}")


class BrokenStream(Exception):
    """The connection ended (or sent garbage) before the response was complete."""


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
                    line = await r.readline()
                    if not line:
                        raise BrokenStream("connection closed inside a chunked body")
                    try:
                        size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                    except ValueError:
                        raise BrokenStream(f"bad chunk size line {line[:40]!r}") from None
                    if size == 0:
                        await r.readline()
                        return
                    data = await r.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in self.headers:
                left = int(self.headers["content-length"])
                while left > 0:
                    data = await r.read(min(left, 65536))
                    if not data:
                        raise BrokenStream(f"connection closed with {left} body bytes missing")
                    left -= len(data)
                    yield data
            else:
                while True:
                    data = await r.read(65536)
                    if not data:
                        return
                    yield data
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise BrokenStream(f"connection lost: {exc.__class__.__name__}") from None

    async def body(self, limit: int | None = None) -> bytes:
        out = bytearray()
        async for c in self.chunks():
            out += c
            if limit is not None and len(out) >= limit:
                break
        return bytes(out)

    def close(self) -> None:
        self.writer.close()


async def _open(url: Url, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> _Response:
    ctx = ssl.create_default_context() if url.scheme == "https" else None
    reader, writer = await asyncio.open_connection(url.host, url.port, ssl=ctx, limit=1 << 20)
    head = [f"{method} {path} HTTP/1.1", f"Host: {url.host}:{url.port}", "Connection: close",
            "User-Agent: perfscope-loadtest", *(f"{k}: {v}" for k, v in headers.items())]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        writer.close()
        raise BrokenStream("the server closed the connection without a response")
    try:
        status = int(status_line.split()[1])
    except (IndexError, ValueError):
        writer.close()
        raise BrokenStream(f"bad status line {status_line[:60]!r}") from None
    hdrs: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if not line:
            writer.close()
            raise BrokenStream("connection closed inside the response headers")
        if line in (b"\r\n", b"\n"):
            break
        k, _, v = line.decode("latin-1").partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return _Response(reader, writer, status, hdrs)


async def request_json(url: Url, method: str, path: str, payload: Any = None,
                       headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One JSON call: (status, decoded body or None when the body is not JSON)."""
    body = None if payload is None else json.dumps(payload).encode()
    resp = await _open(url, method, path, body, headers or {})
    try:
        data = await resp.body()
    finally:
        resp.close()
    try:
        return resp.status, json.loads(data) if data else None
    except ValueError:
        return resp.status, None


async def stream_events(url: Url, path: str, payload: Any,
                        headers: dict[str, str] | None = None) -> AsyncIterator[tuple[int, str]]:
    """POST ``payload`` and yield ``(perf_counter_ns, data)`` for each SSE event until ``[DONE]``.

    Raises :class:`HttpError` for a non-2xx answer, :class:`BrokenStream` when the stream is cut.
    """
    resp = await _open(url, "POST", path, json.dumps(payload).encode(),
                       {"Accept": "text/event-stream", **(headers or {})})
    try:
        if not 200 <= resp.status < 300:
            try:
                body = await resp.body(MAX_ERROR_BODY)
            except BrokenStream:
                body = b""
            raise HttpError(resp.status, error_message(body))
        buf = b""
        async for chunk in resp.chunks():
            now = time.perf_counter_ns()
            buf += chunk
            while True:
                # events end with a blank line (\n\n or \r\n\r\n)
                cut = min((i for i in (buf.find(b"\n\n"), buf.find(b"\r\n\r\n")) if i >= 0), default=-1)
                if cut < 0:
                    break
                sep = 4 if buf[cut:cut + 4] == b"\r\n\r\n" else 2
                event, buf = buf[:cut], buf[cut + sep:]
                data = [ln[5:].lstrip() for ln in event.decode("utf-8", "replace").splitlines()
                        if ln.startswith("data:")]
                if not data:
                    continue
                text = "\n".join(data)
                if text.strip() == "[DONE]":
                    return
                yield now, text
        if buf.strip():
            raise BrokenStream("the stream ended inside an event")
        raise EndedWithoutDone("the stream ended without data: [DONE]")
    finally:
        resp.close()


__all__ = ["BrokenStream", "EndedWithoutDone", "HttpError", "Url", "error_message", "request_json", "stream_events"]
