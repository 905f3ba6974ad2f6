"""rocprof-compute (Omniperf) workload folders: ``pmc_perf.csv`` (one row per dispatch, every counter
of every pass), ``sysinfo.csv`` (the device), ``pmc_dispatch_info.csv`` / ``timestamps.csv`` and,
when the roofline benchmark ran, ``roofline.csv`` (measured per-level bandwidths and per-precision
peaks). Costs per dispatch come from :mod:`.counters` (rocprof-compute's own formulas).
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.device import MAX_ROOF, DeviceSpec, Roof, valid_roof
from perfscope.errors import InputFormatError
from perfscope.format import counted
from perfscope.inputs import read_text

from .counters import SOURCE, UTILIZATION_SOURCE, costs_from_counters, utilization_from_counters
from .device import note_sheet, sysinfo_spec
from .tables import gpu_label, ints, kernel_table, read_csv, tagged

if TYPE_CHECKING:
    from pathlib import Path

PMC = "pmc_perf.csv"
HINT = "give the workload folder rocprof-compute wrote (the one holding pmc_perf.csv and sysinfo.csv)"
ROOFLINE_MEMORY = {"HBMBw": "dram", "L2Bw": "l2", "L1Bw": "l1", "LDSBw": "shared"}
ROOFLINE_COMPUTE = {"FP64Flops": "fp64", "FP32Flops": "fp32", "MFMAF64Flops": "fp64_tensor",
                    "MFMAF32Flops": "fp32_matrix", "MFMAF16Flops": "fp16", "MFMABF16Flops": "bf16",
                    "MFMAI8Ops": "int8"}
"""roofline.csv column (GB/s, GFLOP/s, GOP/s) -> perfscope roof. FP32/FP64 are the VALU peaks (the
roofline of a VALU kernel); the MFMA FP32/FP64 peaks are kept as ``fp32_matrix`` / ``fp64_tensor``."""
MEASURED = "measured (rocprof-compute)"


def workload_folder(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def read_frame(path: Path) -> pd.DataFrame:
    return read_csv(path, HINT)


def read_compute(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], DeviceSpec | None, dict[str, Any]]:
    folder = workload_folder(path)
    pmc_path = folder / PMC
    if not pmc_path.is_file():
        raise InputFormatError(folder, "no pmc_perf.csv: not a rocprof-compute workload folder", hint=HINT)
    pmc = read_frame(pmc_path)
    missing = [c for c in ("Kernel_Name", "Start_Timestamp", "End_Timestamp") if c not in pmc]
    if missing:
        raise InputFormatError(pmc_path, f"lacks column(s) {', '.join(missing)}", hint=HINT)
    sysinfo = _one_row(folder / "sysinfo.csv")
    params: dict[str, Any] = {}
    if sysinfo is None:
        warnings.append(f"{folder}: no sysinfo.csv: device unknown, LDS bytes missing")
        spec: DeviceSpec | None = None
    else:
        spec = sysinfo_spec(sysinfo, warnings)
        params = {k: sysinfo.get(k) for k in ("workload_name", "version", "rocm_version", "ip_blocks")}
    banks = spec.properties.get("lds_banks_per_cu") if spec else None
    bad = pmc["Start_Timestamp"].isna() | pmc["End_Timestamp"].isna()
    if bad.any():
        warnings.append(f"{pmc_path}: {counted(int(bad.sum()), 'dispatch')} without timestamps dropped")
        pmc = pmc[~bad].reset_index(drop=True)
    pmc = _timed(pmc, folder / "timestamps.csv", params, warnings)
    costs = costs_from_counters(pmc, banks)
    kernels = kernel_table(
        pmc["Kernel_Name"], pmc["GPU_ID"].map(gpu_label) if "GPU_ID" in pmc else ["gpu"] * len(pmc),
        pmc["Start_Timestamp"], pmc["End_Timestamp"],
        correlation=ints(pmc.get("Dispatch_ID")),
        block=_dims(pmc.get("Workgroup_Size")), grid=_dims(pmc.get("Grid_Size")),
        registers_per_thread=ints(pmc.get("Arch_VGPR")),
        shared_mem_bytes=ints(pmc.get("LDS_Per_Workgroup")),
        **{c: costs[c] for c in costs.columns})
    costed = kernels["flops"].notna() | kernels["dram_bytes"].notna()
    kernels["flops_source"] = tagged(kernels["flops"], "rocprof-compute")
    kernels["bytes_source"] = tagged(kernels["dram_bytes"], "rocprof-compute")
    if (~costed).any():
        warnings.append(f"{int((~costed).sum())} of {len(kernels)} dispatches lack the counters rocprof-compute's "
                        "roofline formulas need (VALU/MFMA instruction and TCC/TCP request counts): their cost is "
                        "missing")
    roofline = folder / "roofline.csv"
    if spec is not None and roofline.is_file():
        spec = with_roofline(spec, roofline, warnings)
    elif spec is not None:
        warnings.append(f"{folder}: no roofline.csv (rocprof-compute ran without its roofline benchmark): roofs are "
                        "the datasheet's where a row matches (else derived from the gfx arch's per-CU rates); L2, L1 and LDS "
                        "roofs unknown")
    if spec is not None and not spec.compute:
        note_sheet(spec, warnings)
    _with_utilization(kernels, pmc, sysinfo, spec, params, warnings)
    params["cost_formulas"] = SOURCE
    return {"kernels": kernels}, spec, params


def _with_utilization(kernels: pd.DataFrame, pmc: pd.DataFrame, sysinfo: dict[str, str] | None,
                      spec: DeviceSpec | None, params: dict[str, Any], warnings: list[str]) -> None:
    """Each unit's % of its peak per dispatch (the input of the kernel's measured limiter), in place: the CU's
    pipes, vL1D, LDS and L2 from the counters (:func:`.counters.utilization_from_counters`), HBM as the
    dispatch's HBM bytes over its time against the DRAM roof."""
    util = utilization_from_counters(pmc.reset_index(drop=True), kernels["duration_ns"], sysinfo)
    for column in util.columns:
        if util[column].notna().any():
            kernels[column] = util[column].to_numpy()
    bw = spec.peak_bandwidth("dram") if spec is not None else None
    if bw:
        seconds = pd.to_numeric(kernels["duration_ns"], errors="coerce").astype("float64") * 1e-9
        dram = 100.0 * pd.to_numeric(kernels["dram_bytes"], errors="coerce") / seconds.where(seconds > 0) / bw
        if dram.notna().any():
            kernels["dram_throughput_pct"] = dram.to_numpy()
    if any(c in kernels for c in util.columns):
        params["unit_utilization"] = UTILIZATION_SOURCE
        over = {c: int((util[c] > 100.0).sum()) for c in util.columns if (util[c] > 100.0).any()}
        if over:
            what = ", ".join(f"{c} in {n}" for c, n in over.items())
            warnings.append(f"rocprof-compute's utilization formula gives more than 100% of peak for some dispatches "
                            f"({what}): kept as computed, read as a saturated unit")


