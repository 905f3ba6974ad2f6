"""Datasheet peak numbers for the GPUs that run LLMs, keyed on the device name string.

A fallback only: measured peaks (a micro-benchmark) or an Nsight Compute report's own
``peak_sustained x clock`` come first. Every roof made here carries provenance ``datasheet``,
the row's source document, the boost clock, and whether a tensor figure is dense (all roofs are:
NVIDIA datasheets since Hopper print with-sparsity tensor figures, which are halved here; the
with-sparsity figure stays in :attr:`Datasheet.sparse_tflops` for the table).

Rows are per device as a trace sees it: per GPU for HGX/NVL boards (B200, GB200, B300 are per
Blackwell GPU), per GCD for MI250X (one OAM package is two devices). A figure the source does
not print, or that could not be checked, is absent rather than guessed; a precision without a
figure has no roof, and its kernels stay ``unknown``. The sources are listed in docs/roofs.md.

A row is found by the device's name (:func:`find_datasheet`), or, when the name is empty or names
no listed model exactly, by the device's properties (compute capability / gcnArch, SM or CU
count, memory size: :func:`match_datasheet`); ``perfscope import --roofs NAME`` picks a row by
name (:func:`lookup_datasheet`).

An AMD device a source describes by its gfx arch, CU count and clock (rocprof-compute ``sysinfo.csv``,
rocprofv3 agent info) gets, for each precision its row does not give (or when no row matches), a
roof derived from the architecture: CUs x clock x FLOPs per CU per clock (:data:`ARCH_RATES`,
:func:`arch_roofs`), provenance ``derived``. A datasheet figure always wins over a derived one.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .device import DeviceSpec, Roof
from .errors import UsageError
from .vocab import speak

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

TERA = 1e12
GIGA = 1e9
GIB = 2**30
PRECISIONS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4")
"""Every precision a row may list, widest first. ``fp64`` and ``fp32`` are the non-tensor (vector)
figures; ``fp64_tensor`` is FP64 on tensor cores / matrix cores."""
TENSOR_PRECISIONS = ("fp64_tensor", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4")
UNNAMED = " (unnamed in the trace, by its properties)"
"""Appended to a row's model to name a device whose trace gave no name."""
MEMORY_SLACK = 0.95
"""A device's memory (GiB, as the driver reports it) matches a row's marketed GB when it lies in
[``MEMORY_SLACK`` x GB, GB]: drivers report a little less than the marketed size (H100 80 GB:
79.2 GiB; MI300X 192 GB: 192.0 GiB; B200 180 GB: 178.4 GiB)."""


@dataclass(frozen=True)
class Datasheet:
    """One device's datasheet row.

    Attributes:
        model: the row's name (``H100 SXM5 80 GB``).
        pattern: regular expression matched against the upper-cased device name.
        tflops: dense peak TFLOP/s (TOPS for int8/int4) per precision of :data:`PRECISIONS`.
        bandwidth_gb_s: DRAM bandwidth, GB/s (10^9 bytes/s).
        status: how far the figures are checked (``[D]``: as the source document prints them;
            ``[P]``: a reproduction or a derivation, said how), and any caveat.
        sparse_tflops: the with-sparsity (2:4) figures the source prints, per precision.
        source: the vendor document the figures come from.
        boost_clock_mhz: the boost (peak engine) clock the figures assume; None when unpublished.
        memory_gb: the memory size as marketed (GB); used to match by properties.
        sm_count: SMs (NVIDIA) or CUs (AMD) of the device; used to match by properties.
        compute_capability: ``major.minor`` as Kineto's ``computeMajor``/``computeMinor`` give it
            (NVIDIA compute capability; AMD gcnArch: gfx942 is ``9.4``, gfx90a ``9.0``).
        vendor: ``nvidia`` or ``amd``.
        gfx_arch: AMD's LLVM target (``gfx942``, ``gfx90a``, ``gfx1201``) as rocprof and
            ``rocminfo`` print it; matched by :func:`find_datasheet_by_arch`.
        memory_type: the DRAM technology (``HBM3``, ``GDDR6X``, ``LPDDR5X``); an ``LPDDR`` part's
            bandwidth is never Nsight Compute's ``2 x clock x bus width`` (:func:`is_lpddr`).
        unified: the GPU shares one memory with the CPU (GB10, MI300A, Strix Halo): the memory
            size a driver reports is a carve-out or the whole system's, so it is not matched.
    """

    model: str
    pattern: str
    tflops: dict[str, float] = field(default_factory=dict)
    bandwidth_gb_s: float | None = None
    status: str = ""
    sparse_tflops: dict[str, float] = field(default_factory=dict)
    source: str = ""
    boost_clock_mhz: float | None = None
    memory_gb: float | None = None
    sm_count: int | None = None
    compute_capability: str | None = None
    vendor: str = "nvidia"
    gfx_arch: str | None = None
    memory_type: str | None = None
    unified: bool = False

    @property
    def family(self) -> str:
        """The model's first word with a digit (``H100``, ``MI300X``, ``4090`` of ``RTX 4090``, ``R9700`` of
        ``Radeon AI PRO R9700``): a name that holds it is of this family."""
        words = self.model.upper().split()
        return next((w for w in words if any(c.isdigit() for c in w)), words[0])

    def to_dict(self) -> dict[str, Any]:
        """The row as plain values (the ``devices --datasheet --json`` record)."""
        return {"model": self.model, "vendor": self.vendor, "dense_tflops": dict(self.tflops),
                "sparse_tflops": dict(self.sparse_tflops), "bandwidth_gb_s": self.bandwidth_gb_s,
                "boost_clock_mhz": self.boost_clock_mhz, "memory_gb": self.memory_gb,
                "sm_count": self.sm_count, "compute_capability": self.compute_capability,
                "gfx_arch": self.gfx_arch, "memory_type": self.memory_type, "unified": self.unified,
                "source": self.source, "status": self.status}


def _sparse(sparse: Mapping[str, float]) -> dict[str, float]:
    """Dense figures from with-sparsity ones: half each."""
    return {p: v / 2 for p, v in sparse.items()}


def _per(n: int, totals: Mapping[str, float]) -> dict[str, float]:
    """Per-device figures from a board's or a rack's totals."""
    return {p: v / n for p, v in totals.items()}


# ---------------------------------------------------------------------------- NVIDIA
_H100_SXM_SPARSE = {"tf32": 989.4, "bf16": 1978.9, "fp16": 1978.9, "fp8": 3957.8, "int8": 3957.8}
_H100_SXM = {"fp64": 33.5, "fp64_tensor": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4,
             "fp8": 1978.9, "int8": 1978.9}
_H100_PCIE_SPARSE = {"tf32": 756.0, "bf16": 1513.0, "fp16": 1513.0, "fp8": 3026.0, "int8": 3026.0}
_NVL_SPARSE = {"tf32": 835.0, "bf16": 1671.0, "fp16": 1671.0, "fp8": 3341.0, "int8": 3341.0}
_NVL = {"fp64": 30.0, "fp64_tensor": 60.0, "fp32": 60.0, **_sparse(_NVL_SPARSE)}
_H200_SPARSE = {"tf32": 989.0, "bf16": 1979.0, "fp16": 1979.0, "fp8": 3958.0, "int8": 3958.0}
_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (2023, SXM / PCIe / NVL columns)"
_H200_DS = "NVIDIA H200 Tensor Core GPU datasheet (2024, H200 SXM / H200 NVL columns)"
_A100 = {"fp64": 9.7, "fp64_tensor": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0,
         "int8": 624.0}
_A100_SPARSE = {"tf32": 312.0, "bf16": 624.0, "fp16": 624.0, "int8": 1248.0}
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (2021, 40GB and 80GB, SXM4 and PCIe columns)"
_A100_STATUS = "[D] dense figures as printed, with-sparsity marked *"
_B200_SPARSE = _per(8, {"tf32": 17_600.0, "bf16": 36_000.0, "fp16": 36_000.0, "fp8": 72_000.0,
                        "fp6": 72_000.0, "int8": 72_000.0, "fp4": 144_000.0})
_GB200_SPARSE = _per(72, {"tf32": 180_000.0, "bf16": 360_000.0, "fp16": 360_000.0, "fp8": 720_000.0,
                          "fp6": 720_000.0, "int8": 720_000.0, "fp4": 1_440_000.0})
_B300_SPARSE = _per(8, {"tf32": 18_000.0, "bf16": 36_000.0, "fp16": 36_000.0, "fp8": 72_000.0,
                        "fp6": 72_000.0, "fp4": 144_000.0})
