"""Datasheet fallback roofs (perfscope.datasheets), keyed on driver device names."""

from __future__ import annotations

import pytest

from perfscope.datasheets import DATASHEETS, datasheet_spec, find_datasheet


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM5 80 GB"),
    ("NVIDIA H100 PCIe", "H100 PCIe 80 GB"),
    ("NVIDIA H200", "H200 SXM 141 GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80 GB SXM4"),
    ("NVIDIA A100 80GB PCIe", "A100 80 GB PCIe"),
    ("NVIDIA A100-PCIE-40GB", "A100 40 GB"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("Tesla V100-DGXS-32GB", "V100 SXM2"),  # the DGX Station's NVLink V100 (kineto_resnet50_v100_2021)
    ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("Tesla T4", "T4"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA B200", "B200 (HGX, per GPU)"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA H100 NVL", "H100 NVL 94 GB"),
    ("NVIDIA H200 NVL", "H200 NVL 141 GB"),
    ("AMD Instinct MI300X", "MI300X"),
])
def test_driver_names_find_their_row(name: str, model: str) -> None:
    sheet = find_datasheet(name)
    assert sheet is not None and sheet.model == model


@pytest.mark.parametrize("name", ["NVIDIA L40", "NVIDIA GeForce RTX 4090 D", "AMD Instinct MI300", "Tesla V100S-PCIE-32GB",
                                  "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "", None])
def test_unlisted_or_different_parts_are_not_guessed(name: str | None) -> None:
    assert find_datasheet(name) is None and datasheet_spec(name) is None


def test_h100_spec_values_provenance_and_ridge() -> None:
    spec = datasheet_spec("NVIDIA H100 80GB HBM3")
    assert spec is not None
    assert spec.compute["bf16"].value == pytest.approx(989.4e12) and spec.compute["bf16"].dense is True  # whitepaper Table 3
    assert spec.compute["fp32"].value == pytest.approx(66.9e12) and spec.compute["fp32"].dense is None
    assert spec.memory["dram"].value == 3350e9
    assert {r.provenance for r in spec.compute.values()} == {"datasheet"}
    assert {r.clock for r in spec.compute.values()} == {"boost"}
    assert spec.ridge("bf16") == pytest.approx(989.4e12 / 3350e9)


def test_every_row_is_sourced_and_dense() -> None:
    for sheet in DATASHEETS:
        assert sheet.status and sheet.source, sheet.model
        assert sheet.bandwidth_gb_s or "removed" in sheet.status, sheet.model  # MI308X: printed nowhere found
        fp32 = sheet.tflops.get("fp32")  # absent only where the vendor prints none (A10G, GB10)
        tensor = [v for p, v in sheet.tflops.items() if p in ("tf32", "bf16", "fp16", "fp8")]
        assert fp32 is None or all(v >= fp32 * 0.9 for v in tensor), sheet.model  # dense TC >= FP32
