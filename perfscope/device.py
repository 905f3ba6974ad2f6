"""DeviceSpec: a device's compute and memory roofs, each with its provenance.

A roof is a peak rate (FLOP/s or bytes/s) and the story of where the number came from:
``measured`` by a micro-benchmark on this machine, ``report`` when read from an Nsight
Compute report (peak_sustained x clock), ``datasheet`` from a vendor table, or ``derived``
from the architecture (CUs x clock x FLOPs per CU per clock, for AMD parts without a figure). The ridge
point of a precision is its compute roof divided by the DRAM roof, in FLOP/byte.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

PROVENANCES = ("measured", "report", "datasheet", "derived")
MAX_ROOF = 1e18
"""The largest roof taken (FLOP/s or bytes/s): an exaFLOP/s per device. Past it, or not a finite number
above 0, a roof read from a file is damage (a roofline.csv value of 1e308) and is dropped."""


def valid_roof(value: object) -> bool:
    """A roof value is a finite number in (0, :data:`MAX_ROOF`]."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= MAX_ROOF)
WIDER_PRECISIONS: dict[str, tuple[str, ...]] = {
    "fp4": ("fp6", "fp8", "bf16", "fp16"),
    "fp6": ("fp8", "bf16", "fp16"),
    "fp8": ("bf16", "fp16"),
    "int4": ("int8",),
}
"""Where a device has no roof for a narrow format, the roof its math runs at instead: hardware
without FP4/FP6/FP8 (or INT4) units computes such data after widening it (an MXFP4 GEMM on an
H100 or MI300X runs FP8 or BF16 MMA), so the nearest wider precision the device lists bounds it.
Only narrower -> wider: a device that lists only FP4 (GB10) has no BF16 roof."""


@dataclass(frozen=True)
class Roof:
    """One peak rate and where it came from.

    Attributes:
        value: FLOP/s for compute roofs, bytes/s for memory roofs.
        provenance: ``measured``, ``report``, ``datasheet`` or ``derived`` (an AMD device's CUs x clock
            x its architecture's per-CU rate: :func:`perfscope.datasheets.arch_roofs`).
        method: how it was obtained, in words (benchmark, metrics, source table).
        clock: the clock condition (``boost``, ``base (ncu --clock-control base)``, ...).
        dense: True for dense tensor-core figures, False for with-sparsity, None when moot.
    """

    value: float
    provenance: str
    method: str = ""
    clock: str | None = None
    dense: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Roof:
        return cls(
            value=float(d["value"]),
            provenance=str(d.get("provenance", "datasheet")),
            method=str(d.get("method", "")),
            clock=d.get("clock"),
            dense=d.get("dense"),
        )


@dataclass(frozen=True)
class DeviceSpec:
    """A device and its roofs.

    Attributes:
        name: device name as the system reports it (``NVIDIA H100 80GB HBM3``, a CPU model).
        kind: ``cpu`` or ``cuda`` (``rocm`` for imported AMD traces).
        compute: peak FLOP/s per precision (``fp32``, ``bf16``, ...).
        memory: peak bytes/s per level (``dram``; ``l2`` and ``l1`` where known).
        properties: other facts (SM count, memory size, clocks, threads, ...).
    """

    name: str
    kind: str
    compute: Mapping[str, Roof] = field(default_factory=dict)
    memory: Mapping[str, Roof] = field(default_factory=dict)
    properties: Mapping[str, Any] = field(default_factory=dict)

    def roof_precision(self, precision: str | None) -> str | None:
        """The precision whose compute roof bounds work of ``precision`` on this device: itself
        when listed, else the nearest wider one of :data:`WIDER_PRECISIONS` (fp4 on an H100:
        ``fp8``), fp32 for an unknown precision; None when the device has none of them."""
        if precision and precision in self.compute:
            return precision
        if precision in (None, "", "unknown"):
            return "fp32" if "fp32" in self.compute else None
        return next((p for p in WIDER_PRECISIONS.get(precision, ()) if p in self.compute), None)

    def peak_flops(self, precision: str | None) -> float | None:
        """Compute roof for ``precision`` (through :meth:`roof_precision`: a narrow format without a
        roof of its own takes the nearest wider one; an unknown precision fp32's)."""
        roof = self.roof_precision(precision)
        return self.compute[roof].value if roof else None

    def peak_bandwidth(self, level: str = "dram") -> float | None:
        """Memory roof of ``level`` in bytes/s, or None when unknown."""
        roof = self.memory.get(level)
        return roof.value if roof else None

    def ridge(self, precision: str, level: str = "dram") -> float | None:
        """Ridge point (FLOP/byte) where the memory roof meets the compute roof."""
        peak, bw = self.peak_flops(precision), self.peak_bandwidth(level)
        if not peak or not bw:
            return None
        return peak / bw

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "compute": {k: r.to_dict() for k, r in self.compute.items()},
            "memory": {k: r.to_dict() for k, r in self.memory.items()},
            "properties": dict(self.properties),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceSpec:
        """The spec of a manifest's ``device``; a roof that is not a valid number (null, as a report written
        before its roofs were checked may hold) is left out (:meth:`checked` says which)."""
        def roofs(group: Any) -> dict[str, Roof]:
            items = group.items() if isinstance(group, dict) else ()
            return {str(k): Roof.from_dict(v) for k, v in items
                    if isinstance(v, dict) and valid_roof(_number(v.get("value")))}

        return cls(
            name=str(d.get("name", "unknown")),
            kind=str(d.get("kind", "unknown")),
            compute=roofs(d.get("compute")),
            memory=roofs(d.get("memory")),
            properties=dict(d.get("properties") or {}),
        )

    def checked(self) -> tuple[DeviceSpec, list[str]]:
        """This spec without the roofs that are not finite numbers in (0, :data:`MAX_ROOF`], and a note
        naming them (empty when every roof is valid)."""
        bad = [f"{group} {name} ({roof.value!r})" for group, roofs in (("compute", self.compute), ("memory", self.memory))
               for name, roof in roofs.items() if not valid_roof(roof.value)]
        if not bad:
            return self, []
        spec = DeviceSpec(self.name, self.kind, {k: r for k, r in self.compute.items() if valid_roof(r.value)},
                          {k: r for k, r in self.memory.items() if valid_roof(r.value)}, self.properties)
        return spec, [f"{len(bad)} roof(s) of {self.name!r} dropped: not a finite number in (0, {MAX_ROOF:g}] "
                      f"({', '.join(bad)})"]

    def with_roofs(
        self,
        compute: Mapping[str, Roof] | None = None,
        memory: Mapping[str, Roof] | None = None,
    ) -> DeviceSpec:
        """A copy with some roofs replaced or added (existing ones kept otherwise)."""
        return DeviceSpec(
            name=self.name,
            kind=self.kind,
            compute={**self.compute, **(compute or {})},
            memory={**self.memory, **(memory or {})},
            properties=self.properties,
        )


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