_L40S_SPARSE = {"tf32": 366.0, "bf16": 733.0, "fp16": 733.0, "fp8": 1466.0, "int8": 1466.0, "int4": 1466.0}
_L4_SPARSE = {"tf32": 120.0, "bf16": 242.0, "fp16": 242.0, "fp8": 485.0, "int8": 485.0}
_A10_SPARSE = {"tf32": 125.0, "bf16": 250.0, "fp16": 250.0, "int8": 500.0, "int4": 1000.0}
_ADA_WP = "NVIDIA Ada Lovelace GPU Architecture whitepaper (v2.1), GeForce RTX 4090 column"
_ADA_WP_V = "NVIDIA Ada Lovelace GPU Architecture whitepaper (v2.1)"
_GA102_WP = "NVIDIA Ampere GA102 GPU Architecture whitepaper (V2.0), Appendix A"
_NOT_LAPTOP = r"(?!.*\bLAPTOP\b)"
_NV_COMPARE = ("NVIDIA GeForce graphics-cards compare page (RTX 50 / 40 / 30 series tables), read in a verbatim "
               "public replica")
_RTX4060TI = r"\bRTX 4060 TI\b" + _NOT_LAPTOP
_RTX4060TI_SPARSE = {"int8": 353.0}
_RTX4060TI_DENSE = {"fp32": 22.1, **_sparse(_RTX4060TI_SPARSE)}
_RTX4060TI_STATUS = ("[P] confirmed: 4,352 CUDA cores, \"22 TFLOPS\" shader (22.1 as spec tables print it), \"353 AI "
                     "TOPS\" (INT8 with sparsity, halved), 2.54 GHz boost, 16 / 8 GB GDDR6 on 128 bits and CUDA capability "
                     "8.9 on NVIDIA's compare page; 288 GB/s (18 Gbps) and 34 SMs as the press prints them. Removed: "
                     "FP16/BF16 (a derivation from AI TOPS, printed in no document found); the 8 GB and 16 GB cards print "
                     "the same figures")
_RTX4060TI_SRC = _NV_COMPARE + "; press reviews of the GeForce RTX 4060 Ti (Guru3D, The FPS Review)"
_A40_SPARSE = {"tf32": 149.6, "bf16": 299.4, "fp16": 299.4, "int8": 598.6, "int4": 1197.4}
_ROCM_SPECS = "AMD ROCm documentation, \"AMD GPU specifications\" (reference/gpu-specs)"

