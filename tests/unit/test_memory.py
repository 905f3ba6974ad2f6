"""The memory timeline against independent replays of its inputs (docs/memory.md).

- each committed CUDA memory snapshot: perfscope's allocated bytes equal a direct replay of the
  snapshot's alloc/free events (loaded whole by a plain restricted ``pickle.Unpickler``) at every
  event, and the peak matches;
- the MI300X Kineto trace: allocated bytes equal each ``[memory]`` event's ``Total Allocated``;
- a pickle that would run a command is refused with one line, and never runs;
- torch.profiler's ``export_memory_timeline`` (made here by torch) is read with its categories.
"""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.readers.detect import detect_format, import_file
from perfscope.analysis.readers.snapshot import import_snapshot
from perfscope.errors import InputFormatError

SNAPSHOTS = ["memory/cs336_notHanmin_xl_forward/memory_snapshot_forward.pickle",
             "memory/cs336_notHanmin_xl_forward/memory_snapshot_forward_without_mixed.pickle"]
MI300X = "memory/tracelens_mi300x_normalization_profile_memory/normalization_layer_test.json.gz"


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> None:
        raise AssertionError(f"{module}.{name}")


def _direct_replay(path: Path) -> tuple[list[float], float]:
    """Allocated bytes after each trace event, replayed the simplest way: the blocks live at the
    dump that the trace never allocated, plus the frees of blocks it never allocated, are live
    at the start; then +size per alloc and -size per free_requested of a live block."""
    with open(path, "rb") as fh:
        snap = _PlainData(fh).load()
    events = snap["device_traces"][0]
    allocated = {e["addr"] for e in events if e["action"] == "alloc"}
    freed_first: dict[int, int] = {}
    live: set[int] = set()
    for e in events:
        if e["action"] == "alloc":
            live.add(e["addr"])
        elif e["action"] == "free_requested":
            if e["addr"] in live:
                live.discard(e["addr"])
            else:
                freed_first.setdefault(e["addr"], e["size"])
    untraced = sum(b["size"] for s in snap["segments"] for b in s["blocks"]
                   if b["state"] == "active_allocated" and b["address"] not in live
                   and b["address"] not in allocated and b["address"] not in freed_first)
    level = float(untraced + sum(freed_first.values()))
    sizes: dict[int, int] = {}
    out = []
    for e in events:
        if e["action"] == "alloc":
            sizes[e["addr"]] = e["size"]
            level += e["size"]
        elif e["action"] == "free_requested":
            level -= sizes.pop(e["addr"], e["size"])
        out.append(level)
    return out, max([float(untraced + sum(freed_first.values())), *out])


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_snapshot_replay_matches_direct_replay(fixtures_dir: Path, name: str) -> None:
    path = fixtures_dir / name
    assert detect_format(path) == "memory-snapshot"
    report = import_file(path)
    mem = report.memory
    events = mem[~mem["preexisting"].astype(bool)]
    expect, peak = _direct_replay(path)
    assert len(events) == len(expect) > 7000
    np.testing.assert_array_equal(events["allocated_bytes"].to_numpy("float64"), np.asarray(expect))
    assert float(mem["allocated_bytes"].max()) == peak
    # reserved: the dump's segments; every allocation row is attributed to a category
    assert (mem["reserved_bytes"] >= mem["allocated_bytes"]).all()
    blocks = mem[~mem["action"].isin(["segment_alloc", "segment_free"])]
    assert blocks["category"].notna().all() and not (blocks["category"] == "unknown").any()
    # the segments reserved before the first event are rows too (fragmentation at any event)
    segs = mem[mem["action"] == "segment_alloc"]
    assert segs["preexisting"].astype(bool).all() and segs["size_bytes"].sum() == mem["reserved_bytes"].iloc[0]
    allocs = events[events["action"] == "alloc"]
    assert allocs["source"].str.contains(r"\.py:\d+ ", regex=True).mean() > 0.9
    assert report.manifest["source"]["kind"] == "memory-snapshot"


