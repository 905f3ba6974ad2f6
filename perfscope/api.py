"""The notebook / library API: ``load``, ``profile`` and saving a report with its HTML."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError

if TYPE_CHECKING:
    import os
    from collections.abc import Iterator, Mapping, Sequence

    from perfscope.analysis.projection.project import WhatifResult

    from .device import DeviceSpec
    from .report import Report


def load(path: str | os.PathLike[str]) -> Report:
    """A Report from a ``.perfscope`` folder, or from any profiler output perfscope imports
    (Kineto trace, nsys SQLite / .nsys-rep, ncu report / CSV), detected from its content."""
    from perfscope.analysis.readers.detect import import_file

    return import_file(Path(path))


def save_with_html(report: Report, target: str | os.PathLike[str], *, force: bool = False,
                   html: bool = True, extra_files: Mapping[str, bytes | str | Path] | None = None) -> Path:
    """Save ``report`` atomically with ``report.html`` inside (when the HTML renderer is installed)."""
    files: dict[str, bytes | str | Path] = dict(extra_files or {})
    if html:
        from perfscope.dashboard.html_report import render_html

        files["report.html"] = render_html(report)
    return report.save(Path(target), force=force, extra_files=files)


@dataclass
class ProfileRun:
    """The handle ``with perfscope.profile() as run:`` gives; ``run.report`` is set on exit."""

    device: str
    collectors: tuple[str, ...]
    report: Report | None = None
    trace_dir: Path | None = None
    warnings: list[str] = field(default_factory=list)


@contextmanager
def profile(collectors: Sequence[str] = ("torch",), *, device: str = "auto",
            roofs: DeviceSpec | None = None, name: str = "notebook", stack: bool = False) -> Iterator[ProfileRun]:
    """Profile the code in the ``with`` block and put the analysed Report on ``run.report``.

    Every transformers ``generate()`` call in the block becomes steps (one per forward: prefill,
    decode) and requests (one per sequence) of the report (docs/huggingface.md). The block runs
    once, so its TTFT/TPOT are the profiled run's.

    Args:
        collectors: ``torch`` (torch.profiler, shapes recorded) and optionally ``nvml``
            (GPU counters sampled in the background).
        device: ``auto``, ``cpu`` or ``cuda``: which device's roofs classify the kernels.
        roofs: roofs to use instead of measuring this machine's (cached) roofs.
        stack: record Python stacks (torch.profiler ``with_stack``): the report then has the
            nn.Module hierarchy (``report.hierarchy()``), at the cost of a slower profiled run.

    Examples:
        >>> import torch, perfscope
        >>> with perfscope.profile(roofs=perfscope.device.DeviceSpec("cpu", "cpu")) as run:
        ...     _ = torch.ones(64, 64) @ torch.ones(64, 64)
        >>> "aten::matmul" in set(run.report.kernels["name"])
        True
    """
    import torch

    from perfscope.collectors.hf_generate import GenerateRecorder
    from perfscope.collectors.roofs import device_roofs
    from perfscope.collectors.torch_profiler import _export, start_profiler, stop_profiler
    from perfscope.sessions.profile import attach_counters, hf_report, resolve_device

    unknown = set(collectors) - {"torch", "nvml"}
    if unknown or "torch" not in collectors:
        raise UsageError(f"perfscope.profile() takes collectors 'torch' (required) and 'nvml', got {list(collectors)}")
    dev = resolve_device(device)
    spec = roofs or device_roofs(dev)
    run = ProfileRun(device=dev, collectors=tuple(collectors))
    sampler = _nvml_sampler() if "nvml" in collectors else None
    if sampler is not None:
        sampler.__enter__()
    recorder = GenerateRecorder()
    prof = start_profiler(dev.startswith("cuda"), with_stack=stack)
    try:
        with recorder:
            yield run
    finally:
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        stop_profiler(prof)
        if sampler is not None:
            sampler.__exit__(None, None, None)
        run.trace_dir = Path(tempfile.mkdtemp(prefix="perfscope-"))
        trace = _export(prof, run.trace_dir)
        report = hf_report(trace, spec, recorder.recording, cuda=dev.startswith("cuda")).with_manifest(name=name)
        if sampler is not None:
            report = attach_counters(report, sampler)
        run.report = report


def _nvml_sampler() -> Any:
    from perfscope.collectors.nvml import NvmlSampler

    return NvmlSampler()


def _slug(q: Any) -> str:
    text = "_".join(f"{k}{v}" for k, v in asdict(q).items() if v is not None) or "same"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def run_whatif(report: Report, *, out: str | os.PathLike[str] | None = None, force: bool = False, html: bool = True,
               **values: Any) -> list[WhatifResult]:
    """``perfscope whatif``: every question of the sweep ``values`` asks, projected from ``report``, each saved
    (with its HTML report) where ``out`` says (:mod:`perfscope.outpaths`): one question, the report ``out``
    names (``X.perfscope``; ``X``: ``X.perfscope``; ``DIR/``: ``DIR/<measured>__<question>.perfscope``);
    several, a folder ``out`` with ``<measured>__<question>.perfscope`` each.

    Raises:
        UsageError: a question the model cannot answer, or several questions and an ``out`` named like one
            report; OutputExistsError: a report to write exists (without ``force``). Both before anything
            is projected or written."""
    from perfscope.analysis.projection.project import (
        WhatifResult,
        check_question,
        project,
        projected_metrics,
        sweep,
    )
    from perfscope.errors import OutputExistsError
    from perfscope.outpaths import out_folder, out_path

    results = []
    questions = sweep(**values)
    for q in questions:  # every question checked before any is projected or written
        check_question(q, report)
    names = [f"{report.name}__{_slug(q)}.perfscope" for q in questions]
    targets: list[Path | None] = [None] * len(questions)
    if out is not None:
        targets = [out_path(out, default=names[0])] if len(questions) == 1 else \
            [out_folder(out) / n for n in names]
        for t in targets:
            if t is not None and t.exists() and not force:
                raise OutputExistsError(t)
    for q, target in zip(questions, targets):
        projected = project(report, q)
        path = save_with_html(projected, target, force=force, html=html) if target is not None else None
        results.append(WhatifResult(q, projected, path, projected_metrics(projected)))
    return results