NVIDIA: tuple[Datasheet, ...] = (
    Datasheet("H200 NVL 141 GB", r"\bH200\b.*\bNVL\b", _NVL, 4800.0,
              "[D] with-sparsity figures halved", _NVL_SPARSE, _H200_DS, None, 141, 132, "9.0"),
    Datasheet("H200 SXM 141 GB", r"\bH200\b", {"fp64": 34.0, "fp64_tensor": 67.0, "fp32": 67.0,
                                              **_sparse(_H200_SPARSE)}, 4800.0,
              "[D] with-sparsity figures halved", _H200_SPARSE, _H200_DS, 1980, 141, 132, "9.0"),
    Datasheet("H20 96 GB", r"\bH20\b", {"fp64": 1.0, "fp32": 44.0, "tf32": 74.0, "bf16": 148.0, "fp16": 148.0,
                                        "fp8": 296.0, "int8": 296.0}, 4000.0,
              "[P] NVIDIA publishes no H20 datasheet: dense figures of the spec table reproduced in the press "
              "(Nov 2023); with-sparsity figures omitted", {}, "H20 spec table as reproduced in the press",
              None, 96, None, "9.0"),
    Datasheet("H100 NVL 94 GB", r"\bH100\b.*\bNVL\b", _NVL, 3900.0,
              "[D] with-sparsity figures halved", _NVL_SPARSE, _H100_DS, None, 94, 132, "9.0"),
    Datasheet("H100 PCIe 80 GB", r"\bH100\b.*\bPCIE\b",
              {"fp64": 26.0, "fp64_tensor": 51.0, "fp32": 51.0, **_sparse(_H100_PCIE_SPARSE)}, 2000.0,
              "[D] with-sparsity figures halved", _H100_PCIE_SPARSE, _H100_DS, 1755, 80, 114, "9.0"),
    Datasheet("H100 SXM5 80 GB", r"\bH100\b.*(\bSXM|\bHBM3\b)", _H100_SXM, 3350.0,
              "[D] compute as the whitepaper's Table 3 prints it (dense / with sparsity); bandwidth from the "
              "datasheet", _H100_SXM_SPARSE,
              "NVIDIA H100 Tensor Core GPU Architecture whitepaper (WP-10792-001), Table 3, H100 SXM5 column; "
              "bandwidth: " + _H100_DS, 1980, 80, 132, "9.0"),
    Datasheet("A100 80 GB PCIe", r"\bA100\b.*(80GB.*PCIE|PCIE.*80GB)", _A100, 1935.0, _A100_STATUS,
              _A100_SPARSE, _A100_DS, 1410, 80, 108, "8.0"),
    Datasheet("A100 80 GB SXM4", r"\bA100\b.*80GB", _A100, 2039.0, _A100_STATUS,
              _A100_SPARSE, _A100_DS, 1410, 80, 108, "8.0"),
    Datasheet("A100 40 GB", r"\bA100\b.*40GB", _A100, 1555.0, _A100_STATUS + "; SXM4 and PCIe print the same",
              _A100_SPARSE, _A100_DS, 1410, 40, 108, "8.0"),
    Datasheet("V100 SXM2", r"\bV100\b.*\b(SXM|DGXS)", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 900.0,
              "[D] compute; [P] bandwidth; a DGX Station's `Tesla V100-DGXS-*` is this part: its four V100s are "
              "NVLink (SXM2) modules, per NVIDIA's DGX Station white paper (WP-V01, section 2)", {},
              "NVIDIA Tesla V100 datasheet (SXM2 column)", 1530, None, 80, "7.0"),
    Datasheet("V100 PCIe", r"\bV100\b.*\bPCIE", {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0}, 900.0,
              "[P] not checked against the datasheet", {}, "NVIDIA Tesla V100 datasheet (PCIe column)", 1380,
              None, 80, "7.0"),
    Datasheet("L40S", r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0,
                                    "int8": 733.0, "int4": 733.0}, 864.0,
              "[P] a reseller copy of the datasheet; the sheet prints dense | with-sparsity", _L40S_SPARSE,
              "NVIDIA L40S GPU datasheet", 2520, 48, 142, "8.9"),
    Datasheet("L4", r"\bL4\b", {"fp32": 30.3, **_sparse(_L4_SPARSE)}, 300.0,
              "[P] a reseller copy of the datasheet; with-sparsity figures halved", _L4_SPARSE,
              "NVIDIA L4 Tensor Core GPU datasheet", 2040, 24, 58, "8.9"),
    Datasheet("A10G", r"\bA10G\b", {}, 600.0,
              "[P] an AWS part (EC2 G5) with no NVIDIA datasheet: 24 GB GDDR6 at 600 GB/s; compute figures are "
              "not published and left missing (measure them: `perfscope devices` on the instance)", {},
              "Amazon EC2 G5 instance documentation", None, 24, None, "8.6"),
    Datasheet("A10", r"\bA10\b", {"fp32": 31.2, **_sparse(_A10_SPARSE)}, 600.0,
              "[P] FP32 and bandwidth; tensor figures: with-sparsity halved", _A10_SPARSE,
              "NVIDIA A10 Tensor Core GPU datasheet", 1695, 24, 72, "8.6"),
    Datasheet("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0, "int8": 130.0, "int4": 260.0}, 320.0,
              "[P] TechPowerUp-derived pages; FP16 is mixed precision (FP32 accumulate)", {},
              "NVIDIA T4 Tensor Core GPU datasheet", 1590, 16, 40, "7.5"),
    Datasheet("RTX 4090", r"\bRTX 4090\b(?! D\b)" + _NOT_LAPTOP,
              {"fp64": 1.3, "fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "int8": 660.6,
               "int4": 1321.2}, 1008.0,
              "[P] whitepaper figures as quoted by waredb/gigagpu; FP16/BF16 with FP32 accumulate (the rate "
              "torch GEMMs run at); FP8 omitted (sources disagree on its FP32-accumulate rate)",
              {"tf32": 165.2, "bf16": 330.4, "fp16": 330.4, "int8": 1321.2, "int4": 2642.4}, _ADA_WP,
              2520, 24, 128, "8.9"),
    Datasheet("RTX 5090", r"\bRTX 5090\b(?! D\b)" + _NOT_LAPTOP, {"fp32": 104.8, "fp4": 1676.0}, 1792.0,
              "[P] FP32, bandwidth and FP4 (\"3,352 AI TOPS\", with sparsity, halved) as NVIDIA's product page "
              "prints them; the whitepaper's FP16/BF16/FP8 rates with FP32 accumulate were not checked and are "
              "left missing", {"fp4": 3352.0},
              "NVIDIA GeForce RTX 5090 product specifications; NVIDIA RTX Blackwell GPU Architecture whitepaper",
              2407, 32, 170, "12.0"),
    Datasheet("RTX PRO 6000 Blackwell", r"\bRTX PRO 6000\b(?!.*\bMAX-Q\b)", {"fp32": 125.0, "fp4": 2000.0}, 1792.0,
              "[P] FP32, bandwidth and FP4 AI TOPS (4,000, with sparsity, halved) of the Workstation/Server "
              "Edition; other tensor rates unpublished there, left missing; the Max-Q edition is not listed",
              {"fp4": 4000.0}, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet", None, 96, 188, "12.0"),
    Datasheet("B200 (HGX, per GPU)", r"\bB200\b",
              {"fp64": 37.0, "fp64_tensor": 37.0, "fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0,
               "fp8": 4500.0, "fp6": 4500.0, "int8": 4500.0, "fp4": 9000.0}, 7700.0,
              "[P] HGX B200 8-GPU totals / 8, with-sparsity halved; sources disagree (launch: 40 FP64, 80 FP32, "
              "8 TB/s, TF32 2.25 PF with sparsity), the lower, later quotes are used", _B200_SPARSE,
              "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx), 8-GPU totals; "
              "NVIDIA DGX B200 datasheet", None, 180, 148, "10.0"),
    Datasheet("B300 (HGX, per GPU)", r"\bB300\b",
              {"fp32": 75.0, **_sparse({k: v for k, v in _B300_SPARSE.items() if k != "fp4"}), "fp4": 13_500.0},
              8000.0,
              "[P] HGX B300 8-GPU totals / 8: FP4 dense 108 PFLOPS (not half of sparse), other tensor figures "
              "with-sparsity halved; FP64 and INT8 (cut on Blackwell Ultra) left missing", _B300_SPARSE,
              "NVIDIA HGX B300 specifications (nvidia.com/en-us/data-center/hgx), 8-GPU totals",
              None, 288, None, "10.3"),
    Datasheet("GB200 (NVL72, per Blackwell GPU)", r"\bGB200\b",
              {"fp64": 40.0, "fp64_tensor": 40.0, "fp32": 80.0, **_sparse(_GB200_SPARSE)}, 8000.0,
              "[P] GB200 NVL72 rack totals / 72 GPUs, with-sparsity halved (a GB200 superchip is two of these)",
              _GB200_SPARSE, "NVIDIA GB200 NVL72 specifications (nvidia.com/en-us/data-center/gb200-nvl72), "
              "72-GPU totals", None, 186, None, "10.0"),
    Datasheet("GB10 (DGX Spark)", r"\bGB10\b", {"fp4": 500.0}, 273.0,
              "[P] NVIDIA prints only FP4 (1 PFLOP with sparsity, halved) and 273 GB/s LPDDR5x; other precisions "
              "are unpublished and left missing (measure them: `perfscope devices` on the machine)", {"fp4": 1000.0},
              "NVIDIA DGX Spark datasheet (GB10 Grace Blackwell Superchip)", None, 128, 48, "12.1",
              memory_type="LPDDR5X", unified=True),
    # GeForce / workstation parts people run models on at home and at work. GeForce tensor figures
    # are FP16/BF16 with FP32 accumulate (the rate torch GEMMs run at), as the RTX 4090 row; a figure
    # no document found prints is absent (docs/roofs.md, "Figures left missing").
    Datasheet("RTX 3090", r"\bRTX 3090\b(?! TI\b)" + _NOT_LAPTOP, {"fp32": 35.6, "bf16": 71.0, "fp16": 71.0},
              936.0,
              "[P] confirmed: FP32 35.6, FP16 tensor with FP32 accumulate 71 (dense), 936 GB/s, 82 SMs and the "
              "1,695 MHz boost as public copies quote the GA102 whitepaper's Appendix A; 10,496 CUDA cores, 24 GB "
              "GDDR6X on 384 bits and CUDA capability 8.6 on NVIDIA's compare page; BF16 with FP32 accumulate 71 as "
              "third-party tables print it. Removed: TF32, INT8, INT4 and every with-sparsity figure (no copy of those "
              "whitepaper lines found)", {},
              _GA102_WP + ", GeForce RTX 3090 (as quoted); " + _NV_COMPARE,
              1695, 24, 82, "8.6", memory_type="GDDR6X"),
    Datasheet("RTX 3080", r"\bRTX 3080\b(?! TI\b)" + _NOT_LAPTOP, {"fp32": 29.8}, 760.0,
              "[P] confirmed: 8,704 CUDA cores, 1.71 GHz boost, 10 GB GDDR6X on 320 bits and CUDA capability 8.6 on "
              "NVIDIA's compare page; FP32 29.8 TFLOPS, 760 GB/s (19 Gbps) and 68 SMs as the press reproduced "
              "NVIDIA's launch specifications. Removed: every tensor figure (the GA102 whitepaper's RTX 3080 column "
              "was not found); the later 12 GB card (70 SMs, 912 GB/s) carries the same name and is not listed", {},
              _NV_COMPARE + "; NVIDIA launch specifications as reported (Fudzilla, IT Creations)",
              1710, 10, 68, "8.6", memory_type="GDDR6X"),
    Datasheet("RTX 3060", r"\bRTX 3060\b(?! TI\b)" + _NOT_LAPTOP, {"fp32": 12.7}, 360.0,
              "[P] confirmed: 3,584 CUDA cores, 1.78 GHz boost, 12 GB GDDR6 on 192 bits and CUDA capability 8.6 on "
              "NVIDIA's compare page; FP32 12.7 TFLOPS and 360 GB/s as press spec tables print them (Guru3D); 28 "
              "SMs; tensor rates are printed nowhere found and left missing; the 8 GB card (128 bits) is not listed",
              {}, _NV_COMPARE + "; Guru3D GeForce RTX 40/30 spec table", 1777, 12, 28, "8.6",
              memory_type="GDDR6"),
    Datasheet("RTX 4080", r"\bRTX 4080\b(?! SUPER\b)" + _NOT_LAPTOP, {"fp32": 48.7, "int8": 390.0}, 716.8,
              "[P] confirmed: 9,728 CUDA cores, 2.51 GHz boost, 16 GB GDDR6X on 256 bits, CUDA capability 8.9 and "
              "\"780 AI TOPS\" (INT8 with sparsity, halved) on NVIDIA's compare page; FP32 48.7 (\"49\" there), "
              "716.8 GB/s (22.4 Gbps x 256 bits) and 76 SMs as spec tables print them. Corrected: INT8 with sparsity "
              "779.8 -> 780 (as printed). Removed: TF32, FP16/BF16 and INT4 (the Ada whitepaper's RTX 4080 column was "
              "not found); FP8 omitted as for the RTX 4090", {"int8": 780.0},
              _NV_COMPARE + "; " + _ADA_WP_V + " (not reached)", 2505, 16, 76, "8.9", memory_type="GDDR6X"),
    Datasheet("RTX 4070 Ti", r"\bRTX 4070 TI\b(?! SUPER\b)" + _NOT_LAPTOP, {"fp32": 40.1, "int8": 320.5}, 504.0,
              "[P] confirmed: 7,680 CUDA cores (60 SMs), \"40 TFLOPS\" shader (40.1 as spec tables print it), \"641 "
              "AI TOPS\" (INT8 with sparsity, halved), 2.61 GHz boost, 12 GB GDDR6X on 192 bits and CUDA capability "
              "8.9 on NVIDIA's compare page; 504 GB/s (21 Gbps) as the press prints it. Corrected: INT8 with sparsity "
              "641.4 -> 641 (as printed). Removed: TF32, FP16/BF16 and INT4 (the Ada whitepaper's \"RTX 4080 12 GB\" "
              "column was not found)", {"int8": 641.0},
              _NV_COMPARE + "; press reviews of the GeForce RTX 4070 Ti", 2610, 12, 60, "8.9", memory_type="GDDR6X"),
    Datasheet("RTX 4060 Ti 16 GB", _RTX4060TI, _RTX4060TI_DENSE, 288.0, _RTX4060TI_STATUS, _RTX4060TI_SPARSE,
              _RTX4060TI_SRC, 2535, 16, 34, "8.9", memory_type="GDDR6"),
    Datasheet("RTX 4060 Ti 8 GB", _RTX4060TI, _RTX4060TI_DENSE, 288.0, _RTX4060TI_STATUS, _RTX4060TI_SPARSE,
              _RTX4060TI_SRC, 2535, 8, 34, "8.9", memory_type="GDDR6"),
    Datasheet("RTX 5080", r"\bRTX 5080\b" + _NOT_LAPTOP, {"fp4": 900.5}, 960.0,
              "[P] confirmed: 10,752 CUDA cores, \"1,801 AI TOPS\" (FP4 with sparsity, halved), 2.62 GHz boost, 16 GB "
              "GDDR7 on 256 bits and CUDA capability 12.0 on NVIDIA's compare page; 960 GB/s and 84 SMs as the press "
              "prints them (Notebookcheck). Removed: FP32 56.3 (cores x clock, printed in no document found); other "
              "tensor rates left missing as for the RTX 5090", {"fp4": 1801.0},
              _NV_COMPARE + "; Notebookcheck GeForce RTX 5080 specifications", 2617, 16, 84, "12.0",
              memory_type="GDDR7"),
    Datasheet("RTX 5070 Ti", r"\bRTX 5070 TI\b" + _NOT_LAPTOP, {"fp4": 703.0}, 896.0,
              "[P] confirmed: 8,960 CUDA cores, \"1,406 AI TOPS\" (FP4 with sparsity, halved), 2.45 GHz boost, 16 GB "
              "GDDR7 on 256 bits and CUDA capability 12.0 on NVIDIA's compare page; 896 GB/s as a copy of NVIDIA's "
              "product page prints it; 70 SMs (press). Removed: FP32 43.9 (cores x clock, printed in no document "
              "found); other tensor rates left missing", {"fp4": 1406.0},
              _NV_COMPARE + "; NVIDIA GeForce RTX 5070 Ti product specifications (as copied)", 2452, 16, 70, "12.0",
              memory_type="GDDR7"),
    Datasheet("RTX 6000 Ada", r"\bRTX 6000 ADA\b", {"fp32": 91.1, "fp8": 728.5}, 960.0,
              "[P] confirmed: FP32 91.1 TFLOPS, 142 SMs (18,176 CUDA cores), 48 GB and 960 GB/s on 384 bits as the "
              "press reproduced NVIDIA's product page; \"Tensor 1,457 TFLOPS\" (FP8 with sparsity, halved) as notes "
              "citing NVIDIA's RTX 6000 page print it. Removed: FP16/BF16 (a derivation from the L40S ratio, printed "
              "in no document found) and the boost clock (copies disagree: 2,505 and 2,535 MHz)", {"fp8": 1457.0},
              "NVIDIA RTX 6000 Ada Generation product page and datasheet (as reproduced by grafikkarten.com and "
              "others)", None, 48, 142, "8.9", memory_type="GDDR6"),
    Datasheet("RTX A6000", r"\bRTX A6000\b", {"fp32": 38.7, "bf16": 154.8, "fp16": 154.8}, 768.0,
              "[P] confirmed: FP32 38.7, FP16/BF16 tensor 154.8 dense and 309.7 with sparsity, 10,752 CUDA cores / 84 "
              "SMs, 1,800 MHz boost, 48 GB GDDR6 on 384 bits at 768 GB/s, as PNY's and Microway's copies of the "
              "datasheet print them. Corrected: FP16/BF16 dense 154.85 -> 154.8 (as printed, not half of 309.7). "
              "TF32/INT8/INT4 left missing", {"bf16": 309.7, "fp16": 309.7},
              "NVIDIA RTX A6000 datasheet (as reproduced by PNY and Microway); " + _GA102_WP + ", Appendix C "
              "(not reached)", 1800, 48, 84, "8.6", memory_type="GDDR6"),
    Datasheet("A40", r"\bA40\b", {"fp32": 37.4, **_sparse(_A40_SPARSE)}, 696.0,
              "[P] confirmed: 48 GB GDDR6 (14.5 Gbps, 384 bits) at 696 GB/s and 10,752 CUDA cores / 336 Tensor Cores "
              "as a reseller's copy of NVIDIA's A40 specification prints them; FP32 37.4 and the 1,740 MHz boost as "
              "spec tables print them; the tensor figures (TF32 74.8 | 149.6, BF16/FP16 149.7 | 299.4, INT8 "
              "299.3 | 598.6, INT4 598.7 | 1,197.4) agree within rounding with a third-party table (74.83 | 149.67 "
              "...), with-sparsity halved; NVIDIA's datasheet itself was not reached", _A40_SPARSE,
              "NVIDIA A40 datasheet (as reproduced by resellers); " + _GA102_WP, 1740, 48, 84, "8.6",
              memory_type="GDDR6"),
)

