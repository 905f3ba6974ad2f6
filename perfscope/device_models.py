"""Device models: what a kernel of each family and size attains on each GPU, measured, as data.

Beside the datasheets (:mod:`perfscope.datasheets`, the peaks) and the measured roofs, a device model
says how close to those peaks a device's kernels come, from public measurements (the sources are named
in the data and in docs/whatif.md):

- per device and **kernel family** (:data:`FAMILIES`: GEMM by precision, attention prefill / decode,
  elementwise, reduction / norm, copy, collective, other) a **curve** of ``log(T / R)`` against
  ``log10 R``, where ``R`` is the kernel's roof time on that device (``F / P + B / BW`` at its datasheet
  peaks; a GEMM's the 2-norm of the two). ``exp(-curve)`` is the attainable efficiency at that size:
  a 5 us MI300X elementwise kernel reaches a smaller share of its peak than a 5 ms one;
- per device and family a **kernel-time floor**: the shortest time a kernel of that family took there,
  whatever its work (below the measured sizes the curve is not extrapolated; the floor holds);
- per device and runtime the **launch cost** (the host's launch call, median) and the GPU's own gap
  between back-to-back kernels, where a trace measured them;
- per ordered pair of devices and family, where both ran the same work in one dataset, a **pair
  correction** (:class:`PairCorrection`): what the pair's own measurements say beyond the difference of
  the two curves, along a GEMM's arithmetic intensity or any other family's roof time;
- the **bands**: per family group and vendor pair, the p10 and p90 of the model's own held-out
  validation error (``benchmarks/whatif_crossgpu.py``), so every projected number carries a range.

The data is ``device_models.json`` beside this module, written by ``python benchmarks/whatif_crossgpu.py
--write`` (the fit, :mod:`perfscope.analysis.projection.devicefit`); it is read here and nowhere else. A
device without a model of its own takes the nearest measured device of its vendor and generation
(:meth:`DeviceModels.resolve`), and says so.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .shapes import parse_shapes

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from .datasheets import Datasheet
    from .device import DeviceSpec

DATA = Path(__file__).with_name("device_models.json")
"""The fitted models (``python benchmarks/whatif_crossgpu.py --write`` rewrites it)."""

FAMILIES = ("gemm-fp32", "gemm-tf32", "gemm-bf16", "gemm-fp16", "gemm-fp8", "gemm-int8", "attention-prefill",
            "attention-decode", "elementwise", "reduction", "copy", "collective", "other")
"""Kernel families a device model has a curve for (:func:`kernel_family`)."""

GROUPS = {"gemm": "gemm", "attention": "attention"}
"""A family's group (its first word where listed here, else ``other``): the bands are per group."""

FALLBACK = {"gemm-bf16": ("gemm-fp16",), "gemm-fp16": ("gemm-bf16",), "gemm-fp8": ("gemm-bf16", "gemm-fp16"),
            "gemm-int8": ("gemm-fp8", "gemm-bf16", "gemm-fp16"), "gemm-tf32": ("gemm-bf16", "gemm-fp16"),
            "copy": ("elementwise",), "elementwise": ("copy",), "reduction": ("elementwise",),
            "other": ("elementwise",)}
"""Where a device has no curve for a family, the families taken instead, in order (a curve is an
efficiency relative to the device's own peak for that precision, so bf16 and fp16 GEMMs share one)."""

DECODE_INTENSITY = 16.0
"""An attention kernel below this FLOP/byte (one query token per sequence, or a few) is a decode kernel
when its step's phase is unknown."""

BIN_LO = -10.0
BIN_STEP = 0.5
N_BINS = 21
"""The curve's knots: log10 of the roof time in seconds, -10 (0.1 ns) to 0 (1 s) by half decades."""

INTENSITY_LO = -1.0
INTENSITY_STEP = 0.25
"""A GEMM pair correction's knots (:class:`PairCorrection`): log10 of its FLOPs per DRAM byte, -1 (0.1) to 4
(10,000) by quarter decades, :data:`N_BINS` of them. A bf16 GEMM's intensity is about its smallest side (M,
N or the batch's rows): 1 for a GEMV, 4-5 for a skinny GEMM, hundreds for a square one."""

GAP_NS_DEFAULT = 3_000.0


def family_group(family: str) -> str:
    """``gemm``, ``attention`` or ``other``."""
    return GROUPS.get(family.split("-")[0], "other")


def kernel_family(category: Sequence[Any], precision: Sequence[Any], flops: np.ndarray, nbytes: np.ndarray,
                  phase: Sequence[Any] | None = None) -> np.ndarray:
    """Each kernel's family (:data:`FAMILIES`), vectorised: a GEMM by its precision, attention by its phase
    (decode / verify steps: decode, prefill steps: prefill; no phase: its FLOPs per byte below
    :data:`DECODE_INTENSITY` is decode), norm / softmax / reduction: ``reduction``, memory and views:
    ``copy``, communication: ``collective``."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        low = (np.where(b > 0, f / b, np.inf) < DECODE_INTENSITY).astype(np.int64)
    n = len(f)
    parts = []
    for values, missing in ((category, "other"), (precision, ""), (phase, "")):
        if values is None:
            parts.append((np.zeros(n, np.int64), [missing]))
            continue
        codes, uniq = pd.factorize(pd.Series(np.asarray(values, object), dtype=object), use_na_sentinel=True)
        labels = [str(u) for u in uniq] + [missing]  # code -1 (None, NaN, NA): the last
        parts.append((np.where(codes < 0, len(uniq), codes).astype(np.int64), labels))
    (c_cat, l_cat), (c_prec, l_prec), (c_ph, l_ph) = parts
    # one decision per distinct (category, precision, phase, low intensity): a handful, whatever the kernels
    key = ((c_cat * len(l_prec) + c_prec) * len(l_ph) + c_ph) * 2 + low
    uniq_keys, inverse = np.unique(key, return_inverse=True)
    names = []
    for k in uniq_keys:
        k, lo = divmod(int(k), 2)
        k, ph = divmod(k, len(l_ph))
        ca, pr = divmod(k, len(l_prec))
        names.append(_family(l_cat[ca], l_prec[pr], l_ph[ph], bool(lo)))
    return np.asarray(names, object)[inverse.reshape(-1)] if n else np.zeros(0, object)


def _family(cat: str, prec: str, phase: str, low: bool) -> str:
    if cat == "gemm":
        return f"gemm-{prec if prec in ('fp32', 'tf32', 'bf16', 'fp16', 'fp8', 'int8') else 'bf16'}"
    if cat == "attention":
        decode = phase in ("decode", "verify", "draft") or (phase != "prefill" and bool(low))
        return "attention-decode" if decode else "attention-prefill"
    return {"elementwise": "elementwise", "norm": "reduction", "softmax": "reduction", "reduction": "reduction",
            "memory": "copy", "view": "copy", "comm": "collective"}.get(cat, "other")


def knots() -> np.ndarray:
    """The curve's knots, log10 seconds."""
    return BIN_LO + BIN_STEP * np.arange(N_BINS)


