"""Per-request serving metrics from token times, as vLLM defines them (TTFT, TPOT excluding the
first token, ITL, E2E): :func:`token_latencies`, called by the reference engine, the transformers
``generate()`` recorder and the engine's load test. (The endpoint load test computes the same
definitions over its columns at once, with the unrounded first and last chunk times.)"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence


def token_latencies(arrival_s: float, times_s: Sequence[float] | np.ndarray,
                    n_tokens: int | None = None) -> dict[str, float]:
    """A request's latencies (s) from its arrival and the times its tokens (or streamed chunks) came:
    ``ttft_s`` (arrival to the first), ``e2e_s`` (to the last), ``tpot_s`` ((last - first) / (tokens
    - 1), ``n_tokens`` tokens, default one per time; NaN with one token), ``itl_mean_s`` and
    ``itl_p99_s`` over the gaps between the times (NaN without a gap). NaN where there is no time."""
    t = np.asarray(times_s, dtype=np.float64)
    n = len(t) if n_tokens is None else n_tokens
    if not len(t):
        return {"ttft_s": math.nan, "e2e_s": math.nan, "tpot_s": math.nan, "itl_mean_s": math.nan,
                "itl_p99_s": math.nan}
    gaps = np.diff(t)
    return {"ttft_s": float(t[0] - arrival_s), "e2e_s": float(t[-1] - arrival_s),
            "tpot_s": float((t[-1] - t[0]) / (n - 1)) if n > 1 else math.nan,
            "itl_mean_s": float(gaps.mean()) if len(gaps) else math.nan,
            "itl_p99_s": float(np.percentile(gaps, 99)) if len(gaps) else math.nan}


def _none(v: float) -> float | None:
    return None if math.isnan(v) else v


@dataclass(frozen=True)
class RequestRecord:
    request_id: int
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float | None
    e2e_s: float
    itl_mean_s: float | None
    itl_p99_s: float | None


@dataclass(frozen=True)
class SpeculativeRequestRecord(RequestRecord):
    """A request decoded speculatively: its draft tokens checked and accepted over its verify
    steps, the acceptance rate (%) and the mean accepted drafts per verify step (the same request
    columns for the engine and transformers ``generate()``)."""

    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_pct: float | None = None
    mean_accepted_len: float | None = None


def request_records(prompts: list[list[int]], token_ns: list[int], start_ns: int,
                    output_lens: list[int] | None = None) -> list[RequestRecord]:
    """vLLM serving metrics per request (all rows of a batch share the token times; a row that
    stopped early at an end-of-sequence token has ``output_lens[i]`` tokens, the first ones)."""
    records = []
    for i, p in enumerate(prompts):
        n = len(token_ns) if output_lens is None else output_lens[i]
        lat = token_latencies(0.0, (np.asarray(token_ns[:n], dtype=np.int64) - start_ns) / 1e9)
        records.append(RequestRecord(
            request_id=i, prompt_tokens=len(p), output_tokens=n, ttft_s=lat["ttft_s"], tpot_s=_none(lat["tpot_s"]),
            e2e_s=lat["e2e_s"], itl_mean_s=_none(lat["itl_mean_s"]), itl_p99_s=_none(lat["itl_p99_s"])))
    return records
