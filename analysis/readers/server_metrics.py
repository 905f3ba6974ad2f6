"""A serving run's own metrics, saved: the server's gauges scraped over time, as a report whose ``gauges``
table holds them (the table ``perfscope loadtest --metrics`` fills), so that its findings can say why
requests waited.

What is read (:func:`kind_of` tells them apart by content, never by name):

- ``series``: a scraped time series of ``/metrics`` in a wide CSV: a time column (s) first, then one column
  per server metric under the server's name, with or without its ``vllm:`` / ``sglang:`` prefix
  (:func:`perfscope.gauges.series_column`; vLLMBatchingMemoryGap's benchmark writes vLLM's names without
  it). Other columns are left aside.
- ``prometheus``: the Prometheus text of one ``/metrics`` answer (vLLM, SGLang, ``perfscope serve``): its
  gauges at one moment, and the labels of ``vllm:cache_config_info`` (block size, GPU blocks, memory
  utilisation) into ``params.server_info``.
- ``results``: a benchmark client's result JSON (vLLM's ``benchmark_serving.py`` / ``vllm bench serve
  --save-result``: ``completed``, ``median_ttft_ms``, ``p99_ttft_ms``, ...): its aggregate latencies into
  ``params.client_results``. Alone it is not a report (no server-side evidence); beside the others it is read.

A file of the first two kinds imports alone; a folder that holds one or more of them imports as one
report (the first time series by name; the others are named in a warning, not joined: each has its own
clock).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.errors import InputFormatError
from perfscope.gauges import (
    canonical,
    info_labels,
    looks_like_series,
    parse_prometheus,
    series_columns,
    series_rows,
)
from perfscope.inputs import head_bytes, load_json, read_text, regular_file
from perfscope.limits import take
from perfscope.report import Report, source_info

from .finish import Imported, finish
from .nvidia_smi import counters_frame, looks_like_nvidia_smi

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

HINT = ("give a scraped /metrics time series (CSV: a time column, then the server's metric names), a saved "
        "/metrics text, or a folder holding them")
FOLDER_FILES = 64
"""The most files of a folder sniffed for server metrics (a folder of thousands is not a run's metrics)."""
SNIFF_BYTES = 1 << 14
RESULT_KEYS = 200
"""The most keys of a client result JSON kept (numbers and short strings at its top level)."""


def is_results(doc: Any) -> bool:
    """Whether a JSON document is a benchmark client's results (vLLM's ``benchmark_serving`` layout)."""
    return isinstance(doc, dict) and "completed" in doc and any(k in doc for k in ("median_ttft_ms", "mean_ttft_ms"))


def kind_of(head: bytes) -> str | None:
    """``series``, ``prometheus``, ``results``, ``nvidia-smi`` (:mod:`.nvidia_smi`'s logs, read into counters) or
    None, from a file's first bytes."""
    text = head.decode("utf-8-sig", "replace")
    first = text.lstrip().split("\n", 1)[0]
    if first.startswith("{"):
        return "results" if '"completed"' in text and '_ttft_ms"' in text else None
    if looks_like_series(first):
        return "series"
    if looks_like_nvidia_smi(first):
        return "nvidia-smi"
    if any(s.name.startswith(("vllm:", "sglang:")) for s in parse_prometheus(text[: text.rfind("\n") + 1])):
        return "prometheus"
    return None


def folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(kind, path) of a folder's files that hold server metrics (regular files only, by name, at most
    :data:`FOLDER_FILES` looked at); empty when it holds no time series and no ``/metrics`` text."""
    try:
        entries = sorted(folder.iterdir())[:FOLDER_FILES]
    except OSError:
        return []
    found = []
    for f in entries:
        if f.is_symlink() or not f.is_file():
            continue
        try:
            kind = kind_of(head_bytes(f, SNIFF_BYTES))
        except Exception:  # noqa: BLE001 - a damaged sibling is not this folder's metrics
            kind = None
        if kind:
            found.append((kind, f))
    return found if any(k in ("series", "prometheus") for k, _ in found) else []


def _series(path: Path) -> pd.DataFrame:
    text = read_text(path)
    take(path, text.count("\n") * max(1, len(series_columns(text.split("\n", 1)[0]))))
    try:  # counted before the rows are made: the lines times the gauges each holds
        rows = series_rows(text)
    except ValueError as exc:
        raise InputFormatError(path, f"is not a readable metrics time series ({exc})", hint=HINT) from None
    return pd.DataFrame(rows, columns=["t_s", "metric", "value", "server_name", "labels"])


def _results(path: Path) -> dict[str, Any]:
    doc = load_json(path, HINT)
    if not is_results(doc):
        return {}
    kept: dict[str, Any] = {}
    for k, v in list(doc.items())[:RESULT_KEYS]:
        if isinstance(v, bool) or not isinstance(k, str):
            continue
        if isinstance(v, (int, float)) and math.isfinite(float(v)):
            kept[k[:80]] = float(v) if isinstance(v, float) else int(v)
        elif isinstance(v, str) and len(v) <= 200:
            kept[k[:80]] = v
    return kept


def read(path: str | Path, *, device: DeviceSpec | None = None) -> Report:
    """A report of a serving run's gauges (``gauges`` table), from a file or a folder (module docstring).

    Raises:
        InputFormatError: nothing readable as server metrics, or a time series with a value that is not a number.
    """
    p = Path(path)
    if p.is_dir():
        files = folder_files(p)
    else:
        p = regular_file(p)
        files = [(kind_of(head_bytes(p, SNIFF_BYTES)) or "", p)]
    series = [f for k, f in files if k == "series"]
    dumps = [f for k, f in files if k == "prometheus"]
    results = [f for k, f in files if k == "results"]
    smi = [f for k, f in files if k == "nvidia-smi"]
    if not series and not dumps:
        raise InputFormatError(p, "holds no server metrics", hint=HINT)
    warnings: list[str] = []
    info: dict[str, str] = {}
    gauges = _series(series[0]) if series else pd.DataFrame()
    for f in dumps:
        samples = parse_prometheus(read_text(f))
        take(f, len(samples))
        info = info or {k[:80]: v[:200] for k, v in info_labels(samples, "vllm:cache_config_info").items()}
        if not series and not len(gauges):
            gauges = pd.DataFrame([{**r, "t_s": 0.0} for r in canonical(samples)],
                                  columns=["t_s", "metric", "value", "server_name", "labels"])
    if len(series) > 1:
        warnings.append(f"{len(series)} metrics time series here; read {series[0].name} only (each has its own "
                        f"clock): {', '.join(f.name for f in series[1:])} not read")
    if not len(gauges):
        warnings.append("no gauge perfscope knows is in these metrics")
    counters = pd.DataFrame()
    clock = _clock(series[0]) if smi and series else ""
    if clock.startswith("time") and _clock(smi[0]) == clock:
        counters = counters_frame(smi[0], relative=False)  # one harness clock: the GPU's samples beside the gauges
    elif smi:
        warnings.append(f"{smi[0].name} (nvidia-smi samples) not joined: its clock is not the time series' "
                        "(import it alone)")
    params: dict[str, Any] = {"metrics_files": [f.name for _, f in files]}
    if info:
        params["server_info"] = info
    if results and (client := _results(results[0])):
        params["client_results"] = client
    servers = sorted({str(n).split(":", 1)[0] for n in gauges.get("server_name", pd.Series(dtype=str)).dropna()})
    manifest = {
        "name": p.stem if p.is_file() else p.name,
        "source": source_info("server-metrics", p, " + ".join(f"{s} /metrics" for s in servers) or "/metrics"),
        "params": params,
        "warnings": warnings,
    }
    return finish(Imported({"gauges": gauges, "counters": counters}, manifest, device, origin=str(p)))


def _clock(path: Path) -> str:
    """The first header cell of a CSV (its time column's name), lower case."""
    return head_bytes(path, SNIFF_BYTES).decode("utf-8-sig", "replace").split("\n", 1)[0].split(",", 1)[0].strip().lower()
