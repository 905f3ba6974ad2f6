"""Fuzzing the importers with mutated real fixtures (Kineto JSON/gz, nsys SQLite, ncu-rep, ncu CSV).

Every case is seeded (its id names the seed: ``pytest -k kineto-json-0042`` reruns one) and
must end as a ``Report`` that saves and loads, or as a ``PerfscopeError`` with one message
(naming the file, for input errors) -- never another exception, never a hang (each case runs
under an alarm). Save and load are checked once per distinct report content (a fingerprint of
its tables and manifest): they are a function of that content only, and many mutations (a
flipped byte in a skipped field, say) give the same report.

Mutations: truncation at random offsets, byte flips, deleted/duplicated/zeroed chunks; JSON
structure edits (wrong types for ts/dur/args/name, missing keys, huge numbers, NaN/Infinity,
nested garbage, odd and non-UTF-8 names, broken metadata, other top-level shapes); SQLite page
corruption, dropped tables and columns, wrong-typed values, deleted rows; CSV broken rows;
deviceProperties values, kernel durations (negative, huge), string lengths (names up to 300 KB,
5 MB before the events array); output paths (a parent that is a file, a name too long, odd
characters, a folder that is not a report).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.errors import InputFormatError, PerfscopeError
from perfscope.report import Report

SEED = 20260430
CASE_SECONDS = 30
"""A case that runs longer than this is a hang."""

KINETO = ("kineto/kineto_docs_h100_before_fix.json",
          "kineto/hta_critical_path__cuda_event_sync_multi_stream__event_sync_trace.json.gz",
          "kineto/hta_cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
          "kineto/tracelens_torch_compile_triton__trace.json.gz")
NSYS = ("nsys/nvfuser_h100_matmul.sqlite",)
NCU_REP = ("ncu/esmm_a10g_roofline_set.ncu-rep",)
NCU_CSV = ("ncu/esmm_a10g_roofline_metrics.csv",)

COUNTS = {"kineto-json": 330, "kineto-bytes": 420, "nsys-sql": 60, "nsys-bytes": 60,
          "ncu-csv": 70, "ncu-rep": 60, "kineto-fields": 100, "output-path": 40}
"""Cases per family (1140 in all; fewer where one import costs more, as for nsys exports)."""

CASES = [f"{family}-{i:04d}" for family, n in COUNTS.items() for i in range(n)]


# ---------------------------------------------------------------------------- harness
@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"import ran longer than {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _kinds(value: Any) -> str:
    """The shape of a value as serialisation sees it: types, nesting, and odd text."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_kinds(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + "|".join(sorted({_kinds(v) for v in value})) + "]"
    if isinstance(value, str):
        odd = "" if value.isascii() else "!" + ("~" if any("\ud800" <= c <= "\udfff" for c in value) else "")
        return "str" + odd + ("0" if "\x00" in value else "")
    return type(value).__name__


def fingerprint(report: Report) -> str:
    """What decides whether a report saves and loads: per table its columns and dtypes, and for
    object columns the types (and non-ASCII / NUL text) of their values; the manifest's shape.
    Two reports with the same fingerprint take the same path through Parquet and JSON."""
    parts = []
    for name in ("kernels", "ranges", "transfers", "api", "counters", "requests", "steps"):
        df = getattr(report, name)
        parts.append(f"{name}:{bool(len(df))}")
        for col, dtype in df.dtypes.items():
            kinds = "|".join(sorted({_kinds(v) for v in df[col].unique()})) if dtype == object else ""
            parts.append(f"{col}:{dtype}:{kinds}")
    parts.append(_kinds({k: v for k, v in report.manifest.items() if k != "created"}))
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()


def check_outcome(path: Path, out_dir: Path, verified: set[str]) -> str:
    """Import ``path``; assert the outcome is a round-tripping Report or a PerfscopeError."""
    try:
        with alarm(CASE_SECONDS):
            report = import_file(path)
    except PerfscopeError as exc:
        message = str(exc)
        assert message and "\n" not in message.strip() and "Traceback" not in message
        if isinstance(exc, InputFormatError):
            assert str(path) in message
        return "error"
    assert isinstance(report, Report)
    key = fingerprint(report)
    if key not in verified:
        loaded = Report.load(report.save(out_dir / "case.perfscope", force=True))
        for name in ("kernels", "ranges", "transfers", "api"):
            assert len(getattr(loaded, name)) == len(getattr(report, name)), name
        assert loaded.manifest["partial"] == report.manifest["partial"]
        verified.add(key)
    return "report"


