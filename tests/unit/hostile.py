"""Hostile variants of every input format perfscope reads, one generator per registered reader format
(``perfscope.analysis.readers.detect.READERS``): the corpus tests/unit/test_hostile_inputs.py runs on
every reader, by registration (a format without a generator here fails that test).

Each generator returns cases ``(name, make)``; ``make(fixtures_dir, out)`` writes the input into the
empty folder ``out`` and returns the path to import. Seeds are the committed real fixtures (trimmed
where they are large) or, for formats without a small real one (NVML samples, memory timelines,
snapshots, rocprofv3 JSON), files written in the layout their writers use. What is covered, per format:

- every format (:func:`common`): truncated (half, head), expanded (the content repeated), compressed
  (gzip, a damaged gzip, zstd bytes), a FIFO, ``/dev/zero``, a symbolic-link loop, an empty file, a
  folder where the file should be;
- SQLite (nsys, rocpd, rocprof v1 .db): a recursive, a spinning, a ``zeroblob`` and a cross-joining view
  in a table's place, a hostile view under a trusted one, dropped columns, text, huge and negative values;
- CSV and JSON: missing columns, wrong types, huge (1e400, 10^30) and non-finite numbers, negative
  durations, nesting depth, a long line, nested ranges;
- pickles (memory snapshots): memo/reference bombs, one event repeated, a 10^400 integer, a list where a
  dict belongs, deep nesting, opcodes that call code;
- rocprof-compute roofs: 1e308, 1e400, negative and NaN in roofline.csv, a FIFO in the workload folder.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

Make = Callable[[Path, Path], Path]
Case = tuple[str, Make]

KINETO = "kineto/kineto_docs_h100_before_fix.json"
NSYS = "nsys/nvfuser_h100_matmul.sqlite"
NCU_REP = "ncu/esmm_a10g_roofline_set.ncu-rep"
NCU_CSV = "ncu/esmm_a10g_roofline_metrics.csv"
V3_CSV = "rocprof/rocprofv3_llamacpp_gfx1151_trimmed"
ROCPD = "rocprof/llamacpp_r9700_rocpd/32432_results.db"
V1 = "rocprof/llamacpp_r9700_rocprof_v1"
V2_CSV = "rocprof/aiter_fmla_MI308X_rocprofv2_trace/results_430889.csv"
COMPUTE = "rocprof/rocprof_compute_vcopy_MI200"
ROCPD_UUID = "_00000a10_7bc0_7bc0_a1ef_6b94d43555c0"


# ---------------------------------------------------------------------------- seeds
def _copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def seed_kineto(f: Path, out: Path) -> Path:
    return _copy(f / KINETO, out / "trace.json")


def seed_nsys(f: Path, out: Path) -> Path:
    return _copy(f / NSYS, out / "export.sqlite")


def seed_nsys_rep(f: Path, out: Path) -> Path:
    path = out / "capture.nsys-rep"
    path.write_bytes(b"\x00NSYS-REP\x00" + os.urandom(256))
    return path


def seed_ncu_rep(f: Path, out: Path) -> Path:
    return _copy(f / NCU_REP, out / "report.ncu-rep")


def seed_ncu_csv(f: Path, out: Path) -> Path:
    return _copy(f / NCU_CSV, out / "metrics.csv")


def seed_nvml(f: Path, out: Path, rows: dict[str, list[Any]] | None = None) -> Path:
    """NVML samples written by the sampler's own writer (collectors.nvml.write_samples)."""
    import pandas as pd

    from perfscope.collectors.nvml import write_samples

    n = 50
    frame = pd.DataFrame(rows or {"t_ns": [i * 10_000_000 for i in range(n)], "device": ["cuda:0"] * n,
                                  "gpu_util_pct": [50.0 + i % 50 for i in range(n)], "power_w": [300.0] * n,
                                  "mem_used_bytes": [float(1 << 30)] * n})
    path = out / "nvml.parquet"
    write_samples(frame, {"rate_hz": 100}, path)
    return path


def seed_v3_csv(f: Path, out: Path) -> Path:
    run = out / "run"
    run.mkdir()
    for name in ("decode_kernel_trace.csv", "decode_hip_api_trace.csv"):
        shutil.copyfile(f / V3_CSV / name, run / name)
    return run / "decode_kernel_trace.csv"


V3_DOC_AGENT = {"id": {"handle": 1}, "type": 2, "name": "gfx942", "product_name": "AMD Instinct MI300X",
                "cu_count": 304, "node_id": 2, "logical_node_id": 1, "max_engine_clk_fcompute": 2100}


def v3_doc(n: int = 50, **edits: Any) -> dict[str, Any]:
    """A rocprofv3 ``*_results.json`` in its writer's layout (rocprofiler-sdk's JSON: buffer_records,
    strings, kernel_symbols, agents)."""
    dispatch = [{"kind": 0, "start_timestamp": 1000 + 100 * i, "end_timestamp": 1050 + 100 * i,
                 "correlation_id": {"internal": i + 1},
                 "dispatch_info": {"agent_id": {"handle": 1}, "queue_id": {"handle": 1}, "kernel_id": 3,
                                   "dispatch_id": i + 1, "grid_size": {"x": 256, "y": 1, "z": 1},
                                   "workgroup_size": {"x": 64, "y": 1, "z": 1}}} for i in range(n)]
    tool = {"metadata": {"pid": 7}, "agents": [V3_DOC_AGENT],
            "kernel_symbols": [{"kernel_id": 3, "formatted_kernel_name": "gemm_kernel"}],
            "strings": {"buffer_records": [{"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_COMPLETE"]}]},
            "buffer_records": {"kernel_dispatch": dispatch}}
    tool.update(edits)
    return {"rocprofiler-sdk-tool": [tool]}