# ---------------------------------------------------------------------------- AMD
_MI300 = {"fp64": 81.7, "fp64_tensor": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
          "fp8": 2614.9, "int8": 2614.9}
_MI300_SPARSE = {"tf32": 1307.4, "bf16": 2614.9, "fp16": 2614.9, "fp8": 5229.8, "int8": 5229.8}
_MI355 = {"fp64": 78.6, "fp64_tensor": 78.6, "fp32": 157.3, "bf16": 2516.6, "fp16": 2516.6, "fp8": 5033.2,
          "int8": 5033.2, "fp6": 10066.3, "fp4": 10066.3}
_MI355_SPARSE = {"bf16": 5033.2, "fp16": 5033.2, "fp8": 10066.3, "int8": 10066.3}
_MI250_OAM = {"fp64": 45.3, "fp64_tensor": 90.5, "fp32": 45.3, "bf16": 362.1, "fp16": 362.1, "int8": 362.1}
_MI210 = {"fp64": 22.6, "fp64_tensor": 45.3, "fp32": 22.6, "fp16": 181.0, "int8": 181.0}
_MI300A = {"fp64": 61.3, "fp64_tensor": 122.6, "fp32": 122.6, "bf16": 980.6, "fp16": 980.6}
_R9700 = {"fp32": 47.8, "fp16": 191.0, "fp8": 383.0, "int8": 383.0, "int4": 766.0}
_R9700_SPARSE = {"fp16": 383.0, "fp8": 766.0, "int8": 766.0, "int4": 1531.0}
_MI250X_OAM = {"fp64": 47.9, "fp64_tensor": 95.7, "fp32": 47.9, "bf16": 383.0, "fp16": 383.0, "int8": 383.0}