def _timed(pmc: pd.DataFrame, path: Path, params: dict[str, Any], warnings: list[str]) -> pd.DataFrame:
    """Dispatch times from ``timestamps.csv``, the workload's own timing pass, where it has the dispatch:
    pmc_perf.csv's timestamps are those of a counter pass, slowed or cut by counter multiplexing (the
    MI308X FlashMLA kernel: 16 µs in pmc_perf.csv for 16 ms in timestamps.csv)."""
    if not path.is_file() or "Dispatch_ID" not in pmc:
        params["timing"] = "pmc_perf.csv"
        return pmc
    ts = read_frame(path)
    if not {"Dispatch_ID", "Start_Timestamp", "End_Timestamp"} <= set(ts.columns):
        warnings.append(f"{path}: no Dispatch_ID/Start_Timestamp/End_Timestamp columns; times from pmc_perf.csv")
        return pmc
    ts = ts.drop_duplicates("Dispatch_ID").set_index("Dispatch_ID")
    start = pmc["Dispatch_ID"].map(ts["Start_Timestamp"])
    end = pmc["Dispatch_ID"].map(ts["End_Timestamp"])
    found = start.notna() & end.notna()
    pmc = pmc.copy()
    pmc.loc[found, "Start_Timestamp"] = start[found].astype("int64")
    pmc.loc[found, "End_Timestamp"] = end[found].astype("int64")
    params["timing"] = f"timestamps.csv ({int(found.sum())} of {len(pmc)} dispatches; the rest pmc_perf.csv)"
    return pmc


def _dims(values: Any) -> pd.Series | None:
    if values is None:
        return None
    nums = pd.to_numeric(values, errors="coerce")
    return pd.Series([f"({int(v)}, 1, 1)" if pd.notna(v) else None for v in nums], dtype="object")


def _one_row(path: Path) -> dict[str, str] | None:
    if not path.is_file():
        return None
    rows = csv.DictReader(io.StringIO(read_text(path), newline=""))
    return next(rows, None)


def roofline_roofs(path: Path, device_row: int = 0,
                   warnings: list[str] | None = None) -> tuple[dict[str, Roof], dict[str, Roof]]:
    """(compute, memory) roofs of one device row of rocprof-compute's ``roofline.csv``; a value that is not
    a valid roof (:func:`perfscope.device.valid_roof`: 1e308, inf, negative) is left out and named in
    ``warnings``, so the datasheet's roof stays."""
    table = read_frame(path)
    if "device" in table and (table["device"] == device_row).any():
        row = table[table["device"] == device_row].iloc[0]
    elif len(table):
        row = table.iloc[0]
    else:
        raise InputFormatError(path, "has no rows", hint="re-run rocprof-compute's roofline benchmark")
    method = f"rocprof-compute roofline benchmark ({path.name}, device {device_row}, column {{col}}, mean)"
    with np.errstate(over="ignore"):  # 1e308 x 1e9 is inf: refused below
        values = {col: float(pd.to_numeric(pd.Series([row[col]]), errors="coerce").iloc[0]) * 1e9
                  for col in (*ROOFLINE_MEMORY, *ROOFLINE_COMPUTE) if col in row and pd.notna(row[col])}
    bad = sorted(col for col, v in values.items() if not valid_roof(float(v)))
    if bad and warnings is not None:
        warnings.append(f"{path}: {len(bad)} roofline value(s) that are not a finite rate in (0, {MAX_ROOF:g}] left "
                        f"out ({', '.join(bad)}): the datasheet's roofs stand there")
    good = {col: float(v) for col, v in values.items() if col not in bad}
    memory = {level: Roof(good[col], MEASURED, method=method.format(col=col))
              for col, level in ROOFLINE_MEMORY.items() if col in good}
    compute = {p: Roof(good[col], MEASURED, method=method.format(col=col), dense=True if col.startswith("MFMA") else None)
               for col, p in ROOFLINE_COMPUTE.items() if col in good}
    return compute, memory


def with_roofline(spec: DeviceSpec, path: Path, warnings: list[str]) -> DeviceSpec:
    compute, memory = roofline_roofs(path, warnings=warnings)
    if not memory and not compute:
        warnings.append(f"{path}: no roofline columns read")
        return spec
    return spec.with_roofs(compute=compute, memory=memory)
