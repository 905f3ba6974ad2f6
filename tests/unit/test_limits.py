"""The limits layer (issue 43): inputs opened one way, SQLite under guard, one validator for numbers and
roofs, bounded range paths, arguments checked first, and the two real files that were rejected.

- the MI300X-family rocprof-compute workload whose pmc_perf.csv holds rocprof-compute's pass-averaged
  timestamps (``3806496773226489.5``: "cannot safely cast non-equivalent ... to int64" before);
- a gzipped rocprofv3 ``*_results.json.gz`` ("can't decode byte 0x8b" before).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.readers.detect import detect_format, import_file
from perfscope.cli import main
from perfscope.errors import InputFormatError
from perfscope.inputs import DAMAGED, open_input, read_bytes, read_csv, read_text, regular_file
from perfscope.report import Report
from perfscope.safedb import SafeDb
from perfscope.schema import untimed, validate, whole_numbers

MI308X = "rocprof/aiter_fmla_MI308X_rocprof_compute"
MI200 = "rocprof/rocprof_compute_vcopy_MI200"
ROCPD = "rocprof/llamacpp_r9700_rocpd/32432_results.db"


def _one_line(err: str, *words: str) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("perfscope: error: ") and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), err


# ---------------------------------------------------------------------------- the two real files
def _pass_averaged(src: Path, dst: Path) -> list[dict[str, str]]:
    """The workload folder as rocprof-compute's ``join_prof`` writes it when the passes' timestamps differ:
    each Start/End the mean of two passes 1 ns apart (``x.5``), as ``df[bkeys].mean(axis=1)`` gives
    (ROCm/rocprofiler-compute src/rocprof_compute_profile/profiler_base.py); timestamps.csv left out,
    so pmc_perf.csv's own times are read."""
    shutil.copytree(src, dst)
    (dst / "timestamps.csv").unlink(missing_ok=True)
    with open(dst / "pmc_perf.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for col in ("Start_Timestamp", "End_Timestamp"):
            r[col] = repr(int(r[col]) + 0.5)
    with open(dst / "pmc_perf.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


@pytest.mark.parametrize("workload", [MI308X, MI200])
def test_rocprof_compute_pass_averaged_timestamps_import(workload: str, fixtures_dir: Path, tmp_path: Path) -> None:
    rows = _pass_averaged(fixtures_dir / workload, tmp_path / "w")
    report = import_file(tmp_path / "w")
    assert len(report.kernels) == len(rows)
    # x.5 rounds to even, as numpy's rint does: within half a nanosecond of the file's value
    got = report.kernels.sort_values("correlation")["start_ns"].to_numpy()
    want = np.array(sorted(float(r["Start_Timestamp"]) for r in rows))
    assert np.abs(got - want).max() <= 0.5
    if workload == MI200:  # its measured roofline.csv: the roofs are the benchmark's
        roofs = pd.read_csv(fixtures_dir / MI200 / "roofline.csv").iloc[0]
        assert report.device.memory["dram"].value == pytest.approx(roofs["HBMBw"] * 1e9)
        assert report.device.memory["dram"].provenance == "measured (rocprof-compute)"
        assert report.device.compute["fp32"].value == pytest.approx(roofs["FP32Flops"] * 1e9)


def _rocprofv3_json_from_rocpd(db_path: Path) -> tuple[dict, int]:
    """The rocpd run's dispatches in rocprofv3's JSON layout (rocprofiler-sdk's ``*_results.json``: agents as
    rocpd keeps them in extdata, kernel_symbols, buffer_records.kernel_dispatch)."""
    db = sqlite3.connect(db_path)
    agents = [json.loads(x) | {"name": n, "product_name": p} for x, n, p in
              db.execute("SELECT extdata, name, product_name FROM rocpd_info_agent ORDER BY absolute_index")]
    handle = {i: a["id"]["handle"] for i, a in enumerate(agents)}
    symbols = [{"kernel_id": k, "formatted_kernel_name": n} for k, n in
               db.execute("SELECT id, display_name FROM rocpd_info_kernel_symbol")]
    dispatches = [{"start_timestamp": s, "end_timestamp": e, "correlation_id": {"internal": c},
                   "dispatch_info": {"agent_id": {"handle": handle[a]}, "queue_id": {"handle": q}, "kernel_id": k,
                                     "dispatch_id": d, "grid_size": {"x": gx, "y": gy, "z": gz},
                                     "workgroup_size": {"x": wx, "y": wy, "z": wz}}}
                  for s, e, c, a, q, k, d, gx, gy, gz, wx, wy, wz in db.execute(
                      "SELECT start, end, corr_id, agent_abs_index, queue_id, kernel_id, dispatch_id, grid_x, grid_y, "
                      "grid_z, workgroup_x, workgroup_y, workgroup_z FROM kernels ORDER BY start")]
    db.close()
    doc = {"rocprofiler-sdk-tool": [{"metadata": {"pid": 32432}, "agents": agents, "kernel_symbols": symbols,
                                     "strings": {}, "buffer_records": {"kernel_dispatch": dispatches}}]}
    return doc, len(dispatches)


def test_gzipped_rocprofv3_json_imports_every_dispatch(fixtures_dir: Path, tmp_path: Path) -> None:
    doc, n = _rocprofv3_json_from_rocpd(fixtures_dir / ROCPD)
    path = tmp_path / "32432_results.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert detect_format(path) == "rocprofv3-json"
    report = import_file(path)
    rocpd = import_file(fixtures_dir / ROCPD)
    assert len(report.kernels) == n == len(rocpd.kernels) == 5687
    assert report.kernels["duration_ns"].sum() == rocpd.kernels["duration_ns"].sum()
    assert report.device is not None and "R9700" in report.device.name


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress])
def test_every_text_format_is_decompressed_by_content(compress, fixtures_dir: Path, tmp_path: Path) -> None:
    for rel, fmt in (("rocprof/llamacpp_r9700_rocprof_v1/results.csv", "rocprof-csv"),
                     ("ncu/esmm_a10g_roofline_metrics.csv", "ncu-csv"),
                     ("kineto/kineto_docs_h100_before_fix.json", "kineto")):
        path = tmp_path / Path(rel).name  # the name says nothing of the compression
        path.write_bytes(compress((fixtures_dir / rel).read_bytes()))
        assert detect_format(path) == fmt
        assert len(import_file(path).kernels) == len(import_file(fixtures_dir / rel).kernels)