def test_snapshot_time_window_keeps_the_replayed_level(fixtures_dir: Path) -> None:
    path = fixtures_dir / SNAPSHOTS[1]
    full = import_file(path).memory
    ev = full[~full["preexisting"].astype(bool)]
    t = ev["t_ns"].to_numpy()
    lo_ns, hi_ns = int(np.quantile(t, 0.4)), int(np.quantile(t, 0.6))
    window = import_snapshot(path, start_us=lo_ns / 1000, end_us=hi_ns / 1000).tables["memory"]
    wev = window[~window["preexisting"].astype(bool)]
    inside = ev[(ev["t_ns"] >= lo_ns) & (ev["t_ns"] <= hi_ns)]
    assert 0 < len(wev) == len(inside) < len(ev)
    np.testing.assert_array_equal(wev["allocated_bytes"].to_numpy(), inside["allocated_bytes"].to_numpy())


def test_mi300x_kineto_memory_equals_total_allocated(fixtures_dir: Path) -> None:
    path = fixtures_dir / MI300X
    with gzip.open(path, "rt") as fh:
        raw = [e for e in json.load(fh)["traceEvents"] if e.get("name") == "[memory]"]
    assert len(raw) == 475
    every = import_file(path).memory
    # one row before the events: what the GPU allocator's total counted before the trace, no event naming it
    pre = every[every["preexisting"].astype(bool)]
    assert list(pre["device"]) == ["cuda:0"] and list(pre["category"]) == ["before_recording"]
    mem = every[~every["preexisting"].astype(bool)]
    assert len(mem) == 475
    for dev_type, device in ((6, "cuda:0"), (0, "cpu")):
        want = sorted(((e["ts"], i, e["args"]["Total Allocated"]) for i, e in enumerate(raw)
                       if e["args"]["Device Type"] == dev_type))
        got = mem[mem["device"] == device]
        np.testing.assert_array_equal(got["allocated_bytes"].to_numpy("float64"),
                                      np.array([w[2] for w in want], dtype="float64"))
        if device == "cpu":  # torch's CPU allocator reserves nothing: its Total Reserved is 0, kept missing
            assert got["reserved_bytes"].isna().all()
        else:
            assert got["reserved_bytes"].max() == max(e["args"]["Total Reserved"] for e in raw
                                                      if e["args"]["Device Type"] == dev_type)
    gpu = mem[mem["device"] == "cuda:0"]
    allocs = gpu[gpu["action"] == "alloc"]
    assert allocs["op"].notna().mean() > 0.9 and allocs["module"].notna().any()


def _command_pickle(marker: Path) -> bytes:
    """Protocol-0 bytes of ``os.system("touch MARKER")``, written by hand: never loaded by pickle here."""
    return b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."


def test_pickle_that_runs_a_command_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(b"\x80\x02" + _command_pickle(marker)[0:])  # protocol 2 header, then the GLOBAL/REDUCE
    with pytest.raises(InputFormatError, match=r"os\.system"):
        import_snapshot(evil)
    assert not marker.exists()
    # the CLI: one line, non-zero, no traceback, nothing ran
    proc = subprocess.run([sys.executable, "-m", "perfscope", "import", str(evil), "--out", str(tmp_path / "r")],
                          check=False, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "os.system" in proc.stderr and "refused" in proc.stderr
    assert not marker.exists()


def test_pickle_reduce_without_global_is_refused(tmp_path: Path) -> None:
    """Without a global nothing callable reaches the stack: REDUCE on plain data fails, in one line."""
    path = tmp_path / "reduce.pickle"
    path.write_bytes(b"\x80\x04}\x94(\x8c\x08segments\x94]\x94N)R\x94u.")  # REDUCE on None
    with pytest.raises(InputFormatError, match="damaged or not a pickle .TypeError: 'NoneType' object is not callable"):
        import_snapshot(path)


@pytest.fixture(scope="module")
def torch_cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    out = tmp_path_factory.mktemp("torch_memory")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(out / "timeline.json"), device="cpu")
        prof.export_memory_timeline(str(out / "timeline.raw.json.gz"), device="cpu")
    prof.export_chrome_trace(str(out / "trace.json"))
    return out


