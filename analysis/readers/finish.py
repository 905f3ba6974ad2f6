"""The import pipeline's one finishing step: raw tables in, an analysed Report out.

Every way a capture becomes a Report goes through here: the file readers (Kineto, nsys,
ncu, NVML), ``perfscope profile`` of the engine or a script, the notebook ``perfscope.profile()``
and the load test. A reader parses its format into an :class:`Imported` (raw tables, the
manifest keys it knows, the roofs to classify against); :func:`finish` then

1. conforms each table to its contract, once;
1b. reads the frameworks' step annotations among the ranges into ``steps`` and gives each kernel
   its step and phase (:func:`.framework_steps.with_framework_steps`);
2. classifies the kernels against the roofs (:func:`.roofline.classify_conformed`);
3. assembles the immutable Report, with the roofs as its ``device``;
4. gives every idle slice of the device its cause (:func:`..idle.idle_rows`, the ``idle`` table).

Callers that add tables (the engine's steps and requests, a load test's runs) do so on the
:class:`Imported` before finishing, so nothing is conformed or classified twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.memo import release_free_memory
from perfscope.report import Report
from perfscope.schema import compact_missing, conform, shared_texts, untimed, validate

from ..costs.roofline import classify_conformed
from ..idle import idle_rows
from ..memory import with_steps as memory_with_steps
from ..steps import PROPOSAL_PREFIX, StepRule, with_framework_steps

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.device import DeviceSpec


@dataclass(frozen=True)
class Imported:
    """A capture parsed but not finished: raw tables, manifest keys, and the roofs.

    Attributes:
        tables: report tables by name (``kernels``, ``ranges``, ...), not yet conformed.
        manifest: manifest keys (``name``, ``source`` from :func:`perfscope.report.source_info`,
            ``params``, ``warnings``, ...); its ``device`` is always ``device``'s.
        device: the roofs the kernels are classified against (None: every bound ``unknown``).
        origin: the file or run the tables came from, named in errors.
    """

    tables: Mapping[str, pd.DataFrame]
    manifest: Mapping[str, Any] = field(default_factory=dict)
    device: DeviceSpec | None = None
    origin: str = "<memory>"

    def with_tables(self, **tables: pd.DataFrame) -> Imported:
        """A copy with ``tables`` added or replaced."""
        return replace(self, tables={**self.tables, **tables})

    def with_manifest(self, **keys: Any) -> Imported:
        """A copy with manifest ``keys`` set."""
        return replace(self, manifest={**self.manifest, **keys})

    @property
    def warnings(self) -> list[str]:
        return list(self.manifest.get("warnings") or [])

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.manifest.get("params") or {})


def finish(imported: Imported, steps: StepRule | None = None) -> Report:
    """Conform each table once, classify the kernels, and build the Report (``steps``: the ranges
    that are steps, ``--steps``; default: the frameworks' annotations)."""
    tables, checks = {}, []
    for name, df in imported.tables.items():  # every number read from a file goes through the one validator
        timed, lost = untimed(df, name)
        tables[name], dropped = validate(conform(timed, name, source=imported.origin), name)
        checks += [*lost, *dropped]
    device, roof_notes = imported.device.checked() if imported.device is not None else (None, [])
    tables, notes = with_framework_steps(tables, steps)
    notes = [*checks, *roof_notes, *notes]
    if "steps" in tables and "steps" not in imported.tables:
        tables["steps"] = conform(tables["steps"], "steps", source=imported.origin)
    if "memory" in tables and "steps" in tables:
        tables["memory"] = memory_with_steps(tables["memory"], tables["steps"])
    if "kernels" in tables:
        # the roofline's columns a capture without counters leaves missing cost nothing per row, and its
        # bound labels one shared str per value
        tables["kernels"] = compact_missing(shared_texts(classify_conformed(tables["kernels"], device)))
    # the roofs the kernels were classified against are the report's device, by construction
    manifest = {**imported.manifest, "device": device.to_dict() if device else None}
    if notes:
        manifest["warnings"] = [*imported.warnings, *notes]
    if any("row(s)" in note for note in checks):  # rows were dropped: the report lacks them
        manifest["partial"] = True
    if "idle" in tables:  # given by the caller (a combined report): kept
        return Report.assemble(tables, manifest)
    release_free_memory(len(tables.get("kernels", ())))  # the reader's batches, before the idle classification's arrays come on top
    # a placeholder idle table while the report is read to make the real one (conformed once, below)
    report = Report.assemble({**tables, "idle": pd.DataFrame()}, manifest)
    # 4. every idle slice of the device with its cause (analysis/idle.py)
    return report.replace(idle=idle_rows(report))


def with_steps(report: Report, rule: StepRule) -> Report:
    """``report`` with the ranges ``rule`` matches as its steps (``perfscope import --steps``): the
    kernels' step and phase, the steps table and the idle table made again; a note when none matches."""
    tables = {name: getattr(report, name) for name in ("kernels", "ranges", "api", "transfers")}
    tables, notes = with_framework_steps(tables, rule)
    steps = conform(tables["steps"], "steps", source="--steps") if "steps" in tables else report.steps.iloc[:0]
    new = report.replace(kernels=tables["kernels"], steps=steps)
    kept = [w for w in new.warnings if not w.startswith(PROPOSAL_PREFIX)]  # the proposal was taken
    new = new.with_manifest(warnings=[*kept, *notes])
    return new.replace(idle=idle_rows(new))