def seed_v3_json(f: Path, out: Path) -> Path:
    path = out / "7_results.json"
    path.write_text(json.dumps(v3_doc()))
    return path


def seed_rocpd(f: Path, out: Path) -> Path:
    """The real rocpd database, trimmed to its first 200 dispatches (a copy; the views are rocprofv3's own)."""
    path = _copy(f / ROCPD, out / "1_results.db")
    with sqlite3.connect(path) as db:
        db.execute(f"DELETE FROM rocpd_kernel_dispatch{ROCPD_UUID} WHERE id > 200")
        db.execute(f"DELETE FROM rocpd_region{ROCPD_UUID} WHERE id > 400")
    db = sqlite3.connect(path)
    db.execute("VACUUM")
    db.close()
    return path


def seed_v1_csv(f: Path, out: Path) -> Path:
    return _copy(f / V2_CSV, out / "results.csv")


def seed_v1_db(f: Path, out: Path) -> Path:
    return _copy(f / V1 / "results.db", out / "results.db")


def seed_v1_json(f: Path, out: Path) -> Path:
    return _copy(f / V1 / "results.json", out / "results.json")


def seed_stats(f: Path, out: Path) -> Path:
    for name in ("results.stats.csv", "results.csv", "results.sysinfo.txt"):
        shutil.copyfile(f / V1 / name, out / name)
    return out / "results.stats.csv"


def seed_compute(f: Path, out: Path) -> Path:
    return _copy(f / COMPUTE, out / "workload")


def snapshot_doc(events: list[Any] | None = None) -> dict[str, Any]:
    """A memory snapshot in torch.cuda.memory._dump_snapshot()'s layout (segments, device_traces)."""
    frames = [{"name": "mm", "filename": "model.py", "line": 10}]
    trace = events if events is not None else [
        {"action": a, "addr": 4096 * (i // 2), "size": 512, "stream": 0, "time_us": 1000 + i, "frames": frames}
        for i, a in enumerate(["alloc", "free_completed"] * 20)]
    return {"segments": [{"device": 0, "address": 0, "total_size": 1 << 20, "segment_pool_id": (0, 0),
                          "blocks": [{"address": 0, "size": 512, "state": "inactive", "frames": frames}]}],
            "device_traces": [trace]}


def seed_snapshot(f: Path, out: Path) -> Path:
    path = out / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot_doc(), protocol=4))
    return path


def seed_timeline(f: Path, out: Path) -> Path:
    path = out / "timeline.json"
    times = [1000 * i for i in range(40)]
    sizes = [[0, i * 10, 0, 5, 0, 7 * i, 0, 0, 0] for i in range(40)]
    path.write_text(json.dumps([times, sizes]))
    return path


# ---------------------------------------------------------------------------- common variants
def _main_file(path: Path) -> Path:
    """The file a variant edits: the path itself, or the main file of a workload folder."""
    return path / "pmc_perf.csv" if path.is_dir() else path


def _variant(seed: Make, edit: Callable[[Path], None]) -> Make:
    def make(f: Path, out: Path) -> Path:
        path = seed(f, out)
        edit(_main_file(path))
        return path
    return make


