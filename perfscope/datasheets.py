"""Datasheet peak numbers for common NVIDIA GPUs, keyed on the device name string.

A fallback only: measured peaks (a micro-benchmark) or an Nsight Compute report's own
``peak_sustained x clock`` come first. Every roof made here carries provenance
``datasheet``, the boost clock, and whether a tensor-core figure is dense (all of them are:
Hopper and later datasheets print with-sparsity numbers, which are halved here).
Source: ``docs/FORMATS.md`` section 7, with its verification status per row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .device import DeviceSpec, Roof

TERA = 1e12
GIGA = 1e9
TENSOR_PRECISIONS = ("tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class Datasheet:
    """One GPU's datasheet row.

    Attributes:
        model: the row's name (``H100 SXM5 80 GB``).
        pattern: regular expression matched against the upper-cased device name.
        tflops: dense peak TFLOP/s per precision (fp64 and fp32 are the non-tensor figures).
        bandwidth_gb_s: DRAM bandwidth, GB/s (10^9 bytes/s).
        status: verification status and source, as FORMATS.md section 7 gives it.
    """

    model: str
    pattern: str
    tflops: dict[str, float] = field(default_factory=dict)
    bandwidth_gb_s: float | None = None
    status: str = ""


_H100_SXM = {"fp64": 34.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}
_A100 = {"fp64": 9.7, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}
_A100_STATUS = "[V] A100 datasheet via G. Lockwood and PC2 wiki"

DATASHEETS: tuple[Datasheet, ...] = (
    Datasheet("H200 SXM 141 GB", r"\bH200\b(?!.*\bNVL\b)", _H100_SXM, 4800.0,
              "[P] third-party summaries; compute as H100 SXM"),
    Datasheet("H100 PCIe 80 GB", r"\bH100\b.*\bPCIE\b",
              {"fp64": 26.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
              2000.0, "[P] NVIDIA H100 datasheet table reproduced by HPC Tech"),
    Datasheet("H100 SXM5 80 GB", r"\bH100\b.*(\bSXM|\bHBM3\b)", _H100_SXM, 3350.0,
              "[P] NVIDIA H100 datasheet table reproduced by HPC Tech"),
    Datasheet("A100 80 GB PCIe", r"\bA100\b.*(80GB.*PCIE|PCIE.*80GB)", _A100, 1935.0, "[U] bandwidth"),
    Datasheet("A100 80 GB SXM4", r"\bA100\b.*80GB", _A100, 2039.0, "[P] Lockwood 2.039 TB/s"),
    Datasheet("A100 40 GB", r"\bA100\b.*40GB", _A100, 1555.0, _A100_STATUS),
    Datasheet("V100 SXM2", r"\bV100\b.*\bSXM", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 900.0,
              "[V] compute (developer.nvidia.com); [P] bandwidth"),
    Datasheet("V100 PCIe", r"\bV100\b.*\bPCIE", {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0}, 900.0, "[U]"),
    Datasheet("L40S", r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0},
              864.0, "[P] reseller copy of the datasheet"),
    Datasheet("L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
              300.0, "[P] FP32/TF32/bandwidth; [U] FP16/FP8"),
    Datasheet("A10", r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}, 600.0,
              "[P] FP32 and bandwidth; [U] tensor"),
    Datasheet("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0}, 320.0, "[P] TechPowerUp-derived pages"),
    Datasheet("RTX 4090", r"\bRTX 4090\b",
              {"fp64": 1.3, "fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}, 1008.0,
              "[P] Ada whitepaper figures; FP16/BF16 with FP32 accumulate; FP8 omitted (sources disagree)"),
    Datasheet("B200 (HGX, per GPU)", r"\bB200\b",
              {"fp64": 37.0, "fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
              7700.0, "[P] sources disagree; the lower, later quotes are used"),
)
"""Rows in match order: the more specific patterns (H100 PCIe, A100 80GB PCIe) come first."""


def find_datasheet(name: str | None) -> Datasheet | None:
    """The datasheet row whose pattern matches the device ``name``, or None."""
    if not name:
        return None
    key = " ".join(name.upper().replace("_", " ").split())
    for sheet in DATASHEETS:
        if re.search(sheet.pattern, key):
            return sheet
    return None


def _roof(sheet: Datasheet, precision: str, tflops: float) -> Roof:
    tensor = precision in TENSOR_PRECISIONS
    return Roof(
        value=tflops * TERA,
        provenance="datasheet",
        method=f"datasheet {sheet.model}: {'dense tensor-core' if tensor else 'non-tensor'} "
        f"figure ({sheet.status})",
        clock="boost",
        dense=True if tensor else None,
    )


def datasheet_spec(name: str | None, *, kind: str = "cuda") -> DeviceSpec | None:
    """A DeviceSpec with datasheet roofs for the GPU called ``name``; None when not listed.

    Args:
        name: the device name as the driver prints it (``NVIDIA H100 80GB HBM3``, ``Tesla T4``).
        kind: DeviceSpec kind.
    """
    sheet = find_datasheet(name)
    if sheet is None:
        return None
    compute = {p: _roof(sheet, p, v) for p, v in sheet.tflops.items()}
    memory = {}
    if sheet.bandwidth_gb_s:
        memory["dram"] = Roof(
            value=sheet.bandwidth_gb_s * GIGA,
            provenance="datasheet",
            method=f"datasheet {sheet.model} memory bandwidth ({sheet.status})",
            clock="boost",
        )
    return DeviceSpec(name=str(name), kind=kind, compute=compute, memory=memory,
                      properties={"datasheet": sheet.model})


PROPERTY_NAMES: dict[str, str] = {
    "numSms": "sm_count", "smCount": "sm_count", "multiprocessor_count": "sm_count", "multi_processor_count": "sm_count",
    "totalGlobalMem": "memory_bytes", "totalMemory": "memory_bytes", "total_memory": "memory_bytes",
    "total_memory_bytes": "memory_bytes", "l2CacheSize": "l2_cache_bytes", "memoryBandwidth":
    "memory_bandwidth_bytes_per_s", "clockRate": "max_clock_hz", "chipName": "chip",
}
"""Each source's spelling of a device property (Kineto ``deviceProperties``, nsys ``TARGET_INFO_GPU``,
torch ``get_device_properties``) -> the one vocabulary of ``DeviceSpec.properties``: ``sm_count``,
``memory_bytes``, ``l2_cache_bytes``, ``memory_bandwidth_bytes_per_s``, ``max_clock_hz``,
``compute_capability``, ``chip``."""


def device_properties(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` device facts renamed to the one vocabulary (:data:`PROPERTY_NAMES`); ``computeMajor``
    and ``computeMinor`` become ``compute_capability`` (``"9.0"``); other keys are kept as they are."""
    out = {PROPERTY_NAMES.get(k, k): v for k, v in raw.items() if k not in ("computeMajor", "computeMinor")}
    if raw.get("computeMajor") is not None:
        out.setdefault("compute_capability", f"{raw['computeMajor']}.{raw.get('computeMinor', 0)}")
    return out


