"""``perfscope devices``: this machine's roofs (measured once, cached) with their provenance, or
(``--datasheet``) the datasheet table perfscope falls back on."""

from __future__ import annotations

import re

import click

from perfscope.format import terminal_text

from ._common import echo_json, records


@click.command()
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto (CUDA when present, and the CPU).")
@click.option("--refresh", is_flag=True, help="Measure again instead of using the cached result.")
@click.option("--datasheet", is_flag=True, help="List the datasheet table instead (dense TFLOP/s per precision, "
              "with-sparsity in parentheses, bandwidth, boost clock, source): the names `import --roofs` takes.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def devices(device: str, refresh: bool, datasheet: bool, as_json: bool) -> None:
    """Measure (or read the cached) compute and memory roofs of this machine."""
    if datasheet:
        _datasheet_table(as_json)
        return
    from perfscope.analysis.summaries.kernels import roofs_table
    from perfscope.collectors.roofs import device_roofs
    from perfscope.format import number, si
    from perfscope.sessions.profile import resolve_device
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
    from perfscope.roof_checks import roof_problems, roof_warnings

    for t, spec in zip(targets, specs):
        click.echo(terminal_text(f"{t}: {spec.name}"))
        records = spec.properties.get("roof_records") or {}
        doubtful = roof_problems(spec)
        rows = [[r["roof"], si(r["value"], "FLOP/s" if r["kind"] == "compute" else "B/s"),
                 number(r["ridge_flop_per_byte"], digits=2), r["provenance"] + (" (!)" if r["roof"] in doubtful else ""),
                 _age(records.get(r["roof"])), _spread(records.get(r["roof"])), r["method"]]
                for _, r in roofs_table(spec).iterrows()]
        click.echo(table(["roof", "peak", "ridge FLOP/B", "provenance", "measured", "spread", "how"], rows))
        click.echo("  measured: how long ago; spread: how far the repeats' median is above their best "
                   "(a quiet machine repeats within a few %)")
        for line in roof_warnings(spec):
            click.echo(terminal_text(f"  (!) {line}"))
        if spec.properties.get("cached"):
            click.echo(f"  (cached: {spec.properties['cached']}; --refresh measures again)")


def _age(record: object) -> str:
    """``3 d ago`` from a roof record's ``measured_at``; n/a without one."""
    from perfscope.collectors.roofs import roof_age_s
    from perfscope.format import MISSING

    age = roof_age_s(record.get("measured_at") if isinstance(record, dict) else None)
    if not 0 <= age < float("inf"):
        return MISSING
    for unit, seconds in (("d", 86400), ("h", 3600), ("min", 60)):
        if age >= seconds:
            return f"{age / seconds:.0f} {unit} ago"
    return "just now"


def _spread(record: object) -> str:
    from perfscope.format import pct

    return pct(100 * record["spread"]) if isinstance(record, dict) and isinstance(record.get("spread"), (int, float)) \
        else pct(None)


def _datasheet_table(as_json: bool) -> None:
    from perfscope.datasheets import DATASHEETS, PRECISIONS, Datasheet
    from perfscope.format import MISSING, number
    from perfscope.text_report import table

    if as_json:
        echo_json([s.to_dict() for s in DATASHEETS])
        return
    shown = [p for p in PRECISIONS if any(p in s.tflops for s in DATASHEETS)]

    def cell(dense: float | None, sparse: float | None) -> str:
        text = number(dense, digits=1) if dense is not None else MISSING
        return f"{text} ({number(sparse, digits=0)})" if sparse is not None else text

    def memory(s: Datasheet) -> str:
        size = f"{number(s.memory_gb, digits=0)} GB" if s.memory_gb is not None else MISSING
        return f"{size} {s.memory_type}{' (shared)' if s.unified else ''}" if s.memory_type else size

    rows = [[s.model, *(cell(s.tflops.get(p), s.sparse_tflops.get(p)) for p in shown),
             number(s.bandwidth_gb_s, digits=0), memory(s), number(s.boost_clock_mhz, digits=0),
             "/".join(dict.fromkeys(re.findall(r"\[[DP]\]", s.status))) or MISSING] for s in DATASHEETS]
    click.echo("dense TFLOP/s (int8/int4: TOPS), with sparsity in parentheses; memory bandwidth GB/s; memory size "
               "(shared: the GPU's memory is the system's); boost clock MHz; checked: how far the figures are checked")
    click.echo(table(["model", *shown, "GB/s", "memory", "MHz", "checked"], rows))
    click.echo("  [D]: the figures as the source document prints them; [P]: a reproduction (the press, third-party "
               "summaries) or a derivation, said how below; n/a: not published")
    click.echo("sources:")
    for s in DATASHEETS:
        click.echo(f"  {s.model}: {s.source} {s.status}")
