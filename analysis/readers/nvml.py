"""NVML samples (``nvml.parquet``, written by ``perfscope profile --collector nvml`` or ``--nvml``)
as a Report whose ``counters`` table holds them.

The file is a ``counters`` table (``t_ns``, ``device``, utilisation, clocks, power,
temperature, memory); it has no kernels, so the report answers "how busy and how hot was the
GPU", not "what bounds each kernel". Sampling parameters written by the sampler (rate, clock
anchors) are kept in the manifest's ``params`` when the Parquet file carries them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow.parquet as pq

from perfscope.errors import InputFormatError
from perfscope.inputs import regular_file
from perfscope.limits import take
from perfscope.report import Report, source_info
from perfscope.schema import NVML_PARAMS_KEY, column_names

from .finish import Imported, finish

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec


def is_nvml_parquet(path: Path) -> bool:
    """True when ``path`` is a Parquet file whose columns are a counters table (``t_ns``, ``device``, metrics)."""
    try:
        names = set(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - pyarrow raises several types for non-Parquet or damaged files
        return False
    metrics = set(column_names("counters")) - {"t_ns", "device"}
    return {"t_ns", "device"} <= names and bool(names & metrics)


def read(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    """Read NVML samples into a Report (counters only).

    Raises:
        InputFormatError: the file is not a readable counters table.
    """
    p = regular_file(path)
    try:
        samples = pd.read_parquet(p)
        meta = pq.read_schema(p).metadata or {}
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for damaged files
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputFormatError(p, f"damaged Parquet file ({first})", hint="re-run the capture") from None
    take(p, len(samples))
    try:
        params = json.loads(meta[NVML_PARAMS_KEY]) if NVML_PARAMS_KEY in meta else {}
    except ValueError:
        params = {}
    if not isinstance(params, dict):
        params = {}
    devices = sorted(str(d) for d in samples["device"].dropna().unique()) if "device" in samples else []
    manifest = {
        "name": p.stem,
        "source": source_info("nvml", p, "nvml"),
        "params": {**params, "sampled_devices": devices},
        "warnings": [] if len(samples) else ["the NVML file holds no samples"],
    }
    return finish(Imported({"counters": samples}, manifest, device, origin=str(p)))
