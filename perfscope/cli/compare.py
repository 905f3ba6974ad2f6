"""``perfscope compare A B``: did a change help? Per phase, the top movers by name, and a verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from perfscope.analysis.summaries.compare import KEYS, Comparison, name_view, phase_view, tail_view
from perfscope.format import terminal_text
from perfscope.text_report import table

from ._common import echo_json, roofs_spec

if TYPE_CHECKING:
    import pandas as pd


def _table(view: pd.DataFrame) -> str:
    return table(list(view.columns), view.to_numpy().tolist())


def render_comparison(c: Comparison, top: int = 10, sources: tuple[str, str] | None = None) -> str:
    """The terminal text of a comparison: phases, top movers, verdict (``sources``: the paths given)."""
    where = sources or ("", "")
    lines = [f"A = {c.a}" + (f"  ({where[0]})" if where[0] else ""),
             f"B = {c.b}" + (f"  ({where[1]})" if where[1] else ""), "",
             "Phases" + {"headline": " (headline runs: warm, without the profiler)",
                         "profiled": " (profiled runs)"}.get(c.run, "")]
    lines.append(_table(phase_view(c)))
    lines += ["", f"Top movers (matched by {c.key}; the profiled runs' kernels)"]
    lines.append(_table(name_view(c, top)))
    tails = tail_view(c)
    if len(tails):
        lines += ["", "Tails: how each part of the p99 moved (the parts add up to the p99)"]
        lines.append(_table(tails))
    lines += ["", "Verdict"] + [f"  - {v}" for v in c.verdict]
    return terminal_text("\n".join(lines) + "\n")


@click.command()
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (by_phase, by_name, verdict).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="How many movers to list.")
@click.option("--by", "key", default="short_name", show_default=True, type=click.Choice(KEYS),
              help="Match kernels by short name (template arguments dropped), exact name, launching op, or module path.")
@click.option("--profiled", is_flag=True, help="Compare the profiled runs' phases instead of the headline runs' "
              "(the warm runs without the profiler, the numbers `analyze` tells you to quote).")
@click.option("--roofs", default=None, metavar="NAME|cuda|REPORT",
              help="Take both sides' MFU, MBU and % of roof against these roofs (a datasheet row, `cuda`, or a "
              "report folder's). Default: A's, when both ran on the same device.")
def compare(a: str, b: str, as_json: bool, top: int, key: str, profiled: bool, roofs: str | None) -> None:
    """Compare report A (before) with report B (after): phases, biggest movers, bound shifts.

    A and B are report folders or any profiler output perfscope imports. Phases are compared on the
    headline runs (warm, without the profiler) unless --profiled, against one roof.
    """
    from perfscope.analysis.summaries.compare import compare as compare_reports
    from perfscope.api import load

    spec = roofs_spec(roofs) if roofs else None
    result = compare_reports(load(a), load(b), key=key, profiled=profiled, roofs=spec)
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo(render_comparison(result, top, (a, b)), nl=False)
