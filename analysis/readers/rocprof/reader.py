"""AMD's own profilers to a Report: one reader family, detected from content (:func:`sniff`).

Formats (``detect.READERS`` names):

- ``rocprofv3-csv``: a rocprofv3 CSV run (any one file or its folder; :mod:`.v3csv`);
- ``rocprofv3-json``: rocprofv3 ``*_results.json`` (:mod:`.jsons`);
- ``rocpd``: rocprofv3's rocpd SQLite database, schema v3+ (:mod:`.rocpd`);
- ``rocprof-csv`` / ``rocprof-db`` / ``rocprof-json``: rocprof v1/v2 ``results.csv``, ``results.db``,
  ``results.json``; ``rocprof-stats``: ``results.stats.csv``, which imports its run's trace beside it;
- ``rocprof-compute``: a rocprof-compute (Omniperf) workload folder (:mod:`.compute`).

Kernels, HIP API calls (``api``), copies (``transfers``) and roctx ranges (``ranges``) become the
Report's tables, finished by :func:`..finish.finish` like every other reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.device import DeviceSpec
from perfscope.errors import InputFormatError
from perfscope.inputs import read_text
from perfscope.report import Report, source_info

from ...idle import unrecorded_warning
from ..finish import Imported, finish
from .compute import PMC, read_compute
from .device import agent_spec, rocminfo_agents
from .families import with_family_intensity
from .flat import flat_kernels, has_kernel_columns, no_counter_note
from .jsons import read_v1_json, read_v3_json
from .rocpd import read_rocpd as parse_rocpd
from .rocpd import read_v1_db, table_names
from .tables import MissingColumns, read_csv
from .v3csv import RUN_FILE, read_v3_csv, stats_check

if TYPE_CHECKING:
    from collections.abc import Callable

TOOLS = {"rocprofv3-csv": "rocprofv3", "rocprofv3-json": "rocprofv3", "rocpd": "rocprofv3",
         "rocprof-csv": "rocprof", "rocprof-db": "rocprof", "rocprof-json": "rocprof", "rocprof-stats": "rocprof",
         "rocprof-compute": "rocprof-compute"}
COMPUTE_FILES = {PMC, "sysinfo.csv", "roofline.csv", "pmc_dispatch_info.csv", "timestamps.csv", "pmc_kernel_top.csv"}


# ---------------------------------------------------------------------------- detection
def sniff(path: Path, head: bytes) -> str | None:
    """The rocprof format of ``path`` (a key of :data:`TOOLS`), or None when it is not one."""
    if path.is_dir():
        names = {p.name for p in path.iterdir()}
        if PMC in names:
            return "rocprof-compute"
        if any(RUN_FILE.match(n) for n in names):
            return "rocprofv3-csv"
        return None
    name = path.name
    if name in COMPUTE_FILES and (path.parent / PMC).is_file():
        return "rocprof-compute"
    if head.startswith(b"SQLite format 3\x00"):
        tables = table_names(path)
        if any(t.startswith("rocpd_") for t in tables) or "kernels" in tables and "rocpd_metadata" in tables:
            return "rocpd"
        if "KERN" in tables:
            return "rocprof-db"
        return None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] in (b"{", b"["):
        if b'"rocprofiler-sdk-tool"' in head:
            return "rocprofv3-json"
        if b'"BeginNs"' in head or b'"DispatchNs"' in head:
            return "rocprof-json"
        return None
    first = text.split(b"\n", 1)[0].replace(b'"', b"")
    cols = set(first.strip().split(b","))
    if RUN_FILE.match(name) and ({b"Kernel_Name", b"Function", b"Counter_Name", b"Name"} & cols):
        return "rocprofv3-csv"
    if {b"Counter_Name", b"Counter_Value", b"Dispatch_Id"} <= cols or {b"Kind", b"Agent_Id", b"Kernel_Name"} <= cols:
        return "rocprofv3-csv"
    if {b"Name", b"Calls", b"TotalDurationNs"} <= cols:
        return "rocprof-stats"
    if {b"KernelName", b"BeginNs", b"EndNs"} <= cols or {b"Kernel_Name", b"Start_Timestamp", b"End_Timestamp"} <= cols:
        return "rocprof-csv"
    return None


# ---------------------------------------------------------------------------- readers
Parsed = tuple[dict[str, pd.DataFrame], DeviceSpec | None, dict[str, Any]]


def _finish(fmt: str, path: Path, parse: Callable[[Path, list[str]], Parsed], device: DeviceSpec | None) -> Report:
    path = Path(path)
    warnings: list[str] = []
    try:
        tables, spec, params = parse(path, warnings)
    except MissingColumns as exc:
        raise InputFormatError(path, f"lacks the column(s) {exc}", hint="give the file as the tool wrote it") from None
    except (KeyError, ValueError, TypeError, OverflowError, AttributeError, IndexError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise InputFormatError(path, f"holds a value no {TOOLS[fmt]} output has ({type(exc).__name__}: {first})",
                               hint="re-export the capture; a file cut short imports with what it has") from None
    kernels = tables.get("kernels", pd.DataFrame())
    if len(kernels):
        kernels = with_family_intensity(kernels, warnings)
        tables = {**tables, "kernels": kernels}
        gone = unrecorded_warning(kernels)  # dispatch ids the trace lacks: kernels filtered, sampled or lost
        if gone:
            warnings.append(gone)
    dropped = any("dropped" in w for w in warnings)
    manifest = {
        "name": path.name.split(".")[0] if path.is_file() else path.name,
        "source": source_info(fmt, path, TOOLS[fmt], None),
        "params": {k: v for k, v in params.items() if v is not None},
        "warnings": warnings,
        "partial": dropped,
        "unavailable_metrics": [] if len(kernels) and "flops" in kernels and kernels["flops"].notna().any()
        else ["flops", "dram_bytes"],
    }
    tables = {k: v for k, v in tables.items() if v is not None and len(v.columns)}
    return finish(Imported(tables, manifest, device or spec, origin=str(path)))


def read_rocprofv3_csv(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    return _finish("rocprofv3-csv", Path(path), read_v3_csv, device)


def read_rocprofv3_json(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    return _finish("rocprofv3-json", Path(path), read_v3_json, device)


def read_rocpd(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    return _finish("rocpd", Path(path), _rocpd, device)


def _rocpd(path: Path, warnings: list[str]) -> Parsed:
    return parse_rocpd(path, warnings)


def read_rocprof_compute(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    return _finish("rocprof-compute", Path(path), read_compute, device)


def read_rocprof_csv(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    return _finish("rocprof-csv", Path(path), _v1_csv, device)


def read_rocprof_db(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    return _finish("rocprof-db", Path(path), lambda p, w: _with_sysinfo(p, read_v1_db(p, w), w), device)


def read_rocprof_json(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    def parse(p: Path, w: list[str]) -> Parsed:
        tables, _, params = read_v1_json(p, w)
        return _with_sysinfo(p, (tables, None, params), w)
    return _finish("rocprof-json", Path(path), parse, device)


def read_rocprof_stats(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    return _finish("rocprof-stats", Path(path), _stats, device)


def _v1_csv(path: Path, warnings: list[str]) -> Parsed:
    df = read_csv(path, "re-run rocprof; a trace cut short imports its complete rows")
    if not has_kernel_columns(df):
        raise InputFormatError(path, "no kernel name and timestamp columns", hint="give rocprof's results.csv")
    kernels = flat_kernels(df, warnings, source="rocprof")
    no_counter_note(kernels, warnings)
    return _with_sysinfo(path, ({"kernels": kernels}, None, {}), warnings)


def _stats(path: Path, warnings: list[str]) -> Parsed:
    """A stats file has no timeline: import the run's trace beside it and check it against the stats."""
    stem = path.name.removesuffix(".stats.csv")
    for suffix, parse in ((".csv", _v1_csv), (".db", lambda p, w: _with_sysinfo(p, read_v1_db(p, w), w))):
        sibling = path.with_name(stem + suffix)
        if sibling.is_file() and sibling != path:
            tables, spec, params = parse(sibling, warnings)
            stats = read_csv(path, "give rocprof's results.stats.csv")
            params = {**params, "kernel_stats_check": stats_check(stats, tables["kernels"], warnings),
                      "trace": sibling.name}
            return tables, spec, params
    raise InputFormatError(path, "per-kernel statistics only: no dispatch timeline to import",
                           hint=f"import the run's trace ({stem}.csv, {stem}.db or {stem}.json)")


def _with_sysinfo(path: Path, parsed: Parsed, warnings: list[str]) -> Parsed:
    """rocprof v1 writes rocminfo beside its results (``results.sysinfo.txt``): the device."""
    tables, spec, params = parsed
    info = path.with_name(path.name.split(".")[0] + ".sysinfo.txt")
    if spec is None and info.is_file():
        agents = rocminfo_agents(read_text(info))
        names = sorted({str(a.get("product_name") or a.get("name")) for a in agents})
        if len(names) > 1:
            warnings.append(f"GPUs of different models ({', '.join(names)}); roofs are the first's")
        spec = agent_spec(agents[0] if agents else None, warnings)
    elif spec is None:
        warnings.append(f"no {info.name} (rocminfo) beside the trace: device and roofs unknown; pass --roofs NAME")
    return tables, spec, params
