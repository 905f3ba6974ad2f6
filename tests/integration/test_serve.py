"""``perfscope serve`` end to end, and ``perfscope loadtest --endpoint`` against it.

Every server here is a subprocess bound to 127.0.0.1 on an OS-assigned port (``--port 0``; the
port is read from its first line), with bounded requests, and stopped with Ctrl-C (SIGINT) at the
end: a clean exit (status 0) is part of each test.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

PERFSCOPE = str(Path(sys.executable).parent / "perfscope")
START_TIMEOUT_S = 120


_SIGINT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execv(sys.argv[1], sys.argv[1:])")


def _stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C a server, and kill it if it has not stopped within 30 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _cmd(*args: str) -> list[str]:
    """``args`` run with Ctrl-C's default action, even when this test runs in a background job (where
    SIGINT is inherited ignored): the exec keeps it."""
    return [sys.executable, "-c", _SIGINT_DEFAULT, *args]


def _readline(stream: object, proc: subprocess.Popen[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            return stream.readline()  # type: ignore[attr-defined]
        if proc.poll() is not None:
            break
    raise AssertionError(f"no line from the server within {timeout} s (exit {proc.poll()})")


@contextmanager
def served(*args: str, cwd: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(_cmd(PERFSCOPE, "serve", "--port", "0", *args), cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = _readline(proc.stdout, proc, START_TIMEOUT_S)
        assert line.startswith("serving ") and "http://127.0.0.1:" in line, line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        yield url, proc
    finally:
        if proc.poll() is None:
            _stop(proc)


def _stopped_cleanly(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "perfscope serve: stopped" in out
    assert "Traceback" not in err and "CancelledError" not in err


def _post(url: str, body: object, raw: bytes | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=raw if raw is not None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _loadtest(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PERFSCOPE, "loadtest", *args], check=False, cwd=cwd, text=True, capture_output=True, timeout=timeout)


def _recompute(req: pd.DataFrame) -> dict:
    ok = req[req["status"] == "ok"]
    times = [np.asarray(json.loads(t), dtype=float) for t in ok["token_times_s"]]
    first = np.array([t[0] for t in times])
    last = np.array([t[-1] for t in times])
    sent = ok["arrival_s"].to_numpy(dtype=float)
    n = ok["output_tokens"].to_numpy(dtype=float)
    duration = req["end_s"].max()
    tpot = ((last - first) / (n - 1))[n > 1]

    def s(v: np.ndarray) -> dict:
        return {"p50": np.percentile(v, 50), "p90": np.percentile(v, 90), "p99": np.percentile(v, 99), "mean": v.mean()}

    tpot_all = np.where(n > 1, (last - first) / np.maximum(n - 1, 1), 0.0)
    good = ((first - sent) <= 0.5) & (tpot_all <= 0.05)
    return {"requests": len(ok), "request_throughput_per_s": len(ok) / duration, "output_tokens_per_s": n.sum() / duration,
            "ttft_s": s(first - sent), "e2e_s": s(last - sent), "tpot_s": s(tpot),
            "itl_s": s(np.concatenate([np.diff(t) for t in times if len(t) > 1])),
            "goodput_per_s": good.sum() / duration}


def test_loadtest_against_perfscope_serve(tmp_path: Path) -> None:
    with served("--model", "tiny", "--max-batch", "8", cwd=tmp_path) as (url, proc):
        res = _loadtest("--endpoint", url, "--rate", "20", "--requests", "30", "--output-len", "uniform:4,24",
                        "--slo", "ttft=0.5,tpot=0.05", "--json", "--out", str(tmp_path / "lt"), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        payload = json.loads(res.stdout)
        _stopped_cleanly(proc)
    assert payload["requests"] == payload["requests_sent"] == 30 and payload["failures"] == {}
    assert payload["endpoint"]["token_counts"] == {"usage": 30}
    folder = Path(payload["report_path"])
    req = pd.read_parquet(folder / "requests.parquet")
    # the server honours max_tokens (no EOS for a random model): usage counts every token asked for
    assert (req["output_tokens"] == req["max_output_tokens"]).all()
    assert (req["chunks"] == req["output_tokens"]).all()  # one token a chunk
    expected = _recompute(req)
    for key in ("requests", "request_throughput_per_s", "output_tokens_per_s", "goodput_per_s"):
        assert payload[key] == pytest.approx(expected[key], rel=1e-9), key
    for key in ("ttft_s", "e2e_s", "tpot_s", "itl_s"):
        for stat in ("p50", "p90", "p99", "mean"):
            assert payload[key][stat] == pytest.approx(expected[key][stat], rel=1e-9, abs=1e-12), (key, stat)
    assert (folder / "report.html").is_file()
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert "loadtest-endpoint-tiny" in html


def test_serve_with_a_kv_policy(tmp_path: Path) -> None:
    """``--kv-policy``: a load test against the server completes; a bad policy stops it at once (exit 2)."""
    bad = subprocess.run([PERFSCOPE, "serve", "--model", "tiny", "--port", "0", "--kv-policy", "h2o:recent=3"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "h2o needs budget" in bad.stderr
    with served("--model", "tiny", "--kv-policy", "h2o:budget=16", cwd=tmp_path) as (url, proc):
        res = _loadtest("--endpoint", url, "--rate", "20", "--requests", "4", "--prompt-len", "40", "--output-len", "6",
                        "--json", "--out", str(tmp_path / "lt"), "--no-html", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        payload = json.loads(res.stdout)
        _stopped_cleanly(proc)
    assert payload["requests"] == 4 and payload["failures"] == {}


def test_openai_errors_and_models(tmp_path: Path) -> None:
    with served("--model", "tiny", "--max-model-len", "64", cwd=tmp_path) as (url, proc):
        with urllib.request.urlopen(url + "/models", timeout=30) as resp:
            models = json.loads(resp.read())
        assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 64
        status, body = _post(url + "/completions", {"prompt": [1, 2, 3], "max_tokens": 5})
        assert status == 200 and body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
        assert body["choices"][0]["finish_reason"] == "length" and len(body["choices"][0]["text"].split()) == 5
        cases = [
            ({"prompt": [1, 2], "max_tokens": 63}, 400, "maximum context length is 64"),
            ({"prompt": "hello"}, 400, "no tokenizer"),
            ({"prompt": [1, 99999]}, 400, "outside the vocabulary"),
            ({"prompt": [1], "max_tokens": 0}, 400, "max_tokens"),
            ({"prompt": [1], "model": "other"}, 404, "does not exist"),
            ({"prompt": [1], "n": 2}, 400, "n=1"),
        ]
        for payload, code, text in cases:
            status, body = _post(url + "/completions", payload)
            assert status == code and text in body["error"]["message"], (payload, body)
            assert set(body["error"]) == {"message", "type", "param", "code"}
        status, body = _post(url + "/completions", None, raw=b"{not json")
        assert status == 400 and "not valid JSON" in body["error"]["message"]
        status, body = _post(url + "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 400 and "no tokenizer" in body["error"]["message"]
        try:
            urllib.request.urlopen(url + "/completions", timeout=30)
        except urllib.error.HTTPError as exc:
            assert exc.code == 405 and "takes POST" in json.loads(exc.read())["error"]["message"]
        else:
            raise AssertionError("GET /v1/completions should be refused")
        _stopped_cleanly(proc)


@pytest.mark.smollm2
def test_smollm2_chat(tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
                            for q in ("What is the capital of France?", "Name a colour.")), encoding="utf-8")
    with served("--model", "smollm2-135m", "--max-model-len", "256", "--max-batch", "4", cwd=tmp_path) as (url, proc):
        status, body = _post(url + "/chat/completions", {
            "model": "smollm2-135m", "max_tokens": 24,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert status == 200, body
        assert "Paris" in body["choices"][0]["message"]["content"]
        assert body["choices"][0]["finish_reason"] == "stop"  # <|im_end|> ends the turn
        res = _loadtest("--endpoint", url, "--api", "chat", "--dataset", str(data), "--rate", "4", "--requests", "4",
                        "--output-len", "12", "--json", "--no-html", "--out", str(tmp_path / "lt"), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        _stopped_cleanly(proc)
    payload = json.loads(res.stdout)
    assert payload["requests"] == 4 and payload["endpoint"]["token_counts"] == {"usage": 4}
    assert payload["endpoint"]["tokenizer"] == "smollm2-135m"


def test_server_killed_mid_run_keeps_every_request(tmp_path: Path) -> None:
    import threading

    from perfscope.api import save_with_html
    from perfscope.sessions.endpoint import EndpointRun, run_endpoint_loadtest

    sending = threading.Event()
    result: dict = {}

    def progress(label: str) -> None:
        if label.startswith("sending"):
            sending.set()

    with served("--model", "tiny", "--max-batch", "4", cwd=tmp_path) as (url, proc):
        run = EndpointRun(url, rates=(10.0,), requests=60, output_len="48", timeout_s=30)
        worker = threading.Thread(target=lambda: result.update(report=run_endpoint_loadtest(run, progress=progress)))
        worker.start()
        assert sending.wait(60)
        time.sleep(2.0)  # about 20 requests sent, some in flight
        proc.kill()  # no clean shutdown: connections drop mid-stream
        proc.wait(30)
        worker.join(120)
    written = save_with_html(result["report"], tmp_path / "lt.perfscope", html=False)
    req = pd.read_parquet(written / "requests.parquet")
    metrics = result["report"].params["loadtest"]["metrics"][0]
    assert len(req) == metrics["requests_sent"] == 60
    counts = req["status"].value_counts().to_dict()
    assert counts.get("ok", 0) == metrics["requests"] > 0
    assert counts.get("broken_stream", 0) + counts.get("connection_error", 0) == metrics["failed_requests"] > 0
    assert counts.get("connection_error", 0) > 0  # the requests sent after the kill
    assert metrics["failures"] == {k: v for k, v in sorted(counts.items()) if k != "ok"}


def test_ctrl_c_writes_the_partial_report(tmp_path: Path) -> None:
    out = tmp_path / "lt"
    with served("--model", "tiny", cwd=tmp_path) as (url, proc):
        lt = subprocess.Popen(_cmd(PERFSCOPE, "loadtest", "--endpoint", url, "--rate", "10", "--requests", "300",
                                   "--output-len", "16", "--no-html", "--out", str(out)), cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PERFSCOPE_PROGRESS": "lines"})
        for _ in range(20):  # the start-up (imports, /v1/models) takes what it takes: wait for the stage line
            if "perfscope: sending" in _readline(lt.stderr, lt, START_TIMEOUT_S):
                break
        time.sleep(3)  # some of the 300 requests (30 s of arrivals) are sent and answered
        assert lt.poll() is None
        lt.send_signal(signal.SIGINT)
        _, err = lt.communicate(timeout=60)
        _stopped_cleanly(proc)
    assert lt.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("perfscope: error: interrupted: the partial report")
    folder = next(p for p in (out, out.with_suffix(".perfscope")) if p.exists())
    req = pd.read_parquet(folder / "requests.parquet")
    counts = req["status"].value_counts().to_dict()
    assert len(req) == 300 and counts.get("not_sent", 0) > 0 and counts.get("ok", 0) > 0
    assert set(counts) <= {"ok", "not_sent", "cancelled"}
    assert json.loads((folder / "manifest.json").read_text())["partial"] is True


def test_profile_puts_the_server_steps_on_the_client_clock(tmp_path: Path) -> None:
    with served("--model", "tiny", "--max-batch", "4", "--profile-dir", str(tmp_path / "traces"),
                cwd=tmp_path) as (url, proc):
        res = _loadtest("--endpoint", url, "--rate", "10", "--requests", "12", "--output-len", "8", "--profile",
                        "--json", "--no-html", "--out", str(tmp_path / "lt"), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        _stopped_cleanly(proc)
    payload = json.loads(res.stdout)
    prof = payload["server_profile"]
    assert Path(prof["trace"]).is_relative_to(tmp_path / "traces")
    assert prof["clock_offset_ns"] is not None and "/health" in prof["clock_offset_method"]
    folder = Path(payload["report_path"])
    steps = pd.read_parquet(folder / "steps.parquet")
    ranges = pd.read_parquet(folder / "ranges.parquet")
    assert prof["steps"] == len(steps) == int(ranges["name"].isin(["prefill", "decode"]).sum())
    # 12 requests of 8 tokens: 12 first tokens from prefill steps, 7 more tokens each from decode steps
    assert steps.loc[steps["phase"] == "prefill", "batch"].sum() == 12
    assert steps.loc[steps["phase"] == "decode", "batch"].sum() == 12 * 7
    req = pd.read_parquet(folder / "requests.parquet")
    assert (req["ttft_prefill_steps"] >= 1).all()
    assert len(pd.read_parquet(folder / "kernels.parquet")) > 0
    # the server's step records name their requests (the stream's response id): each request joined to its
    # own steps, 7 decode steps each after its prefill, and its latency split over them (docs/tails.md)
    links = pd.read_parquet(folder / "request_steps.parquet")
    # on the client's clock through the measured offset, the step that made each request's first token (its last
    # prefill chunk) started after the request was sent and ended before its first token arrived: causal bounds,
    # within the offset's stated uncertainty (half the /health round trip) and 1 ms for mapping the trace's clock,
    # whatever the machine's load; the steps counted towards its TTFT end with that step, so their time is at
    # most the span from the request's arrival to that step's end (steps run one after another)
    tol_s = 0.001 + (prof.get("clock_offset_uncertainty_ns") or 0) / 1e9
    own = links[links["role"] == "prefill"].groupby("request_id")["step"].max()
    made = steps.set_index("step").loc[own.to_numpy()]
    r = req.set_index("request_id").loc[own.index]
    assert len(own) == 12
    assert (made["start_s"].to_numpy() >= r["arrival_s"].to_numpy() - tol_s).all()
    assert (made["end_s"].to_numpy() <= r["first_token_s"].to_numpy() + tol_s).all()
    assert (r["ttft_steps_s"].to_numpy() <= made["end_s"].to_numpy() - r["arrival_s"].to_numpy() + 1e-9).all()
    assert set(links["request_id"]) == set(req["request_id"])
    assert (links[links["role"] == "decode"].groupby("request_id").size() == 7).all()
    assert req["response_id"].str.startswith("cmpl-").all() and req["admitted_s"].notna().all()
    tails = payload["tails"]
    assert tails["source"] == "server steps by request id" and tails["additivity_max_error_pct"] < 1
    for metric in ("ttft", "itl", "tpot", "e2e"):
        e = tails[metric]["p99"]
        assert sum(e["parts"].values()) == pytest.approx(e["value_s"], rel=1e-6)
    _requests_sit_next_to_the_servers_steps(folder, tmp_path / "t.pftrace", tol_s)


def _requests_sit_next_to_the_servers_steps(folder: Path, out: Path, tol_s: float) -> None:
    """The export of a profiled endpoint load test draws its requests on the kernels' clock."""
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    from perfscope.dashboard.export.perfetto import export_trace, lean_report
    from tests.unit.test_trace_export_requests import _check_lanes, _request_slices_proto

    report = lean_report(folder)
    assert len(report.kernels) and len(report.steps)
    stats = export_trace(report, out)
    assert stats.requests == len(report.requests) == 12 and not stats.notes
    slices, _ = _request_slices_proto(out)
    parents = [s for s in slices if s["depth"] == 0]
    _check_lanes(parents)
    steps = report.steps
    prefill_end = steps.loc[steps["phase"] == "prefill", "end_ns"].to_numpy("int64")
    k0, k1 = int(report.kernels["start_ns"].min()), int(report.kernels["end_ns"].max())
    for s in parents:
        row = report.requests[report.requests["request_id"] == s["args"]["request_id"]].iloc[0]
        ttft = next(c for c in slices if c["parent"] == s["i"] and c["name"] == "TTFT")
        assert abs((ttft["end"] - ttft["start"]) - row["ttft_s"] * 1e9) <= 2
        # a prefill step of the server ended after the request was sent and before its first token reached the
        # client: on the same clock, within ``tol_s`` (a wrong clock would be seconds or years off; measured 0.2 to
        # 0.9 ms before the token on an idle machine, more under load, which only widens the window)
        tol = tol_s * 1e9
        assert ((prefill_end >= s["start"] - tol) & (prefill_end <= ttft["end"] + tol)).any()
        assert k0 - 1_000_000_000 < s["start"] < k1 + 1_000_000_000


