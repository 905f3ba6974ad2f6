"""Hostile CUDA memory snapshots (issue 43's pickle cases, for the snapshot reader): each ends in one
``InputFormatError`` line (exit 3, docs/limits.md) naming what was wrong, or imports correctly, in
bounded time and memory, and never runs code.

The files are written by Python's own pickler from plain data (memo references are how a 12 KB
pickle names one object a million times) or by hand, and are never loaded with ``pickle`` here.
"""

from __future__ import annotations

import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.readers.snapshot import import_snapshot
from perfscope.cli import main
from perfscope.errors import InputFormatError
from perfscope.limits import budget, counting

from .memory_snapshots import Snapshot, frames

SECONDS = 20
"""A case taking longer than this is not bounded (each takes well under a second here)."""


def _event(addr: int = 1 << 40, size: int = 512, **extra: Any) -> dict[str, Any]:
    return {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": 1, "frames": [], **extra}


def _snapshot(events: Any = None, segments: Any = None, **top: Any) -> dict[str, Any]:
    return {"segments": [] if segments is None else segments,
            "device_traces": [[_event(), _event(2 << 40)]] if events is None else events, **top}


def _write(tmp_path: Path, name: str, obj: Any) -> Path:
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return path


def _one_line(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Import ``path`` on the CLI: exit 3 and one error line, quickly."""
    capsys.readouterr()
    t = time.perf_counter()
    code = main(["import", str(path), "--out", str(path.with_suffix(".perfscope")), "--no-html", *args])
    assert time.perf_counter() - t < SECONDS
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert len(err.splitlines()) == 1 and err.startswith("perfscope: error: ") and str(path) in err
    return err


# a 12 KB pickle naming one segment, one trace, one event hundreds of thousands of times
MEMO = {
    "segment": lambda: _snapshot(segments=[{"address": 1, "total_size": 2 << 20, "blocks": [
        {"address": 1, "size": 512, "state": "active_allocated"}]}] * 200_000),
    "block": lambda: _snapshot(segments=[{"address": 1, "total_size": 2 << 20, "blocks": [
        {"address": 1, "size": 512, "state": "active_allocated"}] * 200_000}]),
    "trace": lambda: _snapshot(events=[[_event(), _event(2 << 40)]] * 100_000),
    "event": lambda: _snapshot(events=[[_event()] * 400_000]),
}
"""Memo references repeating one object (issue 43: 12 KB became 1.5 GB, 427 KB became 537 MB)."""


@pytest.mark.parametrize("case", sorted(MEMO))
def test_memo_references_repeating_an_object(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, case, MEMO[case]())
    assert path.stat().st_size < 2_000_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    err = _one_line(path, capsys)
    assert "a memo reference repeating it" in err or "refers back to an event already read" in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024  # KB: nothing expanded


def test_nested_references_in_a_traceback_import(tmp_path: Path) -> None:
    """A traceback of a thousand references to a list of a thousand ... (10^9 frames by reference): only
    its own items are read, and it says nothing."""
    inner: list[Any] = [{"name": "at::_ops::mm::call(", "filename": "??", "line": 0}] * 1000
    for _ in range(3):
        inner = [inner] * 1000
    path = _write(tmp_path, "nested", _snapshot(events=[[_event(frames=inner), _event(2 << 40, frames=inner)]]))
    t = time.perf_counter()
    mem = import_snapshot(path).tables["memory"]
    assert time.perf_counter() - t < SECONDS and len(mem) == 2 and mem["op"].isna().all()


def test_max_events_and_max_memory_while_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    s = Snapshot()
    for i in range(3000):
        s.free(s.alloc(1 << 20, frames("mm", [("/m.py", i % 7, "f")])))
    path = tmp_path / "many.pickle"
    s.write(path)
    with counting(), budget(max_events=5000), pytest.raises(InputFormatError, match="more than 5,000 events"):
        import_file(path)  # 12,000 events: stopped at a batch of the first thousand past 5,000
    assert "--max-events budget" in _one_line(path, capsys, "--max-events", "5000")
    monkeypatch.setenv("PERFSCOPE_MAX_MEMORY", "1M")
    assert "PERFSCOPE_MAX_MEMORY" in _one_line(path, capsys)


BAD_NUMBERS = {
    "huge size": (_snapshot(events=[[_event(size=10**400)]]), "size of 1329 bits is not a byte count"),
    "huge addr": (_snapshot(events=[[_event(addr=-(10**400))]]), "addr of 1329 bits is not a byte count"),
    "string size": (_snapshot(events=[[_event(size="512")]]), "size '512' is not a byte count"),
    "float addr": (_snapshot(events=[[_event(addr=1.5)]]), "addr 1.5 is not a byte count"),
    "huge time": (_snapshot(events=[[_event(time_us=10**400)]]), "time_us of 1329 bits is not a time"),
    "nan time": (_snapshot(events=[[_event(time_us=float("nan"))]]), "time_us nan is not a time"),
    "list stream": (_snapshot(events=[[_event(stream=[0])]]), "stream of type list is not a CUDA stream"),
}


@pytest.mark.parametrize("case", sorted(BAD_NUMBERS))
def test_numbers_that_are_not_sizes(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj, words = BAD_NUMBERS[case]
    assert words in _one_line(_write(tmp_path, case.replace(" ", "_"), obj), capsys)


WRONG_TYPES = {
    "event is a list": (_snapshot(events=[[["alloc", 1, 512]]]), "trace event 1 is a list, not a dict"),
    "events are lists of lists": (_snapshot(events=[[[_event()], [_event()]]]), "trace event 1 is a list"),
    "segment is a list": (_snapshot(segments=[[1, 2]]), "segment 1 is a list, not a dict"),
    "blocks is a dict": (_snapshot(segments=[{"blocks": {"a": 1}}]), "blocks is a dict, not a list"),
    "block is a string": (_snapshot(segments=[{"blocks": ["x"]}]), "holds a str where a block's dict belongs"),
    "device_traces is a dict": (_snapshot(events={"0": []}), "device_traces is a dict, not a list"),
    "a trace is a dict": (_snapshot(events=[{"action": "alloc"}]), "holds a dict where a device's list"),
    "an event without action": (_snapshot(events=[[{"addr": 1}, {"addr": 2}]]), "has no 'action'"),
    "top is a list": ([1, 2], "not a CUDA memory snapshot"),
    "events outside device_traces": (_snapshot(events=[], extra=[_event(), _event()]),
                                     "trace events outside device_traces"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_list_where_a_dict_belongs(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj, words = WRONG_TYPES[case]
    assert words in _one_line(_write(tmp_path, case.replace(" ", "_"), obj), capsys)


def test_odd_but_harmless_values_import(tmp_path: Path) -> None:
    """Frames that are a dict, an unknown action, a missing stream, a segment without sizes: read, said
    nothing of, never an error."""
    obj = _snapshot(events=[[_event(frames={"a": 1}), {"action": "snapshot"}, _event(2 << 40, stream=None)]],
                    segments=[{"blocks": []}])
    mem = import_snapshot(_write(tmp_path, "odd", obj)).tables["memory"]
    assert list(mem.loc[~mem["preexisting"].astype(bool), "action"]) == ["alloc", "alloc"]


def test_damaged_and_deep_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, "good", _snapshot())
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(good.read_bytes()[:-7])
    assert "damaged or not a pickle" in _one_line(cut, capsys)
    deep = tmp_path / "deep.pickle"  # a list nested a million deep: built without recursion, refused
    deep.write_bytes(b"\x80\x04" + b"]" * 1_000_000 + b"a" * 999_999 + b".")
    assert "not a CUDA memory snapshot" in _one_line(deep, capsys)
    huge = tmp_path / "huge.pickle"  # a string said to be 2^60 bytes long, in a 30-byte file
    huge.write_bytes(b"\x80\x04\x8d" + (1 << 60).to_bytes(8, "little") + b"abc.")
    assert "damaged or not a pickle" in _one_line(huge, capsys)


def test_a_global_is_never_resolved(tmp_path: Path) -> None:
    """Every way a pickle names a callable (GLOBAL, STACK_GLOBAL, INST, EXT) is refused in one line on
    the command line, and nothing runs (no traceback either)."""
    marker = tmp_path / "ran"
    cmd = f"touch {marker}".encode()
    cases = {
        "global": b"\x80\x02cos\nsystem\nq\x00X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R.",
        "stack_global": b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(cmd)]) + cmd + b"\x85R.",
        "inst": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "ext": b"\x80\x02\x82\x01)R.",
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(b"\x80\x02" + data if not data.startswith(b"\x80") else data)
        proc = subprocess.run([sys.executable, "-m", "perfscope", "import", str(path), "--out",  # noqa: PLW1510
                               str(tmp_path / f"{name}.perfscope")], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 3 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not marker.exists(), name


# --- the memo trimmed while reading (issue 40: torch's layout at C speed in bounded memory) -------------
# The reader drops from the unpickler's memo the events it has read (and their tracebacks) as it goes.
# A file that refers back to one of them after that is read again untrimmed, so it fails (or imports)
# exactly as it would have: one line, nothing run. TRIM_EVENTS is lowered so a small file trims often.


def _trimming(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Trim every 500 events; the list returned gets each read's ``trim`` (a second read: False)."""
    from perfscope.analysis.readers import snapshot

    monkeypatch.setattr(snapshot, "TRIM_EVENTS", 500)
    monkeypatch.setattr(snapshot, "SLOW_EVENTS", 100)
    reads: list[bool] = []
    load = snapshot._load

    def counted(*args: Any, trim: bool, **kw: Any) -> Any:
        reads.append(trim)
        return load(*args, trim=trim, **kw)

    monkeypatch.setattr(snapshot, "_load", counted)
    return reads


def _many(n: int = 3000) -> list[dict[str, Any]]:
    """``n`` events sharing their frame dicts (as torch's do), each its own traceback list."""
    shared = [{"name": f"at::_ops::op{k}::call(at::Tensor const&)", "filename": "??", "line": 0} for k in range(5)]
    user = [{"name": "forward", "filename": f"/work/model{k}.py", "line": k} for k in range(5)]
    return [_event(addr=(i + 1) << 20, frames=[shared[i % 5], user[i % 5], user[(i + 1) % 5]]) for i in range(n)]


def test_a_reference_to_an_event_read_before_a_trim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """An event referred to again thousands of events later (its memo entry long trimmed): read again
    untrimmed, and refused in one line as any repeated event is."""
    reads = _trimming(monkeypatch)
    events = _many()
    path = _write(tmp_path, "late_repeat", _snapshot(events=[[*events, events[10]]]))
    assert "refers back to an event already read" in _one_line(path, capsys)
    assert reads == [True, False]  # the trimmed read failed on the trimmed slot; the second named it


def test_a_traceback_shared_across_a_trim_reads_right(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A traceback list shared by an early and a late event (not a free and its free_completed): the
    late reference finds its memo entry trimmed, the file is read again untrimmed, and both events
    carry the traceback's reading."""
    reads = _trimming(monkeypatch)
    events = _many()
    late = _event(addr=1 << 40, frames=events[7]["frames"])
    mem = import_snapshot(_write(tmp_path, "late_traceback", _snapshot(events=[[*events, late]]))).tables["memory"]
    rows = mem[~mem["preexisting"].astype(bool)]
    assert len(rows) == len(events) + 1
    assert rows["op"].iloc[-1] == rows["op"].iloc[7] == "aten::op2" and rows["source"].iloc[-1] == rows["source"].iloc[7]
    assert reads == [True, False]
    reads.clear()  # without the late reference: one read, trimmed all the way
    assert len(import_snapshot(_write(tmp_path, "no_late", _snapshot(events=[events]))).tables["memory"]) == len(events)
    assert reads == [True]


def test_a_frame_referred_to_as_an_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A frame dict (which the trimmed memo holds a stand-in for) put where an event belongs, after the
    trims: one line naming the event, never the reader's stand-in."""
    reads = _trimming(monkeypatch)
    events = _many()
    path = _write(tmp_path, "frame_event", _snapshot(events=[[*events, events[3]["frames"][0]]]))
    err = _one_line(path, capsys)
    assert "has no 'action'" in err and "_Frame" not in err and "_Read" not in err
    assert reads == [True, False]


def test_a_memo_slot_never_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A reference to a memo slot nothing was put in (inside the trace, after the sink went in): one line."""
    good = pickle.dumps(_snapshot(events=[_many(3)]), protocol=4)
    at = good.index(b"\x8c\x06action")  # the first event's first key: a reference to slot 999,999 there
    path = tmp_path / "no_slot.pickle"
    path.write_bytes(good[:at] + b"j" + (999_999).to_bytes(4, "little") + b"0" + good[at:])
    assert "damaged or not a pickle" in _one_line(path, capsys)


def test_the_memo_holders_names_are_not_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reader fills the trimmed memo from its own bytes through GLOBALs of module ``_``: the same
    names in the file are refused like any other global."""
    path = tmp_path / "holder_name.pickle"
    path.write_bytes(b"\x80\x02c_\n0\n.")
    assert "refused: the pickle asks for _.0" in _one_line(path, capsys)