def _chunks(stream: object, size: int) -> tuple[list[bytes], str | None]:
    """What a reader gets from ``stream`` in reads of ``size`` bytes, and the error that ended it."""
    out: list[bytes] = []
    try:
        while chunk := stream.read(size):  # type: ignore[attr-defined]
            out.append(chunk)
    except DAMAGED as exc:
        return out, type(exc).__name__
    return out, None


def _gzip_variants(gz: bytes) -> dict[str, bytes]:
    crc = bytearray(gz)
    crc[-6] ^= 1
    size = bytearray(gz)
    size[-2] ^= 1
    body = bytearray(gz)
    body[len(gz) // 2] ^= 0xFF
    return {"whole": gz, "two members": gz + gzip.compress(b"[]"), "truncated": gz[:len(gz) // 2],
            "no trailer": gz[:-8], "header only": gz[:10], "bad crc": bytes(crc), "bad size": bytes(size),
            "damaged body": bytes(body), "trailing zeros": gz + bytes(16), "trailing garbage": gz + b"garbage"}


@pytest.mark.parametrize("size", [1 << 16, 1 << 20])
def test_gzip_reads_exactly_what_gzipfile_reads_whole_or_damaged(size: int, fixtures_dir: Path,
                                                               tmp_path: Path) -> None:
    # the fast inflater hands out GzipFile's bytes, read for read, and stops where and as it stops
    gz = (fixtures_dir / "kineto" / "hta_trace_filter__sampled_rank-0.json.gz").read_bytes()
    for name, data in _gzip_variants(gz).items():
        path = tmp_path / f"{name.replace(' ', '_')}.gz"
        path.write_bytes(data)
        with open_input(path, strict=False) as stream:
            got = _chunks(stream, size)
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as ref:
            want = _chunks(ref, size)
        assert got == want, name
        if want[1] is not None:  # strict: the file's one error line
            with pytest.raises(InputFormatError, match="truncated or damaged compressed data"):
                read_bytes(path)


def test_zstd_without_the_package_and_compressed_sqlite_are_one_line(fixtures_dir: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(100))
    try:
        import zstandard  # noqa: F401
    except ImportError:
        assert main(["import", str(path)]) == 3
        _one_line(capsys.readouterr().err, "zstd-compressed", "zstd -d")
    db = tmp_path / "export.sqlite"
    db.write_bytes(gzip.compress((fixtures_dir / "nsys/nvfuser_h100_matmul.sqlite").read_bytes()))
    assert main(["import", str(db)]) == 3
    _one_line(capsys.readouterr().err, "gzip-compressed SQLite", "gunzip")


# ---------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "loop", "socket"])
def test_special_files_are_refused_before_they_are_opened(kind: str, tmp_path: Path) -> None:
    import socket

    path = tmp_path / "trace.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "loop":
        path.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(path)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    want = {"fifo": "FIFO", "dev-zero": "character device", "loop": "loop of symbolic links", "socket": "socket"}[kind]
    for read in (regular_file, read_text, import_file):
        with pytest.raises(InputFormatError, match=want):
            read(path)


def test_csv_rows_count_against_the_budget_as_they_are_read(tmp_path: Path) -> None:
    from perfscope.inputs import CSV_CHUNK_ROWS
    from perfscope.limits import budget, counting

    path = tmp_path / "results.csv"
    path.write_text("KernelName,BeginNs,EndNs\n" + "k,1,2\n" * (CSV_CHUNK_ROWS * 2 + 5))
    with budget(max_events=CSV_CHUNK_ROWS), counting(), pytest.raises(InputFormatError, match="more than"):
        read_csv(path, "hint")
    with budget(max_events=CSV_CHUNK_ROWS * 3), counting():
        assert len(read_csv(path, "hint")) == CSV_CHUNK_ROWS * 2 + 5


# ---------------------------------------------------------------------------- SQLite
def _db(tmp_path: Path, *sql: str) -> Path:
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t(a, b)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, i * 2) for i in range(100)])
        for s in sql:
            db.execute(s)
    return path


