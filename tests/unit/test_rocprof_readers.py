"""AMD's own profilers: every rocprof fixture imports with the source's kernel count and time, the
rocprof-compute costs equal rocprof-compute's formulas on the same counters, the roofs equal roofline.csv."""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from perfscope.analysis.readers.detect import detect_format, import_file
from perfscope.datasheets import find_datasheet
from perfscope.errors import InputFormatError


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _plain(fixtures: Path, rel: str) -> tuple[int, int]:
    """(dispatches, summed ns) counted straight from the source, without perfscope."""
    p = fixtures / "rocprof" / rel
    if rel.endswith(".db") and "rocpd" in rel:
        with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as db:
            return db.execute("SELECT count(*), sum(end - start) FROM kernels").fetchone()
    if rel.endswith(".db"):
        with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as db:
            return db.execute("SELECT count(*), sum(EndNs - BeginNs) FROM KERN").fetchone()
    if rel.endswith(".json"):
        ev = [e for e in json.loads(p.read_text())["traceEvents"] if e.get("ph") == "X"]
        return len(ev), sum(int(e["args"]["EndNs"]) - int(e["args"]["BeginNs"]) for e in ev)
    if p.is_dir():  # rocprof-compute: pmc_perf.csv's dispatches, timed by the timestamps.csv pass
        ts = {r["Dispatch_ID"]: r for r in _rows(p / "timestamps.csv")}
        ids = [r["Dispatch_ID"] for r in _rows(p / "pmc_perf.csv")]
        return len(ids), sum(int(ts[i]["End_Timestamp"]) - int(ts[i]["Start_Timestamp"]) for i in ids)
    if rel.endswith("stats.csv"):
        rows = _rows(p)
        return sum(int(r["Calls"]) for r in rows), sum(int(r["TotalDurationNs"]) for r in rows)
    rows = _rows(p)
    if "Counter_Name" in rows[0]:
        first = {r["Dispatch_Id"]: r for r in rows}
        return len(first), sum(int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in first.values())
    b, e = ("BeginNs", "EndNs") if "BeginNs" in rows[0] else ("Start_Timestamp", "End_Timestamp")
    return len(rows), sum(int(r[e]) - int(r[b]) for r in rows)


CASES = [
    ("rocprof_compute_vcopy_MI200", "rocprof-compute", "MI200"),
    ("aiter_fmla_MI308X_rocprof_compute", "rocprof-compute", "MI308X"),
    ("aiter_fmla_MI308X_rocprofv2_trace/results_430889.csv", "rocprof-csv", None),
    ("llamacpp_r9700_rocprof_v1/results.csv", "rocprof-csv", "AMD Radeon AI PRO R9700"),
    ("llamacpp_r9700_rocprof_v1/results.db", "rocprof-db", "AMD Radeon AI PRO R9700"),
    ("llamacpp_r9700_rocprof_v1/results.json", "rocprof-json", "AMD Radeon AI PRO R9700"),
    ("llamacpp_r9700_rocprof_v1/results.stats.csv", "rocprof-stats", "AMD Radeon AI PRO R9700"),
    ("llamacpp_r9700_rocpd/32432_results.db", "rocpd", "AMD Radeon AI PRO R9700"),
    ("rocprofv3_llamacpp_gfx1151_trimmed/decode_kernel_trace.csv", "rocprofv3-csv", None),
    ("rocprofv3_llamacpp_gfx1151_trimmed/prefill_kernel_trace.csv", "rocprofv3-csv", None),
    ("rocprofv3_llamacpp_gfx1151_trimmed/decode_fetch_counter_collection.csv", "rocprofv3-csv", None),
    ("rocprofv3_llamacpp_gfx1151_trimmed/prefill_stall_counter_collection.csv", "rocprofv3-csv", None),
]


@pytest.mark.parametrize(("rel", "fmt", "device"), CASES)
def test_fixture_imports_with_the_sources_count_and_time(fixtures_dir: Path, rel: str, fmt: str,
                                                         device: str | None) -> None:
    path = fixtures_dir / "rocprof" / rel
    assert detect_format(path) == fmt
    report = import_file(path)
    n, total = _plain(fixtures_dir, rel)
    assert len(report.kernels) == n
    assert abs(float(report.kernels["duration_ns"].sum()) - total) <= 1e-3 * total
    if device is None:  # the capture holds no agent description: said, not guessed
        assert report.device is None
        assert any("device" in w and "unknown" in w for w in report.manifest["warnings"])
    else:
        assert report.device is not None and report.device.name == device
        assert report.device.kind == "rocm"
    assert report.kernels["name"].str.contains(r"\.kd|\[clone").sum() == 0


