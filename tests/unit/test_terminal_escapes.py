"""Escape sequences in a trace's text (kernel, op and device names) are shown escaped on every
terminal output -- analyze, its tree, compare, the import warnings, errors -- piped or not, through
one function (:func:`perfscope.format.terminal_text`)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.format import terminal_text

TRACE = "kineto/tracelens_torch_compile_triton__trace.json.gz"
TITLE = "\x1b]0;pwned\x07"  # OSC 0: sets the window title
CLEAR = "\x1b[2J"  # CSI: clears the screen
LINK = "\x1b]8;;http://evil.example\x07click\x1b]8;;\x07"  # OSC 8: a hyperlink
OTHERS = "\r\x9b2J\u202e"  # carriage return, the one-byte C1 CSI, a right-to-left override
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _evil_trace(fixtures_dir: Path, tmp_path: Path) -> Path:
    with gzip.open(fixtures_dir / TRACE, "rt") as f:
        trace = json.load(f)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    ops = [e for e in trace["traceEvents"] if e.get("name") == "triton_red_fused_add_mean_mul_pow_rsqrt_0"]
    assert ops  # its kernel's launching op, which has no cost formula
    kernels[0]["name"] = "k" + TITLE + CLEAR
    kernels[1]["name"] = "k" + LINK + OTHERS
    for op in ops:
        op["name"] = "my::op" + TITLE  # no cost formula: named in an import warning
    trace["deviceProperties"][0]["name"] = "GPU" + CLEAR + TITLE
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(trace), encoding="utf-8")
    return path


def _shown_safely(text: str) -> None:
    assert not RAW.search(text.replace("\n", "").replace("\t", "")), repr(RAW.search(text))


def test_terminal_text_escapes_controls_and_keeps_lines() -> None:
    assert terminal_text("a" + TITLE + "\tb\nc") == "a\\x1b]0;pwned\\x07\tb\nc"
    assert terminal_text(OTHERS) == "\\x0d\\x9b2J\\u202e"
    assert terminal_text(terminal_text(LINK)) == terminal_text(LINK)  # idempotent
    assert terminal_text("naïve µs → ok") == "naïve µs → ok"  # printable text is left alone


def test_every_terminal_output_shows_escapes(fixtures_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    evil = _evil_trace(fixtures_dir, tmp_path)
    out = tmp_path / "evil.perfscope"
    assert main(["import", str(evil), "--out", str(out), "--no-html"]) == 0
    assert main(["import", str(fixtures_dir / TRACE), "--out", str(tmp_path / "plain.perfscope"), "--no-html"]) == 0
    commands = [["analyze", str(out)], ["analyze", str(out), "--tree"], ["analyze", str(out), "--top", "50"],
                ["compare", str(tmp_path / "plain.perfscope"), str(out), "--by", "name"],
                ["compare", str(out), str(evil)]]
    for argv in commands:
        assert main(argv) == 0, argv
    printed = capsys.readouterr()
    for text in (printed.out, printed.err):
        _shown_safely(text)
    everything = printed.out + printed.err
    assert "\\x1b]0;pwned\\x07" in everything and "\\x1b[2J" in everything  # shown, escaped
    assert "\\x1b]8;;http://evil.example\\x07" in everything and "\\u202e" in everything
    assert "my::op\\x1b]0;pwned\\x07" in printed.err  # the import warning naming the uncosted op


def test_an_error_naming_an_odd_file_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / ("x" + TITLE + ".json")
    bad.write_text("{not json")
    assert main(["import", str(bad), "--out", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err
    _shown_safely(err)
    assert "\\x1b]0;pwned\\x07" in err