AMD: tuple[Datasheet, ...] = (
    Datasheet("MI300X", r"\bMI300X\b", _MI300, 5300.0,
              "[D] peak figures as printed (dense; with-sparsity where printed); FP32 is the vector figure "
              "(matrix is the same)", _MI300_SPARSE,
              "AMD Instinct MI300X accelerator datasheet; AMD CDNA 3 architecture whitepaper", 2100, 192, 304,
              "9.4", "amd", gfx_arch="gfx942", memory_type="HBM3"),
    Datasheet("MI325X", r"\bMI325X\b", _MI300, 6000.0,
              "[D] compute as MI300X (same CDNA 3 die, clock and CU count), 256 GB HBM3E at 6 TB/s",
              _MI300_SPARSE, "AMD Instinct MI325X accelerator datasheet", 2100, 256, 304, "9.4", "amd",
              gfx_arch="gfx942", memory_type="HBM3E"),
    Datasheet("MI355X", r"\bMI355X\b", _MI355, 8000.0,
              "[P] CDNA 4 peaks as AMD prints them (FP16 2.5 PF, FP8 5 PF, MXFP6/MXFP4 10 PF dense); TF32 has "
              "no matrix support on CDNA 4 and is absent", _MI355_SPARSE,
              "AMD Instinct MI355X accelerator datasheet; AMD CDNA 4 architecture whitepaper", 2400, 288, 256,
              "9.5", "amd", gfx_arch="gfx950", memory_type="HBM3E"),
    Datasheet("MI250X (per GCD)", r"\bMI250X\b(?!/MI250\b)", _per(2, _MI250X_OAM), 1638.4,
              "[D] the datasheet's per-OAM figures halved: a trace sees each of the package's two GCDs "
              "(110 CUs, 64 GB, 1.6384 TB/s) as one device; rocm-smi's `MI250X/MI250` is matched by CU count",
              {},
              "AMD Instinct MI250X accelerator datasheet (per OAM module, 2 GCDs)", 1700, 64, 110, "9.0", "amd",
              gfx_arch="gfx90a", memory_type="HBM2e"),
    Datasheet("MI250 (per GCD)", r"(?<!/)\bMI250\b(?!X)", _per(2, _MI250_OAM), 1638.4,
              "[D] confirmed: the OAM's peaks (FP64/FP32 vector 45.3, FP64/FP32 matrix 90.5, FP16/BF16/INT8 matrix "
              "362.1), 104 CUs per GCD, the 1.7 GHz peak clock and 1.6 TB/s per GCD as AMD's ROCm \"MI250 "
              "microarchitecture\" page prints them (1.6384 TB/s = 4,096 bits x 3.2 Gbps, which it rounds), and 208 "
              "CUs / 128 GiB / gfx90a / GFXIP 9.0 in AMD's ROCm GPU specifications; halved here: a trace sees each of "
              "the package's two GCDs (104 CUs, 64 GB) as one device. Per GCD it is an MI210 (same CUs, clock and "
              "memory), so an unnamed gfx90a device with 104 CUs matches both rows, and takes the figures they agree on "
              "(`--roofs` names one)", {},
              "AMD ROCm documentation, \"AMD Instinct MI250 microarchitecture\" (peak-performance table of the MI250 "
              "OAM); " + _ROCM_SPECS, 1700, 64, 104, "9.0", "amd", gfx_arch="gfx90a", memory_type="HBM2e"),
    Datasheet("MI210", r"\bMI210\b", _MI210, 1638.4,
              "[P] confirmed: FP64/FP32 vector 22.6, FP64 matrix 45.3, FP16 matrix and INT8 181, 1,700 MHz, 64 GB "
              "HBM2e at 1.6 TB/s (1.6384 in AMD's datasheet), as AnandTech reproduced AMD's specifications; 104 CUs, "
              "64 GiB, gfx90a and GFXIP 9.0 in AMD's ROCm GPU specifications. Removed: BF16 (not in the copy found)",
              {}, "AMD Instinct MI210 accelerator datasheet, as reproduced by AnandTech; " + _ROCM_SPECS, 1700, 64,
              104, "9.0", "amd", gfx_arch="gfx90a", memory_type="HBM2e"),
    Datasheet("MI300A", r"\bMI300A\b", _MI300A, 5300.0,
              "[P] confirmed: 228 CUs, 128 GiB, gfx942 and GFXIP 9.4 in AMD's ROCm GPU specifications; 128 GB HBM3 "
              "at 5.3 TB/s, shared with the CPU cores, as cited from AMD's MI300A data sheet; FP64 61.3 vector and "
              "122.6 matrix as rocprof-compute prints them; FP32 122.6 (press tables); FP16 and BF16 980.6 dense as "
              "third-party notes print them. Removed: TF32, FP8/INT8, every with-sparsity figure and the boost "
              "clock (no copy of the data sheet's figures found)", {},
              "AMD Instinct MI300A APU data sheet (as cited); " + _ROCM_SPECS + "; rocprof-compute", None, 128, 228,
              "9.4", "amd", gfx_arch="gfx942", memory_type="HBM3", unified=True),
    Datasheet("MI308X", r"\bMI308X\b", {}, 5324.8,
              "[P] AMD publishes no MI308X datasheet and its ROCm GPU specifications do not list it; confirmed: 80 "
              "CUs and gfx942 as users' ROCm logs and rocprof-compute's sysinfo report them; memory: eight HBM3 stacks "
              "(192 GB, as press reports print it) at the per-stack rate rocprof-compute's sysinfo.csv reports "
              "for this device (hbm_bw 665.6 GB/s = max_mclk 1300 MHz x 16 channels x 32 B; MI300X's per-stack "
              "figure is the same 5.3 TB/s / 8), so 8 x 665.6 = 5,324.8 GB/s; compute figures unpublished: "
              "derived from the architecture (gfx942 rates x CUs x clock) where a source gives the clock", {},
              "no AMD document; users' ROCm logs and rocprof-compute 3.0 sysinfo.csv (80 CUs, gfx942, HBM "
              "per-stack rate); press reports (eight stacks, 192 GB)", None, 192, 80, "9.4", "amd",
              gfx_arch="gfx942", memory_type="HBM3"),
    Datasheet("Radeon RX 7900 XTX", r"\bRX 7900 XTX\b", {"fp32": 61.0, "fp16": 123.0}, 960.0,
              "[P] confirmed: 96 CUs, the 2,500 MHz boost, FP16 123 and FP32 61 TFLOPS, 24 GB GDDR6 at 20 Gbps on 384 "
              "bits and 960 GB/s as AMD's product specifications print them (read in a board maker's copy of AMD's "
              "fields); 96 CUs, 24 GiB, gfx1100 and GFXIP 11.0 in AMD's ROCm GPU specifications. Corrected: FP32 "
              "61.4 -> 61, FP16 122.8 -> 123 (as printed). Removed: BF16 (a derivation from the RDNA 3 ISA, printed "
              "in no document found); INT8/INT4 not printed", {},
              "AMD Radeon RX 7900 XTX product specifications (as copied); " + _ROCM_SPECS,
              2500, 24, 96, "11.0", "amd", gfx_arch="gfx1100", memory_type="GDDR6"),
    Datasheet("Radeon AI PRO R9700", r"\bR9700\b", _R9700, 640.0,
              "[P] confirmed: FP32 47.8; FP16 matrix 191 | 383, FP8 and INT8 383 | 766, INT4 766 | 1,531 (dense | "
              "with sparsity) as AMD's R9700 specifications print them (read in verbatim copies of AMD's fields); "
              "the 2,920 MHz boost and 640 GB/s on 256 bits as copies of AMD's specification print them; 64 CUs, 32 "
              "GiB, gfx1201 and GFXIP 12.0 in AMD's ROCm GPU specifications. Corrected: FP16 191.4 -> 191, FP8/INT8 "
              "382.7 -> 383, INT4 765.5 -> 766, with sparsity 382.7 -> 383 and 765.5 -> 766. Removed: BF16 (not "
              "printed)", _R9700_SPARSE,
              "AMD Radeon AI PRO R9700 product specifications (as copied); " + _ROCM_SPECS, 2920, 32, 64,
              "12.0", "amd", gfx_arch="gfx1201", memory_type="GDDR6"),
    Datasheet("Radeon 8060S (Strix Halo, Ryzen AI Max+ 395)",
              r"\bRADEON 8060S\b|\bSTRIX HALO\b|\bRYZEN AI MAX\+? (PRO )?395\b", {}, 256.0,
              "[P] confirmed: 40 CUs, gfx1151 and GFXIP 11.5 in AMD's ROCm GPU specifications (Ryzen AI Max+ 395 / "
              "Radeon 8060S; VRAM \"dynamic + carveout\"); LPDDR5X-8000 on 256 bits (~256 GB/s, shared with the "
              "CPU) and the 2.9 GHz graphics clock as community references print them (AMD's product page was not "
              "reached). Removed: the memory size (128 GB found in no document reached; a unified part is not "
              "matched by memory). AMD prints no GPU TFLOPS for it (only platform TOPS), so compute figures are "
              "missing (measure them: `perfscope devices` on the machine); traces name it `AMD Radeon Graphics`: "
              "matched by gfx1151 and its 40 CUs", {},
              _ROCM_SPECS + "; AMD Ryzen AI Max+ 395 product specifications (not reached)", 2900, None, 40, "11.5",
              "amd", gfx_arch="gfx1151", memory_type="LPDDR5X", unified=True),
)

DATASHEETS: tuple[Datasheet, ...] = NVIDIA + AMD
"""Rows in match order: the more specific patterns (H200 NVL, H100 PCIe, A100 80GB PCIe, A10G) come first."""


# ---------------------------------------------------------------------------- roofs from the architecture
@dataclass(frozen=True)
class ArchRates:
    """An AMD architecture's peak FLOPs (OPs for int) per CU per clock, per precision of :data:`PRECISIONS`.

    Each rate is a reference product's published peak divided by its CUs x boost clock (the
    reference is a row of :data:`DATASHEETS`, so a device of the reference's CU count and clock
    derives the row's figures by construction; tests/unit/test_datasheets_arch.py checks every
    rate against its row). ``fp32`` is the vector figure, as in the rows; a precision the
    reference does not publish is absent.
    """

    arch: str
    family: str
    reference: str
    rates: dict[str, int]


ARCH_RATES: dict[str, ArchRates] = {
    # CDNA 2, MI250X per GCD (the OAM datasheet's figures halved): 110 CU x 1700 MHz = 187.0e12 CU-cycles/s.
    # fp64 23.95 TF / 187.0e12 = 128; fp64 matrix 47.85 -> 256; fp32 vector 23.95 -> 128 (packed FP32 and
    # FP32 matrix run at 256, not a roof here: the row's fp32 is the vector figure); fp16/bf16/int8 191.5 -> 1024.
    "gfx90a": ArchRates("gfx90a", "CDNA 2", "MI250X (per GCD)",
                        {"fp64": 128, "fp64_tensor": 256, "fp32": 128, "bf16": 1024, "fp16": 1024, "int8": 1024}),
    # CDNA 3, MI300X: 304 CU x 2100 MHz = 638.4e12 CU-cycles/s (AMD CDNA 3 whitepaper, MI300X datasheet).
    # fp64 81.7 TF -> 128; fp64 matrix 163.4 -> 256; fp32 163.4 -> 256 (vector = matrix); tf32 653.7 -> 1024;
    # fp16/bf16 1307.4 -> 2048; fp8/int8 2614.9 -> 4096 (dense).
    "gfx942": ArchRates("gfx942", "CDNA 3", "MI300X",
                        {"fp64": 128, "fp64_tensor": 256, "fp32": 256, "tf32": 1024, "bf16": 2048, "fp16": 2048,
                         "fp8": 4096, "int8": 4096}),
    # CDNA 4, MI355X: 256 CU x 2400 MHz = 614.4e12 CU-cycles/s (AMD CDNA 4 whitepaper, MI355X datasheet).
    # fp64 78.6 TF -> 128 (vector = matrix); fp32 157.3 -> 256; fp16/bf16 2516.6 -> 4096; fp8/int8 5033.2
    # -> 8192; MXFP6/MXFP4 10066.3 -> 16384 (dense). No TF32 matrix on CDNA 4.
    "gfx950": ArchRates("gfx950", "CDNA 4", "MI355X",
                        {"fp64": 128, "fp64_tensor": 128, "fp32": 256, "bf16": 4096, "fp16": 4096, "fp8": 8192,
                         "int8": 8192, "fp6": 16384, "fp4": 16384}),
    # RDNA 3, Radeon RX 7900 XTX: 96 CU x 2500 MHz = 240.0e12 CU-cycles/s (AMD product specifications).
    # fp32 61 TF (as AMD prints it, 61.4 unrounded) -> 256 (dual-issue VALU); fp16 WMMA 123 -> 512. BF16, FP64
    # and INT8 are not printed by the reference: absent.
    "gfx1100": ArchRates("gfx1100", "RDNA 3", "Radeon RX 7900 XTX", {"fp32": 256, "fp16": 512}),
    # RDNA 4, Radeon AI PRO R9700: 64 CU x 2920 MHz = 186.88e12 CU-cycles/s (AMD product specifications).
    # fp32 47.8 TF -> 256; fp16 191 (191.4 unrounded) -> 1024; fp8/int8 383 -> 2048; int4 766 -> 4096 (dense);
    # BF16 is not printed by the reference: absent.
    "gfx1201": ArchRates("gfx1201", "RDNA 4", "Radeon AI PRO R9700",
                         {"fp32": 256, "fp16": 1024, "fp8": 2048, "int8": 2048, "int4": 4096}),
    # gfx1151 (RDNA 3.5, Strix Halo): AMD prints no GPU TFLOPS for any product of it: absent, not guessed.
}
"""FLOPs per CU per clock per gfx arch (:class:`ArchRates`): the roofs of a device a source describes by
its arch, CU count and clock when no datasheet row gives a figure (:func:`arch_roofs`)."""
CLOCK_RANGE_HZ = (1e8, 1e10)
"""A device clock outside this range is a unit mistake (kHz, MHz read as Hz), never derived from."""


