"""Nsight Compute results (``.ncu-rep`` through the ``ncu-report`` package, or ``ncu --csv``)
to a classified Report.

One kernel row per profiled launch, with measured FLOPs (per precision and in total), DRAM
bytes, speed-of-light percentages, each pipe's utilization (``pipe_<name>_pct``: the input of the
kernel's measured ``limiter``), occupancy and the top warp-stall reasons (columns listed
in :data:`perfscope.analysis.readers.ncu.metrics.EXTRA_METRICS` plus ``flops_fp64/fp32/fp16``,
``stall_top{1,2,3}`` and ``stall_top{1,2,3}_ratio``, ``ncu_id``). Roofs come from the report's
own peak metrics x clocks (provenance ``report``), else from the datasheet table.

ncu replays each kernel alone, so there is no timeline: launches are laid end to end in
profiling order (``start_ns`` = sum of the earlier durations). A launch whose duration was
not collected cannot sit on that timeline; it is left out of the kernel table and named in
the warnings, ``unavailable_metrics`` and ``params["launches_without_duration"]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.datasheets import datasheet_spec
from perfscope.errors import InputFormatError, ToolNotFoundError
from perfscope.format import counted
from perfscope.kernel_names import short_kernel_name
from perfscope.limits import take
from perfscope.report import Report, source_info

from ..finish import Imported, finish
from .csv_launches import TRUNCATED, read_csv_launches, unit_scale
from .metrics import (
    EXTRA_METRICS,
    FLOP_CONVENTION,
    Launch,
    device_name,
    launch_row,
    roofs_spec,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perfscope.device import DeviceSpec

REP_HINT = "re-open it in Nsight Compute to check it, or re-profile; ncu writes .ncu-rep with --export"
NUMERIC_EXTRAS = (*EXTRA_METRICS, "flops_fp64", "flops_fp32", "flops_fp16",
                  "stall_top1_ratio", "stall_top2_ratio", "stall_top3_ratio")
KEY_COLUMNS = {"duration_ns": "gpu__time_duration.sum", "flops": "SASS FP instruction counters",
               "dram_bytes": "dram__bytes", "achieved_occupancy_pct": "sm__warps_active",
               "sm_throughput_pct": "sm__throughput"}


def read_ncu_rep(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    """Read an Nsight Compute report with the ``ncu-report`` Python package.

    Raises:
        ToolNotFoundError: the ``ncu-report`` package is not installed.
        InputFormatError: missing, damaged or empty report.
    """
    return read_ncu_reps([path], device=device)


def read_ncu_reps(paths: Sequence[str | Path], *, device: DeviceSpec | None = None) -> Report:
    """Read several Nsight Compute reports of one program as one report, in the given order
    (top-N mode writes one report per top kernel); launch ids run on across the files.

    Raises:
        ToolNotFoundError: the ``ncu-report`` package is not installed.
        InputFormatError: no paths, or a missing, damaged or empty report.
    """
    if not paths:
        raise InputFormatError("<ncu reports>", "no report to read", hint=REP_HINT)
    ncu_report = _ncu_report_module()
    launches: list[Launch] = []
    versions = set()
    for path in paths:
        ctx = _load(ncu_report, path)
        found = _actions(ncu_report, ctx, start=len(launches))
        take(path, len(found))
        if not found:
            raise InputFormatError(path, "holds no profiled kernel results (empty, truncated or not an "
                                   "Nsight Compute report)", hint=REP_HINT)
        launches += found
        versions.add(f"ncu_report {ctx.get_version()}" if hasattr(ctx, "get_version") else "ncu_report")
    tool: dict[str, Any] = {"kind": "ncu-rep", "tool": "ncu", "tool_version": None, "reader": ", ".join(sorted(versions))}
    if len(paths) > 1:
        tool["reports"] = [Path(p).name for p in paths]
    return _build(paths[0], launches, [], tool, device)


def _ncu_report_module() -> Any:
    try:
        import ncu_report  # type: ignore[import-not-found]
    except ImportError:
        raise ToolNotFoundError(
            "ncu-report (Python package)",
            "install it with `pip install ncu-report` (or `pip install perfscope[ncu]`); no Nsight "
            "Compute install is needed") from None
    return ncu_report


def _load(ncu_report: Any, path: str | Path) -> Any:
    try:
        return ncu_report.load_report(str(path))
    except Exception as exc:  # noqa: BLE001 - the SWIG binding raises plain RuntimeError, OSError
        raise InputFormatError(path, f"cannot be loaded by ncu_report ({exc})", hint=REP_HINT) from None


def read_ncu_csv(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    """Read ``ncu --csv`` output (details/long or ``--page raw``/wide)."""
    launches, warnings, shape = read_csv_launches(path)
    take(path, len(launches))
    tool = {"kind": "ncu-csv", "tool": "ncu", "tool_version": None, "csv_shape": shape}
    return _build(path, launches, warnings, tool, device, partial=any(w.startswith(TRUNCATED) for w in warnings))


# ------------------------------------------------------------------------------ .ncu-rep
def _actions(ncu_report: Any, ctx: Any, start: int = 0) -> list[Launch]:
    launches: list[Launch] = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            launches.append(_action(ncu_report, rng.action_by_idx(a), start + len(launches)))
    return launches


def _action(ncu_report: Any, action: Any, index: int) -> Launch:
    string_kind = ncu_report.IMetric.ValueKind_STRING
    metrics: dict[str, float | str] = {}
    for name in action.metric_names():
        if not isinstance(name, str) or ":" in name:  # "breakdown:..." and "regex:..." are groupings
            continue
        try:
            metric = action.metric_by_name(name)
        except TypeError:  # a name the binding cannot pass back (damaged report)
            continue
        if metric is None or not metric.has_value():
            continue
        if metric.kind() == string_kind:
            metrics[name] = metric.as_string()
            continue
        value = metric.as_double()
        if math.isfinite(value):
            metrics[name] = value * unit_scale(metric.unit())
    name = action.name(ncu_report.IAction.NameBase_DEMANGLED) or action.name() or f"(unnamed launch {index})"
    return Launch(id=index, name=name, short_name=action.name() or short_kernel_name(name), metrics=metrics,
                  nvtx=_nvtx_stack(action))


def _nvtx_stack(action: Any) -> list[str]:
    """The push/pop ranges open around the launch (``--nvtx``), outermost first.

    ncu keeps one stack per NVTX domain; the default domain's is taken, else the first non-empty
    one (a kernel sits in one stack of nested ranges, like the nsys projection).
    """
    try:
        state = action.nvtx_state()
        if state is None:
            return []
        stacks = []
        for domain_id in state.domains():
            domain = state.domain_by_id(domain_id)
            ranges = [str(r) for r in domain.push_pop_ranges()]
            if ranges:
                label = domain.name() or ""
                default = not label or label.startswith("<")
                stacks.append((not default, ranges if default else [f"{label}:{r}" for r in ranges]))
    except (AttributeError, RuntimeError, TypeError):  # an old report or binding without NVTX state
        return []
    return min(stacks, key=lambda s: s[0])[1] if stacks else []


# ------------------------------------------------------------------------------ report
def _build(path: str | Path, launches: list[Launch], warnings: list[str], tool: dict[str, Any],
           device: DeviceSpec | None, *, partial: bool = False) -> Report:
    rows = pd.DataFrame([launch_row(x) for x in launches])
    for column in (*NUMERIC_EXTRAS, *(c for c in rows.columns if c.startswith("pipe_"))):
        rows[column] = pd.to_numeric(rows[column], errors="coerce").astype("float64")
    untimed = rows["duration_ns"].isna()
    dropped = [{"ncu_id": int(i), "name": n} for i, n in zip(rows.loc[untimed, "ncu_id"], rows.loc[untimed, "name"])]
    if dropped:
        names = ", ".join(f"{i} ({n})" for i, n in zip(rows.loc[untimed, "ncu_id"], rows.loc[untimed, "short_name"]))
        warnings.append(f"{counted(len(dropped), 'launch')} without gpu__time_duration.sum left out of the "
                        f"kernel table (ncu collected no values for them): {names}")
    kernels = _timeline(rows.loc[~untimed].reset_index(drop=True))
    name = device_name(launches)
    spec, roof_warnings = (device, []) if device else roofs_spec(name, launches, datasheet_spec(name))
    warnings += roof_warnings
    ranges = ranges_on_timeline(kernels)
    params: dict[str, Any] = {**tool, "flop_convention": FLOP_CONVENTION, "launches": len(launches),
                              "timeline": "serialized: ncu profiles each launch alone; start_ns is the sum "
                                          "of the earlier durations",
                              "launches_without_duration": dropped}
    if len(ranges):
        params["ranges"] = ("NVTX ranges on the serialized timeline: each spans the profiled kernels "
                            "launched inside it (consecutive instances of one path merge)")
    manifest = {
        "name": Path(path).stem,
        "source": source_info(tool.pop("kind"), path, tool.pop("tool"), tool.pop("tool_version")),
        "params": params,
        "warnings": warnings,
        "unavailable_metrics": _unavailable(rows),
        "partial": bool(dropped) or partial,
    }
    return finish(Imported({"kernels": kernels, "ranges": ranges}, manifest, spec, origin=str(path)))


def ranges_on_timeline(kernels: pd.DataFrame) -> pd.DataFrame:
    """NVTX ranges rebuilt from the kernels' range paths on ncu's serialized timeline.

    Walking the kernels in order with a stack of open ranges: a range opens at the first kernel
    whose path holds it and closes at the end of the last one, so it spans the profiled kernels
    launched inside it (the unprofiled work and CPU time between them are not on this timeline).
    """
    rows: list[dict[str, Any]] = []
    stack: list[int] = []  # positions in rows of the open ranges, outermost first
    last_end = 0
    for path, start, end in zip(kernels["range"], kernels["start_ns"], kernels["end_ns"]):
        names = path.split("/") if isinstance(path, str) and path else []
        keep = 0
        while keep < min(len(stack), len(names)) and rows[stack[keep]]["name"] == names[keep]:
            keep += 1
        for pos in stack[keep:]:
            rows[pos]["end_ns"] = last_end
        del stack[keep:]
        for depth in range(keep, len(names)):
            parent = stack[-1] if stack else None
            rows.append({"id": len(rows), "name": names[depth], "start_ns": int(start), "end_ns": int(end),
                         "depth": depth, "parent": rows[parent]["id"] if parent is not None else None,
                         "path": "/".join(names[: depth + 1]), "source": "nvtx"})
            stack.append(len(rows) - 1)
        last_end = int(end)
    for pos in stack:
        rows[pos]["end_ns"] = last_end
    out = pd.DataFrame(rows)
    if len(out):
        out["duration_ns"] = out["end_ns"] - out["start_ns"]
    return out


def _timeline(rows: pd.DataFrame) -> pd.DataFrame:
    duration = rows["duration_ns"].round().astype("int64") if len(rows) else rows["duration_ns"]
    end = np.cumsum(duration.to_numpy())
    rows["duration_ns"] = duration
    rows["start_ns"] = end - duration.to_numpy()
    rows["end_ns"] = end
    return rows


def _unavailable(rows: pd.DataFrame) -> list[str]:
    """Key columns missing for at least one launch, with the metric that would fill them."""
    return [f"{col} ({metric})" for col, metric in KEY_COLUMNS.items()
            if col in rows and rows[col].isna().any()]
