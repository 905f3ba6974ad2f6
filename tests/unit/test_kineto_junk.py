"""A trace whose ``traceEvents`` array comes after a long value (``{"junk":"AAA…","traceEvents":[…]}``)
is read in one linear pass of the top-level object (issue 30: it went through ijson, whose string
building is quadratic). Behaviour, not time: the blocks and the head are made tiny here, so every
value crosses block boundaries (escapes, quotes and brackets cut in two) as a long one would."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from perfscope.analysis.readers.kineto import events
from perfscope.analysis.readers.kineto.parse import parse_trace
from perfscope.errors import InputFormatError

TRACE = "kineto/hta_critical_path__cuda_event_sync_multi_stream__event_sync_trace.json.gz"

JUNK = {
    "string": "A" * 50_000,
    "escapes": '\\"]}{[,:' * 5_000 + "\u00e9\ud800",
    "nested": [[1, {"a": "]}\"{", "b": [None, True, 1.5e3]}]] * 2_000,
    "numbers": list(range(20_000)),
}


@pytest.fixture
def tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Blocks of 997 bytes (cuts land everywhere) and a 4 KB head; returns the scans' outcomes."""
    monkeypatch.setattr(events, "HEAD_KEEP", 4096)
    monkeypatch.setattr(events, "BLOCK", 997)
    scans: list[str] = []
    real = events._scan_top

    def spy(*args):
        out = real(*args)
        scans.append(out[0])
        return out

    monkeypatch.setattr(events, "_scan_top", spy)
    return scans


def _trace(fixtures_dir: Path) -> dict:
    with gzip.open(fixtures_dir / TRACE, "rt") as f:
        return json.load(f)


def _rows(t) -> dict:
    """Every column of a parsed trace, string codes decoded (their numbering follows the blocks)."""
    from perfscope.analysis.readers.kineto.parse import STRING_FIELDS

    def decode(name: str, col):
        if name in STRING_FIELDS:
            return [t.strings[c] if c >= 0 else None for c in col.tolist()]
        return [None if isinstance(v, float) and math.isnan(v) else v for v in col.tolist()]

    out = {(kind, name): decode(name, col) for kind, cols in t.cols.items() for name, col in cols.items()}
    out.update({("cpu", name): decode(name, col) for name, col in t.cpu.items() if name != "sig"})
    return out


def _same(a, b) -> None:
    assert a.n_events == b.n_events and a.n_events > 0
    assert _rows(a) == _rows(b)
    assert a.meta["deviceProperties"] == b.meta["deviceProperties"]


@pytest.mark.parametrize("kind", sorted(JUNK))
@pytest.mark.parametrize("where", ["first", "middle"])
def test_events_after_a_long_value_are_all_read(fixtures_dir: Path, tmp_path: Path, tiny_blocks: list[str],
                                                kind: str, where: str) -> None:
    trace = _trace(fixtures_dir)
    events_ = trace.pop("traceEvents")
    body = {"junk": JUNK[kind], **trace} if where == "first" else {**trace, "junk": JUNK[kind]}
    text = json.dumps(body)[:-1] + ', "traceEvents": ' + json.dumps(events_) + ', "after": 7}'
    path = tmp_path / "junk.json.gz"
    path.write_bytes(gzip.compress(text.encode("utf-8", "surrogatepass")))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({**trace, "traceEvents": events_}))
    got = parse_trace(path)
    assert tiny_blocks == ["events"]  # the linear scan found the array
    _same(got, parse_trace(plain))
    want = parse_trace(plain)
    assert got.meta["after"] == 7 and not got.partial and got.warnings == want.warnings


def test_a_key_inside_the_long_value_does_not_fool_it(fixtures_dir: Path, tmp_path: Path,
                                                      tiny_blocks: list[str]) -> None:
    trace = _trace(fixtures_dir)
    decoy = '"traceEvents": [{"ph": "X", "cat": "kernel", "name": "decoy", "ts": 1, "dur": 1}], '
    text = '{"junk": ' + json.dumps(decoy * 100) + ", " + json.dumps(trace)[1:]
    path = tmp_path / "decoy.json"
    path.write_text(text)
    got = parse_trace(path)
    names = set(got.strings.tolist())
    assert "decoy" not in names and got.n_events == len(trace["traceEvents"]) and tiny_blocks == ["events"]


def test_a_file_cut_inside_the_long_value_is_one_error(tmp_path: Path, tiny_blocks: list[str]) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"junk": "' + "A" * 20_000)
    with pytest.raises(InputFormatError, match="damaged or truncated JSON"):
        parse_trace(path)


def test_an_object_without_events_is_not_a_trace(tmp_path: Path, tiny_blocks: list[str]) -> None:
    path = tmp_path / "none.json"
    path.write_text(json.dumps({"junk": "A" * 20_000, "other": [1, 2]}))
    with pytest.raises(InputFormatError, match="not a trace"):
        parse_trace(path)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"junk": "A" * 20_000, "traceEvents": []}))
    assert parse_trace(empty).n_events == 0  # a trace, with no events: an empty report, as without the junk