def test_safedb_reads_real_tables_in_memory_read_only(tmp_path: Path) -> None:
    path = _db(tmp_path, "CREATE VIEW v AS SELECT a FROM t")
    with SafeDb(path, hint="h") as db:
        assert db.temp_store == 2  # MEMORY: no temporary file in /var/tmp
        with pytest.raises(sqlite3.DatabaseError, match="not authorized"):  # no pragma but table_info once guarded
            db.conn.execute("PRAGMA temp_store = FILE")
        assert len(db.rows("SELECT a, b FROM t ORDER BY b DESC")) == 100
        assert db.tables == {"t"} and set(db.views) == {"v"} and not db.trusted
        with pytest.raises(InputFormatError, match="view `v`, which is not the tool's own definition"):
            db.rows("SELECT * FROM v")
        with pytest.raises(InputFormatError):
            db.rows("DELETE FROM t")
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 100


@pytest.mark.parametrize(("sql", "words"), [
    ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c", "a recursive query"),
    ("SELECT zeroblob(2000000000)", "the SQL function zeroblob()"),
    ("SELECT printf('%.*c', 100, 'x')", "the SQL function printf()"),
    ("PRAGMA writable_schema = 1", "PRAGMA writable_schema"),
])
def test_safedb_refuses_what_makes_work_or_memory(sql: str, words: str, tmp_path: Path) -> None:
    with SafeDb(_db(tmp_path), hint="h") as db, pytest.raises(InputFormatError, match="refused") as info:
        db.rows(sql)
    assert words in str(info.value)


