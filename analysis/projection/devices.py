"""The device models in a projection: each kernel moved along its family's curves from the measured GPU to
the target (:mod:`perfscope.device_models`), the error band of every projected number, and the whole run
(kernel, busy and wall time; a table by family) that every projection reports, with or without steps.

A band is per kernel: its family group and the vendor pair (``nvidia->amd``) give the held-out error
(:class:`perfscope.device_models.Band`, the p10-p90 of ``log(measured / projected)``), and the kernel's
low and high are its projection times ``exp(q10)`` and ``exp(q90)``. A total's band is the sum of its
kernels' lows and highs (their errors taken as fully correlated: the widest the band can be), and a time
built from a timeline (busy, wall, a step) is the timeline rebuilt with every kernel at its low, then at
its high. A kernel whose pair or rule was never validated (the same GPU at another batch; an AMD target
from an AMD trace; a kernel of unknown cost) keeps its projection at both ends and is counted: the band
then says which share of the time it covers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.datasheets import DATASHEETS, sheet_spec
from perfscope.device_models import (
    DeviceModels,
    PairCorrection,
    Resolved,
    family_group,
    kernel_family,
    spec_identity,
)

from .times import Roofs, device_model_ratio, roof_time_s

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.device import DeviceSpec

BAND_TEXT = "p10-p90 of the held-out validation error (widened for the rows it rests on and the spread between fits)"
"""How a band is named in the outputs."""


@dataclass(frozen=True)
class DevicePair:
    """The device models of a projection's two GPUs (None where a device resolves to none)."""

    source: Resolved | None
    target: Resolved | None
    models: DeviceModels

    @property
    def moves(self) -> bool:
        """Both GPUs have a model and they are different rows: the kernels move along the curves."""
        return self.source is not None and self.target is not None and self.source.device != self.target.device

    @property
    def vendor_pair(self) -> str | None:
        if self.source is None or self.target is None:
            return None
        return f"{self.source.vendor}->{self.target.vendor}"

    def notes(self) -> list[str]:
        return [r.note for r in (self.source, self.target) if r is not None and r.note]

    def to_dict(self) -> dict[str, Any]:
        def one(r: Resolved | None) -> dict[str, Any] | None:
            return None if r is None else {"device": r.device, "model": r.model.device, "stand_in": r.stand_in,
                                           "sources": list(r.model.sources), "launch_ns": r.model.launch_ns,
                                           "gpu_gap_ns": r.model.gpu_gap_ns}
        return {"source": one(self.source), "target": one(self.target), "vendor_pair": self.vendor_pair,
                "moves": self.moves, "pair_corrections": self.corrections()}

    def _pair_corrections(self) -> Mapping[str, PairCorrection]:
        """Per family, the pair's own corrections; empty where the two models were never measured together."""
        if not self.moves or self.source is None or self.target is None:
            return {}
        return self.models.pairs.get(f"{self.source.model.device} -> {self.target.model.device}") or {}

    def corrections(self) -> dict[str, dict[str, Any]]:
        """Per family, the pair's own correction the projection applies (its axis, how many keys both GPUs
        ran, from which datasets); empty where the two models were never measured together."""
        return {fam: {"axis": c.axis, "choice": c.choice or c.axis, "rows": c.rows, "sources": list(c.sources)}
                for fam, c in sorted(self._pair_corrections().items())}

    @property
    def uses_classes(self) -> bool:
        """A correction of this pair has a GEMM shape-class term (the kernels' classes are needed)."""
        return any(c.uses_classes for c in self._pair_corrections().values())

    @property
    def uses_wave(self) -> bool:
        """A correction of this pair has a wave (tile occupancy) term (the GEMMs' dimensions are needed)."""
        return any(c.uses_wave for c in self._pair_corrections().values())


def resolve_pair(source: DeviceSpec, target: DeviceSpec, models: DeviceModels) -> DevicePair:
    """The models of a projection's measured and target devices."""
    return DevicePair(models.resolve(spec_identity(source)), models.resolve(spec_identity(target)), models)


