"""Nsight Compute collector: per-kernel hardware counters (the measured roofline), with bounded
replay so that profiling a real program finishes.

Equivalent command (defaults)::

    ncu --set roofline --clock-control base --target-processes all \\
        --export OUT/ncu --force-overwrite --log-file OUT/ncu.log COMMAND...

``--clock-control`` is always written out: ``base`` (ncu's default) locks the GPU to its base
clocks, so every roof read from the report is a base-clock roof; ``none`` leaves clocks free
(boost), closer to production but less repeatable. It is stored in the capture's ``params``
as the roofs' provenance clock.

Top-N mode (``top_n``) first finds the N kernels with the largest total GPU time with a cheap
pass (an ``nsys`` timeline when nsys is installed, otherwise ``ncu --metrics
gpu__time_duration.sum``), ranked by exact demangled name (each template instantiation of
``vectorized_elementwise_kernel`` is its own kernel). It then runs the program once per top
kernel, so that each one gets its K launches (``launches_per_kernel``, ``--top-n-launches``)
whatever else runs before it::

    ncu ... --kernel-name-base demangled --kernel-name regex:^<escaped name>$ --launch-count K \
        --export OUT/ncu_top1 ...      (then ncu_top2, ... ncu_topN)

One run per kernel costs N+1 runs of the program, but a single run with the names' regex union
and ``--launch-count N*K`` profiles the first N*K launches matching any name (start-up kernels
that share a name), and ncu's ``--filter-mode per-launch-config`` counts per grid/block shape,
not per name. The N reports are imported as one (:func:`perfscope.analysis.readers.ncu.reader.read_ncu_reps`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import CollectorError, InputFormatError, UsageError

from . import nsys
from ._proc import Outcome, fresh_file, run_profiler, tool_version
from .base import CaptureInterrupted, RawCapture

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

SETS = ("roofline", "detailed", "full", "basic")
CLOCK_CONTROLS = ("base", "none")
NAME_BASES = ("function", "demangled", "mangled")
FIRST_PASSES = ("auto", "nsys", "ncu")
TIME_METRIC = "gpu__time_duration.sum"
_TIME_UNITS_NS = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
                  "ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


@dataclass(frozen=True)
class NcuOptions:
    """Settings of one Nsight Compute capture.

    Attributes:
        section_set: ``--set``: roofline (default), detailed, full or basic.
        clock_control: ``--clock-control``: base (locked base clocks) or none (free clocks).
        kernel_name: ``--kernel-name`` filter, verbatim (``regex:gemm`` or an exact name).
        kernel_name_base: what ``kernel_name`` matches: function, demangled or mangled.
        launch_skip: ``--launch-skip``: matching launches to skip first (warm-up).
        launch_count: ``--launch-count``: matching launches to profile at most.
        nvtx_include: ``--nvtx-include`` filters (``prefill/`` is a push/pop range, ``D@r/``
            one in domain D); setting any turns on ``--nvtx``.
        nvtx_exclude: ``--nvtx-exclude`` filters.
        target_processes: ``all`` (child processes too, e.g. torchrun) or application-only.
        top_n: profile only the N kernels with the most total GPU time (a first pass, then one
            profiled run per kernel).
        launches_per_kernel: with ``top_n``, launches profiled per top kernel (K).
        first_pass: how top-N ranks kernels: auto (nsys if installed and no NVTX filter),
            nsys or ncu.
        output_base: report path without extension; ``collect`` puts it in its out_dir.
        timeout_s: wall-clock limit for each profiled run.
        stream_stderr: echo the program's stderr while it runs.
        extra_args: more ncu flags, placed before the command.
    """

    section_set: str = "roofline"
    clock_control: str = "base"
    kernel_name: str | None = None
    kernel_name_base: str = "function"
    launch_skip: int | None = None
    launch_count: int | None = None
    nvtx_include: tuple[str, ...] = ()
    nvtx_exclude: tuple[str, ...] = ()
    target_processes: str = "all"
    top_n: int | None = None
    launches_per_kernel: int = 1
    first_pass: str = "auto"
    output_base: str = "ncu"
    timeout_s: float | None = None
    stream_stderr: bool = True
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _choice("--set", self.section_set, SETS)
        _choice("--clock-control", self.clock_control, CLOCK_CONTROLS)
        _choice("--kernel-name-base", self.kernel_name_base, NAME_BASES)
        _choice("--target-processes", self.target_processes, ("all", "application-only"))
        _choice("top-N first pass", self.first_pass, FIRST_PASSES)
        for name, low in (("launch_skip", 0), ("launch_count", 1), ("top_n", 1),
                          ("launches_per_kernel", 1)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < low):
                raise UsageError(f"ncu {name} must be an integer >= {low}, not {value!r}")
        if self.top_n is not None and self.kernel_name is not None:
            raise UsageError("ncu top-N mode chooses the kernel names itself",
                             hint="give either --top-n or --kernel-name, not both")
        if self.top_n is not None and self.launch_count is not None:
            raise UsageError("ncu top-N mode profiles K launches of each top kernel",
                             hint="give the launches per kernel with --top-n-launches K, not --launch-count")


def _choice(flag: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise UsageError(f"ncu {flag} {value!r} is not one of {', '.join(allowed)}")


def _filter_args(options: NcuOptions) -> list[str]:
    args: list[str] = []
    if options.kernel_name is not None:
        args += ["--kernel-name-base", options.kernel_name_base, "--kernel-name", options.kernel_name]
    if options.launch_skip is not None:
        args += ["--launch-skip", str(options.launch_skip)]
    if options.launch_count is not None:
        args += ["--launch-count", str(options.launch_count)]
    if options.nvtx_include or options.nvtx_exclude:
        args.append("--nvtx")
        for rule in options.nvtx_include:
            args += ["--nvtx-include", rule]
        for rule in options.nvtx_exclude:
            args += ["--nvtx-exclude", rule]
    return args


def _target(target: Sequence[str]) -> list[str]:
    if not target:
        raise UsageError("no command to profile", hint="put it after --, e.g. -- python run.py")
    return list(target)


def profile_command(target: Sequence[str], options: NcuOptions) -> list[str]:
    """The ``ncu`` command line writing ``<output_base>.ncu-rep`` for ``target`` (pure)."""
    return [
        "ncu", "--set", options.section_set, "--clock-control", options.clock_control,
        "--target-processes", options.target_processes, *_filter_args(options),
        "--export", options.output_base, "--force-overwrite",
        "--log-file", f"{options.output_base}.log", *options.extra_args, *_target(target),
    ]


def timing_pass_command(target: Sequence[str], options: NcuOptions, csv_path: Path | str) -> list[str]:
    """The cheap ncu pass of top-N mode: only ``gpu__time_duration.sum``, as CSV (pure).

    It keeps the NVTX filters and ``launch_skip``, prints units in base units (ns) and names
    demangled, the basis the per-kernel passes match with ``--kernel-name-base demangled``.
    """
    bounds = dataclasses.replace(options, kernel_name=None, launch_count=None, top_n=None)
    return [
        "ncu", "--metrics", TIME_METRIC, "--csv", "--print-units", "base",
        "--print-kernel-base", "demangled", "--clock-control", options.clock_control,
        "--target-processes", options.target_processes, *_filter_args(bounds),
        "--log-file", str(csv_path), *_target(target),
    ]


def escape_regex(name: str) -> str:
    """``name`` with every regular-expression metacharacter backslash-escaped."""
    return _REGEX_SPECIAL.sub(r"\\\1", name)


def kernel_regex(names: Sequence[str]) -> str:
    """An ncu ``--kernel-name`` value matching exactly these names: ``regex:^(a|b)$``."""
    if not names:
        raise UsageError("no kernel names to filter on")
    return "regex:^(" + "|".join(escape_regex(n) for n in names) + ")$"


def exact_name_regex(name: str) -> str:
    """An ncu ``--kernel-name`` value matching exactly one demangled name.

    Every metacharacter is escaped (templated names hold ``<>()*,:``) and each run of spaces
    matches any spacing, since demanglers differ on ``T *`` vs ``T*`` and ``> >`` vs ``>>``.
    """
    parts = re.split(r"\s+|(?<=[*&,<>()])|(?=[*&,<>()])", name.strip())
    tokens = [escape_regex(p) for p in parts if p]
    if not tokens:
        raise UsageError("no kernel name to filter on")
    return "regex:^" + r"\s*".join(tokens) + "$"


def _strip_balanced(text: str, open_ch: str, close_ch: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_ch:
            depth += 1
        elif ch == close_ch and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def function_base_name(name: str) -> str:
    """The function name ncu's ``function`` basis (and nsys's ``shortName``) uses.

    ``void at::native::vectorized_elementwise_kernel<(int)4, F>(int, T2)`` becomes
    ``vectorized_elementwise_kernel``: parameters, template arguments, return type and
    namespaces are dropped. A name that is already a base name is returned unchanged.
    """
    text = name.strip()
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                text = text[:i]
                break
    text = _strip_balanced(text, "<", ">").strip()
    text = text.rsplit(" ", 1)[-1]
    return text.rsplit("::", 1)[-1] or name.strip()


def _number(text: str) -> float | None:
    value = text.strip()
    if not value or value.lower() == "n/a":
        return None
    value = value.replace(".", "").replace(",", ".") if value.count(".") > 1 else value.replace(",", "")
    try:
        return float(value)
    except ValueError:
        return None


def parse_kernel_times_csv(text: str, *, source: str = "<ncu csv>") -> dict[str, float]:
    """Total ``gpu__time_duration.sum`` per kernel name (ns) from ``ncu --csv`` details output.

    Lines before the header (program output, ``==PROF==`` lines) are skipped; thousands
    separators and per-row units are handled; results without the metric are left out.

    Raises:
        InputFormatError: no ncu CSV header in ``text``.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise InputFormatError(source, "no ncu CSV header (a line starting with \"ID\")",
                               hint="the ncu pass printed no results: check the ncu log above")
    rows = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    needed = {"Kernel Name", "Metric Name", "Metric Unit", "Metric Value"}
    if not needed <= set(rows.fieldnames or ()):
        raise InputFormatError(source, f"ncu CSV lacks column(s) {sorted(needed - set(rows.fieldnames or ()))}",
                               hint="run the pass with --csv on the details page (the default)")
    totals: dict[str, float] = {}
    for row in rows:
        if row["Metric Name"] != TIME_METRIC:
            continue
        value = _number(row["Metric Value"])
        scale = _TIME_UNITS_NS.get(row["Metric Unit"].strip())
        if value is None or scale is None:
            continue
        totals[row["Kernel Name"]] = totals.get(row["Kernel Name"], 0.0) + value * scale
    return totals


