"""``perfscope report PATH -o FILE.html``: the standalone, offline HTML report."""

from __future__ import annotations

from pathlib import Path

import click

from perfscope.errors import OutputExistsError


@click.command()
@click.argument("path", type=click.Path())
@click.option("-o", "--output", type=click.Path(), default=None,
              help="HTML file to write: X.html, X (.html added) or DIR/ (DIR/NAME.html) (default: report.html inside "
              "the report folder, or NAME.html).")
@click.option("--cdn", is_flag=True, help="Load plotly.js from its CDN instead of inlining it (smaller file, needs internet).")
@click.option("--force", is_flag=True, help="Overwrite an existing HTML file (the report folder's own report.html too).")
def report(path: str, output: str | None, cdn: bool, force: bool) -> None:
    """Write the standalone HTML report of a report folder (or any importable profiler output)."""
    from perfscope.api import load
    from perfscope.dashboard.html_report import write_html
    from perfscope.outpaths import out_path

    rep = load(path)
    stem = rep.path.name.removesuffix(".perfscope") if rep.path is not None else Path(path).name.split(".")[0]
    default = rep.path / "report.html" if rep.path is not None else Path(stem + ".html")
    target = out_path(output, default=default, suffix=".html", also=(".htm",), name=stem + ".html")
    if target.exists() and not force:  # the report's own report.html too: every writer's rule
        raise OutputExistsError(target, flag="-o")
    written = write_html(rep, target, cdn=cdn)
    click.echo(f"wrote {written}")
