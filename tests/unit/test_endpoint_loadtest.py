"""``perfscope loadtest --endpoint``: workload, metrics, and every failure kind against a real
fault-injecting HTTP server on 127.0.0.1 (an OS-assigned port, bounded requests and time).

The fault server streams OpenAI completions whose behaviour the prompt names: ``ok``, ``e500``
(an HTTP 500 with the OpenAI error body), ``break`` (the connection dropped mid-stream),
``empty`` (no text), ``slow`` (longer than the client's --timeout), ``multi`` (two tokens a
chunk: usage says 8 tokens for 4 chunks), ``nousage`` (no usage chunk); each of
:data:`MALFORMED` sends two good chunks and then that event; ``huge_event`` a 20 MB event,
``endless_line`` 64 MB without a newline, ``cut_line`` 3 MB without a newline and then closes.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.summaries.loadtest import load_metrics
from perfscope.cli import main
from perfscope.errors import InputFormatError, UsageError
from perfscope.sessions.endpoint import (
    EndpointRun,
    Prompt,
    build_requests,
    read_dataset,
    request_body,
)
from perfscope.sessions.loadtest import LoadRun, build_workload

KINDS = ["ok", "e500", "break", "empty", "slow", "multi", "nousage"]
CHUNK_GAP_S = 0.004
MALFORMED = {  # kind: the event's data, as a server could send it
    "choices_str": b'{"choices": "nope"}',
    "list": b"[1, 2, 3]",
    "null": b"null",
    "choice_null": b'{"choices": [null]}',
    "text_int": b'{"choices": [{"index": 0, "text": 5, "finish_reason": null}]}',
    "usage_str": b'{"choices": [], "usage": "lots"}',
    "usage_huge": b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1e30, "total_tokens": 1e30}}',
    "usage_negative": b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": -3, "total_tokens": 0}}',
    "reason_int": b'{"choices": [{"index": 0, "text": "", "finish_reason": 7}]}',
    "not_json": b"{oops",
}


class _Fault(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        return None

    def _json(self, status: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fault", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "no route", "type": "NotFoundError", "code": 404}})

    def do_POST(self) -> None:
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the timeout cases): nothing left to send it

    def _post(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        kind = body["prompt"]
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        if kind == "e500":
            self._json(500, {"error": {"message": "injected failure", "type": "InternalServerError", "code": 500}})
            return
        if kind == "slow":
            time.sleep(2.5)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes

        def event(obj: object) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        if kind in ("huge_event", "endless_line", "cut_line"):
            event({"choices": [{"index": 0, "text": " hello", "finish_reason": None}]})
            if kind == "huge_event":
                self.wfile.write(b'data: {"choices": [{"index": 0, "text": "' + b"A" * (20 << 20) + b'"}]}\n\n')
            else:
                size = 64 << 20 if kind == "endless_line" else 3 << 20
                for _ in range(size >> 20):
                    self.wfile.write(b"data: " + b"A" * (1 << 20))
            self.wfile.flush()
            return  # HTTP/1.0: closing the connection ends the body
        pieces = {"empty": [], "multi": [" a b"] * 4}.get(kind, [" hello"] * 4)
        for i, p in enumerate(pieces):
            time.sleep(CHUNK_GAP_S)
            event({"choices": [{"index": 0, "text": p, "finish_reason": None}]})
            if kind == "break" and i == 1:
                self.wfile.flush()
                self.connection.shutdown(2)
                return
            if kind in MALFORMED and i == 1:
                self.wfile.write(b"data: " + MALFORMED[kind] + b"\n\n")
        event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        if kind == "nodone":  # transformers serve's completions: usage in the last choice, no [DONE]
            return
        if kind != "nousage":
            n = 8 if kind == "multi" else len(pieces)
            event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}})
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def fault_server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fault)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


def _dataset(tmp_path: Path, kinds: list[str]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": k}) + "\n" for k in kinds), encoding="utf-8")
    return path


def _independent(req: pd.DataFrame) -> dict:
    """The run's metrics recomputed with numpy from requests.parquet alone (vLLM's definitions)."""
    ok = req[req["status"] == "ok"]
    times = [np.asarray(json.loads(t), dtype=float) for t in ok["token_times_s"]]
    sent = ok["arrival_s"].to_numpy(dtype=float)
    first = np.array([t[0] for t in times])
    last = np.array([t[-1] for t in times])
    n = ok["output_tokens"].to_numpy(dtype=float)
    duration = req["end_s"].max()

    def s(v: np.ndarray) -> dict:
        return {"p50": np.percentile(v, 50), "p90": np.percentile(v, 90), "p99": np.percentile(v, 99), "mean": v.mean()}

    return {"requests": len(ok), "request_throughput_per_s": len(ok) / duration,
            "output_tokens_per_s": n.sum() / duration, "ttft_s": s(first - sent), "e2e_s": s(last - sent),
            "tpot_s": s(((last - first) / (n - 1))[n > 1]),
            "itl_s": s(np.concatenate([np.diff(t) for t in times if len(t) > 1])),
            "scheduled_ttft_s": s(first - ok["scheduled_s"].to_numpy(dtype=float))}


@pytest.mark.smollm2  # its tokenizer counts the tokens of the stream that sends no usage
def test_every_failure_is_kept_and_counted_by_kind(tmp_path: Path, fault_server: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    data = _dataset(tmp_path, KINDS)
    out = tmp_path / "lt"
    code = main(["loadtest", "--endpoint", fault_server, "--dataset", str(data), "--rate", "40", "--requests", "14",
                 "--timeout", "1", "--json", "--no-html", "--out", str(out), "--tokenizer", "smollm2-135m"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    payload = json.loads(captured.out)
    assert payload["requests_sent"] == 14
    assert payload["failures"] == {"broken_stream": 2, "empty_output": 2, "http_error": 2, "timeout": 2}
    assert payload["requests"] == 6 and payload["failed_requests"] == 8
    req = pd.read_parquet(Path(payload["report_path"]) / "requests.parquet")
    assert len(req) == 14  # nothing dropped
    by_kind = dict(zip(req["request_id"] % len(KINDS), req["status"]))
    assert by_kind == {0: "ok", 1: "http_error", 2: "broken_stream", 3: "empty_output", 4: "timeout", 5: "ok", 6: "ok"}
    e500 = req[req["status"] == "http_error"]
    assert (e500["http_status"] == 500).all() and (e500["error"] == "injected failure").all()
    assert req.loc[req["status"] != "ok", "ttft_s"].isna().all()  # failures stay out of the latencies
    multi = req[req["request_id"] % len(KINDS) == 5]
    assert (multi["output_tokens"] == 8).all() and (multi["chunks"] == 4).all()
    assert (multi["token_source"] == "usage").all()
    nousage = req[req["request_id"] % len(KINDS) == 6]
    from perfscope.sessions.endpoint import load_tokenizer

    assert (nousage["token_source"] == "tokenizer").all()
    assert (nousage["output_tokens"] == len(load_tokenizer("smollm2-135m").encode(" hello" * 4))).all()
    expected = _independent(req)
    for key in ("requests", "request_throughput_per_s", "output_tokens_per_s"):
        assert payload[key] == pytest.approx(expected[key], rel=1e-9), key
    for key in ("ttft_s", "e2e_s", "tpot_s", "itl_s", "scheduled_ttft_s"):
        for stat in ("p50", "p90", "p99", "mean"):
            assert payload[key][stat] == pytest.approx(expected[key][stat], rel=1e-9, abs=1e-12), (key, stat)
    # ITL pools the gaps between chunks: the server sleeps CHUNK_GAP_S between them
    assert payload["itl_s"]["p50"] >= CHUNK_GAP_S * 0.9
    manifest = json.loads((Path(payload["report_path"]) / "manifest.json").read_text())
    assert any("8 of 14 request(s) failed" in w for w in manifest["warnings"])
    assert any("chunks of several tokens" in w for w in manifest["warnings"])


def _bad_run(tmp_path: Path, fault_server: str, kind: str, capsys: pytest.CaptureFixture[str],
             *extra: str) -> pd.DataFrame:
    data = _dataset(tmp_path, ["ok", kind])
    code = main(["loadtest", "--endpoint", fault_server, "--dataset", str(data), "--rate", "50", "--requests", "4",
                 "--timeout", "60", "--json", "--no-html", "--out", str(tmp_path / "lt"), *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err
    payload = json.loads(captured.out)
    req = pd.read_parquet(Path(payload["report_path"]) / "requests.parquet")
    assert len(req) == 4 and payload["requests_sent"] == 4
    assert (req.loc[req["request_id"] % 2 == 0, "status"] == "ok").all()  # the run went on
    assert payload["requests"] == 2
    return req[req["request_id"] % 2 == 1]


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_event_is_a_bad_response_and_the_run_goes_on(
        kind: str, tmp_path: Path, fault_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _bad_run(tmp_path, fault_server, kind, capsys)
    assert (bad["status"] == "bad_response").all(), bad[["status", "error"]]
    quoted = MALFORMED[kind].decode()[:40]
    assert all(quoted in e for e in bad["error"]), bad["error"].tolist()  # the event is quoted
    assert bad["ttft_s"].isna().all() and (bad["output_tokens"] >= 0).all()


@pytest.mark.parametrize("kind", ["huge_event", "endless_line"])
def test_a_line_over_the_limit_is_a_bad_response(kind: str, tmp_path: Path, fault_server: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.sessions.http_stream import MAX_SSE_LINE

    bad = _bad_run(tmp_path, fault_server, kind, capsys)
    assert (bad["status"] == "bad_response").all(), bad[["status", "error"]]
    assert all(f"over {MAX_SSE_LINE} bytes" in e or f"over the limit of {MAX_SSE_LINE}" in e for e in bad["error"])
    assert all(len(e) < 1000 for e in bad["error"])  # quoted, cut short


def test_a_server_that_closes_inside_a_line_is_noticed(tmp_path: Path, fault_server: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    bad = _bad_run(tmp_path, fault_server, "cut_line", capsys)
    assert (bad["status"] == "broken_stream").all(), bad[["status", "error"]]  # not a --timeout 60
    assert all("ended inside an event" in e for e in bad["error"])


def test_the_sse_parser_scans_each_byte_once() -> None:
    """Events of any size, fed in any pieces: every byte is scanned once, and a line over the limit
    is refused before the rest of it is read."""
    from perfscope.sessions.http_stream import BadResponse, SseParser

    big = b"data: " + b"x" * (3 << 20) + b"\n\n"
    small = b"data: {}\r\n\r\n: a comment\nevent: e\ndata: a\ndata: b\n\n"
    stream = small + big + small * 1000 + big
    for piece in (1 << 10, 65536, 7):
        parser = SseParser(limit=4 << 20)
        events = []
        feed = stream if piece > 1000 else stream[: 200_000]
        for i in range(0, len(feed), piece):
            events += parser.feed(feed[i:i + piece])
        assert parser.scanned == len(feed)
        if piece > 1000:
            assert events == ["{}", "a\nb", "x" * (3 << 20), *(["{}", "a\nb"] * 1000), "x" * (3 << 20)]
            assert not parser.pending()
    parser = SseParser(limit=1 << 20)
    fed = 0
    with pytest.raises(BadResponse, match=f"over {1 << 20} bytes"):
        for _ in range(64 << 4):
            parser.feed(b"A" * 65536)
            fed += 65536
    assert fed <= (1 << 20) + 65536 and parser.scanned <= fed + 65536


def test_event_schema_check() -> None:
    from perfscope.sessions.endpoint import StreamEvent, check_event
    from perfscope.sessions.http_stream import BadResponse, HttpError

    ok = check_event('{"choices": [{"text": " a", "finish_reason": null}], "usage": null}', "completions")
    assert ok == StreamEvent(" a", None, None)
    chat = check_event('{"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]}', "chat")
    assert chat == StreamEvent("b", "stop", None)
    usage = check_event('{"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}', "completions")
    assert usage.usage == {"prompt_tokens": 2, "completion_tokens": 5}
    with pytest.raises(HttpError, match="boom"):
        check_event('{"error": {"message": "boom", "code": 503}}', "completions")
    for data in ('{"usage": {"completion_tokens": true}}', '{"usage": {"completion_tokens": 2147483648}}',
                 '{"choices": [{"text": ["x"]}]}', '"text"'):
        with pytest.raises(BadResponse, match="in the event"):
            check_event(data, "completions")
    with pytest.raises(BadResponse, match="delta must be an object"):
        check_event('{"choices": [{"index": 0, "delta": "x"}]}', "chat")


def test_tokens_counted_from_chunks_without_usage_nor_tokenizer(tmp_path: Path, fault_server: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    data = _dataset(tmp_path, ["nousage"])
    code = main(["loadtest", "--endpoint", fault_server, "--dataset", str(data), "--rate", "50", "--requests", "3",
                 "--json", "--no-html", "--out", str(tmp_path / "lt")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    payload = json.loads(captured.out)
    assert payload["endpoint"]["token_counts"] == {"chunks": 3}
    assert payload["output_tokens"] == 12


def test_a_prompt_without_usage_nor_tokenizer_has_a_missing_count_left_out_of_the_totals(
        tmp_path: Path, fault_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Text prompts, no --tokenizer: the ``ok`` requests' counts come from the server's usage (3
    tokens each), the ``nousage`` ones' from nowhere: missing (null), never -1 or 0, and the totals
    sum the counted ones and say how many were not."""
    from perfscope.analysis.summaries.serving import request_summary
    from perfscope.format import by_column, dumps
    from perfscope.report import Report
    from perfscope.text_report import render_text

    data = _dataset(tmp_path, ["ok", "nousage"])
    code = main(["loadtest", "--endpoint", fault_server, "--dataset", str(data), "--rate", "50", "--requests", "6",
                 "--json", "--no-html", "--out", str(tmp_path / "lt")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    payload = json.loads(captured.out)
    folder = Path(payload["report_path"])
    raw = pd.read_parquet(folder / "requests.parquet")
    assert raw["prompt_tokens"].dtype == "Int64" and (raw["status"] == "ok").all()
    nousage = raw["request_id"] % 2 == 1
    assert raw.loc[nousage, "prompt_tokens"].isna().all() and (raw.loc[~nousage, "prompt_tokens"] == 3).all()
    assert payload["prompt_tokens"] == 9 and payload["prompt_tokens_unknown"] == 3
    report = Report.load(folder)
    assert report.requests["prompt_tokens"].isna().sum() == 3
    assert any("3 request(s) without a prompt token count" in w for w in report.warnings)
    s = request_summary(report)
    assert s["prompt_tokens"] == 9 and s["prompt_tokens_unknown"] == 3 and s["requests"] == 6
    assert "requests: 6, 9 prompt + 24 output tokens (prompt not counted for 3)" in render_text(report)
    missing = report.requests.loc[report.requests["request_id"] == 1, "prompt_tokens"].iloc[0]
    assert by_column("prompt_tokens", missing) == "n/a" and dumps({"p": missing}, indent=None) == '{"p": null}'
    # none counted: the total is missing too
    data = _dataset(tmp_path, ["nousage"])
    assert main(["loadtest", "--endpoint", fault_server, "--dataset", str(data), "--rate", "50", "--requests", "2",
                 "--json", "--no-html", "--out", str(tmp_path / "lt2")]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["prompt_tokens"] is None and payload["prompt_tokens_unknown"] == 2
    report = Report.load(payload["report_path"])
    assert math.isnan(request_summary(report)["prompt_tokens"])
    assert "requests: 2, n/a prompt + 8 output tokens" in render_text(report)
    # a report written before counts could be missing holds -1 there: it loads as missing
    old = raw.assign(prompt_tokens=raw["prompt_tokens"].fillna(-1).astype("int64"))
    old.to_parquet(folder / "requests.parquet", index=False)
    legacy = Report.load(folder)
    assert legacy.requests["prompt_tokens"].isna().sum() == 3 and request_summary(legacy)["prompt_tokens"] == 9


def test_a_clean_end_after_the_finish_reason_without_done_is_complete(
        tmp_path: Path, fault_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = _dataset(tmp_path, ["nodone", "break"])
    code = main(["loadtest", "--endpoint", fault_server, "--dataset", str(data), "--rate", "50", "--requests", "4",
                 "--json", "--no-html", "--out", str(tmp_path / "lt")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    payload = json.loads(captured.out)
    assert payload["requests"] == 2 and payload["failures"] == {"broken_stream": 2}
    req = pd.read_parquet(Path(payload["report_path"]) / "requests.parquet")
    assert req.loc[req["status"] == "ok", "done_marker"].eq(False).all()
    manifest = json.loads((Path(payload["report_path"]) / "manifest.json").read_text())
    assert any("without data: [DONE]" in w for w in manifest["warnings"])


def test_wrong_url_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "lt"
    code = main(["loadtest", "--endpoint", f"http://127.0.0.1:{port}/v1", "--requests", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 6
    assert len(err) == 1 and err[0].startswith("perfscope: error: cannot connect to http://127.0.0.1:")
    assert not out.with_suffix(".perfscope").exists() and not out.exists()


def test_wrong_path_says_what_the_url_should_be(fault_server: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["loadtest", "--endpoint", fault_server.replace("/v1", "/v2"), "--requests", "2",
                 "--out", str(tmp_path / "lt")])
    err = capsys.readouterr().err
    assert code == 6 and "HTTP 404" in err and "base URL" in err


def test_same_arrivals_and_lengths_as_the_engine_load_test() -> None:
    engine = build_workload(LoadRun(rates=(7.0,), requests=40, prompt_len="uniform:4,20", output_len="normal:9,3",
                                    seed=3), 7.0, 512, 4096)
    run = EndpointRun("http://127.0.0.1:1/v1", rates=(7.0,), requests=40, prompt_len="uniform:4,20",
                      output_len="normal:9,3", seed=3)
    specs = build_requests(run, 7.0, None, vocab_size=512)
    assert [s.scheduled_s for s in specs] == [r.arrival_s for r in engine]
    assert [s.max_tokens for s in specs] == [r.max_output_tokens for r in engine]
    assert [s.prompt.ids for s in specs] == [r.prompt for r in engine]  # token ids when no tokenizer
    body = request_body(run, "m", specs[0])
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["prompt"] == list(engine[0].prompt) and body["max_tokens"] == engine[0].max_output_tokens


def test_burstiness_gamma_gaps() -> None:
    rate = 5.0
    calm = build_requests(EndpointRun("http://x/v1", requests=4000, burstiness=4.0), rate, None)
    bursty = build_requests(EndpointRun("http://x/v1", requests=4000, burstiness=0.25), rate, None)
    for specs, shape in ((calm, 4.0), (bursty, 0.25)):
        gaps = np.diff([0.0] + [s.scheduled_s for s in specs])
        assert gaps.mean() == pytest.approx(1 / rate, rel=0.1)
        # a gamma of shape k has a coefficient of variation 1/sqrt(k)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.15)
    with pytest.raises(UsageError, match="burstiness"):
        EndpointRun("http://x/v1", burstiness=0).check()


def test_read_dataset_formats(tmp_path: Path) -> None:
    jl = tmp_path / "a.jsonl"
    jl.write_text('{"prompt": "hi", "max_tokens": 5}\n\n{"messages": [{"role": "user", "content": "yo"}]}\n'
                  '{"prompt": [1, 2, 3]}\n', encoding="utf-8")
    assert read_dataset(jl) == [Prompt(text="hi", output_len=5),
                                Prompt(messages=({"role": "user", "content": "yo"},)), Prompt(ids=(1, 2, 3))]
    txt = tmp_path / "b.txt"
    txt.write_text("one\n\ntwo\n", encoding="utf-8")
    assert read_dataset(txt) == [Prompt(text="one"), Prompt(text="two")]
    js = tmp_path / "c.json"
    js.write_text('["x", {"text": "y"}]', encoding="utf-8")
    assert read_dataset(js) == [Prompt(text="x"), Prompt(text="y")]
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n', encoding="utf-8")
    with pytest.raises(InputFormatError, match="line 2"):
        read_dataset(bad)
    empty = tmp_path / "e.txt"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match="no prompts"):
        read_dataset(empty)


def test_chat_needs_text() -> None:
    with pytest.raises(UsageError, match="text prompts"):
        build_requests(EndpointRun("http://x/v1", api="chat", requests=2), 1.0, None)


def test_load_metrics_counts_failures_and_scheduled_latency() -> None:
    req = pd.DataFrame({
        "status": ["ok", "ok", "timeout", "http_error"], "scheduled_s": [0.0, 1.0, 2.0, 3.0],
        "arrival_s": [0.5, 1.0, 2.0, 3.1], "first_token_s": [1.0, 1.2, np.nan, np.nan],
        "end_s": [2.0, 1.6, 4.0, 3.2], "ttft_s": [0.5, 0.2, np.nan, np.nan], "e2e_s": [1.5, 0.6, np.nan, np.nan],
        "output_tokens": [3, 5, 0, 0], "prompt_tokens": [4, 4, 4, 4],
        "token_times_s": ["[1.0, 1.5, 2.0]", "[1.2, 1.3, 1.4, 1.5, 1.6]", "[]", "[]"]})
    m = load_metrics(req, {"ttft_s": 0.3}, 4.0)
    assert m["requests"] == 2 and m["requests_sent"] == 4
    assert m["failures"] == {"http_error": 1, "timeout": 1}
    assert m["ttft_s"]["mean"] == pytest.approx(0.35)
    assert m["scheduled_ttft_s"]["p50"] == pytest.approx((1.0 + 0.2) / 2)  # 1.0 - 0 and 1.2 - 1.0
    assert m["dispatch_delay_s"]["mean"] == pytest.approx((0.5 + 0 + 0 + 0.1) / 4)
    assert m["good_requests"] == 1 and m["goodput_per_s"] == pytest.approx(0.25)
    assert m["request_throughput_per_s"] == pytest.approx(0.5)


def test_endpoint_options_need_an_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadtest", "--dataset", "prompts.jsonl", "--max-concurrency", "2"]) == 2
    assert "--dataset, --max-concurrency apply with --endpoint URL only" in capsys.readouterr().err
