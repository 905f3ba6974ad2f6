"""Nsight Systems exports (``nsys export --type sqlite``, or ``.nsys-rep`` via ``nsys``) to a Report.

Tables: kernels (names through StringIds, launch geometry, NVTX range and phase of the
launch call), transfers (memcpy and memset), api (CUDA runtime and driver calls), ranges
(NVTX). Nsight Systems records no hardware counters, so kernel FLOPs and DRAM bytes stay
missing and every bound is ``unknown``, said plainly in the manifest's warnings. Roofs come
from the datasheet table keyed on TARGET_INFO_GPU's device name (FORMATS.md sections 1, 7).
Host names, user names, paths and environment stored in the export are never copied.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.datasheets import ROOFS_FLAG, gpu_spec
from perfscope.device import DeviceSpec, Roof
from perfscope.errors import CollectorError, InputFormatError, ToolNotFoundError
from perfscope.report import Report, source_info

from ..finish import Imported, finish
from .nvtx import innermost_range, range_columns, read_ranges
from .sqlite import EXPORT_HINT, NsysDb, lookup_strings, pid_of, process_key, tid_of

if TYPE_CHECKING:
    from collections.abc import Callable

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
GPU_TABLE = "TARGET_INFO_GPU"
OSRT_TABLE = "OSRT_API"
EXPORT_TIMEOUT_S = 1800

MEMCPY_OPER = {
    0: "CUDA_MEMCPY_KIND_UNKNOWN", 1: "CUDA_MEMCPY_KIND_HTOD", 2: "CUDA_MEMCPY_KIND_DTOH",
    3: "CUDA_MEMCPY_KIND_HTOA", 4: "CUDA_MEMCPY_KIND_ATOH", 5: "CUDA_MEMCPY_KIND_ATOA",
    6: "CUDA_MEMCPY_KIND_ATOD", 7: "CUDA_MEMCPY_KIND_DTOA", 8: "CUDA_MEMCPY_KIND_DTOD",
    9: "CUDA_MEMCPY_KIND_HTOH", 10: "CUDA_MEMCPY_KIND_PTOP", 11: "CUDA_MEMCPY_KIND_UVM_HTOD",
    12: "CUDA_MEMCPY_KIND_UVM_DTOH", 13: "CUDA_MEMCPY_KIND_UVM_DTOD",
}
"""Hard-coded ``copyKind`` ids for exports without ENUM_CUDA_MEMCPY_OPER (FORMATS.md 1.5)."""
COPY_KIND = {
    "HTOD": "HtoD", "HTOA": "HtoD", "UVM_HTOD": "HtoD",
    "DTOH": "DtoH", "ATOH": "DtoH", "UVM_DTOH": "DtoH",
    "DTOD": "DtoD", "ATOA": "DtoD", "ATOD": "DtoD", "DTOA": "DtoD", "UVM_DTOD": "DtoD",
    "HTOH": "HtoH", "PTOP": "PtoP",
}
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed",
            5: "Device Static", 6: "Managed Static", 7: "Unknown"}
"""nsys's own memory-kind ids (not CUPTI's), for exports without ENUM_CUDA_MEM_KIND."""
EVENT_CLASS = {0: "runtime", 1: "driver"}
API_SUFFIX = re.compile(r"_v\d{4,5}$")
NO_COUNTERS = (
    "Nsight Systems records no hardware counters: kernel FLOPs and DRAM bytes are unknown, so "
    "every bound is 'unknown' (profile the kernels with Nsight Compute for a measured roofline)"
)


# ---------------------------------------------------------------------------- public readers
def read_nsys_sqlite(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    """Read an Nsight Systems SQLite export into a classified Report.

    Args:
        path: the ``.sqlite`` file written by ``nsys export --type sqlite``; opened read-only.
        device: roofs to classify against, overriding the datasheet roofs of the captured GPU.

    Raises:
        InputFormatError: not an SQLite file, not an nsys export, or damaged / truncated.
    """
    try:
        return _read_sqlite(path, device=device)
    except (ValueError, TypeError, OverflowError) as exc:  # SQLite columns are dynamically typed
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise InputFormatError(path, f"holds a value no nsys export has ({first})", hint=EXPORT_HINT) from None


def _read_sqlite(path: str | Path, *, device: DeviceSpec | None) -> Report:
    with NsysDb(path) as db:
        meta = db.metadata()
        warnings: list[str] = []
        ranges, nvtx_warnings = read_ranges(db)
        runtime = _runtime(db)
        kernels = _kernels(db, runtime, ranges, warnings)
        transfers = _transfers(db, runtime, ranges)
        waits = _osrt(db)
        gpus = _gpu_rows(db)
        if db.views:
            warnings.append(f"{len(db.views)} view(s) in the export not read (an nsys export holds tables; a view "
                            f"is a query perfscope does not run): {', '.join(db.views[:5])}")
        warnings += db.notes
    warnings += nvtx_warnings
    spec = device or _device_from(gpus, kernels, warnings)
    if len(kernels):
        warnings.append(NO_COUNTERS)
    tables = {
        "kernels": kernels,
        "transfers": transfers,
        "api": _api_table(runtime),
        "ranges": ranges.drop(columns=["global_tid", "push_pop"], errors="ignore"),
        "host": waits,
    }
    manifest = {
        "name": Path(path).stem,
        "source": source_info("nsys-sqlite", path, "nsys", meta.get("EXPORT_PRODUCT_VERSION")),
        "params": {"export_schema_version": meta.get("EXPORT_SCHEMA_VERSION")},
        "warnings": warnings,
        "unavailable_metrics": ["flops", "dram_bytes"] if len(kernels) else [],
    }
    return finish(Imported(tables, manifest, spec, origin=str(path)))


def read_nsys_rep(path: str | Path, *, device: DeviceSpec | None = None,
                  timeout_s: float = EXPORT_TIMEOUT_S) -> Report:
    """Convert a ``.nsys-rep`` with ``nsys export --type sqlite`` and read the result.

    Raises:
        ToolNotFoundError: ``nsys`` is not on PATH.
        CollectorError: the export failed or timed out (command, exit code, stderr tail).
    """
    nsys = shutil.which("nsys")
    if nsys is None:
        raise ToolNotFoundError(
            "nsys",
            "install Nsight Systems (https://developer.nvidia.com/nsight-systems) and put `nsys` "
            "on PATH, or export by hand: `nsys export --type sqlite --output REPORT.sqlite "
            f"{path}` and import REPORT.sqlite",
        )
    with tempfile.TemporaryDirectory(prefix="perfscope-nsys-") as tmp:
        out = Path(tmp) / "export.sqlite"
        cmd = [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={out}", str(path)]
        _run_export(cmd, timeout_s)
        if not out.is_file():
            raise CollectorError("nsys", cmd, 0, "nsys export wrote no SQLite file")
        report = read_nsys_sqlite(out, device=device)
    source = {**report.manifest["source"], "kind": "nsys-rep", "path": str(path)}
    return report.with_manifest(source=source, name=Path(path).stem)


def _run_export(cmd: list[str], timeout_s: float) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise CollectorError("nsys", cmd, None, tail, hint=f"the export ran over {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise CollectorError("nsys", cmd, done.returncode, done.stderr or done.stdout,
                             hint="check that the .nsys-rep is complete and that this nsys can read it")


# ---------------------------------------------------------------------------- kernels
def _kernels(db: NsysDb, runtime: pd.DataFrame, ranges: pd.DataFrame,
             warnings: list[str]) -> pd.DataFrame:
    if not db.has(KERNEL_TABLE):
        warnings.append(f"no CUDA kernels: table {KERNEL_TABLE} is absent (nothing ran on the GPU "
                        "during the capture, or it ran without --trace=cuda)")
        return pd.DataFrame()
    exprs = _kernel_exprs(db)
    k = db.int_frame(KERNEL_TABLE, exprs)
    if k.empty:
        warnings.append(f"no CUDA kernels: table {KERNEL_TABLE} is empty")
        return pd.DataFrame()
    names, short = _kernel_names(db, k)
    start, end = k["start"], k["end"]  # missing where unreadable: schema.untimed drops and counts those rows
    out = pd.DataFrame({
        "name": names,
        "short_name": short,
        "device": _labels(k["deviceId"], lambda d: f"cuda:{d}"),
        "stream": k["streamId"],
        "start_ns": start,
        "end_ns": end,
        "duration_ns": end - start,
        "correlation": k["correlationId"],
        "grid": _labels(k["grid"], _unpack_dims),
        "block": _labels(k["block"], _unpack_dims),
        "registers_per_thread": k["registersPerThread"],
        "shared_mem_bytes": k["sharedMem"],
    })
    _attach_launch(out, k, runtime, ranges)
    return out


def _kernel_exprs(db: NsysDb) -> dict[str, str]:
    """Column name -> SQL expression over the kernel table, NULL where the column is absent.

    Grid and block are packed into one integer each (x << 32 | y << 16 | z; CUDA limits y and
    z to 65535) and shared memory is summed in SQL, so fewer values cross into Python.
    """
    have = set(db.columns(KERNEL_TABLE))
    plain = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid",
             "demangledName", "shortName", "mangledName", "registersPerThread")
    exprs = {c: (f'"{c}"' if c in have else "NULL") for c in plain}
    for dim in ("grid", "block"):
        axes = [f"{dim}{a}" for a in "XYZ"]
        exprs[dim] = (f"(({axes[0]} << 32) | ({axes[1]} << 16) | {axes[2]})"
                      if set(axes) <= have else "NULL")
    shared = [c for c in ("staticSharedMemory", "dynamicSharedMemory") if c in have]
    exprs["sharedMem"] = " + ".join(shared) if shared else "NULL"
    return exprs


def _unpack_dims(packed: int) -> str:
    return f"({packed >> 32}, {(packed >> 16) & 0xFFFF}, {packed & 0xFFFF})"


def _labels(values: pd.Series, fmt: Callable[[int], str]) -> pd.Series:
    """Format each distinct integer once and spread the labels (None where missing)."""
    codes, uniques = pd.factorize(pd.to_numeric(values, errors="coerce"), use_na_sentinel=True)
    labels = np.array([*(fmt(int(u)) for u in uniques), None], dtype=object)
    return pd.Series(labels[codes], index=values.index, dtype="object")


def _kernel_names(db: NsysDb, k: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Demangled name (fallback short, then mangled) and short name, through StringIds."""
    table = db.strings(pd.concat([k["demangledName"], k["shortName"], k["mangledName"]]))
    short = lookup_strings(k["shortName"], table)
    name = lookup_strings(k["demangledName"], table)
    for fallback in (short, lookup_strings(k["mangledName"], table)):
        name = name.where(name.notna() & (name != ""), fallback)
    return name.fillna("(unnamed kernel)"), short