def run_case(case: str, fixtures_dir: Path, work: Path, verified: set[str]) -> str:
    """``report`` or ``error``; anything else is the failure (its traceback)."""
    family = case.rsplit("-", 1)[0]
    case_dir = work / case
    case_dir.mkdir(parents=True, exist_ok=True)
    try:
        if family in CHECK:
            return CHECK[family](random.Random(f"{SEED}:{case}"), fixtures_dir, case_dir, verified)
        path = MUTATE[family](random.Random(f"{SEED}:{case}"), fixtures_dir, case_dir)
        return check_outcome(path, case_dir, verified)
    except Exception as exc:  # noqa: BLE001 -- the failure is reported, not raised, in a worker
        return "FAIL " + "".join(traceback.format_exception(exc))[-4000:]
    finally:
        shutil.rmtree(case_dir, ignore_errors=True)


# ---------------------------------------------------------------------------- workers
MARK = "@@fuzz@@ "
WORKERS = max(1, min(4, os.cpu_count() or 1))
"""Worker processes: a case costs ~50-250 ms (import, and save + load once per class)."""


def run_cases(cases: list[str], fixtures_dir: Path, work: Path) -> dict[str, str]:
    """Outcome of each case, run in :data:`WORKERS` fresh interpreters (in-process if one).

    A worker that dies or stops answering (a crash or hang in a C extension) fails the cases
    it had left, naming the case it was on.
    """
    n = min(WORKERS, len(cases))
    if n <= 1:
        verified: set[str] = set()
        return {case: run_case(case, fixtures_dir, work, verified) for case in cases}
    shares = [cases[i::n] for i in range(n)]
    procs = [subprocess.Popen([sys.executable, __file__, str(fixtures_dir), str(work / f"w{i}")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(n)]
    for proc, share in zip(procs, shares):
        assert proc.stdin is not None
        proc.stdin.write("".join(f"{case}\n" for case in share))
        proc.stdin.close()
    results: dict[str, str] = {}
    for proc, share in zip(procs, shares):
        results.update(_collect(proc, share))
    return results


def _collect(proc: subprocess.Popen[str], share: list[str]) -> dict[str, str]:
    assert proc.stdout is not None
    results: dict[str, str] = {}
    while len(results) < len(share):
        ready, _, _ = select.select([proc.stdout], [], [], CASE_SECONDS + 60)
        line = proc.stdout.readline() if ready else ""
        if not line:
            proc.kill()
            current = share[len(results)]
            why = "stopped answering (a hang)" if not ready else f"died (exit {proc.wait()})"
            return {**results, **{c: f"FAIL worker {why} on {current}" for c in share[len(results):]}}
        if line.startswith(MARK):
            outcome = json.loads(line[len(MARK):])
            results[outcome["case"]] = outcome["outcome"]
    proc.wait()
    return results


def _worker(fixtures_dir: Path, work: Path) -> None:
    verified: set[str] = set()
    for line in sys.stdin:
        case = line.strip()
        outcome = run_case(case, fixtures_dir, work, verified)
        print(MARK + json.dumps({"case": case, "outcome": outcome}), flush=True)


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, fixtures_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every selected case, run once up front in parallel workers."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if getattr(item, "callspec", None) and "case" in item.callspec.params
                and item.module is request.module]
    return run_cases(selected, fixtures_dir, tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("case", CASES)
def test_mutated_input_gives_a_report_or_a_perfscope_error(case, outcomes):
    assert outcomes[case] in ("report", "error"), f"{case}: {outcomes[case]}"


REGRESSIONS = {
    "kineto-json-0001": "a trace with no operator and no kernel rows: KeyError 'flops' in read_kineto",
    "ncu-rep-0003": "a launch whose name did not survive: TypeError in ncu_metrics.short_name_of",
    "ncu-rep-0019": "a metric name the binding cannot take back: TypeError in IAction.metric_by_name",
    "nsys-sql-0005": "text in an integer column: ValueError in nsys_reader._common",
    "nsys-sql-0014": "text in an enum column: ValueError in nsys_reader._memcpy",
    "nsys-sql-0019": "text in an id column: ValueError in nsys_db._ints",
    "nsys-bytes-0034": "a damaged schema: SQLite's multi-line error text in the message",
    "nsys-bytes-0046": "a non-UTF-8 schema: UnicodeDecodeError in nsys_db._connect",
}
"""Cases that failed before their reader was fixed (they stay in :data:`CASES`)."""


def test_regression_cases_are_still_fuzzed():
    assert set(REGRESSIONS) <= set(CASES)


def test_a_trace_without_operators_or_kernels_is_an_empty_report(tmp_path):
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 1, "ts": 5, "dur": 10}]}))
    report = import_file(path)
    assert len(report.kernels) == 0 and len(report.ranges) == 1
    assert report.unavailable_metrics == ["flops", "dram_bytes"]
    assert len(Report.load(report.save(tmp_path / "r.perfscope")).ranges) == 1


