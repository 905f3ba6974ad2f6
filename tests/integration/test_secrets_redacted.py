"""Secrets on the command line never reach what perfscope writes or prints: the manifest, the
HTML report, the report's name and default folder, the Chrome/Perfetto export and ``analyze``
(issue 30). One function redacts them: :mod:`perfscope.redact`."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.redact import REDACTED, high_entropy, redact_argv, redact_text, redact_url

HF = "hf_" + "aZ3kQ9mW2xR7tL5pV8nB4cY6dF1gH0jS"
SK = "sk-proj-" + "Q2w9E4r7T1y6U3i8O5p0AaSsDdFfGgHhJjKk"
PASSWORD = "PASS"  # a plain word: redacted by where it is (URL userinfo), not by its look
NOT_SECRET = ["--max-tokens", "128", "--tokenizer", "gpt2", "--key-cache-dtype", "fp8", "out.json"]


def test_the_redaction_rules() -> None:
    argv = ["python", "gen.py", "--hf-token", HF, "--api-key", SK, "--password", "hunter2", "--token=abc",
            "HF_TOKEN=" + HF, "--secret-file", "/etc/x", "--kv-key", "fp8", *NOT_SECRET,
            "--url", "http://admin:" + PASSWORD + "@127.0.0.1:8754/v1?api_key=xyz&x=1", "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2"]
    got = redact_argv(argv)
    text = " ".join(got)
    for secret in (HF, SK, "hunter2", "abc", PASSWORD, "xyz", "ghp_"):
        assert secret not in text, secret
    assert got[:3] == ["python", "gen.py", "--hf-token"] and got[3] == REDACTED
    assert "--token=***" in got and "HF_TOKEN=***" in got
    assert got[got.index("--kv-key") + 1] == REDACTED  # named for a key: any value
    assert got[got.index("--secret-file") + 1] == "/etc/x"  # last word "file": only a random-looking value goes
    for i in range(0, len(NOT_SECRET) - 1, 2):  # flags that merely contain token/key keep ordinary values
        assert got[got.index(NOT_SECRET[i]) + 1] == NOT_SECRET[i + 1]
    assert "out.json" in got and "http://***@127.0.0.1:8754/v1?api_key=***&x=1" in got
    assert redact_argv(["--max-tokens", "9f8A7b6C5d4E3f2A1b0C"]) == ["--max-tokens", REDACTED]  # random: a key
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    assert redact_text(f"runs/x-{SK}.perfscope") == f"runs/x-{REDACTED}.perfscope"
    assert not high_entropy("a-very-long-plain-word") and not high_entropy("1234567890123456")


GEN = """
import sys, torch
x, w = torch.randn(16, 32), torch.randn(32, 8)
y = torch.relu(x @ w)
"""


@pytest.fixture(scope="module")
def cpu_roofs():
    from perfscope.collectors.roofs import device_roofs

    return device_roofs("cpu")  # cached per machine


def _everything_written(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()
                     and p.suffix in (".json", ".html", ".txt"))


def test_profile_script_with_tokens_on_its_command_line(tmp_path: Path, cpu_roofs, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "gen.py"
    script.write_text(textwrap.dedent(GEN))
    monkeypatch.chdir(tmp_path)
    argv = ["profile", "--collector", "torch", "--device", "cpu", "-q", "--", "python", str(script),
            "--hf-token", HF, "--api-key", SK]
    monkeypatch.setattr(sys, "argv", ["perfscope", *argv])
    assert main(argv) == 0
    printed = capsys.readouterr()
    (report,) = (tmp_path / "runs").iterdir()  # the default folder: runs/<stamp>-gen.perfscope
    assert report.name.endswith("-gen.perfscope")
    manifest = json.loads((report / "manifest.json").read_text())
    assert manifest["name"] == "gen" and manifest["command"][-4:] == ["--hf-token", REDACTED, "--api-key", REDACTED]
    exports = [tmp_path / "t.json", tmp_path / "t.pftrace"]
    assert main(["export", str(report), "-o", str(exports[0]), "--format", "chrome"]) == 0
    assert main(["export", str(report), "-o", str(exports[1]), "--format", "perfetto"]) == 0
    for flags in ([], ["--json"], ["--tree"]):
        assert main(["analyze", str(report), *flags]) == 0
    printed_too = capsys.readouterr()
    written = _everything_written(report) + "".join(p.read_bytes().decode("latin-1") for p in exports)
    assert (report / "report.html").is_file()
    for secret in (HF, SK):
        assert secret not in written and secret not in str(report)
        assert secret not in printed.out + printed.err + printed_too.out + printed_too.err


class _Server(BaseHTTPRequestHandler):
    """A minimal OpenAI-compatible completions server: four tokens a request, usage, [DONE]."""

    def log_message(self, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        data = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for obj in ([{"choices": [{"index": 0, "text": " a", "finish_reason": None}]}] * 4
                    + [{"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
                       {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}]):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def test_loadtest_endpoint_with_a_password_in_its_url(tmp_path: Path, server: int, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://admin:{PASSWORD}@127.0.0.1:{server}/v1"
    out = tmp_path / "lt.perfscope"
    argv = ["loadtest", "--endpoint", url, "--rate", "50", "--requests", "3", "--prompt-len", "4", "--output-len", "4",
            "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["perfscope", *argv])
    assert main(argv) == 0
    assert main(["analyze", str(out)]) == 0
    assert main(["export", str(out), "-o", str(tmp_path / "t.json"), "--format", "chrome"]) == 0
    printed = capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    assert f"http://***@127.0.0.1:{server}/v1" in manifest["command"]
    written = _everything_written(out) + (tmp_path / "t.json").read_text()
    assert (out / "report.html").is_file()
    assert f":{PASSWORD}@" not in written and f":{PASSWORD}@" not in printed.out + printed.err