def test_export_memory_timeline_is_read(torch_cpu_run: Path) -> None:
    path = torch_cpu_run / "timeline.json"
    assert detect_format(path) == "memory-timeline"
    times, sizes = json.loads(path.read_text())
    mem = import_file(path).memory
    totals = {}
    for t, row in zip(times, sizes):
        totals[int(t) * 1000] = sum(row)
    last = mem.groupby("t_ns")["allocated_bytes"].last()
    assert {int(k): float(v) for k, v in last.items()} == {k: float(v) for k, v in totals.items() if k in last.index}
    assert float(mem["allocated_bytes"].max()) == max(sum(r) for r in sizes)
    assert {"weights", "optimizer", "gradient"} <= set(mem["category"])
    raw = import_file(torch_cpu_run / "timeline.raw.json.gz").memory
    assert len(raw) > 0 and {"weights", "optimizer"} <= set(raw["category"])
    # at its peak, torch's categories add up to the total; it names no tensors (no addresses)
    from perfscope.analysis.summaries.memory import peaks

    (p,) = peaks(import_file(path))
    assert sum(p["by_category"].values()) == pytest.approx(max(sum(r) for r in sizes))
    assert p["breakdown"]["tensors"] == []


def test_cpu_kineto_memory_has_ops(torch_cpu_run: Path) -> None:
    mem = import_file(torch_cpu_run / "trace.json").memory
    assert len(mem) > 20 and set(mem["device"]) == {"cpu"}
    allocs = mem[mem["action"] == "alloc"]
    assert allocs["op"].notna().mean() > 0.6  # frees, and scalars made in Python, come between ops
    assert {"optimizer", "gradient"} & set(mem["category"])


# --- the fast paths read the same table (issue 40: a 1 GB snapshot in torch's layout) -------------------


