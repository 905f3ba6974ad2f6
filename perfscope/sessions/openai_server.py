"""``perfscope serve``: the reference engine's continuous batching behind an OpenAI-compatible API.

One scheduler thread runs :func:`perfscope.engine.serving.serve` with live arrivals (this
module's :class:`LiveSource`); an asyncio HTTP/1.1 server (standard library) takes requests and
streams each token back as it is made. Endpoints:

- ``GET /v1/models``; ``GET /health``;
- ``POST /v1/completions`` (``prompt``: text, or token ids) and ``POST /v1/chat/completions``
  (``messages``, rendered with the model's chat template), streamed (``stream: true``, with
  ``stream_options.include_usage``) or not; ``max_tokens``, ``ignore_eos``, ``min_tokens``;
  decoding is greedy whatever ``temperature`` says (the engine's continuous batching is greedy);
- ``POST /start_profile`` and ``POST /stop_profile`` (as vLLM and SGLang): torch.profiler on the
  scheduler thread; the stop answers ``{"trace": PATH, "steps": PATH}``: the Kineto trace and the
  engine steps of the window (their times on ``time.perf_counter_ns``, the host's monotonic clock),
  and every answer carries ``perf_counter_ns`` (the server's clock, to estimate the offset).

Bad requests get the OpenAI error shape ``{"error": {"message", "type", "param", "code"}}`` and
a 400 (a wrong type, an option this server does not implement: ``logprobs``, ``echo``,
``best_of``, ``suffix``...), 404 for an unknown path or model, 405 for a wrong method, 408 when
the request's head and body are not in within the read timeout, 413 for a body over 8 MiB, 414
for a request line over :data:`MAX_REQUEST_LINE`, 431 for a header line over it or more than
:data:`MAX_HEADERS` headers, 503 past the connection cap. ``stop`` strings end the text before
them (finish reason ``stop``). The event loop's errors (``accept()`` out of file descriptors...)
are logged one line per cause per :data:`LOG_INTERVAL_S`, never a traceback each
(docs/limits.md).
A model without a tokenizer (random configs) takes token-id prompts only, and streams each token
as the text ``" <id>"``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import queue
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..engine.serving import (
    LoadRequest,
    LoadStep,
    RealClock,
    RequestTrace,
    ServeConfig,
    SlotEngine,
    serve,
)
from ..kv_policy import parse_kv_policy
from .server_gauges import ServeGauges

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_BODY = 8 << 20
DEFAULT_MAX_LEN = 2048
MAX_REQUEST_LINE = 16 * 1024
"""Bytes of the request line, and of any one header line (414 / 431 past it)."""
MAX_HEADERS = 100
"""Header lines a request may have (431 past it)."""
MAX_HEADER_BYTES = 64 * 1024
"""Bytes of a request's head in all (431 past it)."""
READ_TIMEOUT_S = 30.0
"""Default: seconds a client has to send its whole request (head and body); 408 after it."""
MAX_CONNECTIONS = 256
"""Default: connections served at once; one more is answered 503 and closed."""
LOG_INTERVAL_S = 10.0
"""Seconds between two log lines of the same cause (the ones in between are counted)."""
MAX_STOP = 4
"""``stop`` strings a request may give (OpenAI's limit)."""
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "best_of": (1,), "suffix": ("",), "tools": ([],),
    "response_format": ({"type": "text"},)}
"""Options this server does not implement, with the values that ask for nothing (accepted, as null is)."""


