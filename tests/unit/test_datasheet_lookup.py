"""One datasheet lookup with one property vocabulary, whatever reader or collector asks."""

from __future__ import annotations

import pytest

from perfscope.datasheets import device_properties, find_datasheet, gpu_spec
from perfscope.device import Roof


def test_source_roofs_come_first_and_the_datasheet_fills_the_rest() -> None:
    measured = Roof(500e12, "measured", "torch.mm bf16")
    spec = gpu_spec("NVIDIA H100 80GB HBM3", compute={"bf16": measured})
    assert spec.compute["bf16"] is measured
    assert spec.compute["fp8"].provenance == "datasheet" and spec.compute["fp8"].value == pytest.approx(1978.9e12)
    assert spec.memory["dram"].value == 3350e9 and spec.properties["datasheet"] == "H100 SXM5 80 GB"


def test_fallback_memory_only_when_no_datasheet_lists_the_gpu() -> None:
    theoretical = {"dram": Roof(1e12, "report", "driver")}
    listed = gpu_spec("NVIDIA H200", fallback_memory=theoretical)
    assert listed.memory["dram"].provenance == "datasheet"
    unlisted = gpu_spec("Some Future GPU", fallback_memory=theoretical)
    assert unlisted.memory["dram"].provenance == "report" and not unlisted.compute
    assert "datasheet" not in unlisted.properties and find_datasheet("Some Future GPU") is None


def test_every_source_spelling_maps_to_one_vocabulary() -> None:
    kineto = {"numSms": 132, "totalGlobalMem": 85e9, "computeMajor": 9, "computeMinor": 0}
    nsys = {"smCount": 132, "totalMemory": 85e9, "l2CacheSize": 52428800}
    torch_props = {"sm_count": 132, "total_memory_bytes": 85e9, "compute_capability": "9.0"}
    for raw in (kineto, nsys, torch_props):
        props = device_properties(raw)
        assert props["sm_count"] == 132 and props["memory_bytes"] == 85e9
    assert device_properties(kineto)["compute_capability"] == "9.0"
    assert gpu_spec("NVIDIA H100 80GB HBM3", properties=kineto).properties["sm_count"] == 132
