"""``nvidia-smi --query-gpu=... --format=csv[,nounits] -l N`` logs as a report whose ``counters`` table holds them
(the table NVML sampling fills): utilisation, clocks, power, temperature and memory in use over time.

The header names the queried fields, with their units in brackets unless ``nounits`` (``utilization.gpu [%]``);
values carry their units (``19 %``, ``59772 MiB``), and ``[N/A]`` / ``[Not Supported]`` are missing. The time
is a ``timestamp`` field (``2024/06/01 10:00:00.123``, nvidia-smi's own) or a first column of seconds that a
harness put in front (``time [s]``: vLLMBatchingMemoryGap's, on the same clock as its ``/metrics`` series); times
are kept relative to the first sample. The GPU is its ``index`` (``cuda:N``), else its ``uuid`` / ``pci.bus_id``
numbered in order of appearance, else one GPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.errors import InputFormatError
from perfscope.inputs import read_csv, regular_file
from perfscope.report import Report, source_info

from .finish import Imported, finish

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

HINT = "give the CSV of nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,... --format=csv -l 1"
FIELDS: dict[str, tuple[str, float]] = {
    "utilization.gpu": ("gpu_util_pct", 1.0), "utilization.memory": ("mem_util_pct", 1.0),
    "clocks.sm": ("sm_clock_mhz", 1.0), "clocks.current.sm": ("sm_clock_mhz", 1.0),
    "clocks.mem": ("mem_clock_mhz", 1.0), "clocks.current.memory": ("mem_clock_mhz", 1.0),
    "power.draw": ("power_w", 1.0), "power.draw.average": ("power_w", 1.0), "power.draw.instant": ("power_w", 1.0),
    "temperature.gpu": ("temp_c", 1.0), "memory.used": ("mem_used_bytes", float(1 << 20)),
}
"""nvidia-smi query field -> (counters column, scale to its unit: memory is in MiB)."""
DEVICE_FIELDS = ("index", "uuid", "pci.bus_id", "gpu_bus_id")


def field(header: str) -> str:
    """A header cell's query field: ``utilization.gpu [%]`` -> ``utilization.gpu``."""
    return header.strip().strip('"').split(" [", 1)[0].strip().lower()


def looks_like_nvidia_smi(first_line: str) -> bool:
    """Whether a CSV header is an nvidia-smi query's: a time (``timestamp`` or a first ``time`` column) and a
    field :data:`FIELDS` knows."""
    names = [field(h) for h in first_line.split(",")]
    timed = "timestamp" in names or (bool(names) and names[0].startswith("time"))
    return timed and any(n in FIELDS for n in names)


def _number(cell: Any) -> float:
    """``19 %`` -> 19.0; ``[N/A]``, ``[Not Supported]``, empty or not a number -> NaN."""
    text = str(cell).strip().split(" ", 1)[0] if isinstance(cell, str) else cell
    try:
        v = float(text)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


MAX_SPAN_S = 1e9
"""A log longer than this (about 32 years) is a damaged time, not a run."""


def counters_frame(path: Path, *, relative: bool = True) -> pd.DataFrame:
    """The ``counters`` rows of an nvidia-smi query log (module docstring); ``relative=False`` keeps a harness's
    seconds column as it is (to join another file on the same harness clock; a ``timestamp`` log is always
    relative to its first sample).

    Raises:
        InputFormatError: no time or no known field, or a time that does not parse.
    """
    raw = read_csv(path, HINT, dtype=str, skipinitialspace=True, keep_default_na=False)
    names = [field(c) for c in raw.columns]
    if not looks_like_nvidia_smi(",".join(names)):
        raise InputFormatError(path, "is not an nvidia-smi query log (no time, or no field perfscope reads)", hint=HINT)
    cols = dict(zip(names, raw.columns))
    if "timestamp" in cols:
        when = pd.to_datetime(raw[cols["timestamp"]].str.strip(), format="%Y/%m/%d %H:%M:%S.%f", errors="coerce")
        bad = when.isna()
        t = (when - when.min()).dt.total_seconds() if not bad.all() else pd.Series(math.nan, index=raw.index)
    else:
        t = raw[raw.columns[0]].map(_number)
        bad = t.isna()
    if len(raw) and bad.any():
        line = int(bad.to_numpy().argmax()) + 2
        raise InputFormatError(path, f"line {line}: a time that does not parse", hint=HINT)
    if len(t) and (t.max() - t.min() > MAX_SPAN_S or t.abs().max() > MAX_SPAN_S):
        raise InputFormatError(path, f"times span more than {MAX_SPAN_S:.0e} s: a damaged time column", hint=HINT)
    if relative or "timestamp" in cols:
        t = t - (t.min() if len(t) else 0.0)
    out = pd.DataFrame({"t_ns": (t * 1e9).round().astype("int64") if len(t) else pd.Series(dtype="int64")})
    device = next((d for d in DEVICE_FIELDS if d in cols), None)
    if device is None:
        out["device"] = "cuda:0"
    elif device == "index":
        out["device"] = ["cuda:" + str(int(v)) if math.isfinite(v := _number(s)) else "cuda:?" for s in raw[cols[device]]]
    else:
        ids = raw[cols[device]].str.strip()
        order = {k: i for i, k in enumerate(dict.fromkeys(ids))}
        out["device"] = [f"cuda:{order[s]}" for s in ids]
    for name, (column, scale) in FIELDS.items():
        if name in cols and column not in out:
            out[column] = raw[cols[name]].map(_number) * scale
    return out


def read(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    """A report of an nvidia-smi query log (``counters`` only: how busy, hot and full each GPU was)."""
    p = regular_file(path)
    counters = counters_frame(p)
    manifest = {"name": p.stem, "source": source_info("nvidia-smi", p, "nvidia-smi"),
                "params": {"sampled_devices": sorted(set(counters["device"]))},
                "warnings": [] if len(counters) else ["the nvidia-smi log holds no samples"]}
    return finish(Imported({"counters": counters}, manifest, device, origin=str(p)))