def test_text_in_an_nsys_integer_column_costs_those_rows_and_is_named(fixtures_dir, tmp_path):
    """Every copy's start is text: the copies are dropped, counted under the table and column, and the
    kernels are read as from the clean file (the file was refused whole before, nsys-sql-0005)."""
    path = tmp_path / "export.sqlite"
    shutil.copyfile(fixtures_dir / NSYS[0], path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET start = 'garbage'")
        (copies,) = conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
    conn.close()
    clean, report = import_file(fixtures_dir / NSYS[0]), import_file(path)
    assert copies and len(report.transfers) == len(clean.transfers) - copies
    assert report.kernels["duration_ns"].sum() == clean.kernels["duration_ns"].sum()
    assert f"CUPTI_ACTIVITY_KIND_MEMCPY.start: {copies} value(s) not a whole number" in "\n".join(report.warnings)


# ---------------------------------------------------------------------------- bytes
def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One random byte-level damage: truncation, flips, deleted/duplicated/zeroed/inserted chunk."""
    buf = bytearray(data)
    n = max(len(buf), 1)
    kind = rng.choice(("truncate", "truncate", "flip", "flip", "delete", "duplicate", "zero", "insert"))
    if kind == "truncate":
        return bytes(buf[: rng.randrange(n)])
    start = rng.randrange(n)
    end = min(n, start + rng.choice((1, 3, 16, 64, 512, 4096)))
    if kind == "flip":
        for _ in range(rng.randint(1, 24)):
            i = rng.randrange(n)
            if i < len(buf):
                buf[i] ^= 1 << rng.randrange(8)
    elif kind == "delete":
        del buf[start:end]
    elif kind == "duplicate":
        buf[end:end] = buf[start:end]
    elif kind == "zero":
        buf[start:end] = bytes(end - start)
    else:
        buf[start:start] = rng.randbytes(end - start)
    return bytes(buf)


def _fixture_bytes(fixtures_dir: Path, rel: str) -> bytes:
    data = (fixtures_dir / rel).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _write(path: Path, data: bytes, *, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    return path


# ---------------------------------------------------------------------------- Kineto
DEEP = "@@deep@@"
BAD_UTF8 = "@@bad-utf8@@"


def weird(rng: random.Random) -> Any:
    """A value of the wrong type, size or text."""
    return rng.choice([
        None, True, False, "", "text", "12.5", "nan", -1, 0, 2**64, 10**30, -(10**30), 1e308, -1e308,
        1.5, float("nan"), float("inf"), float("-inf"), [], [1, "a", None], [[1, 2], [3]], {}, {"a": [1]},
        DEEP, BAD_UTF8, "x" * rng.choice((300, 70_000)), "\ud800bad", "名前\u0000\x1f", "<script>\"'",
        "aten::mm", "Memcpy HtoD (Pageable -> Device)", "kernel", "cpu_op",
    ])


ARG_KEYS = ("External id", "correlation", "Input Dims", "Input type", "Concrete Inputs", "device",
            "stream", "grid", "block", "registers per thread", "shared memory", "bytes",
            "est. achieved occupancy %", "fromDevice")
EVENT_KEYS = ("ts", "dur", "name", "cat", "ph", "pid", "tid", "args", "id")


def _edit_event(rng: random.Random, events: list[Any]) -> None:
    if not events:
        events.append(weird(rng))
        return
    i = rng.randrange(len(events))
    e = events[i]
    if not isinstance(e, dict):
        events[i] = weird(rng)
        return
    e = dict(e)
    edit = rng.choice(("set", "set", "arg", "arg", "drop", "dup", "remove", "replace", "steal"))
    if edit == "set":
        e[rng.choice(EVENT_KEYS)] = weird(rng)
    elif edit == "arg":
        args = dict(e["args"]) if isinstance(e.get("args"), dict) else {}
        key = rng.choice(ARG_KEYS)
        if key in args and rng.random() < 0.3:
            del args[key]
        else:
            args[key] = weird(rng)
        e["args"] = args
    elif edit == "drop":
        e.pop(rng.choice(EVENT_KEYS), None)
    elif edit == "dup":
        events.insert(rng.randrange(len(events) + 1), e)
    elif edit == "remove":
        del events[i]
        return
    elif edit == "replace":
        events[i] = weird(rng)
        return
    else:  # take a field from another event (a kernel becomes a cpu_op, times collide, ...)
        other = events[rng.randrange(len(events))]
        if isinstance(other, dict):
            key = rng.choice(EVENT_KEYS)
            if key in other:
                e[key] = other[key]
    events[i] = e


def _edit_top(rng: random.Random, doc: dict[str, Any]) -> Any:
    edit = rng.choice(("events", "devices", "base", "dist", "array", "wrap", "big-meta", "order", "drop"))
    if edit == "events":
        doc["traceEvents"] = weird(rng)
    elif edit == "devices":
        doc["deviceProperties"] = rng.choice([weird(rng), [weird(rng)], [{"name": weird(rng), "numSms": weird(rng)}]])
    elif edit == "base":
        doc["baseTimeNanoseconds"] = weird(rng)
    elif edit == "dist":
        doc["distributedInfo"] = weird(rng)
    elif edit == "array":
        return doc.get("traceEvents")
    elif edit == "wrap":
        return rng.choice([[doc], {"data": doc}, 42, "trace"])
    elif edit == "big-meta":  # the events array starts beyond the head the block reader scans
        return {"padding": "p" * ((4 << 20) + 4096), **doc}
    elif edit == "order":  # events first, metadata after
        return {"traceEvents": doc.get("traceEvents"), **{k: v for k, v in doc.items() if k != "traceEvents"}}
    else:
        doc.pop("traceEvents", None)
    return doc


def _dump(rng: random.Random, doc: Any) -> bytes:
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5, allow_nan=True)
    depth = rng.choice((40, 900, 5000))
    text = text.replace(json.dumps(DEEP), "[" * depth + "]" * depth)
    data = text.encode("utf-8", "surrogatepass")
    return data.replace(BAD_UTF8.encode(), b"bad\xff\xfe\xc3(")


_DOCS: dict[str, Any] = {}


def mutate_kineto_json(rng: random.Random, fixtures_dir: Path, out: Path) -> Path:
    rel = rng.choice(KINETO)
    if rel not in _DOCS:
        _DOCS[rel] = json.loads(_fixture_bytes(fixtures_dir, rel))
    doc = dict(_DOCS[rel])
    doc["traceEvents"] = list(doc["traceEvents"])
    for _ in range(rng.randint(1, 5)):
        _edit_event(rng, doc["traceEvents"])
    result: Any = doc
    if rng.random() < 0.3:
        result = _edit_top(rng, doc)
    gz = rng.random() < 0.3
    return _write(out / ("trace.json.gz" if gz else "trace.json"), _dump(rng, result), gz=gz)


def mutate_kineto_bytes(rng: random.Random, fixtures_dir: Path, out: Path) -> Path:
    rel = rng.choice(KINETO)
    if rng.random() < 0.25:  # damage the compressed stream itself
        raw = (fixtures_dir / rel).read_bytes()
        raw = raw if raw[:2] == b"\x1f\x8b" else gzip.compress(raw)
        return _write(out / "trace.json.gz", mutate_bytes(rng, raw))
    data = _fixture_bytes(fixtures_dir, rel)
    for _ in range(rng.randint(1, 3)):
        data = mutate_bytes(rng, data)
    gz = rng.random() < 0.3
    return _write(out / ("trace.json.gz" if gz else "trace.json"), data, gz=gz)


# ---------------------------------------------------------------------------- nsys SQLite
NSYS_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
               "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS", "StringIds", "TARGET_INFO_GPU",
               "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "META_DATA_EXPORT", "META_DATA_CAPTURE",
               "TARGET_INFO_CUDA_STREAM", "ThreadNames", "PROCESSES")
SQL_VALUES = (None, "garbage", b"\x00\xff", -1, 0, 2**62, -(2**62), 1.5, "", "1e999", "名前")


def _sql_edit(rng: random.Random, conn: sqlite3.Connection) -> None:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    if not tables:
        return
    interesting = [t for t in NSYS_TABLES if t in tables]
    table = rng.choice(interesting) if interesting and rng.random() < 0.8 else rng.choice(tables)
    cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
    rowids = [r[0] for r in conn.execute(f'SELECT rowid FROM "{table}" ORDER BY rowid')]
    some = rng.sample(rowids, min(len(rowids), rng.choice((1, 3, 50)))) if rowids else []
    marks = ",".join("?" * len(some))
    edit = rng.choice(("drop", "drop-col", "set", "set", "set", "delete-some", "delete-all", "rename"))
    if edit == "drop":
        conn.execute(f'DROP TABLE "{table}"')
    elif edit == "drop-col" and cols:
        conn.execute(f'ALTER TABLE "{table}" DROP COLUMN "{rng.choice(cols)}"')
    elif edit == "set" and cols and some:
        conn.execute(f'UPDATE "{table}" SET "{rng.choice(cols)}" = ? WHERE rowid IN ({marks})',
                     [rng.choice(SQL_VALUES), *some])
    elif edit == "delete-some" and some:
        conn.execute(f'DELETE FROM "{table}" WHERE rowid IN ({marks})', some)
    elif edit == "delete-all":
        conn.execute(f'DELETE FROM "{table}"')
    elif edit == "rename":
        conn.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_old"')


def mutate_nsys_sql(rng: random.Random, fixtures_dir: Path, out: Path) -> Path:
    path = _write(out / "export.sqlite", (fixtures_dir / rng.choice(NSYS)).read_bytes())
    conn = sqlite3.connect(path)
    try:
        for _ in range(rng.randint(1, 4)):
            try:
                _sql_edit(rng, conn)
            except sqlite3.Error:
                pass  # an edit SQLite refuses (a column in an index, say) is no mutation
        conn.commit()
    finally:
        conn.close()
    return path


def mutate_nsys_bytes(rng: random.Random, fixtures_dir: Path, out: Path) -> Path:
    data = bytearray((fixtures_dir / rng.choice(NSYS)).read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    pages = len(data) // page
    edit = rng.choice(("page", "page", "page-cut", "bytes"))
    if edit == "page":  # garbage over part of one page (the first page now and then)
        first = 0 if rng.random() < 0.1 else rng.randrange(1, pages) * page
        start = first + rng.randrange(page)
        size = rng.choice((4, 64, page))
        data[start:start + size] = rng.randbytes(min(size, len(data) - start))
    elif edit == "page-cut":
        del data[rng.randrange(1, pages) * page:]
    else:
        data = bytearray(mutate_bytes(rng, bytes(data)))
    return _write(out / "export.sqlite", bytes(data))


# ---------------------------------------------------------------------------- ncu
def _csv_edit(rng: random.Random, lines: list[bytes]) -> None:
    i = rng.randrange(len(lines)) if lines else 0
    edit = rng.choice(("delete", "dup", "cut", "insert", "field", "field", "field", "swap", "header", "bad-utf8"))
    if not lines or edit == "insert":
        lines.insert(i, rng.choice([b"", b"==PROF== Disconnected from process 1", b"garbage,,,", b'"unterminated,"x',
                                    rng.randbytes(20), b'"1","2"', b",".join([b'"x"'] * 40)]))
    elif edit == "delete":
        del lines[i]
    elif edit == "dup":
        lines.insert(i, lines[i])
    elif edit == "cut":
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    elif edit == "field":
        fields = lines[i].split(b'","')
        j = rng.randrange(len(fields))
        fields[j] = rng.choice([b"n/a", b"1,234,567", b"1e999", b"-", b"", b"-5", b"inf", b"nan", b'x"y',
                                b"0x1F", "名前".encode(), b"99999999999999999999999"])
        lines[i] = b'","'.join(fields)
    elif edit == "swap":
        fields = lines[i].split(b",")
        rng.shuffle(fields)
        lines[i] = b",".join(fields)
    elif edit == "header":
        lines[0] = rng.choice([b"", b'"ID","Kernel Name"', lines[0].replace(b'"Metric Value"', b'"Value"')])
    else:
        lines[i] = lines[i] + b"\xff\xfe\xc3("


def mutate_ncu_csv(rng: random.Random, fixtures_dir: Path, out: Path) -> Path:
    lines = (fixtures_dir / rng.choice(NCU_CSV)).read_bytes().split(b"\n")
    for _ in range(rng.randint(1, 4)):
        _csv_edit(rng, lines)
    return _write(out / "metrics.csv", b"\n".join(lines))


def mutate_ncu_rep(rng: random.Random, fixtures_dir: Path, out: Path) -> Path:
    return _write(out / "report.ncu-rep", mutate_bytes(rng, (fixtures_dir / rng.choice(NCU_REP)).read_bytes()))


# ---------------------------------------------------------------------------- fields, lengths, outputs
PROPERTY_KEYS = ("numSms", "totalGlobalMem", "computeMajor", "computeMinor", "name", "id", "maxThreadsPerBlock")
ODD_DURATIONS = (-1, -1e6, -0.001, 0, 1e15, 9e15, 2**63, -(2**63), 1e308, float("nan"), float("inf"), None, "10", [5])


def mutate_kineto_fields(rng: random.Random, fixtures_dir: Path, out: Path) -> Path:
    """deviceProperties values, kernel durations (negative, huge) and string lengths (names, a long
    value before the events array) of a real trace (issue 30)."""
    rel = rng.choice(KINETO)
    if rel not in _DOCS:
        _DOCS[rel] = json.loads(_fixture_bytes(fixtures_dir, rel))
    doc = dict(_DOCS[rel])
    events = doc["traceEvents"] = [dict(e) if isinstance(e, dict) else e for e in doc["traceEvents"]]
    props = [dict(p) for p in doc.get("deviceProperties") or [{"name": "NVIDIA H100"}] if isinstance(p, dict)]
    for _ in range(rng.randint(0, 3)):
        if props:
            props[rng.randrange(len(props))][rng.choice(PROPERTY_KEYS)] = weird(rng)
    doc["deviceProperties"] = props if rng.random() < 0.9 else weird(rng)
    timed = [e for e in events if isinstance(e, dict) and "dur" in e]
    for e in rng.sample(timed, min(len(timed), rng.randint(0, 6))):
        e["dur"] = rng.choice(ODD_DURATIONS)
    named = [e for e in events if isinstance(e, dict) and "name" in e]
    for e in rng.sample(named, min(len(named), rng.randint(0, 3))):
        e["name"] = rng.choice(("k" * rng.choice((1, 5000, 300_000)), "\x1b]0;t\x07" * 50, "", "\u202e" * 9))
    if rng.random() < 0.2:  # a long value before the events array (HEAD_KEEP is 4 MB)
        doc = {"junk": "A" * rng.choice((10, 5 << 20)), **doc}
    gz = rng.random() < 0.5
    return _write(out / ("trace.json.gz" if gz else "trace.json"), _dump(rng, doc), gz=gz)


def _odd_output(rng: random.Random, out: Path) -> Path:
    """An output folder that may not be writable: a parent that is a file, a name too long, odd
    characters, an existing folder that is not a report, deep nesting."""
    (out / "afile").write_text("x")
    (out / "notreport").mkdir(exist_ok=True)
    return rng.choice([
        out / "afile" / "r.perfscope", out / "afile" / "a" / "b" / "r.perfscope", out / ("x" * 300 + ".perfscope"),
        out / "new\nline\x1b[2J.perfscope", out / "名前.perfscope", out / "notreport", out / "a" / "b" / "c" / "r.perfscope",
        out / "ok.perfscope", out / ".." / out.name / "dots.perfscope",
    ])


def check_output_path(rng: random.Random, fixtures_dir: Path, out: Path, verified: set[str]) -> str:
    """Save a real report to an odd output path: a report that loads, or one PerfscopeError line,
    and nothing left behind but what was there."""
    if "report" not in _DOCS:
        _DOCS["report"] = import_file(fixtures_dir / KINETO[0])
    target = _odd_output(rng, out)
    before = {p.name for p in out.iterdir()}
    try:
        saved = _DOCS["report"].save(target, force=rng.random() < 0.5)
    except PerfscopeError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        assert {p.name for p in out.iterdir()} == before, "left behind"
        return "error"
    assert len(Report.load(saved).kernels) == len(_DOCS["report"].kernels)
    return "report"


MUTATE: dict[str, Callable[[random.Random, Path, Path], Path]] = {
    "kineto-json": mutate_kineto_json, "kineto-bytes": mutate_kineto_bytes,
    "nsys-sql": mutate_nsys_sql, "nsys-bytes": mutate_nsys_bytes,
    "ncu-csv": mutate_ncu_csv, "ncu-rep": mutate_ncu_rep, "kineto-fields": mutate_kineto_fields,
}
CHECK: dict[str, Callable[[random.Random, Path, Path, set[str]], str]] = {"output-path": check_output_path}
"""Families that check something other than an import of a mutated file."""


if __name__ == "__main__":  # a worker of run_cases: case ids on stdin, outcomes on stdout
    _worker(Path(sys.argv[1]), Path(sys.argv[2]))