def _attach_launch(out: pd.DataFrame, ops: pd.DataFrame, runtime: pd.DataFrame,
                   ranges: pd.DataFrame) -> None:
    """Add pid, launch_thread, range and phase of each GPU op from its launch call."""
    calls = _launch_calls(ops, runtime)
    out["pid"] = pid_of(ops["globalPid"].fillna(0)).where(ops["globalPid"].notna())
    out["launch_thread"] = tid_of(calls["global_tid"].fillna(0)).where(calls["global_tid"].notna())
    ids = innermost_range(calls, ranges)
    out["range"], out["phase"] = range_columns(ids, ranges)


def _launch_calls(ops: pd.DataFrame, runtime: pd.DataFrame) -> pd.DataFrame:
    """The launch API call of each op: same correlationId within the same process."""
    empty = pd.DataFrame({c: pd.array([pd.NA] * len(ops), dtype="Int64")
                          for c in ("global_tid", "api_start", "api_end")})
    if runtime.empty or ops["correlationId"].isna().all() or ops["globalPid"].isna().all():
        return empty
    processes = pd.Index(pd.unique(process_key(runtime["globalTid"])))
    api_keys = _call_keys(processes, process_key(runtime["globalTid"]), runtime["correlationId"])
    op_keys = _call_keys(processes, ops["globalPid"], ops["correlationId"])
    first = ~pd.Index(api_keys).duplicated(keep="first") & (api_keys >= 0)
    if not first.any():  # no call with a known thread and correlation id
        return empty
    pos = pd.Index(api_keys[first]).get_indexer(op_keys)
    rows = np.flatnonzero(first)[np.maximum(pos, 0)]
    found = (pos >= 0) & (op_keys >= 0)
    out = {}
    for name, col in (("global_tid", "globalTid"), ("api_start", "start"), ("api_end", "end")):
        values = runtime[col]  # whole numbers or missing already (NsysDb.int_frame)
        out[name] = pd.arrays.IntegerArray(values.to_numpy(dtype="int64", na_value=0)[rows],
                                           values.isna().to_numpy()[rows] | ~found)
    return pd.DataFrame(out)