def kernel_times_from_nsys_sqlite(path: Path | str, *, by: str = "shortName") -> dict[str, float]:
    """Total GPU time per kernel name (ns) in an ``nsys export --type sqlite`` file.

    Args:
        path: the export.
        by: ``shortName`` (function name) or ``demangledName`` (exact, with template arguments).

    Raises:
        InputFormatError: ``path`` is not an nsys SQLite export.
    """
    if by not in ("shortName", "demangledName"):
        raise UsageError(f"kernel names by {by!r}: use shortName or demangledName")
    query = (
        "SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
        f"JOIN StringIds AS s ON s.id = k.{by} GROUP BY s.value"
    )
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "StringIds" not in tables:
                raise InputFormatError(path, "not an nsys SQLite export (no StringIds table)")
            if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
                return {}
            return {name: float(total) for name, total in con.execute(query)}
    except sqlite3.DatabaseError as exc:
        raise InputFormatError(path, f"unreadable SQLite file ({exc})") from None


def merge_by_function(times: Mapping[str, float]) -> dict[str, float]:
    """Totals merged by :func:`function_base_name`, the basis the second pass matches."""
    merged: dict[str, float] = {}
    for name, total in times.items():
        base = function_base_name(name)
        merged[base] = merged.get(base, 0.0) + total
    return merged


