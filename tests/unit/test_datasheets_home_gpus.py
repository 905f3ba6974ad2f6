"""Datasheet rows of the GPUs people run models on at home and at work (GeForce RTX 30/40/50, RTX
workstation cards, Radeon, Strix Halo, MI210/MI250/MI300A/MI308X): the names traces carry, matching
by properties and by gfx arch, and figures as their sources print them."""

from __future__ import annotations

import pytest

from perfscope.datasheets import (
    DATASHEETS,
    Datasheet,
    device_properties,
    find_datasheet,
    find_datasheet_by_arch,
    gfx_arch_name,
    gfx_compute_capability,
    is_lpddr,
    match_datasheet,
    sheet_spec,
)

GIB = 2**30
NEW_ROWS = ("RTX 3090", "RTX 3080", "RTX 3060", "RTX 4080", "RTX 4070 Ti", "RTX 4060 Ti 16 GB", "RTX 4060 Ti 8 GB",
            "RTX 5080", "RTX 5070 Ti", "RTX 6000 Ada", "RTX A6000", "A40", "MI250 (per GCD)", "MI210", "MI300A",
            "MI308X", "Radeon RX 7900 XTX", "Radeon AI PRO R9700", "Radeon 8060S (Strix Halo, Ryzen AI Max+ 395)")


def _row(model: str) -> Datasheet:
    return next(s for s in DATASHEETS if s.model == model)


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA GeForce RTX 3090", "RTX 3090"), ("NVIDIA GeForce RTX 3080", "RTX 3080"),
    ("NVIDIA GeForce RTX 3060", "RTX 3060"), ("NVIDIA GeForce RTX 4080", "RTX 4080"),
    ("NVIDIA GeForce RTX 4070 Ti", "RTX 4070 Ti"), ("NVIDIA GeForce RTX 4060 Ti", "RTX 4060 Ti 16 GB"),
    ("NVIDIA GeForce RTX 5080", "RTX 5080"), ("NVIDIA GeForce RTX 5070 Ti", "RTX 5070 Ti"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"), ("NVIDIA RTX A6000", "RTX A6000"), ("NVIDIA A40", "A40"),
    ("AMD Instinct MI210", "MI210"), ("AMD Instinct MI250", "MI250 (per GCD)"), ("AMD Instinct MI300A", "MI300A"),
    ("AMD Instinct MI308X", "MI308X"), ("AMD Radeon RX 7900 XTX", "Radeon RX 7900 XTX"),
    ("AMD Radeon AI PRO R9700", "Radeon AI PRO R9700"),
    ("AMD Radeon 8060S Graphics", "Radeon 8060S (Strix Halo, Ryzen AI Max+ 395)"),
    # rows that were there keep their names
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"), ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI250X", "MI250X (per GCD)"),
])
def test_names_traces_carry(name: str, model: str) -> None:
    sheet, how = match_datasheet(name)
    assert sheet is not None and sheet.model == model and how == "name"


@pytest.mark.parametrize("name", [
    "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 3080 Ti", "NVIDIA GeForce RTX 3060 Ti",
    "NVIDIA GeForce RTX 4080 SUPER", "NVIDIA GeForce RTX 4070 Ti SUPER", "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 4060 Ti Laptop GPU", "NVIDIA GeForce RTX 5080 Laptop GPU", "Quadro RTX 6000",
    "AMD Radeon RX 7900 XT", "AMD Instinct MI300", "AMD Radeon Graphics",
])
def test_neighbours_are_not_taken_for_listed_parts(name: str) -> None:
    assert find_datasheet(name) is None


def test_one_name_two_cards_told_apart_by_memory() -> None:
    eight = {"numSms": 34, "totalGlobalMem": int(7.99 * GIB), "computeMajor": 8, "computeMinor": 9}
    sixteen = {**eight, "totalGlobalMem": int(15.6 * GIB)}
    assert find_datasheet("NVIDIA GeForce RTX 4060 Ti", eight).model == "RTX 4060 Ti 8 GB"
    assert find_datasheet("NVIDIA GeForce RTX 4060 Ti", sixteen).model == "RTX 4060 Ti 16 GB"
    assert _row("RTX 4060 Ti 8 GB").tflops == _row("RTX 4060 Ti 16 GB").tflops  # same figures
    assert _row("RTX 4060 Ti 8 GB").bandwidth_gb_s == 288.0


