"""What every rule shares: the Finding record and severity from the time at stake.

The rules' other helpers live where they belong and are re-exported here for the rule modules
only: interval algebra and the profile's span in :mod:`perfscope.analysis.intervals`, kernel
grouping in :mod:`perfscope.analysis.summaries.kernels`, number formats in :mod:`perfscope.format`.
Code outside ``rules/`` imports them from those modules, not from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfscope.format import jsonable

from ..intervals import (
    activity,
    covered_ns,
    gaps_before,
    merge_intervals,
    profile_span_ns,
    run_span_ns,
)
from ..summaries.kernels import DEGENERATE_SHORT_NAME, group_key, is_cpu_report, top_groups

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.report import Report

__all__ = [
    "DEGENERATE_SHORT_NAME", "EVIDENCE_RULE_SHARE", "HOST_COPY_KINDS", "ITEM_KINDS", "ITEM_SPANS", "NCU_REPROFILE",
    "RUNS", "SEVERITIES", "Evidence", "Finding", "Item", "activity", "collect_advice", "covered_ns", "explained_ns",
    "from_ncu", "gaps_before", "group_key", "headline_run", "info", "is_cpu_report", "merge_intervals", "pct",
    "profile_span_ns", "ranked", "severity_for", "top_groups", "trace_run",
]

SEVERITIES = ("high", "medium", "low", "info")

HIGH_SHARE = 0.25
"""A fix that could give back a quarter or more of the profiled time is ``high``."""
MEDIUM_SHARE = 0.05
"""One that could give back 5% or more is ``medium`` (below that, run-to-run noise on a busy
machine is of the same order); anything smaller is ``low``."""

HOST_COPY_KINDS = ("HtoD", "DtoH")
"""Copies that cross the host link (PCIe / C2C); device-side copies (DtoD, memset) do not."""

Evidence = dict[str, float | int | str]

NCU_REPROFILE = ("This file already is an Nsight Compute report, collected without the roofline sections: re-profile "
                 "with `ncu --set roofline` (or add `--section SpeedOfLight_RooflineChart`), which records the "
                 "peak_sustained rates and the per-precision instruction counts (FLOPs) the roofline needs, then "
                 "import the new report.")
"""The advice for what an Nsight Compute report lacks: never 'profile with Nsight Compute'."""


def from_ncu(report: Report) -> bool:
    """Whether the report was imported from an Nsight Compute report (``.ncu-rep`` or its CSV)."""
    return str((report.manifest.get("source") or {}).get("kind") or "").startswith("ncu")


COUNTER_PROFILERS = {"nvidia": "Nsight Compute (perfscope profile --collector ncu -- CMD)",
                     "amd": "rocprof-compute or rocprofv3 --pmc (perfscope profile --collector rocprof-compute -- CMD)"}
"""The hardware-counter profiler each vendor's advice names (``{counters}`` in :func:`collect_advice`)."""


def from_amd(report: Report) -> bool:
    """Whether the report is of an AMD GPU: its device, or a rocprof source (which may name no device)."""
    from perfscope.vocab import is_amd

    kind = str((report.manifest.get("source") or {}).get("kind") or "")
    return is_amd(report.device) or kind.startswith(("rocprof", "rocpd"))


def collect_advice(report: Report, advice: str) -> str:
    """``advice`` on what to collect, with ``{counters}`` naming the device vendor's counter profiler
    (:data:`COUNTER_PROFILERS`: never Nsight Compute for an AMD GPU), unless the file already is what it
    asks for: an Nsight Compute report gets :data:`NCU_REPROFILE` (its missing sections)."""
    if from_ncu(report):
        return NCU_REPROFILE
    return advice.format(counters=COUNTER_PROFILERS["amd" if from_amd(report) else "nvidia"])


ITEM_SPANS = 32
"""The most member places a group item carries (its largest members): enough to find them on the
timeline, few enough that ``--json`` stays small."""

ITEM_KINDS = ("gap", "gaps", "kernel", "kernels", "copy", "sync", "range", "step", "phase", "request", "tensor",
              "rank", "metric")
"""What an :class:`Item` can point at. ``gaps``/``kernels`` are a group of like items (one line for 1,983 gaps
under 5 us); the others are one thing each. ``metric`` is a measured number with no place on the timeline."""