def top_kernels(times: Mapping[str, float], n: int, *, exact: bool = False) -> list[tuple[str, float]]:
    """The ``n`` kernels with the largest total time (ns), largest first.

    Args:
        times: total time per kernel name.
        n: how many.
        exact: rank the names as given (demangled: one entry per template instantiation)
            instead of merging them by :func:`function_base_name`.

    Ties are broken by name so the choice is deterministic.
    """
    merged = dict(times) if exact else merge_by_function(times)
    ranked = sorted(merged.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:n]


def per_kernel_options(options: NcuOptions, names: Sequence[str]) -> list[NcuOptions]:
    """The options of top-N's profiled runs: one per kernel, exactly that demangled name, K launches.

    Each run writes ``<output_base>_top<rank>`` and keeps the NVTX filters and ``launch_skip``
    (which then skips that kernel's own first launches).
    """
    return [dataclasses.replace(options, top_n=None, kernel_name=exact_name_regex(name),
                                kernel_name_base="demangled", launch_count=options.launches_per_kernel,
                                output_base=f"{options.output_base}_top{rank}")
            for rank, name in enumerate(names, start=1)]


def choose_first_pass(options: NcuOptions, nsys_available: bool) -> str:
    """``nsys`` or ``ncu``: nsys is cheaper, but only ncu honours the NVTX filters."""
    if options.first_pass != "auto":
        return options.first_pass
    has_nvtx = bool(options.nvtx_include or options.nvtx_exclude)
    return "nsys" if nsys_available and not has_nvtx else "ncu"


