"""Kernel time on another device: the measured kernel's efficiency, carried to the target's roofs.

The one time model of ``perfscope whatif`` and of its validation (``benchmarks/whatif_crossgpu.py``),
vectorised over a whole kernel table:

- **roof time** ``R = F / P(precision) + B / BW``: the time the kernel's FLOPs and DRAM bytes take at the
  device's peaks, compute and memory added (a kernel rarely overlaps the two perfectly; the sum ranks
  near-ridge kernels better than ``max``, measured in docs/whatif.md);
- **latency floor** ``t0`` per family (category and precision): half the family's shortest measured
  kernel. It is the fixed part of a kernel's time (launch on the GPU, first wave, tail), which a
  faster device does not shorten; a family of one kernel takes half of it as well;
- **efficiency** ``e = R_source / (T_source - t0)``: the kernel's own achieved share of its roof,
  measured, kept on the target (the per-kernel rule), so a GEMM that ran at 60% of the A100's roofs runs
  at 60% of the H100's; the latency floor makes small kernels of a family gain less than large ones;
- **time** ``T_target = t0 + R_target / e``;
- a kernel with **unknown cost** (no FLOPs and no bytes) scales by the DRAM bandwidth ratio (the
  common case of an uncosted kernel is data movement), counted as ``rule = "unknown-cost"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfscope.device import DeviceSpec

LATENCY_FLOOR_SHARE = 0.5
"""The share of a family's shortest kernel taken as its fixed latency ``t0``."""

RULES = ("efficiency-kept", "unknown-cost", "no-roof")
"""Per kernel, how its projected time was made."""


@dataclass(frozen=True)
class Roofs:
    """The peaks a projection reads: FLOP/s per precision and DRAM bytes/s."""

    flops_per_s: dict[str, float]
    bytes_per_s: float | None
    name: str

    @classmethod
    def of(cls, spec: DeviceSpec) -> Roofs:
        peaks = {}
        for p in ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4"):
            v = spec.peak_flops(p)
            if v:
                peaks[p] = float(v)
        bw = spec.peak_bandwidth("dram")
        return cls(peaks, float(bw) if bw else None, spec.name)

    def peak(self, precision: pd.Series) -> np.ndarray:
        """Peak FLOP/s per row's precision (NaN where the device has none)."""
        codes, uniques = pd.factorize(precision.astype("object"), use_na_sentinel=True)
        vals = np.array([self.flops_per_s.get(str(u), np.nan) for u in uniques] + [np.nan], dtype=np.float64)
        return vals[codes]


def roof_time_s(flops: np.ndarray, nbytes: np.ndarray, peak: np.ndarray, bw: float | None) -> np.ndarray:
    """``F / P + B / BW`` per kernel (a missing FLOP count with known bytes counts as 0 FLOPs and the
    reverse; both missing: NaN)."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    bw_v = bw if bw else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        tf = np.where(np.isnan(f) | (f == 0), 0.0, f / peak)
        tb = np.where(np.isnan(b), 0.0, b / bw_v)
    unknown = np.isnan(f) & np.isnan(b)
    return np.where(unknown, np.nan, tf + tb)


def latency_floor_s(duration_s: np.ndarray, family: pd.Series) -> np.ndarray:
    """Per kernel, its family's ``t0``: :data:`LATENCY_FLOOR_SHARE` of the family's shortest kernel."""
    d = pd.Series(np.asarray(duration_s, np.float64), index=family.index)
    shortest = d.where(d > 0).groupby(family.astype("object").fillna("?"), sort=False).transform("min")
    return (shortest * LATENCY_FLOOR_SHARE).fillna(0.0).to_numpy()


def project_times(duration_s: np.ndarray, flops: np.ndarray, nbytes: np.ndarray, precision: pd.Series,
                  family: pd.Series, source: Roofs, target: Roofs, *, new_flops: np.ndarray | None = None,
                  new_bytes: np.ndarray | None = None, new_precision: pd.Series | None = None) -> pd.DataFrame:
    """Projected time of each kernel on ``target``, from its time measured on ``source``.

    Args:
        duration_s: measured times on the source, s.
        flops, nbytes: the measured kernel's work (NaN where unknown).
        precision: roofline precision per kernel (``bf16``...).
        family: the group a latency floor is fitted over (category and precision).
        source, target: the two devices' roofs (the same for a shape-only question).
        new_flops, new_bytes, new_precision: the work at the new shapes (default: unchanged).

    Returns:
        A frame with ``time_s``, ``efficiency``, ``t0_s``, ``roof_time_s`` (target, at the new work) and
        ``rule`` (:data:`RULES`).
    """
    d = np.asarray(duration_s, np.float64)
    nf = np.asarray(flops if new_flops is None else new_flops, np.float64)
    nb = np.asarray(nbytes if new_bytes is None else new_bytes, np.float64)
    nprec = precision if new_precision is None else new_precision
    r_src = roof_time_s(flops, nbytes, source.peak(precision), source.bytes_per_s)
    r_tgt = roof_time_s(nf, nb, target.peak(nprec), target.bytes_per_s)
    t0 = np.minimum(latency_floor_s(d, family), d)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = r_src / (d - t0)
        time = t0 + r_tgt / eff
    unknown = np.isnan(r_src) | np.isnan(r_tgt)
    no_roof = unknown & ~(np.isnan(np.asarray(flops, np.float64)) & np.isnan(np.asarray(nbytes, np.float64)))
    ratio = (source.bytes_per_s / target.bytes_per_s) if source.bytes_per_s and target.bytes_per_s else 1.0
    time = np.where(unknown, d * ratio, time)
    time = np.where(r_src == 0, d, time)  # a kernel with no work keeps its (latency) time
    rule = np.where(no_roof, "no-roof", np.where(unknown, "unknown-cost", "efficiency-kept"))
    return pd.DataFrame({"time_s": time, "efficiency": np.where(unknown, np.nan, eff), "t0_s": t0,
                         "roof_time_s": r_tgt, "rule": rule})
