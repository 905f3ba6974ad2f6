"""rocprofv3 CSV output: ``<prefix>kernel_trace.csv``, ``hip_api_trace.csv``, ``memory_copy_trace.csv``,
``marker_api_trace.csv``, ``counter_collection.csv``, ``kernel_stats.csv`` and ``agent_info.csv`` of one
run (one file prefix, such as ``12345_`` or ``decode_``). Any one file, or a folder holding one run,
picks up its siblings."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.errors import InputFormatError

from .device import agent_spec
from .flat import flat_kernels, no_counter_note, pivot_counters
from .tables import api_table, gpu_label, innermost_range, ints, range_table, read_csv

if TYPE_CHECKING:
    from pathlib import Path

    from perfscope.device import DeviceSpec

KINDS = ("kernel_trace", "hip_api_trace", "memory_copy_trace", "marker_api_trace", "counter_collection",
         "kernel_stats", "agent_info")
RUN_FILE = re.compile(r"^(?P<prefix>.*?)(?P<kind>" + "|".join(KINDS) + r")\.csv$")
HINT = "give one rocprofv3 CSV (or the folder of one run) written by `rocprofv3 --output-format csv`"
DIRECTION = {"HOST_TO_DEVICE": "HtoD", "DEVICE_TO_HOST": "DtoH", "DEVICE_TO_DEVICE": "DtoD",
             "HOST_TO_HOST": "HtoH", "PEER_TO_PEER": "PtoP"}


def run_files(path: Path) -> dict[str, Path]:
    """The files of the run ``path`` belongs to (a file of it, or a folder holding exactly one run)."""
    if path.is_dir():
        prefixes = sorted({m.group("prefix") for f in path.iterdir() if (m := RUN_FILE.match(f.name))})
        if not prefixes:
            raise InputFormatError(path, "holds no rocprofv3 CSV (*_kernel_trace.csv, ...)", hint=HINT)
        if len(prefixes) > 1:
            names = ", ".join(p.rstrip("_") or "(none)" for p in prefixes)
            raise InputFormatError(path, f"holds {len(prefixes)} rocprofv3 runs ({names})",
                                   hint="give one file of the run to import")
        folder, prefix = path, prefixes[0]
    else:
        m = RUN_FILE.match(path.name)
        if m is None:
            return {"kernel_trace": path}
        folder, prefix = path.parent, m.group("prefix")
    return {kind: folder / f"{prefix}{kind}.csv" for kind in KINDS if (folder / f"{prefix}{kind}.csv").is_file()}


def read_v3_csv(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], DeviceSpec | None, dict[str, Any]]:
    files = run_files(path)
    params: dict[str, Any] = {"files": sorted(p.name for p in files.values())}
    counters = pivot_counters(read_csv(files["counter_collection"], HINT)) if "counter_collection" in files else None
    if "kernel_trace" in files:
        trace = read_csv(files["kernel_trace"], HINT)
        if counters is not None and "Dispatch_Id" in trace:
            extra = [c for c in counters.columns if c not in trace.columns or c == "Dispatch_Id"]
            trace = trace.merge(counters[extra], on="Dispatch_Id", how="left")
        kernels = flat_kernels(trace, warnings, source="rocprofv3")
    elif counters is not None:
        kernels = flat_kernels(counters, warnings, source="rocprofv3")
    elif "kernel_stats" in files:
        raise InputFormatError(files["kernel_stats"], "per-kernel statistics only: no dispatch timeline to import",
                               hint="import the run's *_kernel_trace.csv (rocprofv3 --kernel-trace)")
    else:
        kernels = pd.DataFrame()
        warnings.append("no kernel_trace.csv nor counter_collection.csv in the run: no kernels")
    if "kernel_stats" in files and len(kernels):
        params["kernel_stats_check"] = stats_check(read_csv(files["kernel_stats"], HINT), kernels, warnings)
    no_counter_note(kernels, warnings)
    tables: dict[str, pd.DataFrame] = {"kernels": kernels}
    api = pd.DataFrame()
    if "hip_api_trace" in files:
        t = read_csv(files["hip_api_trace"], HINT)
        kind = t["Domain"].astype(str).str.contains("COMPILER").map({True: "compiler", False: "runtime"})
        api = api_table(t["Function"], t["Start_Timestamp"], t["End_Timestamp"], thread=t.get("Thread_Id"),
                        correlation=t.get("Correlation_Id"), kind=kind, pid=t.get("Process_Id"))
        tables["api"] = api
    if "marker_api_trace" in files:
        t = read_csv(files["marker_api_trace"], HINT)
        ranges = range_table(t["Function"], t["Start_Timestamp"], t["End_Timestamp"], t.get("Thread_Id"))
        tables["ranges"] = ranges
        innermost_range(kernels, api, ranges)
    if "memory_copy_trace" in files:
        tables["transfers"] = copies(read_csv(files["memory_copy_trace"], HINT), warnings)
    spec = None
    if "agent_info" in files:
        spec = agent_spec(_busiest(read_csv(files["agent_info"], HINT), kernels), warnings)
    else:
        warnings.append("no agent_info.csv beside the run: device and roofs unknown (rocprofv3 writes it "
                        "with every run; pass --roofs NAME)")
    return tables, spec, params


def _busiest(agents: pd.DataFrame, kernels: pd.DataFrame) -> dict[str, Any] | None:
    gpus = agents[agents.get("Agent_Type", pd.Series("GPU", index=agents.index)).astype(str) == "GPU"]
    if gpus.empty:
        return None
    if len(kernels):
        top = kernels["device"].value_counts().index[0]
        for col in ("Node_Id", "Logical_Node_Id", "Agent_Id"):
            if col in gpus:
                hit = gpus[gpus[col].map(gpu_label) == top]
                if len(hit):
                    return {k.lower(): v for k, v in hit.iloc[0].items()}
    return {k.lower(): v for k, v in gpus.iloc[0].items()}


def copies(t: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    """The run's copies; a layout without a size column (rocprofv3 before it recorded one) keeps its copies, their
    times measured and their bytes missing (never 0), and says so in a warning."""
    s, e = ints(t["Start_Timestamp"]), ints(t["End_Timestamp"])
    size = next((t[c] for c in ("Size", "Bytes", "Copy_Bytes") if c in t), None)
    if size is None:
        warnings.append(f"memory_copy_trace.csv has no size column (this rocprofv3 records none): its {len(t)} "
                        f"copies ({float((e - s).sum()) / 1e6:.3f} ms) are imported with their bytes missing")
        size = pd.Series(pd.NA, index=t.index, dtype="Int64")
    direction = t.get("Direction", t.get("Operation", pd.Series("", index=t.index))).astype(str)
    kind = direction.str.replace("MEMORY_COPY_", "", regex=False).map(DIRECTION).fillna("other")
    out = pd.DataFrame({"kind": kind, "bytes": ints(size), "start_ns": s, "end_ns": e, "duration_ns": e - s,
                        "correlation": ints(t["Correlation_Id"]) if "Correlation_Id" in t else pd.NA,
                        "stream": ints(t["Stream_Id"]) if "Stream_Id" in t else pd.NA})
    return out[out["start_ns"].notna() & out["end_ns"].notna()].reset_index(drop=True)


def stats_check(stats: pd.DataFrame, kernels: pd.DataFrame, warnings: list[str]) -> dict[str, Any]:
    """Compare a stats file's call count and total time with the kernels imported."""
    calls = pd.to_numeric(stats.get("Calls"), errors="coerce").sum()
    total = pd.to_numeric(stats.get("TotalDurationNs"), errors="coerce").sum()
    got_n, got_ns = len(kernels), float(kernels["duration_ns"].sum())
    if int(calls) != got_n or (total and abs(got_ns - total) > 1e-3 * total):
        warnings.append(f"the stats file counts {int(calls)} calls / {total:.0f} ns, the trace {got_n} / {got_ns:.0f} ns")
    return {"calls": int(calls), "total_ns": float(total)}
