"""Kernel time on another device: the measured kernel's efficiency, carried to the target's roofs.

The one time model of ``perfscope whatif`` and of its validation (``benchmarks/whatif_crossgpu.py``),
vectorised over a whole kernel table:

- **roof time** ``R = F / P(precision) + B / BW``: the time the kernel's FLOPs and DRAM bytes take at the
  device's peaks, compute and memory added (a kernel rarely overlaps the two perfectly; the sum ranks
  near-ridge kernels better than ``max``, measured in docs/whatif.md). A GEMM (tensor cores) overlaps
  them in part, as its tiles stream the next operands while the matrix cores work: its roof time is the
  2-norm ``sqrt((F / P)^2 + (B / BW)^2)`` (:data:`GEMM_ROOF_NORM`), between the sum and ``max``;
- **latency floor** ``t0`` per family (category and precision): half the family's shortest measured
  kernel. It is the fixed part of a kernel's time (launch on the GPU, first wave, tail), which a
  faster device does not shorten; a family of one kernel takes half of it as well;
- **efficiency** ``e = R_source / (T_source - t0)``: the kernel's own achieved share of its roof,
  measured, kept on the target (the per-kernel rule), so a GEMM that ran at 60% of the A100's roofs runs
  at 60% of the H100's; the latency floor makes small kernels of a family gain less than large ones;
- **time** ``T_target = t0 + R_target / e`` for a GEMM (tensor cores: a GEMM below its roof is still
  bound by tensor-core throughput, tile shapes and pipeline depth, which scale with the tensor peak);
  any other kernel ``T_target = t0 + (T_source - t0) * (e R_target / R_source + (1 - e) S_source / S_target)``
  with ``S`` = SMs (CUs) x boost clock: the share of its time its roofs explain scales with the
  roofs, the rest (instruction issue, latency: an embedding gather at 5% of the bandwidth) with the
  SMs and the clock; without an SM count or clock on either side, the roofs alone;
- **new shapes** (another batch, prompt, context): the family's line ``T = t0 + c R`` fitted over its
  kernels at other sizes in the same trace (:func:`family_fit`: where their roof times span 4x),
  each kernel keeping its own ratio to the line, ``T_new = T * line(R_new) / line(R)``; a family
  measured at one size keeps the rule above (efficiency kept, floor ``t0``);
- a kernel whose precision has no compute roof (a boolean mask, an integer index) is timed by its
  bytes alone (``memory-only``);
- a kernel with **unknown cost** (no FLOPs and no bytes) scales by the DRAM bandwidth ratio (the
  common case of an uncosted kernel is data movement), counted as ``rule = "unknown-cost"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.device_models import at_least, curve_step, run_level

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec
    from perfscope.device_models import DeviceModel, DeviceModels

LATENCY_FLOOR_SHARE = 0.5
"""The share of a family's shortest kernel taken as its fixed latency ``t0``."""

GEMM_ROOF_NORM = 2.0
"""A GEMM's roof time combines its compute and memory times as their p-norm, p = this: 1 is the sum (no
overlap), infinity ``max`` (perfect overlap). Measured on the cross-GPU tables (docs/whatif.md): the
median GEMM error is 13.0% (sum) / 12.5% (2) / 13.0% (3) / 14.1% (max) on A100 -> H100 and 9.7 / 7.9 /
8.0 / 7.9% on A100 -> A40; 2 is the round value in that flat optimum."""

RULES = ("device-model", "efficiency-kept", "memory-only", "size-curve", "unknown-cost", "no-roof")
"""Per kernel, how its projected time was made."""

KNOWN_RULES = ("device-model", "efficiency-kept", "memory-only", "size-curve")
"""The rules that project a kernel from its work (the others scale a kernel whose work is unknown)."""


