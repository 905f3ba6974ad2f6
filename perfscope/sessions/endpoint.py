"""``perfscope loadtest --endpoint URL``: the load test against any OpenAI-compatible server.

The workload is the engine load test's (:mod:`perfscope.sessions.loadtest`): the same seeded
arrivals (Poisson, gamma with ``burstiness``, or an ``--arrivals`` file), the same length
distributions and rate sweeps, plus a prompt dataset file. Each request is one streamed call
(``stream: true``, ``stream_options: {include_usage: true}``) to ``/v1/completions`` or
``/v1/chat/completions``, sent by an asyncio client (:mod:`perfscope.sessions.http_stream`) at its
intended time (``scheduled_s``), or later when ``max_concurrency`` requests are in flight.

Per request (the ``requests`` table, times in s from the run's start): ``scheduled_s`` (intended
send), ``arrival_s`` (actual send: the request reaches the server), ``first_token_s``, ``end_s``,
``token_times_s`` (the arrival of each streamed chunk that carried text), ``chunks``,
``output_tokens`` and ``prompt_tokens`` (from the server's ``usage``, else counted with the
model's tokenizer, else the chunks: ``token_source`` says which; a prompt that neither usage nor
a tokenizer counted has a missing ``prompt_tokens``), ``status`` (``ok`` or the
failure's kind), ``error``, ``http_status``. The metrics are :func:`perfscope.analysis.summaries.loadtest.load_metrics`,
the engine load test's: one definition for both.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import InputFormatError, PerfscopeError, UsageError
from ..redact import redact_argv
from ..report import Report, source_info
from .http_stream import (
    BadResponse,
    BrokenStream,
    EndedWithoutDone,
    HttpError,
    Url,
    quote,
    request_json,
    stream_events,
)
from .loadtest import (
    arrival_times,
    check_workload,
    metrics_payload,
    random_prompt_ids,
    sample_lengths,
)
from .server_gauges import scraper_rows, start_scraper, with_gauges

Progress = Callable[[str], None]
APIS = {"completions": "completions", "chat": "chat/completions"}
SAFE_VOCAB = 256  # token-id prompts without a tokenizer nor the server's vocabulary size: ids every vocabulary holds
FAILURE_KINDS = ("http_error", "timeout", "broken_stream", "bad_response", "empty_output", "connection_error",
                 "client_error", "cancelled", "not_sent")
MAX_TOKEN_COUNT = 2**31 - 1
"""The largest token count a ``usage`` field may hold; more (or a negative one) is a bad response."""


class EndpointError(PerfscopeError):
    """The endpoint cannot be reached or is not an OpenAI-compatible API."""

    exit_code = 6


class Interrupted(PerfscopeError):
    """Ctrl-C during the load test: the partial report was written."""

    exit_code = 130


@dataclass(frozen=True)
class EndpointRun:
    """What ``perfscope loadtest --endpoint`` runs."""

    endpoint: str
    api: str = "completions"  # "completions" | "chat"
    model: str | None = None  # the served model's name (None: the first of /v1/models)
    rates: tuple[float, ...] = (10.0,)
    requests: int | None = None
    duration_s: float | None = None
    prompt_len: str = "64"
    output_len: str = "32"
    seed: int = 0
    arrivals: str | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    dataset: str | None = None
    tokenizer: str | None = None  # smollm2-135m, a .gguf file or a folder with tokenizer.json
    slo: dict[str, float] = field(default_factory=dict)
    timeout_s: float = 120.0
    ignore_eos: bool = False
    api_key: str | None = None
    profile: bool = False
    profile_dir: str | None = None  # where the server writes its trace (vLLM / SGLang: their profiler dir)
    metrics: bool = False  # scrape the server's /metrics during each run (server_gauges.GaugeScraper)
    metrics_interval_s: float = 1.0

    def check(self) -> None:
        if self.api not in APIS:
            raise UsageError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        check_workload(self)
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise UsageError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise UsageError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        parse_endpoint(self.endpoint)


def parse_endpoint(text: str) -> Url:
    """``http://host:port/v1`` (a URL without a path means ``/v1``)."""
    try:
        url = Url.parse(text)
    except ValueError as exc:
        raise UsageError(f"--endpoint: {exc}", hint="use e.g. http://127.0.0.1:8000/v1") from None
    return url if url.path else Url(url.scheme, url.host, url.port, "/v1")


