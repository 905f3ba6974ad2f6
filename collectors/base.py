"""The collector contract: a :class:`Collector` Protocol and the :class:`RawCapture` it returns.

A collector wraps one profiler. Building its command line is a pure function
(:meth:`Collector.command`), so every flag can be unit-tested without a GPU; running it
(:meth:`Collector.collect`) writes raw files into a folder and describes them in a
:class:`RawCapture`. Turning those files into a Report is analysis's job
(``perfscope.analysis.readers.detect.import_file``), never the collector's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

OptionsT_contra = TypeVar("OptionsT_contra", contravariant=True)


@dataclass(frozen=True)
class RawCapture:
    """What a collector wrote, and how.

    Attributes:
        collector: the collector's registry name (``nsys``, ``ncu``, ``nvml``).
        files: files written, the one to import first (``.sqlite``, ``.ncu-rep``, ...).
        commands: every command run, in order, exactly as run.
        tool_version: the profiler's version (``nsys --version``), None if unknown.
        partial: the run was cut short (Ctrl-C, timeout, the program crashed) but the
            files hold what was collected.
        warnings: one line each, for the report manifest.
        unavailable_metrics: metrics the device could not provide (NVML), listed once.
        params: settings that change how the numbers read (ncu ``clock_control``, set,
            filters, NVML clock anchors), for the manifest's ``params``.
    """

    collector: str
    files: tuple[Path, ...]
    commands: tuple[tuple[str, ...], ...]
    tool_version: str | None = None
    partial: bool = False
    warnings: tuple[str, ...] = ()
    unavailable_metrics: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def primary(self) -> Path | None:
        """The file to import (the first of :attr:`files`), None when nothing was written."""
        return self.files[0] if self.files else None

    def source(self) -> dict[str, Any]:
        """The manifest ``source`` entry: kind, path, tool and tool_version."""
        from perfscope.report import source_info

        return source_info(self.collector, self.primary, self.collector, self.tool_version)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (for ``manifest.json`` and ``--json`` output)."""
        return {
            "collector": self.collector,
            "files": [str(p) for p in self.files],
            "commands": [list(c) for c in self.commands],
            "tool_version": self.tool_version,
            "partial": self.partial,
            "warnings": list(self.warnings),
            "unavailable_metrics": list(self.unavailable_metrics),
            "params": dict(self.params),
        }


class CaptureInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a collection; :attr:`capture` holds what was written (``partial``).

    It is a ``KeyboardInterrupt``, so code that knows nothing of it still stops; the
    ``profile`` command catches it to save the partial report.
    """

    def __init__(self, capture: RawCapture) -> None:
        super().__init__(f"{capture.collector} interrupted; partial capture kept")
        self.capture = capture


@runtime_checkable
class Collector(Protocol[OptionsT_contra]):
    """One profiler behind a uniform interface (STYLE.md principle 3).

    Attributes:
        name: registry name, also the CLI's ``--collector`` choice.
        options_type: the frozen options dataclass ``command`` and ``collect`` take.
    """

    @property
    def name(self) -> str:
        """Registry name, also the CLI's ``--collector`` choice."""
        ...

    @property
    def options_type(self) -> type:
        """The frozen options dataclass ``command`` and ``collect`` take."""
        ...

    def is_available(self) -> bool:
        """True when the profiler can run here (tool on PATH, driver library loadable)."""
        ...

    def command(self, target: Sequence[str], options: OptionsT_contra) -> list[str]:
        """The exact command line :meth:`collect` runs first (pure: no side effects)."""
        ...

    def collect(
        self, target: Sequence[str], out_dir: Path, options: OptionsT_contra
    ) -> RawCapture:
        """Profile ``target`` (a command, argv list), writing raw files into ``out_dir``."""
        ...