def test_host_other_than_loopback_warns(tmp_path: Path) -> None:
    proc = subprocess.Popen(_cmd(PERFSCOPE, "serve", "--model", "tiny", "--host", "0.0.0.0", "--port", "0"), cwd=tmp_path,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = _readline(proc.stderr, proc, START_TIMEOUT_S)
        assert "warning: serving on 0.0.0.0, reachable from other machines" in line
    finally:
        proc.send_signal(signal.SIGINT)  # before or just after it binds: nothing is sent to it
        proc.communicate(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _smollm2_hf_folder(out: Path) -> Path:
    """SmolLM2's GGUF as a Hugging Face folder (transformers dequantizes it; its GGUF path does not serve)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from perfscope.engine.gguf_model import smollm2_path

    gguf = smollm2_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    cfg = model.config
    cfg.architectures = [type(model).__name__]
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    out.mkdir(parents=True)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.smollm2
def test_transformers_serve_a_server_no_one_here_wrote(tmp_path: Path) -> None:
    """`transformers serve` (transformers' own OpenAI-compatible server) with SmolLM2, on loopback."""
    for module in ("fastapi", "uvicorn", "openai", "accelerate", "gguf"):
        pytest.importorskip(module, reason="transformers serve needs pip install 'perfscope[peer]'")
    folder = _smollm2_hf_folder(tmp_path / "smollm2-hf")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_cmd(sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder),
                                 "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32"),
                            cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "transformers serve did not start in time"
                time.sleep(1)
        res = _loadtest("--endpoint", url, "--rate", "1", "--requests", "4", "--prompt-len", "16", "--output-len", "4",
                        "--tokenizer", str(folder), "--json", "--no-html", "--out", str(tmp_path / "lt"), cwd=tmp_path,
                        timeout=300)
        assert res.returncode == 0, res.stderr
        payload = json.loads(res.stdout)
        assert payload["requests"] == payload["requests_sent"] == 4, payload["failures"]
        assert payload["endpoint"]["model"] == str(folder)  # the first of its /v1/models
        assert payload["endpoint"]["token_counts"] == {"usage": 4}
        assert payload["output_tokens"] == 16  # max_tokens honoured (4 each)
        manifest = json.loads((Path(payload["report_path"]) / "manifest.json").read_text())
        # its /v1/completions stream ends without data: [DONE]: complete, and said
        assert any("without data: [DONE]" in w for w in manifest["warnings"])
    finally:
        _stop(proc)


# ---------------------------------------------------------------------------- abuse
def _port(url: str) -> int:
    return int(url.split("127.0.0.1:", 1)[1].split("/", 1)[0])


def _raw(port: int, data: bytes, *, timeout: float = 60) -> tuple[int, dict]:
    """Send raw bytes, end our side, read the answer to its end: (status, JSON body or {})."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    try:
        return status, json.loads(body)
    except ValueError:
        return status, {}


def _request(body: bytes, *headers: str, path: str = "/v1/completions") -> bytes:
    return ("\r\n".join([f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *headers])
            + "\r\n\r\n").encode() + body


def test_half_open_connections_get_a_503_past_the_cap(tmp_path: Path) -> None:
    """50 connections that send nothing against --max-connections 10: the first 10 wait (no read
    timeout here), the 40 others are answered 503 at once, a normal request too; once they close,
    a normal request is served."""
    import socket

    with served("--model", "tiny", "--max-connections", "10", "--read-timeout", "600", cwd=tmp_path) as (url, proc):
        port = _port(url)
        held = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(50)]
        answered: dict[int, bytes] = {}
        for _ in range(600):  # bounded: until the 40 past the cap have their answer
            if len(answered) >= 40:
                break
            ready, _, _ = select.select([s for s in held if s.fileno() not in answered], [], [], 0.5)
            for s in ready:
                answered[s.fileno()] = s.recv(65536)
        assert len(answered) == 40
        assert all(a.startswith(b"HTTP/1.1 503 ") and b"its cap" in a for a in answered.values())
        assert _raw(port, _request(b'{"prompt": [1], "max_tokens": 2}'))[0] == 503
        for s in held:
            s.close()
        for _ in range(200):  # bounded: the server sees the 10 close
            status, body = _raw(port, _request(b'{"prompt": [1], "max_tokens": 2}'))
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200 and body["usage"]["completion_tokens"] == 2
        _stopped_cleanly(proc)


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `perfscope serve --model tiny` for the tests that only send it requests; it must stop cleanly."""
    with served("--model", "tiny", cwd=tmp_path_factory.mktemp("serve")) as (url, proc):
        yield url
        _stopped_cleanly(proc)


def test_malformed_http_is_a_4xx_and_the_server_goes_on(tiny_server: str) -> None:
    ok = b'{"prompt": [1, 2], "max_tokens": 2}'
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400, "Content-Length"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400, "Content-Length"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413, "over 8 MiB"),
        (_request(ok, "X-Big: " + "a" * 100_000), 431, "header line"),
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n", 414, "request line"),
        (_request(ok, *(f"X-H{i}: v" for i in range(1000))), 431, "headers"),
        (_request(deep), 400, "nested too deeply"),
        (_request(ok, "Transfer-Encoding: chunked"), 501, "Content-Length"),
        (b"NONSENSE\r\n\r\n", 400, "request line"),
    ]
    port = _port(tiny_server)
    for data, code, text in cases:
        status, body = _raw(port, data)
        assert status == code and text in body["error"]["message"], (data[:80], status, body)
        assert set(body["error"]) == {"message", "type", "param", "code"}
    assert _raw(port, _request(ok))[0] == 200  # still serving