# ---------------------------------------------------------------- prompts
@dataclass(frozen=True)
class Prompt:
    """One request's input: text, token ids (completions only) or chat messages."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    output_len: int | None = None  # the dataset's own max_tokens (else --output-len)


def read_dataset(path: str | Path) -> list[Prompt]:
    """Prompts from a file: JSON lines (``{"prompt": ...}`` or ``{"messages": [...]}``, optional
    ``max_tokens`` / ``output_len``), a JSON list of such objects or strings, or plain text (one
    prompt a line)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFormatError(p, f"cannot read the --dataset file: {exc}") from None
    stripped = text.lstrip()
    items: list[Any]
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise InputFormatError(p, f"not valid JSON: {exc}") from None
    elif stripped.startswith("{"):
        items = []
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except ValueError:
                raise InputFormatError(p, f"line {i} is not a JSON object",
                                       hint="a JSON-lines dataset holds one {\"prompt\": ...} object a line") from None
    else:
        items = [line for line in text.splitlines() if line.strip()]
    out = [_prompt(item, p, i) for i, item in enumerate(items, start=1)]
    if not out:
        raise InputFormatError(p, "the --dataset file has no prompts", hint="write one prompt a line")
    return out


def _prompt(item: Any, path: Path, i: int) -> Prompt:
    if isinstance(item, str):
        return Prompt(text=item)
    if not isinstance(item, dict):
        raise InputFormatError(path, f"item {i} is neither a string nor an object")
    n = item.get("max_tokens", item.get("output_len"))
    if n is not None and (not isinstance(n, int) or n < 1):
        raise InputFormatError(path, f"item {i}: max_tokens {n!r} must be an integer >= 1")
    if isinstance(item.get("messages"), list):
        msgs = item["messages"]
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
            raise InputFormatError(path, f"item {i}: each message needs a string content")
        return Prompt(messages=tuple({"role": str(m.get("role", "user")), "content": m["content"]} for m in msgs),
                      output_len=n)
    prompt = item.get("prompt", item.get("text"))
    if isinstance(prompt, str):
        return Prompt(text=prompt, output_len=n)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return Prompt(ids=tuple(prompt), output_len=n)
    raise InputFormatError(path, f"item {i} has no prompt", hint='give "prompt" (text or token ids) or "messages"')


class TextTokenizer:
    """Counts and makes text: a GGUF file's tokenizer or a folder's ``tokenizer.json``."""

    def __init__(self, name: str, backend: Any, vocab_size: int) -> None:
        self.name, self.backend, self.vocab_size = name, backend, vocab_size

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=True))


def load_tokenizer(name: str) -> TextTokenizer:
    """``smollm2-135m``, a ``.gguf`` file, or a local folder (or file) with ``tokenizer.json``."""
    from perfscope.engine.gguf_model import GGUFFile, GGUFTokenizer, is_gguf_name, resolve_gguf

    if is_gguf_name(name):
        tok = GGUFTokenizer.from_gguf(GGUFFile(resolve_gguf(name)))
        if tok is None:
            raise InputFormatError(name, "the GGUF file has no tokenizer")
        return TextTokenizer(name, tok.backend, len(tok.tokens))
    p = Path(name).expanduser()
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise UsageError(f"--tokenizer {name!r}: no tokenizer.json there",
                         hint="give smollm2-135m, a .gguf file or a folder holding tokenizer.json")
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise InputFormatError(file, f"not a tokenizer.json: {exc}") from None
    return TextTokenizer(name, backend, backend.get_vocab_size())


