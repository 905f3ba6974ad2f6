"""``perfscope import PATH_OR_GLOB --ranks``: the multi-rank import behind ``perfscope import``.

The work is :func:`perfscope.analysis.ranks.dask_import.import_ranks`; this module picks the output
name, shows progress per rank, adds the rank-view HTML page and prints what was kept and skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from perfscope.report import REPORT_SUFFIX

from ._common import out_path

if TYPE_CHECKING:
    from collections.abc import Mapping


def default_out(source: str) -> Path:
    """``traces/`` or ``'traces/*.json.gz'`` -> ``traces.perfscope`` (one file: its stem)."""
    p = Path(source)
    if any(ch in source for ch in "*?["):
        p = Path(source.split("*")[0].split("?")[0].split("[")[0] or ".").resolve()
        p = p if p.is_dir() else p.parent
    stem = (p.resolve().name if p.is_dir() else p.name.split(".")[0]) or "ranks"
    return Path(stem + REPORT_SUFFIX)


def _render(tables: Any, stragglers: Any, manifest: Mapping[str, Any]) -> dict[str, str]:
    from perfscope.dashboard.figures.ranks import rank_view_html

    return {"ranks.html": rank_view_html(tables, manifest, stragglers)}


def run_rank_import(path: str, *, out: str | None, force: bool, html: bool, scheduler: str | None,
                    workers: int | None) -> None:
    """Import the per-rank traces of ``path`` and print a summary (errors are PerfscopeErrors)."""
    from tqdm import tqdm

    from perfscope.analysis.ranks.dask_import import import_ranks
    from perfscope.analysis.ranks.stats import format_ranks, parse_ranks

    target = out_path(out, default=default_out(path))
    bar = tqdm(total=None, unit="rank", file=sys.stderr, leave=False, disable=None, desc="ranks")

    def progress(done: int, total: int, result: Any) -> None:
        bar.total = total
        rank = result.identity.rank
        who = f"rank {rank}" if rank is not None else Path(result.path).name
        if result.error:  # a failing rank is named at once; the job goes on without it
            tqdm.write(f"  {who} ({Path(result.path).name}) failed: {result.error}", file=sys.stderr)
        bar.set_postfix_str(f"{who} {result.seconds or 0:.1f} s", refresh=False)
        bar.update(1)

    try:
        res = import_ranks(path, target, scheduler=scheduler, workers=workers, force=force,
                           render=_render if html else None, progress=progress)
    finally:
        bar.close()
    plan, summary = res.plan, res.summary
    world = f" of world size {plan.world_size}" if plan.world_size else ""
    rows = res.manifest["tables"]
    click.echo(f"imported ranks {format_ranks(plan.ranks)}{world} from {path}: {rows['kernels']} kernels, "
               f"{rows['ranges']} ranges, {rows['transfers']} transfers -> {res.path}")
    for role, ranks in (summary.get("roles") or {}).items():
        click.echo(f"  {role} ranks: {ranks}")
    click.echo(f"  {summary.get('straggler', {}).get('statement', 'no straggler analysis')}")
    waited = {r for g in summary.get("groups") or [] if g.get("stragglers") for r in parse_ranks(g["ranks"])}
    for row in summary.get("stragglers") or []:
        if row["rank"] not in waited:  # a group held back by its straggler is slow as a whole: said above
            click.echo(f"  straggler: rank {row['rank']} {row['metric']} {row['margin_pct']:.1f}% above the median of "
                       "the others")
    for s in plan.skipped:
        click.echo(f"  skipped {s['path']}: {s['reason']}", err=True)
    if plan.missing:
        click.echo(f"  missing: {len(plan.missing)} ranks have no trace ({format_ranks(plan.missing)})", err=True)
    if html:
        click.echo(f"  rank view: {res.path / 'ranks.html'}")