def _sheet(model: str) -> Datasheet:
    return next(s for s in DATASHEETS if s.model == model)


def arch_roofs(gfx_arch: str | None, cu_count: Any, clock_hz: Any) -> dict[str, Roof]:
    """Compute roofs of an AMD device from its architecture: CUs x clock x FLOPs/CU/clock of
    :data:`ARCH_RATES`, one per precision the arch lists, provenance ``derived``. Empty when the arch
    is not listed or the CU count or clock is unknown or implausible.

    Args:
        gfx_arch: the LLVM target (``gfx942``, ``gfx942:sramecc+:xnack-``).
        cu_count: the device's compute units (rocprof-compute ``cu_per_gpu``, rocprofv3 ``cu_count``).
        clock_hz: its max engine clock in Hz (``max_sclk`` x 1e6, ``max_engine_clk_fcompute`` x 1e6).
    """
    table = ARCH_RATES.get(gfx_arch_name(gfx_arch) or "")
    try:
        cus, hz = int(cu_count), float(clock_hz)
    except (TypeError, ValueError):
        return {}
    if table is None or cus <= 0 or not CLOCK_RANGE_HZ[0] <= hz <= CLOCK_RANGE_HZ[1]:
        return {}
    ref = _sheet(table.reference)
    out = {}
    for precision, rate in table.rates.items():
        if precision not in ref.tflops:  # the reference no longer prints it: nothing to derive from
            continue
        tensor = precision in TENSOR_PRECISIONS
        out[precision] = Roof(
            value=cus * hz * rate, provenance="derived",
            method=f"{table.arch}: {rate} FLOP/CU/clk ({ref.model} {ref.tflops[precision]:g} TFLOP/s / "
            f"{ref.sm_count} CU / {ref.boost_clock_mhz:g} MHz) x {cus} CU x {hz / 1e6:g} MHz ({table.family} "
            f"{'dense matrix-core' if tensor else 'vector'} rate; source: {ref.source})",
            clock=f"max engine {hz / 1e6:g} MHz", dense=True if tensor else None)
    return out


def _key(name: str) -> str:
    return " ".join(name.upper().replace("_", " ").split())


def find_datasheet(name: str | None, properties: Mapping[str, Any] | None = None) -> Datasheet | None:
    """The datasheet row of the device called ``name`` (else by its ``properties``), or None.

    ``properties`` may be in any spelling :func:`device_properties` reads: Kineto's ``numSms``,
    ``totalGlobalMem``, ``computeMajor``/``computeMinor``; nsys' ``smCount``/``totalMemory``; or, for
    AMD sources that know the arch (rocprof), ``gfx_arch`` (``gfx942``), ``cu_count`` and
    ``memory_gb``. See :func:`match_datasheet`."""
    return match_datasheet(name, properties)[0]


def match_datasheet(name: str | None, properties: Mapping[str, Any] | None = None) -> tuple[Datasheet | None, str]:
    """The row for a device and how it was found (``name`` or ``device properties (...)``).

    By name first: the first row whose pattern matches the upper-cased ``name``; when several do
    (one name, two cards: RTX 4060 Ti 8 GB / 16 GB), the first whose memory the device reports.
    When none does and ``properties`` are given (any spelling :func:`device_properties` reads), the
    row whose compute capability (or gfx arch, when the source gives it), SM/CU count and memory
    size all match, if exactly one does; memory is not compared when unknown, nor for a
    unified-memory row (its driver reports a carve-out). A name that holds a listed family
    (``NVIDIA A100-PG509-200``) is matched only within that family.

    Returns:
        (row, how), or (None, why not) when no row, or more than one, matches.
    """
    key = _key(name or "")
    props = device_properties(properties or {})
    mem = props.get("memory_bytes")
    if key:
        named = [sheet for sheet in DATASHEETS if re.search(sheet.pattern, key)]
        if named:
            # one name, several cards (RTX 4060 Ti 8 GB / 16 GB): the memory size tells them apart
            sized = [s for s in named if mem is not None and _same_memory(s, float(mem))]
            return (sized or named)[0], "name"
    cc, sms, arch = props.get("compute_capability"), props.get("sm_count"), props.get("gfx_arch")
    if (cc is None and arch is None) or sms is None:
        return None, "name not listed" if key else "no name"
    words = set(re.split(r"[^A-Z0-9]+", key))
    rows = [s for s in DATASHEETS if s.family in words] or list(DATASHEETS)
    hits = [s for s in rows if _same_device(s, None if cc is None else str(cc), int(sms),
                                            None if mem is None else float(mem), arch)]
    agreed = agreeing_rows(hits) if len(hits) > 1 else None
    if len(hits) != 1 and agreed is None:
        return None, (f"{len(hits)} rows match its properties ({', '.join(s.model for s in hits)})" if hits
                      else "no row matches its properties")
    facts = [f"gfx arch {arch}" if arch else f"compute capability {cc}", f"{sms} SMs/CUs"]
    if mem is not None:
        facts.append(f"{float(mem) / GIB:.0f} GiB")
    if agreed is not None:
        return agreed, (f"device properties ({', '.join(facts)}), which {len(hits)} rows fit "
                        f"({', '.join(s.model for s in hits)}); their figures agree, so theirs are taken and a "
                        "precision not every row prints is left out")
    return hits[0], f"device properties ({', '.join(facts)})"


AGREE_REL = 0.01
"""Rows whose figures differ by no more than this (relative) agree: one part seen two ways (an MI250 GCD
and an MI210 print 22.65 and 22.6 TFLOP/s FP64, the same silicon, clock and memory, rounded apart)."""


def _agree(values: list[float]) -> bool:
    return max(values) <= (1.0 + AGREE_REL) * min(values)


def agreeing_rows(rows: Sequence[Datasheet]) -> Datasheet | None:
    """One row standing for ``rows`` when the device could be any of them and their figures agree
    (within :data:`AGREE_REL`): its bandwidth, and each precision (dense and with sparsity) that every
    row prints, the lowest of their figures; a precision one row lacks is left out, not guessed. None
    when they differ in vendor, arch, bandwidth or any shared figure, or share none."""
    first = rows[0]
    if any((s.vendor, s.gfx_arch, s.compute_capability, s.sm_count) !=
           (first.vendor, first.gfx_arch, first.compute_capability, first.sm_count) for s in rows):
        return None
    bws = [s.bandwidth_gb_s for s in rows]
    if any(b is None for b in bws) or not _agree([float(b) for b in bws if b is not None]):
        return None

    def shared(tables: list[dict[str, float]]) -> dict[str, float] | None:
        keys = set.intersection(*(set(t) for t in tables))
        if any(not _agree([t[k] for t in tables]) for k in keys):
            return None
        return {k: min(t[k] for t in tables) for k in sorted(keys)}

    dense, sparse = shared([s.tflops for s in rows]), shared([s.sparse_tflops for s in rows])
    if not dense or sparse is None:
        return None
    clocks = {s.boost_clock_mhz for s in rows}
    models = " or ".join(s.model for s in rows)
    return Datasheet(
        models, "(?!)", dense, min(float(b) for b in bws if b is not None),
        f"[P] the figures {models} agree on (within {100 * AGREE_REL:.0f}%), the lowest of each: the device "
        "could be any of them", sparse, "; ".join(dict.fromkeys(s.source for s in rows)),
        clocks.pop() if len(clocks) == 1 else None, min((s.memory_gb for s in rows if s.memory_gb), default=None),
        first.sm_count, first.compute_capability, first.vendor, gfx_arch=first.gfx_arch,
        memory_type=first.memory_type if len({s.memory_type for s in rows}) == 1 else None,
        unified=all(s.unified for s in rows))


