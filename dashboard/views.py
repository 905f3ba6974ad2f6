"""View-models shared by the HTML report and the Dash app: facts, roofs, metrics, tables.

Everything here returns plain data (lists of label/value pairs, DataFrames, dicts). Metrics
that other modules own (``perfscope.analysis.summaries.kernels``, ``.serving``, ``.findings``) are taken
from them when they are installed; nothing here re-derives them.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import by_column, column_label
from perfscope.schema import rows_at

from .figures.timeline_data import busy_share, timeline_index
from .memo import memo
from .text import MISSING, duration, is_missing, pct, si

if TYPE_CHECKING:
    from collections.abc import Callable

    from perfscope.report import Report


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
    from perfscope.analysis.summaries.kernels import split_note
    from perfscope.vocab import speak

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
    said: set[str] = set()
    for row in rows:  # a datasheet's source sentence once, on the first roof that carries it
        head, note = split_note(row["method"])
        if note is not None and note in said:
            row["method"] = f"{head} (source as above)"
        elif note is not None:
            said.add(note)
        row["method"] = speak(row["method"], device)
    return rows


def device_words(report: Report) -> dict[str, str]:
    """The words the pages use for what ran: on a CPU run ``kernel`` -> ``operator`` and "the GPU waits"
    -> "the cores wait" (a CPU report has no GPU to wait)."""
    from perfscope.analysis.summaries.kernels import is_cpu_report

    if is_cpu_report(report):
        return {"kernel": "operator", "Kernel": "Operator", "kernels": "operators", "Kernels": "Operators",
                "waits": "Why the cores wait"}
    return {"kernel": "kernel", "Kernel": "Kernel", "kernels": "kernels", "Kernels": "Kernels",
            "waits": "Why the GPU waits"}


def has_device_work(report: Report) -> bool:
    """Whether the report holds anything that ran on a device (kernels, copies, ranges, steps): an
    endpoint load test measures the server from outside and has none, so its pages show its requests,
    latencies and failures, and no roofline, timeline, device or phase section it cannot fill."""
    return bool(len(report.kernels) or len(report.transfers) or len(report.ranges) or len(report.steps)
                or len(report.steps_unprofiled))


def no_device_why(report: Report) -> str:
    """Why a report without device work has none, in words."""
    if str((report.manifest.get("source") or {}).get("kind") or "").startswith("endpoint"):
        return ("a load test of an endpoint measures the server from outside; `perfscope loadtest --endpoint "
                "--profile` against a server that offers /start_profile puts its steps beside the requests")
    return "this report holds no kernels, copies, ranges or steps"


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
    if fn is None or not has_device_work(report):
        return None
    out = fn(report)
    if len(report.steps_unprofiled) and isinstance(out, pd.DataFrame):
        out = pd.concat([out, fn(report, profiled=True)], ignore_index=True)
    return out if isinstance(out, pd.DataFrame) and len(out) else None


PHASE_FIRST = ("phase", "timing", "steps", "tokens", "wall_s", "tokens_per_s", "achieved_flops_per_s", "mfu",
               "achieved_bytes_per_s", "mbu", "kernel_time_s")
"""The phase table's columns that carry the meaning, first (the others follow: a table no wider than
the page shows these without scrolling)."""
RUN_NAMES = {"unprofiled": "headline", "profiled": "profiled"}
"""The ``timing`` column's values as the phase table says them (the note under it says what each is)."""
RUN_NOTE = ("run: headline = the warm run without the profiler (the numbers to quote); profiled = the run under "
            "the profiler, whose kernels the rest of the report shows (slower by the profiler's overhead)")
CPU_WORDS = {"kernel_time_s": "operator time (summed over threads)", "flops": "operator FLOPs",
             "dram_bytes": "operator DRAM bytes"}
"""Labels of the phase table on a CPU run: operators, and their time summed over threads (it can exceed
the wall time when operators overlap on several threads)."""


