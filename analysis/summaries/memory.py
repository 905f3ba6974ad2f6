"""Tables from a report's ``memory`` table: the peak per device, per phase and per step; what was
live at a time (by category, with fragmentation: reserved but not allocated); and the gauges'
summary beside the latencies."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from perfscope.report import Report

CATEGORY_ORDER = ("weights", "kv_cache", "activations", "workspace", "optimizer", "gradient", "cuda_graph_pool",
                  "unknown")


def _alloc_rows(mem: pd.DataFrame) -> pd.DataFrame:
    return mem[mem["action"].to_numpy() == "alloc"]


def live_at(report: Report, device: str, t_ns: int) -> pd.DataFrame:
    """The allocations of ``device`` live just after ``t_ns`` (made at or before it, not yet freed),
    largest first: size, category, op, module, source, when made."""
    mem = report.memory
    if not len(mem):
        return pd.DataFrame()
    a = _alloc_rows(mem[mem["device"] == device])
    made = a["t_ns"].to_numpy("int64") <= t_ns
    free_t = a["free_t_ns"].astype("float64").to_numpy()
    alive = made & (np.isnan(free_t) | (free_t > t_ns))
    cols = ["size_bytes", "category", "op", "module", "source", "t_ns", "addr", "preexisting"]
    return a.loc[alive, cols].sort_values("size_bytes", ascending=False, kind="stable").reset_index(drop=True)


def by_category(report: Report, device: str, t_ns: int) -> dict[str, float]:
    """Bytes live at ``t_ns`` per category, and ``fragmentation`` (reserved - allocated, when the
    source records reserved bytes)."""
    live = live_at(report, device, t_ns)
    out = {c: float(live.loc[live["category"] == c, "size_bytes"].sum()) for c in CATEGORY_ORDER
           if (live["category"] == c).any()} if len(live) else {}
    mem = report.memory
    dev = mem[(mem["device"] == device) & (mem["t_ns"] <= t_ns)]
    if len(dev):
        row = dev.iloc[-1]
        reserved = float(row["reserved_bytes"]) if pd.notna(row["reserved_bytes"]) else math.nan
        allocated = float(row["allocated_bytes"]) if pd.notna(row["allocated_bytes"]) else math.nan
        if np.isfinite(reserved) and np.isfinite(allocated) and reserved > 0:
            out["fragmentation"] = reserved - allocated
    return out


def peaks(report: Report) -> list[dict[str, Any]]:
    """Per device: the peak of allocated bytes, when, the op / module / source of the allocation
    that reached it, the reserved bytes then, and the bytes per category at that moment."""
    mem = report.memory
    out = []
    for device in sorted(set(mem["device"].dropna())) if len(mem) else []:
        dev = mem[mem["device"] == device]
        alloc = dev["allocated_bytes"].astype("float64")
        if not alloc.notna().any():
            continue
        i = int(np.nanargmax(alloc.to_numpy()))
        row = dev.iloc[i]
        t = int(row["t_ns"])
        out.append({
            "device": device, "peak_allocated_bytes": float(alloc.iloc[i]), "t_ns": t,
            "reserved_bytes": float(row["reserved_bytes"]) if pd.notna(row["reserved_bytes"]) else None,
            "max_reserved_bytes": float(dev["reserved_bytes"].max()) if dev["reserved_bytes"].notna().any() else None,
            "op": row["op"], "module": row["module"], "source": row["source"], "phase": row["phase"],
            "step": None if pd.isna(row["step"]) else int(row["step"]),
            "by_category": by_category(report, device, t), "events": len(dev),
            "memory_source": row["memory_source"],
        })
    return out


def peak_by(report: Report, key: str) -> pd.DataFrame:
    """Peak allocated bytes per device and ``key`` (``phase`` or ``step``), rows in time order."""
    mem = report.memory
    if not len(mem) or mem[key].isna().all():
        return pd.DataFrame(columns=["device", key, "peak_allocated_bytes", "t_ns"])
    m = mem[mem[key].notna()]
    idx = m.groupby(["device", key], sort=False)["allocated_bytes"].idxmax()
    rows = m.loc[idx.dropna().astype(int), ["device", key, "allocated_bytes", "t_ns"]]
    return rows.rename(columns={"allocated_bytes": "peak_allocated_bytes"}).sort_values("t_ns").reset_index(drop=True)


def top_sources(report: Report, device: str, n: int = 8) -> pd.DataFrame:
    """The allocations live at the device's peak grouped by (category, op, source), largest first."""
    p = next((p for p in peaks(report) if p["device"] == device), None)
    if p is None:
        return pd.DataFrame()
    live = live_at(report, device, p["t_ns"])
    if not len(live):
        return live
    keys = ["category", "op", "source", "module"]
    g = live.fillna({k: "" for k in keys}).groupby(keys, sort=False)["size_bytes"].agg(["sum", "count"])
    return g.sort_values("sum", ascending=False).head(n).reset_index().rename(
        columns={"sum": "bytes", "count": "allocations"})