@dataclass(frozen=True)
class RequestSpec:
    request_id: int
    scheduled_s: float
    prompt: Prompt
    max_tokens: int
    intended_prompt_tokens: int | None  # the drawn length (random prompts), None for dataset text


def build_requests(run: EndpointRun, rate: float | None, tokenizer: TextTokenizer | None,
                   vocab_size: int | None = None) -> list[RequestSpec]:
    """The run's requests at ``rate``: the engine load test's arrivals and lengths; prompts from the
    dataset (in order, repeated) or seeded random token ids (sent as text when a tokenizer is known;
    else as ids below the server's ``vocab_size`` when /v1/models gives it, below
    :data:`SAFE_VOCAB` otherwise)."""
    arrivals = arrival_times(run, rate)
    n = len(arrivals)
    prompt_lens, output_lens = sample_lengths(run, n)
    if run.dataset:
        data = read_dataset(run.dataset)
        prompts = [data[i % len(data)] for i in range(n)]
        intended: list[int | None] = [None] * n
    else:
        vocab = tokenizer.vocab_size if tokenizer else vocab_size
        if tokenizer is None and run.api == "chat":
            raise UsageError("the chat API needs text prompts: give --dataset FILE or --tokenizer NAME")
        vocab = vocab or SAFE_VOCAB
        ids = random_prompt_ids(run.seed, prompt_lens, vocab)
        prompts = [Prompt(text=tokenizer.decode(x)) if tokenizer else Prompt(ids=x) for x in ids]
        if run.api == "chat":
            prompts = [Prompt(messages=({"role": "user", "content": p.text or ""},)) for p in prompts]
        intended = [int(x) for x in prompt_lens]
    if run.api == "chat" and any(p.messages is None and p.text is None for p in prompts):
        raise UsageError("the chat API takes text prompts, not token ids", hint="use --api completions")
    return [RequestSpec(i, float(arrivals[i]), prompts[i], int(prompts[i].output_len or output_lens[i]), intended[i])
            for i in range(n)]


def request_body(run: EndpointRun, model: str, spec: RequestSpec) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}, "temperature": 0.0}
    p = spec.prompt
    if run.api == "chat":
        body["messages"] = list(p.messages) if p.messages else [{"role": "user", "content": p.text or ""}]
    else:
        body["prompt"] = list(p.ids) if p.ids is not None else (
            p.text if p.text is not None else "\n".join(m["content"] for m in p.messages or ()))
    if run.ignore_eos:
        body["ignore_eos"] = True  # vLLM's, SGLang's and perfscope serve's extension
        body["min_tokens"] = spec.max_tokens
    return body


# ---------------------------------------------------------------- the client
@dataclass(frozen=True)
class StreamEvent:
    """One streamed chunk, checked: its first choice's text and finish reason, and its usage."""

    text: str
    finish_reason: str | None
    usage: dict[str, int] | None
    id: str | None = None  # the response's id (cmpl-..., chatcmpl-...): perfscope serve's steps name it


def _count(usage: dict[str, Any], key: str) -> int | None:
    n = usage.get(key)
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKEN_COUNT:
        raise BadResponse(f"usage.{key} must be a token count (an integer in 0..{MAX_TOKEN_COUNT}), got {quote(repr(n), 40)}")
    return n


def check_event(data: str, api: str) -> StreamEvent:
    """The one schema check of a streamed event's ``data`` (an OpenAI completions or chat chunk).

    Raises :class:`HttpError` for an ``{"error": ...}`` event, and :class:`BadResponse` naming
    what is wrong and quoting the event (cut to 200 characters) for anything else off the schema:
    not JSON, not an object, ``choices`` not a list of objects, a text (``choices[0].text``, or
    ``delta.content`` for chat) or ``finish_reason`` not a string, ``usage`` not an object of
    token counts (integers in 0..:data:`MAX_TOKEN_COUNT`).
    """
    try:
        event = json.loads(data)
    except ValueError:
        raise BadResponse(f"an event is not JSON: {quote(data)}") from None
    try:
        return _checked(event, api)
    except BadResponse as exc:
        raise BadResponse(f"{exc}, in the event {quote(data)}") from None


