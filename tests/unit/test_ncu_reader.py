"""Nsight Compute reports and CSV, checked against the raw metric values read independently."""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import detect_format, import_file
from perfscope.analysis.readers.ncu.reader import read_ncu_csv, read_ncu_rep
from perfscope.errors import InputFormatError, ToolNotFoundError
from perfscope.report import Report

ncu_report = pytest.importorskip("ncu_report")

REPORTS = ("esmm_a10g_all_metrics", "esmm_a10g_sol_partial", "esmm_a10g_roofline_set")
SASS = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum.per_cycle_elapsed"


def raw_actions(path: Path) -> list[dict[str, float]]:
    """Every action's numeric metrics, straight from ncu_report (NaN kept as NaN)."""
    ctx = ncu_report.load_report(str(path))
    out = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            values = {"__name__": action.name()}
            for name in action.metric_names():
                metric = action.metric_by_name(name)
                if metric.kind() != ncu_report.IMetric.ValueKind_STRING and ":" not in name:
                    values[name] = metric.as_double()
            out.append(values)
    return out


@pytest.fixture(scope="module", params=REPORTS)
def rep(request: pytest.FixtureRequest, fixtures_dir: Path) -> tuple[Path, Report, list[dict]]:
    path = fixtures_dir / "ncu" / f"{request.param}.ncu-rep"
    return path, read_ncu_rep(path), raw_actions(path)


def test_durations_equal_raw_metric(rep: tuple[Path, Report, list[dict]]) -> None:
    _, report, raw = rep
    timed = [a for a in raw if not math.isnan(a.get("gpu__time_duration.sum", math.nan))]
    assert report.kernels["duration_ns"].tolist() == [a["gpu__time_duration.sum"] for a in timed]
    assert report.kernels["short_name"].tolist() == [a["__name__"] for a in timed]
    assert report.kernels["start_ns"].tolist() == [sum(a["gpu__time_duration.sum"] for a in timed[:i])
                                                   for i in range(len(timed))]


def test_launch_geometry_equals_raw_metrics(rep: tuple[Path, Report, list[dict]]) -> None:
    _, report, raw = rep
    timed = [a for a in raw if "launch__grid_dim_x" in a]
    k = report.kernels
    for row, a in zip(k.itertuples(), timed):
        assert row.grid == f"({a['launch__grid_dim_x']:.0f}, {a['launch__grid_dim_y']:.0f}, {a['launch__grid_dim_z']:.0f})"
        assert row.block == f"({a['launch__block_dim_x']:.0f}, {a['launch__block_dim_y']:.0f}, {a['launch__block_dim_z']:.0f})"
        assert row.registers_per_thread == a["launch__registers_per_thread"]
        assert row.shared_mem_bytes == (a["launch__shared_mem_per_block_static"]
                                        + a["launch__shared_mem_per_block_dynamic"])


def test_roofline_set_flops_bytes_and_roofs(fixtures_dir: Path) -> None:
    path = fixtures_dir / "ncu" / "esmm_a10g_roofline_set.ncu-rep"
    report, raw = read_ncu_rep(path), raw_actions(path)
    k = report.kernels
    for row, a in zip(k.itertuples(), raw):
        seconds = a["gpu__time_duration.sum"] * 1e-9
        clock = a["smsp__cycles_elapsed.avg.per_second"]
        fp32 = (a[SASS.format("fadd")] + a[SASS.format("fmul")] + 2 * a[SASS.format("ffma")]) * clock * seconds
        assert row.flops_fp32 == pytest.approx(fp32, rel=1e-12)
        assert row.flops == pytest.approx(fp32, rel=1e-12)  # fp64 and fp16 counters read 0
        assert row.flops == pytest.approx(2 * 1024**3, rel=2e-3)  # a 1024^3 SGEMM
        assert row.dram_bytes == pytest.approx(a["dram__bytes.sum.per_second"] * seconds, rel=1e-12)
        assert (row.precision, row.flops_source, row.bytes_source) == ("fp32", "ncu", "ncu")
    dev = report.device
    sm_clock = statistics.median(a["sm__cycles_elapsed.avg.per_second"] for a in raw)
    dram_clock = statistics.median(a["dram__cycles_elapsed.avg.per_second"] for a in raw)
    assert dev.compute["fp32"].value == pytest.approx(2 * 10240 * sm_clock, rel=1e-12)
    assert dev.compute["fp64"].value == pytest.approx(2 * 160 * sm_clock, rel=1e-12)
    assert dev.memory["dram"].value == pytest.approx(96 * dram_clock, rel=1e-12)
    assert {r.provenance for r in [*dev.compute.values(), *dev.memory.values()]} == {"report"}
    assert dev.name == "NVIDIA A10G" and report.warnings == []
    assert set(k["roofline_bound"]) == {"compute"}  # the FLOPs and bytes: past the ridge
    # the measured limiter: the 1D-blocktiling kernel's LSU pipe at 65% (SM 64.8%); the others reach no unit's 60%
    assert k["bound"].tolist() == ["compute", "latency", "latency", "latency"]
    assert k["limiter"].iloc[0] == "lsu" and k["limiter_pct"].iloc[0] == pytest.approx(
        raw[0]["sm__throughput.avg.pct_of_peak_sustained_elapsed"])
    assert k["pct_of_roof"].tolist() == pytest.approx(
        (k["flops"] / (k["duration_ns"] * 1e-9) / dev.compute["fp32"].value * 100).tolist())


