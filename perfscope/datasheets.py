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
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .device import DeviceSpec, Roof
from .errors import UsageError

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

    @property
    def family(self) -> str:
        """The model's first word (``H100``, ``MI300X``): a name that holds it is of this family."""
        return self.model.split()[0].upper()

    def to_dict(self) -> dict[str, Any]:
        """The row as plain values (the ``devices --datasheet --json`` record)."""
        return {"model": self.model, "vendor": self.vendor, "dense_tflops": dict(self.tflops),
                "sparse_tflops": dict(self.sparse_tflops), "bandwidth_gb_s": self.bandwidth_gb_s,
                "boost_clock_mhz": self.boost_clock_mhz, "memory_gb": self.memory_gb,
                "sm_count": self.sm_count, "compute_capability": self.compute_capability,
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
    Datasheet("V100 SXM2", r"\bV100\b.*\bSXM", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 900.0,
              "[D] compute; [P] bandwidth", {}, "NVIDIA Tesla V100 datasheet (SXM2 column)", 1530, None, 80, "7.0"),
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
    Datasheet("RTX 4090", r"\bRTX 4090\b(?! D\b)",
              {"fp64": 1.3, "fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "int8": 660.6,
               "int4": 1321.2}, 1008.0,
              "[P] whitepaper figures as quoted by waredb/gigagpu; FP16/BF16 with FP32 accumulate (the rate "
              "torch GEMMs run at); FP8 omitted (sources disagree on its FP32-accumulate rate)",
              {"tf32": 165.2, "bf16": 330.4, "fp16": 330.4, "int8": 1321.2, "int4": 2642.4}, _ADA_WP,
              2520, 24, 128, "8.9"),
    Datasheet("RTX 5090", r"\bRTX 5090\b(?! D\b)", {"fp32": 104.8, "fp4": 1676.0}, 1792.0,
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
              "NVIDIA DGX Spark datasheet (GB10 Grace Blackwell Superchip)", None, 128, 48, "12.1"),
)

# ---------------------------------------------------------------------------- AMD
_MI300 = {"fp64": 81.7, "fp64_tensor": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4,
          "fp8": 2614.9, "int8": 2614.9}
_MI300_SPARSE = {"tf32": 1307.4, "bf16": 2614.9, "fp16": 2614.9, "fp8": 5229.8, "int8": 5229.8}
_MI355 = {"fp64": 78.6, "fp64_tensor": 78.6, "fp32": 157.3, "bf16": 2516.6, "fp16": 2516.6, "fp8": 5033.2,
          "int8": 5033.2, "fp6": 10066.3, "fp4": 10066.3}
_MI355_SPARSE = {"bf16": 5033.2, "fp16": 5033.2, "fp8": 10066.3, "int8": 10066.3}
_MI250X_OAM = {"fp64": 47.9, "fp64_tensor": 95.7, "fp32": 47.9, "bf16": 383.0, "fp16": 383.0, "int8": 383.0}

AMD: tuple[Datasheet, ...] = (
    Datasheet("MI300X", r"\bMI300X\b", _MI300, 5300.0,
              "[D] peak figures as printed (dense; with-sparsity where printed); FP32 is the vector figure "
              "(matrix is the same)", _MI300_SPARSE,
              "AMD Instinct MI300X accelerator datasheet; AMD CDNA 3 architecture whitepaper", 2100, 192, 304,
              "9.4", "amd"),
    Datasheet("MI325X", r"\bMI325X\b", _MI300, 6000.0,
              "[D] compute as MI300X (same CDNA 3 die, clock and CU count), 256 GB HBM3E at 6 TB/s",
              _MI300_SPARSE, "AMD Instinct MI325X accelerator datasheet", 2100, 256, 304, "9.4", "amd"),
    Datasheet("MI355X", r"\bMI355X\b", _MI355, 8000.0,
              "[P] CDNA 4 peaks as AMD prints them (FP16 2.5 PF, FP8 5 PF, MXFP6/MXFP4 10 PF dense); TF32 has "
              "no matrix support on CDNA 4 and is absent", _MI355_SPARSE,
              "AMD Instinct MI355X accelerator datasheet; AMD CDNA 4 architecture whitepaper", 2400, 288, 256,
              "9.5", "amd"),
    Datasheet("MI250X (per GCD)", r"\bMI250X\b(?!/MI250\b)", _per(2, _MI250X_OAM), 1638.4,
              "[D] the datasheet's per-OAM figures halved: a trace sees each of the package's two GCDs "
              "(110 CUs, 64 GB, 1.6384 TB/s) as one device; rocm-smi's `MI250X/MI250` is matched by CU count",
              {},
              "AMD Instinct MI250X accelerator datasheet (per OAM module, 2 GCDs)", 1700, 64, 110, "9.0", "amd"),
)

DATASHEETS: tuple[Datasheet, ...] = NVIDIA + AMD
"""Rows in match order: the more specific patterns (H200 NVL, H100 PCIe, A100 80GB PCIe, A10G) come first."""


def _key(name: str) -> str:
    return " ".join(name.upper().replace("_", " ").split())


def find_datasheet(name: str | None, properties: Mapping[str, Any] | None = None) -> Datasheet | None:
    """The datasheet row of the device called ``name`` (else by its ``properties``), or None.

    See :func:`match_datasheet`."""
    return match_datasheet(name, properties)[0]