def _checked(event: Any, api: str) -> StreamEvent:
    if not isinstance(event, dict):
        raise BadResponse(f"an event is a JSON {type(event).__name__}, not an object")
    if event.get("error"):
        err = event["error"]
        code = str(err.get("code")) if isinstance(err, dict) else ""
        raise HttpError(int(code) if code.isascii() and code.isdigit() and len(code) <= 3 else 0,
                        str(err.get("message") if isinstance(err, dict) else err)[:500])
    choices = event.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise BadResponse("choices must be a list of objects")
    text: Any = None
    reason: Any = None
    if choices:
        c = choices[0]
        if api == "chat":
            delta = c.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise BadResponse("choices[0].delta must be an object")
            text = (delta or {}).get("content")
            where = "choices[0].delta.content"
        else:
            text, where = c.get("text"), "choices[0].text"
        if text is not None and not isinstance(text, str):
            raise BadResponse(f"{where} must be a string")
        reason = c.get("finish_reason")
        if reason is not None and not isinstance(reason, str):
            raise BadResponse("choices[0].finish_reason must be a string or null")
    usage = event.get("usage")
    counts: dict[str, int] | None = None
    if usage is not None:
        if not isinstance(usage, dict):
            raise BadResponse("usage must be an object")
        counts = {k: n for k in ("prompt_tokens", "completion_tokens", "total_tokens")
                  if (n := _count(usage, k)) is not None}
    rid = event.get("id")
    return StreamEvent(text or "", reason or None, counts, rid[:200] if isinstance(rid, str) else None)


async def _one(run: EndpointRun, url: Url, model: str, spec: RequestSpec, rec: dict[str, Any], t0_ns: int,
               sem: asyncio.Semaphore | None, tokenizer: TextTokenizer | None) -> None:
    def since(ns: int) -> float:
        return (ns - t0_ns) / 1e9

    headers = {"Authorization": f"Bearer {run.api_key}"} if run.api_key else {}
    body = request_body(run, model, spec)
    if sem is not None:
        await sem.acquire()
    try:
        rec["arrival_s"] = since(time.perf_counter_ns())
        rec["status"] = "in_flight"
        times: list[float] = []
        text: list[str] = []
        usage: dict[str, int] | None = None
        try:
            async with asyncio.timeout(run.timeout_s):
                async for ns, data in stream_events(url, url.join(APIS[run.api]), body, headers):
                    event = check_event(data, run.api)
                    if event.id and not rec.get("response_id"):
                        rec["response_id"] = event.id
                    if event.text:
                        times.append(since(ns))
                        text.append(event.text)
                    if event.finish_reason:
                        rec["finish_reason"] = event.finish_reason
                    if event.usage:
                        usage = event.usage
            status, error = ("ok", None) if times else ("empty_output", "the stream ended without any text")
            rec["done_marker"] = True
        except EndedWithoutDone as exc:
            if rec.get("finish_reason"):  # a clean end after the last choice: complete, no [DONE] sent
                status, error = ("ok", None) if times else ("empty_output", "the stream ended without any text")
                rec["done_marker"] = False
            else:
                status, error = "broken_stream", str(exc)
        except TimeoutError:
            status, error = "timeout", f"no complete answer within --timeout {run.timeout_s:g} s"
        except HttpError as exc:
            status, error = "http_error", exc.message
            rec["http_status"] = exc.status
        except BadResponse as exc:
            status, error = "bad_response", str(exc)
        except BrokenStream as exc:
            status, error = "broken_stream", str(exc)
        except (ConnectionRefusedError, socket.gaierror) as exc:  # never connected
            status, error = "connection_error", f"{exc.__class__.__name__}: {exc}"
        except OSError as exc:  # connected, then cut (ConnectionResetError, BrokenPipeError, ...)
            status, error = "broken_stream", f"{exc.__class__.__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - one request's surprise must not lose the run's measurements
            status, error = "client_error", f"{type(exc).__name__}: {quote(str(exc))}"
        end = since(time.perf_counter_ns())
        rec.update(status=status, error=error, chunks=len(times),
                   token_times_s=json.dumps([round(x, 9) for x in times]))
        rec["first_token_s"] = times[0] if times else math.nan
        rec["end_s"] = times[-1] if status == "ok" else end
        out_text = "".join(text)
        rec["output_chars"] = len(out_text)
        if usage and usage.get("completion_tokens") is not None:
            rec["output_tokens"], rec["token_source"] = usage["completion_tokens"], "usage"
        elif tokenizer is not None and status == "ok":
            rec["output_tokens"], rec["token_source"] = len(tokenizer.encode(out_text)), "tokenizer"
        else:
            rec["output_tokens"], rec["token_source"] = len(times), "chunks"
        if usage and usage.get("prompt_tokens") is not None:
            rec["prompt_tokens"] = usage["prompt_tokens"]
        if status in ("ok", "empty_output"):
            rec["http_status"] = 200
    finally:
        if sem is not None:
            sem.release()