def frame_rows(frame: pd.DataFrame) -> list[dict[str, str]]:
    """A DataFrame's rows formatted by their columns' units."""
    return [{str(c): by_column(str(c), v) for c, v in row.items()} for row in frame.to_dict("records")]


def phase_rows(report: Report, phases: pd.DataFrame, *, detail: bool = False) -> list[dict[str, str]]:
    """The phase table as people read it: the run each row is of (headline or profiled) right after the
    phase, then the rates (:data:`PHASE_FIRST`); ``detail``: the work behind them instead (FLOPs, bytes,
    precision, where MFU and MBU come from, a framework's token split). Columns with no value in any row
    are left out; labels in words (CPU runs in operator words)."""
    frame = phases.dropna(axis=1, how="all")
    keep = [c for c in frame if c not in PHASE_FIRST] if detail else [c for c in PHASE_FIRST if c in frame]
    if detail:
        keep = [c for c in ("phase", "timing") if c in frame] + keep
        if len(keep) <= 2:
            return []
    frame = frame[keep]
    if "timing" in frame:
        frame = frame.assign(timing=frame["timing"].map(lambda t: RUN_NAMES.get(str(t), t)))
    cpu = bool(len(report.kernels)) and (report.kernels["device"] == "cpu").all()
    rows = []
    for row in frame_rows(frame):
        rows.append({("run" if k == "timing" else CPU_WORDS[k] if cpu and k in CPU_WORDS else column_label(k)): v
                     for k, v in row.items()})
    return rows


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
    """Findings of ``perfscope.analysis.findings.run_rules`` (None when that module is absent), run
    once per Report object (the overview shows them; a click on one selects its items)."""
    fn = optional("perfscope.analysis.findings", "run_rules")
    return list(memo(report, "findings", lambda: list(fn(report)))) if fn is not None else None


SELECTION_SPANS = 200
"""The most places on the timeline one finding's selection carries (its items' largest first)."""


def finding_selection(report: Report, index: int) -> dict[str, Any] | None:
    """What a click on the ``index``-th finding selects: its items' places on the timeline (ms from
    the timeline's origin, as the timeline figure's x axis: small numbers a browser holds exactly,
    where epoch ns would lose their last digits), the largest first, and the names of its kernels
    (its items' and its own ``kernels``). None when there is no such finding."""
    found = findings(report) or []
    if not 0 <= index < len(found):
        return None
    f = found[index]
    origin = timeline_index(report).origin_ns
    spans: list[list[float]] = []
    names: list[str] = []
    for item in getattr(f, "items", ()):
        for s, e in item.places():
            if len(spans) < SELECTION_SPANS:
                spans.append([(s - origin) / 1e6, (e - origin) / 1e6])
        name = item.attrs.get("name")
        if item.kind in ("kernel", "kernels") and isinstance(name, str) and name not in names:
            names.append(name)
    names += [k for k in getattr(f, "kernels", ()) if k not in names]
    return {"index": index, "finding": str(f.id), "title": str(f.title)[:200], "spans": spans, "kernels": names}


def selection_mask(report: Report, selection: dict[str, Any] | None) -> np.ndarray | None:
    """The kernels a finding's selection names (by the rules' group name or the full name); None
    when the selection names none."""
    from perfscope.analysis.summaries.kernels import group_key

    names = (selection or {}).get("kernels")
    if not isinstance(names, list) or not names or not len(report.kernels):
        return None
    wanted = {str(n) for n in names}
    k = report.kernels
    return (group_key(k).isin(wanted) | k["name"].astype("object").isin(wanted)).to_numpy(bool)


EVIDENCE_ROWS = 10
"""Items of a finding the HTML report and the dashboard list (the largest first)."""