def _same_memory(sheet: Datasheet, memory_bytes: float) -> bool:
    """The device's memory is the row's: in [``MEMORY_SLACK`` x GB, GB]; any size up to the row's for a
    unified-memory part (its driver reports a carve-out or the system's memory)."""
    if sheet.memory_gb is None:
        return sheet.unified  # a unified part's size is not compared; another row's unknown size matches nothing
    gib = memory_bytes / GIB
    low = 0.0 if sheet.unified else MEMORY_SLACK * sheet.memory_gb
    return low <= gib <= sheet.memory_gb * 1.001


def _same_device(sheet: Datasheet, cc: str | None, sms: int, memory_bytes: float | None,
                 gfx_arch: str | None = None) -> bool:
    if sheet.sm_count != sms:
        return False
    if gfx_arch is not None and sheet.gfx_arch is not None:
        if sheet.gfx_arch != gfx_arch:
            return False
    elif cc is None or sheet.compute_capability != cc:
        return False
    return memory_bytes is None or _same_memory(sheet, memory_bytes)


def gfx_arch_name(text: str | None) -> str | None:
    """The LLVM target in ``text`` (``gfx942`` of ``gfx942:sramecc+:xnack-``), lower-cased; None without one."""
    found = re.search(r"gfx[0-9a-f]{3,4}", str(text or "").lower())
    return found.group(0) if found else None


def gfx_compute_capability(gfx_arch: str) -> str:
    """The ``major.minor`` HIP reports for an LLVM target (Kineto's ``computeMajor``/``computeMinor``):
    the last two hex digits are minor and stepping, the rest is major (``gfx942`` -> ``9.4``,
    ``gfx90a`` -> ``9.0``, ``gfx1151`` -> ``11.5``, ``gfx1201`` -> ``12.0``)."""
    digits = gfx_arch.lower().removeprefix("gfx")
    return f"{int(digits[:-2])}.{int(digits[-2], 16)}"


def find_datasheet_by_arch(gfx_arch: str, cu_count: int | None = None,
                           memory_gb: float | None = None) -> Datasheet | None:
    """The row of an AMD device known by its LLVM target (rocprof, ``rocminfo``: ``gfx942``,
    ``gfx1151``, with or without ``:sramecc+:xnack-``), its CU count and, to tell MI300X from MI325X,
    its memory (GiB as the driver reports it). None when no row, or more than one, fits; without
    ``cu_count`` only an arch that one row alone carries is matched."""
    arch = gfx_arch_name(gfx_arch)
    if arch is None:
        return None
    rows = [s for s in DATASHEETS if s.gfx_arch == arch and (cu_count is None or s.sm_count == int(cu_count))
            and (memory_gb is None or _same_memory(s, float(memory_gb) * GIB))]
    return rows[0] if len(rows) == 1 else None


def is_lpddr(sheet: Datasheet | None) -> bool:
    """Whether the row's DRAM is LPDDR (GB10, Strix Halo): Nsight Compute's theoretical
    ``2 x max_mem_frequency x bus width`` doubles such memory; the datasheet figure is the right one."""
    return sheet is not None and str(sheet.memory_type or "").upper().startswith("LPDDR")