def test_strix_halo_is_matched_by_gfx1151_and_its_cus_whatever_memory_the_bios_gave_it() -> None:
    for carve_out_gib in (16, 64, 96, 110):
        kineto = {"name": "AMD Radeon Graphics", "numSms": 40, "computeMajor": 11, "computeMinor": 5,
                  "totalGlobalMem": carve_out_gib * GIB}
        sheet, how = match_datasheet("AMD Radeon Graphics", kineto)
        assert sheet is not None and sheet.gfx_arch == "gfx1151" and how.startswith("device properties")
    assert find_datasheet("AMD Radeon Graphics", {"gfx_arch": "gfx1151:xnack-", "cu_count": 40}).bandwidth_gb_s == 256
    assert find_datasheet("", {"gfx_arch": "gfx1150", "cu_count": 16}) is None  # Strix Point is another part


def test_gfx_arch_helper_for_rocprof_sources() -> None:
    assert gfx_arch_name("gfx942:sramecc+:xnack-") == "gfx942" and gfx_arch_name("AMD Instinct") is None
    assert [gfx_compute_capability(a) for a in ("gfx942", "gfx90a", "gfx1151", "gfx1201", "gfx950")] == \
        ["9.4", "9.0", "11.5", "12.0", "9.5"]
    assert find_datasheet_by_arch("gfx942", 304, 192).model == "MI300X"
    assert find_datasheet_by_arch("gfx942", 304, 255.98).model == "MI325X"
    assert find_datasheet_by_arch("gfx942", 304) is None  # MI300X or MI325X: memory decides
    assert find_datasheet_by_arch("gfx942", 228).model == "MI300A"
    assert find_datasheet_by_arch("gfx942", 80).model == "MI308X"
    assert find_datasheet_by_arch("gfx1201", 64).model == "Radeon AI PRO R9700"
    assert find_datasheet_by_arch("gfx1100", 96).model == "Radeon RX 7900 XTX"
    assert find_datasheet_by_arch("gfx950", 256).model == "MI355X"
    assert find_datasheet_by_arch("gfx90a", 110).model == "MI250X (per GCD)"
    # the 31amd importer's call: find_datasheet(name, properties) with the arch keys
    props = {"gfx_arch": "gfx942", "cu_count": 304, "memory_gb": 191.98}
    assert find_datasheet("", props).model == "MI300X"
    assert device_properties(props)["compute_capability"] == "9.4" and device_properties(props)["sm_count"] == 304


def test_gfx90a_with_104_cus_is_mi210_or_one_mi250_gcd_and_says_so() -> None:
    # the HTA MI250 trace: "AMD Radeon Graphics", 104 CUs, gfx90a, 64 GiB: an MI250 GCD and an MI210 look alike.
    # Their figures agree (one silicon, clock and memory): the roofs both print are taken, the lowest of each
    props = {"numSms": 104, "computeMajor": 9, "computeMinor": 0, "totalGlobalMem": 68702699520}
    sheet, how = match_datasheet("AMD Radeon Graphics", props)
    assert sheet is not None and sheet.model == "MI250 (per GCD) or MI210"
    assert "2 rows fit (MI250 (per GCD), MI210); their figures agree" in how
    mi250, mi210 = _row("MI250 (per GCD)"), _row("MI210")
    assert sheet.tflops == {p: min(mi250.tflops[p], mi210.tflops[p]) for p in set(mi250.tflops) & set(mi210.tflops)}
    assert "bf16" in mi250.tflops and "bf16" not in sheet.tflops  # the MI210 copy prints none: left out, not guessed
    assert sheet.bandwidth_gb_s == 1638.4 and sheet.boost_clock_mhz == 1700 and sheet.gfx_arch == "gfx90a"
    assert find_datasheet("AMD Instinct MI250X/MI250", props).model == "MI250 (per GCD)"  # the family decides
    assert find_datasheet("AMD Instinct MI210", props).model == "MI210"