def test_rocprofv3_siblings_give_hip_api_launches(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / "rocprof" / "rocprofv3_llamacpp_gfx1151_trimmed" / "decode_kernel_trace.csv")
    api = report.api
    assert len(api) == len(_rows(fixtures_dir / "rocprof/rocprofv3_llamacpp_gfx1151_trimmed/decode_hip_api_trace.csv"))
    assert "hipLaunchKernel" in set(api["name"])
    # the kernel trace and the API trace share correlation ids: launches are joined as on CUDA
    assert api["correlation"].isin(report.kernels["correlation"]).any()


def test_counter_collection_fetch_size_gives_hbm_bytes(fixtures_dir: Path) -> None:
    path = fixtures_dir / "rocprof/rocprofv3_llamacpp_gfx1151_trimmed/decode_fetch_counter_collection.csv"
    report = import_file(path)
    want = {int(r["Dispatch_Id"]): float(r["Counter_Value"]) * 1024 for r in _rows(path)}
    got = dict(zip(report.kernels["correlation"].astype(int), report.kernels["dram_bytes"]))
    assert got == pytest.approx(want)


# ---------------------------------------------------------------------------- rocprof-compute costs
def test_vcopy_costs_equal_rocprof_computes_formulas(fixtures_dir: Path) -> None:
    folder = fixtures_dir / "rocprof" / "rocprof_compute_vcopy_MI200"
    report = import_file(folder)
    k = report.kernels.sort_values("correlation").reset_index(drop=True)
    banks = float(_rows(folder / "sysinfo.csv")[0]["lds_banks_per_cu"])
    for i, r in enumerate(_rows(folder / "pmc_perf.csv")):
        c = {key: float(v) for key, v in r.items() if key.startswith(("SQ_", "TCP_", "TCC_"))}
        valu = sum(64 * (c[f"SQ_INSTS_VALU_ADD_{p}"] + c[f"SQ_INSTS_VALU_MUL_{p}"] + 2 * c[f"SQ_INSTS_VALU_FMA_{p}"]
                         + c[f"SQ_INSTS_VALU_TRANS_{p}"]) for p in ("F16", "F32", "F64"))
        mfma = 512 * sum(c[f"SQ_INSTS_VALU_MFMA_MOPS_{p}"] for p in ("F16", "BF16", "F32", "F64"))
        hbm = (32 * c["TCC_EA_RDREQ_32B_sum"] + 64 * (c["TCC_EA_RDREQ_sum"] - c["TCC_EA_RDREQ_32B_sum"])
               + 64 * c["TCC_EA_WRREQ_64B_sum"] + 32 * (c["TCC_EA_WRREQ_sum"] - c["TCC_EA_WRREQ_64B_sum"]))
        l2 = 64 * (c["TCP_TCC_READ_REQ_sum"] + c["TCP_TCC_WRITE_REQ_sum"] + c["TCP_TCC_ATOMIC_WITH_RET_REQ_sum"]
                   + c["TCP_TCC_ATOMIC_WITHOUT_RET_REQ_sum"])
        assert k.at[i, "correlation"] == int(r["Dispatch_ID"])
        assert k.at[i, "flops"] == valu + mfma + 512 * c["SQ_INSTS_VALU_MFMA_MOPS_I8"]
        assert k.at[i, "dram_bytes"] == hbm
        assert k.at[i, "l2_bytes"] == l2
        assert k.at[i, "l1_bytes"] == 64 * c["TCP_TOTAL_CACHE_ACCESSES_sum"]
        assert k.at[i, "shared_bytes"] == (c["SQ_LDS_IDX_ACTIVE"] - c["SQ_LDS_BANK_CONFLICT"]) * 4 * banks
    # known truth: `vcopy -n 1048576` reads and writes 2^20 doubles, 16 MiB through L2, no FLOPs
    assert (k["flops"] == 0).all() and (k["l2_bytes"] == 2 * 8 * 2**20).all()
    assert (k["dram_bytes"] > 8 * 2**20).all()
    assert (k["roofline_bound"] == "memory").all()
    # measured: HBM is each copy's busiest unit, at its share of the measured HBM roof (the first, warm-up copy
    # reaches 59%: under the 60% line, latency-bound)
    assert (k["limiter"] == "dram").all()
    assert k["limiter_pct"].to_numpy(float) == pytest.approx(  # float: pandas 2.0 gives object arrays here
        (k["dram_bytes"] / (k["duration_ns"] * 1e-9) / report.device.peak_bandwidth("dram") * 100).to_numpy(float))
    assert k["bound"].tolist() == ["latency", "memory", "memory"]
    assert k["bound_level"].notna().all()