class NcuCollector:
    """Nsight Compute: measured FLOPs, DRAM bytes and roofs for each profiled kernel launch."""

    name = "ncu"
    options_type = NcuOptions

    def is_available(self) -> bool:
        """True when ``ncu`` is on PATH."""
        return shutil.which("ncu") is not None

    def command(self, target: Sequence[str], options: NcuOptions) -> list[str]:
        """The ``ncu`` command :meth:`collect` runs (without top-N's first pass)."""
        return profile_command(target, options)

    def collect(self, target: Sequence[str], out_dir: Path, options: NcuOptions) -> RawCapture:
        """Profile ``target`` into ``out_dir/<output_base>.ncu-rep``.

        Raises:
            ToolNotFoundError: ncu (or nsys for an nsys first pass) is not on PATH.
            CollectorError: ncu failed and wrote no report, or profiled no kernel.
            CaptureInterrupted: Ctrl-C; its ``capture`` holds the partial report.
        """
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        options = dataclasses.replace(options, output_base=str(out_dir / Path(options.output_base).name))
        version = tool_version("ncu")
        log = _PassLog()
        if options.top_n is not None:
            return self._collect_top(target, out_dir, options, log, version)
        cmd = profile_command(target, options)
        log.commands.append(tuple(cmd))
        report = Path(options.output_base + ".ncu-rep")
        since = time.time()
        outcome = _run_ncu(cmd, report, options)
        _require_report(report, since, cmd)
        return _capture(self.name, [report], log, version, outcome, options)

    def _collect_top(self, target: Sequence[str], out_dir: Path, options: NcuOptions, log: _PassLog,
                     version: str | None) -> RawCapture:
        """Top-N: rank, then one profiled run per top kernel; the reports in rank order."""
        names = _rank(target, out_dir, options, log)
        reports: list[Path] = []
        outcomes: list[Outcome] = []
        for name, opts in zip(names, per_kernel_options(options, names)):
            cmd = profile_command(target, opts)
            log.commands.append(tuple(cmd))
            report = Path(opts.output_base + ".ncu-rep")
            since = time.time()
            outcomes.append(_run_ncu(cmd, report, opts))
            if fresh_file(report, since):
                reports.append(report)
            else:
                log.warnings.append(f"top-N: ncu profiled no launch of {name[:160]} (it ran in the first pass "
                                    "only, or its name differs between the two passes)")
            if outcomes[-1].interrupted:
                break
        outcome = Outcome(partial=any(o.partial for o in outcomes), interrupted=any(o.interrupted for o in outcomes),
                          warnings=tuple(w for o in outcomes for w in o.warnings))
        if not reports and not outcome.interrupted:
            raise CollectorError("ncu", log.commands[-1], 0, _log_tail(Path(options.output_base + "_top1.log")),
                                 hint="no top kernel was profiled in the per-kernel runs: do the kernel names of "
                                 "the first pass match ncu's demangled names? try --kernel-name instead")
        log.params["launches_per_kernel"] = options.launches_per_kernel
        return _capture(self.name, reports, log, version, outcome, options)


@dataclass
class _PassLog:
    commands: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    params: dict[str, object] = dataclasses.field(default_factory=dict)


