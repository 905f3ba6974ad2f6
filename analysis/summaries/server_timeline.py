"""A load test's requests next to the server's steps, on one clock (s from the run's start).

:func:`ttft_steps` explains each request's TTFT by the engine steps that ran between its
arrival at the server and its first token: how many prefill and decode steps (its own and other
requests'), and their summed wall time. A TTFT much longer than the request's own prefill is
time spent behind other requests' steps (or waiting for a KV slot: ``queue_len`` of the steps).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TTFT_COLUMNS = ("ttft_prefill_steps", "ttft_decode_steps", "ttft_steps_s")


def ttft_steps(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with :data:`TTFT_COLUMNS` added: the steps that started in [arrival, first token).

    Steps need ``start_s``/``end_s`` on the requests' clock; rows without a first token (failed
    requests) or steps without times get missing values, not 0.
    """
    out = requests.copy()
    n = len(out)
    pre = np.full(n, np.nan)
    dec = np.full(n, np.nan)
    busy = np.full(n, np.nan)
    if len(steps) and {"start_s", "end_s", "phase"} <= set(steps.columns) and steps["start_s"].notna().any():
        s0 = steps["start_s"].to_numpy(dtype=float)
        s1 = steps["end_s"].to_numpy(dtype=float)
        phase = steps["phase"].astype(str).to_numpy()
        runs = steps["run"].astype(str).to_numpy() if "run" in steps.columns else None
        arrival = out["arrival_s"].to_numpy(dtype=float)
        first = out["first_token_s"].to_numpy(dtype=float)
        req_runs = out["run"].astype(str).to_numpy() if "run" in out.columns else None
        for i in range(n):
            if not (np.isfinite(arrival[i]) and np.isfinite(first[i])):
                continue
            # the step that made the first token started before it (its end and the token's
            # receipt differ by the transfer and the clock offset's uncertainty)
            inside = (s0 >= arrival[i]) & (s0 < first[i])
            if runs is not None and req_runs is not None:
                inside &= runs == req_runs[i]
            pre[i] = float((inside & (phase == "prefill")).sum())
            dec[i] = float((inside & (phase == "decode")).sum())
            busy[i] = float((s1[inside] - s0[inside]).sum())
    out["ttft_prefill_steps"], out["ttft_decode_steps"], out["ttft_steps_s"] = pre, dec, busy
    return out
