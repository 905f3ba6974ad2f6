"""Every HTTP client perfscope runs (``http_stream.CLIENTS``), by registration, against a hostile server on
127.0.0.1: a redirect to another origin (a second server that records what reaches it: the
``Authorization`` header must never), an endless body, a 64 MB line, a 1 byte/s drip, a garbage status.

Each client ends on its own: a one-line error, or a failure counted in a report that is kept; never a
credential sent elsewhere, never another host's numbers stored. The checks are on the decision (the
failure's kind, what the second server saw), not on the machine's speed: the deadlines are made short
here (the policy's own value is a constant, tested by its use). A client without a driver here fails
:func:`test_every_http_client_has_a_driver`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from perfscope.errors import PerfscopeError
from perfscope.sessions import http_stream
from perfscope.sessions.endpoint import EndpointRun, run_endpoint_loadtest
from perfscope.sessions.http_stream import CLIENTS, Url
from perfscope.sessions.server_gauges import GaugeScraper
from perfscope.sessions.server_profile import ProfileSession

SECRET = "sk-hostile-test-0123456789abcdef"
MODES = ("redirect", "endless", "long-line", "drip", "garbage-status")
SERVER_BYTES = 600 << 20
SERVER_SECONDS = 60.0
"""Bounds of every server loop (an endless body stops there, or when the client hangs up)."""


@dataclass
class Server:
    """A server on 127.0.0.1 answering by mode; ``seen`` records each request's path and headers."""

    mode: str
    other: int = 0  # the port a redirect points to
    only: str | None = None  # the path (ending) that gets the hostile answer; others get a good one
    seen: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0