def _call_keys(processes: pd.Index, pkey: pd.Series, corr: pd.Series) -> np.ndarray:
    """One int64 per (process, correlationId); -1 where either is unknown."""
    proc = processes.get_indexer(pd.to_numeric(pkey, errors="coerce").fillna(-1).astype("int64"))
    c = pd.to_numeric(corr, errors="coerce").fillna(-1).to_numpy(dtype="int64")
    keys = (proc.astype("int64") << 32) | (c & 0xFFFFFFFF)
    return np.where((proc >= 0) & (c >= 0), keys, -1)


# ---------------------------------------------------------------------------- OS runtime
def _osrt(db: NsysDb) -> pd.DataFrame:
    """The OS-runtime calls (``--trace=osrt``: futex, poll, nanosleep, read, ioctl, pthread_cond_wait...)
    as rows of kind ``wait`` of the ``host`` table (docs/idle.md): the host blocked or in I/O."""
    wanted = ("start", "end", "globalTid", "nameId")
    if not db.has(OSRT_TABLE) or set(db.present(OSRT_TABLE, wanted)) != set(wanted):
        return pd.DataFrame()
    rows = db.int_frame(OSRT_TABLE, {c: f'"{c}"' for c in wanted})
    rows = db.timed(OSRT_TABLE, rows, ("start", "end"))
    if not len(rows):
        return pd.DataFrame()
    names = lookup_strings(rows["nameId"], db.strings(rows["nameId"]), "(unnamed call)")
    start = rows["start"].to_numpy("int64")
    end = np.maximum(rows["end"].to_numpy("int64"), start)
    return pd.DataFrame({"kind": "wait", "name": names.to_numpy(object), "start_ns": start, "end_ns": end,
                         "duration_ns": end - start, "thread": tid_of(rows["globalTid"].fillna(0).astype("int64")).to_numpy()})


