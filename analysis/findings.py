"""Findings: what to fix first in a profile, with the evidence, ranked by the time a fix could save.

    from perfscope.analysis.findings import run_rules
    for f in run_rules(report):
        print(f.severity, f.title, f.recommendation)

Each rule is a function ``Report -> list[Finding]`` in :data:`RULES`. Rules degrade: one whose
inputs are missing (no transfers, no API table, no FLOPs, no engine steps) returns nothing or an
``info`` finding that says what it could not check; none invents a number. A rule that crashes
(a bug) yields one ``rule-error`` info finding instead of taking the others down. Thresholds are named
constants in the rule modules (``perfscope.analysis.rules.*``), each with its reason.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from perfscope.errors import UsageError
from perfscope.vocab import is_amd, speak

from .intervals import run_span_ns
from .rules import (
    kernels,
    levels,
    llm,
    memory,
    occupancy,
    sources,
    steps,
    tails,
    timeline,
    transfers,
)
from .rules._base import EVIDENCE_RULE_SHARE, SEVERITIES, Finding, Item, trace_run
from .rules.ranks import rank_findings

if TYPE_CHECKING:
    from perfscope.report import Report

__all__ = ["EVIDENCE_RULE_SHARE", "RULES", "SEVERITIES", "Finding", "Item", "run_rules"]

Rule = Callable[["Report"], list[Finding]]

RULES: dict[str, Rule] = {
    "no-gpu-work": sources.no_gpu_work,
    "gpu-idle": timeline.gpu_idle,
    "short-kernels": timeline.short_kernels,
    "launch-overhead": timeline.launch_overhead,
    "serialized-streams": timeline.serialized_streams,
    "copies-exposed": transfers.copies_exposed,
    "pageable-copies": transfers.pageable_copies,
    "memory-below-roof": kernels.memory_below_roof,
    "compute-below-roof": kernels.compute_below_roof,
    "latency-bound": kernels.latency_bound,
    "roof-exceeded": kernels.roof_exceeded,
    "memory-level": levels.memory_level,
    "fp32-matmul": kernels.fp32_matmul,
    "flops-mismatch": kernels.flops_mismatch,
    "excess-work": kernels.excess_work,
    "occupancy-stalls": occupancy.occupancy_stalls,
    "decode-mbu": llm.decode_mbu,
    "prefill-mfu": llm.prefill_mfu,
    "kv-cache-share": llm.kv_cache_share,
    "speculation": llm.speculation,
    "kv-policy": llm.kv_policy,
    "inference-window": steps.inference_window,
    "step-outliers": steps.step_outliers,
    "steady-state": steps.steady_state,
    "step-idle": steps.step_idle,
    "mixed-steps": steps.mixed_steps,
    "ranks": rank_findings,
    "memory-peak": memory.memory_peak,
    "ttft-gauges": memory.server_gauges,
    "server-queue": memory.server_queue,
    "kv-capacity": memory.kv_capacity,
    "serving-tail": tails.serving_tails,
}
"""Rule name -> rule. A rule may emit findings under a more specific id (``gpu-idle`` emits
``time-outside-ops`` on CPU reports)."""


def _rank_key(f: Finding, report: Report) -> tuple[float, int]:
    """Largest share of its own run first: a finding's time at stake over the span of the run it names
    (the headline run is shorter than the profiled one by the profiler's overhead)."""
    stake = f.time_at_stake_ns
    span = run_span_ns(report, f.run)
    share = stake / span if math.isfinite(stake) and math.isfinite(span) and span > 0 else stake
    return (-share if math.isfinite(share) else math.inf, SEVERITIES.index(f.severity))


def run_rules(report: Report, *, rules: Iterable[str] | None = None) -> list[Finding]:
    """Run the rules over ``report`` and return their findings, largest time at stake first.

    Findings whose time at stake is unknown (NaN) come after the others, by severity. Each names the
    run its numbers and stake come from (:attr:`Finding.run`; a rule that does not name one reads the
    trace: :func:`perfscope.analysis.rules._base.trace_run`), and the ranking compares each stake with
    the span of its own run.

    Args:
        report: the report to examine.
        rules: names from :data:`RULES` to run (default: all).

    Raises:
        UsageError: an unknown rule name.
    """
    names = list(RULES) if rules is None else list(rules)
    unknown = [n for n in names if n not in RULES]
    if unknown:
        raise UsageError(f"unknown rule(s): {', '.join(unknown)}", hint=f"choose from {', '.join(RULES)}")
    default_run = trace_run(report)
    findings = [_in_device_words(f if f.run else dataclasses.replace(f, run=default_run), report)
                for name in names for f in _run_one(name, report)]
    return sorted(findings, key=lambda f: (f.id not in LEADING, *_rank_key(f, report)))


LEADING = ("no-gpu-work",)
"""Findings that say what the file is (a process that ran no GPU work): they come before what to fix in it."""


def _in_device_words(f: Finding, report: Report) -> Finding:
    """``f`` in the words of the report's device (:func:`perfscope.vocab.speak`: CU, wavefront,
    matrix core and ``gpu:N`` on AMD), so no rule needs to know the vendor."""
    if not is_amd(report.device):
        return f
    evidence = {k: speak(v, report.device) if isinstance(v, str) else v for k, v in f.evidence.items()}
    items = tuple(dataclasses.replace(i, label=speak(i.label, report.device)) for i in f.items)
    return dataclasses.replace(f, title=speak(f.title, report.device), evidence=evidence,
                               recommendation=speak(f.recommendation, report.device), items=items)


def _run_one(name: str, report: Report) -> list[Finding]:
    """One rule's findings; a rule that crashes becomes an ``info`` finding (``rule-error``) so the
    other findings still reach the user. ``PERFSCOPE_DEBUG=1`` re-raises instead."""
    try:
        return RULES[name](report)
    except Exception as exc:  # a bug in one rule must not hide the others
        if os.environ.get("PERFSCOPE_DEBUG"):
            raise
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return [Finding("rule-error", "info", f"Rule {name} could not run ({reason[:160]})",
                        {"rule": name, "error": reason[:300]},
                        "This is a perfscope bug, not a problem of the profile: please report it with the report "
                        "folder. Run with PERFSCOPE_DEBUG=1 to see the traceback.", math.nan)]


def stake_clock(report: Report) -> str:
    """The clock of the findings' times at stake, in words. A report with a warm unprofiled run
    beside the profiled one: each finding's numbers and stake come from one run, the headline where
    it has the quantity (engine steps), the profiled run otherwise (kernels, gaps), said with the
    profiler's overhead in the words the timing line uses
    (:func:`perfscope.analysis.summaries.runs.profiler_overhead`)."""
    from .summaries.runs import profiler_overhead

    over = profiler_overhead(report.params)
    said = f" ({over})" if over else ""
    if len(report.steps_unprofiled) or len(report.requests_unprofiled):
        return ("each finding's numbers and time at stake come from the run it names: the headline (warm "
                "unprofiled) run where it has them, the profiled run otherwise" + said)
    if trace_run(report) == "profiled":
        return "time at stake on the profiled run's clock" + said
    return "time at stake on the trace's clock"