def _new_record(spec: RequestSpec, tokenizer: TextTokenizer | None) -> dict[str, Any]:
    p = spec.prompt
    if p.ids is not None:
        prompt_tokens: int | None = len(p.ids)
    elif tokenizer is not None:
        prompt_tokens = len(tokenizer.encode(p.text if p.text is not None
                                             else "\n".join(m["content"] for m in p.messages or ())))
    else:
        prompt_tokens = spec.intended_prompt_tokens
    # None: not known unless the server's usage says (dataset text, no tokenizer): missing, never a sentinel
    return {"request_id": spec.request_id, "scheduled_s": spec.scheduled_s, "arrival_s": math.nan,
            "first_token_s": math.nan, "end_s": math.nan, "prompt_tokens": prompt_tokens,
            "output_tokens": 0, "max_output_tokens": spec.max_tokens, "finish_reason": None, "status": "not_sent",
            "error": None, "http_status": None, "chunks": 0, "token_times_s": "[]", "token_source": None,
            "output_chars": 0, "done_marker": None, "response_id": None}


async def _run_rate(run: EndpointRun, url: Url, model: str, specs: Sequence[RequestSpec],
                    records: list[dict[str, Any]], tokenizer: TextTokenizer | None,
                    epoch: list[int] | None = None) -> tuple[int, float]:
    """Send ``specs`` on schedule; fill ``records`` in place. Returns (t0 perf_counter_ns, wall s);
    ``epoch`` gets the wall clock (Unix ns) at t0."""
    sem = asyncio.Semaphore(run.max_concurrency) if run.max_concurrency else None
    t0_ns = time.perf_counter_ns()
    if epoch is not None:
        epoch.append(time.time_ns() - (time.perf_counter_ns() - t0_ns))
    tasks = []
    for spec, rec in zip(specs, records):
        delay = spec.scheduled_s - (time.perf_counter_ns() - t0_ns) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_one(run, url, model, spec, rec, t0_ns, sem, tokenizer)))
    await asyncio.gather(*tasks)
    return t0_ns, (time.perf_counter_ns() - t0_ns) / 1e9


def server_ids(records: Sequence[dict[str, Any]]) -> dict[int, int]:
    """The server's request ids (the number ending a response id, ``cmpl-12``: perfscope serve's) -> the
    client's; responses whose id ends in no number (vLLM's, SGLang's hex ids) are left out."""
    out: dict[int, int] = {}
    for rec in records:
        tail = str(rec.get("response_id") or "").rpartition("-")[2]
        if tail.isascii() and tail.isdigit() and len(tail) < 19:
            out[int(tail)] = int(rec["request_id"])
    return out