def gpu_spec(name: str, *, kind: str = "cuda", compute: Mapping[str, Roof] | None = None,
             memory: Mapping[str, Roof] | None = None, properties: Mapping[str, Any] | None = None,
             fallback_memory: Mapping[str, Roof] | None = None) -> DeviceSpec:
    """The one datasheet lookup: a GPU's DeviceSpec from what a source knows, filled from the datasheet.

    Roofs come first from the source (``compute``, ``memory``: measured or a report's own peaks),
    then from the datasheet row matching ``name`` for the precisions and memory levels still
    missing, then from ``fallback_memory`` (a driver's theoretical bandwidth). Properties are
    renamed to one vocabulary (:func:`device_properties`); ``datasheet`` names the row used, and
    is absent when the GPU is not listed.
    """
    sheet = datasheet_spec(name, kind=kind)
    roofs_c, roofs_m = dict(compute or {}), dict(memory or {})
    props = device_properties(properties or {})
    if sheet is not None:
        for precision, roof in sheet.compute.items():
            roofs_c.setdefault(precision, roof)
        for level, roof in sheet.memory.items():
            roofs_m.setdefault(level, roof)
        props["datasheet"] = sheet.properties["datasheet"]
    for level, roof in (fallback_memory or {}).items():
        roofs_m.setdefault(level, roof)
    return DeviceSpec(name=str(name), kind=kind, compute=roofs_c, memory=roofs_m, properties=props)