def memory_payload(report: Report) -> dict[str, Any]:
    """The ``--json`` key ``memory``: peaks per device (with categories), per phase and per step."""
    if not len(report.memory):
        return {"peaks": [], "by_phase": [], "by_step": []}
    from perfscope.format import jsonable

    return jsonable({"peaks": peaks(report),
                     "by_phase": peak_by(report, "phase").to_dict("records"),
                     "by_step": peak_by(report, "step").to_dict("records")})


def gauge_summary(report: Report) -> pd.DataFrame:
    """Per gauge: samples, min, max, last (the report's gauges table)."""
    g = report.gauges
    if not len(g):
        return pd.DataFrame()
    return g.groupby("metric", sort=True)["value"].agg(["count", "min", "max", "last"]).reset_index()


DEFAULT_CONTEXT = 8192
"""The context of a report's capacity section when the run does not say its own (prompt + output)."""


def capacity_section(report: Report) -> dict[str, Any] | None:
    """The capacity section of an LLM report: its model (the engine's, or an HF config the manifest
    names) on its GPU (the datasheet row of the report's device), at the run's context (prompt +
    output tokens, else :data:`DEFAULT_CONTEXT`), with the activation peak measured in the run
    when the report has a memory timeline. None when the model or the GPU's memory is unknown."""
    from perfscope.capacity import (
        InputFormatError,
        UsageError,
        capacity,
        dtype_bytes,
        replace_source,
        resolve_device_memory,
        resolve_model,
        sentence,
    )
    from perfscope.datasheets import find_datasheet

    params = report.params
    name = params.get("model")
    dev = report.device
    if not isinstance(name, str) or dev is None or dev.kind == "cpu":
        return None
    sheet = find_datasheet(dev.name, dev.properties)
    if sheet is None or not sheet.memory_gb:
        return None
    try:
        m = resolve_model(name)
    except (UsageError, InputFormatError):
        return None
    ctx = params.get("prompt_len", 0) + params.get("gen_len", 0) if isinstance(params.get("prompt_len"), int) else 0
    context = int(ctx) if isinstance(ctx, int) and ctx > 0 else DEFAULT_CONTEXT
    act = None
    mem = getattr(report, "memory", None)
    if mem is not None and len(mem):
        got = [p for p in peaks(report) if str(p["device"]).startswith("cuda")]
        if got:
            cats = got[0]["by_category"]
            act = float(cats.get("activations", 0.0) + cats.get("workspace", 0.0))
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(params.get("dtype")), None)
    dm = resolve_device_memory(sheet.model)
    kw: dict[str, Any] = {"context": context, "weights_dtype": dtype, "activation_bytes": act}
    c = capacity(m, dm, kv_dtype=dtype, **kw)
    fp8 = capacity(m, dm, kv_dtype="fp8", **kw) if dtype_bytes(c.kv_dtype) > 1 else None
    if act is not None:
        c = replace_source(c, "measured in this run (activations + workspace at the peak)")
    return {"capacity": c.to_dict(), "fp8_kv": fp8.to_dict() if fp8 else None, "finding": sentence(c, fp8)}