def test_rows_that_disagree_are_never_merged() -> None:
    """One row stands for several only when every shared figure agrees within 1%: an MI250X GCD (110 CUs) and an
    MI250 GCD differ in CUs; an H100 PCIe and SXM5 in every figure."""
    from perfscope.datasheets import agreeing_rows

    assert agreeing_rows([_row("MI250 (per GCD)"), _row("MI210")]) is not None
    assert agreeing_rows([_row("MI250X (per GCD)"), _row("MI250 (per GCD)")]) is None
    assert agreeing_rows([_row("H100 SXM5 80 GB"), _row("H100 PCIe 80 GB")]) is None
    mi210 = _row("MI210")
    faster = Datasheet(**{**mi210.__dict__, "model": "MI210 fast", "tflops": {**mi210.tflops, "fp16": 190.0}})
    assert agreeing_rows([mi210, faster]) is None  # 5% apart on one shared figure
    slower_memory = Datasheet(**{**mi210.__dict__, "model": "MI210 slow", "bandwidth_gb_s": 1500.0})
    assert agreeing_rows([mi210, slower_memory]) is None


@pytest.mark.parametrize(("model", "precision", "dense", "sparse"), [
    ("RTX 4080", "int8", 390.0, 780.0),  # NVIDIA compare page: 780 AI TOPS (INT8 with sparsity)
    ("RTX 4070 Ti", "int8", 320.5, 641.0),  # compare page: 641 AI TOPS
    ("RTX 4060 Ti 16 GB", "int8", 176.5, 353.0),  # compare page: 353 AI TOPS
    ("RTX 5080", "fp4", 900.5, 1801.0),  # compare page: 1,801 AI TOPS
    ("RTX 5070 Ti", "fp4", 703.0, 1406.0),  # compare page: 1,406 AI TOPS
    ("RTX 6000 Ada", "fp8", 728.5, 1457.0),  # "Tensor 1,457 TFLOPS" (FP8, with sparsity)
    ("RTX A6000", "fp16", 154.8, 309.7),  # datasheet copies: 154.8 dense, 309.7 with sparsity
    ("A40", "bf16", 149.7, 299.4),
    ("Radeon AI PRO R9700", "fp16", 191.0, 383.0),  # AMD: FP16 matrix 191 | 383 with structured sparsity
    ("Radeon AI PRO R9700", "int4", 766.0, 1531.0),  # AMD: INT4 766 | 1,531
])
def test_dense_and_sparse_as_printed(model: str, precision: str, dense: float, sparse: float) -> None:
    sheet = _row(model)
    assert sheet.tflops[precision] == pytest.approx(dense, rel=1e-3)
    assert sheet.sparse_tflops[precision] == pytest.approx(sparse)


@pytest.mark.parametrize(("model", "precision", "dense"), [
    ("RTX 3090", "fp16", 71.0),  # GA102 whitepaper, Appendix A (as quoted): FP16 with FP32 accumulate
    ("Radeon RX 7900 XTX", "fp16", 123.0),  # AMD product page: Peak Half Precision 123 TFLOPs
    ("MI210", "fp16", 181.0), ("MI210", "fp64_tensor", 45.3),  # AMD MI200 specifications
    ("MI250 (per GCD)", "fp16", 362.1 / 2), ("MI250 (per GCD)", "bf16", 362.1 / 2),  # ROCm MI250 page, per OAM
    ("MI300A", "fp64_tensor", 122.6), ("MI300A", "fp64", 61.3), ("MI300A", "bf16", 980.6),
    ("RTX 3090", "bf16", 71.0),
])
def test_dense_figures_without_a_printed_sparse_one(model: str, precision: str, dense: float) -> None:
    sheet = _row(model)
    assert sheet.tflops[precision] == pytest.approx(dense) and precision not in sheet.sparse_tflops