def test_wrong_types_and_unsupported_options_are_openai_400s(tiny_server: str) -> None:
    base = {"prompt": [1, 2, 3], "max_tokens": 4}
    cases = [
        ({"temperature": "hot"}, "temperature"), ({"top_p": "x"}, "top_p"), ({"top_p": 0}, "top_p"),
        ({"temperature": 9}, "temperature"), ({"seed": "x"}, "seed"), ({"stop": 5}, "stop"),
        ({"stop": ["a", 1]}, "stop"), ({"stop": ["a"] * 5}, "stop"), ({"ignore_eos": "x"}, "ignore_eos"),
        ({"stream": "yes"}, "stream"), ({"min_tokens": 10, "max_tokens": 2}, "min_tokens"),
        ({"min_tokens": True}, "min_tokens"), ({"max_tokens": 2.5}, "max_tokens"),
        ({"logprobs": 1}, "logprobs"), ({"echo": True}, "echo"), ({"best_of": 2}, "best_of"),
        ({"suffix": "x"}, "suffix"), ({"stream_options": {"include_usage": "x"}}, "stream_options"),
    ]
    url = tiny_server
    for extra, param in cases:
        status, body = _post(url + "/completions", {**base, **extra})
        assert status == 400, (extra, body)
        assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error", (extra, body)
    # the values that ask for nothing are accepted
    status, body = _post(url + "/completions", {**base, "logprobs": None, "echo": False, "best_of": 1,
                                                "suffix": None, "temperature": 0.7, "top_p": 1, "seed": 3})
    assert status == 200, body


