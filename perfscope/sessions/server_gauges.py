"""The server's gauges under load: a scraper of ``/metrics`` on the load test's clock
(``perfscope loadtest --endpoint URL --metrics``), and the gauges ``perfscope serve`` publishes
under vLLM's names. The text format and the names are :mod:`perfscope.gauges`'.

The scraper is one of the HTTP clients of :data:`perfscope.sessions.http_stream.CLIENTS` (``metrics``):
no redirect is followed (the ``Authorization`` header never leaves for another origin, and another
host's numbers are never stored as the server's), the body and each line are capped, and each scrape
has a deadline for its whole answer. A scrape that fails is counted (``params.gauges.scrapes_failed``
and a warning); the load test and its report go on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pandas as pd

from perfscope.gauges import canonical, parse_prometheus, render_vllm

from .http_stream import CLIENTS, BrokenStream, HttpError, Url, fetch

SCRAPE_TIMEOUT_S = CLIENTS["metrics"].deadline_s or 2.0


def metrics_url(endpoint_url: Any) -> str:
    """``http://host:port/metrics`` of an OpenAI endpoint ``http://host:port/v1`` (the path is dropped:
    vLLM and SGLang both serve ``/metrics`` at the root)."""
    host = f"[{endpoint_url.host}]" if ":" in str(endpoint_url.host) else endpoint_url.host
    return f"{endpoint_url.scheme}://{host}:{endpoint_url.port}/metrics"


class GaugeScraper:
    """Scrapes ``url`` every ``interval_s`` in a thread; each sample is stamped with
    ``time.perf_counter_ns()`` when its answer arrived, the clock the load test stamps requests with,
    so :meth:`rows` places it on the requests' timeline."""

    def __init__(self, url: str, interval_s: float = 1.0, api_key: str | None = None) -> None:
        self.url, self.interval_s, self.api_key = url, interval_s, api_key
        self.samples: list[tuple[int, list[dict[str, Any]]]] = []
        self.errors: list[str] = []
        self.failures = 0
        self.attempts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="perfscope-gauges", daemon=True)

    def start(self) -> GaugeScraper:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def scrape_once(self) -> None:
        """One scrape under the ``metrics`` policy; a failure of any kind is counted, never raised."""
        self.attempts += 1
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            url = Url.parse(self.url)
            status, body = asyncio.run(fetch(url, "GET", url.path or "/metrics", CLIENTS["metrics"], headers=headers))
            if status != 200:
                raise HttpError(status, "not 200 OK")
            rows = canonical(parse_prometheus(body.decode("utf-8", "replace")))
        except (HttpError, BrokenStream, TimeoutError, OSError, ValueError) as exc:
            self._failed(exc)
            return
        except Exception as exc:  # noqa: BLE001 - a scrape must never cost the load test its report
            self._failed(exc)
            return
        self.samples.append((time.perf_counter_ns(), rows))

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        if len(self.errors) < 5:
            self.errors.append(f"{type(exc).__name__}: {str(exc)[:200] or 'timed out'}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(SCRAPE_TIMEOUT_S + self.interval_s + 1.0)

    def rows(self, t0_ns: int, run: str | None = None) -> pd.DataFrame:
        """The ``gauges`` rows: ``t_s`` from the run's start (negative: scraped before its first request)."""
        out = [{**r, "t_s": (ns - t0_ns) / 1e9, "run": run} for ns, rows in self.samples for r in rows]
        return pd.DataFrame(out, columns=["t_s", "metric", "value", "server_name", "labels", "run"])

    def warnings(self) -> list[str]:
        out = []
        if self.failures:
            out.append(f"/metrics at {self.url}: {self.failures} of {self.attempts} scrape(s) failed ({self.errors[0]})")
        if not self.samples:
            out.append(f"/metrics at {self.url}: no sample (does the server publish Prometheus metrics?)")
        elif not any(rows for _, rows in self.samples):
            out.append(f"/metrics at {self.url}: none of the vLLM or SGLang gauges perfscope knows")
        return out


class ServeGauges:
    """What ``perfscope serve`` publishes on ``/metrics``: updated by the scheduler thread after each
    step (:meth:`on_step`), read by the HTTP front (:meth:`text`)."""

    def __init__(self, model: Any, max_batch: int, max_len: int, name: str) -> None:
        self.name = name
        self.max_batch, self.max_len = max_batch, max_len
        kv = getattr(model, "kv_bytes", None)
        self.kv_total_bytes = float(kv(max_batch, max_len)) if callable(kv) else float("nan")
        self.values: dict[str, float] = {"kv_cache_usage_pct": 0.0, "requests_running": 0.0, "requests_waiting": 0.0,
                                         "preemptions_total": 0.0, "prompt_tokens_total": 0.0,
                                         "generation_tokens_total": 0.0}
        self._lock = threading.Lock()

    def on_step(self, step: Any) -> None:
        with self._lock:
            v = self.values
            if self.kv_total_bytes > 0:
                v["kv_cache_usage_pct"] = 100.0 * float(step.kv_cache_size_bytes) / self.kv_total_bytes
            v["requests_running"] = float(step.kv_slots_in_use)
            v["requests_waiting"] = float(step.queue_len)
            v["prompt_tokens_total"] += float(step.prefill_tokens)
            # a decode step makes one token per sequence; a prefill, each prefilled sequence's first
            v["generation_tokens_total"] += float(step.decode_seqs if step.phase == "decode" else step.batch)

    def text(self) -> str:
        with self._lock:
            values = dict(self.values)
        return render_vllm(values, model_name=self.name, info={
            "block_size": 1, "num_gpu_blocks": self.max_batch * self.max_len, "max_num_seqs": self.max_batch,
            "preemption": "never (the engine holds a slot per sequence)"})


def start_scraper(run: Any, url: Any) -> GaugeScraper | None:
    """A started scraper of the endpoint's ``/metrics`` when the run asks for it (``run.metrics``)."""
    if not getattr(run, "metrics", False):
        return None
    return GaugeScraper(metrics_url(url), float(run.metrics_interval_s), getattr(run, "api_key", None)).start()


def scraper_rows(scraper: GaugeScraper, t0_ns: int, run: str, warnings: list[str]) -> pd.DataFrame:
    """Stop ``scraper`` (one last sample first, so the run's end is in) and return its rows; its failed
    scrapes are kept in ``df.attrs["scrapes_failed"]``."""
    scraper.stop()
    scraper.scrape_once()
    warnings += scraper.warnings()
    rows = scraper.rows(t0_ns, run)
    rows.attrs["scrapes_failed"] = scraper.failures
    rows.attrs["scrapes"] = scraper.attempts
    return rows


def with_gauges(report: Any, frames: list[pd.DataFrame], run: Any) -> Any:
    """``report`` with its ``gauges`` table and the scrape's settings in ``params.gauges`` (with the
    scrapes tried and failed)."""
    if not getattr(run, "metrics", False):
        return report
    gauges = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    params = {**report.params, "gauges": {"interval_s": float(run.metrics_interval_s),
                                          "clock": "t_s: seconds from the run's start, the requests' clock",
                                          "samples": int(gauges["t_s"].nunique()) if len(gauges) else 0,
                                          "scrapes": sum(int(f.attrs.get("scrapes", 0)) for f in frames),
                                          "scrapes_failed": sum(int(f.attrs.get("scrapes_failed", 0)) for f in frames)}}
    return report.replace(gauges=gauges).with_manifest(params=params)