def _squash(text: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", text.upper())


COMMON_PART = {"H100": "H100 SXM5 80 GB", "H200": "H200 SXM 141 GB", "A100": "A100 80 GB SXM4", "V100": "V100 SXM2",
               "RTX 4060 Ti": "RTX 4060 Ti 16 GB", "MI300": "MI300X"}
"""A family name a user types (``--gpu H100``) -> its most common part, taken when the name answers to
several rows (servers and clouds run the SXM boards; the 16 GB card is the one sold for ML; the MI300X is the
MI300 sold as a GPU, the MI300A an APU)."""

VARIANT = re.compile(r"^\s+(TI|SUPER|XT|XTX)\b", re.IGNORECASE)
"""A word after a model's name that makes another product (``RTX 4070 Ti`` is not the ``RTX 4070``)."""

OTHER_PARTS = ("L40",)
"""Products the table lacks whose name begins a row's inside a word: ``L40`` is not the ``L40S`` (a row's
name that continues a query inside a word is otherwise the part meant: ``MI355`` is the ``MI355X``)."""


def _rest(model: str, want: str) -> str | None:
    """What follows the squashed query ``want`` in ``model`` (None when ``model`` does not start with it)."""
    m = re.match("".join(re.escape(ch) + r"[^A-Z0-9]*" for ch in want[:-1]) + re.escape(want[-1:]), model.upper())
    return model[m.end():] if m else None


def _answers(want: str) -> list[Datasheet]:
    """The rows a squashed query names as a prefix: those it names in whole words (``B300`` answers to
    ``B300 (HGX, per GPU)``, ``H20`` to ``H20 96 GB`` and not to ``H200 ...``), else those it stops inside a
    word of (``MI355`` of ``MI355X``; not for :data:`OTHER_PARTS`). A query that stops before a variant's word
    (``RTX 4070`` of ``RTX 4070 Ti``) names another product."""
    whole: list[Datasheet] = []
    glued: list[Datasheet] = []
    for s in DATASHEETS:
        rest = _rest(s.model, want) if want else None
        if rest is None or VARIANT.match(rest):
            continue
        (whole if not rest or not rest[0].isalnum() else glued).append(s)
    return whole or ([] if want in {_squash(p) for p in OTHER_PARTS} else glued)


def pick_datasheet(query: str, flag: str = "--roofs") -> tuple[Datasheet, str | None]:
    """The row a user names, and a note when a family name was read as its most common part.

    As :func:`lookup_datasheet`, except that a name several rows start with (``H100``: PCIe, SXM5, NVL) is
    the family's most common part (:data:`COMMON_PART`) rather than an error: the note says which row was
    taken and names the others (``flag`` is the option the user typed, to say it in the note).

    Raises:
        UsageError: no row answers to ``query``, or several do and none is the family's common part.
    """
    want = _squash(query)
    prefixed = [s for s in DATASHEETS if want and _squash(s.model).startswith(want)]
    if len(_answers(want)) != 1 and not any(_squash(s.model) == want for s in DATASHEETS):
        common = next((COMMON_PART[k] for k in COMMON_PART if _squash(k) == want), None)
        pick = next((s for s in prefixed if s.model == common), None)
        if pick is not None:
            others = ", ".join(repr(s.model) for s in prefixed if s is not pick)
            return pick, (f"{flag} {query}: took {pick.model!r}, the most common {query} part; the others are "
                          f"{others} (name one to use it)")
    return lookup_datasheet(query, flag), None


def lookup_datasheet(query: str, flag: str = "--roofs") -> Datasheet:
    """The row a user names (``perfscope import --roofs NAME``): a model as the table lists it
    (``MI300X``, ``H100 SXM5 80 GB``, ``h100-sxm5``: case, spaces and punctuation do not matter),
    a unique prefix of one (``B300``), a family's most common part (``H100``: :func:`pick_datasheet`, which
    also says so), or a device name as a driver prints it (``NVIDIA H100 80GB HBM3``).

    Raises:
        UsageError: no row, or more than one, answers to ``query``; the message lists close names.
    """
    want = _squash(query)
    exact = [s for s in DATASHEETS if _squash(s.model) == want]
    if exact:
        return exact[0]
    prefixed = [s for s in DATASHEETS if want and _squash(s.model).startswith(want)]
    common = next((COMMON_PART[k] for k in COMMON_PART if _squash(k) == want), None)
    if common is not None and any(s.model == common for s in prefixed):
        return next(s for s in prefixed if s.model == common)
    words = _answers(want)
    if len(words) == 1:
        return words[0]
    by_name = find_datasheet(query) if not prefixed else None
    if by_name is not None:
        return by_name
    close = words or prefixed or [s for s in DATASHEETS
                         if _squash(s.model) in difflib.get_close_matches(want, [_squash(d.model) for d in DATASHEETS],
                                                                          n=5, cutoff=0.5)]
    names = ", ".join(repr(s.model) for s in close) or "none"
    what = ("more than one datasheet row answers to it" if len(words) > 1 else
            "no datasheet row is that part (the rows it begins are other products)" if prefixed else
            "no datasheet row answers to it")
    raise UsageError(f"{flag} {query!r}: {what} (close: {names})", hint="`perfscope devices --datasheet` lists every row")


def _roof(sheet: Datasheet, precision: str, tflops: float) -> Roof:
    tensor = precision in TENSOR_PRECISIONS
    unit = "matrix" if sheet.vendor == "amd" else "tensor"
    return Roof(
        value=tflops * TERA,
        provenance="datasheet",
        method=f"datasheet {sheet.model}: {f'dense {unit}-core' if tensor else f'non-{unit}'} figure"
        f"{f' at the {sheet.boost_clock_mhz:g} MHz boost clock' if sheet.boost_clock_mhz else ''} "
        f"({sheet.status}; source: {sheet.source})",
        clock="boost",
        dense=True if tensor else None,
    )


def sheet_spec(sheet: Datasheet, *, name: str | None = None, kind: str | None = None) -> DeviceSpec:
    """A DeviceSpec with ``sheet``'s dense roofs (per precision) and DRAM bandwidth.

    Args:
        sheet: the datasheet row.
        name: the device name (default: the row's model).
        kind: DeviceSpec kind (default ``cuda`` for NVIDIA rows, ``rocm`` for AMD ones).
    """
    compute = {p: _roof(sheet, p, v) for p, v in sheet.tflops.items()}
    memory = {}
    if sheet.bandwidth_gb_s:
        memory["dram"] = Roof(
            value=sheet.bandwidth_gb_s * GIGA,
            provenance="datasheet",
            method=f"datasheet {sheet.model} memory bandwidth ({sheet.status}; source: {sheet.source})",
            clock="boost",
        )
    return DeviceSpec(name=name or sheet.model, kind=kind or ("rocm" if sheet.vendor == "amd" else "cuda"),
                      compute=compute, memory=memory, properties={"datasheet": sheet.model})


def datasheet_spec(name: str | None, *, kind: str = "cuda",
                   properties: Mapping[str, Any] | None = None) -> DeviceSpec | None:
    """A DeviceSpec with datasheet roofs for the GPU called ``name``; None when not listed.

    Args:
        name: the device name as the driver prints it (``NVIDIA H100 80GB HBM3``, ``Tesla T4``).
        kind: DeviceSpec kind.
        properties: the device's properties, to match by when the name matches no row
            (:func:`match_datasheet`).
    """
    sheet = find_datasheet(name, properties)
    return None if sheet is None else sheet_spec(sheet, name=str(name), kind=kind)


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


NUMERIC_PROPERTIES = frozenset({"sm_count", "memory_bytes", "l2_cache_bytes", "memory_bandwidth_bytes_per_s",
                                "max_clock_hz", "computeMajor", "computeMinor"})
"""The device facts that are counts or sizes (in :data:`PROPERTY_NAMES`'s vocabulary, and the
compute capability's parts): a finite number >= 0, or not used."""


def unusable_properties(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The numeric facts of ``raw`` (any spelling) whose values are not finite numbers >= 0 (a
    string, a list, NaN, a negative count): a source's damaged field, ignored, never fatal."""
    import math

    def ok(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0

    return {k: v for k, v in raw.items() if PROPERTY_NAMES.get(k, k) in NUMERIC_PROPERTIES and not ok(v)}


def device_properties(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` device facts renamed to the one vocabulary (:data:`PROPERTY_NAMES`); ``computeMajor``
    and ``computeMinor`` become ``compute_capability`` (``"9.0"``); other keys are kept as they are.

    AMD sources (rocprof, ``rocminfo``, the 31amd importer) may give ``gfx_arch`` (or ``gcnArchName``:
    ``gfx942``, ``gfx942:sramecc+:xnack-``), ``cu_count`` (compute units) and ``memory_gb`` (GiB as the
    driver reports it): they become ``gfx_arch`` (the bare target), ``compute_capability`` (``9.4``),
    ``sm_count`` and ``memory_bytes``. Numeric facts that are not numbers (:func:`unusable_properties`)
    are left out."""
    bad = unusable_properties(raw)
    raw = {k: v for k, v in raw.items() if k not in bad}
    out = {PROPERTY_NAMES.get(k, k): v for k, v in raw.items() if k not in ("computeMajor", "computeMinor")}
    if raw.get("computeMajor") is not None and "computeMinor" not in bad:
        major, minor = (int(v) if isinstance(v, float) and v.is_integer() else v
                        for v in (raw["computeMajor"], raw.get("computeMinor", 0)))
        out.setdefault("compute_capability", f"{major}.{minor}")
    arch = gfx_arch_name(raw.get("gfx_arch") or raw.get("gcnArchName"))
    if arch is not None:
        out["gfx_arch"] = arch
        out.setdefault("compute_capability", gfx_compute_capability(arch))
    elif "gfx_arch" in out:
        del out["gfx_arch"]
    if raw.get("cu_count") is not None:
        out.setdefault("sm_count", int(raw["cu_count"]))
    if raw.get("memory_gb") is not None:
        out.setdefault("memory_bytes", float(raw["memory_gb"]) * GIB)
    return out


def gpu_spec(name: str, *, kind: str = "cuda", compute: Mapping[str, Roof] | None = None,
             memory: Mapping[str, Roof] | None = None, properties: Mapping[str, Any] | None = None,
             fallback_memory: Mapping[str, Roof] | None = None) -> DeviceSpec:
    """The one datasheet lookup: a GPU's DeviceSpec from what a source knows, filled from the datasheet.

    Roofs come first from the source (``compute``, ``memory``: measured or a report's own peaks),
    then from the datasheet row matching ``name`` (else its ``properties``: :func:`match_datasheet`)
    for the precisions and memory levels still missing, then, for an AMD device whose properties give
    ``gfx_arch``, ``sm_count`` and ``max_clock_hz``, from its architecture's per-CU rates for the
    precisions still missing (:func:`arch_roofs`, provenance ``derived``), then from ``fallback_memory`` (a driver's
    theoretical bandwidth). Properties are renamed to one vocabulary (:func:`device_properties`);
    ``datasheet`` names the row used and ``datasheet_match`` how it was found (both absent when
    the GPU is not listed). A device with an empty name matched by its properties is named
    ``<model> (unnamed in the trace, by its properties)``.
    """
    props = device_properties(properties or {})
    sheet, how = match_datasheet(name, props)
    roofs_c, roofs_m = dict(compute or {}), dict(memory or {})
    if sheet is not None:
        spec = sheet_spec(sheet, name=str(name), kind=kind)
        for precision, roof in spec.compute.items():
            roofs_c.setdefault(precision, roof)
        for level, roof in spec.memory.items():
            roofs_m.setdefault(level, roof)
        props["datasheet"] = sheet.model
        props["datasheet_match"] = how
        if not str(name).strip():
            name = sheet.model + UNNAMED
    elif " rows match" in how:
        props["datasheet_candidates"] = how  # more than one row fits: the note names them
    # a precision neither the source nor the row gives: CUs x clock x the arch's per-CU rate (AMD)
    for precision, roof in arch_roofs(props.get("gfx_arch"), props.get("sm_count"), props.get("max_clock_hz")).items():
        roofs_c.setdefault(precision, roof)
    for level, roof in (fallback_memory or {}).items():
        roofs_m.setdefault(level, roof)
    return DeviceSpec(name=str(name), kind=kind, compute=roofs_c, memory=roofs_m, properties=props)


ROOFS_FLAG = ("pass `perfscope import TRACE --roofs NAME` with a model of `perfscope devices --datasheet`, "
              "or `--roofs cuda` on the profiled machine")
"""How a user gives roofs on the command line (the library's equivalent: ``import_file(path, device=spec)``)."""


def roofs_note(spec: DeviceSpec | None) -> str | None:
    """What a report should say about its roofs' origin: why there are none (naming the device
    and its properties, and :data:`ROOFS_FLAG`), or that the row was matched by the device's
    properties rather than its name; None when the name found the row or roofs came from elsewhere."""
    if spec is not None and spec.properties.get("datasheet_match", "name") != "name":
        who = "the trace names no device" if spec.name.endswith(UNNAMED) else f"device {spec.name!r}"
        return speak(f"{who}: datasheet roofs of {spec.properties.get('datasheet')}, matched by its "
                     f"{spec.properties['datasheet_match']}; if that is the wrong part, {ROOFS_FLAG}", spec)
    if spec is not None and spec.compute:
        return None
    if spec is None or spec.kind == "cpu":
        return f"no device roofs known for this trace: bound is 'unknown'; {ROOFS_FLAG}"
    p = spec.properties
    facts = ", ".join(f"{label} {p[key]}" for key, label in (("sm_count", "SMs/CUs"), ("compute_capability",
                      "compute capability")) if p.get(key) is not None)
    if p.get("memory_bytes"):
        facts += f"{', ' if facts else ''}{float(p['memory_bytes']) / GIB:.1f} GiB"
    why = (f"{p['datasheet_candidates']}, so none is taken" if p.get("datasheet_candidates")
           else "no datasheet row matches its name or properties")
    return speak(f"no device roofs known for {spec.name!r}{f' ({facts})' if facts else ''}: {why}, bound is "
                 f"'unknown'; {ROOFS_FLAG}", spec)
