"""Per-request serving metrics from token times, as vLLM defines them (TTFT, TPOT excluding the
first token, ITL, E2E): shared by the reference engine and the transformers ``generate()`` recorder."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


def request_records(prompts: list[list[int]], token_ns: list[int], start_ns: int,
                    output_lens: list[int] | None = None) -> list[RequestRecord]:
    """vLLM serving metrics per request (all rows of a batch share the token times; a row that
    stopped early at an end-of-sequence token has ``output_lens[i]`` tokens, the first ones)."""
    records = []
    for i, p in enumerate(prompts):
        n = len(token_ns) if output_lens is None else output_lens[i]
        t = (np.asarray(token_ns[:n], dtype=np.int64) - start_ns) / 1e9
        gaps = np.diff(t)
        records.append(RequestRecord(
            request_id=i, prompt_tokens=len(p), output_tokens=n, ttft_s=float(t[0]),
            tpot_s=float((t[-1] - t[0]) / (n - 1)) if n > 1 else None, e2e_s=float(t[-1]),
            itl_mean_s=float(gaps.mean()) if n > 1 else None,
            itl_p99_s=float(np.percentile(gaps, 99)) if n > 1 else None))
    return records
