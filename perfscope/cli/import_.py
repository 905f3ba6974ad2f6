"""``perfscope import PATH``: turn a profiler output into a report folder."""

from __future__ import annotations

from pathlib import Path

import click

from ._common import as_report_path


@click.command(name="import")
@click.argument("path", type=click.Path())
@click.option("--out", type=click.Path(), default=None, help="Report folder to write (default: ./NAME.perfscope).")
@click.option("--force", is_flag=True, help="Replace an existing report folder.")
@click.option("--html/--no-html", default=True, show_default=True, help="Also write report.html inside the folder.")
def import_(path: str, out: str | None, force: bool, html: bool) -> None:
    """Import a Kineto trace, an nsys SQLite export / .nsys-rep, or an ncu report / CSV."""
    from perfscope.analysis.importers import import_file
    from perfscope.api import save_with_html

    report = import_file(path)
    target = as_report_path(out) if out else Path(Path(path).name.split(".")[0] + ".perfscope")
    written = save_with_html(report, target, force=force, html=html)
    k = report.kernels
    click.echo(f"imported {path}: {len(k)} kernels, {len(report.ranges)} ranges, "
               f"{len(report.transfers)} transfers -> {written}")
    for w in report.warnings:
        click.echo(f"  warning: {w}", err=True)
