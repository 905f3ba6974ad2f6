"""Compute roofs derived from an AMD architecture's per-CU per-clock rates (perfscope.datasheets.ARCH_RATES)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.datasheets import ARCH_RATES, DATASHEETS, arch_roofs, gpu_spec, lookup_datasheet
from perfscope.device import PROVENANCES


def test_every_rate_is_its_reference_rows_figure_over_cus_and_clock() -> None:
    for arch, table in ARCH_RATES.items():
        ref = lookup_datasheet(table.reference)
        assert ref.gfx_arch == arch
        cycles = ref.sm_count * ref.boost_clock_mhz * 1e6
        assert set(table.rates) == set(ref.tflops), arch  # every figure the row prints, and no other
        for precision, rate in table.rates.items():
            exact = ref.tflops[precision] * 1e12 / cycles
            # the row's rounding only: figures are printed to three or four significant digits
            # (RX 7900 XTX: AMD prints 61 TFLOPS FP32, 256 x 96 CU x 2500 MHz = 61.44)
            assert abs(exact - rate) / rate < 1e-2, (arch, precision, exact)


def test_mi308x_workload_gets_derived_roofs(fixtures_dir: Path) -> None:
    spec = import_file(fixtures_dir / "rocprof" / "aiter_fmla_MI308X_rocprof_compute").device
    cycles = 80 * 1420e6  # sysinfo.csv: cu_per_gpu 80, max_sclk 1420
    want = {"fp16": 2048 * cycles, "bf16": 2048 * cycles, "fp32": 256 * cycles, "fp64": 128 * cycles,
            "fp64_tensor": 256 * cycles, "fp8": 4096 * cycles}
    assert want["fp16"] == pytest.approx(232.6528e12)
    for precision, value in want.items():
        roof = spec.compute[precision]
        assert roof.provenance == "derived"
        assert roof.value == pytest.approx(value, rel=1e-12)
    assert spec.compute["fp16"].method.startswith(
        "gfx942: 2048 FLOP/CU/clk (MI300X 1307.4 TFLOP/s / 304 CU / 2100 MHz) x 80 CU x 1420 MHz")
    assert spec.compute["fp16"].dense is True and spec.compute["fp32"].dense is None
    # memory is never derived from the arch: the MI308X row's eight HBM3 stacks at the per-stack rate
    assert spec.memory["dram"].value == 8 * 665.6e9 and spec.memory["dram"].provenance == "datasheet"


def test_mi300x_by_properties_alone_derives_the_mi300x_row() -> None:
    # gfx942 with 304 CUs is MI300X or MI325X: without memory size no row is taken, the roofs are derived
    spec = gpu_spec("", kind="rocm", properties={"gfx_arch": "gfx942", "cu_count": 304, "max_clock_hz": 2100e6})
    assert "datasheet" not in spec.properties
    row = lookup_datasheet("MI300X")
    assert set(spec.compute) == set(row.tflops)
    for precision, tflops in row.tflops.items():
        assert spec.compute[precision].provenance == "derived"
        assert round(spec.compute[precision].value / 1e12, 1) == tflops  # as the datasheet prints it


@pytest.mark.parametrize(("model", "per"), [("MI210", 1), ("MI250 (per GCD)", 2)])  # rows that print a clock
def test_rows_not_used_as_references_agree_with_their_arch(model: str, per: int) -> None:
    """Rows whose figures were not used to make the rates: derived from their CUs and clock, each
    figure is the datasheet's (MI250 per GCD: the OAM figure, two GCDs, as printed)."""
    row = lookup_datasheet(model)
    derived = arch_roofs(row.gfx_arch, row.sm_count, row.boost_clock_mhz * 1e6)
    for precision, tflops in row.tflops.items():
        assert round(derived[precision].value * per / 1e12, 1) == round(tflops * per, 1), precision


def test_datasheet_figure_wins_over_derived() -> None:
    # an R9700 by name at a lower clock: every figure is the row's, none derived
    spec = gpu_spec("AMD Radeon AI PRO R9700", kind="rocm",
                    properties={"gfx_arch": "gfx1201", "cu_count": 64, "max_clock_hz": 2000e6})
    assert {r.provenance for r in spec.compute.values()} == {"datasheet"}
    assert spec.compute["fp16"].value == 191e12  # as AMD prints it


def test_row_gaps_are_filled_and_unknowns_stay_missing() -> None:
    # RX 7900 XTX prints fp32/fp16; gfx1100 has no other rate, so nothing else appears
    spec = gpu_spec("Radeon RX 7900 XTX", kind="rocm",
                    properties={"gfx_arch": "gfx1100", "cu_count": 96, "max_clock_hz": 2500e6})
    assert set(spec.compute) == {"fp32", "fp16"}
    # no rate table for gfx1151 (AMD prints no GPU TFLOPS for it), none for an unknown clock
    assert arch_roofs("gfx1151", 40, 2900e6) == {}
    assert arch_roofs("gfx942", 80, None) == {}
    assert arch_roofs("gfx942", 80, 1420e3) == {}  # a clock in kHz read as Hz is not derived from
    assert arch_roofs("gfx942:sramecc+:xnack-", 80, 1420e6)["fp16"].value == 2048 * 80 * 1420e6


def test_derived_is_a_provenance_and_no_nvidia_row_is_touched() -> None:
    assert "derived" in PROVENANCES
    assert not any(s.vendor == "nvidia" for s in DATASHEETS if s.gfx_arch in ARCH_RATES)
    spec = gpu_spec("NVIDIA H100 80GB HBM3", properties={"numSms": 132, "computeMajor": 9, "computeMinor": 0})
    assert {r.provenance for r in spec.compute.values()} == {"datasheet"}


def test_rocprofv3_agent_of_an_unlisted_part_gets_derived_roofs_and_says_so() -> None:
    from perfscope.analysis.readers.rocprof.device import agent_spec

    warnings: list[str] = []
    # one XCD of a gfx942 part in CPX mode: 38 CUs, a CU count no row lists
    agent = {"name": "gfx942", "cu_count": 38, "max_engine_clk_fcompute": 2100}
    spec = agent_spec(agent, warnings)
    assert spec is not None and "datasheet" not in spec.properties
    assert spec.compute["bf16"].value == 38 * 2100e6 * 2048 and spec.compute["bf16"].provenance == "derived"
    assert "dram" not in spec.memory  # bandwidth is never derived
    assert any("derived from the architecture" in w for w in warnings)