def _same_table(a: Any, b: Any) -> None:
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_batches_and_trims_read_what_event_by_event_reads(fixtures_dir: Path, name: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each committed snapshot, and the same written at protocol 2 (BINPUT memo) and without a memo:
    read in batches column by column with the memo trimmed every 500 events, it is the table the
    event-by-event read (every value checked in Python, no trim) gives."""
    from perfscope.analysis.readers import snapshot

    path = fixtures_dir / name
    with open(path, "rb") as fh:
        snap = _PlainData(fh).load()
    paths = [path]
    for proto, fast in ((2, False), (4, True)):
        out = tmp_path / f"p{proto}{fast}.pickle"
        with open(out, "wb") as f:
            pk = pickle.Pickler(f, protocol=proto)
            pk.fast = fast
            pk.dump(snap)
        paths.append(out)
    window = (snap["device_traces"][0][2000]["time_us"], snap["device_traces"][0][6000]["time_us"])
    for p, lo, hi in ((path, None, None), (path, *window), *((q, None, None) for q in paths[1:])):
        monkeypatch.setattr(snapshot, "TRIM_EVENTS", 500)
        monkeypatch.setattr(snapshot, "SLOW_EVENTS", 100)
        fast_read = snapshot.import_snapshot(p, start_us=lo, end_us=hi)
        _, got = snapshot.load_snapshot(p)
        assert got.trimmed and (got.trims > 0) == (p.name != "p4True.pickle")  # trimmed (a memo), read once
        monkeypatch.setattr(snapshot, "TRIM_EVENTS", 1 << 40)
        monkeypatch.setattr(snapshot, "SLOW_EVENTS", 1 << 40)
        monkeypatch.setattr(snapshot._Reader, "_batch", lambda self, k, items: False)
        slow_read = snapshot.import_snapshot(p, start_us=lo, end_us=hi)
        monkeypatch.undo()
        _same_table(fast_read.tables["memory"], slow_read.tables["memory"])
        assert fast_read.manifest["params"] == slow_read.manifest["params"]


def test_pairing_by_address_is_the_event_by_event_pairing(fixtures_dir: Path) -> None:
    """Frees paired with their allocs at C speed (by address) as the event-by-event pairing does: on
    random orders of events at a few addresses (frees twice, free_completed alone, no address, -0.0)
    and on the committed snapshots' events."""
    from perfscope.analysis.memory import _pair, _pair_each

    rng = np.random.default_rng(40)
    cases = []
    for k in range(2000):
        n = int(rng.integers(1, 40))
        action = rng.choice([0, 1, 2, 3, 5], size=n, p=[0.35, 0.3, 0.25, 0.05, 0.05]).astype("int8") if k % 2 else \
            np.array([[0, 1, 2], [0, 2, 0], [0, 1, 0]][k % 3] * 14, dtype="int8")[:n]  # well-formed runs
        addr = rng.choice([1.0, 2.0, 3.0, np.nan, -0.0, 0.0], size=n) if k % 2 else np.repeat(rng.choice([1.0, 2.0]), n)
        cases.append((action, rng.choice([512.0, 1024.0, np.nan], size=n), addr))
    codes = {"alloc": 0, "free_requested": 1, "free": 1, "free_completed": 2, "segment_alloc": 3, "segment_free": 4}
    for name in SNAPSHOTS:
        with open(fixtures_dir / name, "rb") as fh:
            events = [e for e in _PlainData(fh).load()["device_traces"][0] if e["action"] in codes]
        cases.append((np.array([codes[e["action"]] for e in events], dtype="int8"),
                      np.array([e["size"] for e in events], dtype="float64"),
                      np.array([e["addr"] for e in events], dtype="float64")))
    for action, size, addr in cases:
        fast, each = _pair(action, size, addr), _pair_each(action, size, addr)
        for x, y in zip(fast[:5], each[:5]):
            np.testing.assert_array_equal(x, y)
        assert set(fast[5].tolist()) == set(each[5].tolist())  # the addresses live at the end


def test_a_large_memory_table_written_in_row_groups_reads_back_the_same(fixtures_dir: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed snapshot's memory table (nullable Int64, boolean, text with missing values, a column of
    nothing but None) written in slices of 1,000 rows reads back as the table written in one piece, with
    the schema's dtypes, and the peak breakdown read from it is the same."""
    from perfscope import report as report_module
    from perfscope.analysis.summaries.memory import peaks
    from perfscope.report import Report
    from perfscope.schema import MEMORY_COLUMNS

    report = import_file(fixtures_dir / SNAPSHOTS[0])
    mem = report.memory
    assert len(mem) > 3000 and mem["module"].isna().all() and mem["free_t_ns"].isna().any()
    whole = Report.load(report.save(tmp_path / "whole"))
    monkeypatch.setattr(report_module, "ROW_GROUP", 1000)
    sliced_path = report.save(tmp_path / "sliced")
    import pyarrow.parquet as pq

    assert pq.ParquetFile(sliced_path / "memory.parquet").num_row_groups == -(-len(mem) // 1000)
    sliced = Report.load(sliced_path)
    pd.testing.assert_frame_equal(sliced.memory, whole.memory, check_exact=True)
    assert pq.ParquetFile(tmp_path / "whole" / "memory.parquet").num_row_groups == 1
    numbers = [c.name for c in MEMORY_COLUMNS if c.kind != "str"]  # text reads back as pandas' str dtype
    pd.testing.assert_frame_equal(sliced.memory[numbers], mem[numbers], check_exact=True)
    assert str(sliced.memory["free_t_ns"].dtype) == "Int64" and str(sliced.memory["preexisting"].dtype) == "boolean"
    assert peaks(sliced) == peaks(report)