# ---------------------------------------------------------------------------- runtime / api
def _runtime(db: NsysDb) -> pd.DataFrame:
    wanted = ("start", "end", "eventClass", "globalTid", "correlationId", "nameId")
    cols = db.present(RUNTIME_TABLE, wanted)
    if not {"start", "end", "globalTid", "correlationId"} <= set(cols):
        return pd.DataFrame(columns=[*wanted, "name", "kind"])
    runtime = db.int_frame(RUNTIME_TABLE, {c: (f'"{c}"' if c in cols else "NULL") for c in wanted})
    return _name_runtime(db, runtime)


def _api_table(runtime: pd.DataFrame) -> pd.DataFrame:
    if runtime.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        "name": runtime["name"],
        "start_ns": runtime["start"],
        "end_ns": runtime["end"],
        "duration_ns": runtime["end"] - runtime["start"],
        "thread": tid_of(runtime["globalTid"]),
        "correlation": runtime["correlationId"],
        "kind": runtime["kind"],
        "pid": pid_of(runtime["globalTid"]),
    })


def _name_runtime(db: NsysDb, runtime: pd.DataFrame) -> pd.DataFrame:
    """Add ``name`` (``_vNNNN`` suffix stripped) and ``kind`` (runtime, driver, ...) columns."""
    runtime = runtime.copy()
    table = {i: API_SUFFIX.sub("", s) for i, s in db.strings(runtime["nameId"]).items()}
    runtime["name"] = lookup_strings(runtime["nameId"], table, "(unnamed call)")
    labels = db.enum("ENUM_NSYS_EVENT_CLASS", {}, field="label")
    classes = {int(c): EVENT_CLASS.get(int(c), labels.get(int(c))) for c in runtime["eventClass"].dropna().unique()}
    runtime["kind"] = lookup_strings(runtime["eventClass"], {c: v for c, v in classes.items() if v})
    return runtime