class ApiError(Exception):
    """An error answered to the client in the OpenAI shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        self.status, self.message, self.kind, self.param = status, message, kind, param
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class Parsed:
    """A completion request, checked."""

    ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    stop: tuple[str, ...] = ()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shown(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__
    return text if len(text) <= 40 else text[:40] + "..."


def _number(body: dict[str, Any], key: str, low: float, high: float, *, low_open: bool = False) -> None:
    v = body.get(key)
    if v is None:
        return
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not (
            (low < v if low_open else low <= v) and v <= high):
        raise ApiError(400, f"{key} must be a number in {'(' if low_open else '['}{low:g}, {high:g}], got {_shown(v)}",
                       param=key)


def stop_at(text: str, stops: tuple[str, ...], start: int = 0) -> int | None:
    """The index in ``text`` where the first ``stops`` string begins (searching from ``start``), or None."""
    found = [i for i in (text.find(x, start) for x in stops) if i >= 0]
    return min(found) if found else None


@dataclass
class _Stream:
    """One request in flight: the asyncio side's queue of (text piece or None, finish reason) events."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[int, float, str | None]]
    max_tokens: int
    stop_ids: frozenset[int]
    min_tokens: int = 0
    cancelled: bool = False
    stop: tuple[str, ...] = ()


@dataclass
class LiveSource:
    """Arrivals from the HTTP side and profiler commands, taken on the scheduler's thread."""

    clock: RealClock
    stopped: bool = False
    inbox: queue.Queue[Any] = field(default_factory=queue.Queue)
    on_control: Callable[[str, concurrent.futures.Future[Any]], None] | None = None
    _wake: threading.Event = field(default_factory=threading.Event)

    def submit(self, item: Any) -> None:
        self.inbox.put(item)
        self._wake.set()

    def stop(self) -> None:
        self.stopped = True
        self._wake.set()

    def take(self, now: float) -> list[LoadRequest]:
        out: list[LoadRequest] = []
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return out
            if isinstance(item, LoadRequest):
                out.append(item)
            elif self.on_control is not None:
                self.on_control(*item)

    def wait(self) -> bool:
        while not self.stopped and self.inbox.empty():
            self._wake.wait(0.5)
            self._wake.clear()
        return not self.stopped


