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

import math
import os
from collections.abc import Callable, Iterable

from perfscope.errors import UsageError
from perfscope.report import Report

from .rules import kernels, llm, memory, occupancy, steps, timeline, transfers
from .rules._base import SEVERITIES, Finding
from .rules.ranks import rank_findings

__all__ = ["RULES", "SEVERITIES", "Finding", "run_rules"]

Rule = Callable[[Report], list[Finding]]

RULES: dict[str, Rule] = {
    "gpu-idle": timeline.gpu_idle,
    "short-kernels": timeline.short_kernels,
    "launch-overhead": timeline.launch_overhead,
    "serialized-streams": timeline.serialized_streams,
    "copies-exposed": transfers.copies_exposed,
    "pageable-copies": transfers.pageable_copies,
    "memory-below-roof": kernels.memory_below_roof,
    "compute-below-roof": kernels.compute_below_roof,
    "roof-exceeded": kernels.roof_exceeded,
    "fp32-matmul": kernels.fp32_matmul,
    "flops-mismatch": kernels.flops_mismatch,
    "excess-work": kernels.excess_work,
    "occupancy-stalls": occupancy.occupancy_stalls,
    "decode-mbu": llm.decode_mbu,
    "prefill-mfu": llm.prefill_mfu,
    "kv-cache-share": llm.kv_cache_share,
    "speculation": llm.speculation,
    "inference-window": steps.inference_window,
    "step-outliers": steps.step_outliers,
    "steady-state": steps.steady_state,
    "step-idle": steps.step_idle,
    "mixed-steps": steps.mixed_steps,
    "ranks": rank_findings,
    "memory-peak": memory.memory_peak,
    "ttft-gauges": memory.server_gauges,
    "kv-capacity": memory.kv_capacity,
}
"""Rule name -> rule. A rule may emit findings under a more specific id (``gpu-idle`` emits
``time-outside-ops`` on CPU reports)."""


def _rank_key(f: Finding) -> tuple[float, int]:
    stake = f.time_at_stake_ns
    return (-stake if math.isfinite(stake) else math.inf, SEVERITIES.index(f.severity))


def run_rules(report: Report, *, rules: Iterable[str] | None = None) -> list[Finding]:
    """Run the rules over ``report`` and return their findings, largest time at stake first.

    Findings whose time at stake is unknown (NaN) come after the others, by severity.

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
    findings = [f for name in names for f in _run_one(name, report)]
    return sorted(findings, key=_rank_key)


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