@pytest.mark.parametrize(("model", "precision"), [
    # printed in no document found, or a derivation: missing, never guessed
    ("RTX 3090", "tf32"), ("RTX 3090", "int8"), ("RTX 3080", "fp16"), ("RTX 4080", "bf16"),
    ("RTX 4070 Ti", "bf16"), ("RTX 4060 Ti 16 GB", "bf16"), ("RTX 4060 Ti 8 GB", "fp16"),
    ("RTX 5080", "fp32"), ("RTX 5070 Ti", "fp32"), ("RTX 6000 Ada", "bf16"), ("RTX A6000", "int8"),
    ("MI210", "bf16"), ("MI300A", "tf32"), ("MI300A", "fp8"),
    ("Radeon RX 7900 XTX", "bf16"), ("Radeon AI PRO R9700", "bf16"),
])
def test_unconfirmed_figures_are_missing(model: str, precision: str) -> None:
    sheet = _row(model)
    assert precision not in sheet.tflops and precision not in sheet.sparse_tflops
    assert sheet_spec(sheet).compute.get(precision) is None  # no roof: its kernels stay unknown


@pytest.mark.parametrize(("model", "gb_s", "fp32"), [
    ("RTX 3090", 936.0, 35.6), ("RTX 3080", 760.0, 29.8), ("RTX 3060", 360.0, 12.7), ("RTX 4080", 716.8, 48.7),
    ("RTX 4070 Ti", 504.0, 40.1), ("RTX 4060 Ti 8 GB", 288.0, 22.1), ("RTX 5080", 960.0, None),
    ("RTX 5070 Ti", 896.0, None), ("RTX 6000 Ada", 960.0, 91.1), ("RTX A6000", 768.0, 38.7), ("A40", 696.0, 37.4),
    ("MI210", 1638.4, 22.6), ("MI250 (per GCD)", 1638.4, 22.65), ("MI300A", 5300.0, 122.6), ("MI308X", 5324.8, None),
    ("Radeon RX 7900 XTX", 960.0, 61.0), ("Radeon AI PRO R9700", 640.0, 47.8),
    ("Radeon 8060S (Strix Halo, Ryzen AI Max+ 395)", 256.0, None),  # LPDDR5X-8000 x 256 bits / 8
])
def test_bandwidth_and_fp32(model: str, gb_s: float | None, fp32: float | None) -> None:
    sheet = _row(model)
    assert sheet.bandwidth_gb_s == (pytest.approx(gb_s) if gb_s is not None else None)
    assert sheet.tflops.get("fp32") == (pytest.approx(fp32) if fp32 is not None else None)


@pytest.mark.parametrize("model", NEW_ROWS)
def test_every_new_row_is_complete_and_sourced(model: str) -> None:
    sheet = _row(model)
    assert sheet.sm_count and sheet.compute_capability and sheet.vendor in ("nvidia", "amd")
    assert sheet.source and sheet.status.startswith(("[D]", "[P]")) and "confirmed" in sheet.status.lower()
    # a property no document found prints is absent, and the status says it was removed
    assert (sheet.memory_gb and sheet.memory_type) or "removed" in sheet.status.lower()
    if sheet.vendor == "amd":
        assert sheet.gfx_arch and gfx_compute_capability(sheet.gfx_arch) == sheet.compute_capability
    # a row's own name finds it (the name a user types for --roofs works too)
    assert find_datasheet(sheet.model) is not None


def test_lpddr_parts_are_marked() -> None:
    assert is_lpddr(_row("GB10 (DGX Spark)")) and is_lpddr(_row("Radeon 8060S (Strix Halo, Ryzen AI Max+ 395)"))
    assert not is_lpddr(_row("MI300A")) and not is_lpddr(_row("RTX 4090")) and not is_lpddr(None)
