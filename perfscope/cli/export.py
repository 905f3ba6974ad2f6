"""``perfscope export REPORT -o trace.pftrace``: the report's timeline for Perfetto or Chrome tracing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from perfscope.format import duration, terminal_text

if TYPE_CHECKING:
    from perfscope.analysis.findings import Finding
    from perfscope.dashboard.export.perfetto import LeanReport
    from perfscope.report import Report


@click.command()
@click.argument("path", type=click.Path())
@click.option("-o", "--out", "out", required=True, type=click.Path(),
              help="File to write: X.pftrace (perfetto) / X.json (chrome), X (the extension added) or DIR/ (DIR/NAME.pftrace).")
@click.option("--format", "fmt", default="perfetto", show_default=True, type=click.Choice(["perfetto", "chrome"]),
              help="perfetto: protobuf TrackEvent (ui.perfetto.dev); chrome: Chrome trace JSON.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.option("--findings/--no-findings", "with_findings", default=True, show_default=True,
              help="Draw the findings' evidence (their gaps, kernels, steps) on a 'findings' track; "
                   "--no-findings reads a report folder lean only (the rules need the whole report).")
def export(path: str, out: str, fmt: str, force: bool, with_findings: bool = True) -> None:
    """Export a report (or any trace perfscope imports) as a Perfetto or Chrome trace."""
    from pathlib import Path

    from perfscope.api import load
    from perfscope.dashboard.export.perfetto import export_trace, lean_report
    from perfscope.errors import OutputExistsError
    from perfscope.outpaths import out_path, single_report
    from perfscope.report import MANIFEST

    folder = single_report(path) or Path(path)
    suffix = ".pftrace" if fmt == "perfetto" else ".json"  # a name with any trace extension is taken as it is
    also = (".pftrace", ".perfetto-trace", ".pb", ".json")
    stem = folder.name.removesuffix(".perfscope") if (folder / MANIFEST).is_file() else Path(path).name.split(".")[0]
    target = out_path(out, default=stem + suffix, suffix=suffix, also=also)
    if target.exists() and not force:  # before the rules run on a loaded report
        raise OutputExistsError(target, flag="-o")
    report: Report | LeanReport
    found: list[Finding] | None
    if (folder / MANIFEST).is_file():  # a report folder: the timeline read lean, the findings from the loaded report
        found = _findings_of(str(folder)) if with_findings else []
        report = lean_report(folder)
    else:
        report = load(path)
        found = None if with_findings else []
    stats = export_trace(report, target, format=fmt, force=force, findings=found)
    kinds = ", ".join(f"{n:,} {k} slices" for k, n in stats.slices.items())
    click.echo(f"wrote {stats.path} ({fmt}): {kinds}; {stats.counter_samples:,} counter samples; "
               f"{stats.tracks} tracks; {duration(stats.kernel_time_ns)} of kernel time")
    if stats.requests:
        click.echo(f"requests: {stats.requests:,} on {stats.request_lanes} lane(s)"
                   + (f", {stats.flows:,} flows to the steps they ran in" if stats.flows else ""))
    for note in stats.notes:
        click.echo(terminal_text(f"note: {note}"))


def _findings_of(path: str) -> list[Finding]:
    """The findings of the report folder ``path`` (loaded whole for the rules, then let go before
    the lean export reads its tables)."""
    from perfscope.analysis.findings import run_rules
    from perfscope.api import load

    return run_rules(load(path))