@dataclass(frozen=True)
class Item:
    """One piece of evidence behind a finding's time at stake: a thing the trace shows, in its own words.

    Attributes:
        kind: what it is (:data:`ITEM_KINDS`).
        label: one line a user reads ("10.0 ms gap in ensure_layer_3_weights: the host ran no CUDA call").
        time_ns: the part of the finding's time at stake this item holds; NaN when it is not a time
            (a tensor's bytes, a counter).
        explains: whether the trace says *why* this time is lost (a known cause: the host ran
            ``aten::bmm`` on CPU tensors, ncu measured the ALU pipe at 57%). An item whose cause is not
            known is listed but counts towards the unexplained share.
        start_ns, end_ns: where it lies on the report's clock (NaN: nowhere, or spread over the run),
            so that the dashboard can select it and the Perfetto export can mark it.
        attrs: what else identifies it (``cause``, ``host_kind``, ``limiter``, ``bytes``, ``request_id``,
            ``rank``, ``count``, ``device``...), units in the keys.
        spans: for a group item (``gaps``, ``kernels``, several steps) whose members lie apart on the
            timeline, the ``(start_ns, end_ns)`` of its largest members (at most :data:`ITEM_SPANS`,
            largest first), so that the dashboard and the Perfetto export mark each; empty for an
            item with one place (``start_ns``/``end_ns``) or none.
    """

    kind: str
    label: str
    time_ns: float = math.nan
    explains: bool = True
    start_ns: float = math.nan
    end_ns: float = math.nan
    attrs: Mapping[str, float | int | str | None] = field(default_factory=dict)
    spans: tuple[tuple[float, float], ...] = ()

    def places(self) -> tuple[tuple[float, float], ...]:
        """Where the item lies on the timeline: its ``spans``, else its one ``(start_ns, end_ns)``;
        empty when it has no place (a metric, a tensor)."""
        if self.spans:
            return self.spans
        if math.isfinite(self.start_ns) and math.isfinite(self.end_ns) and self.end_ns >= self.start_ns:
            return ((self.start_ns, self.end_ns),)
        return ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None)."""
        return jsonable({"kind": self.kind, "label": self.label, "time_ns": self.time_ns,
                         "explains": self.explains, "start_ns": self.start_ns, "end_ns": self.end_ns,
                         "attrs": dict(self.attrs), "spans": [list(s) for s in self.spans]})


def explained_ns(items: tuple[Item, ...] | list[Item], time_at_stake_ns: float) -> float:
    """The time the ``items`` whose cause is known account for, at most ``time_at_stake_ns``: 0 when
    items carry times but none of known cause (all of the stake is then unexplained); NaN when no
    item carries a time (the finding then states no share)."""
    if not any(math.isfinite(i.time_ns) for i in items):
        return math.nan
    total = float(sum(i.time_ns for i in items if i.explains and math.isfinite(i.time_ns)))
    return min(total, time_at_stake_ns) if math.isfinite(time_at_stake_ns) else total


EVIDENCE_RULE_SHARE = 0.90
"""The evidence rule: a finding explains at least this share of its time at stake by items of known
cause, or it states the share it leaves unexplained (docs/findings.md)."""


@dataclass(frozen=True)
class Finding:
    """One thing to fix, with the numbers behind it.

    Attributes:
        id: stable rule id (``gpu-idle``, ``short-kernels``, ``decode-mbu``, ...).
        severity: ``high``, ``medium``, ``low`` or ``info``.
        title: one line with the key number.
        evidence: the numbers behind it; units are in the keys (``_ns``, ``_pct``, ``_bytes``).
        recommendation: what to change, concretely, chosen from the items (never a stock paragraph:
            advice the items do not support is not given).
        time_at_stake_ns: the time a fix could save at best (the ranking key); NaN when unknown.
        kernels: affected kernel or operator names (the top few).
        ranges: affected NVTX / record_function ranges.
        items: the things behind the time at stake (gaps with what the host did, kernels with their
            limiter, tensors, requests, steps, ranks), largest first.
        explained_ns: how much of the time at stake the items of known cause account for
            (:func:`explained_ns`); NaN when the finding has no timed items.
        run: the run every number of the finding (and its stake) comes from: ``headline`` (an engine
            report's warm unprofiled run), ``profiled`` or ``trace`` (an imported trace); "" unknown.
    """

    id: str
    severity: str
    title: str
    evidence: Mapping[str, float | int | str]
    recommendation: str
    time_at_stake_ns: float
    kernels: tuple[str, ...] = ()
    ranges: tuple[str, ...] = field(default=())
    items: tuple[Item, ...] = ()
    explained_ns: float = math.nan
    run: str = ""

    @property
    def explained_share(self) -> float:
        """``explained_ns / time_at_stake_ns`` (0..1); NaN when either is unknown."""
        stake = self.time_at_stake_ns
        if not (math.isfinite(stake) and stake > 0 and math.isfinite(self.explained_ns)):
            return math.nan
        return min(1.0, self.explained_ns / stake)

    @property
    def unexplained_ns(self) -> float:
        """The time at stake that no item of known cause accounts for; NaN when unknown."""
        if not (math.isfinite(self.time_at_stake_ns) and math.isfinite(self.explained_ns)):
            return math.nan
        return max(0.0, self.time_at_stake_ns - self.explained_ns)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None, numpy numbers plain Python numbers)."""
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": jsonable(dict(self.evidence)),
            "recommendation": self.recommendation,
            "time_at_stake_ns": jsonable(self.time_at_stake_ns),
            "kernels": list(self.kernels),
            "ranges": list(self.ranges),
            "items": [i.to_dict() for i in self.items],
            "explained_ns": jsonable(self.explained_ns),
            "explained_share": jsonable(self.explained_share),
            "unexplained_ns": jsonable(self.unexplained_ns),
            "run": self.run or None,
        }


