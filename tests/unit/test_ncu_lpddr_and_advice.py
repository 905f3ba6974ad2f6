"""Nsight Compute on LPDDR / unified-memory parts: the theoretical DRAM roof is not doubled (GB10:
273 GB/s, not 546); and advice never asks an Nsight Compute report to be collected with Nsight Compute."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from perfscope.analysis.findings import run_rules
from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.readers.ncu.metrics import Launch, attribute_bandwidth, roofs_spec
from perfscope.datasheets import datasheet_spec

GB10_ATTRS = {"device__attribute_max_mem_frequency_khz": 8_533_000.0,  # LPDDR5X-8533: the data rate
              "device__attribute_global_memory_bus_width": 256.0, "device__attribute_multiprocessor_count": 48.0,
              "device__attribute_compute_capability_major": 12.0, "device__attribute_compute_capability_minor": 1.0,
              "gpu__time_duration.sum": 1_000.0}
A10G_ATTRS = {"device__attribute_max_mem_frequency_khz": 6_251_000.0,  # GDDR6: 2 transfers per reported clock
              "device__attribute_global_memory_bus_width": 384.0, "device__attribute_integrated": 0.0}


def test_gb10_dram_roof_is_the_lpddr5x_rate_not_twice_it() -> None:
    launches = [Launch(0, "attn", "attn", {**GB10_ATTRS, "device__attribute_display_name": "NVIDIA GB10"})]
    spec, _ = roofs_spec("NVIDIA GB10", launches, datasheet_spec("NVIDIA GB10"))
    assert spec is not None and spec.memory["dram"].value == pytest.approx(273e9)  # the datasheet's LPDDR5X figure
    # the formula itself, told the part is LPDDR (its datasheet row) or integrated: 8,533 MT/s x 32 B
    assert attribute_bandwidth(launches, lpddr=True).value == pytest.approx(273.056e9)
    integrated = [Launch(0, "k", "k", {**GB10_ATTRS, "device__attribute_integrated": 1.0})]
    roof = attribute_bandwidth(integrated)
    assert roof.value == pytest.approx(273.056e9) and "not the 2 x" in roof.method
    # an unlisted integrated part (no datasheet row): the per-type multiplier still applies
    spec, _ = roofs_spec("NVIDIA Jetson Something", integrated, None)
    assert spec.memory["dram"].value == pytest.approx(273.056e9)


def test_gddr_and_hbm_keep_the_best_practices_formula(fixtures_dir: Path) -> None:
    assert attribute_bandwidth([Launch(0, "k", "k", A10G_ATTRS)]).value == pytest.approx(600.096e9)
    report = import_file(fixtures_dir / "ncu/esmm_a10g_all_metrics.ncu-rep")  # A10G, GDDR6, no peak metrics
    dram = report.device.memory["dram"]
    assert dram.value == pytest.approx(600.096e9) and dram.method.startswith("theoretical: 2 x")


def _gb10_csv(path: Path) -> Path:
    """A minimal `ncu --csv --page raw` export of one attention kernel on GB10, without roofline sections."""
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    metrics = [("gpu__time_duration.sum", "nsecond", "52,384"), ("dram__bytes.sum", "byte", "8,388,608"),
               ("device__attribute_max_mem_frequency_khz", "", "8,533,000"),
               ("device__attribute_global_memory_bus_width", "", "256"),
               ("device__attribute_multiprocessor_count", "", "48")]
    with path.open("w", newline="") as fh:
        out = csv.writer(fh, quoting=csv.QUOTE_ALL)
        out.writerow(head)
        for name, unit, value in metrics:
            out.writerow(["0", "4242", "python3", "127.0.0.1", "flash_fwd_kernel(Flash_fwd_params)", "1", "7",
                          "(128, 1, 1)", "(32, 8, 1)", "NVIDIA GB10", "12.1", "Command line profiler metrics",
                          name, unit, value])
    return path


def test_an_ncu_export_of_gb10_gets_273_gb_s_and_is_told_to_use_set_roofline(tmp_path: Path) -> None:
    report = import_file(_gb10_csv(tmp_path / "attn_gb10.csv"))
    assert report.device.name == "NVIDIA GB10"
    assert report.device.peak_bandwidth("dram") == pytest.approx(273e9)
    findings = run_rules(report)
    text = " ".join(f.title + " " + f.recommendation for f in findings)
    assert "Profile the top kernels with Nsight" not in text and "Nsight Compute (perfscope profile" not in text
    assert "ncu --set roofline" in text


@pytest.mark.parametrize("rel", ["ncu/esmm_a10g_all_metrics.ncu-rep", "ncu/esmm_a10g_sol_partial.ncu-rep"])
def test_an_ncu_report_without_roofline_sections_is_told_to_reprofile_with_set_roofline(fixtures_dir: Path,
                                                                                        rel: str) -> None:
    findings = run_rules(import_file(fixtures_dir / rel))
    advice = [f.recommendation for f in findings]
    assert any("ncu --set roofline" in a and "already is an Nsight Compute report" in a for a in advice)
    assert not any("with Nsight Compute" in a for a in advice)


def test_a_trace_without_counters_still_gets_the_nsight_advice(fixtures_dir: Path) -> None:
    # an nsys export has no counters or shapes: there, profiling with Nsight Compute is the right advice
    rel = next(p for p in (fixtures_dir / "nsys").glob("*.sqlite"))
    advice = " ".join(f.recommendation for f in run_rules(import_file(rel)))
    assert "ncu --set roofline" not in advice
