"""Roofline classification: intensity, achieved rates, attainable roof, bound and % of roof.

``classify(kernels, device)`` is a pure step: it returns a new kernel table whose
``arith_intensity``, ``achieved_flops_per_s``, ``achieved_bytes_per_s``, ``precision``,
``bound``, ``roof_flops_per_s`` and ``pct_of_roof`` are filled from ``flops``,
``dram_bytes``, ``duration_ns`` and the device's roofs.

Rules (honest by construction):
- intensity needs both FLOPs and bytes; without them ``bound`` is ``unknown``, never guessed;
- each kernel is placed against the roof of its own precision (an fp8 GEMM against the fp8 tensor
  roof); a narrow format (fp4, fp6, fp8, int4) on a device without units for it takes the nearest
  wider precision's roof (``DeviceSpec.roof_precision``); any other precision the device has no
  figure for is unknown, so is the bound;
- attainable = min(peak FLOP/s of the precision, intensity x DRAM bandwidth);
- a kernel is ``memory``-bound when its intensity is below the ridge point, else ``compute``;
- % of roof is achieved bytes/s / bandwidth for memory-bound kernels (defined even at zero
  FLOPs) and achieved FLOP/s / peak for compute-bound ones.

That reading is kept in ``roofline_bound``. Where Nsight Compute or rocprof-compute measured each unit's
throughput, ``bound`` (and ``bound_level``) follow the measured limiter instead
(:mod:`perfscope.analysis.costs.limiter`: ``compute``, ``memory`` or ``latency``, the unit in ``limiter``);
the point stays where the FLOPs and bytes put it, and ``pct_of_roof`` stays the roofline's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.schema import conform, decode, factorize, map_codes, map_distinct

from .limiter import apply_limiter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.device import DeviceSpec

DTYPE_TO_PRECISION = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32",
    "tf32": "tf32",
    "bfloat16": "bf16", "c10::bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "half": "fp16", "c10::half": "fp16", "fp16": "fp16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "c10::float8_e4m3fn": "fp8",
    "c10::float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
    "c10::float8_e4m3fnuz": "fp8", "c10::float8_e5m2fnuz": "fp8", "fp8": "fp8", "mxfp8": "fp8",
    "fp6": "fp6", "mxfp6": "fp6",
    "float4_e2m1fn_x2": "fp4", "c10::float4_e2m1fn_x2": "fp4", "fp4": "fp4", "mxfp4": "fp4", "nvfp4": "fp4",
    "int8": "int8", "signed char": "int8", "char": "int8",
    "int4": "int4", "quint4x2": "int4",
}
"""dtype name -> roofline precision. ``fp8`` covers OCP E4M3/E5M2 and AMD's FNUZ variants (MI300);
``fp4`` torch's packed E2M1 pair and the MX/NV block formats; a precision the device has no roof
for is placed against the nearest wider one (``perfscope.device.WIDER_PRECISIONS``)."""


def precision_of(dtype: object) -> str | None:
    """Roofline precision (fp32, bf16, ...) of a dtype name as torch or Kineto print it."""
    if not isinstance(dtype, str) or not dtype:
        return None
    key = dtype.strip().lower().removeprefix("torch.")
    return DTYPE_TO_PRECISION.get(key)


TF32_KERNEL_MARKERS = ("tf32", "tensorop_s1688", "tensorop_s16816", "tensorop_s168")
"""Kernel-name parts that say an FP32 GEMM runs on TF32 tensor cores (cuBLAS/cutlass name them so)."""


def _canonical(precision: object) -> object:
    """A precision as the roofs name it: a dtype or block-format spelling mapped (``mxfp4`` -> ``fp4``),
    any other value kept."""
    return (precision_of(precision) or precision) if isinstance(precision, str) else precision


def runs_tf32(name: object) -> bool:
    """True when a kernel's own name states TF32 tensor-core math (an FP32 op's precision is then tf32)."""
    return isinstance(name, str) and any(m in name.lower() for m in TF32_KERNEL_MARKERS)


def classify(kernels: pd.DataFrame, device: DeviceSpec | None) -> pd.DataFrame:
    """Fill the roofline columns of a kernel table against ``device``'s roofs.

    Args:
        kernels: a kernel table (see ``perfscope.schema.KERNEL_COLUMNS``); not modified.
        device: the device's roofs; ``None`` leaves every bound ``unknown``.

    Returns:
        A new table with the roofline columns filled.
    """
    return classify_conformed(conform(kernels, "kernels", source="<classify>"), device)


def classify_conformed(df: pd.DataFrame, device: DeviceSpec | None) -> pd.DataFrame:
    """:func:`classify` of a table already conformed to the kernel contract (the import
    pipeline's finishing step conforms once, then classifies); fills ``df``'s roofline columns
    in place and returns it."""
    flops = pd.to_numeric(df["flops"], errors="coerce").astype("float64")
    nbytes = pd.to_numeric(df["dram_bytes"], errors="coerce").astype("float64")
    seconds = pd.to_numeric(df["duration_ns"], errors="coerce").astype("float64") * 1e-9
    seconds = seconds.where(seconds > 0)

    precision = df["precision"].astype("object")
    derived = map_distinct(df["dtype"], precision_of) if "dtype" in df else pd.Series(None, index=df.index)
    tf32 = (derived == "fp32") & map_distinct(df["name"], runs_tf32).astype(bool)
    derived = derived.where(~tf32, "tf32")
    # one factorization gives both the precision's roof name (a cost model's own spelling, ``mxfp4``
    # or ``float8_e4m3fn``, becomes ``fp4`` / ``fp8``) and, below, its peak
    codes, distinct = factorize(precision.where(precision.notna(), derived))
    distinct = np.array([_canonical(p) for p in distinct], dtype=object)
    precision = pd.Series(decode(codes, distinct), index=df.index, dtype="object")
    df["precision"] = precision

    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = (flops / nbytes).where((nbytes > 0) & flops.notna())
        if "family_intensity" in df:  # a kernel family's intensity where its FLOPs and bytes are unknown
            intensity = intensity.fillna(pd.to_numeric(df["family_intensity"], errors="coerce").astype("float64"))
        df["arith_intensity"] = intensity
        df["achieved_flops_per_s"] = flops / seconds
        df["achieved_bytes_per_s"] = nbytes / seconds

    if device is None:
        df["roof_flops_per_s"] = np.nan
        df["pct_of_roof"] = np.nan
        df["bound"] = _labels(np.full(len(df), 2, np.int8), df.index)
        df["roofline_bound"] = df["bound"]
        apply_limiter(df)  # a measured limiter needs no roofs
        return df

    peaks = map_codes(codes, distinct, lambda p: device.peak_flops(p if isinstance(p, str) else None))
    peak = pd.to_numeric(pd.Series(peaks, index=df.index), errors="coerce").astype("float64")
    bw = device.peak_bandwidth("dram")
    bw_value = float(bw) if bw else np.nan

    with np.errstate(divide="ignore", invalid="ignore"):
        roof = np.minimum(peak, intensity * bw_value)
        ridge = peak / bw_value
        known = intensity.notna() & peak.notna() & np.isfinite(bw_value)
        memory = known & (intensity < ridge)
        compute = known & ~memory
        pct_mem = df["achieved_bytes_per_s"] / bw_value * 100.0
        pct_cmp = df["achieved_flops_per_s"] / peak * 100.0

    df["roof_flops_per_s"] = roof.where(known)
    df["bound"] = _labels(np.select([memory, compute], [0, 1], default=2).astype(np.int8), df.index)
    df["pct_of_roof"] = np.select([memory, compute], [pct_mem, pct_cmp], default=np.nan)
    df["pct_of_roof"] = df["pct_of_roof"].astype("float64")
    df["roofline_bound"] = df["bound"]
    _classify_levels(df, flops, nbytes, peak, device)
    apply_limiter(df)
    return df


BOUNDS = np.array(["memory", "compute", "unknown"], dtype=object)
"""The roofline's bounds, indexed by the codes :func:`classify_conformed` computes."""


def _labels(codes: np.ndarray, index: pd.Index) -> pd.Series:
    """The bound of each row as the object column the stored table holds (one shared ``str`` per bound), built
    from its codes: not a pandas ``str`` column (Arrow's buffers, first writes to its memory pool) that
    :func:`perfscope.schema.shared_texts` would turn back into objects."""
    return pd.Series(BOUNDS[codes], index=index, dtype=object, copy=False)


ABOVE_ROOF_PCT = 100.0
"""A row past this share of its roof ran faster than the roof allows: the roof or its count is wrong."""


def above_roof_note(row: Mapping[str, Any], device: DeviceSpec | None) -> str | None:
    """Why a kernel (or an aggregate row) sits above its roof, in words; None when it does not.

    Above the roof means the roof or the work count is wrong for that kernel, and which one can
    be told from where each came from:
    - memory-bound, bytes not measured (analytic: the compulsory bytes): the data came from cache
      (L2 / last-level cache), so DRAM does not bind it and its DRAM bytes are not its traffic;
    - memory-bound, bytes measured (ncu's DRAM bytes): the DRAM roof is low;
    - compute-bound under a measured roof: the micro-benchmark's roof is below what this kernel
      reached (re-measure it); under a datasheet roof: the FLOP count is too high.
    """
    pct = row.get("pct_of_roof")
    try:
        pct = float(pct)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not pct > ABOVE_ROOF_PCT or device is None:
        return None
    roofline = row.get("roofline_bound")  # the % of roof is the roofline's reading, not the measured limiter's
    bound = str(roofline if isinstance(roofline, str) and roofline else row.get("bound"))
    if bound == "memory":
        roof = device.memory.get("dram")
        if str(row.get("bytes_source") or "") == "ncu":
            return (f"{pct:.0f}% of the DRAM roof with measured DRAM bytes: the DRAM roof "
                    f"({(roof.provenance if roof else 'unknown')}) is too low for this device")
        return (f"{pct:.0f}% of the DRAM roof: its data came from cache, so its byte count (the compulsory "
                "bytes, not measured) overstates its DRAM traffic and the DRAM roof does not bind it")
    if bound == "compute":
        name = device.roof_precision(str(row.get("precision")) if row.get("precision") else None)
        roof = device.compute.get(name) if name else None
        if roof is not None and roof.provenance == "measured":
            return (f"{pct:.0f}% of the measured {name} roof: the micro-benchmark's roof is below what this "
                    "kernel reached; re-measure it (`perfscope devices --refresh`) or compare with the datasheet")
        return (f"{pct:.0f}% of the {name or 'compute'} roof ({roof.provenance if roof else 'unknown'}): "
                "its FLOP count is too high for its time, or the roof is low")
    return None


LEVELS = (("dram", "dram_bytes"), ("l2", "l2_bytes"), ("l1", "l1_bytes"), ("shared", "shared_bytes"))
"""Memory levels of the hierarchical roofline, outermost first: (roof name, kernel bytes column)."""


def _classify_levels(df: pd.DataFrame, flops: pd.Series, dram: pd.Series, peak: pd.Series,
                     device: DeviceSpec) -> None:
    """Hierarchical roofline: per level with bytes and a known bandwidth, the attainable FLOP/s is
    intensity there x that level's bandwidth (= FLOPs / the time the level needs to move its bytes);
    ``bound_level`` is the level where it is lowest, ``level_roof_flops_per_s`` its value. A kernel
    with FLOPs known but zero is bound by the level whose transfers take longest."""
    slowest = pd.Series(-np.inf, index=df.index)  # seconds the slowest level needs to move its bytes
    level = pd.Series(None, index=df.index, dtype="object")
    for name, col in LEVELS:
        bw = device.peak_bandwidth(name)
        if not bw or col not in df:
            continue
        nbytes = dram if col == "dram_bytes" else pd.to_numeric(df[col], errors="coerce").astype("float64")
        seconds = (nbytes / float(bw)).where(nbytes > 0)
        take = seconds.notna() & flops.notna() & (seconds > slowest)
        slowest = slowest.where(~take, seconds)
        level = level.where(~take, name)
    known = level.notna()
    with np.errstate(divide="ignore", invalid="ignore"):
        df["level_roof_flops_per_s"] = (flops / slowest).where(known)
    df["bound_level"] = level