@functools.lru_cache(maxsize=64)
def datasheet_roofs(device: str) -> Roofs:
    """A datasheet row's roofs, by its model name: the peaks every curve is relative to."""
    sheet = next(d for d in DATASHEETS if d.model == device)
    return Roofs.of(sheet_spec(sheet))


def roof_times(flops: np.ndarray, nbytes: np.ndarray, precision: pd.Series, family: np.ndarray,
               roofs: Roofs) -> np.ndarray:
    """Roof time of each kernel on ``roofs``: a GEMM's 2-norm of compute and memory time, else their sum
    (the time every curve is a function of)."""
    gemm = np.char.startswith(np.asarray(family, str), "gemm")
    return roof_time_s(np.asarray(flops, np.float64), np.asarray(nbytes, np.float64),
                       roofs.peak(precision.reset_index(drop=True)), roofs.bytes_per_s, gemm)


def families(kernels: pd.DataFrame, flops: np.ndarray, nbytes: np.ndarray, precision: pd.Series) -> np.ndarray:
    """Each kernel's family (:func:`perfscope.device_models.kernel_family`) at its (new) work."""
    phase = kernels["phase"].to_numpy(object) if "phase" in kernels else None
    return kernel_family(kernels["category"].to_numpy(object), precision.to_numpy(object), flops, nbytes, phase)


