"""AMD's profilers as collectors: rocprofv3 (kernel, HIP, memory-copy and marker traces) and
rocprof-compute (hardware counters and the roofline benchmark of a workload).

Equivalent commands::

    rocprofv3 --kernel-trace --hip-runtime-trace --memory-copy-trace --marker-trace \\
        --output-format rocpd -d OUT -o run -- COMMAND...        # writes OUT/run_results.db
    rocprof-compute profile -n perfscope --path OUT/workload -- COMMAND...

The files they write are imported by perfscope's rocprof readers (``perfscope import``).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import CollectorError, ToolNotFoundError

from ._proc import fresh_file, run_profiler, run_tool
from .base import CaptureInterrupted, RawCapture

if TYPE_CHECKING:
    from collections.abc import Sequence

FORMATS = ("rocpd", "csv", "json")
WORKLOAD_FILES = ("sysinfo.csv", "roofline.csv", "timestamps.csv", "pmc_dispatch_info.csv", "pmc_kernel_top.csv")
RESULT = {"rocpd": "{base}_results.db", "csv": "{base}_kernel_trace.csv", "json": "{base}_results.json"}
INSTALL = {"rocprofv3": "install ROCm (rocprofiler-sdk provides /opt/rocm/bin/rocprofv3) and add /opt/rocm/bin to PATH",
           "rocprof-compute": "install ROCm's rocprofiler-compute (apt install rocprofiler-compute, then "
                              "pip install -r /opt/rocm/libexec/rocprofiler-compute/requirements.txt)"}


@dataclass(frozen=True)
class RocprofOptions:
    """Settings of one rocprofv3 capture.

    Attributes:
        output_format: ``rocpd`` (SQLite, ROCm 7+), ``csv`` or ``json``.
        output_base: file prefix (``-o``); ``collect`` puts it in its out_dir.
        marker_trace: record roctx ranges (what perfscope.annotate writes on ROCm).
        pmc: hardware counters to collect per dispatch (``--pmc``), e.g. the roofline counters.
        timeout_s: wall-clock limit for the profiled run.
        extra_args: more rocprofv3 flags, placed before the command.
    """

    output_format: str = "rocpd"
    output_base: str = "run"
    marker_trace: bool = True
    pmc: tuple[str, ...] = ()
    timeout_s: float | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.output_format not in FORMATS:
            raise ValueError(f"output_format must be one of {FORMATS}, not {self.output_format!r}")


def rocprofv3_command(target: Sequence[str], options: RocprofOptions, out_dir: Path | str = ".") -> list[str]:
    cmd = ["rocprofv3", "--kernel-trace", "--hip-runtime-trace", "--memory-copy-trace"]
    if options.marker_trace:
        cmd.append("--marker-trace")
    if options.pmc:
        cmd += ["--pmc", *options.pmc]
    cmd += ["--output-format", options.output_format, "-d", str(out_dir), "-o", Path(options.output_base).name,
            *options.extra_args, "--", *target]
    return cmd


class Rocprofv3Collector:
    """rocprofv3: kernels, HIP API calls, copies and roctx ranges on one timeline."""

    name = "rocprofv3"
    options_type = RocprofOptions

    def is_available(self) -> bool:
        return shutil.which("rocprofv3") is not None

    def command(self, target: Sequence[str], options: RocprofOptions) -> list[str]:
        return rocprofv3_command(target, options)

    def collect(self, target: Sequence[str], out_dir: Path, options: RocprofOptions) -> RawCapture:
        if not self.is_available():
            raise ToolNotFoundError("rocprofv3", INSTALL["rocprofv3"])
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = rocprofv3_command(target, options, out_dir)
        result = out_dir / RESULT[options.output_format].format(base=Path(options.output_base).name)
        outcome = run_profiler(cmd, result, timeout_s=options.timeout_s)
        # a CSV run is several files of one prefix; the kernel trace (imported first) picks up the others
        siblings = sorted(p for p in out_dir.glob(f"{Path(options.output_base).name}_*") if p.is_file() and p != result)
        capture = RawCapture(collector=self.name, files=(result, *siblings), commands=(tuple(cmd),),
                             partial=outcome.partial,
                             warnings=outcome.warnings, params={"output_format": options.output_format,
                                                                "pmc": list(options.pmc)})
        if outcome.interrupted:
            raise CaptureInterrupted(capture)
        return capture


@dataclass(frozen=True)
class RocprofComputeOptions:
    """Settings of one rocprof-compute capture: workload name, extra flags (``--roof-only``,
    ``--kernel NAME``, ...) and a time limit."""

    name: str = "perfscope"
    timeout_s: float | None = None
    extra_args: tuple[str, ...] = ()


def rocprof_compute_command(target: Sequence[str], options: RocprofComputeOptions,
                            out_dir: Path | str = ".") -> list[str]:
    return ["rocprof-compute", "profile", "-n", options.name, "--path", str(Path(out_dir) / "workload"),
            *options.extra_args, "--", *target]


class RocprofComputeCollector:
    """rocprof-compute: every counter pass of a workload, and its roofline benchmark."""

    name = "rocprof-compute"
    options_type = RocprofComputeOptions

    def is_available(self) -> bool:
        return shutil.which("rocprof-compute") is not None

    def command(self, target: Sequence[str], options: RocprofComputeOptions) -> list[str]:
        return rocprof_compute_command(target, options)

    def collect(self, target: Sequence[str], out_dir: Path, options: RocprofComputeOptions) -> RawCapture:
        if not self.is_available():
            raise ToolNotFoundError("rocprof-compute", INSTALL["rocprof-compute"])
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = rocprof_compute_command(target, options, out_dir)
        since = time.time()
        run_tool(cmd, timeout_s=options.timeout_s)
        found = [p for p in (out_dir / "workload").rglob("pmc_perf.csv") if fresh_file(p, since)]
        if not found:
            raise CollectorError("rocprof-compute", cmd, 0, "rocprof-compute wrote no pmc_perf.csv")
        # pmc_perf.csv first (its folder is the workload the importer reads), then the files it needs beside it
        beside = [found[0].parent / n for n in WORKLOAD_FILES if (found[0].parent / n).is_file()]
        return RawCapture(collector=self.name, files=(found[0], *beside), commands=(tuple(cmd),),
                          params={"workload": options.name})