def _rank(target: Sequence[str], out_dir: Path, options: NcuOptions, log: _PassLog) -> list[str]:
    """The demangled names of the top-N kernels, from the first pass."""
    how = choose_first_pass(options, shutil.which("nsys") is not None)
    pass_fn = _nsys_pass if how == "nsys" else _ncu_pass
    top = top_kernels(pass_fn(target, out_dir, options, log), options.top_n or 0, exact=True)
    if not top:
        raise CollectorError(how, log.commands[-1], 0, "the first pass recorded no CUDA kernel",
                             hint="does the program run on the GPU? check the NVTX filters")
    log.params.update(top_n=options.top_n, first_pass=how,
                      top_kernels=[{"name": n, "total_ns": t} for n, t in top])
    return [n for n, _ in top]


def _nsys_pass(target: Sequence[str], out_dir: Path, options: NcuOptions,
               log: _PassLog) -> dict[str, float]:
    opts = nsys.NsysOptions(trace=("cuda",), output_base="topn_pass", timeout_s=options.timeout_s,
                            stream_stderr=options.stream_stderr)
    capture = nsys.NsysCollector().collect(target, out_dir, opts)
    log.commands.extend(capture.commands)
    log.warnings.extend(f"top-N first pass: {w}" for w in capture.warnings)
    return kernel_times_from_nsys_sqlite(capture.files[0], by="demangledName")


def _ncu_pass(target: Sequence[str], out_dir: Path, options: NcuOptions,
              log: _PassLog) -> dict[str, float]:
    csv_path = out_dir / "topn_pass.csv"
    cmd = timing_pass_command(target, options, csv_path)
    log.commands.append(tuple(cmd))
    outcome = _run_ncu(cmd, csv_path, options, log_file=csv_path)
    if outcome.interrupted:
        raise KeyboardInterrupt
    log.warnings.extend(f"top-N first pass: {w}" for w in outcome.warnings)
    text = csv_path.read_text(errors="replace") if csv_path.exists() else ""
    if '"ID",' not in text:
        raise CollectorError("ncu", cmd, 0, _log_tail(csv_path) or "no output",
                             hint=ncu_hint(text) or "the timing pass profiled no kernel")
    return parse_kernel_times_csv(text, source=str(csv_path))


def _log_tail(log: Path, lines: int = 5) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def ncu_hint(log_text: str) -> str | None:
    """The fix for an ncu failure recognised in its log, or None."""
    if "ERR_NVGPUCTRPERM" in log_text:
        return ("this user may not read GPU performance counters: run as root, or load the driver "
                "with NVreg_RestrictProfilingToAdminUsers=0 (https://developer.nvidia.com/ERR_NVGPUCTRPERM)")
    if "No kernels were profiled" in log_text:
        return "no kernel matched the filters (--kernel-name, NVTX ranges, --launch-skip)"
    return None


def _run_ncu(cmd: Sequence[str], output: Path, options: NcuOptions,
             log_file: Path | None = None) -> Outcome:
    log_file = log_file or output.with_suffix(".log")
    try:
        return run_profiler(cmd, output, timeout_s=options.timeout_s,
                            on_stderr=nsys.stderr_echo(options.stream_stderr))
    except CollectorError as exc:
        tail = "\n".join(x for x in (exc.stderr_tail, _log_tail(log_file)) if x)
        raise CollectorError("ncu", exc.cmd, exc.returncode, tail,
                             hint=ncu_hint(tail) or exc.hint) from None


def _require_report(report: Path, since: float, cmd: Sequence[str]) -> None:
    if fresh_file(report, since):
        return
    tail = _log_tail(report.with_suffix(".log"))
    hint = ncu_hint(tail) or "ncu wrote no report: see its log above"
    raise CollectorError("ncu", cmd, 0, tail or f"no report at {report}", hint=hint)


def _capture(name: str, reports: Sequence[Path], log: _PassLog, version: str | None,
             outcome: Outcome, options: NcuOptions) -> RawCapture:
    params = {
        "set": options.section_set, "clock_control": options.clock_control,
        "kernel_name": options.kernel_name, "launch_skip": options.launch_skip,
        "launch_count": options.launch_count, "nvtx_include": list(options.nvtx_include),
        "nvtx_exclude": list(options.nvtx_exclude), **log.params,
    }
    logs = [r.with_suffix(".log") for r in reports]
    files = (*reports, *(f for f in logs if f.exists()))
    capture = RawCapture(collector=name, files=files, commands=tuple(log.commands),
                         tool_version=version, partial=outcome.partial,
                         warnings=(*log.warnings, *outcome.warnings), params=params)
    if outcome.interrupted:
        raise CaptureInterrupted(capture)
    return capture
