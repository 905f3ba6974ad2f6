"""Details of one roofline point (a kernel execution or a kernel name), as label/value rows.

Values are plain text (not escaped): the Dash app renders them as text nodes. The point's key
comes from the figure's ``customdata``: a row index in ``report.kernels`` for per-kernel
points, the kernel name for per-name points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfscope.analysis.costs.limiter import UNIT_COLUMNS, bound_label, limiter_note, limiter_words
from perfscope.schema import text_of

from .text import MISSING, duration, is_missing, pct, si

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report


def _text(value: Any) -> str:
    return MISSING if is_missing(value) else str(value)


def _achieved_rows(row: pd.Series | dict[str, Any]) -> list[tuple[str, str]]:
    return [
        ("FLOPs", si(row.get("flops"), "FLOP")),
        ("DRAM bytes", si(row.get("dram_bytes"), "B")),
        ("arithmetic intensity", si(row.get("arith_intensity"), "FLOP/B")),
        ("achieved", (f"{si(row.get('achieved_flops_per_s'), 'FLOP/s')}, "
                      f"{si(row.get('achieved_bytes_per_s'), 'B/s')}")),
        ("attainable roof", si(row.get("roof_flops_per_s"), "FLOP/s")),
        ("% of roof", pct(row.get("pct_of_roof"))),
        ("bound", _text(bound_label(row.get("bound"), row.get("limiter")))),
        *_limiter_rows(row),
        ("precision", _text(row.get("precision"))),
        *_level_rows(row),
    ]


def _limiter_rows(row: pd.Series | dict[str, Any]) -> list[tuple[str, str]]:
    """The measured limiter and each unit's % of its peak, where Nsight Compute or rocprof-compute measured
    them; the roofline's reading when it disagrees (the point stays where the FLOPs and bytes put it)."""
    limiter = row.get("limiter")
    if is_missing(limiter):
        return []
    pipe = row.get(f"pipe_{limiter}_pct")
    out = [("measured limiter", limiter_words(limiter, row.get("limiter_pct"), pipe))]
    note = limiter_note(row)
    if note:
        out.append(("roofline reading", note))
    for col in UNIT_COLUMNS:
        if not is_missing(row.get(col)):
            out.append((f"{col.removesuffix('_pct').replace('_', ' ')}", pct(row.get(col))))
    return out


def _level_rows(row: pd.Series | dict[str, Any]) -> list[tuple[str, str]]:
    """Hierarchical roofline facts, where the kernel has bytes per level."""
    if is_missing(row.get("bound_level")):
        return []
    return [("L2 bytes", si(row.get("l2_bytes"), "B")), ("L1 bytes", si(row.get("l1_bytes"), "B")),
            ("shared/LDS bytes", si(row.get("shared_bytes"), "B")),
            ("binding memory level", _text(row.get("bound_level"))),
            ("its roof", si(row.get("level_roof_flops_per_s"), "FLOP/s"))]


def kernel_details(report: Report, row_index: int) -> list[tuple[str, str]]:
    """Every fact about one kernel execution (row ``row_index`` of ``report.kernels``)."""
    k = report.kernels
    if not 0 <= int(row_index) < len(k):
        return [("error", f"no kernel row {row_index} in this report")]
    row = k.iloc[int(row_index)]
    total = float(k["duration_ns"].sum()) or 1.0
    rows = [
        ("name", _text(row["name"])),
        ("operator", _text(row.get("op"))),
        ("shapes", _text(row.get("op_shapes"))),
        ("dtype", _text(row.get("dtype"))),
        ("device / stream", f"{_text(row.get('device'))} / {_text(row.get('stream'))}"),
        ("launch config", (f"grid {_text(row.get('grid'))}, block {_text(row.get('block'))}, "
                           f"{_text(row.get('registers_per_thread'))} regs/thread, "
                           f"{si(row.get('shared_mem_bytes'), 'B')} shared")),
        ("duration", duration(row["duration_ns"])),
        ("share of total kernel time", pct(float(row["duration_ns"]) / total * 100.0, 2)),
        ("range", _text(row.get("range"))),
        ("phase", _text(row.get("phase"))),
    ]
    return rows + _achieved_rows(row)


def _top_values(sub: pd.DataFrame, column: str, n: int = 3) -> str:
    valid = sub[sub[column].notna()]
    if not len(valid):
        return MISSING
    per = valid.groupby(text_of(valid[column]))["duration_ns"].sum().sort_values(ascending=False)
    extra = f" (+{len(per) - n} more)" if len(per) > n else ""
    return "; ".join(per.index[:n]) + extra


def name_details(report: Report, name: str) -> list[tuple[str, str]]:
    """Facts about every execution of kernel ``name``, with totals re-classified on the roofline."""
    from perfscope.analysis.summaries.kernels import aggregate_by_name

    k = report.kernels
    sub = k[k["name"].astype("object") == name]
    if not len(sub):
        return [("error", "no kernel of that name in this report")]
    agg = aggregate_by_name(sub, report.device).iloc[0]
    total = float(k["duration_ns"].sum()) or 1.0
    rows = [
        ("name", name),
        ("executions", str(len(sub))),
        ("total time", duration(agg["duration_ns"])),
        ("mean time", duration(agg["mean_ns"])),
        ("share of total kernel time", pct(float(agg["duration_ns"]) / total * 100.0, 2)),
        ("operators", _top_values(sub, "op")),
        ("shapes (most time first)", _top_values(sub, "op_shapes")),
        ("launch configs", _top_values(sub.assign(cfg="grid " + text_of(sub["grid"], "?") + ", block "
                                                  + text_of(sub["block"], "?")), "cfg")),
        ("phases", _top_values(sub, "phase")),
        ("FLOPs known for", pct(agg.get("flops_coverage_pct")) + " of its time"),
    ]
    return rows + _achieved_rows(agg)


def point_details(report: Report, key: object, per: str) -> list[tuple[str, str]]:
    """Details for a clicked roofline point (``per`` is the figure's ``kernel``/``name`` mode)."""
    if per == "name":
        return name_details(report, str(key))
    try:
        return kernel_details(report, int(key))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return [("error", f"not a kernel row: {key!r}")]
