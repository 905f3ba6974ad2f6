"""``perfscope doctor [--json]``: report what this machine can profile, with fixes."""

from __future__ import annotations

import json

import click

from perfscope.doctor import healthy, render_text, run_checks, to_json


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
    click.echo(json.dumps(to_json(checks), indent=2) if as_json else render_text(checks))
    if not healthy(checks):
        raise click.exceptions.Exit(1)
