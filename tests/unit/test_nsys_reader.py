"""Nsight Systems SQLite reader, checked against direct SQL on the same real exports."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.analysis.readers.detect import detect_format, import_file
from perfscope.analysis.readers.nsys.reader import read_nsys_sqlite
from perfscope.report import Report

FIXTURES = ("nvfuser_h100_matmul.sqlite", "aws_t4_softmax.sqlite")
MASK = ~0xFFFFFF  # globalTid & 0xFFFFFFFFFF000000, as a signed 64-bit mask


def sql(path: Path, query: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module", params=FIXTURES)
def export(request: pytest.FixtureRequest, fixtures_dir: Path) -> tuple[Path, Report]:
    path = fixtures_dir / "nsys" / request.param
    return path, read_nsys_sqlite(path)


@pytest.fixture(scope="module")
def nvfuser(fixtures_dir: Path) -> tuple[Path, Report]:
    path = fixtures_dir / "nsys" / "nvfuser_h100_matmul.sqlite"
    return path, read_nsys_sqlite(path)


def test_kernel_count_and_total_duration_per_name_match_sql(export: tuple[Path, Report]) -> None:
    path, report = export
    expected = dict(sql(path, """
        SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds s ON s.id = k.demangledName GROUP BY s.value"""))
    (count,), = sql(path, "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    got = report.kernels.groupby("name")["duration_ns"].sum().to_dict()
    assert len(report.kernels) == count
    assert got == expected


def test_kernel_geometry_and_names_match_sql(nvfuser: tuple[Path, Report]) -> None:
    path, report = nvfuser
    rows = sql(path, """
        SELECT k.start, sh.value, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ,
               k.registersPerThread, k.staticSharedMemory + k.dynamicSharedMemory, k.streamId,
               k.correlationId, k.deviceId
        FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds sh ON sh.id = k.shortName ORDER BY k.start""")
    k = report.kernels.sort_values("start_ns").reset_index(drop=True)
    for i, r in enumerate(rows):
        assert k.loc[i, "start_ns"] == r[0]
        assert k.loc[i, "short_name"] == r[1]
        assert k.loc[i, "grid"] == f"({r[2]}, {r[3]}, {r[4]})"
        assert k.loc[i, "block"] == f"({r[5]}, {r[6]}, {r[7]})"
        assert (k.loc[i, "registers_per_thread"], k.loc[i, "shared_mem_bytes"]) == (r[8], r[9])
        assert (k.loc[i, "stream"], k.loc[i, "correlation"], k.loc[i, "device"]) == (r[10], r[11], f"cuda:{r[12]}")
    assert (k["shared_mem_bytes"] > 0).sum() == 3  # nvFuser, nvjet and reduce kernels


def test_no_counters_means_unknown_bound_said_plainly(export: tuple[Path, Report]) -> None:
    _, report = export
    k = report.kernels
    assert k["flops"].isna().all() and k["dram_bytes"].isna().all()
    assert set(k["bound"]) == {"unknown"}
    assert report.unavailable_metrics == ["flops", "dram_bytes"]
    assert any("no hardware counters" in w for w in report.warnings)


def test_transfers_match_sql(export: tuple[Path, Report]) -> None:
    path, report = export
    memcpy = sql(path, "SELECT copyKind, COUNT(*), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind")
    tables = {r[0] for r in sql(path, "SELECT name FROM sqlite_master")}
    memset = (sql(path, "SELECT COUNT(*), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET")[0]
              if "CUPTI_ACTIVITY_KIND_MEMSET" in tables else (0, None))
    t = report.transfers
    kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD", 11: "HtoD", 12: "DtoH"}
    for code, count, nbytes in memcpy:
        rows = t[(t["kind"] == kinds[code]) & (t["kind"] != "memset")]
        assert (len(rows), int(rows["bytes"].sum())) == (count, nbytes)
    sets = t[t["kind"] == "memset"]
    assert len(sets) == memset[0] and (memset[0] == 0 or int(sets["bytes"].sum()) == memset[1])


def test_transfer_kinds_and_pinned_from_enum_tables(fixtures_dir: Path) -> None:
    h100 = read_nsys_sqlite(fixtures_dir / "nsys" / "nvfuser_h100_matmul.sqlite").transfers
    copy = h100[h100["kind"] == "DtoH"].iloc[0]
    assert (copy["src_kind"], copy["dst_kind"], bool(copy["pinned"])) == ("Device", "Pinned", True)
    assert h100[h100["kind"] == "memset"].iloc[0]["dst_kind"] == "Device"
    t4 = read_nsys_sqlite(fixtures_dir / "nsys" / "aws_t4_softmax.sqlite").transfers
    assert set(t4["copy_kind"]) == {"Unified Host-to-Device", "Unified Device-to-Host"}
    assert t4["pinned"].isna().all()  # memory kind "Unknown": not guessed


def test_api_calls_match_sql_with_version_suffix_stripped(export: tuple[Path, Report]) -> None:
    path, report = export
    rows = sql(path, """
        SELECT s.value, r.eventClass FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId""")
    expected = pd.Series([re.sub(r"_v\d{4,5}$", "", n) for n, _ in rows]).value_counts().to_dict()
    assert report.api["name"].value_counts().to_dict() == expected
    assert report.api["kind"].value_counts().to_dict() == pd.Series(
        ["runtime" if c == 0 else "driver" for _, c in rows]).value_counts().to_dict()


def test_api_suffix_rule_keeps_real_names(nvfuser: tuple[Path, Report]) -> None:
    names = set(nvfuser[1].api["name"])
    assert {"cudaLaunchKernel", "cuGetProcAddress_v2", "cudaGetDeviceProperties_v2",
            "cudaOccupancyMaxActiveClusters"} <= names
    assert not any(re.search(r"_v\d{4,5}$", n) for n in names)


def _brute_force_ranges(path: Path) -> list[tuple[int, int, int, str]]:
    return [(s, e, t, n) for s, e, t, n in sql(path, """
        SELECT start, end, globalTid, text FROM NVTX_EVENTS WHERE eventType = 59""")]


def test_ranges_depth_and_parent_match_brute_force(nvfuser: tuple[Path, Report]) -> None:
    path, report = nvfuser
    raw = _brute_force_ranges(path)
    ranges = report.ranges.set_index("id")
    assert len(ranges) == len(raw)
    by_key = {(r["start_ns"], r["end_ns"], r["name"]): i for i, r in ranges.iterrows()}
    for s, e, tid, name in raw:
        enclosing = [x for x in raw if x[2] == tid and x[0] <= s and x[1] >= e and x != (s, e, tid, name)]
        row = ranges.loc[by_key[(s, e, name)]]
        assert row["depth"] == len(enclosing)
        path_names = [x[3] for x in sorted(enclosing, key=lambda x: (x[0], -x[1]))] + [name]
        assert row["path"] == "/".join(path_names)


def test_kernel_nvtx_projection_matches_brute_force(nvfuser: tuple[Path, Report]) -> None:
    path, report = nvfuser
    raw = _brute_force_ranges(path)
    launches = sql(path, f"""
        SELECT k.start, r.start, r.end, r.globalTid FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
          ON r.correlationId = k.correlationId AND (r.globalTid & {MASK}) = k.globalPid""")
    expected = {}
    for kstart, rs, re_, tid in launches:
        enclosing = sorted((x for x in raw if x[2] == tid and x[0] <= rs and x[1] >= re_),
                           key=lambda x: (x[0], -x[1]))
        expected[kstart] = "/".join(x[3] for x in enclosing) or None
    got = dict(zip(report.kernels["start_ns"], report.kernels["range"]))
    assert got == expected
    assert sum(v is not None for v in got.values()) == 2  # nvFuser's own launches only


def test_phase_from_engine_range_names(nvfuser: tuple[Path, Report], tmp_path: Path) -> None:
    path, report = nvfuser
    inner = report.kernels.dropna(subset=["range"]).iloc[0]
    outer = inner["range"].split("/")[0]
    copy = tmp_path / "phase.sqlite"
    shutil.copyfile(path, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE NVTX_EVENTS SET text = 'decode' WHERE text = ?", (outer,))
    k = read_nsys_sqlite(copy).kernels
    tagged = k[k["range"].notna()]
    assert set(tagged["phase"]) == {"decode"} and tagged["range"].str.startswith("decode/").all()
    assert k.loc[k["range"].isna(), "phase"].isna().all()


def test_device_from_target_info_gpu_with_datasheet_roofs(export: tuple[Path, Report]) -> None:
    path, report = export
    name, sms, mem, bw = sql(path, """
        SELECT g.name, g.smCount, g.totalMemory, g.memoryBandwidth FROM TARGET_INFO_GPU g
        WHERE g.id = (SELECT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1)""")[0]
    dev = report.device
    assert dev is not None and dev.name == name
    assert (dev.properties["sm_count"], dev.properties["memory_bytes"]) == (sms, mem)
    # memoryBandwidth is bytes/s: within 0.1% of the datasheet DRAM roof on both GPUs
    assert dev.memory["dram"].provenance == "datasheet"
    assert abs(bw / dev.memory["dram"].value - 1) < 1e-3
    assert all(r.provenance == "datasheet" and r.clock == "boost" for r in dev.compute.values())


def test_manifest_source_and_no_host_or_user_data(export: tuple[Path, Report]) -> None:
    path, report = export
    meta = dict(sql(path, "SELECT name, value FROM META_DATA_EXPORT"))
    src = report.manifest["source"]
    assert src == {"kind": "nsys-sqlite", "path": str(path), "tool": "nsys",
                   "tool_version": meta["EXPORT_PRODUCT_VERSION"]}
    text = json.dumps(report.manifest)
    private = [v for k, v in meta.items() if k in ("EXPORT_HOST", "EXPORT_USER") or "PATH_ABS" in k]
    env = [v for (n, v) in sql(path, "SELECT name, value FROM TARGET_INFO_SYSTEM_ENV")
           if n in ("Hostname", "DeviceEnvironment", "SystemUID")]
    for value in private + env:
        assert str(value) not in text


def test_report_round_trip(nvfuser: tuple[Path, Report], tmp_path: Path) -> None:
    _, report = nvfuser
    saved = Report.load(report.save(tmp_path / "h100.perfscope"))
    for col in ("name", "duration_ns"):
        assert saved.kernels[col].tolist() == report.kernels[col].tolist()
    assert saved.kernels["range"].isna().tolist() == report.kernels["range"].isna().tolist()
    assert saved.kernels["range"].dropna().tolist() == report.kernels["range"].dropna().tolist()
    assert len(saved.ranges) == len(report.ranges) and len(saved.api) == len(report.api)


def test_import_file_detects_and_reads_nsys_sqlite(nvfuser: tuple[Path, Report]) -> None:
    path, report = nvfuser
    assert detect_format(path) == "nsys-sqlite"
    again = import_file(path)
    assert np.array_equal(again.kernels["start_ns"], report.kernels["start_ns"])


def test_device_argument_overrides(nvfuser: tuple[Path, Report]) -> None:
    from perfscope.device import DeviceSpec, Roof

    spec = DeviceSpec("my gpu", "cuda", {"fp32": Roof(1e12, "measured")}, {"dram": Roof(1e11, "measured")})
    report = read_nsys_sqlite(nvfuser[0], device=spec)
    assert report.device == spec
