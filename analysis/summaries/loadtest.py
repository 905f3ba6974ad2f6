"""Serving metrics of a load test, as vLLM's ``benchmark_serving`` defines them.

Per request (``requests`` table of a ``perfscope loadtest`` report; times in seconds from the
run's start): TTFT = first token - arrival (queueing included); E2E = last token - arrival;
TPOT = (E2E - TTFT) / (output tokens - 1), for requests with more than one output token; ITL =
every gap between consecutive tokens of a request, all requests' gaps pooled.

Over the run: ``duration_s`` = the last request's end (the run starts at time 0, before the first
arrival); ``request_throughput_per_s`` = completed requests / duration; ``output_tokens_per_s`` =
output tokens / duration; ``goodput_per_s`` = requests meeting every SLO / duration, where a
request with one output token has TPOT 0 for the SLO check (as vLLM does).

Requests sent to an HTTP endpoint (``perfscope loadtest --endpoint``) also carry ``status``
(``ok`` or the failure's kind: ``http_error``, ``timeout``, ``broken_stream``, ``empty_output``,
``connection_error``), ``scheduled_s`` (the intended send time) and ``arrival_s`` (the actual
send). Every request is counted (``requests_sent``, ``failures`` by kind); only ``ok`` ones enter
the latencies, throughputs and goodput (``requests`` is then the completed count). Their
**scheduled latencies** ``scheduled_ttft_s`` / ``scheduled_e2e_s`` are measured from the intended
send time, so a queue in the client does not hide the server's delay; ``dispatch_delay_s`` =
actual - intended send.

Statistics are ``p50``, ``p90``, ``p99`` (``numpy.percentile``, linear interpolation) and ``mean``;
an empty set gives NaN (null in JSON), never 0. ``prompt_tokens`` sums the completed requests whose
prompt was counted; ``prompt_tokens_unknown`` says how many were not (null total when none was).

A rate sweep (``--rate 1,2,4,8``) has one run per rate (``run`` and ``rate_per_s`` columns);
:func:`knee` marks the highest rate whose p99 E2E latency is still within ``KNEE_FACTOR`` of its
floor (the lowest rate's p99): beyond it, latency leaves its floor as queues build.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.errors import UsageError

from .serving import prompt_token_total, stats

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.report import Report

LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
SLO_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
KNEE_FACTOR = 1.5


def parse_slo(text: str | None) -> dict[str, float]:
    """``ttft=0.5,tpot=0.05`` (seconds) -> ``{"ttft_s": 0.5, "tpot_s": 0.05}``; keys ttft, tpot, e2e."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise UsageError(f"bad --slo item {part!r}", hint="use ttft=SECONDS,tpot=SECONDS,e2e=SECONDS")
        try:
            seconds = float(value)
        except ValueError:
            raise UsageError(f"bad --slo value {value!r} for {key}", hint="give seconds, e.g. ttft=0.5") from None
        if not np.isfinite(seconds) or seconds <= 0:
            raise UsageError(f"--slo {key} must be a positive number of seconds, got {value!r}")
        out[SLO_KEYS[key]] = seconds
    return out


def token_times(requests: pd.DataFrame) -> list[np.ndarray]:
    """Each request's token times (s from the run's start), from the ``token_times_s`` JSON column."""
    if "token_times_s" not in requests.columns:
        return []
    return [np.asarray(json.loads(t) if isinstance(t, str) else [], dtype=float) for t in requests["token_times_s"]]


def itl_values(requests: pd.DataFrame) -> np.ndarray:
    """Every inter-token gap of every request, pooled."""
    gaps = [np.diff(t) for t in token_times(requests) if len(t) > 1]
    return np.concatenate(gaps) if gaps else np.zeros(0)


