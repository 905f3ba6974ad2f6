"""Flat per-dispatch kernel tables: rocprof v1 ``results.csv`` / ``results.db`` (KERN table),
rocprofv2 kernel-trace CSVs and rocprofv3 ``*_kernel_trace.csv`` / ``*_counter_collection.csv``:
one column naming scheme per generation, mapped to one kernel table here."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .counters import costs_from_counters, has_cost_counters
from .tables import NO_COUNTERS, MissingColumns, dims_column, gpu_label, ints, kernel_table, tagged

ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("Kernel_Name", "KernelName", "kernel_name", "Name"),
    "start": ("Start_Timestamp", "BeginNs", "start"),
    "end": ("End_Timestamp", "EndNs", "end"),
    "agent": ("Agent_Id", "GPU_ID", "gpu-id", "agent_abs_index"),
    "correlation": ("Correlation_Id", "Correlation_ID", "Dispatch_ID", "Index", "corr_id"),
    # rocpd's own column first: a counter join adds a Dispatch_Id that is empty on kernels without counters
    "dispatch": ("dispatch_id", "Dispatch_Id", "Dispatch_ID", "Index"),
    "stream": ("Stream_Id", "Queue_Id", "Queue_ID", "queue-id", "stream_id"),
    "pid": ("Process_Id", "PID", "pid"),
    "vgpr": ("VGPR_Count", "Arch_VGPR", "arch_vgpr", "vgpr_count"),
    "lds": ("LDS_Block_Size", "Group_Segment_Size", "LDS_Per_Workgroup", "lds", "lds_size"),
}
START_END = ("start", "end")


def pick(df: pd.DataFrame, key: str) -> pd.Series | None:
    for col in ALIASES[key]:
        if col in df:
            return df[col]
    return None


def has_kernel_columns(df: pd.DataFrame) -> bool:
    return all(pick(df, k) is not None for k in ("name", *START_END))


def _grid_block(df: pd.DataFrame) -> dict[str, pd.Series]:
    out: dict[str, pd.Series] = {}
    for key, cols in (("grid", ("Grid_Size", "grd", "grid_size")), ("block", ("Workgroup_Size", "wgr", "workgroup_size"))):
        x = f"{cols[0]}_X"
        if x in df:
            out[key] = dims_column(df[x], df.get(f"{cols[0]}_Y"), df.get(f"{cols[0]}_Z"))
        elif f"{key}_x" in df or f"{'workgroup' if key == 'block' else 'grid'}_x" in df:
            base = "workgroup" if key == "block" else "grid"
            out[key] = dims_column(df[f"{base}_x"], df.get(f"{base}_y"), df.get(f"{base}_z"))
        else:
            col = next((c for c in cols if c in df), None)
            if col is not None:
                out[key] = dims_column(df[col])
    return out


def flat_kernels(df: pd.DataFrame, warnings: list[str], *, source: str, lds_banks: Any = None) -> pd.DataFrame:
    """One kernel row per dispatch row of ``df`` (rows without both timestamps are dropped, counted).

    Raises:
        MissingColumns: no kernel name, start or end column in any of its spellings.
    """
    missing = [k for k in ("name", *START_END) if pick(df, k) is None]
    if missing:
        raise MissingColumns(" or ".join("/".join(ALIASES[k][:2]) for k in missing))
    start, end = ints(pick(df, "start")), ints(pick(df, "end"))
    bad = start.isna() | end.isna()
    if bad.any():
        warnings.append(f"{int(bad.sum())} dispatch row(s) without a start or end timestamp dropped")
        df, start, end = df[~bad].reset_index(drop=True), start[~bad].reset_index(drop=True), end[~bad].reset_index(drop=True)
    agent = pick(df, "agent")
    extra: dict[str, Any] = {}
    for key, col in (("correlation", "correlation"), ("stream", "stream"), ("registers_per_thread", "vgpr"),
                     ("shared_mem_bytes", "lds"), ("pid", "pid"), ("dispatch_id", "dispatch")):
        values = pick(df, col)
        if values is not None:
            extra[key] = ints(values)
    extra.update(_grid_block(df))
    out = kernel_table(pick(df, "name"), agent.map(gpu_label) if agent is not None else ["gpu"] * len(df),
                       start, end, **extra)
    if has_cost_counters(df):
        costs = costs_from_counters(df, lds_banks)
        for col in costs.columns:
            out[col] = costs[col].to_numpy()
        out["flops_source"] = tagged(out["flops"], source)
        out["bytes_source"] = tagged(out["dram_bytes"], source)
    return out


def pivot_counters(df: pd.DataFrame) -> pd.DataFrame:
    """rocprofv3 ``counter_collection`` (one row per dispatch and counter) -> one row per dispatch with a
    column per counter (values summed over dimensions a counter repeats on)."""
    keys = [c for c in df.columns if c not in ("Counter_Name", "Counter_Value")]
    dispatch = "Dispatch_Id" if "Dispatch_Id" in df else keys[0]
    values = pd.to_numeric(df["Counter_Value"], errors="coerce")
    wide = values.groupby([df[dispatch], df["Counter_Name"]], sort=False).sum(min_count=1).unstack("Counter_Name")
    first = df.drop(columns=["Counter_Name", "Counter_Value"]).drop_duplicates(dispatch).set_index(dispatch)
    return first.join(wide).reset_index()


def no_counter_note(kernels: pd.DataFrame, warnings: list[str]) -> None:
    if len(kernels) and ("flops" not in kernels or kernels["flops"].isna().all()) and \
            ("dram_bytes" not in kernels or kernels["dram_bytes"].isna().all()):
        warnings.append(NO_COUNTERS)