@dataclass(frozen=True)
class Roofs:
    """The peaks a projection reads: FLOP/s per precision and DRAM bytes/s."""

    flops_per_s: dict[str, float]
    bytes_per_s: float | None
    name: str
    sm_mhz: float | None = None
    """SMs (CUs) x boost clock, MHz: the rate of a kernel bound by neither roof (issue, latency)."""

    @classmethod
    def of(cls, spec: DeviceSpec) -> Roofs:
        from perfscope.datasheets import DATASHEETS, find_datasheet

        peaks = {}
        for p in ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4"):
            v = spec.peak_flops(p)
            if v:
                peaks[p] = float(v)
        bw = spec.peak_bandwidth("dram")
        model = spec.properties.get("datasheet")
        row = next((d for d in DATASHEETS if d.model == model), None) or find_datasheet(spec.name, spec.properties)
        sms = spec.properties.get("sm_count") or (row.sm_count if row else None)
        clock = row.boost_clock_mhz if row else None
        if clock is None and spec.properties.get("max_clock_hz"):  # a device the source describes itself
            clock = float(spec.properties["max_clock_hz"]) / 1e6
        return cls(peaks, float(bw) if bw else None, spec.name, float(sms) * clock if sms and clock else None)

    def peak(self, precision: pd.Series) -> np.ndarray:
        """Peak FLOP/s per row's precision (NaN where the device has none)."""
        codes, uniques = pd.factorize(precision.astype("object"), use_na_sentinel=True)
        vals = np.array([self.flops_per_s.get(str(u), np.nan) for u in uniques] + [np.nan], dtype=np.float64)
        return vals[codes]


def roof_time_s(flops: np.ndarray, nbytes: np.ndarray, peak: np.ndarray, bw: float | None,
                gemm: np.ndarray | None = None) -> np.ndarray:
    """``F / P + B / BW`` per kernel, and for the ``gemm`` rows their :data:`GEMM_ROOF_NORM`-norm (a missing
    FLOP count with known bytes counts as 0 FLOPs and the reverse; both missing: NaN)."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    bw_v = bw if bw else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        tf = np.where(np.isnan(f) | (f == 0) | np.isnan(peak), 0.0, f / peak)  # no roof for its precision: memory only
        tb = np.where(np.isnan(b), 0.0, b / bw_v)
    unknown = np.isnan(f) & np.isnan(b)
    total = tf + tb
    if gemm is not None:
        p = GEMM_ROOF_NORM
        total = np.where(np.asarray(gemm, bool), (tf ** p + tb ** p) ** (1.0 / p), total)
    return np.where(unknown, np.nan, total)


def latency_floor_s(duration_s: np.ndarray, family: pd.Series) -> np.ndarray:
    """Per kernel, its family's ``t0``: :data:`LATENCY_FLOOR_SHARE` of the family's shortest kernel."""
    d = pd.Series(np.asarray(duration_s, np.float64), index=family.index)
    shortest = d.where(d > 0).groupby(family.astype("object").fillna("?"), sort=False).transform("min")
    return (shortest * LATENCY_FLOOR_SHARE).fillna(0.0).to_numpy()


FIT_MIN_SPAN = 4.0
"""A family is fitted (:func:`family_fit`) when its kernels' roof times span at least this factor."""