def move(pair: DevicePair, family: np.ndarray, flops: np.ndarray, nbytes: np.ndarray, precision: pd.Series,
         shape_class: np.ndarray | None = None, dims: np.ndarray | None = None,
         source_time_s: np.ndarray | None = None, op: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel, the factor that moves its time (at its new work) from the measured GPU to the target,
    ``g_t(R_t) / g_s(R_s)`` times the pair's correction where one was measured (``shape_class``: each
    kernel's GEMM shape class, :func:`perfscope.device_models.shape_classes`, for a correction with a class
    term; ``dims``: each GEMM's (batch, M, N), for a correction with a wave term; ``source_time_s``: each
    kernel's time on the measured GPU at its new work, for a correction with a persistence term; ``op``: each
    kernel's operator, for one with an op term), NaN where either device has
    no curve for its family; and the family used."""
    if not pair.moves:
        return np.full(len(family), np.nan), np.full(len(family), "", object)
    assert pair.source is not None and pair.target is not None
    rs = roof_times(flops, nbytes, precision, family, datasheet_roofs(pair.source.device))
    rt = roof_times(flops, nbytes, precision, family, datasheet_roofs(pair.target.device))
    return device_model_ratio(family, rs, rt, pair.source.model, pair.target.model, pair.models, flops, nbytes,
                              shape_class, dims, source_time_s, op)


def kernel_bands(pair: DevicePair, family: np.ndarray, rule: np.ndarray, time_s: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel: low, high (s) and whether the band was validated (a device-model kernel of a validated
    family group and vendor pair); an unvalidated kernel's low and high are its projection."""
    low = np.asarray(time_s, np.float64).copy()
    high = low.copy()
    ok = np.zeros(len(low), bool)
    src_v = pair.source.vendor if pair.source else None
    tgt_v = pair.target.vendor if pair.target else None
    if not pair.moves:
        return low, high, ok
    for fam, idx in pd.Series(np.asarray(family, object)).groupby(np.asarray(family, object), sort=False).indices.items():
        band = pair.models.band(str(fam), src_v, tgt_v)
        if band is None:
            continue
        sel = idx[np.asarray(rule, object)[idx] == "device-model"]
        low[sel] = time_s[sel] * np.exp(band.q10)
        high[sel] = time_s[sel] * np.exp(band.q90)
        ok[sel] = True
    return low, high, ok


def busy_ns(start: np.ndarray, end: np.ndarray) -> float:
    """The length of the union of [start, end) intervals."""
    if not len(start):
        return 0.0
    order = np.argsort(start, kind="stable")
    s = np.asarray(start, np.float64)[order]
    e = np.asarray(end, np.float64)[order]
    covered = np.concatenate([[-np.inf], np.maximum.accumulate(e)[:-1]])
    return float(np.sum(np.clip(e - np.maximum(s, covered), 0.0, None)))


def host_window(report_api: pd.DataFrame, ranges: pd.DataFrame, origin: int = 0) -> tuple[float, float] | None:
    """The host's first start and last end (runtime calls, ranges), in ns from ``origin``; None without
    host events."""
    starts, ends = [], []
    for t in (report_api, ranges):
        if len(t):
            starts.append(float(int(t["start_ns"].min()) - origin))
            ends.append(float(int(t["end_ns"].max()) - origin))
    return (min(starts), max(ends)) if starts else None


def wall_ns(k_start: np.ndarray, k_end: np.ndarray, launch: np.ndarray, host: tuple[float, float] | None,
            measured_end: np.ndarray | None = None) -> float:
    """The run's wall time: from its first event to its end, where the run ends after its last launch and
    its last kernel, whichever is later, plus the host time measured after that (``measured_end``: the
    measured kernels' ends, to find it; the measured run itself when None)."""
    if not len(k_start):
        return float(host[1] - host[0]) if host else float("nan")
    last_launch = float(np.max(launch))
    first = min(float(np.min(k_start)), host[0] if host else np.inf)
    ref_end = float(np.max(measured_end if measured_end is not None else k_end))
    tail = max(0.0, (host[1] if host else ref_end) - max(last_launch, ref_end))
    return max(last_launch, float(np.max(k_end))) + tail - first


def band_of(value: float, low: float, high: float, validated_share: float) -> dict[str, Any]:
    """One number with its band as every output writes it: ``projected``, ``low``, ``high``,
    ``validated_share`` (the share of its time a validated band covers) and ``band`` (the band's name,
    or ``unvalidated``)."""
    ok = validated_share > 0
    return {"projected": value, "low": low if ok else None, "high": high if ok else None,
            "validated_share": validated_share, "band": BAND_TEXT if ok else "unvalidated"}


def family_table(family: np.ndarray, measured_ns: np.ndarray, projected_ns: np.ndarray, low_ns: np.ndarray,
                 high_ns: np.ndarray, rule: np.ndarray, validated: np.ndarray) -> list[dict[str, Any]]:
    """The whole run by kernel family: measured and projected time, the band, the share of the projected
    total and the rule that priced most of its time."""
    df = pd.DataFrame({"family": family, "m": measured_ns, "p": projected_ns, "lo": low_ns, "hi": high_ns,
                       "rule": rule, "ok": validated})
    total = float(df["p"].sum()) or 1.0
    out: list[dict[str, Any]] = []
    for fam, g in df.groupby("family", sort=False):
        by_rule = g.groupby("rule")["p"].sum().sort_values(ascending=False)
        vshare = float(g.loc[g["ok"], "p"].sum() / g["p"].sum()) if g["p"].sum() else 0.0
        out.append({"family": str(fam), "group": family_group(str(fam)), "kernels": len(g),
                    "measured_s": float(g["m"].sum()) * 1e-9, "projected_s": float(g["p"].sum()) * 1e-9,
                    "low_s": float(g["lo"].sum()) * 1e-9 if vshare else None,
                    "high_s": float(g["hi"].sum()) * 1e-9 if vshare else None,
                    "share": float(g["p"].sum()) / total, "rule": str(by_rule.index[0]),
                    "band": BAND_TEXT if vshare else "unvalidated", "validated_share": vshare})
    out.sort(key=lambda r: -r["projected_s"])
    return out


__all__ = ["BAND_TEXT", "DevicePair", "band_of", "busy_ns", "datasheet_roofs", "families", "family_table", "host_window", "kernel_bands", "move",
           "resolve_pair", "roof_times", "wall_ns"]
