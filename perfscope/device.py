"""DeviceSpec: a device's compute and memory roofs, each with its provenance.

A roof is a peak rate (FLOP/s or bytes/s) and the story of where the number came from:
``measured`` by a micro-benchmark on this machine, ``report`` when read from an Nsight
Compute report (peak_sustained x clock), or ``datasheet`` from a vendor table. The ridge
point of a precision is its compute roof divided by the DRAM roof, in FLOP/byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

PROVENANCES = ("measured", "report", "datasheet")


@dataclass(frozen=True)
class Roof:
    """One peak rate and where it came from.

    Attributes:
        value: FLOP/s for compute roofs, bytes/s for memory roofs.
        provenance: ``measured``, ``report`` or ``datasheet``.
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

    def peak_flops(self, precision: str | None) -> float | None:
        """Compute roof for ``precision``, falling back to fp32 for unknown precisions."""
        if precision and precision in self.compute:
            return self.compute[precision].value
        if precision in (None, "", "unknown") and "fp32" in self.compute:
            return self.compute["fp32"].value
        return None

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
        return cls(
            name=str(d.get("name", "unknown")),
            kind=str(d.get("kind", "unknown")),
            compute={k: Roof.from_dict(v) for k, v in (d.get("compute") or {}).items()},
            memory={k: Roof.from_dict(v) for k, v in (d.get("memory") or {}).items()},
            properties=dict(d.get("properties") or {}),
        )

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