def with_scheduler_times(requests: pd.DataFrame, scheduler: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with the server scheduler's ``considered_s`` and ``admitted_s`` (on the client's clock)
    where its records name the request (perfscope serve under ``--profile``)."""
    if not len(scheduler):
        return requests
    key = ["run", "request_id"]
    s = scheduler.drop_duplicates(key).set_index(key)
    idx = pd.MultiIndex.from_arrays([requests["run"], requests["request_id"]])
    out = requests.copy()
    for col in ("considered_s", "admitted_s"):
        got = s[col].reindex(idx).to_numpy(dtype=float, na_value=np.nan)
        old = out[col].to_numpy(dtype=float, na_value=np.nan) if col in out else np.full(len(out), np.nan)
        out[col] = np.where(np.isfinite(got), got, old)
    return out


def request_frame(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The ``requests`` table: the engine load test's columns plus the endpoint's (see the module doc)."""
    df = pd.DataFrame(list(records))
    df["prompt_tokens"] = pd.array(df["prompt_tokens"].tolist(), dtype="Int64")  # missing where not counted
    ok = df["status"] == "ok"
    first, end, arrival = df["first_token_s"].astype(float), df["end_s"].astype(float), df["arrival_s"].astype(float)
    n = df["output_tokens"].astype(float)
    df["ttft_s"] = np.where(ok, first - arrival, np.nan)
    df["e2e_s"] = np.where(ok, end - arrival, np.nan)
    df["tpot_s"] = np.where(ok & (n > 1), (end - first) / np.maximum(n - 1, 1), np.nan)
    gaps = [np.diff(json.loads(t)) for t in df["token_times_s"]]
    df["itl_mean_s"] = [float(g.mean()) if len(g) and o else math.nan for g, o in zip(gaps, ok)]
    df["itl_p99_s"] = [float(np.percentile(g, 99)) if len(g) and o else math.nan for g, o in zip(gaps, ok)]
    df["dispatch_delay_s"] = arrival - df["scheduled_s"].astype(float)
    df["admitted_s"] = math.nan  # known to the server only
    return df


# ---------------------------------------------------------------- the run
async def _models(url: Url, api_key: str | None) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:  # under the endpoint-models policy: 30 s for the whole answer, no redirect followed
        status, body = await request_json(url, "GET", url.join("models"), headers=headers)
    except HttpError as exc:  # a redirect
        raise EndpointError(f"{url}/models answered HTTP {exc.status}: {exc.message}",
                            hint="give the API's final base URL as --endpoint") from None
    except (ConnectionError, OSError, socket.gaierror) as exc:
        raise EndpointError(f"cannot connect to {url}: {exc.strerror or exc}",
                            hint="start the server, or check --endpoint") from None
    except (TimeoutError, BrokenStream) as exc:
        raise EndpointError(f"{url}/models gave no answer ({exc or 'timed out'})", hint="check --endpoint") from None
    if status != 200 or not isinstance(body, dict):
        raise EndpointError(f"{url}/models answered HTTP {status}, not an OpenAI model list",
                            hint="--endpoint should be the API's base URL, e.g. http://127.0.0.1:8000/v1")
    return [m for m in body.get("data") or [] if isinstance(m, dict) and m.get("id") is not None]


def _default_tokenizer(model: str) -> TextTokenizer | None:
    from perfscope.engine.gguf_model import is_gguf_name

    if is_gguf_name(model) or (Path(model).expanduser() / "tokenizer.json").is_file():
        try:
            return load_tokenizer(model)
        except PerfscopeError:
            return None
    return None