def family_fit(duration_s: np.ndarray, roof_s: np.ndarray, family: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel, its family's fitted ``T = t0 + c * R`` (``t0`` >= 0, ``c`` >= 0): a least-squares line
    through the family's (roof time, measured time) points, weighted by 1 / T (relative error), where
    the family holds kernels whose roof times span :data:`FIT_MIN_SPAN`; NaN elsewhere."""
    d = np.asarray(duration_s, np.float64)
    r = np.asarray(roof_s, np.float64)
    codes, _ = pd.factorize(family.astype("object").fillna("?"), use_na_sentinel=False)
    ok = (d > 0) & np.isfinite(r) & (r > 0)
    n = int(codes.max()) + 1 if len(codes) else 0
    w = np.where(ok, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    x, y = np.where(ok, r, 0.0), np.where(ok, d, 0.0)
    # weighted normal equations of y/T = t0/T + c x/T, per family, by bincount
    a11 = np.bincount(codes, (w * w), n)
    a12 = np.bincount(codes, (w * w * x), n)
    a22 = np.bincount(codes, (w * w * x * x), n)
    b1 = np.bincount(codes, (w * w * y), n)
    b2 = np.bincount(codes, (w * w * x * y), n)
    rmin = pd.Series(np.where(ok, r, np.inf)).groupby(codes).min().reindex(range(n)).to_numpy()
    rmax = pd.Series(np.where(ok, r, -np.inf)).groupby(codes).max().reindex(range(n)).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        det = a11 * a22 - a12 * a12
        t0 = (b1 * a22 - a12 * b2) / det
        c = (a11 * b2 - a12 * b1) / det
        # a negative intercept or slope: the other term alone
        c_only = b2 / a22
        t0_only = b1 / a11
        t0, c = np.where(t0 < 0, 0.0, t0), np.where(t0 < 0, c_only, c)
        t0, c = np.where(c < 0, t0_only, t0), np.where(c < 0, 0.0, c)
        fitted = (rmax >= FIT_MIN_SPAN * rmin) & np.isfinite(t0) & np.isfinite(c)
    t0 = np.where(fitted, t0, np.nan)
    c = np.where(fitted, c, np.nan)
    return t0[codes], c[codes]


def project_times(duration_s: np.ndarray, flops: np.ndarray, nbytes: np.ndarray, precision: pd.Series,
                  family: pd.Series, source: Roofs, target: Roofs, *, new_flops: np.ndarray | None = None,
                  new_bytes: np.ndarray | None = None, new_precision: pd.Series | None = None,
                  fit: bool = False, tensor: np.ndarray | None = None) -> pd.DataFrame:
    """Projected time of each kernel on ``target``, from its time measured on ``source``.

    Args:
        duration_s: measured times on the source, s.
        flops, nbytes: the measured kernel's work (NaN where unknown).
        precision: roofline precision per kernel (``bf16``...).
        family: the group a latency floor is fitted over (category and precision).
        source, target: the two devices' roofs (the same for a shape-only question).
        new_flops, new_bytes, new_precision: the work at the new shapes (default: unchanged).
        tensor: per kernel, whether it runs on the tensor cores (GEMMs): those scale with the roofs
            alone, their roof time the :data:`GEMM_ROOF_NORM`-norm; the others blend the roofs and the
            SMs x clock by their efficiency (None: roofs alone).
        fit: use the family's fitted line (:func:`family_fit`) where it has one: the rule for new
            shapes (how time grows with work is measured from the family's other sizes); without it
            (another device, the same shapes) each kernel's own efficiency and the latency floor.

    Returns:
        A frame with ``time_s``, ``efficiency``, ``t0_s``, ``roof_time_s`` (target, at the new work) and
        ``rule`` (:data:`RULES`).
    """
    d = np.asarray(duration_s, np.float64)
    nf = np.asarray(flops if new_flops is None else new_flops, np.float64)
    nb = np.asarray(nbytes if new_bytes is None else new_bytes, np.float64)
    nprec = precision if new_precision is None else new_precision
    r_src = roof_time_s(flops, nbytes, source.peak(precision), source.bytes_per_s, tensor)
    r_tgt = roof_time_s(nf, nb, target.peak(nprec), target.bytes_per_s, tensor)
    t0 = np.minimum(latency_floor_s(d, family), d)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = r_src / (d - t0)
        time = t0 + r_tgt / eff
        if tensor is not None and source.sm_mhz and target.sm_mhz:
            # a kernel off the tensor cores: the share of its time its roofs explain (its efficiency e)
            # scales with the roofs, the rest (issue, latency) with the SMs x clock
            e = np.clip(eff, 0.0, 1.0)
            blend = t0 + (d - t0) * (e * r_tgt / r_src + (1.0 - e) * source.sm_mhz / target.sm_mhz)
            time = np.where(np.asarray(tensor, bool), time, blend)
        if fit:
            # the family's line T = t0 + c R, each kernel keeping its own ratio to the line
            ft0, fc = family_fit(d, r_src, family)
            line_src = ft0 + fc * r_src
            line_tgt = ft0 + fc * r_tgt
            fitted = np.isfinite(line_src) & (line_src > 0)
            time = np.where(fitted, line_tgt * d / line_src, time)
            eff = np.where(fitted, r_src / (d - np.minimum(ft0 * d / line_src, d)), eff)
            t0 = np.where(fitted, np.minimum(ft0 * d / line_src, d), t0)
    unknown = np.isnan(r_src) | np.isnan(r_tgt)
    no_roof = unknown & ~(np.isnan(np.asarray(flops, np.float64)) & np.isnan(np.asarray(nbytes, np.float64)))
    ratio = (source.bytes_per_s / target.bytes_per_s) if source.bytes_per_s and target.bytes_per_s else 1.0
    time = np.where(unknown, d * ratio, time)
    time = np.where(r_src == 0, d, time)  # a kernel with no work keeps its (latency) time
    f_in = np.asarray(flops, np.float64)
    memory_only = ~unknown & (f_in > 0) & np.isnan(source.peak(precision))
    rule = np.where(no_roof, "no-roof", np.where(unknown, "unknown-cost",
                                                 np.where(memory_only, "memory-only", "efficiency-kept")))
    return pd.DataFrame({"time_s": time, "efficiency": np.where(unknown, np.nan, eff), "t0_s": t0,
                         "roof_time_s": r_tgt, "rule": rule})


def device_model_ratio(family: np.ndarray, roof_src_s: np.ndarray, roof_tgt_s: np.ndarray, source: DeviceModel,
                       target: DeviceModel, models: DeviceModels, flops: np.ndarray | None = None,
                       nbytes: np.ndarray | None = None, shape_class: np.ndarray | None = None,
                       dims: np.ndarray | None = None, source_time_s: np.ndarray | None = None,
                       op: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel, ``g_t(R_t) / g_s(R_s)``: the target's typical time for its family at its roof time there,
    over the source's (:meth:`perfscope.device_models.Curve.time_s`), times the pair's own correction where
    the two devices ran the same work of the family (:class:`perfscope.device_models.PairCorrection`, along
    the roof time, or a GEMM's FLOPs per byte from ``flops`` and ``nbytes``, and its shape class from
    ``shape_class`` where the correction has a class term, each GEMM's (batch, M, N) from ``dims`` where it
    has a wave term, its time on the source from ``source_time_s`` where it has a persistence term: its distance
    from the source's curve, and the median of those distances over the family's kernels, the run's level, where
    it has a run-level term, its operator from ``op`` where it has an op term); and the family whose curves were
    used (a :data:`perfscope.device_models.FALLBACK` where a device lacks its own, else the family's curve
    over every GPU; "" and NaN where there is none)."""
    ratio = np.full(len(family), np.nan)
    used = np.full(len(family), "", object)
    fam = pd.Series(np.asarray(family, object))
    for name, idx in fam.groupby(fam, sort=False).indices.items():
        cs, fs = models.curve(source, str(name))
        ct, ft = models.curve(target, str(name))
        if cs is None or ct is None:
            continue
        t_src = None if source_time_s is None else np.asarray(source_time_s, np.float64)[idx]
        ratio[idx], dist, bound = curve_step(cs, ct, roof_src_s[idx], roof_tgt_s[idx], t_src)
        resid = None if t_src is None else dist
        corr = models.pair_correction(source.device, target.device, str(name))
        # the run's level: these kernels are one run of this family on the source (a run-level term)
        run = (np.full(len(idx), run_level(resid, roof_src_s[idx])) if corr is not None and corr.uses_run
               and resid is not None else None)
        if corr is not None:
            ratio[idx] *= corr.factor(roof_src_s[idx], None if flops is None else np.asarray(flops, np.float64)[idx],
                                      None if nbytes is None else np.asarray(nbytes, np.float64)[idx],
                                      None if shape_class is None else np.asarray(shape_class, object)[idx],
                                      None if dims is None else np.asarray(dims, np.float64).reshape(-1, 3)[idx],
                                      resid, run, None if op is None else np.asarray(op, object)[idx])
        if t_src is not None:  # never under the target's floor (floor_bound_s)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio[idx] = at_least(ratio[idx], bound / t_src)
        used[idx] = fs if fs == ft else f"{fs}/{ft}"
    return ratio, used


def curve_ratio(curve: pd.DataFrame, n: np.ndarray, k: np.ndarray, dtype: np.ndarray, m_old: np.ndarray,
                m_new: np.ndarray) -> np.ndarray:
    """Per kernel, ``curve(m_new) / curve(m_old)`` on its weight's measured GEMM size curve (the Report's
    ``gemm_curve``: time against rows for one weight, linear between the measured rows); NaN where the
    kernel's weight (N, K, dtype) has no curve or either row count lies outside the measured rows (no
    extrapolation: the family's line takes those)."""
    out = np.full(len(n), np.nan)
    if not len(curve) or not len(n):
        return out
    dtype = np.asarray(dtype, object)
    for (cn, ck, cd), g in curve.groupby(["n", "k", "dtype"], sort=False):
        g = g.sort_values("m")
        ms, ts = g["m"].to_numpy(np.float64, na_value=np.nan), g["time_ns"].to_numpy(np.float64, na_value=np.nan)
        if not (ts > 0).all():
            continue
        hit = ((n == cn) & (k == ck) & (dtype == cd) & (m_old >= ms[0]) & (m_old <= ms[-1])
               & (m_new >= ms[0]) & (m_new <= ms[-1]))
        if hit.any():
            out[hit] = np.interp(m_new[hit], ms, ts) / np.interp(m_old[hit], ms, ts)
    return out