def test_a_trusted_view_that_spins_stops_at_its_step_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a view the reader trusts cannot run without end: the progress handler stops a statement past its
    step budget (deterministic: counted steps, not seconds)."""
    from perfscope import safedb

    monkeypatch.setattr(safedb, "MIN_STEPS", 2_000_000)
    monkeypatch.setattr(safedb, "STEPS_PER_BYTE", 1)
    path = _db(tmp_path, "CREATE VIEW big AS SELECT a.a FROM t a, t b, t c, t d")  # 10^8 rows
    with SafeDb(path, hint="h", trust=lambda db, name, sql: True) as db, \
            pytest.raises(InputFormatError, match="past its budget of 2,000,000 SQLite steps"):
        db.rows("SELECT count(*) FROM big")


def test_a_value_over_the_length_limit_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t(a)")
        db.execute("INSERT INTO t VALUES (?)", ("x" * (2 << 20),))
    from perfscope import safedb

    monkeypatch.setattr(safedb, "MAX_VALUE_BYTES", 1 << 20)
    with SafeDb(path, hint="h") as db, pytest.raises(InputFormatError, match="too big"):
        db.rows("SELECT a FROM t")


def test_rocpd_views_are_trusted_by_their_sql(fixtures_dir: Path, tmp_path: Path) -> None:
    from perfscope.analysis.readers.rocprof.rocpd import KNOWN_VIEWS, open_db

    with open_db(fixtures_dir / ROCPD) as db:
        assert set(KNOWN_VIEWS) <= db.trusted and "rocpd_kernel_dispatch" in db.trusted
        assert "top_kernels" not in db.trusted  # a view perfscope does not read is not trusted either
    path = shutil.copy(fixtures_dir / ROCPD, tmp_path / "r.db")
    with sqlite3.connect(path) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'kernels'").fetchone()[0]
        db.execute("DROP VIEW kernels")
        db.execute(sql.replace("K.start,", "K.start + 1 AS start,"))  # one changed expression: not rocprofv3's
    with pytest.raises(InputFormatError, match="`kernels` view is not rocprofv3's own definition"):
        import_file(path)


# ---------------------------------------------------------------------------- numbers and roofs
def test_whole_numbers_round_and_make_damage_missing() -> None:
    got = whole_numbers(pd.Series([1, 2.5, 3.5, "7", "x", float("inf"), float("nan"), 1e400, 10**30, -4.4], dtype=object))
    assert got.tolist() == [1, 2, 4, 7, pd.NA, pd.NA, pd.NA, pd.NA, pd.NA, -4]


def test_validate_drops_bad_times_and_makes_bad_sizes_missing() -> None:
    k = pd.DataFrame({"name": ["a", "b", "c", "d"], "device": "gpu", "start_ns": [0, 10, 20, 2**63 - 1],
                      "end_ns": [5, 6, 30, 2**63 - 1], "duration_ns": [5, -4, 10, 0],
                      "dram_bytes": [1.0, 2.0, -3.0, np.inf], "flops": [1e30, 1.0, 2.0, 3.0]})
    from perfscope.schema import conform

    out, notes = validate(conform(k, "kernels", source="t"), "kernels")
    assert out["name"].tolist() == ["a", "c"]  # b ends before it starts; d's time is past 2^62
    assert out["dram_bytes"].isna().tolist() == [False, True] and out["flops"].isna().tolist() == [True, False]
    assert any("2 row(s)" in n for n in notes) and any("dram_bytes 1" in n and "flops 1" in n for n in notes)
    kept, lost = untimed(pd.DataFrame({"start_ns": ["1", "x", 1e400], "end_ns": [2, 3, 4]}), "api")
    assert len(kept) == 1 and "2 row(s) without a readable start_ns/end_ns" in lost[0]


def test_a_report_with_a_null_roof_loads_and_is_never_saved_with_one(fixtures_dir: Path, tmp_path: Path) -> None:
    """A report written before roofs were checked (a roofline.csv value of 1e308 became null) loads without
    that roof, and `analyze` runs on it; saving never writes a null roof."""
    saved = import_file(fixtures_dir / MI200).save(tmp_path / "r.perfscope")
    manifest = json.loads((saved / "manifest.json").read_text())
    manifest["device"]["memory"]["dram"]["value"] = None
    (saved / "manifest.json").write_text(json.dumps(manifest))
    report = Report.load(saved)
    assert "dram" not in report.device.memory
    assert main(["analyze", str(saved)]) == 0
    again = report.save(tmp_path / "again.perfscope")
    assert "dram" not in json.loads((again / "manifest.json").read_text())["device"]["memory"]


# ---------------------------------------------------------------------------- ranges
def test_range_paths_stay_bounded_however_deep() -> None:
    from perfscope.analysis.tree import ELIDED, MAX_PATH_DEPTH, depth_of, range_paths

    n = 5000
    parent = np.arange(-1, n - 1)
    paths = range_paths(np.array([f"r{i}" for i in range(n)], dtype=object), parent, depth_of(parent))
    assert paths[MAX_PATH_DEPTH - 1].count("/") == MAX_PATH_DEPTH - 1 and ELIDED not in paths[MAX_PATH_DEPTH - 1]
    assert paths[-1].endswith(f"{ELIDED}r{n - 1}") and len(paths[-1]) == len(paths[MAX_PATH_DEPTH - 1]) + len(f"{ELIDED}r{n - 1}")
    assert max(len(p) for p in paths) < 1000


def test_nested_roctx_ranges_match_kernels_by_an_interval_join(fixtures_dir: Path, tmp_path: Path) -> None:
    """3000 nested roctx ranges around a real kernel trace: every kernel gets the innermost, depths are exact,
    and the deepest path is bounded (the former pass per range and full paths were quadratic)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from roctx_nesting import write_run

    report = import_file(write_run(tmp_path, 3000))
    assert len(report.ranges) == 3000 and report.ranges["depth"].max() == 2999
    assert (report.kernels["range"].str.endswith("/level_2999")).all()
    assert report.ranges["path"].str.len().max() < 1000


# ---------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("args", [
    ["whatif", "{trace}", "--batch", "1000000000"], ["whatif", "{trace}", "--draft-len", "100000"],
    ["capacity", "--model", "llama-3-8b", "--gpu", "H100", "--memory-gib", "nan"],
    ["capacity", "--model", "llama-3-8b", "--gpu", "H100", "--memory-gib", "inf"],
    ["capacity", "--model", "llama-3-8b", "--gpu", "H100", "--gpu-memory-utilization", "nan"],
])
def test_arguments_are_checked_before_any_work(args: list[str], fixtures_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(fixtures_dir / "kineto/kineto_docs_h100_before_fix.json")
    assert main([a.format(trace=trace) for a in args]) == 2
    _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(("field", "value"), [("num_hidden_layers", 1e30), ("num_hidden_layers", -16),
                                              ("hidden_size", -4096), ("vocab_size", "lots"), ("num_local_experts", 1e9)])
def test_a_config_with_sizes_out_of_range_is_one_line(field: str, value: object, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000, field: value}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["capacity", "--model", str(tmp_path), "--gpu", "H100"]) == 3
    _one_line(capsys.readouterr().err, field, "is not a size")