# ---------------------------------------------------------------------------- transfers
def _transfers(db: NsysDb, runtime: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    mem_kind = db.enum("ENUM_CUDA_MEM_KIND", MEM_KIND, field="label")
    parts = [_memcpy(db, mem_kind), _memset(db, mem_kind)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame()
    ops = pd.concat(parts, ignore_index=True)
    out = ops.drop(columns=["correlationId", "globalPid"])
    _attach_launch(out, ops, runtime, ranges)
    return out.drop(columns=["phase", "launch_thread"])


def _activity(db: NsysDb, table: str, extra: tuple[str, ...]) -> pd.DataFrame:
    wanted = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", *extra)
    cols = db.present(table, wanted)
    if not {"start", "end", "bytes"} <= set(cols):
        return pd.DataFrame()
    return db.int_frame(table, {c: f'"{c}"' for c in cols}).reindex(columns=list(wanted))


def _common(t: pd.DataFrame) -> pd.DataFrame:
    start, end = t["start"], t["end"]  # missing where unreadable: schema.untimed drops and counts those rows
    return pd.DataFrame({
        "bytes": t["bytes"], "start_ns": start, "end_ns": end, "duration_ns": end - start,
        "device": _labels(t["deviceId"], lambda d: f"cuda:{d}"),
        "stream": t["streamId"], "correlation": t["correlationId"],
        "correlationId": t["correlationId"], "globalPid": t["globalPid"],
    })


def _memcpy(db: NsysDb, mem_kind: dict[int, str]) -> pd.DataFrame:
    t = _activity(db, MEMCPY_TABLE, ("copyKind", "srcKind", "dstKind"))
    if t.empty:
        return t
    oper = db.enum("ENUM_CUDA_MEMCPY_OPER", MEMCPY_OPER)
    labels = db.enum("ENUM_CUDA_MEMCPY_OPER", {}, field="label")
    code = t["copyKind"]
    out = _common(t)
    short = code.map(lambda c: oper.get(int(c), "") if pd.notna(c) else "").str.replace(
        "CUDA_MEMCPY_KIND_", "", regex=False)
    out.insert(0, "kind", short.map(COPY_KIND).fillna("other"))
    out["copy_kind"] = code.map(lambda c: labels.get(int(c), oper.get(int(c))) if pd.notna(c) else None)
    out["src_kind"] = t["srcKind"].map(mem_kind)
    out["dst_kind"] = t["dstKind"].map(mem_kind)
    host = np.where(out["kind"] == "DtoH", out["dst_kind"], out["src_kind"])
    host = pd.Series(host, index=out.index).where(out["kind"].isin(["HtoD", "DtoH", "HtoH"]))
    out["pinned"] = host.map({"Pinned": True, "Pageable": False}).astype("boolean")
    return out


def _memset(db: NsysDb, mem_kind: dict[int, str]) -> pd.DataFrame:
    t = _activity(db, MEMSET_TABLE, ("memKind",))
    if t.empty:
        return t
    out = _common(t)
    out.insert(0, "kind", "memset")
    out["dst_kind"] = t["memKind"].map(mem_kind)
    return out


# ---------------------------------------------------------------------------- device
GPU_COLUMNS = ("id", "name", "smCount", "totalMemory", "l2CacheSize", "memoryBandwidth", "clockRate",
               "computeMajor", "computeMinor", "chipName")


def _gpu_rows(db: NsysDb) -> pd.DataFrame:
    cols = db.present(GPU_TABLE, GPU_COLUMNS)
    if "name" not in cols or "id" not in cols:
        return pd.DataFrame(columns=list(GPU_COLUMNS))
    rows = db.frame(f'SELECT {", ".join(cols)} FROM {GPU_TABLE}', cols)
    rows = db.whole(GPU_TABLE, rows, [c for c in cols if c not in ("name", "chipName")])
    return rows.loc[rows["id"].notna()].reindex(columns=list(GPU_COLUMNS))


def _device_from(gpus: pd.DataFrame, kernels: pd.DataFrame, warnings: list[str]) -> DeviceSpec | None:
    """The GPU that ran the most kernels, with datasheet roofs when its name is listed."""
    if gpus.empty:
        warnings.append(f"no device description: table {GPU_TABLE} is absent; roofs unknown "
                        "(pass a device to classify against)")
        return None
    row = _busiest_gpu(gpus, kernels, warnings)
    props = _gpu_properties(row)
    bandwidth = props.get("memory_bandwidth_bytes_per_s")
    theoretical = {"dram": Roof(float(bandwidth), "report", method="nsys TARGET_INFO_GPU.memoryBandwidth "
                                "(theoretical, as the driver reports it)", clock="max")} if bandwidth else {}
    spec = gpu_spec(str(row["name"]), properties=props, fallback_memory=theoretical)
    if "datasheet" not in spec.properties:
        warnings.append(f"no datasheet roofs for {row['name']!r}; compute roofs unknown; {ROOFS_FLAG}")
    return spec


def _busiest_gpu(gpus: pd.DataFrame, kernels: pd.DataFrame, warnings: list[str]) -> pd.Series:
    gpus = gpus.drop_duplicates("id")
    if len(kernels):
        used = kernels["device"].value_counts()
        ids = [int(d.split(":")[1]) for d in used.index if d.split(":")[1].isdigit()]
        busy = gpus.loc[gpus["id"].isin(ids), "name"].unique()
        if len(busy) > 1:
            warnings.append(f"kernels ran on different GPU models ({', '.join(map(str, busy))}); "
                            "roofs are those of the busiest one")
        for device_id in ids:
            match = gpus.loc[gpus["id"] == device_id]
            if len(match):
                return match.iloc[0]
    return gpus.sort_values("id").iloc[0]


def _gpu_properties(row: pd.Series) -> dict[str, Any]:
    def num(key: str) -> Any:
        value = row.get(key)
        return None if value is None or pd.isna(value) else value.item() if hasattr(value, "item") else value

    cc = (f"{num('computeMajor')}.{num('computeMinor')}" if num("computeMajor") is not None else None)
    return {
        "device_id": num("id"), "chip": num("chipName"), "sm_count": num("smCount"),
        "memory_bytes": num("totalMemory"), "l2_cache_bytes": num("l2CacheSize"),
        "memory_bandwidth_bytes_per_s": num("memoryBandwidth"), "max_clock_hz": num("clockRate"),
        "compute_capability": cc,
    }
