"""``perfscope doctor [--json]``: report what this machine can profile, with fixes."""

from __future__ import annotations

import click

from perfscope.doctor import healthy, render_text, run_checks, to_json

from ._common import echo_json


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True,
              help="Seconds to wait for each `nsys --version` / `ncu --version`.")
def doctor(as_json: bool, timeout_s: float) -> None:
    """Check Python, torch/CUDA, the GPU driver and NVML, nsys, ncu and counter permissions.

    Exits 0 when perfscope itself works, even if GPU tools are missing (it is a report);
    exits 1 when a required check fails.
    """
    checks = run_checks(timeout_s=timeout_s)
    if as_json:
        echo_json(to_json(checks))
    else:
        click.echo(render_text(checks))
    if not healthy(checks):
        raise click.exceptions.Exit(1)