def _ok_answer(path: str) -> bytes | None:
    """What a well-behaved OpenAI server answers (for the paths a hostile mode leaves alone)."""
    if path.endswith("/models"):
        body = json.dumps({"data": [{"id": "tiny"}]}).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    if path.endswith("/completions"):
        events = [{"choices": [{"text": "hi", "finish_reason": None}]},
                  {"choices": [{"text": "!", "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}]
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    if path.endswith("/metrics"):
        body = b'vllm:num_requests_running{model_name="tiny"} 1.0\n'
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    return None


def _hostile(server: Server, sock: socket.socket, path: str) -> None:
    started = time.monotonic()
    sent = 0

    def send(data: bytes) -> bool:
        nonlocal sent
        if sent > SERVER_BYTES or time.monotonic() - started > SERVER_SECONDS:
            return False
        sock.sendall(data)
        sent += len(data)
        return True

    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    if server.mode == "redirect":
        send(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d%s\r\nContent-Length: 0\r\n\r\n"
             % (server.other, path.encode()))
    elif server.mode == "endless":
        send(head)
        line = b'data: {"choices": [{"text": "x", "finish_reason": null}]}\n\n' if path.endswith("completions") \
            else b'vllm:num_requests_running{model_name="elsewhere"} 99.0\n'
        chunk = line * (65536 // len(line))
        while send(chunk):
            pass
    elif server.mode == "long-line":
        send(head)
        chunk = b"x" * 65536
        for _ in range((64 << 20) // len(chunk)):
            if not send(chunk):
                break
    elif server.mode == "drip":
        send(b"HTTP/1.1 200 OK\r\n")
        while send(b"a"):
            time.sleep(1.0)
    else:
        send(b"HTCPCP/1.0 418 I'm a teapot with a very long and odd status\r\n\r\n")


def _handler(server: Server) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            sock: socket.socket = self.request
            sock.settimeout(SERVER_SECONDS)
            data = b""
            try:
                while b"\r\n\r\n" not in data and len(data) < 1 << 20:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
                server.seen.append({"path": path, "headers": headers})
                if server.mode == "capture":
                    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    return
                if server.only is not None and not path.endswith(server.only):
                    sock.sendall(_ok_answer(path) or b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    return
                _hostile(server, sock, path)
            except OSError:  # the client hung up: what a bounded client does
                return
    return Handler


class _Threaded(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def serving(server: Server) -> Iterator[Server]:
    srv = _Threaded(("127.0.0.1", 0), _handler(server))
    server.port = srv.server_address[1]
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        srv.shutdown()
        srv.server_close()


@contextmanager
def hostile_pair(mode: str, only: str | None = None) -> Iterator[tuple[Server, Server]]:
    """(the hostile server, the other origin it redirects to, which records what reaches it)."""
    with serving(Server("capture")) as other, serving(Server(mode, other=other.port, only=only)) as hostile:
        yield hostile, other


@pytest.fixture(autouse=True)
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policies' deadlines, shortened for the test (the drip must end at the deadline, not the drip's end)."""
    for name, policy in list(CLIENTS.items()):
        if policy.deadline_s is not None:
            monkeypatch.setitem(CLIENTS, name, policy.with_deadline(2.0))


# ---------------------------------------------------------------------------- drivers: one per client
def drive_models(mode: str, tmp: Path) -> tuple[Server, Server, str]:
    """``loadtest --endpoint``'s /v1/models call: a hostile answer is one EndpointError line."""
    with hostile_pair(mode) as (server, other):
        with pytest.raises(PerfscopeError) as info:
            run_endpoint_loadtest(EndpointRun(endpoint=f"http://127.0.0.1:{server.port}/v1", requests=1,
                                              api_key=SECRET, timeout_s=3.0))
        text = str(info.value)
        assert "\n" not in text and info.value.exit_code == 6
        return server, other, text


def drive_stream(mode: str, tmp: Path) -> tuple[Server, Server, str]:
    """The streamed completions: each request fails with its kind; the report is kept."""
    with hostile_pair(mode, only="completions") as (srv, other):
        report = run_endpoint_loadtest(EndpointRun(endpoint=f"http://127.0.0.1:{srv.port}/v1", requests=2,
                                                   rates=(50.0,), api_key=SECRET, timeout_s=3.0))
        status = sorted(set(report.requests["status"]))
        expected = {"redirect": {"http_error"}, "endless": {"timeout", "bad_response"}, "long-line": {"bad_response"},
                    "drip": {"timeout"}, "garbage-status": {"bad_response", "http_error"}}[mode]
        assert set(status) <= expected, (mode, status, list(report.requests["error"]))
        return srv, other, " ".join(str(e) for e in report.requests["error"])


def drive_metrics(mode: str, tmp: Path) -> tuple[Server, Server, str]:
    """The /metrics scraper: the scrape fails and is counted; no sample is kept."""
    with hostile_pair(mode) as (server, other):
        scraper = GaugeScraper(f"http://127.0.0.1:{server.port}/metrics", 1.0, api_key=SECRET)
        scraper.scrape_once()
        assert scraper.failures == 1 and scraper.samples == []
        return server, other, " ".join(scraper.warnings())


def drive_profile(mode: str, tmp: Path) -> tuple[Server, Server, str]:
    """``--profile``: the server's profiler calls fail into warnings; nothing is imported."""
    with hostile_pair(mode) as (server, other):
        session = ProfileSession(Url("http", "127.0.0.1", server.port, "/v1"), SECRET, None)
        warnings = session.start()
        assert warnings and not session.active
        return server, other, " ".join(warnings)


DRIVERS: dict[str, Callable[[str, Path], tuple[Server, Server, str]]] = {
    "endpoint-models": drive_models, "endpoint-stream": drive_stream, "metrics": drive_metrics,
    "profile": drive_profile}


def test_every_http_client_has_a_driver() -> None:
    assert sorted(set(CLIENTS) - set(DRIVERS)) == [], "add a driver for the new client in tests/unit/test_hostile_http.py"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_hostile_server_never_gets_a_credential_elsewhere_and_ends(client: str, mode: str, tmp_path: Path) -> None:
    server, other, said = DRIVERS[client](mode, tmp_path)
    # the credential went to the origin given (so the check below is not vacuous), and nowhere else
    assert any(r["headers"].get("authorization") == f"Bearer {SECRET}" for r in server.seen), server.seen
    assert other.seen == [], f"the other origin was reached: {other.seen}"
    assert SECRET not in said
    if mode == "redirect":
        assert "not followed" in said or "redirect" in said.lower(), said


def test_a_failed_scrape_keeps_the_load_test_report(tmp_path: Path) -> None:
    """`loadtest --metrics` against a server whose /metrics redirects elsewhere: the run's report is whole,
    its gauges empty, the failed scrapes counted."""
    with hostile_pair("redirect", only="/metrics") as (hostile, other):
        report = run_endpoint_loadtest(EndpointRun(endpoint=f"http://127.0.0.1:{hostile.port}/v1", requests=3,
                                                   rates=(50.0,), api_key=SECRET, metrics=True,
                                                   metrics_interval_s=0.2, timeout_s=5.0))
    assert other.seen == []
    assert (report.requests["status"] == "ok").all() and len(report.gauges) == 0
    gauges = report.params["gauges"]
    assert gauges["scrapes_failed"] == gauges["scrapes"] >= 1
    assert any("scrape(s) failed" in w for w in report.warnings)


def test_stream_parser_line_cap_is_the_policy_s() -> None:
    assert CLIENTS["endpoint-stream"].max_line == http_stream.MAX_SSE_LINE
    assert asyncio.iscoroutinefunction(http_stream.fetch)