class EngineServer:
    """The engine, its scheduler thread and the streams of the requests in flight."""

    def __init__(self, model: Any, name: str, *, max_batch: int = 8, max_len: int | None = None,
                 max_batched_tokens: int | None = None, kv_dtype: str = "auto", profile_dir: str | None = None,
                 cuda: bool = False, kv_policy: str | None = None) -> None:
        self.model, self.name = model, name
        self.tokenizer = getattr(model, "tokenizer", None)
        self.max_len = min(max_len or DEFAULT_MAX_LEN, model.args.max_seq_len)
        self.config = ServeConfig(max_batch, max_batched_tokens, None, "continuous")
        self.config.check()
        self.kv_dtype = kv_dtype
        self.kv_policy = parse_kv_policy(kv_policy).text()
        self.cuda = cuda
        self.profile_dir = Path(profile_dir) if profile_dir else Path(tempfile.mkdtemp(prefix="perfscope-serve-"))
        self.stop_ids = frozenset(self.tokenizer.stop_ids) if self.tokenizer is not None else frozenset()
        eos = model.args.extra.get("eos_token_id")
        if isinstance(eos, int):
            self.stop_ids |= {eos}
        self.clock = RealClock()
        self.source = LiveSource(self.clock, on_control=self._control)
        self.streams: dict[int, _Stream] = {}
        self.ids = itertools.count()
        self.created = int(time.time())
        self._prof: Any = None
        self._steps: list[LoadStep] = []
        self._requests: list[dict[str, Any]] = []
        self._profiling = False
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="perfscope-serve-engine", daemon=True)
        self.gauges = ServeGauges(model, max_batch, self.max_len, name)

    # ------------------------------------------------------------ the scheduler thread
    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        self.source.stop()
        self._thread.join(timeout)
        for s in list(self.streams.values()):
            s.loop.call_soon_threadsafe(s.events.put_nowait, (-1, 0.0, "abort"))

    def _run(self) -> None:
        try:
            with SlotEngine(self.model, self.config.max_batch, self.max_len, self.kv_dtype, self.kv_policy) as engine:
                serve(engine, [], self.config, self.clock, source=self.source, on_token=self._on_token,
                      on_step=self._on_step)
        except Exception as exc:  # noqa: BLE001 - the server answers 500 from now on, with this reason
            self.error = f"{type(exc).__name__}: {exc}"
            for s in list(self.streams.values()):
                s.loop.call_soon_threadsafe(s.events.put_nowait, (-1, 0.0, "error"))
        finally:
            if self._prof is not None:
                self._stop_profiler()

    def _on_step(self, step: LoadStep) -> None:
        self.gauges.on_step(step)
        if self._profiling:
            self._steps.append(step)

    def _on_token(self, trace: RequestTrace, token: int, t: float) -> str | None:
        if self._profiling and trace.output_tokens == 1:  # the scheduler's times of the request, for the window's log
            self._requests.append({"request_id": trace.request_id, "arrival_s": trace.arrival_s,
                                   "considered_s": trace.considered_s, "admitted_s": trace.admitted_s})
        s = self.streams.get(trace.request_id)
        if s is None or s.cancelled:
            return "abort"
        n = trace.output_tokens  # the token is already appended
        reason: str | None = None
        if token in s.stop_ids and n > s.min_tokens:
            reason = "stop"
        elif n >= s.max_tokens:
            reason = "length"
        s.loop.call_soon_threadsafe(s.events.put_nowait, (token, t, reason))
        return reason

    def _control(self, command: str, done: concurrent.futures.Future[Any]) -> None:
        try:
            if command == "start":
                if self._prof is not None:
                    raise ApiError(400, "the profiler is already running")
                from perfscope.collectors.torch_profiler import start_profiler

                self._steps, self._requests = [], []
                self._prof = start_profiler(self.cuda)
                self._profiling = True
                done.set_result({"status": "profiling", "perf_counter_ns": time.perf_counter_ns()})
            else:
                if self._prof is None:
                    raise ApiError(400, "the profiler is not running (POST /start_profile first)")
                done.set_result(self._stop_profiler())
        except Exception as exc:  # noqa: BLE001 - handed to the HTTP side, answered as an error
            done.set_exception(exc)

    def _stop_profiler(self) -> dict[str, Any]:
        from perfscope.collectors.torch_profiler import _export, stop_profiler

        prof, self._prof, self._profiling = self._prof, None, False
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        stop_profiler(prof)
        folder = self.profile_dir / f"profile-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns()}"
        trace = _export(prof, folder)
        steps = folder / "steps.json"
        steps.write_text(json.dumps({"clock": "time.perf_counter_ns", "origin_ns": self.clock.origin_ns,
                                     "steps": [asdict(s) for s in self._steps],
                                     "requests": self._requests}), encoding="utf-8")
        return {"status": "stopped", "trace": str(trace), "steps": str(steps), "perf_counter_ns": time.perf_counter_ns()}

    async def control(self, command: str) -> dict[str, Any]:
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.source.submit((command, done))
        return await asyncio.wrap_future(done)

    # ------------------------------------------------------------ requests
    def parse(self, path: str, body: dict[str, Any]) -> Parsed:
        """The request body checked against the OpenAI schema: :class:`ApiError` (400) for a wrong
        type or value, or an option this server does not implement."""
        chat = path.endswith("chat/completions")
        model = body.get("model")
        if model is not None and model != self.name:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        for key, neutral in UNSUPPORTED.items():
            v = body.get(key)
            if v is not None and not any(v == n and type(v) is type(n) for n in neutral):
                raise ApiError(400, f"{key} is not supported by perfscope serve (it implements prompt, messages, "
                                    "max_tokens, min_tokens, stop, ignore_eos, stream, stream_options, n=1; "
                                    "decoding is greedy)", param=key)
        if body.get("n", 1) != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        _number(body, "temperature", 0.0, 2.0)
        _number(body, "top_p", 0.0, 1.0, low_open=True)
        _number(body, "presence_penalty", -2.0, 2.0)
        _number(body, "frequency_penalty", -2.0, 2.0)
        for key in ("seed", "top_k"):
            if body.get(key) is not None and not _is_int(body[key]):
                raise ApiError(400, f"{key} must be an integer, got {_shown(body[key])}", param=key)
        for key in ("ignore_eos", "stream"):
            if body.get(key) is not None and not isinstance(body[key], bool):
                raise ApiError(400, f"{key} must be a boolean, got {_shown(body[key])}", param=key)
        stop = body.get("stop")
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,)
        elif isinstance(stop, list) and len(stop) <= MAX_STOP and all(isinstance(x, str) for x in stop):
            stops = tuple(stop)
        else:
            raise ApiError(400, f"stop must be a string or a list of at most {MAX_STOP} strings, got {_shown(stop)}",
                           param="stop")
        stops = tuple(x for x in stops if x)
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
                raise ApiError(400, "messages must be a non-empty list of {role, content} with string content",
                               param="messages")
            if self.tokenizer is None:
                raise ApiError(400, f"model {self.name} has no tokenizer nor chat template: use /v1/completions "
                                    "with token-id prompts", param="messages")
            from perfscope.errors import PerfscopeError

            try:
                text = self.tokenizer.apply_chat([{"role": str(m.get("role", "user")), "content": m["content"]}
                                                  for m in msgs])
            except PerfscopeError as exc:
                raise ApiError(400, str(exc), param="messages") from None
            ids = list(self.tokenizer.backend.encode(text, add_special_tokens=False).ids)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ApiError(400, f"model {self.name} has no tokenizer: give the prompt as token ids",
                                   param="prompt")
                ids = self.tokenizer.encode(prompt)
            elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
                ids = list(prompt)
                vocab = self.model.args.vocab_size
                bad = [t for t in ids if not 0 <= t < vocab]
                if bad:
                    raise ApiError(400, f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="prompt")
            else:
                raise ApiError(400, "prompt must be a string or a non-empty list of token ids (one prompt a request)",
                               param="prompt")
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = body.get(key, 16 if not chat else None)
        if max_tokens is None:
            max_tokens = self.max_len - len(ids)
        if not _is_int(max_tokens) or max_tokens < 1:
            raise ApiError(400, f"{key} must be an integer >= 1, got {_shown(max_tokens)}", param=key)
        if len(ids) + max_tokens > self.max_len:
            raise ApiError(400, f"This model's maximum context length is {self.max_len} tokens. However, you "
                                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} "
                                "for the completion). Please reduce the prompt or the completion length.",
                           param=key)
        min_tokens = body.get("min_tokens")
        min_tokens = 0 if min_tokens is None else min_tokens
        if not _is_int(min_tokens) or min_tokens < 0:
            raise ApiError(400, f"min_tokens must be an integer >= 0, got {_shown(min_tokens)}", param="min_tokens")
        if min_tokens > max_tokens:
            raise ApiError(400, f"min_tokens ({min_tokens}) must be at most {key} ({max_tokens})", param="min_tokens")
        opts = body.get("stream_options")
        opts = {} if opts is None else opts
        if not isinstance(opts, dict):
            raise ApiError(400, "stream_options must be an object", param="stream_options")
        if opts.get("include_usage") is not None and not isinstance(opts["include_usage"], bool):
            raise ApiError(400, "stream_options.include_usage must be a boolean", param="stream_options")
        return Parsed(ids, max_tokens, min_tokens, bool(body.get("ignore_eos")), bool(body.get("stream")),
                      bool(opts.get("include_usage")), stops)

    def submit(self, req: Parsed) -> tuple[int, _Stream]:
        if self.error is not None:
            raise ApiError(500, f"the engine stopped: {self.error}", "InternalServerError")
        rid = next(self.ids)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), req.max_tokens,
                         frozenset() if req.ignore_eos else self.stop_ids, req.min_tokens, stop=req.stop)
        self.streams[rid] = stream
        self.source.submit(LoadRequest(rid, self.clock.now(), tuple(req.ids), req.max_tokens))
        return rid, stream

    def text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return "".join(f" {t}" for t in ids)
        return str(self.tokenizer.decode(ids))


