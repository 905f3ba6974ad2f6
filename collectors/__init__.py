"""perfscope.collectors: run or wrap the profilers (torch.profiler, nsys, ncu, NVML, NVTX) and
hand raw captures to analysis. Collectors import only perfscope's core.

:data:`COLLECTORS` is the registry the CLI's ``--collector`` choices come from (:func:`collector_names`).
"""

from __future__ import annotations

from perfscope.errors import UsageError

from .base import CaptureInterrupted, Collector, RawCapture
from .ncu import NcuCollector, NcuOptions
from .nsys import NsysCollector, NsysOptions
from .nvml import NvmlCollector, NvmlOptions, NvmlSampler
from .rocprof import (
    RocprofComputeCollector,
    RocprofComputeOptions,
    RocprofOptions,
    Rocprofv3Collector,
)

COLLECTORS: dict[str, Collector] = {
    "nsys": NsysCollector(),
    "ncu": NcuCollector(),
    "nvml": NvmlCollector(),
    "rocprofv3": Rocprofv3Collector(),
    "rocprof-compute": RocprofComputeCollector(),
}
"""Registry name -> collector instance: each runs a command under its profiler."""

IN_PROCESS = "torch"
"""torch.profiler runs inside perfscope's own process (the engine, or ``-- python x.py``), so it is
not a command-running :class:`Collector`; it is offered next to the registered ones."""


def collector_names() -> tuple[str, ...]:
    """Every ``--collector`` choice: ``torch`` (in-process) first, then the registry's names."""
    return (IN_PROCESS, *COLLECTORS)


def get_collector(name: str) -> Collector:
    """The collector registered as ``name``.

    Raises:
        UsageError: no collector has that name.
    """
    try:
        return COLLECTORS[name]
    except KeyError:
        raise UsageError(f"unknown collector {name!r}",
                         hint=f"choose one of {', '.join(sorted(COLLECTORS))}") from None


__all__ = [
    "COLLECTORS",
    "IN_PROCESS",
    "CaptureInterrupted",
    "Collector",
    "NcuCollector",
    "NcuOptions",
    "NsysCollector",
    "NsysOptions",
    "NvmlCollector",
    "NvmlOptions",
    "NvmlSampler",
    "RawCapture",
    "RocprofComputeOptions",
    "RocprofOptions",
    "collector_names",
    "get_collector",
]
