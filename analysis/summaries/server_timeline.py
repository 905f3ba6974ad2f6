"""A load test's requests next to the server's steps, on one clock (s from the run's start).

:func:`ttft_steps` explains each request's TTFT by the engine steps that ran between its
arrival at the server and its first token: how many prefill and decode steps (its own and other
requests'), and their summed wall time. A TTFT much longer than the request's own prefill is
time spent behind other requests' steps (or waiting for a KV slot: ``queue_len`` of the steps).

:func:`request_times_ns` goes the other way: each request's times moved onto the report's timeline
(the kernels' and steps' ns), for the timeline export (``perfscope export``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TTFT_COLUMNS = ("ttft_prefill_steps", "ttft_decode_steps", "ttft_steps_s")


def ttft_steps(requests: pd.DataFrame, steps: pd.DataFrame, links: pd.DataFrame | None = None) -> pd.DataFrame:
    """``requests`` with :data:`TTFT_COLUMNS` added: the steps that started in [arrival, first token).

    Steps need ``start_s``/``end_s`` on the requests' clock; rows without a first token (failed
    requests) or steps without times get missing values, not 0. With ``links`` (``request_steps``: the
    steps each request took part in), a request's window ends where the step that made its first token
    (its last prefill chunk) ends: a step that started after that, while the token was on its way to the
    client, did not delay it.
    """
    out = requests.copy()
    n = len(out)
    pre = np.full(n, np.nan)
    dec = np.full(n, np.nan)
    busy = np.full(n, np.nan)
    if len(steps) and {"start_s", "end_s", "phase"} <= set(steps.columns) and steps["start_s"].notna().any():
        s0 = steps["start_s"].to_numpy(dtype=float, na_value=np.nan)
        s1 = steps["end_s"].to_numpy(dtype=float, na_value=np.nan)
        phase = steps["phase"].astype(str).to_numpy()
        runs = steps["run"].astype(str).to_numpy() if "run" in steps.columns else None
        arrival = out["arrival_s"].to_numpy(dtype=float, na_value=np.nan)
        first = out["first_token_s"].to_numpy(dtype=float, na_value=np.nan)
        own_end = _first_token_step_end(out, steps, links)
        req_runs = out["run"].astype(str).to_numpy() if "run" in out.columns else None
        for i in range(n):
            if not (np.isfinite(arrival[i]) and np.isfinite(first[i])):
                continue
            # the step that made the first token started before it (its end and the token's
            # receipt differ by the transfer and the clock offset's uncertainty); where the links
            # name that step, the window ends with it
            until = own_end[i] if np.isfinite(own_end[i]) else first[i]
            inside = (s0 >= arrival[i]) & (s0 < until)
            if runs is not None and req_runs is not None:
                inside &= runs == req_runs[i]
            pre[i] = float((inside & (phase == "prefill")).sum())
            dec[i] = float((inside & (phase == "decode")).sum())
            busy[i] = float((s1[inside] - s0[inside]).sum())
    out["ttft_prefill_steps"], out["ttft_decode_steps"], out["ttft_steps_s"] = pre, dec, busy
    return out


def _first_token_step_end(requests: pd.DataFrame, steps: pd.DataFrame, links: pd.DataFrame | None) -> np.ndarray:
    """Per request: ``end_s`` of the step that made its first token (the last step it took part in as
    ``prefill``), NaN where ``links`` do not name one."""
    n = len(requests)
    need = {"request_id", "step", "role"}
    if links is None or not len(links) or not need <= set(links.columns) or "request_id" not in requests \
            or "step" not in steps:
        return np.full(n, np.nan)
    keys = ["run"] if "run" in links.columns and "run" in requests.columns and "run" in steps.columns else []
    chunks = links[links["role"].astype(str) == "prefill"]
    last = chunks.groupby([*keys, "request_id"], as_index=False)["step"].max()
    ends = last.merge(steps[[*keys, "step", "end_s"]], on=[*keys, "step"], how="left")
    got = requests[[*keys, "request_id"]].merge(ends, on=[*keys, "request_id"], how="left")
    return pd.to_numeric(got["end_s"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


REQUEST_TIMES = ("scheduled", "arrival", "admitted", "first_token", "end")
"""The request times (``<name>_s`` on the run's clock) that :func:`request_times_ns` places."""


def _ns(seconds: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Seconds as int64 ns (rounded) and a mask of the known ones."""
    s = pd.to_numeric(seconds, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    ok = np.isfinite(s)
    return np.where(ok, np.rint(np.where(ok, s, 0.0) * 1e9), 0).astype(np.int64), ok


def _group(df: pd.DataFrame, key: str, value: object) -> np.ndarray:
    if key not in df.columns:
        return np.ones(len(df), dtype=bool)
    return (df[key].astype(object) == value).to_numpy()


def request_times_ns(requests: pd.DataFrame, steps: pd.DataFrame, run_origins_ns: dict[str, int] | None = None,
                     *, requests_only: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Each request's times on the report's timeline (the clock of its kernels and steps), in ns.

    Request times are seconds on the run's clock (``arrival_s`` ...: from the run's start); each run
    (``run`` column, else the whole table) is moved onto the timeline by one offset in ns, taken from
    the first source that has it:

    - the run's steps that hold both clocks (``end_ns`` on the timeline, ``end_s`` on the run's, else
      the starts: the engine load test, an endpoint load test of perfscope serve with ``--profile``):
      the median of ``end_ns - end_s``. Exact when the steps kept their own clock; when they were
      moved onto the trace's step ranges, the ends are the steady edge (on the CPU engine ~10 µs of
      spread within a run, where the range starts vary by ~100 µs), and a step's end is when its
      tokens were made;
    - per transformers ``generate()`` call (``generate_call`` in both tables): the end of the call's
      first step (its prefill, which made the first token) minus the call's first token;
    - a report that holds requests only (``requests_only``: an endpoint load test without
      ``--profile``): the run's start, ``run_origins_ns[run]`` (its ``t0_perf_counter_ns``), else 0.

    Returns the table (index of ``requests``; ``<time>_ns`` Int64 columns for :data:`REQUEST_TIMES`,
    missing where the request lacks the time or its run has no offset) and notes on what could not be
    placed (requests without times, e.g. a batch ``generate()`` of the engine, are not counted there).
    """
    n = len(requests)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    notes: list[str] = []
    st = steps if len(steps) else pd.DataFrame(columns=["start_ns", "start_s"])
    runs = requests["run"].astype(object).unique().tolist() if "run" in requests.columns else [None]
    for run in runs:
        rows = _group(requests, "run", run) if run is not None else np.ones(n, dtype=bool)
        srows = _group(st, "run", run) if run is not None else np.ones(len(st), dtype=bool)
        offset: int | None = None
        edge = "end" if {"end_ns", "end_s"} <= set(st.columns) else "start"
        if {f"{edge}_ns", f"{edge}_s"} <= set(st.columns):
            s_ns, ok = _ns(st[f"{edge}_s"])
            t_ns = pd.to_numeric(st[f"{edge}_ns"], errors="coerce")
            ok &= srows & t_ns.notna().to_numpy()
            if ok.any():
                t = t_ns.to_numpy(dtype=np.int64, na_value=0)[ok]
                base = int(t[0])  # the median of small differences: exact in float64, unlike epoch ns
                offset = base + int(np.rint(np.median((t - base) - s_ns[ok])))
        if offset is not None:
            offsets[rows], placed[rows] = offset, True
            continue
        if "generate_call" in requests.columns and {"generate_call", "end_ns"} <= set(st.columns):
            first_tok, ok = _ns(requests["first_token_s"] if "first_token_s" in requests.columns
                                else pd.Series(np.nan, index=requests.index))
            calls = requests["generate_call"].to_numpy()
            for call in pd.unique(calls[rows]):
                in_call = rows & (calls == call) & ok
                call_steps = st[(st["generate_call"].to_numpy() == call) & srows]
                if in_call.any() and len(call_steps):
                    end = int(call_steps.sort_values("start_ns", kind="stable")["end_ns"].iloc[0])
                    offsets[rows & (calls == call)] = end - int(first_tok[in_call].min())
                    placed[rows & (calls == call)] = True
            if placed[rows].any():
                continue
        if requests_only:
            offsets[rows] = int((run_origins_ns or {}).get(str(run), 0) or 0) if run is not None else 0
            placed[rows] = True
            continue
        timed = int((rows & requests.get("arrival_s", pd.Series(np.nan, index=requests.index)).notna().to_numpy()).sum())
        if timed:
            notes.append(f"{timed} request(s){'' if run is None else f' of run {run}'} not placed on the timeline: "
                         "no step holds both the run's clock and the trace's (end_s and end_ns)")
    out = pd.DataFrame(index=requests.index)
    for name in REQUEST_TIMES:
        col = f"{name}_s"
        if col in requests.columns:
            ns, ok = _ns(requests[col])
            ok &= placed
            out[f"{name}_ns"] = pd.array(np.where(ok, ns + offsets, 0), dtype="Int64")
            out.loc[~ok, f"{name}_ns"] = pd.NA
        else:
            out[f"{name}_ns"] = pd.array([pd.NA] * n, dtype="Int64")
    return out, notes
