"""Nsight Systems collector: a CUDA/NVTX/OS-runtime timeline of any command, exported to SQLite.

Equivalent commands::

    nsys profile --trace=cuda,nvtx,osrt --cuda-graph-trace=node --sample=none \\
        --output=OUT/nsys --force-overwrite=true [--duration=S] COMMAND...
    nsys export --type=sqlite --force-overwrite=true --output=OUT/nsys.sqlite OUT/nsys.nsys-rep

``--cuda-graph-trace=node`` is the flag people forget: nsys's default (``graph``) shows each
CUDA-graph replay as one opaque block, which hides every kernel of a graph-captured decode
step. ``--sample=none`` turns off CPU IP sampling, which perfscope does not read.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import CollectorError, UsageError

from ._proc import fresh_file, run_profiler, run_tool, tool_version
from .base import CaptureInterrupted, RawCapture

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

_TRACE_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
GRAPH_TRACE = ("node", "graph")
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
"""``.qdrep`` is what releases before 2021.4 wrote."""

EXPORT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class NsysOptions:
    """Settings of one Nsight Systems capture.

    Attributes:
        trace: APIs to trace (``--trace``).
        cuda_graph_trace: ``node`` (each kernel of a CUDA graph) or ``graph`` (one block).
        sample: CPU sampling (``--sample``); ``none`` by default.
        duration_s: stop collecting after this many seconds (``--duration``).
        delay_s: start collecting after this many seconds (``--delay``).
        output_base: report path without extension; ``collect`` puts it in its out_dir.
        timeout_s: wall-clock limit for the whole profiled run.
        export_sqlite: also run ``nsys export --type=sqlite`` (what perfscope imports).
        stream_stderr: echo the program's stderr while it runs.
        extra_args: more ``nsys profile`` flags, placed before the command.
    """

    trace: tuple[str, ...] = ("cuda", "nvtx", "osrt")
    cuda_graph_trace: str = "node"
    sample: str = "none"
    duration_s: int | None = None
    delay_s: int | None = None
    output_base: str = "nsys"
    timeout_s: float | None = None
    export_sqlite: bool = True
    stream_stderr: bool = True
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [t for t in self.trace if not _TRACE_RE.match(t)]
        if not self.trace or bad:
            raise UsageError(f"bad nsys --trace value(s) {bad or '(none given)'}",
                             hint="give API names such as cuda, nvtx, osrt, cublas")
        if self.cuda_graph_trace not in GRAPH_TRACE:
            raise UsageError(f"--cuda-graph-trace must be node or graph, not {self.cuda_graph_trace!r}")
        for name in ("duration_s", "delay_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise UsageError(f"nsys {name} must be a positive number of seconds, not {value}")


def profile_command(target: Sequence[str], options: NsysOptions) -> list[str]:
    """``nsys profile`` command line for ``target`` (pure)."""
    if not target:
        raise UsageError("no command to profile", hint="put it after --, e.g. -- python run.py")
    cmd = [
        "nsys", "profile",
        f"--trace={','.join(options.trace)}",
        f"--cuda-graph-trace={options.cuda_graph_trace}",
        f"--sample={options.sample}",
        f"--output={options.output_base}",
        "--force-overwrite=true",
    ]
    if options.delay_s is not None:
        cmd.append(f"--delay={options.delay_s}")
    if options.duration_s is not None:
        cmd.append(f"--duration={options.duration_s}")
    return [*cmd, *options.extra_args, *target]


def export_command(report: Path | str, sqlite: Path | str) -> list[str]:
    """``nsys export`` command turning a ``.nsys-rep`` into the SQLite file perfscope reads."""
    return ["nsys", "export", "--type=sqlite", "--force-overwrite=true",
            f"--output={sqlite}", str(report)]


def report_path(output_base: Path) -> Path:
    """The report nsys wrote for ``output_base`` (``.nsys-rep``, or ``.qdrep`` on old nsys)."""
    for suffix in REPORT_SUFFIXES:
        candidate = output_base.with_name(output_base.name + suffix)
        if candidate.exists():
            return candidate
    return output_base.with_name(output_base.name + REPORT_SUFFIXES[0])


def _echo(line: str) -> None:
    sys.stderr.write(line)


def stderr_echo(enabled: bool) -> Callable[[str], None] | None:
    """The stderr streaming callback collectors pass to ``run_tool`` (None: capture only)."""
    return _echo if enabled else None


class NsysCollector:
    """Nsight Systems: kernels, memcpys, CUDA API calls and NVTX ranges on one timeline."""

    name = "nsys"
    options_type = NsysOptions

    def is_available(self) -> bool:
        """True when ``nsys`` is on PATH."""
        return shutil.which("nsys") is not None

    def command(self, target: Sequence[str], options: NsysOptions) -> list[str]:
        """The ``nsys profile`` command :meth:`collect` runs first."""
        return profile_command(target, options)

    def collect(self, target: Sequence[str], out_dir: Path, options: NsysOptions) -> RawCapture:
        """Profile ``target`` and export SQLite into ``out_dir``.

        Raises:
            ToolNotFoundError: nsys is not on PATH.
            CollectorError: nsys failed and wrote no report, or the export failed.
            CaptureInterrupted: Ctrl-C; its ``capture`` holds the partial files.
        """
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        base = out_dir / Path(options.output_base).name
        options = dataclasses.replace(options, output_base=str(base))
        version = tool_version("nsys")
        cmd = profile_command(target, options)
        since = time.time()
        outcome = run_profiler(cmd, report_path(base), timeout_s=options.timeout_s,
                               on_stderr=stderr_echo(options.stream_stderr))
        report = _written_report(base, cmd, since)
        files, commands = [report], [tuple(cmd)]
        if options.export_sqlite:
            sqlite = base.with_name(base.name + ".sqlite")
            export = export_command(report, sqlite)
            _export(export, report)
            files.insert(0, sqlite)
            commands.append(tuple(export))
        capture = RawCapture(
            collector=self.name, files=tuple(files), commands=tuple(commands),
            tool_version=version, partial=outcome.partial, warnings=outcome.warnings,
            params={"trace": list(options.trace), "cuda_graph_trace": options.cuda_graph_trace},
        )
        if outcome.interrupted:
            raise CaptureInterrupted(capture)
        return capture


def _export(cmd: Sequence[str], report: Path) -> None:
    try:
        run_tool(cmd, timeout_s=EXPORT_TIMEOUT_S)
    except CollectorError as exc:
        raise CollectorError("nsys", exc.cmd, exc.returncode, exc.stderr_tail,
                             hint=f"the report is kept at {report}; open it in Nsight Systems "
                             "or retry the export with a newer nsys") from None


def _written_report(base: Path, cmd: Sequence[str], since: float) -> Path:
    report = report_path(base)
    if not fresh_file(report, since):
        raise CollectorError(
            "nsys", cmd, 0, f"no report at {report}",
            hint="nsys ran but wrote nothing: did the program start? see the output above",
        )
    return report
