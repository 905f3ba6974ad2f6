"""``perfscope compare A B``: did a change help? Per phase, the top movers by name, and a verdict."""

from __future__ import annotations

import math
from typing import Any

import click

from perfscope.analysis.compare import KEYS, Comparison
from perfscope.text_report import table

from ._common import echo_json


def _time(seconds: Any) -> str:
    from perfscope.analysis.rules._base import fmt_ns

    v = float(seconds)
    return "-" if math.isnan(v) else fmt_ns(v * 1e9)


def _num(value: Any, fmt: str = ".3g", suffix: str = "") -> str:
    v = float(value)
    return "-" if math.isnan(v) else f"{v:{fmt}}{suffix}"


def _phase_rows(c: Comparison) -> list[list[str]]:
    return [[r.phase, _time(r.time_a_s), _time(r.time_b_s), _num(r.delta_pct, "+.1f", "%"),
             _num(r.tokens_per_s_a, ".4g"), _num(r.tokens_per_s_b, ".4g"),
             _num(r.mfu_a_pct, ".3g", "%"), _num(r.mfu_b_pct, ".3g", "%"),
             _num(r.mbu_a_pct, ".3g", "%"), _num(r.mbu_b_pct, ".3g", "%")]
            for r in c.by_phase.itertuples(index=False)]


def _label(value: Any) -> str:
    return value if isinstance(value, str) and value else "-"


def _name_rows(c: Comparison, top: int) -> list[list[str]]:
    rows = []
    for r in c.by_name.head(top).itertuples(index=False):
        a, b = _label(r.bound_a), _label(r.bound_b)
        bound = f"{a} -> {b}" if r.bound_changed else (b if r.status != "vanished" else a)
        name = r.name if len(r.name) <= 60 else r.name[:59] + "…"
        rows.append([name, r.status, str(r.count_a), str(r.count_b), _time(r.time_a_s), _time(r.time_b_s),
                     ("+" if r.delta_s > 0 else "") + _time(r.delta_s), bound])
    return rows


def render_comparison(c: Comparison, top: int = 10, sources: tuple[str, str] | None = None) -> str:
    """The terminal text of a comparison: phases, top movers, verdict (``sources``: the paths given)."""
    where = sources or ("", "")
    lines = [f"A = {c.a}" + (f"  ({where[0]})" if where[0] else ""),
             f"B = {c.b}" + (f"  ({where[1]})" if where[1] else ""), "", "Phases"]
    lines.append(table(["phase", "A", "B", "change", "tok/s A", "tok/s B", "MFU A", "MFU B", "MBU A", "MBU B"],
                       _phase_rows(c)))
    lines += ["", f"Top movers (matched by {c.key})"]
    lines.append(table(["name", "status", "n A", "n B", "A", "B", "change", "bound"], _name_rows(c, top)))
    lines += ["", "Verdict"] + [f"  - {v}" for v in c.verdict]
    return "\n".join(lines) + "\n"


@click.command()
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (by_phase, by_name, verdict).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="How many movers to list.")
@click.option("--by", "key", default="short_name", show_default=True, type=click.Choice(KEYS),
              help="Match kernels by short name (template arguments dropped), exact name, or launching op.")
def compare(a: str, b: str, as_json: bool, top: int, key: str) -> None:
    """Compare report A (before) with report B (after): phases, biggest movers, bound shifts.

    A and B are report folders or any profiler output perfscope imports.
    """
    from perfscope.analysis.compare import compare as compare_reports
    from perfscope.api import load

    result = compare_reports(load(a), load(b), key=key)
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo(render_comparison(result, top, (a, b)), nl=False)