def finding_evidence(f: Any, n: int = EVIDENCE_ROWS) -> tuple[str | None, list[dict[str, str]], str | None]:
    """A finding's evidence as the HTML report and the dashboard show it: the share of its time at
    stake its items explain (or the time left unexplained; :func:`perfscope.format.evidence_share`),
    one row per item (share of the stake, cause known or not, the item's own words), largest first,
    and the line for the items past ``n``."""
    from perfscope.analysis.findings import EVIDENCE_RULE_SHARE
    from perfscope.format import evidence_item, evidence_more, evidence_share

    items = list(getattr(f, "items", ()) or ())
    share = evidence_share(getattr(f, "time_at_stake_ns", None), getattr(f, "explained_ns", None), EVIDENCE_RULE_SHARE)
    rows = [dict(zip(("share", "cause", "evidence"), evidence_item(i, getattr(f, "time_at_stake_ns", None))))
            for i in items[:n]]
    return share, rows, evidence_more(items, n)


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
    "bound_level": ("bound_level", "binding level", "text"),
    "limiter": ("limiter", "measured limiter", "text"), "limiter_pct": ("limiter_pct", "limiter % of peak", "pct"),
    "roofline_bound": ("roofline_bound", "roofline reading", "text"),
    "op": ("op", "operator", "text"), "op_shapes": ("op_shapes", "shapes", "text"),
    "device": ("device", "device", "text"), "stream": ("stream", "stream", "int"),
    "start_ms": ("start_ms", "start (ms)", "num"), "grid": ("grid", "grid", "text"), "block": ("block", "block", "text"),
}
def table_column(column: str, values: pd.Series) -> tuple[str, str, str]:
    """(key, label, kind) of a column of a page's sortable table: the kernel tables' own labels, else
    the label and cell format its unit suffix gives (``ttft_p99_s``: seconds; ``_ns``, ``_pct``,
    ``_per_s``), plain numbers for other numeric columns, text for the rest."""
    if column in KERNEL_TABLE_COLUMNS:
        return KERNEL_TABLE_COLUMNS[column]
    base = re.sub(r"_(mean|median|min|max|std|p\d+)$", "", column)
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    kind = "text"
    if numeric:
        kind = ("ns" if base.endswith("_ns") else "s" if base.endswith("_s") and not base.endswith("_per_s")
                else "pct" if base.endswith("_pct") else "si" if base.endswith("_per_s")
                else "int" if pd.api.types.is_integer_dtype(values) else "num")
    label = column_label(column)
    if kind == "si":  # the cell shows the number with its scale; the label says the unit
        label = column_label(column.replace("_per_s", "")) + " /s"
    return column, label, kind


BY_NAME_COLUMNS = ["name", "count", "duration_ns", "mean_ns", "share_pct", "category", "phase", "precision",
                   "flops_coverage_pct", "arith_intensity", "achieved_flops_per_s", "bound", "limiter", "limiter_pct",
                   "pct_of_roof", "bound_level"]
ROW_COLUMNS = ["name", "duration_ns", "share_pct", "phase", "bound", "limiter", "limiter_pct", "pct_of_roof",
               "bound_level", "arith_intensity",
               "achieved_flops_per_s", "achieved_bytes_per_s", "precision", "start_ms", "op", "op_shapes", "device",
               "stream", "grid", "block"]


def name_aggregate(report: Report) -> pd.DataFrame:
    """Every column of ``aggregate_by_name`` over all kernels, computed once per Report object
    (the per-name roofline, the per-name table and the compare view share it)."""
    from perfscope.analysis.summaries.kernels import aggregate_by_name

    return memo(report, "kernels:by_name", lambda: aggregate_by_name(report.kernels, report.device))


def kernels_by_name(report: Report) -> pd.DataFrame:
    """Kernel time aggregated per name and phase (``perfscope.analysis.summaries.kernels.aggregate_by_name``
    with ``by_phase``): a row's intensity and bound are one phase's calls, never prefill and decode summed."""
    from perfscope.analysis.summaries.kernels import aggregate_by_name

    agg = memo(report, "kernels:by_name_phase", lambda: aggregate_by_name(report.kernels, report.device, by_phase=True))
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