def test_partial_report_names_the_untimed_launch(fixtures_dir: Path) -> None:
    report = read_ncu_rep(fixtures_dir / "ncu" / "esmm_a10g_sol_partial.ncu-rep")
    assert len(report.kernels) == 5 and report.manifest["partial"] is True
    assert report.params["launches_without_duration"][0]["ncu_id"] == 5
    assert "one_d_vec" in report.params["launches_without_duration"][0]["name"]
    assert any("duration_ns (gpu__time_duration.sum)" == m for m in report.unavailable_metrics)
    assert any("without gpu__time_duration.sum" in w and "one_d_vec" in w for w in report.warnings)


def test_sol_and_occupancy_columns_equal_raw(fixtures_dir: Path) -> None:
    path = fixtures_dir / "ncu" / "esmm_a10g_sol_partial.ncu-rep"
    k, raw = read_ncu_rep(path).kernels, raw_actions(path)[:5]
    assert k["sm_throughput_pct"].tolist() == [a["sm__throughput.avg.pct_of_peak_sustained_elapsed"] for a in raw]
    assert k["achieved_occupancy_pct"].tolist() == [a["sm__warps_active.avg.pct_of_peak_sustained_active"] for a in raw]
    assert k["theoretical_occupancy_pct"].tolist() == [a["sm__maximum_warps_per_active_cycle_pct"] for a in raw]
    assert k["dram_throughput_pct"].tolist() == [a["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"] for a in raw]


def test_reports_without_counters_stay_unknown(fixtures_dir: Path) -> None:
    report = read_ncu_rep(fixtures_dir / "ncu" / "esmm_a10g_all_metrics.ncu-rep")
    k = report.kernels
    assert len(k) == 12 and k["flops"].isna().all() and set(k["bound"]) == {"unknown"}
    assert "flops (SASS FP instruction counters)" in report.unavailable_metrics
    dram = report.device.memory["dram"]  # theoretical: 2 x 6.251 GHz x 384 bit / 8
    assert dram.value == pytest.approx(2 * 6_251_000e3 * 384 / 8) and dram.provenance == "report"
    assert report.device.compute == {}
    assert any("row A10G lists no compute figures" in w for w in report.warnings)  # NVIDIA publishes none


# ------------------------------------------------------------------------------ CSV (long)
def csv_metrics(path: Path) -> dict[str, dict[str, float]]:
    """ID -> metric -> value, parsed with the csv module and plain string handling."""
    out: dict[str, dict[str, float]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            out.setdefault(row["ID"], {})[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return out


def test_long_csv_durations_flops_and_bytes_equal_raw(fixtures_dir: Path) -> None:
    path = fixtures_dir / "ncu" / "esmm_a10g_roofline_metrics.csv"
    report, raw = read_ncu_csv(path), csv_metrics(path)
    k = report.kernels
    assert len(k) == len(raw) == 9
    for row, (launch_id, m) in zip(k.itertuples(), raw.items()):
        assert row.ncu_id == int(launch_id)
        assert row.duration_ns == m["gpu__time_duration.sum"]
        fp32 = (m["sm__sass_thread_inst_executed_op_fadd_pred_on.sum"] + m["sm__sass_thread_inst_executed_op_fmul_pred_on.sum"]
                + 2 * m["sm__sass_thread_inst_executed_op_ffma_pred_on.sum"])
        assert row.flops == fp32 and row.flops_fp32 == fp32
        assert math.isnan(row.flops_fp64) and math.isnan(row.flops_fp16)  # not collected
        assert row.dram_bytes == m["dram__bytes.sum"]
    assert k.loc[0, "flops"] == 2 * 1_073_741_824 + 1_048_576
    assert k.loc[0, "grid"] == "(32, 32, 1)" and k.loc[0, "device"] == "cuda:0"
    assert report.manifest["source"]["kind"] == "ncu-csv" and report.params["csv_shape"] == "long"


def test_csv_without_device_name_says_roofs_unknown(fixtures_dir: Path) -> None:
    report = read_ncu_csv(fixtures_dir / "ncu" / "esmm_a10g_roofline_metrics.csv")
    assert report.device is None and set(report.kernels["bound"]) == {"unknown"}
    assert any("compute roofs unknown" in w for w in report.warnings)
    assert "127.0.0.1" not in str(report.manifest) and "a.out" not in str(report.manifest)


def test_device_argument_classifies_csv(fixtures_dir: Path) -> None:
    spec = read_ncu_rep(fixtures_dir / "ncu" / "esmm_a10g_roofline_set.ncu-rep").device  # same A10G
    report = read_ncu_csv(fixtures_dir / "ncu" / "esmm_a10g_roofline_metrics.csv", device=spec)
    assert report.device == spec
    assert set(report.kernels["bound"]) <= {"memory", "compute"}


# ------------------------------------------------------------------------------ detection and errors
def test_detection_of_every_ncu_fixture(fixtures_dir: Path) -> None:
    for path in sorted((fixtures_dir / "ncu").iterdir()):
        fmt = detect_format(path)
        assert fmt == ("ncu-csv" if path.suffix == ".csv" else "ncu-rep")
        assert len(import_file(path).kernels) > 0


def test_truncated_and_junk_reports_are_input_errors(fixtures_dir: Path, tmp_path: Path) -> None:
    data = (fixtures_dir / "ncu" / "esmm_a10g_roofline_set.ncu-rep").read_bytes()
    cut = tmp_path / "cut.ncu-rep"
    cut.write_bytes(data[: len(data) // 3])
    junk = tmp_path / "junk.ncu-rep"
    junk.write_bytes(b"hello " * 100)
    for bad in (cut, junk):
        with pytest.raises(InputFormatError, match="no profiled kernel results"):
            read_ncu_rep(bad)


def test_missing_ncu_report_package_says_pip_install(fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ncu_report", None)  # makes `import ncu_report` fail
    with pytest.raises(ToolNotFoundError, match="pip install ncu-report"):
        read_ncu_rep(fixtures_dir / "ncu" / "esmm_a10g_roofline_set.ncu-rep")
