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
# -- multi-rank import (logic in perfscope/cli/_ranks.py and perfscope.analysis.ranks_dask) --
@click.option("--ranks", is_flag=True, help="PATH is a folder or quoted glob of per-rank traces: import them in "
              "parallel on Dask into one multi-rank report.")
@click.option("--scheduler", default=None, metavar="ADDRESS", help="With --ranks: run on this Dask scheduler "
              "(tcp://HOST:8786) instead of a local cluster.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="With --ranks: local Dask workers "
              "(default: sized to this machine's CPUs and memory).")
def import_(path: str, out: str | None, force: bool, html: bool, ranks: bool, scheduler: str | None,
            workers: int | None) -> None:
    """Import a Kineto trace, an nsys SQLite export / .nsys-rep, or an ncu report / CSV."""
    if ranks or scheduler or workers:
        from ._ranks import run_rank_import

        if not ranks:
            raise click.UsageError("--scheduler and --workers go with --ranks")
        run_rank_import(path, out=out, force=force, html=html, scheduler=scheduler, workers=workers)
        return
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