def test_vcopy_roofs_equal_roofline_csv(fixtures_dir: Path) -> None:
    folder = fixtures_dir / "rocprof" / "rocprof_compute_vcopy_MI200"
    row = _rows(folder / "roofline.csv")[0]
    spec = import_file(folder).device
    assert spec is not None
    for col, level in (("HBMBw", "dram"), ("L2Bw", "l2"), ("L1Bw", "l1"), ("LDSBw", "shared")):
        assert spec.memory[level].value == float(row[col]) * 1e9
        assert spec.memory[level].provenance == "measured (rocprof-compute)"
    for col, p in (("FP32Flops", "fp32"), ("FP64Flops", "fp64"), ("MFMAF16Flops", "fp16"), ("MFMABF16Flops", "bf16"),
                   ("MFMAF64Flops", "fp64_tensor"), ("MFMAI8Ops", "int8")):
        assert spec.compute[p].value == float(row[col]) * 1e9
        assert spec.compute[p].provenance == "measured (rocprof-compute)"


def test_fmla_times_come_from_the_timestamps_pass(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / "rocprof" / "aiter_fmla_MI308X_rocprof_compute")
    mla = report.kernels[report.kernels["name"].str.contains("flash_fwd_splitkv_mla")]
    assert len(mla) == 8
    assert (mla["duration_ns"] > 10_000_000).all()  # ~16 ms each, not pmc_perf.csv's 8-17 µs
    assert mla["precision"].eq("fp16").all() and mla["flops"].gt(0).all()
    assert mla[["l2_bytes", "l1_bytes", "shared_bytes"]].notna().all().all()


def test_fmla_decode_is_memory_bound_against_hbm(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / "rocprof" / "aiter_fmla_MI308X_rocprof_compute")
    # the MI308X row prints no compute figure: sysinfo.csv's gfx942, 80 CUs and 1420 MHz derive them
    assert report.device.compute["fp16"].provenance == "derived"
    assert report.device.memory["dram"].provenance == "datasheet"  # the row's 5.3 TB/s HBM3
    mla = report.kernels[report.kernels["name"].str.contains("flash_fwd_splitkv_mla")]
    assert len(mla) > 0
    assert mla["roofline_bound"].eq("memory").all()
    # measured: no unit of the CU reaches 60% (L2 27%, vL1D 26%, HBM 8% of the 5.3 TB/s): latency-bound
    assert mla["bound"].eq("latency").all() and (mla["limiter_pct"] < 60).all()