# ---------------------------------------------------------------- HTTP
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            413: "Payload Too Large", 414: "URI Too Long", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}


def _head(status: int, content_type: str, length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", f"Content-Type: {content_type}",
             "Connection: close", "Cache-Control: no-cache"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send_json(writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    writer.write(_head(status, "application/json", len(data)) + data)
    await writer.drain()


async def _line(reader: asyncio.StreamReader, too_long: ApiError) -> bytes:
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise ConnectionResetError("the client closed the connection") from None
        raise ApiError(400, "the request ended inside its head") from None
    except asyncio.LimitOverrunError:
        raise too_long from None


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, Any] | None]:
    """The request's method, path and JSON body; :class:`ApiError` (4xx) for anything malformed or
    over a limit. The reader's ``limit`` must be :data:`MAX_REQUEST_LINE`."""
    line = await _line(reader, ApiError(414, f"the request line is over {MAX_REQUEST_LINE} bytes"))
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ApiError(400, "bad request line")
    method, target = parts[0].upper(), parts[1].split("?", 1)[0]
    headers: dict[str, str] = {}
    size = len(line)
    for _ in range(MAX_HEADERS + 1):
        h = await _line(reader, ApiError(431, f"a header line is over {MAX_REQUEST_LINE} bytes"))
        size += len(h)
        if size > MAX_HEADER_BYTES:
            raise ApiError(431, f"the request's headers are over {MAX_HEADER_BYTES} bytes")
        if h in (b"\r\n", b"\n"):
            break
        k, colon, v = h.decode("latin-1").partition(":")
        if not colon or not k.strip():
            raise ApiError(400, "bad header line")
        headers[k.strip().lower()] = v.strip()
    else:
        raise ApiError(431, f"more than {MAX_HEADERS} headers")
    if "transfer-encoding" in headers:
        raise ApiError(501, "chunked request bodies are not supported: send Content-Length")
    length = headers.get("content-length", "0")
    if not (length.isascii() and length.isdigit()):
        raise ApiError(400, f"Content-Length must be a number of bytes, got {_shown(length)}")
    n = int(length)
    if n > MAX_BODY:
        raise ApiError(413, f"the request body is over {MAX_BODY >> 20} MiB")
    body = None
    if n:
        try:
            raw = await reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the client closed the connection inside the body") from None
        try:
            body = json.loads(raw)
        except RecursionError:
            raise ApiError(400, "the request body is JSON nested too deeply") from None
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
    return method, target, body


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float = 2.0) -> None:
    """After an error answer: end our side, and read (and drop) what the client is still sending, up
    to :data:`MAX_BODY` bytes or ``timeout_s``, so that closing with unread bytes does not reset
    the connection before the client has read the answer."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(timeout_s):
            left = MAX_BODY
            while left > 0:
                data = await reader.read(65536)
                if not data:
                    return
                left -= len(data)
    except (TimeoutError, OSError):
        pass


class LogLimiter:
    """One log line per cause per ``interval_s`` (the repeats in between are counted in the next
    line), so a flood of one error (``accept()`` out of file descriptors) is a few lines, not
    thousands of tracebacks."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, write: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def __call__(self, cause: str, detail: str = "") -> None:
        now = self.clock()
        last = self._last.get(cause)
        if last is not None and now - last < self.interval_s:
            self._quiet[cause] = self._quiet.get(cause, 0) + 1
            return
        self._last[cause] = now
        n = self._quiet.pop(cause, 0)
        more = f" ({n} more since the last such line)" if n else ""
        self.write(f"perfscope serve: {cause}{': ' + detail if detail else ''}{more}")

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """An asyncio exception handler: the message and the exception's kind are the cause."""
        exc = context.get("exception")
        cause = str(context.get("message") or "event loop error")
        if exc is not None:
            errno = getattr(exc, "errno", None)
            cause += f" ({type(exc).__name__}{f' errno {errno}' if errno else ''})"
        self(cause, str(exc) if exc is not None else "")