def test_stop_strings_end_the_text(tiny_server: str) -> None:
    """The tiny model (no tokenizer) streams each token as " <id>": a stop string cut from an
    unstopped answer ends the text right before it, streamed or not, with finish_reason stop."""
    url = tiny_server
    body = {"prompt": [5, 6, 7], "max_tokens": 12}
    status, full = _post(url + "/completions", body)
    assert status == 200 and full["choices"][0]["finish_reason"] == "length"
    text = full["choices"][0]["text"]
    ids = text.split()
    stop = f" {ids[5]} {ids[6]}"  # two tokens' text, met first at the 6th token or before
    cut = text.find(stop)
    status, got = _post(url + "/completions", {**body, "stop": [" never", stop]})
    assert status == 200 and got["choices"][0]["finish_reason"] == "stop", got
    assert got["choices"][0]["text"] == text[:cut]
    req = urllib.request.Request(url + "/completions", data=json.dumps({**body, "stop": stop, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        events = [json.loads(line[6:]) for line in resp.read().decode().splitlines() if line.startswith("data: {")]
    streamed = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert streamed == text[:cut]
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "stop"


def test_ctrl_c_with_a_stream_in_flight_exits_cleanly(tmp_path: Path) -> None:
    import socket

    with served("--model", "tiny", cwd=tmp_path) as (url, proc), \
            socket.create_connection(("127.0.0.1", _port(url)), timeout=60) as s:
        s.sendall(_request(json.dumps({"prompt": [1, 2, 3], "max_tokens": 400, "stream": True}).encode()))
        first = s.recv(65536)
        while b"data: {" not in first:  # a token has been streamed: the request is in flight
            first += s.recv(65536)
        _stopped_cleanly(proc)  # exit 0, "stopped", no traceback (CancelledError) on stderr


def test_out_of_file_descriptors_is_a_few_log_lines_not_a_flood(tmp_path: Path) -> None:
    """The server's descriptor limit lowered to what it holds + 5, then 40 connections: accept()
    fails (EMFILE) and the log says so in one line per cause per 10 s, no traceback; once the
    connections close and the limit is back, a normal request is served."""
    import resource
    import socket

    with served("--model", "tiny", "--max-connections", "1000", "--read-timeout", "600", cwd=tmp_path) as (url, proc):
        port = _port(url)
        held_fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        old = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (held_fds + 5, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        held = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(40)]
        logged = ""
        for _ in range(50):  # waits for the line (no sleep); other lines before it are kept
            logged += _readline(proc.stderr, proc, 60)
            if "out of system resource" in logged:
                break
        assert "out of system resource" in logged and "errno 24" in logged, logged
        for s in held:
            s.close()
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, old)
        for _ in range(200):  # bounded: accept() is retried after a second
            try:
                status = _raw(port, _request(b'{"prompt": [1], "max_tokens": 2}'), timeout=10)[0]
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.05)
        assert status == 200
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert (logged + err).count("out of system resource") <= 3, err
