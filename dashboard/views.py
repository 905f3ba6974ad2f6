"""View-models shared by the HTML report and the Dash app: facts, roofs, metrics, tables.

Everything here returns plain data (lists of label/value pairs, DataFrames, dicts). Metrics
that other modules own (``perfscope.analysis.summaries.kernels``, ``.serving``, ``.findings``) are taken
from them when they are installed; nothing here re-derives them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from perfscope.format import by_column
from perfscope.report import Report
from perfscope.schema import rows_at

from .figures.timeline_data import busy_share, timeline_index
from .memo import memo
from .text import MISSING, duration, is_missing, pct, si


def optional(module: str, attr: str) -> Callable[..., Any] | None:
    """``module.attr`` when that module exists (it may land later), else None."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None
        raise
    return getattr(mod, attr, None)


def source_facts(report: Report) -> list[tuple[str, str]]:
    """Where the report came from: name, source, tool, command, created."""
    src = report.manifest.get("source") or {}
    tool = " ".join(str(x) for x in (src.get("tool"), src.get("tool_version")) if x)
    model = (report.params or {}).get("model")
    where = src.get("path") or (f"perfscope's engine, model {model}" if src.get("kind") == "engine" and model else None)
    rows = [("report", report.name), ("source", f"{src.get('kind') or MISSING}: {where or MISSING}"),
            ("tool", tool or MISSING), ("created", str(report.manifest.get("created") or MISSING))]
    if report.manifest.get("command"):
        rows.append(("command", str(report.manifest["command"])))
    if report.manifest.get("partial"):
        rows.append(("partial", "yes: the capture did not finish; tables may be incomplete"))
    projection = report.manifest.get("projection")
    if projection:
        rows.append(("PROJECTED", f"not measured: {projection.get('measured_name')} on {projection.get('source_device')} "
                                  f"-> {projection.get('question_text')} (docs/whatif.md)"))
    return rows


def roofs_rows(report: Report) -> list[dict[str, str]]:
    """One row per roof: roof, value, ridge point, provenance, method, clock, dense."""
    device = report.device
    if device is None:
        return []
    rows = []
    for prec, roof in device.compute.items():
        ridge = device.ridge(prec)
        rows.append({"roof": f"compute {prec}", "value": si(roof.value, "FLOP/s"),
                     "ridge": f"{ridge:.3g} FLOP/B" if ridge else MISSING, "provenance": roof.provenance,
                     "method": roof.method, "clock": roof.clock or MISSING,
                     "dense": MISSING if roof.dense is None else ("dense" if roof.dense else "sparse")})
    for level, roof in device.memory.items():
        rows.append({"roof": f"memory {level}", "value": si(roof.value, "B/s"), "ridge": "",
                     "provenance": roof.provenance, "method": roof.method, "clock": roof.clock or MISSING,
                     "dense": ""})
    return rows


def overview_facts(report: Report) -> list[tuple[str, str]]:
    """Headline numbers: span, kernel count and time, busy share per lane, unplaced time."""
    k = report.kernels
    index = timeline_index(report)
    kernel_ns = float(k["duration_ns"].sum()) if len(k) else 0.0
    device = report.device
    rows = [("device", f"{device.name} ({device.kind})" if device else "unknown (no roofs)"),
            ("span of the capture", duration(index.end_ns)),
            ("kernels / operators", f"{len(k):,} rows, {duration(kernel_ns)} in total")]
    for lane, share in busy_share(report).items():
        rows.append((f"busy: {lane}", pct(share)))
    if len(k):
        bound = k["duration_ns"].groupby(k["bound"].fillna("unknown")).sum()
        for name, ns in bound.sort_values(ascending=False).items():
            rows.append((f"time {name}-bound", f"{duration(ns)} ({pct(ns / max(kernel_ns, 1) * 100)})"))
    return rows


def phase_notes(table: pd.DataFrame | None) -> list[str]:
    """Why rows of the phase table (:func:`phase_metrics`) lack rates or MFU
    (``perfscope.analysis.summaries.serving.phase_notes``)."""
    fn = optional("perfscope.analysis.summaries.serving", "phase_notes")
    return list(fn(table)) if fn is not None and table is not None else []


def phase_metrics(report: Report) -> pd.DataFrame | None:
    """Per-phase metrics (time, MFU, MBU, ...) from ``perfscope.analysis.summaries.serving``, if present.

    An engine report's headline rows (``timing`` = unprofiled: the warm run without the profiler)
    come first, then the profiled run's rows, labelled ``profiled``."""
    fn = optional("perfscope.analysis.summaries.serving", "phase_summary")
    if fn is None:
        return None
    out = fn(report)
    if len(report.steps_unprofiled) and isinstance(out, pd.DataFrame):
        out = pd.concat([out, fn(report, profiled=True)], ignore_index=True)
    return out if isinstance(out, pd.DataFrame) and len(out) else None


