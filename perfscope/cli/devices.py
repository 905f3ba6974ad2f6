"""``perfscope devices``: this machine's roofs (measured once, cached) with their provenance."""

from __future__ import annotations

import click

from ._common import echo_json, records


@click.command()
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto (CUDA when present, and the CPU).")
@click.option("--refresh", is_flag=True, help="Measure again instead of using the cached result.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def devices(device: str, refresh: bool, as_json: bool) -> None:
    """Measure (or read the cached) compute and memory roofs of this machine."""
    from perfscope.analysis.summary import roofs_table
    from perfscope.collectors.roofs import device_roofs
    from perfscope.format import number, si
    from perfscope.session import resolve_device
    from perfscope.text_report import table

    targets = ["cpu"]
    if device == "auto":
        cuda = resolve_device("auto")
        if cuda != "cpu":
            targets.append(cuda)
    else:
        targets = [resolve_device(device)]
    specs = [device_roofs(t, refresh=refresh) for t in targets]
    if as_json:
        echo_json([{"device": t, "name": s.name, "kind": s.kind, "properties": s.properties,
                    "roofs": records(roofs_table(s))} for t, s in zip(targets, specs)])
        return
    for t, spec in zip(targets, specs):
        click.echo(f"{t}: {spec.name}")
        rows = [[r["roof"], si(r["value"], "FLOP/s" if r["kind"] == "compute" else "B/s"),
                 number(r["ridge_flop_per_byte"], digits=2), r["provenance"], r["method"]]
                for _, r in roofs_table(spec).iterrows()]
        click.echo(table(["roof", "peak", "ridge FLOP/B", "provenance", "how"], rows))
        if spec.properties.get("cached"):
            click.echo(f"  (cached: {spec.properties['cached']}; --refresh measures again)")
