"""``perfscope analyze PATH``: the summary (and findings) of a report or any profiler output."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ._common import echo_json, records

if TYPE_CHECKING:
    from perfscope.report import Report


def analysis_payload(report: Report, top: int, memory_at: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` document: device, phases, top_kernels, requests, tails, idle, findings, warnings.

    ``phases`` and ``requests`` are the headline: an engine report's warm unprofiled run;
    ``phases_profiled`` and ``requests_profiled`` are the profiled run's (the same figures when
    the report holds only one run); ``params`` is the manifest's (``profiler_overhead_ratio``,
    ``profiled_wall_s``, ``unprofiled_wall_s``, ``compile_s``, ...).
    """
    from perfscope.analysis.summaries.kernels import roofs_table, top_kernels
    from perfscope.analysis.summaries.serving import phase_summary, request_summary
    from perfscope.vocab import device_record, speak

    dev = report.device
    payload: dict[str, Any] = {
        "report": report.name,
        "source": report.manifest.get("source"),
        "device": None if dev is None else {"name": dev.name, "kind": dev.kind,
                                             "roofs": [{**r, "method": speak(r["method"], dev)} for r in records(roofs_table(dev))],
                                             **device_record(dev)},
        "phases": records(phase_summary(report)),
        "phases_profiled": records(phase_summary(report, profiled=True)),
        "requests": request_summary(report),
        "requests_profiled": request_summary(report, profiled=True),
        "params": report.params,
        "top_kernels": records(top_kernels(report, top)),
        "warnings": report.warnings,
        "unavailable_metrics": report.unavailable_metrics,
        "partial": bool(report.manifest.get("partial")),
    }
    if "rank" in report.kernels.columns:
        from perfscope.analysis.ranks.partial_read import rank_summary_of

        payload["ranks"] = rank_summary_of(report)
    from perfscope.analysis.summaries.memory import capacity_section, memory_payload

    payload["memory"] = memory_payload(report, at=memory_at)
    payload["capacity"] = capacity_section(report)
    from perfscope.analysis.summaries.kv_policy import kv_policy_summary

    payload["kv_policy"] = kv_policy_summary(report)  # None for a full-cache run
    from perfscope.analysis.summaries.tails import tails_payload

    payload["tails"] = tails_payload(report)  # a load test's p50/p99 split into causes (docs/tails.md)
    from perfscope.analysis.idle import idle_of, idle_overview

    payload["idle"] = idle_overview(idle_of(report))  # why the GPU waits, per device (docs/idle.md)
    from perfscope.analysis.findings import run_rules, stake_clock

    payload["findings"] = [f.to_dict() for f in run_rules(report)]
    payload["findings_clock"] = stake_clock(report)
    return payload


@click.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print JSON (keys: device, phases, top_kernels, findings, ...).")
@click.option("--top", default=12, show_default=True, type=click.IntRange(min=1), help="How many kernels to list.")
@click.option("--tree", "show_tree", is_flag=True, help="Print where the time goes: the module -> op -> kernel tree.")
@click.option("--depth", type=click.IntRange(min=1), default=None, help="Levels of the tree to show (default: all).")
@click.option("--phase", default=None, help="The tree of one phase (prefill, decode, ...; default: each phase).")
@click.option("--memory", "show_memory", is_flag=True, help="Print the memory timeline's summary: the peak per "
              "device and what held it (category, op, source line), the peak per phase and step, the server's gauges.")
@click.option("--memory-at", "memory_at", default=None, metavar="INSTANT",
              help="With --memory or --json: also what is live at this instant on each device: event:N, step:N, "
              "phase:NAME or a time from the record's first event (time:12.5ms). See docs/memory.md.")
@click.option("--expand", is_flag=True, help="In the tree, list every instance of repeated layers (Qwen3DecoderLayer_0 "
              "... _35) instead of one collapsed row with their spread.")
def analyze(path: str, as_json: bool, top: int, show_tree: bool, depth: int | None, phase: str | None,
            expand: bool, show_memory: bool = False, memory_at: str | None = None) -> None:
    """Summarise a report folder, or any trace/export perfscope can import."""
    from perfscope.api import load
    from perfscope.text_report import render_text
    from perfscope.text_tree import render_tree, tree_payload

    at = None
    if memory_at is not None:
        from perfscope.analysis.summaries.memory import parse_instant

        at = parse_instant(memory_at)
    report = load(path)
    if phase is not None and phase not in set(report.kernels["phase"].dropna().astype(str)):
        from perfscope.errors import UsageError

        have = sorted(set(report.kernels["phase"].dropna().astype(str))) or ["none"]
        raise UsageError(f"{path}: no kernels of phase {phase!r}", hint=f"use --phase {' or '.join(have)}")
    if as_json:
        payload = analysis_payload(report, top, memory_at=at)
        payload["tree"] = tree_payload(report, phase=phase, depth=depth, expand=expand)
        echo_json(payload)
    elif show_memory:
        from perfscope.text_memory import render_memory

        click.echo(render_memory(report, at=at), nl=False)
    elif show_tree:
        click.echo(render_tree(report, phase=phase, depth=depth, expand=expand), nl=False)
    else:
        click.echo(render_text(report, top=top), nl=False)