def request_metrics(report: Report) -> dict[str, Any] | None:
    """Request metrics (TTFT, TPOT, ITL, E2E, tokens/s) from ``perfscope.analysis.summaries.serving``."""
    if not len(report.requests):
        return None
    fn = optional("perfscope.analysis.summaries.serving", "request_summary")
    out = fn(report) if fn is not None else None
    if out and fn is not None and len(report.requests_unprofiled):  # headline: the warm unprofiled run; the profiled beside
        prof = fn(report, profiled=True)
        out = {**out, **{f"profiled_{k}": prof[k] for k in ("ttft_s_mean", "tpot_s_mean", "e2e_s_mean",
                                                             "throughput_tokens_per_s") if k in prof}}
    return dict(out) if out else None


def findings(report: Report) -> list[Any] | None:
    """Findings of ``perfscope.analysis.findings.run_rules`` (None when that module is absent)."""
    fn = optional("perfscope.analysis.findings", "run_rules")
    return list(fn(report)) if fn is not None else None


format_value = by_column
"""Format a metric by its column's unit suffix (see :func:`perfscope.format.by_column`)."""


KERNEL_TABLE_COLUMNS = {
    "name": ("name", "name", "text"), "count": ("count", "calls", "int"),
    "duration_ns": ("duration_ns", "total time", "ns"), "mean_ns": ("mean_ns", "mean", "ns"),
    "share_pct": ("share_pct", "share", "pct"),
    "flops_coverage_pct": ("flops_coverage_pct", "FLOPs known for", "pct"), "category": ("category", "category", "text"),
    "phase": ("phase", "phase", "text"), "precision": ("precision", "precision", "text"),
    "arith_intensity": ("arith_intensity", "FLOP/B", "num"),
    "achieved_flops_per_s": ("achieved_flops_per_s", "FLOP/s", "si"),
    "achieved_bytes_per_s": ("achieved_bytes_per_s", "B/s", "si"),
    "bound": ("bound", "bound", "text"), "pct_of_roof": ("pct_of_roof", "% of roof", "pct"),
    "op": ("op", "operator", "text"), "op_shapes": ("op_shapes", "shapes", "text"),
    "device": ("device", "device", "text"), "stream": ("stream", "stream", "int"),
    "start_ms": ("start_ms", "start (ms)", "num"), "grid": ("grid", "grid", "text"), "block": ("block", "block", "text"),
}
BY_NAME_COLUMNS = ["name", "count", "duration_ns", "mean_ns", "share_pct", "category", "phase", "precision",
                   "flops_coverage_pct", "arith_intensity", "achieved_flops_per_s", "bound", "pct_of_roof"]
ROW_COLUMNS = ["name", "duration_ns", "share_pct", "start_ms", "device", "stream", "op", "op_shapes", "grid",
               "block", "phase", "precision", "arith_intensity", "achieved_flops_per_s", "achieved_bytes_per_s",
               "bound", "pct_of_roof"]


def name_aggregate(report: Report) -> pd.DataFrame:
    """Every column of ``aggregate_by_name`` over all kernels, computed once per Report object
    (the per-name roofline, the per-name table and the compare view share it)."""
    from perfscope.analysis.summaries.kernels import aggregate_by_name

    return memo(report, "kernels:by_name", lambda: aggregate_by_name(report.kernels, report.device))


def kernels_by_name(report: Report) -> pd.DataFrame:
    """Kernel time aggregated per name (``perfscope.analysis.summaries.kernels.aggregate_by_name``)."""
    agg = name_aggregate(report)
    return agg[[c for c in BY_NAME_COLUMNS if c in agg.columns]]


def kernel_rows(report: Report, mask: np.ndarray | None = None, limit: int | None = None) -> pd.DataFrame:
    """Individual kernel executions, longest first (``mask`` selects rows, ``limit`` caps them).

    The ``key`` column is the row index in ``report.kernels`` (the roofline's click key).
    """
    k = report.kernels if mask is None else rows_at(report.kernels, np.flatnonzero(mask), (*ROW_COLUMNS, "start_ns"))
    if limit is not None and len(k) > limit:
        k = k.nlargest(limit, "duration_ns", keep="first")
    else:
        k = k.sort_values("duration_ns", ascending=False, kind="stable")
    total = float(report.kernels["duration_ns"].sum()) or 1.0
    origin = timeline_index(report).origin_ns
    out = k.assign(share_pct=k["duration_ns"] / total * 100.0, start_ms=(k["start_ns"] - origin) / 1e6)
    out = out[[c for c in ROW_COLUMNS if c in out.columns]]
    return out.rename_axis("key").reset_index()


def table_records(frame: pd.DataFrame) -> list[list[Any]]:
    """Rows as JSON-ready lists (missing values become None, numpy scalars plain numbers)."""
    records = []
    for row in frame.itertuples(index=False, name=None):
        records.append([None if is_missing(v) else (v.item() if hasattr(v, "item") else v) for v in row])
    return records
