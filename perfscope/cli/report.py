"""``perfscope report PATH -o FILE.html``: the standalone, offline HTML report."""

from __future__ import annotations

from pathlib import Path

import click

from perfscope.errors import OutputExistsError


@click.command()
@click.argument("path", type=click.Path())
@click.option("-o", "--output", type=click.Path(), default=None,
              help="HTML file to write (default: report.html inside the report folder, or PATH.html).")
@click.option("--cdn", is_flag=True, help="Load plotly.js from its CDN instead of inlining it (smaller file, needs internet).")
@click.option("--force", is_flag=True, help="Overwrite an existing HTML file (the report folder's own report.html too).")
def report(path: str, output: str | None, cdn: bool, force: bool) -> None:
    """Write the standalone HTML report of a report folder (or any importable profiler output)."""
    from perfscope.api import load
    from perfscope.dashboard.html_report import write_html

    rep = load(path)
    if output:
        target = Path(output)
    elif rep.path is not None:
        target = rep.path / "report.html"
    else:
        target = Path(Path(path).name.split(".")[0] + ".html")
    if target.exists() and not force:  # the report's own report.html too: every writer's rule
        raise OutputExistsError(target, flag="-o")
    written = write_html(rep, target, cdn=cdn)
    click.echo(f"wrote {written}")
