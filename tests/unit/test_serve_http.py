"""``perfscope serve``'s HTTP front in-process (no model): the read timeout, the log limiter,
the request-head limits and the stop-string search. The end-to-end abuse tests (half-open
connections, oversize heads and bodies, deep JSON, wrong types, stop) are in
tests/integration/test_serve.py against the real server."""

from __future__ import annotations

import asyncio
import json

import pytest

from perfscope.sessions.openai_server import (
    MAX_REQUEST_LINE,
    ApiError,
    HttpFront,
    LogLimiter,
    _read_request,
    stop_at,
)


async def _exchange(front: HttpFront, data: bytes) -> bytes:
    srv = await asyncio.start_server(front.handle, "127.0.0.1", 0, limit=MAX_REQUEST_LINE)
    port = srv.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)  # and then nothing more: the connection stays open
        answer = await asyncio.wait_for(reader.read(), 60)
        writer.close()
        return answer
    finally:
        srv.close()


def test_a_request_not_sent_within_the_read_timeout_is_a_408() -> None:
    front = HttpFront(server=None, read_timeout_s=0.2)  # type: ignore[arg-type]  (never reaches the engine)
    for partial in (b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                    b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"prompt\""):
        answer = asyncio.run(_exchange(front, partial))
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert "within 0.2 s" in body["error"]["message"] and body["error"]["code"] == 408
    assert front.active == 0


def test_the_connection_cap_answers_503() -> None:
    front = HttpFront(server=None, max_connections=0, log=LogLimiter(write=lambda _: None))  # type: ignore[arg-type]
    answer = asyncio.run(_exchange(front, b"GET /health HTTP/1.1\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable") and b"retry later" in answer


def _read(data: bytes) -> tuple[str, str, dict | None]:
    async def go() -> tuple[str, str, dict | None]:
        reader = asyncio.StreamReader(limit=MAX_REQUEST_LINE)
        reader.feed_data(data)
        reader.feed_eof()
        return await _read_request(reader)

    return asyncio.run(go())


@pytest.mark.parametrize(("data", "status"), [
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", 400),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: \xd9\xa3\r\n\r\n", 400),  # a non-ASCII digit
    (b"POST /v1/completions HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\n" + b"X: y\r\n" * 20_000 + b"\r\n", 431),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n[1,2]", 400),  # not an object
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 20000\r\n\r\n" + b"{" * 10_000 + b"}" * 10_000, 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x", 400),  # the head ends inside a line
])
def test_bad_request_heads(data: bytes, status: int) -> None:
    with pytest.raises(ApiError) as exc:
        _read(data)
    assert exc.value.status == status


def test_a_good_request_head() -> None:
    assert _read(b"POST /v1/completions?x=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}") == ("POST", "/v1/completions", {})


def test_one_log_line_per_cause_per_interval() -> None:
    lines: list[str] = []
    now = [0.0]
    log = LogLimiter(10.0, lines.append, clock=lambda: now[0])
    for i in range(100_000):  # a flood: one cause, 100,000 times in 5 s
        now[0] = i * 5e-5
        log.loop_handler(None, {"message": "socket.accept() out of system resource",  # type: ignore[arg-type]
                                "exception": OSError(24, "Too many open files")})
    log("connection cap reached", "256 connections open")
    now[0] = 12.0
    log.loop_handler(None, {"message": "socket.accept() out of system resource",  # type: ignore[arg-type]
                            "exception": OSError(24, "Too many open files")})
    assert lines == [
        "perfscope serve: socket.accept() out of system resource (OSError errno 24): [Errno 24] Too many open files",
        "perfscope serve: connection cap reached: 256 connections open",
        "perfscope serve: socket.accept() out of system resource (OSError errno 24): [Errno 24] Too many open files "
        "(99999 more since the last such line)",
    ]


def test_stop_at() -> None:
    assert stop_at(" 1 382 7", (" 382",)) == 2
    assert stop_at(" 1 382 7", (" 9", " 7", " 1 3")) == 0
    assert stop_at(" 1 382 7", (" 382",), start=3) is None
    assert stop_at("abc", ()) is None