def run_endpoint_loadtest(run: EndpointRun, *, progress: Progress | None = None) -> Report:
    """Run the load test against ``run.endpoint`` at each rate and return one Report (not saved).

    Ctrl-C stops the sending: requests in flight are counted ``cancelled``, the unsent ones
    ``not_sent``, and the report (marked partial) holds every request.
    """
    run.check()
    say = progress or (lambda _: None)
    url = parse_endpoint(run.endpoint)
    say(f"asking {url} for its models")
    models = asyncio.run(_models(url, run.api_key))
    model = run.model or (str(models[0]["id"]) if models else None)
    if model is None:
        raise EndpointError(f"{url}/models lists no model", hint="name it with --model NAME")
    info = next((m for m in models if str(m["id"]) == model), {})
    vocab = info.get("vocab_size") if isinstance(info.get("vocab_size"), int) else None
    tokenizer = load_tokenizer(run.tokenizer) if run.tokenizer else _default_tokenizer(model)
    rates: list[float | None] = [None] if run.arrivals else list(run.rates)
    workloads = [build_requests(run, r, tokenizer, vocab) for r in rates]
    frames, runs_meta, warnings = [], [], []
    gauge_frames: list[pd.DataFrame] = []
    partial = False
    profile: dict[str, Any] | None = None
    for rate, specs in zip(rates, workloads):
        label = "arrivals" if rate is None else f"rate={rate:g}"
        records = [_new_record(s, tokenizer) for s in specs]
        say(f"sending {len(specs)} requests ({label})")
        session = None
        if run.profile:
            from .server_profile import ProfileSession

            session = ProfileSession(url, run.api_key, run.profile_dir)
            warnings += session.start()
        wall = math.nan
        epoch: list[int] = []
        scraper = start_scraper(run, url)
        try:
            t0_ns, wall = asyncio.run(_run_rate(run, url, model, specs, records, tokenizer, epoch))
        except KeyboardInterrupt:
            partial = True
            t0_ns = 0
            for rec in records:
                if rec["status"] == "in_flight":
                    rec["status"], rec["error"] = "cancelled", "the load test was interrupted (Ctrl-C)"
                elif rec["status"] == "not_sent":
                    rec["error"] = "the load test was interrupted (Ctrl-C) before its send time"
        if scraper is not None:
            gauge_frames.append(scraper_rows(scraper, t0_ns, label, warnings))
        if session is not None and not partial:
            profile = session.stop(t0_ns, label, server_ids(records))
            warnings += profile.get("warnings", [])
        df = request_frame(records).assign(run=label, rate_per_s=math.nan if rate is None else rate)
        frames.append(df)
        ends = df["end_s"].astype(float)
        duration = float(ends.max()) if ends.notna().any() else math.nan
        offered = len(specs) / specs[-1].scheduled_s if specs[-1].scheduled_s > 0 else math.nan
        runs_meta.append({"run": label, "rate_per_s": rate, "offered_rate_per_s": offered, "requests": len(specs),
                          "duration_s": duration, "wall_s": wall, "t0_perf_counter_ns": t0_ns,
                          # the run's start on the wall clock: a framework's trace (Unix-time ns) meets the requests
                          "t0_epoch_ns": epoch[0] if epoch else None})
        if partial:
            break
    requests = pd.concat(frames, ignore_index=True)
    if profile and profile.get("scheduler") is not None:
        requests = with_scheduler_times(requests, profile["scheduler"])
    report = _report(run, url, model, requests, runs_meta, warnings, partial, tokenizer, profile)
    return with_gauges(report, gauge_frames, run)


