"""``perfscope export REPORT -o trace.pftrace``: the report's timeline for Perfetto or Chrome tracing."""

from __future__ import annotations

import click

from perfscope.format import duration, terminal_text


@click.command()
@click.argument("path", type=click.Path())
@click.option("-o", "--out", "out", required=True, type=click.Path(),
              help="File to write: X.pftrace (perfetto) / X.json (chrome), X (the extension added) or DIR/ (DIR/NAME.pftrace).")
@click.option("--format", "fmt", default="perfetto", show_default=True, type=click.Choice(["perfetto", "chrome"]),
              help="perfetto: protobuf TrackEvent (ui.perfetto.dev); chrome: Chrome trace JSON.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def export(path: str, out: str, fmt: str, force: bool) -> None:
    """Export a report (or any trace perfscope imports) as a Perfetto or Chrome trace."""
    from pathlib import Path

    from perfscope.api import load
    from perfscope.dashboard.export.perfetto import export_trace, lean_report
    from perfscope.outpaths import out_path, single_report
    from perfscope.report import MANIFEST

    folder = single_report(path) or Path(path)
    report = lean_report(folder) if (folder / MANIFEST).is_file() else load(path)  # a report folder: read lean
    suffix = ".pftrace" if fmt == "perfetto" else ".json"  # a name with any trace extension is taken as it is
    also = (".pftrace", ".perfetto-trace", ".pb", ".json")
    stem = folder.name.removesuffix(".perfscope") if (folder / MANIFEST).is_file() else Path(path).name.split(".")[0]
    target = out_path(out, default=stem + suffix, suffix=suffix, also=also)
    stats = export_trace(report, target, format=fmt, force=force)
    kinds = ", ".join(f"{n:,} {k} slices" for k, n in stats.slices.items())
    click.echo(f"wrote {stats.path} ({fmt}): {kinds}; {stats.counter_samples:,} counter samples; "
               f"{stats.tracks} tracks; {duration(stats.kernel_time_ns)} of kernel time")
    if stats.requests:
        click.echo(f"requests: {stats.requests:,} on {stats.request_lanes} lane(s)")
    for note in stats.notes:
        click.echo(terminal_text(f"note: {note}"))