RUNS = ("headline", "profiled", "trace")
"""The runs a finding's numbers come from (:attr:`Finding.run`)."""

OWN_RUNS = ("engine", "torch-script", "engine-sweep", "engine-loadtest")
"""Source kinds perfscope ran itself under the profiler: their trace is "the profiled run"."""


def trace_run(report: Report) -> str:
    """The run the kernels, ranges and the trace's steps belong to: ``profiled`` for a run perfscope
    profiled itself (an engine report, a script), ``trace`` for an imported trace."""
    kind = str((report.manifest.get("source") or {}).get("kind") or "")
    if kind in OWN_RUNS or len(report.steps_unprofiled) or len(report.requests_unprofiled):
        return "profiled"
    return "trace"


def headline_run(report: Report) -> str:
    """The run the engine steps of the headline come from (``analysis.summaries.serving.run_steps``):
    ``headline`` when the report holds a warm unprofiled run's steps, else :func:`trace_run`."""
    return "headline" if len(report.steps_unprofiled) else trace_run(report)


def severity_for(at_stake_ns: float, reference_ns: float) -> str:
    """``high`` / ``medium`` / ``low`` from the share of ``reference_ns`` a fix could save."""
    if not (reference_ns > 0) or not math.isfinite(at_stake_ns):
        return "low"
    share = at_stake_ns / reference_ns
    if share >= HIGH_SHARE:
        return "high"
    return "medium" if share >= MEDIUM_SHARE else "low"


def ranked(report: Report, rule_id: str, title: str, evidence: Evidence, recommendation: str,
           time_at_stake_ns: float, *, kernels: tuple[str, ...] = (), ranges: tuple[str, ...] = (),
           items: tuple[Item, ...] = (), run: str = "") -> Finding:
    """A Finding whose severity is its time at stake against the span of the run it names (``run``: its
    numbers' run, :data:`RUNS`; default the trace's, :func:`trace_run`), with the share of that time its
    ``items`` explain (:func:`explained_ns`)."""
    run = run or trace_run(report)
    severity = severity_for(time_at_stake_ns, run_span_ns(report, run))
    items = tuple(sorted(items, key=lambda i: -i.time_ns if math.isfinite(i.time_ns) else math.inf))
    return Finding(rule_id, severity, title, evidence, recommendation, time_at_stake_ns, kernels, ranges,
                   items, explained_ns(items, time_at_stake_ns), run)


def info(rule_id: str, title: str, recommendation: str, **evidence: float | str) -> Finding:
    """An ``info`` finding: something a rule could not check, and how to make it checkable."""
    return Finding(rule_id, "info", title, dict(evidence), recommendation, math.nan)


def pct(part: float, whole: float) -> float:
    """``part / whole`` in percent; NaN when ``whole`` is not positive."""
    return 100.0 * part / whole if whole > 0 else math.nan