def _replace_bytes(fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(p: Path) -> None:
        p.write_bytes(fn(p.read_bytes()))
    return edit


def _special(kind: str) -> Callable[[Path], None]:
    def edit(p: Path) -> None:
        name = p.name
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dev-zero":
            p.symlink_to("/dev/zero")
        elif kind == "loop":
            other = p.with_name(name + ".loop")
            p.symlink_to(other)
            other.symlink_to(p)
        elif kind == "folder":
            p.mkdir()
        else:
            p.write_bytes(b"")
    return edit


def _expand(data: bytes) -> bytes:
    """The content repeated: a CSV's rows (its header once), else the whole file, to about 8 MB."""
    times = max(2, min(400, (8 << 20) // max(len(data), 1)))
    if b"\n" in data[:4096] and data[:1] not in (b"{", b"[", b"\x80", b"S", b"P"):
        head, _, body = data.partition(b"\n")
        return head + b"\n" + body * times
    return data * 2


def common(seed: Make) -> list[Case]:
    """The variants every format gets."""
    return [
        ("seed", seed),
        ("truncated-half", _variant(seed, _replace_bytes(lambda d: d[:len(d) // 2]))),
        ("truncated-head", _variant(seed, _replace_bytes(lambda d: d[:64]))),
        ("expanded", _variant(seed, _replace_bytes(_expand))),
        ("gzip", _variant(seed, _replace_bytes(lambda d: gzip.compress(d, 1)))),
        ("gzip-damaged", _variant(seed, _replace_bytes(lambda d: gzip.compress(d, 1)[: max(30, len(d) // 40)]))),
        ("zstd", _variant(seed, _replace_bytes(lambda d: b"\x28\xb5\x2f\xfd" + os.urandom(64)))),
        ("bytes-flipped", _variant(seed, _replace_bytes(lambda d: bytes(b ^ 0x5A if i % 97 == 3 else b
                                                                        for i, b in enumerate(d))))),
        ("fifo", _variant(seed, _special("fifo"))),
        ("dev-zero", _variant(seed, _special("dev-zero"))),
        ("symlink-loop", _variant(seed, _special("loop"))),
        ("empty", _variant(seed, _special("empty"))),
        ("folder-in-its-place", _variant(seed, _special("folder"))),
    ]


# ---------------------------------------------------------------------------- SQLite
SPIN = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT * FROM c WHERE x < 0"
RECURSIVE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x"


def _sql(seed: Make, *statements: str) -> Make:
    def make(f: Path, out: Path) -> Path:
        path = seed(f, out)
        db = sqlite3.connect(path)
        try:
            for sql in statements:
                if sql.startswith("@drop "):
                    name = sql.split(" ", 1)[1]
                    kind = db.execute("SELECT type FROM sqlite_master WHERE name = ?", (name,)).fetchone()
                    if kind:
                        db.execute(f'DROP {kind[0].upper()} "{name}"')
                elif sql.startswith("@copy-without "):
                    _, table, column = sql.split(" ")
                    cols = [r[1] for r in db.execute(f'PRAGMA table_info("{table}_old")') if r[1] != column]
                    db.execute(f'CREATE TABLE "{table}" AS SELECT {", ".join(chr(34) + c + chr(34) for c in cols)} '
                               f'FROM "{table}_old"')
                else:
                    db.execute(sql)
            db.commit()
        finally:
            db.close()
        return path
    return make


def _as_view(table: str, select: str) -> list[str]:
    """``table`` (a table or a view) replaced by a view of the same name."""
    return [f"@drop {table}", f'CREATE VIEW "{table}" AS {select}']


def _drop_column(table: str, column: str) -> list[str]:
    """``table`` rebuilt without ``column`` (views that read it keep pointing at it, and then fail)."""
    return ["PRAGMA legacy_alter_table = ON", f'ALTER TABLE "{table}" RENAME TO "{table}_old"',
            f"@copy-without {table} {column}", f'DROP TABLE "{table}_old"']


NSYS_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
NSYS_KERNEL_COLUMNS = ("start, end, deviceId, streamId, correlationId, globalPid, demangledName, shortName, "
                       "registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, "
                       "dynamicSharedMemory")


def nsys_cases() -> list[Case]:
    cols = ", ".join(f"x AS {c.strip()}" for c in NSYS_KERNEL_COLUMNS.split(",")[1:])
    return [*common(seed_nsys),
            ("view-recursive", _sql(seed_nsys, *_as_view(NSYS_KERNEL, f"{RECURSIVE} AS start, {cols} FROM c"))),
            ("view-spinning", _sql(seed_nsys, *_as_view(NSYS_KERNEL, SPIN))),
            ("view-zeroblob", _sql(seed_nsys, *_as_view("StringIds", "SELECT 1 AS id, zeroblob(2000000000) AS value"))),
            ("view-cross-join", _sql(seed_nsys, "CREATE TABLE k2 AS SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME",
                                     *_as_view("CUPTI_ACTIVITY_KIND_RUNTIME",
                                               "SELECT a.* FROM k2 a, k2 b, k2 c"))),
            ("column-dropped", _sql(seed_nsys, *_drop_column(NSYS_KERNEL, "end"))),
            ("text-in-times", _sql(seed_nsys, f"UPDATE {NSYS_KERNEL} SET start = 'soon'")),
            ("negative-durations", _sql(seed_nsys, f'UPDATE {NSYS_KERNEL} SET "end" = start - 3950')),
            ("huge-values", _sql(seed_nsys, f"UPDATE {NSYS_KERNEL} SET start = 9.0e307, gridX = 1e300")),
            ("huge-strings", _sql(seed_nsys, "UPDATE StringIds SET value = printf('%.*c', 5000000, 'x') WHERE id < 3"))]


def rocpd_cases() -> list[Case]:
    row = ("x AS name, 0 AS agent_abs_index, x AS start, x + 1 AS end, 0 AS corr_id, x AS dispatch_id, "
           "0 AS stream_id, 0 AS queue_id, 1 AS grid_x, 1 AS grid_y, 1 AS grid_z, 1 AS workgroup_x, "
           "1 AS workgroup_y, 1 AS workgroup_z, 0 AS vgpr_count, 0 AS lds_size, 0 AS pid")
    dispatch = f"rocpd_kernel_dispatch{ROCPD_UUID}"
    return [*common(seed_rocpd),
            ("view-recursive", _sql(seed_rocpd, *_as_view("kernels", f"{RECURSIVE} AS {row[5:]} FROM c"))),
            ("view-spinning", _sql(seed_rocpd, *_as_view("kernels", SPIN))),
            ("view-zeroblob", _sql(seed_rocpd, *_as_view("kernels", "SELECT zeroblob(2000000000) AS "
                                                                    + row[5:].replace("x + 1", "2").replace("x AS", "1 AS")))),
            ("view-under-a-trusted-one", _sql(seed_rocpd, "DROP VIEW rocpd_string",
                                             f"CREATE VIEW rocpd_string AS {RECURSIVE} AS id, 'n' AS string, "
                                             "'00000a10-7bc0-7bc0-a1ef-6b94d43555c0' AS guid FROM c")),
            ("passthrough-to-a-view", _sql(seed_rocpd, "PRAGMA legacy_alter_table = ON",
                                          f"ALTER TABLE {dispatch} RENAME TO d_old",
                                          f"CREATE VIEW {dispatch} AS SELECT a.* FROM d_old a, d_old b, d_old c")),
            ("column-dropped", _sql(seed_rocpd, *_drop_column(dispatch, "end"))),
            ("text-in-times", _sql(seed_rocpd, f"UPDATE {dispatch} SET start = 'soon' WHERE id % 3 = 0")),
            ("negative-durations", _sql(seed_rocpd, f'UPDATE {dispatch} SET "end" = start - 3950')),
            ("huge-values", _sql(seed_rocpd, f"UPDATE {dispatch} SET start = 9.0e307, grid_size_x = 1e300"))]


def v1_db_cases() -> list[Case]:
    return [*common(seed_v1_db),
            ("view-recursive", _sql(seed_v1_db, *_as_view("KERN", f"{RECURSIVE} AS KernelName, x AS BeginNs, "
                                                                  "x + 1 AS EndNs FROM c"))),
            ("view-zeroblob", _sql(seed_v1_db, *_as_view("KERN", "SELECT zeroblob(2000000000) AS KernelName, "
                                                                 "1 AS BeginNs, 2 AS EndNs"))),
            ("column-dropped", _sql(seed_v1_db, *_drop_column("KERN", "EndNs"))),
            ("text-in-times", _sql(seed_v1_db, "UPDATE KERN SET BeginNs = 'soon'")),
            ("negative-durations", _sql(seed_v1_db, "UPDATE KERN SET EndNs = BeginNs - 3950")),
            ("huge-values", _sql(seed_v1_db, "UPDATE KERN SET BeginNs = 9.0e307"))]


# ---------------------------------------------------------------------------- CSV
def _csv(seed: Make, fn: Callable[[list[list[str]]], list[list[str]]], name: str | None = None) -> Make:
    """Edit a CSV as rows of fields (the first row the header); ``name``: the file in a seed's folder."""
    import csv

    def make(f: Path, out: Path) -> Path:
        path = seed(f, out)
        target = path / name if name and path.is_dir() else (path.parent / name if name else _main_file(path))
        rows = list(csv.reader(io.StringIO(target.read_text(encoding="utf-8", errors="replace"))))
        buf = io.StringIO()
        csv.writer(buf).writerows(fn(rows))
        target.write_text(buf.getvalue())
        return path
    return make


def _set(col: str, value: str, every: int = 1) -> Callable[[list[list[str]]], list[list[str]]]:
    def fn(rows: list[list[str]]) -> list[list[str]]:
        if col in rows[0]:
            i = rows[0].index(col)
            for n, r in enumerate(rows[1:]):
                if n % every == 0 and i < len(r):
                    r[i] = value
        return rows
    return fn


def _drop(col: str) -> Callable[[list[list[str]]], list[list[str]]]:
    def fn(rows: list[list[str]]) -> list[list[str]]:
        if col in rows[0]:
            i = rows[0].index(col)
            rows = [r[:i] + r[i + 1:] for r in rows]
        return rows
    return fn


def _negative(start: str, end: str) -> Callable[[list[list[str]]], list[list[str]]]:
    def fn(rows: list[list[str]]) -> list[list[str]]:
        if start in rows[0] and end in rows[0]:
            s, e = rows[0].index(start), rows[0].index(end)
            for r in rows[1:]:
                if max(s, e) < len(r) and r[s].strip().lstrip("-").isdigit():
                    r[e] = str(int(r[s]) - 3950)
        return rows
    return fn


def _long_line(size: int) -> Callable[[list[list[str]]], list[list[str]]]:
    def fn(rows: list[list[str]]) -> list[list[str]]:
        if len(rows) > 1 and rows[1]:
            rows[1][0] = "k" * size
        return rows
    return fn


def csv_cases(seed: Make, start: str, end: str, name_col: str, name: str | None = None) -> list[Case]:
    return [(f"missing-{start}", _csv(seed, _drop(start), name)), (f"missing-{name_col}", _csv(seed, _drop(name_col), name)),
            ("negative-durations", _csv(seed, _negative(start, end), name)),
            ("huge-numbers", _csv(seed, _set(start, "1e400", 3), name)),
            ("huge-integers", _csv(seed, _set(end, "9" * 40, 2), name)),
            ("non-finite", _csv(seed, _set(end, "nan", 2), name)),
            ("text-in-numbers", _csv(seed, _set(start, "soon", 4), name)),
            ("long-line", _csv(seed, _long_line(8 << 20), name))]


def _dup(col: str) -> Callable[[list[list[str]]], list[list[str]]]:
    """Every row's ``col`` the first row's (every dispatch id one id)."""
    def fn(rows: list[list[str]]) -> list[list[str]]:
        if col in rows[0] and len(rows) > 1:
            i = rows[0].index(col)
            for r in rows[1:]:
                if i < len(r):
                    r[i] = rows[1][i]
        return rows
    return fn


def dispatch_id_cases(seed: Make, col: str) -> list[Case]:
    """Damaged dispatch ids (read into ``kernels.dispatch_id``, and by the idle classification's ``unrecorded``
    cause): the column missing, text, duplicated, negative, huge (past int64 and past 2^53)."""
    return [(f"missing-{col}", _csv(seed, _drop(col))), (f"text-in-{col}", _csv(seed, _set(col, "soon", 3))),
            (f"duplicate-{col}", _csv(seed, _dup(col))), (f"negative-{col}", _csv(seed, _set(col, "-5", 2))),
            (f"huge-{col}", _csv(seed, _set(col, "9" * 40, 5))),
            (f"beyond-2-53-{col}", _csv(seed, _set(col, str((1 << 60) + 7), 7)))]


def roctx_nested(n: int) -> Make:
    def make(f: Path, out: Path) -> Path:
        path = seed_v3_csv(f, out)
        rows = ['"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"']
        rows += [f'"MARKER_CORE_API","level_{i}","1","2684120","{i}","{342331487000000 + 10 * i}",'
                 f'"{342335000000000 - 10 * i}"' for i in range(n)]
        (path.parent / "decode_marker_api_trace.csv").write_text("\n".join(rows) + "\n")
        return path
    return make


# ---------------------------------------------------------------------------- JSON
def _json_file(name: str, doc: Any, *, raw: bytes | None = None) -> Make:
    def make(f: Path, out: Path) -> Path:
        path = out / name
        path.write_bytes(raw if raw is not None else json.dumps(doc, allow_nan=True).encode())
        return path
    return make


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _edit_json(seed: Make, fn: Callable[[Any], Any], *, text: Callable[[str], str] | None = None) -> Make:
    def make(f: Path, out: Path) -> Path:
        path = seed(f, out)
        doc = fn(json.loads(path.read_text()))
        data = json.dumps(doc, allow_nan=True)
        path.write_text(text(data) if text else data)
        return path
    return make


def _events(fn: Callable[[dict[str, Any]], None]) -> Callable[[Any], Any]:
    def edit(doc: Any) -> Any:
        for e in (doc.get("traceEvents") if isinstance(doc, dict) else doc) or []:
            if isinstance(e, dict) and e.get("ph") == "X":
                fn(e)
        return doc
    return edit


def kineto_cases() -> list[Case]:
    return [*common(seed_kineto),
            ("nesting-depth", _json_file("trace.json", None, raw=b'{"traceEvents": ' + _deep(200_000) + b"}")),
            ("huge-numbers", _edit_json(seed_kineto, _events(lambda e: e.update(dur=1e308, ts=1e308)),
                                        text=lambda t: t.replace("1e+308", "1e400", 3))),
            ("non-finite", _edit_json(seed_kineto, _events(lambda e: e.update(dur=float("nan"), ts=float("inf"))))),
            ("negative-durations", _edit_json(seed_kineto, _events(lambda e: e.update(dur=-3.95)))),
            ("wrong-types", _edit_json(seed_kineto, _events(lambda e: e.update(dur=[1], ts={"a": 1}, args="lots")))),
            ("huge-integers", _edit_json(seed_kineto, _events(lambda e: e.update(ts=10**30)))),
            # counter ranges (CUPTI's range profiler): every event one, with names and args no range has
            ("counter-ranges", _edit_json(seed_kineto, _events(lambda e: e.update(
                cat="cuda_profiler_range", name=[1, {"a": None}], args={"smsp__x.sum": "lots", "": [None]})))),
            ("counter-ranges-bad-times", _edit_json(seed_kineto, _events(lambda e: e.update(
                cat="cuda_profiler_range", ts=float("nan"), dur=-1, args=7)))),
            ("top-is-a-list-of-lists", _json_file("trace.json", [[1, 2], [3]])),
            # a file named manifest.json that says it is perfscope's opens its folder as a report (detect_format)
            ("report-manifest-alone", _json_file("manifest.json", {"perfscope_version": "0.1.0"})),
            ("report-manifest-damaged", _json_file("manifest.json", None, raw=b'{"perfscope_version": "0.1", '
                                                   b'"schema_version": "1.0", "name": "\\u00')),
            ("report-manifest-wrong-types", _json_file("manifest.json", {"perfscope_version": [1], "schema_version": {},
                                                                         "name": 7, "source": "x", "params": [None]})),
            ("another-tools-manifest", _json_file("manifest.json", {"name": "not a report"}))]


def v3_json_cases() -> list[Case]:
    def records(value: Any) -> Make:
        return _json_file("7_results.json", v3_doc(buffer_records={"kernel_dispatch": value}))

    def edit(**changes: Any) -> Make:
        doc = v3_doc()
        for d in doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"]:
            d.update(changes)
        return _json_file("7_results.json", doc)

    return [*common(seed_v3_json),
            ("nesting-depth", _json_file("7_results.json", None, raw=b'{"rocprofiler-sdk-tool": ' + _deep(200_000) + b"}")),
            ("list-where-a-dict-belongs", records([[1, 2], "x", None])),
            ("dict-where-a-list-belongs", records({"a": 1})),
            ("huge-integers", edit(start_timestamp=10**400, end_timestamp=10**400 + 5)),
            ("huge-numbers", edit(start_timestamp=1e308, end_timestamp=float("inf"))),
            ("negative-durations", edit(start_timestamp=5000, end_timestamp=1050)),
            ("wrong-types", edit(start_timestamp="soon", dispatch_info=[1, 2], correlation_id="x")),
            ("tools-not-a-list", _json_file("7_results.json", {"rocprofiler-sdk-tool": 42}))]


def v1_json_cases() -> list[Case]:
    def edit(fn: Callable[[dict[str, Any]], None]) -> Make:
        return _edit_json(seed_v1_json, _events(fn))

    return [*common(seed_v1_json),
            ("nesting-depth", _json_file("results.json", None, raw=b'{"traceEvents": ' + _deep(200_000) + b"}")),
            ("huge-numbers", edit(lambda e: (e.get("args") or {}).update(BeginNs=1e308, EndNs=1e308))),
            ("negative-durations", edit(lambda e: (e.get("args") or {}).update(EndNs=0))),
            ("wrong-types", edit(lambda e: e.update(args=[1, 2], ts="soon", dur={}))),
            ("events-not-a-list", _json_file("results.json", {"traceEvents": {"BeginNs": 1}}))]


def timeline_cases() -> list[Case]:
    sizes = [[0, 1, 0, 0, 0, 0, 0, 0, 0]] * 3
    return [*common(seed_timeline),
            ("nesting-depth", _json_file("timeline.json", None, raw=b"[" + _deep(200_000) + b", []]")),
            ("huge-integers", _json_file("timeline.json", [[10**30, 2, 3], sizes])),
            ("huge-numbers", _json_file("timeline.json", [[1, 2, 3], [[0, 1e308, 0, 0, 0, 0, 0, 0, 0]] * 3],
                                        raw=json.dumps([[1, 2, 3], sizes]).replace("1,", "1e400,", 1).encode())),
            ("non-finite", _json_file("timeline.json", [[1, 2, 3], [[0, float("nan"), 0, 0, 0, 0, 0, 0, 0]] * 3])),
            ("wrong-types", _json_file("timeline.json", [["a", "b", "c"], sizes])),
            ("raw-rows-wrong-types", _json_file("timeline.raw.json", [[1, "x", {}, None]] * 5))]


# ---------------------------------------------------------------------------- pickles
def _pickle(name: str, data: bytes | Callable[[], bytes]) -> Make:
    def make(f: Path, out: Path) -> Path:
        path = out / name
        path.write_bytes(data() if callable(data) else data)
        return path
    return make


def memo_bomb(width: int = 2000) -> bytes:
    """References, not copies: one event in a list of ``width`` references to it, that list referenced
    ``width`` times (the trace), and a traceback of ``width`` x ``width`` references to one frame. pickle
    writes each object once and then memo GETs: about 30 KB for width^2 = 4 million events and frames."""
    frame = {"name": "mm", "filename": "model.py", "line": 10}
    frames = [[frame] * width] * width
    event = {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": 1.0, "frames": frames}
    inner = [event] * width
    return pickle.dumps({"segments": [], "device_traces": [inner * 1, [inner] * width]}, protocol=4)


def snapshot_cases() -> list[Case]:
    ev = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1000, "frames": []}
    repeated = snapshot_doc([ev] * 400_000)  # one event object, pickled once and referenced 400,000 times
    return [*common(seed_snapshot),
            ("memo-bomb", _pickle("snapshot.pickle", memo_bomb)),
            ("one-event-repeated", _pickle("snapshot.pickle", lambda: pickle.dumps(repeated, protocol=4))),
            ("huge-integer", _pickle("snapshot.pickle", lambda: pickle.dumps(
                snapshot_doc([{**ev, "size": 10**400, "addr": 10**400}]), protocol=4))),
            ("list-where-a-dict-belongs", _pickle("snapshot.pickle", lambda: pickle.dumps(
                {"segments": [[1, 2]], "device_traces": [[["alloc", 1, 2]]]}, protocol=4))),
            ("dict-where-a-list-belongs", _pickle("snapshot.pickle", lambda: pickle.dumps(
                {"segments": {"a": 1}, "device_traces": {"b": 2}}, protocol=4))),
            ("wrong-types", _pickle("snapshot.pickle", lambda: pickle.dumps(
                snapshot_doc([{**ev, "size": "lots", "time_us": [1], "action": 5}] * 10), protocol=4))),
            ("nesting-depth", _pickle("snapshot.pickle", lambda: b"\x80\x04" + b"]" * 200_000 + b"a" * 199_999 + b".")),
            ("calls-code", _pickle("snapshot.pickle", lambda: b"\x80\x04cos\nsystem\n\x8c\x04true\x85R.")),
            ("non-finite-times", _pickle("snapshot.pickle", lambda: pickle.dumps(
                snapshot_doc([{**ev, "time_us": float("inf")}, {**ev, "time_us": float("nan")}]), protocol=4)))]


# ---------------------------------------------------------------------------- rocprof-compute
def compute_cases() -> list[Case]:
    def roof(value: str) -> Make:
        return _csv(seed_compute, lambda rows: [rows[0]] + [[value if h in ("HBMBw", "FP32Flops", "MFMAF16Flops") else v
                                                           for h, v in zip(rows[0], r)] for r in rows[1:]],
                    "roofline.csv")

    def sibling(name: str, kind: str) -> Make:
        return _variant(lambda f, out: seed_compute(f, out), lambda p: _special(kind)(p.parent / name))

    return [*common(seed_compute),
            ("roofline-1e308", roof("1e308")), ("roofline-1e400", roof("1e400")), ("roofline-negative", roof("-5")),
            ("roofline-nan", roof("nan")), ("roofline-text", roof("fast")),
            ("roofline-fifo", sibling("roofline.csv", "fifo")), ("sysinfo-dev-zero", sibling("sysinfo.csv", "dev-zero")),
            ("timestamps-loop", sibling("timestamps.csv", "loop")),
            *csv_cases(seed_compute, "Start_Timestamp", "End_Timestamp", "Kernel_Name"),
            ("fractional-timestamps", _csv(seed_compute, _set("Start_Timestamp", "1411551767635712.5")))]


def nvml_cases() -> list[Case]:
    n = 10

    def rows(**cols: list[Any]) -> Make:
        base = {"t_ns": [i * 1000 for i in range(n)], "device": ["cuda:0"] * n, "gpu_util_pct": [50.0] * n}
        base.update(cols)
        return lambda f, out: seed_nvml(f, out, base)

    return [*common(seed_nvml),
            ("non-finite", rows(gpu_util_pct=[float("inf"), float("nan")] * 5, power_w=[-1e308] * n)),
            ("huge-times", rows(t_ns=[2**62 + i for i in range(n)])),
            ("text-in-numbers", rows(gpu_util_pct=["lots"] * n)),
            ("negative-times", rows(t_ns=[-(10**18)] * n))]


# ---------------------------------------------------------------------------- a server's saved /metrics
SERVING = "serving/vllm_metrics_llama2_7b_h100_bsc"
SERIES_CSV = "metrics_engine_server_0.csv"


def seed_series(f: Path, out: Path) -> Path:
    return _copy(f / SERVING / SERIES_CSV, out / "series.csv")


def seed_dump(f: Path, out: Path) -> Path:
    return _copy(f / SERVING / "cache_config_server_0.txt", out / "metrics.txt")


def seed_serving_folder(f: Path, out: Path) -> Path:
    return _copy(f / SERVING, out / "run")


def _in_folder(name: str, edit: Callable[[Path], None]) -> Make:
    """The run folder with its file ``name`` edited (or made: a sibling that was not there)."""
    def make(f: Path, out: Path) -> Path:
        path = seed_serving_folder(f, out)
        target = path / name
        if not target.exists():
            target.write_bytes(b"x")
        edit(target)
        return path
    return make


def _write(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


def sampled_csv_cases(seed: Make, t: str, value: str, huge: str) -> list[Case]:
    """The cases of a CSV of samples over time (a time column ``t``, a value column ``value``): huge values,
    times that are not finite or not numbers, text in values, ragged rows, an 8 MB field."""
    return [("huge-numbers", _csv(seed, _set(value, huge, 3))),
            ("non-finite-times", _csv(seed, _set(t, "inf", 2))),
            ("text-in-times", _csv(seed, _set(t, "soon", 4))),
            ("text-in-values", _csv(seed, _set(value, "many", 4))),
            ("ragged-rows", _csv(seed, lambda rows: [rows[0]] + [r[: 1 + n % len(r)] for n, r in enumerate(rows[1:])])),
            ("long-line", _csv(seed, _long_line(8 << 20)))]


def server_metrics_cases() -> list[Case]:
    waiting, t, kv = "num_requests_waiting", "time [s]", "gpu_cache_usage_perc"
    results = "openai-infqps-llama-2-7b-20250218-165534.json"
    return [*common(seed_series),
            *[(f"dump-{n}", m) for n, m in common(seed_dump)],
            ("missing-time", _csv(seed_series, _drop(t))), ("missing-gauges", _csv(seed_series, _drop(waiting))),
            *sampled_csv_cases(seed_series, t, waiting, "1e400"),
            ("huge-integers", _csv(seed_series, _set(waiting, "9" * 40, 2))),
            ("negative-values", _csv(seed_series, _set(kv, "-5", 2))),
            ("many-columns", _replace_case(seed_series, lambda d: b",".join([b"time"] + [b"num_requests_waiting"] * 200_000)
                                           + b"\n" + b",".join([b"1"] * 200_001) + b"\n")),
            ("dump-long-label", _replace_case(seed_dump, lambda d: b'vllm:num_requests_waiting{m="' + b"x" * (8 << 20)
                                              + b'"} 3\n' + d)),
            ("dump-huge-values", _replace_case(seed_dump, lambda d: d.replace(b"} 0.0", b"} 1e400"))),
            ("folder", seed_serving_folder),
            ("folder-series-fifo", _in_folder(SERIES_CSV, _special("fifo"))),
            ("folder-series-loop", _in_folder(SERIES_CSV, _special("loop"))),
            ("folder-series-dev-zero", _in_folder(SERIES_CSV, _special("dev-zero"))),
            ("folder-fifo-beside", _in_folder("other.csv", _special("fifo"))),
            ("folder-results-damaged", _in_folder(results, _replace_bytes(lambda d: d[: len(d) // 2]))),
            ("folder-results-deep", _in_folder(results, _write(b'{"completed": 1, "median_ttft_ms": '
                                                               + b"[" * 100_000 + b"]" * 100_000 + b"}"))),
            ("folder-results-wrong-types", _in_folder(results, _write(json.dumps(
                {"completed": "all", "median_ttft_ms": {"a": 1}, "p99_ttft_ms": 1e308, "x" * 5000: "y" * 5000}).encode()))),
            ("folder-results-only", results_only), ("folder-second-series", second_series)]


def results_only(f: Path, out: Path) -> Path:
    (out / "run").mkdir()
    return _copy(f / SERVING / "openai-infqps-llama-2-7b-20250218-165534.json", out / "run" / "results.json").parent


def second_series(f: Path, out: Path) -> Path:
    path = seed_serving_folder(f, out)
    _copy(f / SERVING / SERIES_CSV, path / "series_1.csv")
    return path


def seed_smi(f: Path, out: Path) -> Path:
    return _copy(f / SERVING / "metrics_gpu_device_nvidia_smi_0_server_0.csv", out / "smi.csv")


def nvidia_smi_cases() -> list[Case]:
    t, util = "time [s]", " utilization.gpu [%]"
    stamped = ("timestamp, index, utilization.gpu [%], memory.used [MiB]\n"
               + "".join(f"2024/06/01 10:00:{i:02d}.000, {i % 2}, {i} %, {i * 10} MiB\n" for i in range(40)))
    return [*common(seed_smi),
            ("missing-time", _csv(seed_smi, _drop(t))), ("missing-fields", _csv(seed_smi, _drop(util))),
            *sampled_csv_cases(seed_smi, t, util, "1e400 %"),
            ("huge-times", _csv(seed_smi, _set(t, "1e300", 5))),
            ("negative-times", _csv(seed_smi, _set(t, "-1e12", 5))),
            ("not-available", _csv(seed_smi, _set(util, " [N/A]", 1))),
            ("timestamps", lambda f, out: _write_text(out / "stamped.csv", stamped)),
            ("timestamps-damaged", lambda f, out: _write_text(out / "stamped.csv", stamped.replace("10:00:07", "25:99:99"))),
            ("index-not-a-number", lambda f, out: _write_text(out / "stamped.csv", stamped.replace(", 1, ", ", one, ")))]


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


GENERATORS: dict[str, Callable[[], list[Case]]] = {
    "kineto": kineto_cases,
    "nsys-sqlite": nsys_cases,
    "nsys-rep": lambda: common(seed_nsys_rep),
    "ncu-rep": lambda: common(seed_ncu_rep),
    "ncu-csv": lambda: [*common(seed_ncu_csv),
                        ("long-line", _replace_case(seed_ncu_csv, lambda d: d.replace(b"\n", b"\n" + b"x" * (8 << 20) + b"\n", 1))),
                        ("huge-values", _replace_case(seed_ncu_csv, lambda d: d.replace(b'"ns","', b'"ns","1e400', 3))),
                        ("negative-durations", _replace_case(seed_ncu_csv, lambda d: d.replace(b'"ns","', b'"ns","-', 3)))],
    "nvml": nvml_cases,
    "rocprofv3-csv": lambda: [*common(seed_v3_csv),
                              *csv_cases(seed_v3_csv, "Start_Timestamp", "End_Timestamp", "Kernel_Name"),
                              *dispatch_id_cases(seed_v3_csv, "Dispatch_Id"),
                              ("roctx-nested-5000", roctx_nested(5000))],
    "rocprofv3-json": v3_json_cases,
    "rocpd": rocpd_cases,
    "rocprof-csv": lambda: [*common(seed_v1_csv), *csv_cases(seed_v1_csv, "BeginNs", "EndNs", "KernelName"),
                            *dispatch_id_cases(seed_v1_csv, "Dispatch_ID")],
    "rocprof-db": v1_db_cases,
    "rocprof-json": v1_json_cases,
    "rocprof-stats": lambda: [*common(seed_stats),
                              ("trace-missing", _variant(seed_stats, lambda p: (p.parent / "results.csv").unlink())),
                              ("trace-a-fifo", _variant(seed_stats, lambda p: _special("fifo")(p.parent / "results.csv"))),
                              *csv_cases(seed_stats, "Calls", "TotalDurationNs", "Name")],
    "rocprof-compute": compute_cases,
    "memory-snapshot": snapshot_cases,
    "memory-timeline": timeline_cases,
    "server-metrics": server_metrics_cases,
    "nvidia-smi": nvidia_smi_cases,
}
"""Format (a key of ``detect.READERS``) -> its hostile cases."""


def _replace_case(seed: Make, fn: Callable[[bytes], bytes]) -> Make:
    return _variant(seed, _replace_bytes(fn))


def all_cases() -> dict[str, Make]:
    """Every case by id ``<format>/<case>``."""
    return {f"{fmt}/{name}": make for fmt, gen in GENERATORS.items() for name, make in gen()}