def _report(run: EndpointRun, url: Url, model: str, requests: pd.DataFrame, runs_meta: list[dict[str, Any]],
            warnings: list[str], partial: bool, tokenizer: TextTokenizer | None,
            profile: dict[str, Any] | None) -> Report:
    from perfscope.analysis.readers.finish import Imported, finish
    from perfscope.analysis.summaries.loadtest import knee, load_metrics

    metrics = []
    for meta in runs_meta:
        req = requests[requests["run"] == meta["run"]]
        metrics.append({"run": meta["run"], "rate_per_s": meta["rate_per_s"],
                        **load_metrics(req, run.slo, meta["duration_s"])})
    swept = [m for m in metrics if m["rate_per_s"] is not None]
    knee_rate = knee(np.asarray([m["rate_per_s"] for m in swept], dtype=float),
                     np.asarray([m["e2e_s"]["p99"] for m in swept], dtype=float)) if len(swept) > 1 else None
    sources = requests["token_source"].dropna().value_counts().to_dict()
    ok = requests[requests["status"] == "ok"]
    several = int((ok["output_tokens"] > ok["chunks"]).sum())
    if sources.get("tokenizer"):
        warnings.append(f"{sources['tokenizer']} request(s) without usage in the stream: output tokens counted "
                        f"with the {tokenizer.name if tokenizer else '?'} tokenizer")
    if sources.get("chunks"):
        warnings.append(f"{sources['chunks']} request(s) without usage nor a tokenizer: output tokens are the "
                        "streamed chunks (give --tokenizer to count them)")
    uncounted = int(requests["prompt_tokens"].isna().sum())
    if uncounted:
        warnings.append(f"{uncounted} request(s) without a prompt token count (text prompts, no usage in the stream, "
                        "no tokenizer): prompt_tokens missing, left out of the totals (give --tokenizer to count them)")
    if several:
        warnings.append(f"{several} request(s) streamed chunks of several tokens: ITL is the gap between chunks "
                        "(vLLM's definition); TPOT divides by the token count")
    no_done = int((ok["done_marker"] == False).sum())
    if no_done:
        warnings.append(f"{no_done} stream(s) ended cleanly after their finish_reason without data: [DONE]: "
                        "counted complete")
    failed = requests[requests["status"] != "ok"]
    if len(failed):
        kinds = failed["status"].value_counts().to_dict()
        warnings.append(f"{len(failed)} of {len(requests)} request(s) failed ("
                        + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
                        + "): counted, kept in requests.parquet, out of the latencies")
    params = {
        **{k: v for k, v in asdict(run).items() if k != "api_key"}, "rates": list(run.rates), "model": model,
        "endpoint": str(url),
        "loadtest": {"runs": runs_meta, "slo": dict(run.slo), "knee_rate_per_s": knee_rate, "kv_dtype": None,
                     "kv_logit_error": None, "policy": None, "metrics": metrics,
                     "endpoint": {"url": str(url), "api": run.api, "model": model, "max_concurrency": run.max_concurrency,
                                  "burstiness": run.burstiness, "timeout_s": run.timeout_s,
                                  "tokenizer": tokenizer.name if tokenizer else None,
                                  "token_counts": {str(k): int(v) for k, v in sources.items()},
                                  "requests_with_multi_token_chunks": several},
                     "server_profile": {k: v for k, v in (profile or {}).items() if k not in ("tables", "warnings")} or None},
    }
    name = f"loadtest-endpoint-{model.replace('/', '_')}-" + (
        "arrivals" if run.arrivals else "r" + "_".join(f"{r:g}" for r in run.rates))
    tables: dict[str, pd.DataFrame] = {"requests": requests}
    if profile and profile.get("tables"):
        from perfscope.analysis.summaries.server_timeline import ttft_steps

        tables.update(profile["tables"])
        if "steps" in tables:
            tables["requests"] = ttft_steps(requests, tables["steps"], tables.get("request_steps"))
    manifest = {
        "name": name,
        "source": source_info("endpoint-loadtest", str(url), "perfscope-http-client"),
        "command": redact_argv(sys.argv), "params": params, "warnings": sorted(set(warnings)), "partial": partial,
    }
    if not (profile and profile.get("tables")):
        manifest["unavailable_metrics"] = ["kernels and steps (the server's: run with --profile against a "
                                           "server offering /start_profile)"]
    return finish(Imported(tables, manifest, None, origin=str(url)))


def cli_payload(report: Report) -> dict[str, Any]:
    """The ``--json`` output: one run's metrics flat; a sweep's as ``runs`` with the knee."""
    from perfscope.analysis.summaries.tails import tails_payload

    lt = report.params["loadtest"]
    extra = {"endpoint": lt["endpoint"], "partial": bool(report.manifest.get("partial")),
             "tails": tails_payload(report)}
    if lt.get("server_profile"):
        extra["server_profile"] = lt["server_profile"]
    return metrics_payload(lt, extra)


__all__ = ["EndpointError", "EndpointRun", "Interrupted", "Prompt", "StreamEvent", "build_requests", "check_event",
           "cli_payload", "load_tokenizer",
           "parse_endpoint", "read_dataset", "request_frame", "run_endpoint_loadtest"]
