"""``perfscope dashboard [PATH ...]``: the interactive Dash dashboard over report folders."""

from __future__ import annotations

from pathlib import Path

import click

from perfscope.errors import ToolNotFoundError, UsageError


@click.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--port", type=click.IntRange(1, 65535), default=8050, show_default=True, help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but a loopback address exposes your reports to the network.")
@click.option("--debug", is_flag=True, help="Dash debug mode (reloader and error pop-ups; local use only).")
def dashboard(paths: tuple[str, ...], port: int, host: str, debug: bool) -> None:
    """Serve the reports found under PATH folders (default: runs/ and sample_reports/)."""
    try:
        from perfscope.dashboard.app import DEFAULT_ROOTS, serve
        from perfscope.dashboard.store import ReportStore
        from perfscope.hosts import is_loopback
    except ModuleNotFoundError as exc:
        raise ToolNotFoundError(exc.name or "dash", "install the dashboard extra: pip install -e '.[dashboard]'") from None
    roots = paths or DEFAULT_ROOTS
    missing = [p for p in roots if not Path(p).is_dir()]
    if paths and missing:
        raise UsageError(f"not a folder: {', '.join(missing)}", hint="give folders that contain .perfscope reports")
    entries = ReportStore([p for p in roots if Path(p).is_dir()]).entries()
    if not is_loopback(host):
        click.echo(f"perfscope: warning: serving on {host}, reachable from other machines; the dashboard "
                   "has no authentication. Use --host 127.0.0.1 unless you mean it.", err=True)
    click.echo(f"perfscope dashboard: {len(entries)} report(s) under {', '.join(map(str, roots))}")
    click.echo(f"open http://{host if ':' not in host else f'[{host}]'}:{port}/  (Ctrl-C to stop)")
    serve([p for p in roots if Path(p).is_dir()], host=host, port=port, debug=debug)
