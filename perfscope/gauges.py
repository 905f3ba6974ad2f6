"""Server gauges: the Prometheus text format that vLLM and SGLang publish on ``/metrics``, read
into canonical gauges (the ``gauges`` table), and written back under vLLM's names (``perfscope
serve``).

Canonical names (units in the name; percentages 0-100) and the server names that feed them, old and
new (vLLM renamed ``gpu_cache_usage_perc`` to ``kv_cache_usage_perc`` in V1; a ``_total`` suffix is
the Prometheus client's for counters):
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

GAUGES: dict[str, tuple[tuple[str, float], ...]] = {
    "kv_cache_usage_pct": (("vllm:kv_cache_usage_perc", 100.0), ("vllm:gpu_cache_usage_perc", 100.0),
                           ("sglang:token_usage", 100.0)),
    "requests_running": (("vllm:num_requests_running", 1.0), ("sglang:num_running_reqs", 1.0)),
    "requests_waiting": (("vllm:num_requests_waiting", 1.0), ("sglang:num_queue_reqs", 1.0)),
    "requests_swapped": (("vllm:num_requests_swapped", 1.0),),
    "preemptions_total": (("vllm:num_preemptions_total", 1.0), ("vllm:num_preemptions", 1.0)),
    "prefix_cache_hit_pct": (("vllm:gpu_prefix_cache_hit_rate", 100.0), ("sglang:cache_hit_rate", 100.0)),
    "prefix_cache_queries_total": (("vllm:prefix_cache_queries_total", 1.0), ("vllm:prefix_cache_queries", 1.0)),
    "prefix_cache_hits_total": (("vllm:prefix_cache_hits_total", 1.0), ("vllm:prefix_cache_hits", 1.0)),
    "spec_decode_acceptance_pct": (("vllm:spec_decode_draft_acceptance_rate", 100.0),
                                   ("sglang:spec_accept_rate", 100.0)),
    "spec_decode_draft_tokens_total": (("vllm:spec_decode_num_draft_tokens_total", 1.0),),
    "spec_decode_accepted_tokens_total": (("vllm:spec_decode_num_accepted_tokens_total", 1.0),),
    "prompt_tokens_total": (("vllm:prompt_tokens_total", 1.0), ("sglang:prompt_tokens_total", 1.0)),
    "generation_tokens_total": (("vllm:generation_tokens_total", 1.0), ("sglang:generation_tokens_total", 1.0)),
    "requests_finished_total": (("vllm:request_success_total", 1.0),),
    "gen_throughput_tokens_per_s": (("sglang:gen_throughput", 1.0),
                                    ("vllm:avg_generation_throughput_toks_per_s", 1.0)),
}
"""Canonical gauge -> (server metric name, scale to the canonical unit), first found wins."""

__doc__ = (__doc__ or "") + "\n" + "\n".join(
    f"- ``{k}``: " + ", ".join(f"``{n}``" for n, _ in v) for k, v in GAUGES.items())

_BY_SERVER = {name: (canon, scale) for canon, names in GAUGES.items() for name, scale in names}

VLLM_NAMES = {canon: names[0][0] for canon, names in GAUGES.items() if names[0][0].startswith("vllm:")}
"""The vLLM name ``perfscope serve`` publishes each gauge under (the newest)."""

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (comments skipped; a line that does not
    parse is skipped too: a scrape must not fail on one odd line)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(3) or "")}
        out.append(Sample(m.group(1), labels, value))
    return out


def canonical(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    """Rows (metric, value, server_name, labels) of the samples perfscope knows, summed over
    label sets of one name (several engines or models on one server); a negative value (vLLM's
    -1 for 'no data') is missing."""
    sums: dict[tuple[str, str], list[Any]] = {}
    for s in samples:
        got = _BY_SERVER.get(s.name)
        if got is None:
            continue
        canon, scale = got
        value = s.value * scale if s.value >= 0 and math.isfinite(s.value) else math.nan
        key = (canon, s.name)
        if key not in sums:
            sums[key] = [value, s.labels]
        else:
            sums[key][0] = sums[key][0] + value
    rows = []
    seen = set()
    for canon, names in GAUGES.items():
        for name, _ in names:
            if (canon, name) in sums and canon not in seen:
                seen.add(canon)
                value, labels = sums[(canon, name)]
                rows.append({"metric": canon, "value": value, "server_name": name,
                             "labels": json.dumps(dict(labels), sort_keys=True)})
    return rows


def info_labels(samples: Iterable[Sample], name: str) -> dict[str, str]:
    """The labels of an ``*_info`` sample (vLLM's ``vllm:cache_config_info``: block_size,
    num_gpu_blocks, gpu_memory_utilization, ...), or {}."""
    for s in samples:
        if s.name == name:
            return dict(s.labels)
    return {}


def render_vllm(values: Mapping[str, float], *, model_name: str = "perfscope",
                info: Mapping[str, Any] | None = None) -> str:
    """Prometheus text of canonical ``values`` under vLLM's names (counters typed as counters),
    with ``vllm:cache_config_info`` from ``info``."""
    lines = []
    for canon, value in values.items():
        name = VLLM_NAMES.get(canon)
        if name is None or value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        scale = dict(GAUGES[canon])[name]
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {name} {canon} (perfscope serve)", f"# TYPE {name} {kind}",
                  f'{name}{{model_name="{_escape(model_name)}"}} {float(value) / scale!r}']
    if info:
        labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(info.items()))
        lines += ["# HELP vllm:cache_config_info Information of the cache config (perfscope serve)",
                  "# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{labels}}} 1.0"]
    return "\n".join(lines) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_column(name: str) -> tuple[str, str, float] | None:
    """(canonical gauge, server name, scale) of a scraped time series' column named after a server metric, with
    or without its server's prefix (vLLMBatchingMemoryGap's benchmark writes vLLM's names without ``vllm:``); None
    for any other column."""
    for server_name in (name, f"vllm:{name}", f"sglang:{name}"):
        if server_name in _BY_SERVER:
            canon, scale = _BY_SERVER[server_name]
            return canon, server_name, scale
    return None


def series_columns(header: str) -> list[str]:
    """The columns of a CSV header line after its first that name a server metric (:func:`series_column`)."""
    names = [h.strip().strip('"') for h in header.split(",")]
    return [n for n in names[1:] if series_column(n)]


def looks_like_series(header: str) -> bool:
    """Whether a CSV header line is a scraped time series': a time column first, then a server metric's."""
    return header.strip().strip('"').lower().startswith("time") and bool(series_columns(header))


def series_rows(csv_text: str) -> list[dict[str, Any]]:
    """The ``gauges`` rows of a scraped time series CSV: a time column (s) first, then one column per
    server metric (:func:`series_column`; the first of :data:`GAUGES`' names wins where two feed one gauge,
    other columns are left aside). A negative value (vLLM's -1 for 'no data') or a non-finite one is missing.

    Raises:
        ValueError: the first column is not the time, or a time or value that is not a number (its line named).
    """
    import csv
    import io

    reader = csv.reader(io.StringIO(csv_text))
    rows: list[dict[str, Any]] = []
    try:
        header = [h.strip() for h in next(reader, [])]
        if not header or not header[0].lower().startswith("time"):
            raise ValueError("the first column is not the time")
        found = {i: got for i, h in enumerate(header) if i and (got := series_column(h))}
        rank = {name: k for names in GAUGES.values() for k, (name, _) in enumerate(names)}
        best: dict[str, int] = {}
        for i, (canon, name, _) in found.items():
            if canon not in best or rank[name] < rank[found[best[canon]][1]]:
                best[canon] = i
        cols = sorted((i, *found[i]) for i in best.values())
        for rec in reader:
            _series_record(rec, reader.line_num, cols, rows)
    except csv.Error as exc:
        raise ValueError(f"line {reader.line_num}: {exc}") from None
    return rows


def _series_record(rec: list[str], line: int, cols: list[tuple[int, str, str, float]], rows: list[dict[str, Any]]) -> None:
    """The rows of one line of a scraped series (:func:`series_rows`), appended to ``rows``."""
    if not rec or not "".join(rec).strip():
        return
    try:
        t = float(rec[0])
        values = [float(rec[i]) if i < len(rec) and rec[i].strip() else math.nan for i, *_ in cols]
    except ValueError:
        raise ValueError(f"line {line}: a time or value that is not a number") from None
    if not math.isfinite(t):
        raise ValueError(f"line {line}: the time is not a finite number")
    for (_, canon, name, scale), v in zip(cols, values):
        v = v * scale if v >= 0 else math.nan
        rows.append({"t_s": t, "metric": canon, "value": v if math.isfinite(v) else math.nan,
                     "server_name": name, "labels": None})
