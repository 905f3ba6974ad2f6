"""The server's profile of a load test's window, on the client's timeline.

:class:`ProfileSession` estimates the offset between the client's clock and the server's
(``time.perf_counter_ns``: CLOCK_MONOTONIC on Linux) from round trips to ``/health`` when the
server says its clock there (perfscope serve), the midpoint of each round trip against the
server's reading, the shortest round trip kept (its half is the uncertainty) as NTP does;
then ``POST /start_profile`` before the first request and ``POST /stop_profile`` after the last.

The trace is the one the stop answer names (perfscope serve: ``{"trace", "steps"}``), else the
newest trace written into ``--server-trace-dir`` during the window (vLLM's
``VLLM_TORCH_PROFILER_DIR``, SGLang's output dir). It is imported with the one Kineto reader;
perfscope serve's step records (server clock) are matched to the trace's ``prefill``/``decode``
ranges one to one (:func:`perfscope.sessions.profile.align_steps`) and given ``start_s``/``end_s`` on the
client's run clock (s from the run's start, as the requests), so each request's arrival, first
token and end sit next to the steps it waited for (:mod:`perfscope.analysis.summaries.server_timeline`).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from .http_stream import CLIENTS, BrokenStream, HttpError, Url, request_json

TRACE_PATTERNS = ("*.pt.trace.json.gz", "*.pt.trace.json", "*.trace.json.gz", "*.trace.json", "*.json.gz")


class ProfileSession:
    """One profiled window of a load test."""

    def __init__(self, url: Url, api_key: str | None, trace_dir: str | None) -> None:
        self.url, self.trace_dir = url, Path(trace_dir).expanduser() if trace_dir else None
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.active = False
        self.started_epoch = 0.0
        self.offset: dict[str, Any] = {"clock_offset_ns": None, "clock_offset_uncertainty_ns": None,
                                       "clock_offset_method": None}

    def _call(self, method: str, path: str) -> tuple[int, Any]:
        """One call under the ``profile`` policy (120 s for the whole answer, no redirect followed)."""
        try:
            return asyncio.run(request_json(self.url, method, path, {} if method == "POST" else None, self.headers,
                                            policy=CLIENTS["profile"]))
        except HttpError as exc:  # a redirect
            return exc.status, {"error": exc.message}
        except (OSError, BrokenStream, TimeoutError) as exc:
            return 0, {"error": str(exc) or type(exc).__name__}

    def _root(self, name: str) -> str:
        base = self.url.path.removesuffix("/v1")
        return f"{base}/{name}"

    def estimate_offset(self, pings: int = 7) -> dict[str, Any]:
        best: tuple[int, int] | None = None  # (round trip, offset)
        for _ in range(pings):
            t1 = time.perf_counter_ns()
            status, body = self._call("GET", self._root("health"))
            t2 = time.perf_counter_ns()
            server = body.get("perf_counter_ns") if isinstance(body, dict) else None
            if status != 200 or not isinstance(server, int):
                break
            rtt, off = t2 - t1, server - (t1 + t2) // 2
            if best is None or rtt < best[0]:
                best = (rtt, off)
        if best is not None:
            rtt, off = best
            method = f"round trips to /health (server perf_counter_ns), best of {pings}: {off} ns ± {rtt // 2} ns"
            if abs(off) <= rtt // 2:
                off, method = 0, method + ", consistent with 0 (one host clock): 0 used"
            return {"clock_offset_ns": off, "clock_offset_uncertainty_ns": rtt // 2, "clock_offset_method": method}
        local = self.url.host in ("127.0.0.1", "localhost", "::1")
        return {"clock_offset_ns": 0 if local else None, "clock_offset_uncertainty_ns": None,
                "clock_offset_method": "assumed 0: same host, one monotonic clock" if local else
                "unknown: the server does not say its clock"}

    def start(self) -> list[str]:
        """Estimate the clock offset and start the server's profiler; warnings when it cannot."""
        self.offset = self.estimate_offset()
        self.started_epoch = time.time()
        status, body = self._call("POST", self._root("start_profile"))
        if status != 200:
            why = (body or {}).get("error") if isinstance(body, dict) else None
            return [f"--profile: the server did not start its profiler (POST /start_profile: "
                    f"{'HTTP ' + str(status) if status else 'no answer'}{': ' + str(why) if why else ''}); "
                    "the report has no server profile"]
        self.active = True
        return []

    def stop(self, t0_ns: int, label: str, ids: dict[int, int] | None = None) -> dict[str, Any]:
        """Stop the profiler and import its trace: tables (kernels, ranges, steps) and what was done.

        ``ids`` maps the server's request ids to the client's (:func:`.endpoint.server_ids`): with it,
        perfscope serve's step records join each step to the requests in it (``request_steps``), and its
        scheduler's admission times come back on the client's clock (``scheduler``)."""
        out: dict[str, Any] = {**self.offset, "warnings": []}
        if not self.active:
            return out
        status, body = self._call("POST", self._root("stop_profile"))
        if status != 200:
            out["warnings"].append(f"--profile: POST /stop_profile answered {status or 'nothing'}; no server profile")
            return out
        trace = body.get("trace") if isinstance(body, dict) else None
        steps_file = body.get("steps") if isinstance(body, dict) else None
        trace = str(trace) if isinstance(trace, str) else None
        steps_file = str(steps_file) if isinstance(steps_file, str) and self._may_read(Path(steps_file)) else None
        if trace and not self._may_read(Path(str(trace))):
            out["warnings"].append(f"--profile: the server named a trace outside --server-trace-dir ({str(trace)[:200]}); "
                                   "a remote server's path is not read")
            trace = None
        if not trace:
            trace = self._newest_trace()
        if not trace or not Path(trace).is_file():
            out["warnings"].append("--profile: the server stopped its profiler but perfscope found no trace: give "
                                   "--server-trace-dir (the folder the server writes traces into)")
            return out
        from perfscope.analysis.readers.kineto.reader import import_kineto
        from perfscope.errors import PerfscopeError
        from perfscope.limits import counting

        try:
            with counting():  # the trace is imported under the import budget, as `perfscope import` would
                imported = import_kineto(trace)
        except PerfscopeError as exc:  # the load test keeps its report; the profile is what is lost
            out["warnings"].append(f"--profile: the server's trace could not be read: {exc}")
            return out
        tables = dict(imported.tables)
        out["warnings"] += imported.warnings
        out["trace"] = str(trace)
        if steps_file and Path(steps_file).is_file():
            try:
                steps, note = self._engine_steps(Path(steps_file), tables.get("ranges", pd.DataFrame()), t0_ns)
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                steps, note = pd.DataFrame(), f"--profile: the server's step records are unreadable ({type(exc).__name__})"
            if note:
                out["warnings"].append(note)
            tables["steps"] = steps
            out["steps"] = len(steps)
            if ids:
                links, sched = self._scheduler_log(Path(steps_file), ids, t0_ns)
                tables["request_steps"] = links
                out["scheduler"] = sched.assign(run=label)
                out["joined_requests"] = int(links["request_id"].nunique()) if len(links) else 0
        tables = {k: (df.assign(run=label) if len(df) else df) for k, df in tables.items()}
        out["tables"] = tables
        return out

    def _engine_steps(self, path: Path, ranges: pd.DataFrame, t0_ns: int) -> tuple[pd.DataFrame, str | None]:
        from perfscope.engine.serving import LoadStep
        from perfscope.sessions.profile import align_steps

        data = json.loads(path.read_text(encoding="utf-8"))
        steps = [LoadStep(**s) for s in data.get("steps", [])]
        df, note = align_steps(steps, ranges)
        if not len(df):
            return df, note
        off = self.offset.get("clock_offset_ns")
        raw_start = pd.Series([s.start_ns for s in steps], dtype="int64")
        raw_end = pd.Series([s.end_ns for s in steps], dtype="int64")
        if off is None:
            df["start_s"] = float("nan")
            df["end_s"] = float("nan")
        else:  # server clock -> client clock -> s from the run's start
            df["start_s"] = (raw_start - off - t0_ns) / 1e9
            df["end_s"] = (raw_end - off - t0_ns) / 1e9
        df["framework"] = "engine"
        return df, note

    def _may_read(self, path: Path) -> bool:
        """A path the server named is read when the server runs on this host (loopback) or the path is inside
        ``--server-trace-dir``: a remote server cannot make perfscope read a local file of its choosing."""
        if self.url.host in ("127.0.0.1", "localhost", "::1"):
            return True
        if self.trace_dir is None:
            return False
        try:
            return path.resolve().is_relative_to(self.trace_dir.resolve())
        except OSError:
            return False

    def _scheduler_log(self, path: Path, ids: dict[int, int], t0_ns: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """perfscope serve's log of the window: each step's requests (the client's ids) and each request's
        first look and admission on the client's clock (missing when the clock offset is not known)."""
        from perfscope.engine.serving import LoadStep
        from perfscope.sessions.loadtest import request_steps_frame

        data = json.loads(path.read_text(encoding="utf-8"))
        steps = [LoadStep(**s) for s in data.get("steps", [])]
        links = request_steps_frame(steps, ids)
        off = self.offset.get("clock_offset_ns")
        origin = int(data.get("origin_ns") or 0)
        rows = []
        for r in data.get("requests", []):
            rid = ids.get(int(r.get("request_id", -1)))
            if rid is None:
                continue
            def client_s(x: Any) -> float:
                if off is None or x is None:
                    return float("nan")
                return (origin + float(x) * 1e9 - off - t0_ns) / 1e9
            rows.append({"request_id": rid, "considered_s": client_s(r.get("considered_s")),
                         "admitted_s": client_s(r.get("admitted_s"))})
        return links, pd.DataFrame(rows, columns=["request_id", "considered_s", "admitted_s"])

    def _newest_trace(self) -> str | None:
        if self.trace_dir is None or not self.trace_dir.is_dir():
            return None
        found = [p for pat in TRACE_PATTERNS for p in self.trace_dir.rglob(pat)
                 if p.stat().st_mtime >= self.started_epoch - 1]
        return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


__all__ = ["ProfileSession"]