def load_metrics(requests: pd.DataFrame, slo: Mapping[str, float] | None = None,
                 duration_s: float | None = None) -> dict[str, Any]:
    """The ``--json`` payload of one run: counts, throughputs, latency statistics, goodput."""
    failures: dict[str, int] | None = None
    r = sent = requests
    if "status" in r.columns:
        status = r["status"].astype(str)
        failures = {str(k): int(v) for k, v in status[status != "ok"].value_counts().sort_index().items()}
        r = r[status == "ok"]
    n = len(r)
    dur = float(r["end_s"].max()) if duration_s is None and n else (duration_s if duration_s is not None else float("nan"))
    out_tokens = int(r["output_tokens"].sum()) if n else 0
    per_s = (lambda x: x / dur) if dur and dur > 0 else (lambda x: float("nan"))
    ttft = r["ttft_s"].to_numpy(dtype=float, na_value=np.nan) if n else np.zeros(0)
    e2e = r["e2e_s"].to_numpy(dtype=float, na_value=np.nan) if n else np.zeros(0)
    outs = r["output_tokens"].to_numpy(dtype=float, na_value=np.nan) if n else np.zeros(0)
    multi = outs > 1
    tpot = np.where(multi, (e2e - ttft) / np.maximum(outs - 1, 1), np.nan)
    prompt_total, prompt_unknown = prompt_token_total(r)
    payload: dict[str, Any] = {
        "requests": n, "duration_s": dur, "prompt_tokens": prompt_total, "prompt_tokens_unknown": prompt_unknown,
        "output_tokens": out_tokens, "request_throughput_per_s": per_s(n),
        "output_tokens_per_s": per_s(out_tokens),
        "ttft_s": stats(ttft), "tpot_s": stats(tpot[multi]), "itl_s": stats(itl_values(r)), "e2e_s": stats(e2e),
    }
    if failures is not None:
        payload["requests_sent"] = len(sent)
        payload["failed_requests"] = int(sum(failures.values()))
        payload["failures"] = failures
    if "scheduled_s" in r.columns:
        sched = r["scheduled_s"].to_numpy(dtype=float, na_value=np.nan) if n else np.zeros(0)
        first = r["first_token_s"].to_numpy(dtype=float, na_value=np.nan) if n else np.zeros(0)
        end = r["end_s"].to_numpy(dtype=float, na_value=np.nan) if n else np.zeros(0)
        payload["scheduled_ttft_s"] = stats(first - sched)
        payload["scheduled_e2e_s"] = stats(end - sched)
        payload["dispatch_delay_s"] = stats(sent["arrival_s"].to_numpy(dtype=float, na_value=np.nan)
                                            - sent["scheduled_s"].to_numpy(dtype=float, na_value=np.nan))
    if slo:
        good = np.ones(n, dtype=bool)
        values = {"ttft_s": ttft, "tpot_s": np.where(multi, tpot, 0.0), "e2e_s": e2e}
        for key, limit in slo.items():
            good &= values[key] <= limit
        payload["slo"] = dict(slo)
        payload["good_requests"] = int(good.sum())
        payload["goodput_per_s"] = per_s(int(good.sum()))
    return payload


def is_loadtest(report: Report) -> bool:
    """True for a report written by ``perfscope loadtest``."""
    return bool(report.params.get("loadtest")) and "token_times_s" in report.requests.columns


def runs(report: Report) -> list[dict[str, Any]]:
    """The load test's runs (one per rate) from the manifest: ``run``, ``rate_per_s``, ``duration_s``."""
    return list(report.params.get("loadtest", {}).get("runs", []))


def run_tables(report: Report, run: str, name: str) -> pd.DataFrame:
    df = report.table(name)
    return df[df["run"] == run] if "run" in df.columns else df


def rate_summary(report: Report) -> pd.DataFrame:
    """One row per rate: throughputs, latency percentiles, goodput; ``knee`` marks the knee."""
    slo = report.params.get("loadtest", {}).get("slo") or {}
    rows = []
    for run in runs(report):
        m = load_metrics(run_tables(report, run["run"], "requests"), slo, run.get("duration_s"))
        row = {"run": run["run"], "rate_per_s": run["rate_per_s"], "requests": m["requests"],
               "request_throughput_per_s": m["request_throughput_per_s"],
               "output_tokens_per_s": m["output_tokens_per_s"]}
        for lat in LATENCIES:
            for s in ("p50", "p99"):
                row[f"{lat.removesuffix('_s')}_{s}_s"] = m[lat][s]
        row["goodput_per_s"] = m.get("goodput_per_s", np.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        k = knee(df["rate_per_s"].to_numpy(dtype=float, na_value=np.nan), df["e2e_p99_s"].to_numpy(dtype=float, na_value=np.nan))
        df["knee"] = df["rate_per_s"] == k if k is not None else False
    return df


def knee(rates: np.ndarray, p99: np.ndarray, factor: float = KNEE_FACTOR) -> float | None:
    """The highest rate whose p99 latency is within ``factor`` x the floor (p99 at the lowest rate),
    before the first rate that exceeds it; None with fewer than two rates."""
    order = np.argsort(rates)
    rates, p99 = rates[order], p99[order]
    if len(rates) < 2 or not np.isfinite(p99[0]):
        return None
    floor = p99[0]
    best = rates[0]
    for rate, value in zip(rates, p99):
        if not np.isfinite(value) or value > factor * floor:
            break
        best = rate
    return float(best)
