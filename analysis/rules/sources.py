"""What the profiled file is: a process that ran no GPU work (a serving frontend) says so first."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ._base import Finding, Item

if TYPE_CHECKING:
    from perfscope.report import Report

NO_GPU_WORK = "no GPU work in this trace"
"""The opening of the Kineto reader's warning for a process that saw a GPU but asked it for nothing."""


def no_gpu_work(report: Report) -> list[Finding]:
    """A trace whose process saw a GPU but launched nothing on it: what it is, and where the GPU
    work is (the reader's warning: a vLLM frontend's GPU work is in the engine core's rank traces)."""
    params = report.params or {}
    if params.get("gpu_work") is not False:
        return []
    note = next((w for w in report.warnings if w.startswith(NO_GPU_WORK)), NO_GPU_WORK)
    what, _, where = note.partition("; the GPU work of this run is in ")
    where = where.removesuffix(": import that file")
    engine = params.get("frontend")
    title = (f"This is the {engine} frontend's trace: no GPU work ran in this process" if engine
             else "No GPU work ran in this process: the trace holds CPU operators only")
    advice = (f"Import the trace that holds the GPU work: {where}" if where
              else f"{what[len(NO_GPU_WORK) + 2:].capitalize()}. Import the trace of the process that ran the model.")
    device = report.device.name if report.device is not None else None
    k = report.kernels
    ops = Item("metric", f"{len(k):,} CPU operators, no GPU kernel nor copy" + (f" (device {device} seen)" if device
                                                                                else ""),
               attrs={"operators": len(k)})
    items = (ops, Item("metric", f"the reader's note: {note}", attrs={"note": note}))
    return [Finding("no-gpu-work", "high", title, {"device": device or "unknown", "frontend": engine or "none"},
                    advice, math.nan, items=items)]
