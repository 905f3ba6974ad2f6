"""Schema differences across nsys versions and bad input, on reduced copies of a real export."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.readers.nsys.reader import read_nsys_rep, read_nsys_sqlite
from perfscope.errors import CollectorError, InputFormatError, ToolNotFoundError

KERNELS = "CUPTI_ACTIVITY_KIND_KERNEL"


@pytest.fixture(scope="module")
def source(fixtures_dir: Path) -> Path:
    return fixtures_dir / "nsys" / "nvfuser_h100_matmul.sqlite"


def reduced(source: Path, tmp_path: Path, *statements: str) -> Path:
    """A copy of the export with some schema statements applied (the original is untouched)."""
    copy = tmp_path / "reduced.sqlite"
    shutil.copyfile(source, copy)
    os.chmod(copy, stat.S_IRUSR | stat.S_IWUSR)
    with sqlite3.connect(copy) as conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()
    return copy


def enum_tables(path: Path) -> list[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'ENUM_%'")]


def kernel_totals(path: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return dict(conn.execute(f"""SELECT s.value, SUM(k.end - k.start) FROM {KERNELS} k
                                     JOIN StringIds s ON s.id = k.demangledName GROUP BY 1"""))


VARIANTS: dict[str, Callable[[Path], list[str]]] = {
    "no ENUM tables (pre-2024 exports)": lambda src: [f"DROP TABLE {t}" for t in enum_tables(src)],
    "EXPORT_META_DATA (2022.4 name)": lambda src: ["ALTER TABLE META_DATA_EXPORT RENAME TO EXPORT_META_DATA"],
    "no greenContextId (2022.4)": lambda src: [
        f"ALTER TABLE {t} DROP COLUMN greenContextId"
        for t in (KERNELS, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")],
    "no mangledName": lambda src: [f"ALTER TABLE {KERNELS} DROP COLUMN mangledName"],
    "no NVTX table": lambda src: ["DROP TABLE NVTX_EVENTS"],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_older_schema_variants_import_with_same_kernels(source: Path, tmp_path: Path, variant: str) -> None:
    path = reduced(source, tmp_path, *VARIANTS[variant](source))
    report = read_nsys_sqlite(path)
    assert report.kernels.groupby("name")["duration_ns"].sum().to_dict() == kernel_totals(source)
    assert report.manifest["source"]["tool_version"] == "2024.6.2.25"
    assert set(report.transfers["kind"]) == {"DtoH", "memset"}
    assert report.transfers.loc[report.transfers["kind"] == "DtoH", "pinned"].tolist() == [True]


def test_missing_nvtx_table_is_a_warning(source: Path, tmp_path: Path) -> None:
    report = read_nsys_sqlite(reduced(source, tmp_path, "DROP TABLE NVTX_EVENTS"))
    assert report.ranges.empty and report.kernels["range"].isna().all()
    assert any("NVTX_EVENTS absent" in w for w in report.warnings)


def test_nothing_captured_gives_empty_report_with_warnings(source: Path, tmp_path: Path) -> None:
    path = reduced(source, tmp_path, f"DROP TABLE {KERNELS}", "DROP TABLE CUPTI_ACTIVITY_KIND_MEMCPY",
                   "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET", "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME",
                   "DROP TABLE TARGET_INFO_GPU")
    report = read_nsys_sqlite(path)
    assert report.kernels.empty and report.transfers.empty and report.api.empty
    assert len(report.ranges) == 639
    assert any(f"{KERNELS} is absent" in w for w in report.warnings)
    assert any("TARGET_INFO_GPU is absent" in w for w in report.warnings)
    assert report.device is None and report.unavailable_metrics == []


def test_unknown_gpu_keeps_driver_bandwidth_as_report_roof(source: Path, tmp_path: Path) -> None:
    # an unlisted name whose properties match no row either (an H100's would match H100 SXM5 by them)
    report = read_nsys_sqlite(reduced(source, tmp_path, "UPDATE TARGET_INFO_GPU SET name = 'Mystery GPU', smCount = 7"))
    dev = report.device
    assert dev is not None and dev.compute == {}
    assert dev.memory["dram"].value == 3352320000000 and dev.memory["dram"].provenance == "report"
    assert any("no datasheet roofs for 'Mystery GPU'" in w for w in report.warnings)


# ------------------------------------------------------------------------------ bad input
def test_empty_file_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(InputFormatError, match="empty"):
        import_file(empty)
    with pytest.raises(InputFormatError, match="not an Nsight Systems export"):
        read_nsys_sqlite(empty)


def test_truncated_sqlite_names_file_and_fix(source: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    with pytest.raises(InputFormatError) as err:
        import_file(cut)
    assert str(cut) in str(err.value) and "truncated" in str(err.value) and "nsys export" in str(err.value)


def test_corrupt_page_is_an_input_error(source: Path, tmp_path: Path) -> None:
    data = bytearray(source.read_bytes())
    for offset in range(4096 * 20, len(data), 4096 * 7):  # scribble over many b-tree pages
        data[offset:offset + 64] = b"\xff" * 64
    bad = tmp_path / "corrupt.sqlite"
    bad.write_bytes(bytes(data))
    with pytest.raises(InputFormatError, match="corrupt.sqlite"):
        read_nsys_sqlite(bad)


def test_sqlite_that_is_not_nsys(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE people(name TEXT)")
    conn.close()
    with pytest.raises(InputFormatError, match="not an Nsight Systems export"):
        import_file(other)


def test_reader_never_writes_the_input(source: Path, tmp_path: Path) -> None:
    copy = reduced(source, tmp_path)
    os.chmod(copy, stat.S_IRUSR)
    before = (copy.read_bytes(), copy.stat().st_mtime_ns)
    read_nsys_sqlite(copy)
    assert (copy.read_bytes(), copy.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reduced.sqlite"]


def test_nsys_rep_without_nsys_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(ToolNotFoundError) as err:
        import_file(rep)
    assert "nsys export --type sqlite" in str(err.value)


def test_failing_nsys_export_reports_command_and_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``nsys`` (the real one is not installed here) that fails like a bad report."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text("#!/bin/sh\necho 'Importer error status: Wrong event order' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really")
    with pytest.raises(CollectorError) as err:
        read_nsys_rep(rep)
    assert err.value.returncode == 3 and "export" in err.value.cmd
    assert "Wrong event order" in str(err.value)


def test_domains_registered_strings_start_end_and_open_ranges(source: Path, tmp_path: Path) -> None:
    """NVTX features the fixture lacks, added to a copy: a named domain, a registered string,
    a start/end range and a range that never closed."""
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as conn:
        tid, first, last = conn.execute("SELECT globalTid, MIN(start), MAX(end) FROM NVTX_EVENTS").fetchone()
        (sid,) = conn.execute("SELECT MAX(id) + 1 FROM StringIds").fetchone()
    conn.close()
    path = reduced(
        source, tmp_path,
        f"INSERT INTO StringIds (id, value) VALUES ({sid}, 'registered message')",
        f"INSERT INTO NVTX_EVENTS (start, eventType, globalTid, domainId, text) VALUES ({first}, 75, {tid}, 7, 'mydomain')",
        f"INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, domainId, textId) "
        f"VALUES ({first}, {first + 10}, 59, {tid}, 7, {sid})",
        f"INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, domainId, text) "
        f"VALUES ({first + 5}, {last}, 60, {tid}, 0, 'async work')",
        f"INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, domainId, text) "
        f"VALUES ({last - 100}, NULL, 59, {tid}, 0, 'never closed')",
    )
    report = read_nsys_sqlite(path)
    r = report.ranges.set_index("name")
    assert len(report.ranges) == 639 + 3
    assert r.loc["mydomain:registered message", "domain"] == "mydomain"
    assert r.loc["async work", "depth"] == 0 and r.loc["async work", "path"] == "async work"
    assert r.loc["never closed", "end_ns"] == last
    assert any("1 NVTX range(s) never closed" in w for w in report.warnings)


DAMAGE = ("'garbage'", "1e400", "-1e400", "1.5e30")
"""Cells no nsys export writes in an integer column: text, ±inf, a number past int64 (stored as REAL)."""


@pytest.mark.parametrize("value", DAMAGE)
def test_an_unreadable_time_costs_its_row_and_says_which_table_and_column(source: Path, tmp_path: Path,
                                                                           value: str) -> None:
    """One kernel's start, one API call's end and one NVTX range's start set to a value no export has:
    those three rows are dropped, every other row is read as from the clean file, and the warnings name
    each table and column (the whole file was refused before: 'holds a value no nsys export has')."""
    clean = read_nsys_sqlite(source)
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as conn:
        (kernel_id,) = conn.execute(f"SELECT MIN(rowid) FROM {KERNELS}").fetchone()
        (lost_name,) = conn.execute(f"SELECT s.value FROM {KERNELS} k JOIN StringIds s ON s.id = k.demangledName "
                                    f"WHERE k.rowid = {kernel_id}").fetchone()
    conn.close()
    path = reduced(
        source, tmp_path,
        f"UPDATE {KERNELS} SET start = {value} WHERE rowid = {kernel_id}",
        f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET end = {value} WHERE rowid = (SELECT MIN(rowid) FROM "
        "CUPTI_ACTIVITY_KIND_RUNTIME)",
        f"UPDATE NVTX_EVENTS SET start = {value} WHERE rowid = (SELECT MIN(rowid) FROM NVTX_EVENTS "
        "WHERE eventType = 59)",
    )
    report = read_nsys_sqlite(path)
    assert len(report.kernels) == len(clean.kernels) - 1
    assert len(report.api) == len(clean.api) - 1
    assert len(report.ranges) == len(clean.ranges) - 1
    lost = clean.kernels.loc[clean.kernels["name"] == lost_name, "duration_ns"]
    assert report.kernels["duration_ns"].sum() == clean.kernels["duration_ns"].sum() - lost.iloc[0]
    for column in (f"{KERNELS}.start", "CUPTI_ACTIVITY_KIND_RUNTIME.end", "NVTX_EVENTS.start"):
        assert any(w.startswith(f"{column}: 1 value(s) not a whole number") for w in report.warnings), column
    assert any("kernels: 1 row(s) without a readable" in w for w in report.warnings)


@pytest.mark.parametrize(("name", "table", "statement", "column"), [
    ("nvfuser_h100_matmul.sqlite", "NVTX_EVENTS",
     "UPDATE NVTX_EVENTS SET start = NULL WHERE rowid = (SELECT MIN(rowid) FROM NVTX_EVENTS WHERE eventType = 59)",
     "start/globalTid"),
    ("aws_t4_softmax.sqlite", "OSRT_API", "UPDATE OSRT_API SET \"end\" = NULL WHERE rowid IN "
     "(SELECT rowid FROM OSRT_API ORDER BY rowid LIMIT 3)", "start/end"),
])
def test_a_row_without_a_time_is_dropped_and_counted(fixtures_dir: Path, tmp_path: Path, name: str, table: str,
                                                     statement: str, column: str) -> None:
    """A NULL in an NVTX range's start or an OS-runtime call's end (no nsys export writes one) costs that row,
    and the report says how many rows of which table it lost (they were dropped without a word before)."""
    source = fixtures_dir / "nsys" / name
    clean = read_nsys_sqlite(source)
    # nsys declares its times NOT NULL; a file made otherwise (the same table without the constraint) is read too
    unconstrained = (f"CREATE TABLE copied AS SELECT * FROM {table}", f"DROP TABLE {table}",
                     f"ALTER TABLE copied RENAME TO {table}")
    report = read_nsys_sqlite(reduced(source, tmp_path, *unconstrained, statement))
    lost = 1 if table == "NVTX_EVENTS" else 3
    note = f"{table}: {lost} row(s) without a readable {column} dropped"
    assert note in report.warnings and note not in clean.warnings
    if table == "NVTX_EVENTS":
        assert len(report.ranges) == len(clean.ranges) - 1
    else:
        waits = clean.host[clean.host["kind"] == "wait"]
        assert len(report.host[report.host["kind"] == "wait"]) == len(waits) - 3
    assert len(report.kernels) == len(clean.kernels)


def test_an_unreadable_id_leaves_that_rows_link_unknown(source: Path, tmp_path: Path) -> None:
    """Text in a kernel's correlationId and in every API call's globalTid: each kernel is still read, with
    its time; only what those ids join (the launching thread, the NVTX range) is unknown where they are."""
    clean = read_nsys_sqlite(source)
    path = reduced(source, tmp_path,
                   f"UPDATE {KERNELS} SET correlationId = 'x' WHERE rowid = (SELECT MIN(rowid) FROM {KERNELS})",
                   "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = 'x'",
                   "UPDATE TARGET_INFO_GPU SET memoryBandwidth = 'x'")
    report = read_nsys_sqlite(path)
    assert len(report.kernels) == len(clean.kernels)
    assert report.kernels["duration_ns"].sum() == clean.kernels["duration_ns"].sum()
    assert report.kernels["launch_thread"].isna().all() and clean.kernels["launch_thread"].notna().all()
    assert report.device.name == clean.device.name
    for column in (f"{KERNELS}.correlationId", "CUPTI_ACTIVITY_KIND_RUNTIME.globalTid",
                   "TARGET_INFO_GPU.memoryBandwidth"):
        assert any(w.startswith(f"{column}: ") for w in report.warnings), column