def match_datasheet(name: str | None, properties: Mapping[str, Any] | None = None) -> tuple[Datasheet | None, str]:
    """The row for a device and how it was found (``name`` or ``device properties (...)``).

    By name first: the first row whose pattern matches the upper-cased ``name``. When none does
    and ``properties`` are given (any spelling :func:`device_properties` reads), the row whose
    compute capability, SM/CU count and memory size all match, if exactly one does; a name that
    holds a listed family (``NVIDIA A100-PG509-200``) is matched only within that family.

    Returns:
        (row, how), or (None, why not) when no row, or more than one, matches.
    """
    key = _key(name or "")
    if key:
        for sheet in DATASHEETS:
            if re.search(sheet.pattern, key):
                return sheet, "name"
    props = device_properties(properties or {})
    cc, sms, mem = props.get("compute_capability"), props.get("sm_count"), props.get("memory_bytes")
    if cc is None or sms is None or mem is None:
        return None, "name not listed" if key else "no name"
    words = set(re.split(r"[^A-Z0-9]+", key))
    rows = [s for s in DATASHEETS if s.family in words] or list(DATASHEETS)
    hits = [s for s in rows if _same_device(s, str(cc), int(sms), float(mem))]
    if len(hits) != 1:
        return None, f"{len(hits)} rows match its properties" if hits else "no row matches its properties"
    gib = float(mem) / GIB
    return hits[0], f"device properties (compute capability {cc}, {sms} SMs/CUs, {gib:.0f} GiB)"


def _same_device(sheet: Datasheet, cc: str, sms: int, memory_bytes: float) -> bool:
    if sheet.compute_capability is None or sheet.sm_count is None or sheet.memory_gb is None:
        return False
    gib = memory_bytes / GIB
    return (sheet.compute_capability == cc and sheet.sm_count == sms
            and MEMORY_SLACK * sheet.memory_gb <= gib <= sheet.memory_gb * 1.001)


def _squash(text: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", text.upper())


def lookup_datasheet(query: str) -> Datasheet:
    """The row a user names (``perfscope import --roofs NAME``): a model as the table lists it
    (``MI300X``, ``H100 SXM5 80 GB``, ``h100-sxm5``: case, spaces and punctuation do not matter),
    a unique prefix of one (``B300``), or a device name as a driver prints it (``NVIDIA H100 80GB HBM3``).

    Raises:
        UsageError: no row, or more than one, answers to ``query``; the message lists close names.
    """
    want = _squash(query)
    exact = [s for s in DATASHEETS if _squash(s.model) == want]
    if exact:
        return exact[0]
    prefixed = [s for s in DATASHEETS if want and _squash(s.model).startswith(want)]
    if len(prefixed) == 1:
        return prefixed[0]
    by_name = find_datasheet(query) if not prefixed else None
    if by_name is not None:
        return by_name
    close = prefixed or [s for s in DATASHEETS
                         if _squash(s.model) in difflib.get_close_matches(want, [_squash(d.model) for d in DATASHEETS],
                                                                          n=5, cutoff=0.5)]
    names = ", ".join(repr(s.model) for s in close) or "none"
    raise UsageError(f"--roofs {query!r}: {'more than one' if prefixed else 'no'} datasheet row answers to it "
                     f"(close: {names})", hint="`perfscope devices --datasheet` lists every row")


def _roof(sheet: Datasheet, precision: str, tflops: float) -> Roof:
    tensor = precision in TENSOR_PRECISIONS
    return Roof(
        value=tflops * TERA,
        provenance="datasheet",
        method=f"datasheet {sheet.model}: {'dense tensor-core' if tensor else 'non-tensor'} figure"
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
    Numeric facts that are not numbers (:func:`unusable_properties`) are left out."""
    bad = unusable_properties(raw)
    raw = {k: v for k, v in raw.items() if k not in bad}
    out = {PROPERTY_NAMES.get(k, k): v for k, v in raw.items() if k not in ("computeMajor", "computeMinor")}
    if raw.get("computeMajor") is not None and "computeMinor" not in bad:
        major, minor = (int(v) if isinstance(v, float) and v.is_integer() else v
                        for v in (raw["computeMajor"], raw.get("computeMinor", 0)))
        out.setdefault("compute_capability", f"{major}.{minor}")
    return out


def gpu_spec(name: str, *, kind: str = "cuda", compute: Mapping[str, Roof] | None = None,
             memory: Mapping[str, Roof] | None = None, properties: Mapping[str, Any] | None = None,
             fallback_memory: Mapping[str, Roof] | None = None) -> DeviceSpec:
    """The one datasheet lookup: a GPU's DeviceSpec from what a source knows, filled from the datasheet.

    Roofs come first from the source (``compute``, ``memory``: measured or a report's own peaks),
    then from the datasheet row matching ``name`` (else its ``properties``: :func:`match_datasheet`)
    for the precisions and memory levels still missing, then from ``fallback_memory`` (a driver's
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
        return (f"{who}: datasheet roofs of {spec.properties.get('datasheet')}, matched by its "
                f"{spec.properties['datasheet_match']}; if that is the wrong part, {ROOFS_FLAG}")
    if spec is not None and spec.compute:
        return None
    if spec is None or spec.kind == "cpu":
        return f"no device roofs known for this trace: bound is 'unknown'; {ROOFS_FLAG}"
    p = spec.properties
    facts = ", ".join(f"{label} {p[key]}" for key, label in (("sm_count", "SMs/CUs"), ("compute_capability",
                      "compute capability")) if p.get(key) is not None)
    if p.get("memory_bytes"):
        facts += f"{', ' if facts else ''}{float(p['memory_bytes']) / GIB:.1f} GiB"
    return (f"no device roofs known for {spec.name!r}{f' ({facts})' if facts else ''}: no datasheet row matches "
            f"its name or properties, bound is 'unknown'; {ROOFS_FLAG}")