class HttpFront:
    """The asyncio HTTP server in front of an :class:`EngineServer`: at most ``max_connections``
    at once (503 past it), ``read_timeout_s`` to send a request (408 past it)."""

    ROUTES: ClassVar[dict[str, str]] = {"/v1/models": "GET", "/health": "GET", "/v1/completions": "POST", "/v1/chat/completions": "POST",
              "/start_profile": "POST", "/stop_profile": "POST", "/metrics": "GET"}

    def __init__(self, server: EngineServer, *, max_connections: int = MAX_CONNECTIONS,
                 read_timeout_s: float = READ_TIMEOUT_S, log: LogLimiter | None = None) -> None:
        self.server = server
        self.max_connections, self.read_timeout_s = max_connections, read_timeout_s
        self.log = log or LogLimiter()
        self.active = 0
        self.writers: set[asyncio.StreamWriter] = set()  # the connections open (closed on shutdown)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.active >= self.max_connections:
            self.log("connection cap reached", f"{self.max_connections} connections open: answered 503")
            try:
                await _send_json(writer, 503, ApiError(503, f"the server holds {self.max_connections} connections "
                                                            "(its cap): retry later", "service_unavailable").body())
                await _linger(reader, writer, 0.5)
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()
            return
        self.active += 1
        self.writers.add(writer)
        try:
            try:
                try:
                    async with asyncio.timeout(self.read_timeout_s):
                        method, path, body = await _read_request(reader)
                except TimeoutError:
                    raise ApiError(408, f"the request was not sent within {self.read_timeout_s:g} s") from None
                want = self.ROUTES.get(path)
                if want is None:
                    raise ApiError(404, f"no route {_shown(path)}", "NotFoundError")
                if method != want:
                    raise ApiError(405, f"{path} takes {want}, not {_shown(method)}")
                await self.route(method, path, body or {}, writer)
            except ApiError as exc:
                await _send_json(writer, exc.status, exc.body())
                await _linger(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
                self.log(f"request failed ({type(exc).__name__})", str(exc)[:200])
                await _send_json(writer, 500, ApiError(500, f"{type(exc).__name__}: {exc}",
                                                       "InternalServerError").body())
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            pass  # shutting down (Ctrl-C): the connection is closed below; this task is nobody's to await
        finally:
            self.active -= 1
            self.writers.discard(writer)
            writer.close()

    async def route(self, method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        srv = self.server
        if path == "/v1/models":
            await _send_json(writer, 200, {"object": "list", "data": [
                {"id": srv.name, "object": "model", "created": srv.created, "owned_by": "perfscope",
                 "max_model_len": srv.max_len, "vocab_size": srv.model.args.vocab_size}]})
        elif path == "/health":
            await _send_json(writer, 500 if srv.error else 200, {"status": srv.error or "ok",
                                                                 "perf_counter_ns": time.perf_counter_ns()})
        elif path == "/metrics":
            data = srv.gauges.text().encode()
            writer.write(_head(200, "text/plain; version=0.0.4", len(data)) + data)
            await writer.drain()
        elif path in ("/start_profile", "/stop_profile"):
            await _send_json(writer, 200, await srv.control("start" if path == "/start_profile" else "stop"))
        else:
            await self.complete(path, body, writer)

    async def complete(self, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        srv = self.server
        chat = path.endswith("chat/completions")
        req = srv.parse(path, body)
        ids, stream = req.ids, req.stream
        rid, s = srv.submit(req)
        prefix = "chatcmpl" if chat else "cmpl"
        base = {"id": f"{prefix}-{rid}", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": srv.name}
        out: list[int] = []
        sent = text = ""
        reason: str | None = None
        eos = False
        hold = max((len(x) for x in req.stop), default=1) - 1  # characters that may begin a stop string
        scanned = 0

        def choice(piece: str, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": piece} if piece or finish is None else {},
                        "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}

        async def event(obj: Any) -> None:
            writer.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            await writer.drain()

        try:
            if stream:
                writer.write(_head(200, "text/event-stream"))
                if chat:
                    await event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}]})
            while reason is None:
                token, _, reason = await s.events.get()
                if token < 0:
                    if reason == "error":
                        raise ApiError(500, f"the engine stopped: {srv.error}", "InternalServerError")
                    break
                if reason == "stop":
                    eos = True  # the end-of-sequence token: counted, not shown
                else:
                    out.append(token)
                if not (stream or req.stop):
                    continue  # the text is made once, at the end
                text = srv.text(out)
                if req.stop:
                    cut = stop_at(text, req.stop, max(0, scanned - hold))
                    scanned = len(text)
                    if cut is not None:  # a stop string: the text ends before it, the engine drops the request
                        text, reason, s.cancelled = text[:cut], "stop", True
                if stream:
                    if text.endswith("\ufffd") and reason is None:
                        continue  # an incomplete UTF-8 character: wait for the next token
                    ready = text if reason is not None or not hold else text[:max(len(sent), len(text) - hold)]
                    piece, sent = ready[len(sent):], ready
                    if piece:
                        await event({**base, "choices": [choice(piece, None)]})
            n_out = len(out) + (1 if eos else 0)
            counts = {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out}
            if stream:
                await event({**base, "choices": [choice("", reason or "abort")]})
                if req.include_usage:
                    await event({**base, "choices": [], "usage": counts})
                writer.write(b"data: [DONE]\n\n")
                await writer.drain()
            else:
                if not req.stop:
                    text = srv.text(out)
                msg = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                        "finish_reason": reason} if chat else
                       {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
                await _send_json(writer, 200, {"id": base["id"], "object": "chat.completion" if chat else
                                               "text_completion", "created": base["created"], "model": srv.name,
                                               "choices": [msg], "usage": counts})
        except (ConnectionError, asyncio.CancelledError):
            s.cancelled = True
            raise
        finally:
            s.cancelled = True
            srv.streams.pop(rid, None)


def serve_http(server: EngineServer, host: str, port: int, *, ready: Callable[[int], None] | None = None,
               max_connections: int = MAX_CONNECTIONS, read_timeout_s: float = READ_TIMEOUT_S) -> None:
    """Serve until Ctrl-C: ``ready(port)`` is called once listening (``port`` 0: the OS picks one).

    Ctrl-C closes the listening socket and every connection (a stream in flight ends there, the
    client sees the connection close) and raises KeyboardInterrupt once all is closed, with no
    traceback from the requests it cut."""
    log = LogLimiter()
    front = HttpFront(server, max_connections=max_connections, read_timeout_s=read_timeout_s, log=log)

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(log.loop_handler)
        srv = await asyncio.start_server(front.handle, host, port, reuse_address=True, limit=MAX_REQUEST_LINE)
        bound = srv.sockets[0].getsockname()[1]
        server.start()
        if ready is not None:
            ready(int(bound))
        try:
            await srv.serve_forever()
        finally:
            srv.close()
            for w in list(front.writers):
                w.close()

    try:
        asyncio.run(main())
    finally:
        server.close()


def model_name_for(name: str) -> str:
    """The id ``/v1/models`` gives: the name the user passed (a path's last part for folders and files)."""
    p = Path(name)
    return p.name if ("/" in name or name.endswith(".gguf")) else name


__all__ = ["ApiError", "EngineServer", "HttpFront", "LiveSource", "LogLimiter", "model_name_for", "serve_http",
           "stop_at"]