def interp_weights(log_r: np.ndarray, lo: float = BIN_LO, step: float = BIN_STEP) -> tuple[np.ndarray, np.ndarray]:
    """(lower knot index, weight of the upper knot) of each log10 roof time (or any log10 value on knots
    ``lo + step * k``), clamped to the knots."""
    p = np.clip((np.asarray(log_r, np.float64) - lo) / step, 0.0, N_BINS - 1 - 1e-9)
    i = np.floor(p).astype(np.int64)
    return i, p - i


@dataclass(frozen=True)
class Curve:
    """One device's curve for one family.

    Attributes:
        a: ``log(T / R)`` at each knot (:func:`knots`); ``exp(-a)`` is the attainable efficiency.
        counts: measurements near each knot.
        lo, hi: log10 roof times of the smallest and largest kernel of the family measured on any GPU:
            outside them the curve is held at its end value (the floor takes over below).
        floor_ns: the shortest measured kernel of the family on the device: in a profiler trace where one
            holds the family (:attr:`trace_floor_ns`), else in a published table (:attr:`table_floor_ns`),
            else the family's floor over the GPUs measured.
        rows: how many (distinct) kernels it was fitted on.
        sources: the datasets it was fitted from.
        measured_lo, measured_hi: log10 roof times of this device's own smallest and largest kernel:
            outside them its curve returns to the family's curve over every GPU.
        trace_floor_ns: the shortest kernel of the family in a profiler trace of the device (NaN: none).
        table_floor_ns: the shortest in a published table timed on the GPU (NaN: none). A table's tuned
            kernels (aiconfigurator's 2.5 us GEMMs on the H100) run under a trace's eager ones of the same
            size (5-6 us), so two devices' floors are compared within one kind (:func:`pair_floors_ns`).
    """

    a: tuple[float, ...]
    counts: tuple[int, ...]
    lo: float
    hi: float
    floor_ns: float
    rows: int
    sources: tuple[str, ...] = ()
    measured_lo: float = math.nan
    measured_hi: float = math.nan
    trace_floor_ns: float = math.nan
    table_floor_ns: float = math.nan

    def time_s(self, roof_s: np.ndarray, floor_ns: float | None = None) -> np.ndarray:
        """The time the device's typical kernel of this family takes at roof time ``roof_s``:
        ``max(floor, R exp(a(log10 R)))`` (``floor_ns``, else :attr:`floor_ns`); a kernel with no work
        (``R`` = 0) takes the floor; NaN where ``R`` is unknown."""
        floor = self.floor_ns if floor_ns is None or math.isnan(floor_ns) else floor_ns
        r = np.asarray(roof_s, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            lr = np.clip(np.log10(np.where(r > 0, r, np.nan)), self.lo, self.hi)
        i, w = interp_weights(np.nan_to_num(lr, nan=BIN_LO))
        a = np.asarray(self.a, np.float64)
        val = a[i] * (1.0 - w) + a[np.minimum(i + 1, N_BINS - 1)] * w
        t = np.maximum(np.where(r > 0, r, 0.0) * np.exp(val), floor * 1e-9)
        return np.where(r >= 0, t, np.nan)

    def efficiency(self, roof_s: np.ndarray) -> np.ndarray:
        """``R / time`` at each roof time: the attainable share of the datasheet peak."""
        r = np.asarray(roof_s, np.float64)
        return r / self.time_s(r)

    def to_dict(self) -> dict[str, Any]:
        return {"a": [round(float(x), 5) for x in self.a], "counts": [int(c) for c in self.counts],
                "lo": round(float(self.lo), 4), "hi": round(float(self.hi), 4),
                "floor_ns": round(float(self.floor_ns), 1), "rows": int(self.rows), "sources": list(self.sources),
                "measured_lo": round(float(self.measured_lo), 4), "measured_hi": round(float(self.measured_hi), 4),
                "trace_floor_ns": _round_or_none(self.trace_floor_ns),
                "table_floor_ns": _round_or_none(self.table_floor_ns)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Curve:
        return cls(tuple(float(x) for x in d["a"]), tuple(int(c) for c in d["counts"]), float(d["lo"]),
                   float(d["hi"]), float(d["floor_ns"]), int(d["rows"]), tuple(d.get("sources", ())),
                   float(d.get("measured_lo", math.nan)), float(d.get("measured_hi", math.nan)),
                   _float_or_nan(d.get("trace_floor_ns")), _float_or_nan(d.get("table_floor_ns")))


def _round_or_none(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 1)


def _float_or_nan(x: Any) -> float:
    return math.nan if x is None else float(x)


def pair_floors_ns(source: Curve, target: Curve, prefer: str = "trace") -> tuple[float, float]:
    """The floors of one family on two devices, of one kind of measurement on both where both have it:
    ``prefer`` (``trace``: profiler traces, what a user's trace is; ``table``: published tables, for a
    table's own rows), else the other kind, else each curve's :attr:`Curve.floor_ns`. A floor is its
    harness's as much as its GPU's (the H100's shortest bf16 GEMM: 2.5 us in aiconfigurator's tuned table,
    5.1 us in an eager trace), so a ratio of floors of two kinds would carry the harness."""
    kinds = ("trace_floor_ns", "table_floor_ns")
    for kind in (kinds if prefer == "trace" else kinds[::-1]):
        fs, ft = getattr(source, kind), getattr(target, kind)
        if not (math.isnan(fs) or math.isnan(ft)):
            return fs, ft
    return source.floor_ns, target.floor_ns


def floor_bound_s(source_time_s: np.ndarray, floor_s_ns: float, floor_t_ns: float) -> np.ndarray:
    """The shortest a kernel measured ``source_time_s`` on the source may be projected on the target: the
    target's floor of its family (the shortest kernel of the family measured there, whatever its work),
    times its own time over the source's floor where it ran under that floor (another harness's shorter
    kernels keep their ratio to it). Applied after a pair's correction, which is fitted along work or time
    and may otherwise carry a short kernel below anything the target was measured to run (H100 -> MI300X
    attention: 9-15 us kernels projected at 17-28 us, where the MI300X's shortest took 27 us); NaN where a
    floor is unknown (no bound)."""
    t = np.asarray(source_time_s, np.float64)
    if not (floor_s_ns > 0 and floor_t_ns > 0):
        return np.full(t.shape, np.nan)
    with np.errstate(invalid="ignore"):
        return floor_t_ns * 1e-9 * np.minimum(1.0, t / (floor_s_ns * 1e-9))


def curve_step(source: Curve, target: Curve, roof_src_s: np.ndarray, roof_tgt_s: np.ndarray,
               source_time_s: np.ndarray | None = None, prefer: str = "trace"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kernels of one family moved from one device to another along the two devices' curves, before any pair
    correction: ``g_t(R_t) / g_s(R_s)`` at the floors of one kind of measurement (:func:`pair_floors_ns`,
    ``prefer``), each kernel's distance from the source's curve ``log(T_s / g_s(R_s))`` (a persistence or
    run-level term's input) and the shortest time it may be projected at (:func:`floor_bound_s`); the last two
    NaN where ``source_time_s`` is None. The one step that ``perfscope whatif``
    (:func:`perfscope.analysis.projection.times.device_model_ratio`) and the held-out check
    (:mod:`perfscope.analysis.projection.devicefit`) both take, so the check measures what a user runs."""
    fl_s, fl_t = pair_floors_ns(source, target, prefer)
    n = len(np.atleast_1d(roof_src_s))
    with np.errstate(divide="ignore", invalid="ignore"):
        g_s = source.time_s(roof_src_s, fl_s)
        ratio = target.time_s(roof_tgt_s, fl_t) / g_s
        if source_time_s is None:
            return ratio, np.full(n, np.nan), np.full(n, np.nan)
        t = np.asarray(source_time_s, np.float64)
        return ratio, np.log(t / g_s), floor_bound_s(t, fl_s, fl_t)


def at_least(values: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """``values`` raised to ``bound`` where the bound is known (:func:`floor_bound_s`); a NaN value (nothing
    projected) stays NaN, a NaN bound leaves its value as it is."""
    v = np.asarray(values, np.float64)
    return np.where(np.isnan(v), v, np.fmax(v, bound))


SHAPE_CLASSES = ("batched-small", "k-tiny", "gemv", "skinny", "square")
"""A GEMM's shape class (:func:`gemm_shape_class`): the kernel each vendor's library picks differs by class, not
only by FLOPs per byte (a term of a :class:`PairCorrection` where the inner cross-validation picks it)."""


def gemm_dims(op: str, shapes: Sequence[Any]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM op from its input shapes as a trace records them (``aten::mm`` ``[[M, K],
    [K, N]]``, ``aten::addmm`` / ``baddbmm`` with the bias first, ``aten::bmm`` ``[[B, M, K], [B, K, N]]``,
    ``aten::linear`` ``[[..., K], [N, K]]``; a ``matmul`` of a 3-D by a 2-D tensor folds the batch into M);
    None where the shapes do not say."""
    name = str(op).split("::")[-1]
    dims = [list(d) for d in shapes if isinstance(d, (list, tuple))]
    first = 1 if name in ("addmm", "baddbmm", "addbmm", "addmv") else 0
    mats = [d for d in dims[first:first + 2]]
    if len(mats) < 2 or any(len(d) < 1 for d in mats):
        return None
    a, b = mats
    try:
        if name == "linear":
            k = int(a[-1])
            m = int(np.prod(a[:-1])) if len(a) > 1 else 1
            n = int(b[0]) if len(b) == 2 else 1
            return 1, m, n, k
        if len(a) < 2:
            return None
        m, k = int(a[-2]), int(a[-1])
        n = int(b[-1]) if len(b) >= 2 else 1
        if len(b) <= 2:  # a batch of rows against one matrix: one GEMM of all the rows
            return 1, int(np.prod(a[:-1])), n, k
        return int(np.prod(a[:-2])) if len(a) > 2 else 1, m, n, k
    except (TypeError, ValueError):
        return None


def gemm_shape_class(op: str, shapes: Sequence[Any] | str | None) -> str:
    """A GEMM's shape class (:data:`SHAPE_CLASSES`), "" where its shapes do not say: many small matrices
    (``batched-small``: 64+ matrices of at most 64 x 64 outputs), a tiny inner dimension (``k-tiny``: K <= 16,
    an outer product), a GEMV (``gemv``: M or N <= 2), a skinny GEMM (``skinny``: M or N <= 32), else
    ``square``. ``shapes`` as a list, or its text (``[[141, 512], [512, 512]]``)."""
    if shapes is None or (isinstance(shapes, float) and math.isnan(shapes)):
        return ""
    if isinstance(shapes, str):
        shapes = parse_shapes(shapes)
        if shapes is None:
            return ""
    d = gemm_dims(op, shapes)
    if d is None:
        return ""
    batch, m, n, k = d
    if batch >= 64 and m * n <= 64 * 64:
        return "batched-small"
    if k <= 16:
        return "k-tiny"
    if min(m, n) <= 2:
        return "gemv"
    if min(m, n) <= 32:
        return "skinny"
    return "square"


WAVE_TILES = {"nvidia": ((128, 128),), "amd": ((128, 128), (256, 128), (256, 256))}
"""A GEMM's nominal output tile (rows x columns) per vendor, the candidates of a pair correction's wave term
(:func:`wave_fill`; the inner cross-validation picks one, :data:`perfscope.analysis.projection.devicefit.CANDIDATES`).
What the committed traces' GEMM kernels name: cuBLAS on the H100 ``sm90_xmma_gemm_..._tilesize128x128x64`` (every
large GEMM of the TimeSformer and Qwen traces; ``64x64x64`` for BERT-small's), hipBLASLt on the MI300X
``Cijk_..._MT256x128x64`` / ``MT256x192x64`` / ``MT256x224x64`` / ``MT128x256x32`` (TimeSformer's) and ``MT16x16x128``
to ``MT128x144x64`` (BERT-small's): each library picks its tile by shape; one nominal tile is the model's
simplification."""


def wave_fill(batch: np.ndarray, m: np.ndarray, n: np.ndarray, tile: tuple[int, int], units: int) -> np.ndarray:
    """Each GEMM's wave (tile) occupancy on a device of ``units`` SMs / CUs with output tiles of ``tile``:
    ``tiles = batch * ceil(M / tm) * ceil(N / tn)`` spread over ``ceil(tiles / units)`` waves of ``units``
    slots, ``fill = tiles / (ceil(tiles / units) * units)`` (1: every slot of every wave busy). NaN where a
    dimension is unknown (NaN or not positive)."""
    b, mm, nn = (np.asarray(x, np.float64) for x in (batch, m, n))
    ok = np.isfinite(b) & np.isfinite(mm) & np.isfinite(nn) & (b > 0) & (mm > 0) & (nn > 0) & (units > 0)
    with np.errstate(invalid="ignore"):
        tiles = np.where(ok, b, 1.0) * np.ceil(np.where(ok, mm, 1.0) / tile[0]) * np.ceil(np.where(ok, nn, 1.0) / tile[1])
        fill = tiles / (np.ceil(tiles / units) * units) if units > 0 else np.full(len(tiles), np.nan)
    return np.where(ok, fill, np.nan)


def _each_distinct(op: Sequence[Any] | np.ndarray, shapes: Sequence[Any] | np.ndarray,
                   family: Sequence[Any] | np.ndarray | None, of: Callable[[str, Any], Any]
                   ) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """``of(op, shapes)`` once per distinct op and shapes of the kernels of a GEMM family (every kernel where
    ``family`` is None): (their positions, each one's distinct code, the values per code)."""
    ops = np.asarray(op, object)
    sh = np.asarray(shapes, object)
    at = (np.arange(len(ops)) if family is None
          else np.flatnonzero(np.char.startswith(np.asarray(family, object).astype(str), "gemm")))
    if not len(at):
        return at, np.zeros(0, np.int64), []
    key = pd.Series(ops[at]).astype(str) + "\x00" + pd.Series(sh[at]).astype(str)
    codes, uniq = pd.factorize(key)
    first = np.zeros(len(uniq), np.int64)
    first[codes[::-1]] = np.arange(len(codes))[::-1]
    return at, codes, [of(str(ops[at[i]]), sh[at[i]]) for i in first]


def _bmn(op: str, shapes: Any) -> tuple[float, float, float]:
    parsed = parse_shapes(shapes) if isinstance(shapes, str) else (shapes if isinstance(shapes, (list, tuple)) else None)
    d = gemm_dims(op, parsed) if parsed is not None else None
    return (float(d[0]), float(d[1]), float(d[2])) if d is not None else (math.nan,) * 3


def gemm_bmn(op: Sequence[Any] | np.ndarray, shapes: Sequence[Any] | np.ndarray,
             family: Sequence[Any] | np.ndarray | None = None) -> np.ndarray:
    """(batch, M, N) of each kernel's GEMM (:func:`gemm_dims`, once per distinct op and shapes; ``shapes`` as
    lists or their text), an array of shape (n, 3); NaN for a kernel of a family other than a GEMM (``family``
    given) or whose shapes do not say."""
    out = np.full((len(np.asarray(op, object)), 3), np.nan)
    at, codes, vals = _each_distinct(op, shapes, family, _bmn)
    if len(at):
        out[at] = np.array(vals, np.float64).reshape(-1, 3)[codes]
    return out


def shape_classes(op: Sequence[Any] | np.ndarray, shapes: Sequence[Any] | np.ndarray,
                  family: Sequence[Any] | np.ndarray | None = None) -> np.ndarray:
    """:func:`gemm_shape_class` of each kernel (once per distinct op and shapes); "" for a kernel of a family
    other than a GEMM (``family`` given) or without shapes."""
    out = np.full(len(np.asarray(op, object)), "", object)
    at, codes, vals = _each_distinct(op, shapes, family, lambda o, s: gemm_shape_class(
        o, s if isinstance(s, (str, list, tuple)) else None))
    if len(at):
        out[at] = np.array(vals, object)[codes]
    return out


def _clipped_term(coef: float, x: np.ndarray | None, lo: float, hi: float, n: int) -> np.ndarray:
    """``coef x clip(x, lo, hi)`` per kernel (a persistence or run-level term); 0 where ``x`` is unknown, or
    everywhere when there is no term (``coef`` 0) or no ``x``."""
    if coef == 0.0 or x is None:
        return np.zeros(n)
    d = np.asarray(x, np.float64)
    ok = np.isfinite(d)
    return np.where(ok, coef * np.clip(np.where(ok, d, 0.0), lo, hi), 0.0)


@dataclass(frozen=True)
class PairCorrection:
    """What one ordered pair of devices does for a family beyond the difference of their curves, measured on
    work both ran (the same key in one dataset): ``log(T_target / projected)`` as a smooth function of the
    work's position on an axis (the source's log10 roof time, ``roof``, or a GEMM's log10 FLOPs per byte,
    ``intensity``), optionally plus a second axis's function and a level per GEMM shape class
    (:data:`SHAPE_CLASSES`), each pulled to 0 by a ridge. Which of these terms a pair and family gets
    (:attr:`choice`) is picked by a cross-validation inside the data it is fitted on
    (:func:`perfscope.analysis.projection.devicefit.select_pair_choices`); ``none`` is a correction of 1.
    The curves of two devices can come from data of other kinds (the A100's large elementwise efficiency from
    vidur's small kernels extrapolated, the MI210's from LLMCompass's sweeps); the pair's own measurements
    say how the two compare in one harness.

    Attributes:
        axis: ``roof`` (log10 roof time on the source, :data:`BIN_LO`, :data:`BIN_STEP`), ``intensity``
            (log10 FLOP/byte, :data:`INTENSITY_LO`, :data:`INTENSITY_STEP`) or ``none`` (no axis term).
        a: the correction (natural log) at each knot of ``axis``.
        lo, hi: the measured range on the axis: outside it the end value holds.
        rows: how many paired keys it was fitted on.
        sources: the datasets they came from.
        axis2, a2, lo2, hi2: a second axis's term ("": none).
        classes: shape class -> its level (natural log), where the choice has a class term.
        choice: the terms picked (``intensity``, ``intensity+class``, ``intensity+roof``, ``none``...).
        wave_tiles: the nominal output tile (rows, columns) on the source and on the target, where the choice
            has a wave term (``wave128x128/256x128``: the NVIDIA / AMD tile); () where it has none.
        wave_units: the SMs / CUs of the source and the target (their datasheets).
        wave_coef: the wave term's weight: ``log(fill_source / fill_target)`` (:func:`wave_fill`) times it is
            added (1: the physical factor, time in proportion to the waves; a ``wave~`` choice fits it).
        keep_coef: the persistence term's weight (a ``keep`` choice; 0: none): the kernel's own distance from
            its family's curve on the source, ``d = log(T_source / g_source(R_source))``, times it is added, so
            the kernel keeps ``1 + keep_coef`` of that distance on the target (0: all of it, the curves' rule;
            -1: none, the target's typical time). A shape (or a harness) that is slow on one vendor's library
            is only partly slow on another's.
        keep_lo, keep_hi: the measured range of ``d``: outside it the end value holds.
        run_coef: the run-level term's weight (a ``run`` choice; 0: none): the level of the kernel's run on
            the source, ``D`` = the median of ``d`` over the distinct works of its family in the same trace or
            table (:func:`run_level`), times it is added. With a ``keep`` term beside it, a kernel keeps ``1 +
            keep_coef`` of its own departure from its run and ``1 + keep_coef + run_coef`` of its run's level: a
            harness (library, eager or tuned kernels) that is fast on one vendor need not be on another.
        run_lo, run_hi: the measured range of ``D``: outside it the end value holds.
        ops: operator -> its level (natural log), where the choice has an op term: what the pair measured of
            that operator (``aten::add``, ``aten::bmm``, ``_C::silu_and_mul``) beyond the rest of the
            correction, pulled to 0 by a ridge; a kernel of another operator gets none. An operator whose
            kernel one vendor's library runs well and another's does not, on work of the same size.
    """

    axis: str
    a: tuple[float, ...]
    lo: float
    hi: float
    rows: int
    sources: tuple[str, ...] = ()
    axis2: str = ""
    a2: tuple[float, ...] = ()
    lo2: float = math.nan
    hi2: float = math.nan
    classes: Mapping[str, float] = field(default_factory=dict)
    choice: str = ""
    wave_tiles: tuple[tuple[int, int], ...] = ()
    wave_units: tuple[int, ...] = ()
    wave_coef: float = 0.0
    keep_coef: float = 0.0
    keep_lo: float = math.nan
    keep_hi: float = math.nan
    run_coef: float = 0.0
    run_lo: float = math.nan
    run_hi: float = math.nan
    ops: Mapping[str, float] = field(default_factory=dict)

    def knots(self) -> tuple[float, float]:
        return axis_knots(self.axis)

    @property
    def uses_classes(self) -> bool:
        return bool(self.classes)

    @property
    def uses_keep(self) -> bool:
        return self.keep_coef != 0.0 and math.isfinite(self.keep_lo) and math.isfinite(self.keep_hi)

    def keep_log(self, source_resid: np.ndarray | None, n: int) -> np.ndarray:
        """The persistence term (natural log) of each kernel from its distance ``source_resid`` from its
        family's curve on the source (``log(T_source / g_source(R_source))``), clipped to the measured range;
        0 where it is unknown or the correction has no such term."""
        return _clipped_term(self.keep_coef if self.uses_keep else 0.0, source_resid, self.keep_lo, self.keep_hi, n)

    @property
    def uses_run(self) -> bool:
        return self.run_coef != 0.0 and math.isfinite(self.run_lo) and math.isfinite(self.run_hi)

    def run_log(self, source_run: np.ndarray | None, n: int) -> np.ndarray:
        """The run-level term (natural log) of each kernel from its run's level ``source_run`` on the source
        (:func:`run_level`), clipped to the measured range; 0 where it is unknown or there is no such term."""
        return _clipped_term(self.run_coef if self.uses_run else 0.0, source_run, self.run_lo, self.run_hi, n)

    @property
    def uses_wave(self) -> bool:
        return len(self.wave_tiles) == 2 and self.wave_coef != 0.0

    def wave_log(self, dims: np.ndarray | None, n: int) -> np.ndarray:
        """``log(fill_source / fill_target)`` of each GEMM (``dims``: (batch, M, N) rows, :func:`gemm_bmn`), 0
        where its dimensions are unknown or the correction has no wave term."""
        if not self.uses_wave or dims is None or not len(dims):
            return np.zeros(n)
        d = np.asarray(dims, np.float64).reshape(-1, 3)
        fs = wave_fill(d[:, 0], d[:, 1], d[:, 2], self.wave_tiles[0], self.wave_units[0])
        ft = wave_fill(d[:, 0], d[:, 1], d[:, 2], self.wave_tiles[1], self.wave_units[1])
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.log(fs / ft)
        return np.where(np.isfinite(x), x, 0.0)

    def log_factor(self, roof_src_s: np.ndarray, flops: np.ndarray | None = None, nbytes: np.ndarray | None = None,
                   shape_class: np.ndarray | None = None, dims: np.ndarray | None = None,
                   source_resid: np.ndarray | None = None, source_run: np.ndarray | None = None,
                   op: np.ndarray | None = None) -> np.ndarray:
        """The correction (natural log) of each kernel: 0 where its position on an axis is unknown (``dims``:
        each GEMM's (batch, M, N), for a wave term; ``source_resid``: its distance from its family's curve on
        the source, for a persistence term, :meth:`keep_log`; ``source_run``: its run's level there, for a
        run-level term, :meth:`run_log`; ``op``: its operator, for an op term)."""
        n = len(np.atleast_1d(roof_src_s))
        out = self.wave_coef * self.wave_log(dims, n) if self.uses_wave else np.zeros(n)
        out = out + self.keep_log(source_resid, n) + self.run_log(source_run, n)
        for axis, a, lo, hi in ((self.axis, self.a, self.lo, self.hi), (self.axis2, self.a2, self.lo2, self.hi2)):
            if axis in ("", "none") or not len(a):
                continue
            x = pair_axis(axis, roof_src_s, flops, nbytes)
            ok = np.isfinite(x)
            klo, step = axis_knots(axis)
            i, w = interp_weights(np.clip(np.where(ok, x, lo), lo, hi), klo, step)
            arr = np.asarray(a, np.float64)
            out += np.where(ok, arr[i] * (1.0 - w) + arr[np.minimum(i + 1, N_BINS - 1)] * w, 0.0)
        for table, keys in ((self.classes, shape_class), (self.ops, op)):
            if table and keys is not None:
                levels = pd.Series(np.asarray(keys, object)).map(dict(table))
                out += levels.astype(np.float64).fillna(0.0).to_numpy()
        return out

    def factor(self, roof_src_s: np.ndarray, flops: np.ndarray | None = None, nbytes: np.ndarray | None = None,
               shape_class: np.ndarray | None = None, dims: np.ndarray | None = None,
               source_resid: np.ndarray | None = None, source_run: np.ndarray | None = None,
               op: np.ndarray | None = None) -> np.ndarray:
        """``exp(correction)`` of each kernel (1 where its position on the axis is unknown)."""
        return np.exp(self.log_factor(roof_src_s, flops, nbytes, shape_class, dims, source_resid, source_run, op))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"axis": self.axis, "a": [round(float(x), 5) for x in self.a], "lo": round(float(self.lo), 4),
                             "hi": round(float(self.hi), 4), "rows": int(self.rows), "sources": list(self.sources)}
        if self.axis2:
            d.update({"axis2": self.axis2, "a2": [round(float(x), 5) for x in self.a2], "lo2": round(float(self.lo2), 4),
                      "hi2": round(float(self.hi2), 4)})
        if self.classes:
            d["classes"] = {k: round(float(v), 5) for k, v in sorted(self.classes.items())}
        if self.choice:
            d["choice"] = self.choice
        if self.uses_wave:
            d.update({"wave_tiles": [list(t) for t in self.wave_tiles], "wave_units": list(self.wave_units),
                      "wave_coef": round(float(self.wave_coef), 5)})
        if self.uses_keep:
            d.update({"keep_coef": round(float(self.keep_coef), 5), "keep_lo": round(float(self.keep_lo), 4),
                      "keep_hi": round(float(self.keep_hi), 4)})
        if self.ops:
            d["ops"] = {k: round(float(v), 5) for k, v in sorted(self.ops.items())}
        if self.uses_run:
            d.update({"run_coef": round(float(self.run_coef), 5), "run_lo": round(float(self.run_lo), 4),
                      "run_hi": round(float(self.run_hi), 4)})
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PairCorrection:
        return cls(str(d["axis"]), tuple(float(x) for x in d["a"]), float(d["lo"]), float(d["hi"]), int(d["rows"]),
                   tuple(d.get("sources", ())), str(d.get("axis2", "")), tuple(float(x) for x in d.get("a2", ())),
                   float(d.get("lo2", math.nan)), float(d.get("hi2", math.nan)),
                   {str(k): float(v) for k, v in d.get("classes", {}).items()}, str(d.get("choice", "")),
                   tuple((int(t[0]), int(t[1])) for t in d.get("wave_tiles", ())),
                   tuple(int(u) for u in d.get("wave_units", ())), float(d.get("wave_coef", 0.0)),
                   float(d.get("keep_coef", 0.0)), float(d.get("keep_lo", math.nan)), float(d.get("keep_hi", math.nan)),
                   float(d.get("run_coef", 0.0)), float(d.get("run_lo", math.nan)), float(d.get("run_hi", math.nan)),
                   {str(k): float(v) for k, v in d.get("ops", {}).items()})


def run_levels(resid: np.ndarray, work: np.ndarray, runs: pd.DataFrame) -> pd.Series:
    """Each run's level on its device for one family, indexed by ``runs``' columns (a run per distinct row of
    them, one row per kernel): the median, over the run's distinct works (``work``: a value per kernel that
    tells works apart, e.g. the roof time), of each work's median distance from the family's curve (``resid``:
    ``log(T / g(R))`` per kernel). A run with no finite distance has no entry. Each work counts once, as a table
    lists each shape once, however often a trace launched it."""
    d = np.asarray(resid, np.float64)
    ok = np.isfinite(d)
    keys = [runs[c].to_numpy(object)[ok] for c in runs.columns]
    if not ok.any():
        return pd.Series(dtype=np.float64)
    per_work = pd.Series(d[ok]).groupby([*keys, np.asarray(work)[ok]], sort=False).median()
    levels = per_work.groupby(level=list(range(len(keys))), sort=False).median()
    return levels.rename_axis(list(runs.columns))


def run_level(resid: np.ndarray, work: np.ndarray) -> float:
    """One run's level (:func:`run_levels`: all of ``resid`` is one run); NaN where none is finite."""
    levels = run_levels(resid, work, pd.DataFrame({"run": np.zeros(len(np.atleast_1d(resid)))}))
    return float(levels.iloc[0]) if len(levels) else math.nan


def axis_knots(axis: str) -> tuple[float, float]:
    """(first knot, step) of a correction's axis."""
    return (INTENSITY_LO, INTENSITY_STEP) if axis == "intensity" else (BIN_LO, BIN_STEP)


def pair_axis_name(family: str) -> str:
    """The axis a family's pair correction runs along: a GEMM's intensity, any other family's roof time."""
    return "intensity" if family.startswith("gemm") else "roof"


def pair_axis(axis: str, roof_src_s: np.ndarray, flops: np.ndarray | None = None,
              nbytes: np.ndarray | None = None) -> np.ndarray:
    """Each kernel's position on a correction's axis: log10 FLOP/byte (``intensity``; NaN without both) or
    log10 of its roof time on the source (``roof``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if axis == "intensity":
            if flops is None or nbytes is None:
                return np.full(len(np.atleast_1d(roof_src_s)), np.nan)
            f, b = np.asarray(flops, np.float64), np.asarray(nbytes, np.float64)
            return np.where((f > 0) & (b > 0), np.log10(f / np.where(b > 0, b, 1.0)), np.nan)
        r = np.asarray(roof_src_s, np.float64)
        return np.where(r > 0, np.log10(np.where(r > 0, r, 1.0)), np.nan)


@dataclass(frozen=True)
class DeviceModel:
    """One device's model: its curves per family, and its launch cost where measured.

    Attributes:
        device: the datasheet row it belongs to (``MI300X``, ``H100 SXM5 80 GB``).
        vendor: ``nvidia`` or ``amd``.
        generation: ``nvidia-9`` (compute capability major), ``amd-gfx94`` (the gfx arch's family).
        curves: family -> :class:`Curve`.
        launch_ns: the host's kernel-launch call, median, by runtime (``cuda``, ``hip``).
        gpu_gap_ns: the GPU's own gap between back-to-back kernels, median.
        sources: every dataset any part was fitted from.
    """

    device: str
    vendor: str
    generation: str
    curves: Mapping[str, Curve] = field(default_factory=dict)
    launch_ns: float | None = None
    gpu_gap_ns: float | None = None
    sources: tuple[str, ...] = ()

    def curve(self, family: str) -> tuple[Curve | None, str]:
        """The curve for ``family`` and the family it is (itself, else a :data:`FALLBACK`), or (None, "")."""
        for fam in (family, *FALLBACK.get(family, ())):
            if fam in self.curves:
                return self.curves[fam], fam
        return None, ""

    def to_dict(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "generation": self.generation,
                "curves": {k: c.to_dict() for k, c in sorted(self.curves.items())},
                "launch_ns": None if self.launch_ns is None else round(float(self.launch_ns), 1),
                "gpu_gap_ns": None if self.gpu_gap_ns is None else round(float(self.gpu_gap_ns), 1),
                "sources": list(self.sources)}

    @classmethod
    def from_dict(cls, device: str, d: Mapping[str, Any]) -> DeviceModel:
        return cls(device, str(d["vendor"]), str(d["generation"]),
                   {k: Curve.from_dict(c) for k, c in d.get("curves", {}).items()},
                   d.get("launch_ns"), d.get("gpu_gap_ns"), tuple(d.get("sources", ())))


@dataclass(frozen=True)
class Band:
    """The model's held-out error for one family group and vendor pair: projected x ``exp(q10)`` to
    projected x ``exp(q90)`` holds the truth 80% of the time on the validation rows.

    Attributes:
        group: ``gemm``, ``attention`` or ``other``.
        pair: ``nvidia->amd`` (source vendor -> target vendor).
        q10, q90: the p10 and p90 of ``log(measured / projected)`` on the held-out rows.
        rows: how many held-out rows.
        median_abs_pct, p90_abs_pct: the median and p90 of ``|projected / measured - 1|``, %.
    """

    group: str
    pair: str
    q10: float
    q90: float
    rows: int
    median_abs_pct: float
    p90_abs_pct: float

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "pair": self.pair, "q10": round(self.q10, 5), "q90": round(self.q90, 5),
                "rows": self.rows, "median_abs_pct": round(self.median_abs_pct, 2),
                "p90_abs_pct": round(self.p90_abs_pct, 2)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Band:
        return cls(str(d["group"]), str(d["pair"]), float(d["q10"]), float(d["q90"]), int(d["rows"]),
                   float(d["median_abs_pct"]), float(d["p90_abs_pct"]))


def generation_of(vendor: str, compute_capability: str | None, gfx_arch: str | None) -> str:
    """``nvidia-9`` of compute capability 9.0, ``amd-gfx94`` of gfx942: devices of one generation share
    their kernels' libraries and architecture."""
    if vendor == "amd" and gfx_arch:
        return f"amd-{gfx_arch[:-1]}"
    cc = str(compute_capability or "").split(".")[0]
    return f"{vendor}-{cc or '?'}"


def sheet_identity(sheet: Datasheet) -> tuple[str, str, str]:
    """(row model, vendor, generation) of a datasheet row."""
    return sheet.model, sheet.vendor, generation_of(sheet.vendor, sheet.compute_capability, sheet.gfx_arch)


def spec_identity(spec: DeviceSpec) -> tuple[str, str, str] | None:
    """(datasheet row, vendor, generation) of a device, from its datasheet row (by the row it was made
    from, else by its name and properties); None for a CPU or a device no row matches."""
    from .datasheets import DATASHEETS, find_datasheet

    if spec.kind == "cpu":
        return None
    model = spec.properties.get("datasheet")
    sheet = next((d for d in DATASHEETS if d.model == model), None) or find_datasheet(spec.name, spec.properties)
    return None if sheet is None else sheet_identity(sheet)


@dataclass(frozen=True)
class Resolved:
    """The model a device gets: its own, or a stand-in's (``note`` says which and why)."""

    model: DeviceModel
    device: str
    vendor: str
    stand_in: bool
    note: str


@dataclass(frozen=True)
class DeviceModels:
    """Every device model and the bands: the data of ``device_models.json``."""

    devices: Mapping[str, DeviceModel]
    bands: Sequence[Band] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    validation: Sequence[Mapping[str, Any]] = ()
    fitted_by: str = ""
    priors: Mapping[str, Curve] = field(default_factory=dict)
    """Per family, its curve over every GPU (what a GPU's own curve departs from, and what a GPU without a
    curve of the family takes)."""
    pairs: Mapping[str, Mapping[str, PairCorrection]] = field(default_factory=dict)
    """Per ordered device pair (``SOURCE -> TARGET``, the datasheet rows) and family: the pair's correction
    (:class:`PairCorrection`), where both devices measured work of that family in one dataset."""
    pair_selection: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Per family group (``gemm``, ``other``): the terms its pair corrections have (``choice``) and every
    candidate's inner cross-validation error (``scores_pct``), from
    :func:`perfscope.analysis.projection.devicefit.select_pair_choices`."""

    def pair_correction(self, source: str, target: str, family: str) -> PairCorrection | None:
        """The correction of ``source -> target`` for ``family`` (or a :data:`FALLBACK` family's); None where
        the two never ran the same work of it."""
        per = self.pairs.get(f"{source} -> {target}")
        if not per:
            return None
        return next((per[f] for f in (family, *FALLBACK.get(family, ())) if f in per), None)

    def curve(self, model: DeviceModel, family: str) -> tuple[Curve | None, str]:
        """A device's curve for ``family``: its own (or a :data:`FALLBACK` family's), else the family's
        curve over every GPU (``every GPU``), else (None, "")."""
        own, fam = model.curve(family)
        if own is not None:
            return own, fam
        if family in self.priors:
            return self.priors[family], "every GPU"
        return None, ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceModels:
        return cls({k: DeviceModel.from_dict(k, v) for k, v in d.get("devices", {}).items()},
                   tuple(Band.from_dict(b) for b in d.get("bands", ())), dict(d.get("sources", {})),
                   tuple(d.get("validation", ())), str(d.get("fitted_by", "")),
                   {k: Curve.from_dict(c) for k, c in d.get("priors", {}).items()},
                   {p: {f: PairCorrection.from_dict(c) for f, c in per.items()}
                    for p, per in d.get("pairs", {}).items()}, dict(d.get("pair_selection", {})))

    def to_dict(self) -> dict[str, Any]:
        return {"fitted_by": self.fitted_by, "knots_log10_s": [BIN_LO, BIN_STEP, N_BINS],
                "sources": dict(sorted(self.sources.items())),
                "devices": {k: m.to_dict() for k, m in sorted(self.devices.items())},
                "priors": {k: c.to_dict() for k, c in sorted(self.priors.items())},
                "pair_selection": {g: dict(v) for g, v in sorted(self.pair_selection.items())},
                "pairs": {p: {f: c.to_dict() for f, c in sorted(per.items())} for p, per in sorted(self.pairs.items())},
                "bands": [b.to_dict() for b in self.bands], "validation": list(self.validation)}

    def write(self, path: Path = DATA) -> Path:
        path.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n")
        return path

    def resolve(self, identity: tuple[str, str, str] | None) -> Resolved | None:
        """The model for a device (:func:`spec_identity`): its own; else the measured device of its vendor
        and generation with the most measurements; else the nearest generation of its vendor; else None."""
        if identity is None:
            return None
        model, vendor, gen = identity
        if model in self.devices:
            return Resolved(self.devices[model], model, vendor, False, "")
        same = [m for m in self.devices.values() if m.vendor == vendor]
        if not same:
            return None

        def size(m: DeviceModel) -> int:
            return sum(c.rows for c in m.curves.values())

        def gen_num(g: str) -> float:
            digits = "".join(ch for ch in g.split("-", 1)[-1] if ch.isdigit())
            return float(digits) if digits else math.inf

        want = gen_num(gen)
        best = min(same, key=lambda m: (m.generation != gen, abs(gen_num(m.generation) - want), -size(m)))
        why = "the same generation" if best.generation == gen else f"the nearest {vendor} generation measured"
        return Resolved(best, model, vendor, True,
                        f"{model} has no measured device model: {best.device}'s ({why}) stands in, its "
                        f"efficiencies taken against {model}'s own datasheet peaks")

    def band(self, family: str, source_vendor: str | None, target_vendor: str | None) -> Band | None:
        """The band for a family's group and the vendor pair; None where it was never validated."""
        if not source_vendor or not target_vendor:
            return None
        pair = f"{source_vendor}->{target_vendor}"
        group = family_group(family)
        return next((b for b in self.bands if b.pair == pair and b.group == group), None)


@functools.lru_cache(maxsize=1)
def device_models() -> DeviceModels:
    """The shipped models (``device_models.json``); empty when the file is absent."""
    if not DATA.is_file():
        return DeviceModels({})
    return DeviceModels.from_dict(json.loads(DATA.read_text()))


__all__ = [
    "BIN_LO",
    "BIN_STEP",
    "FAMILIES",
    "INTENSITY_LO",
    "INTENSITY_STEP",
    "N_BINS",
    "SHAPE_CLASSES",
    "WAVE_TILES",
    "Band",
    "Curve",
    "DeviceModel",
    "DeviceModels",
    "PairCorrection",
    "Resolved",
    "at_least",
    "axis_knots",
    "curve_step",
    "device_models",
    "family_group",
    "floor_bound_s",
    "gemm_bmn",
    "gemm_dims",
    "gemm_shape_class",
    "generation_of",
    "interp_weights",
    "kernel_family",
    "knots",
    "pair_axis",
    "pair_axis_name",
    "pair_floors_ns",
    "run_level",
    "run_levels",
    "shape_classes",
    "sheet_identity",
    "spec_identity",
    "wave_fill",
]