# ---------------------------------------------------------------------------- damaged input
def test_truncated_csv_imports_complete_rows_as_partial(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "rocprof/llamacpp_r9700_rocprof_v1/results.csv"
    lines = src.read_text().splitlines(keepends=True)
    cut = tmp_path / "results.csv"
    cut.write_text("".join(lines[:101]) + lines[101][:40])
    report = import_file(cut)
    assert len(report.kernels) == 100
    assert report.manifest["partial"] is True
    assert any("dropped" in w for w in report.manifest["warnings"])


@pytest.mark.parametrize("rel", ["rocprofv3_llamacpp_gfx1151_trimmed/decode_kernel_trace.csv",
                                 "aiter_fmla_MI308X_rocprofv2_trace/results_430889.csv"])
@pytest.mark.parametrize("value", ["1e400", "-1e400", "9" * 30, "-1"])
def test_a_launch_dimension_no_launch_has_leaves_that_kernels_grid_unknown(fixtures_dir: Path, tmp_path: Path,
                                                                          rel: str, value: str) -> None:
    """One grid or workgroup cell that is no launch's (infinite, past 32 bits, negative) is that kernel's grid
    unknown, not the whole file refused ("holds a value no rocprofv3 output has (OverflowError)" before; found by
    fuzzing the readers): every kernel imports, the others keep their grids."""
    src = fixtures_dir / "rocprof" / rel
    shutil.copytree(src.parent, tmp_path / "run")
    path = tmp_path / "run" / src.name
    rows = list(csv.reader(path.open(newline="")))
    col = next(i for i, c in enumerate(rows[0]) if c in ("Grid_Size_X", "Grid_Size"))
    rows[3][col] = value
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    clean, hostile = import_file(src), import_file(path)
    assert len(hostile.kernels) == len(clean.kernels)
    k, c = hostile.kernels.sort_values("start_ns"), clean.kernels.sort_values("start_ns")
    changed = (k["grid"].to_numpy(object) != c["grid"].to_numpy(object))
    assert changed.sum() == 1 and k["grid"].isna().sum() == c["grid"].isna().sum() + 1
    assert (k["duration_ns"].to_numpy() == c["duration_ns"].to_numpy()).all()


def test_truncated_json_is_one_error_line(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "rocprof/llamacpp_r9700_rocprof_v1/results.json"
    cut = tmp_path / "results.json"
    cut.write_bytes(src.read_bytes()[:50_000])
    with pytest.raises(InputFormatError) as err:
        import_file(cut)
    assert "JSON" in str(err.value) and "\n" not in str(err.value)


def test_damaged_rocpd_is_one_error_line(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "rocprof/llamacpp_r9700_rocpd/32432_results.db"
    cut = tmp_path / "1_results.db"
    cut.write_bytes(src.read_bytes()[:300_000])
    with pytest.raises(InputFormatError) as err:
        import_file(cut)
    assert str(cut) in str(err.value) and "\n" not in str(err.value)


def test_rocprofv3_json_with_integers_over_64_bits(tmp_path: Path) -> None:
    """rocprofv3's JSON as its writer lays it out (rocprofiler-sdk tests/rocprofv3: buffer_records,
    strings, kernel_symbols, agents); an XGMI hive id above 2^63 must not reject the file."""
    doc = {"rocprofiler-sdk-tool": [{
        "metadata": {"pid": 7},
        "agents": [{"id": {"handle": 1}, "type": 2, "name": "gfx942", "product_name": "AMD Instinct MI300X",
                    "cu_count": 304, "node_id": 2, "logical_node_id": 1, "hive_id": 17332996360099338395,
                    "max_engine_clk_fcompute": 2100}],
        "kernel_symbols": [{"kernel_id": 3, "formatted_kernel_name": "gemm_kernel"}],
        "strings": {"buffer_records": [{"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_COMPLETE"]},
                                       {"kind": "HIP_RUNTIME_API", "operations": ["hipLaunchKernel"]}]},
        "buffer_records": {
            "kernel_dispatch": [{"kind": 0, "start_timestamp": 1000 + 100 * i, "end_timestamp": 1050 + 100 * i,
                                 "correlation_id": {"internal": i + 1},
                                 "dispatch_info": {"agent_id": {"handle": 1}, "queue_id": {"handle": 1},
                                                   "kernel_id": 3, "dispatch_id": i + 1,
                                                   "grid_size": {"x": 256, "y": 1, "z": 1},
                                                   "workgroup_size": {"x": 64, "y": 1, "z": 1}}} for i in range(3)],
            "hip_api": [{"kind": 1, "operation": 0, "correlation_id": {"internal": i + 1}, "thread_id": 7,
                         "start_timestamp": 900 + 100 * i, "end_timestamp": 950 + 100 * i} for i in range(3)]},
    }]}
    path = tmp_path / "7_results.json"
    path.write_text(json.dumps(doc))
    assert detect_format(path) == "rocprofv3-json"
    report = import_file(path)
    assert len(report.kernels) == 3 and report.kernels["duration_ns"].eq(50).all()
    assert report.device is not None and report.device.properties["compute_capability"] == "9.4"
    assert list(report.api["name"]) == ["hipLaunchKernel"] * 3


def test_folder_with_two_runs_asks_for_one_file(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "rocprof/rocprofv3_llamacpp_gfx1151_trimmed"
    for name in ("decode_kernel_trace.csv", "prefill_kernel_trace.csv"):
        shutil.copy(src / name, tmp_path / name)
    with pytest.raises(InputFormatError, match="2 rocprofv3 runs"):
        import_file(tmp_path)
    single = tmp_path / "one"
    single.mkdir()
    shutil.copy(src / "decode_kernel_trace.csv", single / "decode_kernel_trace.csv")
    assert len(import_file(single).kernels) == len(pd.read_csv(single / "decode_kernel_trace.csv"))


# ---------------------------------------------------------------------------- kernel families without counters
def test_llamacpp_decode_gemv_intensity_from_its_template(fixtures_dir: Path) -> None:
    report = import_file(fixtures_dir / "rocprof/llamacpp_r9700_rocpd/32432_results.db")
    k = report.kernels
    q4 = k[k["name"].str.startswith("void mul_mat_vec_q<(ggml_type)2, 1,")]
    q6 = k[k["name"].str.startswith("void mul_mat_vec_q<(ggml_type)14, 1,")]
    assert len(q4) and len(q6)
    # Q4_0: 18 bytes per 32 weights, 2 FLOPs per weight; Q6_K: 210 bytes per 256 weights
    assert q4["arith_intensity"].eq(2 / (18 / 32)).all() and q6["arith_intensity"].eq(2 / (210 / 256)).all()
    assert q4["flops"].isna().all() and q4["dram_bytes"].isna().all()  # never invented
    others = k[~k["name"].str.contains("mul_mat_vec_q")]
    assert others["arith_intensity"].isna().all()


def test_llamacpp_decode_gemv_is_memory_bound(fixtures_dir: Path) -> None:
    assert find_datasheet("AMD Radeon AI PRO R9700", {"compute_capability": "12.0", "sm_count": 64}) is not None
    report = import_file(fixtures_dir / "rocprof/llamacpp_r9700_rocpd/32432_results.db")
    k = report.kernels
    assert k.loc[k["name"].str.contains("mul_mat_vec_q"), "bound"].eq("memory").all()


def _gfx1151(fixtures_dir: Path, tmp_path: Path, run: str) -> Path:
    shutil.copy(fixtures_dir / f"rocprof/rocprofv3_llamacpp_gfx1151_trimmed/{run}_kernel_trace.csv",
                tmp_path / f"{run}_kernel_trace.csv")
    return tmp_path / f"{run}_kernel_trace.csv"


def test_llamacpp_prefill_gemm_shape_from_its_launch_grid(fixtures_dir: Path, tmp_path: Path) -> None:
    """mul_mat_q's M, N, K come from its grid and the quantize_mmq_q8_1 dispatch before it; checked by
    hand on the Q4_K GEMM of grid (4608, 4, 1) x block (32, 4, 1) after a quantize grid (16384, 5, 1)."""
    from perfscope.analysis.readers.rocprof.families import mmq_intensity, mmq_shape

    name = "void mul_mat_q<(ggml_type)12, 128, false>(char const*, int const*)"
    # 4608 / 32 = 144 row tiles of 128 rows; 16384 / 128 = 128 tokens (one 128-column tile: 4 / 4);
    # K padded to 5 x 512 = 2560
    assert mmq_shape(name, "(4608, 4, 1)", "(32, 4, 1)", "(16384, 5, 1)") == (18432, 128, 2560, 12)
    m, n, k = 18432, 128, 2560
    expected = 2 * m * n * k / (m * k * 144 / 256 + n * k * 144 / 128 + 4 * m * n)
    assert mmq_intensity((m, n, k, 12)) == pytest.approx(expected)
    # a flattened (rocprof v1) grid, a column count the quantize grid contradicts, or no quantize: no shape
    assert mmq_shape(name, "(32768, 1, 1)", "(256, 1, 1)", "(524288, 1, 1)") is None
    assert mmq_shape(name, "(4608, 8, 1)", "(32, 4, 1)", "(16384, 5, 1)") is None
    assert mmq_shape(name, "(4608, 4, 1)", "(32, 4, 1)", None) is None

    report = import_file(_gfx1151(fixtures_dir, tmp_path, "prefill"))
    k4 = report.kernels
    gemm = k4[k4["name"].str.contains("mul_mat_q<")]
    assert len(gemm) == 248 and gemm["arith_intensity"].notna().all()
    assert gemm["precision"].eq("int8").all()
    row = gemm[(gemm["grid"] == "(4608, 4, 1)") & gemm["name"].str.startswith("void mul_mat_q<(ggml_type)12,")]
    assert row["arith_intensity"].round(6).eq(round(expected, 6)).all()
    assert gemm["flops"].isna().all() and gemm["dram_bytes"].isna().all()  # never invented
    # rocprof v1 prints the grid as one product: its prefill GEMMs stay unknown, and the warning says why
    v1 = import_file(fixtures_dir / "rocprof/llamacpp_r9700_rocprof_v1/results.csv")
    assert v1.kernels.loc[v1.kernels["name"].str.contains("mul_mat_q<"), "arith_intensity"].isna().all()
    assert any("442 llama.cpp mul_mat_q dispatches without a recoverable shape" in w for w in v1.warnings)


def test_llamacpp_prefill_gemms_sit_far_closer_to_the_compute_roof(fixtures_dir: Path, tmp_path: Path) -> None:
    """The done-when of issue 31 on the gfx1151 captures: against one device's roofs (the file names no
    device, so --roofs gives one, as a user would), decode's GEMVs attain under 1% of the int8 compute
    roof and prefill's GEMMs over a sixth of it."""
    from perfscope.datasheets import lookup_datasheet, sheet_spec

    device = sheet_spec(lookup_datasheet("Radeon AI PRO R9700"))
    peak = device.peak_flops("int8")
    pre = import_file(_gfx1151(fixtures_dir, tmp_path, "prefill"), device=device).kernels
    (tmp_path / "d").mkdir()
    dec = import_file(_gfx1151(fixtures_dir, tmp_path / "d", "decode"), device=device).kernels
    gemm = pre[pre["name"].str.contains("mul_mat_q<")]
    gemv = dec[dec["name"].str.contains("mul_mat_vec_q<")]
    assert len(gemv) and len(gemm)
    assert (gemv["roof_flops_per_s"] / peak).max() < 0.01 and gemv["bound"].eq("memory").all()
    assert (gemm["roof_flops_per_s"] / peak).min() > 1 / 6
    assert gemm["arith_intensity"].min() > 25 * gemv["arith_intensity"].max()


def test_marker_and_memory_copy_siblings(fixtures_dir: Path, tmp_path: Path) -> None:
    """roctx ranges and copies of a run, in rocprofv3's CSV layout (the headers its own tests check:
    rocprofiler-sdk tests/rocprofv3/tracing/validate.py), beside a real kernel trace."""
    src = fixtures_dir / "rocprof/rocprofv3_llamacpp_gfx1151_trimmed"
    shutil.copy(src / "decode_kernel_trace.csv", tmp_path / "run_kernel_trace.csv")
    shutil.copy(src / "decode_hip_api_trace.csv", tmp_path / "run_hip_api_trace.csv")
    kernels = pd.read_csv(tmp_path / "run_kernel_trace.csv")
    t0, t1 = int(kernels["Start_Timestamp"].min()), int(kernels["End_Timestamp"].max())
    mid = (t0 + t1) // 2
    (tmp_path / "run_marker_api_trace.csv").write_text(
        '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
        f'"MARKER_CORE_API","generate","1","2684120","1","{t0 - 10**9}","{t1 + 1}"\n'
        f'"MARKER_CORE_API","token 0","1","2684120","2","{t0 - 10**9}","{mid}"\n')
    (tmp_path / "run_memory_copy_trace.csv").write_text(
        '"Kind","Direction","Stream_Id","Source_Agent_Id","Destination_Agent_Id","Correlation_Id",'
        '"Start_Timestamp","End_Timestamp"\n'
        f'"MEMORY_COPY","MEMORY_COPY_HOST_TO_DEVICE",0,"Agent 0","Agent 1",7,{t0},{t0 + 500}\n')
    report = import_file(tmp_path / "run_kernel_trace.csv")
    assert len(report.ranges) == 2 and set(report.ranges["depth"]) == {0, 1}
    ranges = report.kernels["range"].dropna()
    assert len(ranges) == len(report.kernels)  # every kernel's launch lies inside "generate"
    assert ranges.str.startswith("generate").all() and ranges.eq("generate/token 0").any()
    # this layout records no copy sizes: the copy is kept with its measured time and its bytes missing, never 0
    assert len(report.transfers) == 1 and report.transfers["bytes"].isna().all()
    assert int(report.transfers["duration_ns"].iloc[0]) == 500 and report.transfers["kind"].iloc[0] == "HtoD"
    assert any("no size column" in w and "1 copies" in w and "bytes missing" in w for w in report.manifest["warnings"])
    (tmp_path / "run_memory_copy_trace.csv").write_text(
        '"Kind","Direction","Stream_Id","Source_Agent_Id","Destination_Agent_Id","Correlation_Id",'
        '"Start_Timestamp","End_Timestamp","Size"\n'
        f'"MEMORY_COPY","MEMORY_COPY_DEVICE_TO_HOST",0,"Agent 1","Agent 0",7,{t0},{t0 + 500},4096\n')
    t = import_file(tmp_path).transfers
    assert list(t["kind"]) == ["DtoH"] and list(t["bytes"]) == [4096]


# ---------------------------------------------------------------------------- mutated input
FUZZ_SOURCES = ("llamacpp_r9700_rocprof_v1/results.csv", "llamacpp_r9700_rocprof_v1/results.json",
                "llamacpp_r9700_rocpd/32432_results.db", "rocprofv3_llamacpp_gfx1151_trimmed/decode_kernel_trace.csv",
                "rocprofv3_llamacpp_gfx1151_trimmed/decode_stall_counter_collection.csv",
                "aiter_fmla_MI308X_rocprof_compute/pmc_perf.csv")


@pytest.mark.parametrize("case", range(24))
def test_mutated_rocprof_files_give_a_report_or_one_error_line(fixtures_dir: Path, tmp_path: Path, case: int) -> None:
    """Flipped bytes and cuts in real rocprof files: a Report, or a PerfscopeError of one line naming the file."""
    import random

    from perfscope.errors import PerfscopeError

    rng = random.Random(f"rocprof:{case}")
    rel = FUZZ_SOURCES[case % len(FUZZ_SOURCES)]
    src = fixtures_dir / "rocprof" / rel
    if src.name == "pmc_perf.csv":  # a workload folder: mutate its pmc_perf.csv beside the real sysinfo
        for name in ("sysinfo.csv", "timestamps.csv"):
            shutil.copy(src.parent / name, tmp_path / name)
    data = bytearray(src.read_bytes())
    if case % 3 == 0:
        data = data[: rng.randrange(len(data) // 10, len(data))]
    else:
        for _ in range(rng.randrange(1, 40)):
            data[rng.randrange(64, len(data))] = rng.randrange(256)
    path = tmp_path / src.name
    path.write_bytes(bytes(data))
    try:
        report = import_file(path)
    except PerfscopeError as exc:
        message = str(exc)
        assert message and "\n" not in message.strip() and "Traceback" not in message
        return
    assert report.manifest["source"]["kind"] in ("rocprof-csv", "rocprof-json", "rocpd", "rocprofv3-csv",
                                                 "rocprof-compute")
    from perfscope.report import Report

    loaded = Report.load(report.save(tmp_path / "case.perfscope", force=True))  # what it imported, it keeps
    assert len(loaded.kernels) == len(report.kernels) and loaded.manifest["partial"] == report.manifest["partial"]


AGENT_INFO_HEADER = (
    '"Node_Id","Logical_Node_Id","Agent_Type","Cpu_Cores_Count","Simd_Count","Cpu_Core_Id_Base","Simd_Id_Base",'
    '"Max_Waves_Per_Simd","Lds_Size_In_Kb","Gds_Size_In_Kb","Num_Gws","Wave_Front_Size","Num_Xcc","Cu_Count",'
    '"Array_Count","Num_Shader_Banks","Simd_Arrays_Per_Engine","Cu_Per_Simd_Array","Simd_Per_Cu",'
    '"Max_Slots_Scratch_Cu","Gfx_Target_Version","Vendor_Id","Device_Id","Location_Id","Domain","Drm_Render_Minor",'
    '"Num_Sdma_Engines","Num_Sdma_Xgmi_Engines","Num_Sdma_Queues_Per_Engine","Num_Cp_Queues",'
    '"Max_Engine_Clk_Ccompute","Max_Engine_Clk_Fcompute","Sdma_Fw_Version","Fw_Version","Capability",'
    '"Cu_Per_Engine","Max_Waves_Per_Cu","Family_Id","Workgroup_Max_Size","Grid_Max_Size","Local_Mem_Size",'
    '"Hive_Id","Gpu_Id","Workgroup_Max_Dim_X","Workgroup_Max_Dim_Y","Workgroup_Max_Dim_Z","Grid_Max_Dim_X",'
    '"Grid_Max_Dim_Y","Grid_Max_Dim_Z","Name","Vendor_Name","Product_Name","Model_Name"')
"""rocprofv3's agent_info.csv header as its documentation prints it (rocprofiler-sdk docs, using-rocprofv3)."""


def test_agent_info_sibling_gives_the_device(fixtures_dir: Path, tmp_path: Path) -> None:
    """A GPU row in rocprofv3's agent_info layout beside a real kernel trace: its name, arch and CUs
    make the device, matched to a datasheet row; the hive id above 2^63 is no reason to fail."""
    shutil.copy(fixtures_dir / "rocprof/rocprofv3_llamacpp_gfx1151_trimmed/decode_kernel_trace.csv",
                tmp_path / "9_kernel_trace.csv")
    cols = AGENT_INFO_HEADER.replace('"', "").split(",")
    cpu = dict.fromkeys(cols, "0") | {"Agent_Type": "CPU", "Name": "AMD EPYC 9654", "Product_Name": "AMD EPYC 9654"}
    gpu = dict.fromkeys(cols, "0") | {"Node_Id": "1", "Logical_Node_Id": "1", "Agent_Type": "GPU", "Cu_Count": "304",
                                      "Max_Engine_Clk_Fcompute": "2100", "Hive_Id": "17332996360099338395",
                                      "Name": "gfx942", "Product_Name": "AMD Instinct MI300X"}
    rows = [",".join(f'"{r[c]}"' for c in cols) for r in (cpu, gpu)]
    (tmp_path / "9_agent_info.csv").write_text("\n".join([AGENT_INFO_HEADER, *rows]) + "\n")
    report = import_file(tmp_path / "9_kernel_trace.csv")
    spec = report.device
    assert spec is not None and spec.name == "AMD Instinct MI300X"
    assert spec.properties["gfx_arch"] == "gfx942" and spec.properties["sm_count"] == 304
    assert spec.properties["max_clock_hz"] == 2.1e9 and spec.properties.get("datasheet") == "MI300X"
    gemv = report.kernels[report.kernels["name"].str.contains("mul_mat_vec_q")]
    assert len(gemv) and gemv["bound"].eq("memory").all()  # Q5_K GEMV: 2.9 FLOP/B against a ridge of ~250


def test_collect_advice_names_the_vendors_counter_profiler(fixtures_dir: Path) -> None:
    """A kernel trace without counters is told to collect them with its own vendor's profiler: rocprof-compute
    for an AMD capture (the R9700's rocprof v1 database), Nsight Compute for an NVIDIA one."""
    from perfscope.analysis.findings import run_rules

    amd = import_file(fixtures_dir / "rocprof/llamacpp_r9700_rocprof_v1/results.db")
    skipped = [f for f in run_rules(amd) if f.title.startswith("Roofline rules skipped")]
    assert len(skipped) == 1 and "rocprof-compute" in skipped[0].recommendation
    assert "Nsight" not in skipped[0].recommendation
    nvidia = import_file(fixtures_dir / "nsys/aws_t4_softmax.sqlite")
    text = [f.recommendation for f in run_rules(nvidia) if f.title.startswith("Roofline rules skipped")]
    assert len(text) == 1 and "Nsight Compute (perfscope profile --collector ncu" in text[0] and "rocprof" not in text[0]
