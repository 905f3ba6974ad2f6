"""Helpers shared by the subcommands: progress display, output paths, JSON printing."""

from __future__ import annotations

import datetime as _dt
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from perfscope.format import dumps, records
from perfscope.outpaths import out_path
from perfscope.report import REPORT_SUFFIX

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from perfscope.device import DeviceSpec

__all__ = ["OUT_RULE", "Finite", "default_run_dir", "echo_json", "out_path", "records", "roofs_spec",
           "stage_progress"]


class Finite(click.FloatRange):
    """A float option in a range that also refuses NaN and ±inf (click's FloatRange lets NaN through:
    every comparison with it is false), so a value is checked before any arithmetic or allocation."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if out is not None and not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


@contextmanager
def stage_progress(total: int, *, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A progress bar over named stages (on stderr); yields the callback that advances it.

    ``PERFSCOPE_PROGRESS=lines`` prints each stage as a line instead (``perfscope: <stage>``), for
    logs and for anything waiting on a stage (the bar shows on a terminal only)."""
    if not enabled:
        yield lambda _label: None
        return
    if os.environ.get("PERFSCOPE_PROGRESS") == "lines":
        def line(label: str) -> None:
            click.echo(f"perfscope: {label}", err=True)
            sys.stderr.flush()

        yield line
        return
    from tqdm import tqdm

    bar = tqdm(total=total, file=sys.stderr, leave=False, dynamic_ncols=True, disable=None,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]")
    started = False

    def advance(label: str) -> None:
        nonlocal started
        if started:
            bar.update(1)
        started = True
        bar.set_description_str(label)

    try:
        yield advance
        bar.update(bar.total - bar.n)
    finally:
        bar.close()


OUT_RULE = "X.perfscope, X (.perfscope added) or DIR/ (a folder: the default name inside it)"
"""How every ``--out`` is read, for the help texts (:mod:`perfscope.outpaths` has the rule)."""


def default_run_dir(stem: str) -> Path:
    """``runs/<timestamp>-<stem>.perfscope`` under the current directory."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{stem}{REPORT_SUFFIX}"


def echo_json(payload: Any) -> None:
    """Print ``payload`` as JSON (NaN/inf become null, numpy scalars plain numbers)."""
    click.echo(dumps(payload))


def roofs_spec(spec: str) -> DeviceSpec:
    """Device roofs named on the command line (``--roofs`` of import and compare): ``cuda[:N]``
    (measured here), a report folder, or a datasheet row's name (an unknown name is a UsageError
    listing close ones)."""
    from perfscope.datasheets import pick_datasheet, sheet_spec
    from perfscope.errors import InputFormatError, UsageError
    from perfscope.format import terminal_text
    from perfscope.report import Report

    if spec.startswith("cuda"):
        from perfscope.collectors.roofs import device_roofs
        from perfscope.engine.generate import resolve_device

        resolve_device(spec)  # a clear error when there is no GPU
        return device_roofs(spec)
    if not Path(spec).is_dir():
        if spec.endswith(".perfscope") or "/" in spec:
            raise UsageError(f"--roofs {spec!r}: no such report folder",
                             hint="give a .perfscope report folder, a datasheet model, or `cuda`")
        sheet, note = pick_datasheet(spec, "--roofs")
        if note:
            click.echo(terminal_text(f"  note: {note}"), err=True)
        return sheet_spec(sheet)
    report = Report.load(spec)
    if report.device is None or not report.device.compute:
        raise InputFormatError(spec, "has no device roofs to lend", hint="use a report made on the profiled GPU")
    return report.device
