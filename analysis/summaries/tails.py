"""Serving tails explained: each request's latency split into the causes that made it, and the p50
and p99 of TTFT, ITL, TPOT and E2E with their parts.

A pure step over the ``requests``, ``steps`` and ``request_steps`` tables of a load test (and its
``gauges`` when it has no steps). For each request, the time from its arrival to its last token is
cut at every event of its own (arrival, the scheduler's first look, admission, each token,
preemptions and readmissions) and at every step's start and end; each piece goes to one part
(:data:`PARTS`), so the parts of a request add up to its latency, of its TTFT to its TTFT, of each
inter-token gap to that gap, by construction:

- ``queued``: the scheduler looked at the request and had no KV slot or KV room for it (from its
  first look, ``considered_s``, to its admission);
- ``prefill``: its own prompt's work (its share, by tokens, of the prefill steps that ran its chunks);
- ``head_of_line``: before its first token, other requests' prefill work it waited behind (their
  steps, and their share of a prefill step it shared);
- ``decode``: decode steps: the one that made its token, at that step's batch (before its first
  token: the running batch's decode steps it waited through);
- ``prefill_stall``: after its first token, other requests' prefill work inside its inter-token gap
  (a separate prefill forward, as the engine runs, or the prefill share of a mixed step);
- ``preemption``: preempted (its KV cache dropped) until readmitted, and the steps recomputing it;
- ``host``: no step ran (the scheduler's own time, the host between forwards; for an endpoint also
  the HTTP hop of the token);
- ``unmeasured``: time the join could not place (outside the profiled steps, or everything beyond the
  queue estimate when only the server's gauges were scraped).

How requests are joined to steps (``source``):

- ``scheduler``: the engine's load test: its scheduler logged every step's rows (``request_steps``)
  and every request's first look, admission and preemptions: exact;
- ``server steps by request id``: ``loadtest --endpoint --profile`` against ``perfscope serve``: its
  step records name their requests, matched to the client's by the stream's response id;
- ``steps by time``: vLLM's and SGLang's step annotations carry counts, not request ids (nor do an
  engine report's steps written before the scheduler's log): a
  request's own prefill is the last prefill (or mixed) step that ended before its first token, and
  the other steps are classified by what they ran; queueing is not told apart from waiting behind
  steps;
- ``gauges``: ``--metrics`` only: the queued time is estimated from ``requests_waiting`` (first come,
  first served, among the requests the client had sent and that had no first token yet), and the
  rest is ``unmeasured``;
- ``none``: requests only: every part ``unmeasured``.

A mixed step (prefill and decode tokens in one forward, vLLM's chunked prefill) is split: its decode
part is the median time of pure decode steps at its batch (linear between batches; by token share
when the trace has no pure decode step), the rest is prefill (other requests': head of line before
the first token, stall after).

The p50 and p99 of each metric are ``numpy.percentile``'s (linear): a value between two sorted
samples (requests, or gaps for ITL), and its parts the same interpolation of theirs, so the parts of
a percentile add up to it and are those of the requests (or gaps) that make it up (``from``).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.memo import memo

if TYPE_CHECKING:
    from perfscope.report import Report

PARTS = ("queued", "prefill", "head_of_line", "decode", "prefill_stall", "preemption", "host", "unmeasured")
"""The parts of a latency, in the order they are shown."""

PART_WORDS = {
    "queued": "queued for a KV slot or KV room",
    "prefill": "its own prefill",
    "head_of_line": "other requests' prefill before its first token (head of line)",
    "decode": "decode steps at their batch",
    "prefill_stall": "other requests' prefill inside the gap (stall)",
    "preemption": "preempted and recomputed",
    "host": "no step running (scheduler, host, transfer)",
    "unmeasured": "not placed (no step to join)",
}
"""Each part in words, for text and pages."""

METRICS = ("ttft", "itl", "tpot", "e2e")
QUANTILES = (("p50", 50.0), ("p99", 99.0))

EDGE_S = 1e-6
"""Times within a microsecond of the steps' span are inside it (token times are stored rounded to 1 ns)."""

SOURCES = ("scheduler", "server steps by request id", "steps by time", "gauges", "none")

_P = {p: i for i, p in enumerate(PARTS)}
_DECODE_PHASES = ("decode",)
_PREFILL_PHASES = ("prefill",)
_MIXED_PHASES = ("mixed",)


@dataclass(frozen=True)
class RunSplit:
    """One run's requests, split.

    Attributes:
        run: the run's label (``rate=20``), "" for a report without runs.
        source: how requests were joined to steps (:data:`SOURCES`).
        requests: one row per request: ``request_id``, ``ttft_s``, ``tpot_s``, ``e2e_s``,
            ``output_tokens`` and ``<metric>_<part>_s`` for ttft, tpot and e2e.
        gaps: one row per inter-token gap: ``request_id``, ``gap`` (1: between tokens 1 and 2),
            ``itl_s``, ``start_s``, ``end_s`` and ``<part>_s``.
        segments: the pieces: ``request_id``, ``gap`` (0: before the first token), ``part``,
            ``seconds``, ``start_s``, ``end_s``, ``step`` (position in :attr:`steps`, -1 none).
        steps: the run's steps on its requests' clock (``start_s``/``end_s``), in start order.
        notes: what the join could not do, in words.
        additivity_error_pct: the largest gap, over requests, between a request's parts and its measured
            TTFT, E2E and gaps, in percent of the latency (0 up to rounding: they are cut from it).
    """

    run: str
    source: str
    requests: pd.DataFrame
    gaps: pd.DataFrame
    segments: pd.DataFrame
    steps: pd.DataFrame
    notes: tuple[str, ...] = ()
    additivity_error_pct: float = math.nan
    unmeasured: tuple[str, ...] = field(default=())

    def values(self, metric: str) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
        """(values, parts matrix [n, len(PARTS)], the rows they come from) of ``metric``."""
        if metric == "itl":
            rows = self.gaps
            cols = [f"{p}_s" for p in PARTS]
            return rows["itl_s"].to_numpy(float, na_value=np.nan), rows[cols].to_numpy(float, na_value=np.nan) if len(rows) else np.zeros((0, len(PARTS))), rows
        rows = self.requests[self.requests[f"{metric}_s"].notna()] if len(self.requests) else self.requests
        cols = [f"{metric}_{p}_s" for p in PARTS]
        return (rows[f"{metric}_s"].to_numpy(float, na_value=np.nan),
                rows[cols].to_numpy(float, na_value=np.nan) if len(rows) else np.zeros((0, len(PARTS))), rows)


# ---------------------------------------------------------------------------- inputs
def _json_list(value: Any) -> list[float]:
    if isinstance(value, str) and value:
        try:
            out = json.loads(value)
        except ValueError:
            return []
        return [float(x) for x in out] if isinstance(out, list) else []
    return []


def _runs(report: Report) -> list[str | None]:
    runs = [str(r["run"]) for r in (report.params.get("loadtest") or {}).get("runs") or [] if isinstance(r, dict)]
    if runs:
        return list(runs)
    req = report.requests
    if "run" in req.columns and req["run"].notna().any():
        return [str(x) for x in pd.unique(req["run"].dropna())]
    return [None]


def _of_run(df: pd.DataFrame, run: str | None) -> pd.DataFrame:
    if run is None or "run" not in df.columns:
        return df
    return df[df["run"].astype(object) == run]


def _run_meta(report: Report, run: str | None) -> dict[str, Any]:
    for r in (report.params.get("loadtest") or {}).get("runs") or []:
        if isinstance(r, dict) and str(r.get("run")) == run:
            return r
    return {}


def run_steps(report: Report, run: str | None) -> tuple[pd.DataFrame, str | None]:
    """The run's steps on its requests' clock (``start_s``/``end_s``, seconds from the run's start),
    in start order with their position as ``pos``; and a note when the report's steps could not be put
    there. Steps that already carry ``start_s`` (the engine's, ``perfscope serve``'s) keep it; a
    framework's steps (vLLM, SGLang: the trace's timeline, Unix-time ns as torch.profiler writes it)
    are moved by the run's ``t0_epoch_ns`` (the client's wall clock at its start)."""
    steps = report.steps
    if not len(steps):
        return steps.iloc[:0], None
    has_s = "start_s" in steps.columns and pd.to_numeric(steps["start_s"], errors="coerce").notna().any()
    if has_s:
        st = _of_run(steps, run) if "run" in steps.columns and steps["run"].notna().any() else steps
        st = st[pd.to_numeric(st["start_s"], errors="coerce").notna()]
        note = None
    else:
        t0 = _run_meta(report, run).get("t0_epoch_ns")
        if not isinstance(t0, int):
            return steps.iloc[:0], ("the server's steps are on the trace's clock only (no step holds the "
                                    "client's, and the run has no wall-clock origin): not joined to requests")
        st = steps.copy()
        st["start_s"] = (st["start_ns"].astype("int64") - t0) / 1e9
        st["end_s"] = (st["end_ns"].astype("int64") - t0) / 1e9
        wall = float(_run_meta(report, run).get("wall_s") or math.inf)
        st = st[(st["end_s"] >= -1.0) & (st["start_s"] <= (wall + 1.0 if math.isfinite(wall) else math.inf))]
        note = ("the server's steps were put on the client's clock by wall time (the trace's Unix-time "
                "timestamps against the client's at the run's start: exact on one host, NTP's error otherwise)")
    st = st.sort_values("start_s", kind="stable").reset_index(drop=True)
    st = st.assign(pos=np.arange(len(st)))
    return st, note


def _decode_estimate(steps: pd.DataFrame) -> np.ndarray:
    """Per step, the time of its decode part: the whole step for a decode step, 0 for a prefill step,
    and for a mixed step the median pure decode step at its batch (linear between batches with
    data), else its decode tokens' share of its time."""
    dur = (steps["end_s"].to_numpy(float, na_value=np.nan) - steps["start_s"].to_numpy(float, na_value=np.nan)).clip(0)
    phase = steps["phase"].astype(object).to_numpy()
    out = np.where(np.isin(phase, _DECODE_PHASES), dur, 0.0)
    mixed = np.isin(phase, _MIXED_PHASES)
    if not mixed.any():
        return out
    seqs = pd.to_numeric(steps.get("decode_seqs", pd.Series(np.nan, index=steps.index)), errors="coerce").to_numpy(float, na_value=np.nan)
    toks = pd.to_numeric(steps.get("tokens", pd.Series(np.nan, index=steps.index)), errors="coerce").to_numpy(float, na_value=np.nan)
    pure = np.isin(phase, _DECODE_PHASES) & np.isfinite(seqs)
    if "outlier" in steps.columns:  # a stalled or cold decode step is not the decode time at its batch
        pure &= steps["outlier"].isna().to_numpy()
    if pure.any():
        by = pd.Series(dur[pure]).groupby(seqs[pure]).median().sort_index()
        est = np.interp(np.nan_to_num(seqs[mixed]), by.index.to_numpy(float, na_value=np.nan), by.to_numpy(float, na_value=np.nan))
    else:
        est = dur[mixed] * np.where(toks[mixed] > 0, np.nan_to_num(seqs[mixed]) / toks[mixed], 0.5)
    out[mixed] = np.minimum(est, dur[mixed])
    return out


def _host_stall_share(report: Report, steps: pd.DataFrame) -> np.ndarray:
    """Per step, the share of its window the host launched nothing in, for steps flagged ``host stall``
    (:func:`perfscope.analysis.steps.flag_outliers`); 0 for the others."""
    out = np.zeros(len(steps))
    if not len(steps) or "outlier" not in steps.columns or not len(report.kernels):
        return out
    flagged = steps["outlier"].astype(object).fillna("").astype(str).str.startswith("host stall").to_numpy()
    if not flagged.any() or not {"start_ns", "end_ns"} <= set(steps.columns):
        return out
    from ..steps import host_gaps, launch_times_ns, step_of

    win = steps[["start_ns", "end_ns"]].astype("int64").reset_index(drop=True)
    launch = launch_times_ns(report.kernels, report.api)
    gaps = host_gaps(win, step_of(launch, win), launch)["gap_ns"].to_numpy(float, na_value=np.nan)
    dur = (win["end_ns"] - win["start_ns"]).to_numpy(float, na_value=np.nan)
    return np.where(flagged & (dur > 0), np.clip(gaps / np.where(dur > 0, dur, 1.0), 0.0, 1.0), 0.0)


@dataclass
class _Join:
    """What one request's pieces are classified with."""

    member: dict[int, tuple[str, int]]  # step position -> (role, tokens) from the scheduler's log
    own_prefill: set[int]  # step positions of its own prefill (by time: the step that made its first token)
    own_share: dict[int, float]  # own share of those steps' prefill work (by time: 1 / prefilling sequences)


@dataclass(frozen=True)
class _Steps:
    """A run's steps as arrays, on the requests' clock, and what each piece inside one is made of."""

    s0: np.ndarray
    s1: np.ndarray
    phase: np.ndarray
    tokens: np.ndarray
    pre_seqs: np.ndarray
    batch: np.ndarray
    dec_share: np.ndarray  # the decode part's share of the step (1 for a decode step, the estimate for a mixed one)
    stall: np.ndarray  # the host stall's share of the step (flagged steps only)

    @classmethod
    def of(cls, report: Report, steps: pd.DataFrame) -> _Steps:
        def num(col: str) -> np.ndarray:
            return pd.to_numeric(steps[col], errors="coerce").to_numpy(float, na_value=np.nan) if col in steps.columns \
                else np.full(len(steps), np.nan)
        # on the requests' grid: token times are stored to the ns, so a token made at a step's end meets it exactly
        s0, s1 = np.round(num("start_s"), 9), np.round(num("end_s"), 9)
        dur = np.maximum(s1 - s0, 0.0)
        dec = _decode_estimate(steps) if len(steps) else np.zeros(0)
        return cls(s0, s1, steps["phase"].astype(object).fillna("?").to_numpy() if len(steps) else np.zeros(0, object),
                   num("tokens"), num("prefill_seqs"), num("batch"),
                   np.where(dur > 0, dec / np.where(dur > 0, dur, 1.0), 0.0), _host_stall_share(report, steps))

    @property
    def covered(self) -> tuple[float, float] | None:
        return (float(self.s0.min()), float(self.s1.max())) if len(self.s0) else None


def _source(report: Report, run: str | None, steps: pd.DataFrame, links: pd.DataFrame) -> tuple[str, list[str]]:
    """How the run's requests are joined to its steps (:data:`SOURCES`), and what the join cannot tell."""
    kind = str((report.manifest.get("source") or {}).get("kind") or "")
    if len(steps) and len(links):
        return ("scheduler" if kind.startswith("engine") else "server steps by request id"), []
    if len(steps):
        fw = sorted({str(f) for f in steps.get("framework", pd.Series(dtype=object)).dropna()} - {"engine"})
        notes = (["the engine's steps without its scheduler's log (a report written before it): joined by time"]
                 if kind.startswith("engine") else [])
        notes.append(f"the step annotations ({', '.join(fw) or 'the steps'}) carry no request identity: "
                     "each request is joined to the steps by time (its own prefill: the last prefill or mixed "
                     "step that ended before its first token; earlier chunks of its prompt count as head of line), "
                     "and time queued for a KV slot is not told apart from time behind other requests' steps")
        return "steps by time", notes
    gauges = _of_run(report.gauges, run) if "run" in report.gauges.columns else report.gauges
    return ("gauges" if len(gauges) else "none"), []


def _members(steps: pd.DataFrame, links: pd.DataFrame) -> dict[int, dict[int, tuple[str, int]]]:
    """request id -> step position -> (role, tokens), from the scheduler's log."""
    out: dict[int, dict[int, tuple[str, int]]] = {}
    if not (len(links) and len(steps)):
        return out
    pos_of = dict(zip(steps["step"].astype("int64").tolist(), steps["pos"].tolist()))
    for rid, stp, role, tok in zip(links["request_id"].tolist(), links["step"].tolist(), links["role"].tolist(),
                                   pd.to_numeric(links["tokens"], errors="coerce").fillna(0).tolist()):
        p = pos_of.get(int(stp))
        if p is not None:
            out.setdefault(int(rid), {})[p] = (str(role), int(tok))
    return out


# ---------------------------------------------------------------------------- the split
def split_run(report: Report, run: str | None) -> RunSplit:
    """Every request of ``run`` split into :data:`PARTS` (see the module docstring)."""
    req = _of_run(report.requests, run)
    if "status" in req.columns:
        req = req[req["status"].astype(object).fillna("ok") == "ok"]
    req = req[pd.to_numeric(req.get("arrival_s", pd.Series(np.nan, index=req.index)), errors="coerce").notna()]
    steps, step_note = run_steps(report, run)
    links = _of_run(report.request_steps, run)
    source, notes = _source(report, run, steps, links)
    notes = ([step_note] if step_note else []) + notes
    if source == "server steps by request id":
        unjoined = int((~req["request_id"].isin(links["request_id"])).sum())
        if unjoined:
            notes.append(f"{unjoined} request(s) not named by the server's step records (no response id matched): "
                         "joined by time")
    members = _members(steps, links)
    st = _Steps.of(report, steps)
    if st.stall.any():
        notes.append(f"{int((st.stall > 0).sum())} step(s) flagged as host stalls (no launch for most of the step): "
                     "their launch-free stretch counts as host time, not as the step's work")
    if np.isin(st.phase, _MIXED_PHASES).any():
        notes.append("mixed steps (prefill and decode in one forward): their decode part is the median pure decode "
                     "step at their batch, the rest other requests' prefill")
    gauges = _of_run(report.gauges, run) if "run" in report.gauges.columns else report.gauges
    queue_est = _gauge_queue(req, gauges) if source == "gauges" else None
    rows, gap_rows, seg_rows = [], [], []
    worst = 0.0
    for r in req.itertuples(index=False):
        tok = np.asarray(_json_list(getattr(r, "token_times_s", "[]")), float)
        if not len(tok) or not math.isfinite(float(r.arrival_s)):
            continue
        rid = int(r.request_id)
        parts, pieces = _request_pieces(r, tok, st, members.get(rid), source,
                                        queue_est.get(rid, ([], [])) if queue_est is not None else None)
        seg_rows += pieces
        row, gaps, err = _request_rows(rid, float(r.arrival_s), tok, parts)
        rows.append(row)
        gap_rows += gaps
        worst = max(worst, err)
    cols = ["request_id", "output_tokens", "ttft_s", "e2e_s", "tpot_s",
            *(f"{m_}_{p}_s" for m_ in ("ttft", "e2e", "tpot") for p in PARTS)]
    unmeasured = _unmeasured(source)
    if source == "gauges":
        notes.append("only the server's gauges (--metrics, no --profile): queued time is estimated from "
                     "requests_waiting (first come, first served among the requests sent and without a first token); "
                     f"{', '.join(unmeasured)} need the server's steps (--profile)")
    elif source == "none":
        notes.append("no server steps nor gauges: the latencies are measured, their causes are not "
                     "(--profile puts the server's steps beside the requests; --metrics its gauges)")
    return RunSplit(run or "", source, pd.DataFrame(rows, columns=cols),
                    pd.DataFrame(gap_rows, columns=["request_id", "gap", "itl_s", "start_s", "end_s",
                                                    *(f"{p}_s" for p in PARTS)]),
                    pd.DataFrame(seg_rows, columns=["request_id", "gap", "part", "seconds", "start_s", "end_s", "step"]),
                    steps, tuple(notes), 100.0 * worst, unmeasured)


def _request_pieces(r: Any, tok: np.ndarray, st: _Steps, member: dict[int, tuple[str, int]] | None, source: str,
                    queue_est: tuple[list[float], list[tuple[float, float]]] | None
                    ) -> tuple[np.ndarray, list[tuple[int, int, str, float, float, float, int]]]:
    """One request's time cut into pieces, each given its part: the parts per token gap ([tokens, PARTS]:
    row 0 the TTFT, row k the gap before token k+1) and the pieces (request, gap, part, seconds, start,
    end, step position)."""
    rid, a, end = int(r.request_id), float(r.arrival_s), float(tok[-1])
    considered = float(getattr(r, "considered_s", math.nan))
    admitted = float(getattr(r, "admitted_s", math.nan))
    pre_s = _json_list(getattr(r, "preempted_s", "[]"))
    re_s = _json_list(getattr(r, "readmitted_s", "[]"))
    cuts = [a, end, *tok.tolist(), *pre_s, *re_s, *(x for x in (considered, admitted) if math.isfinite(x))]
    lo_i, hi_i = int(np.searchsorted(st.s1, a, side="left")), int(np.searchsorted(st.s0, end, side="right"))
    near = np.arange(max(lo_i - 1, 0), min(hi_i + 1, len(st.s0)))
    cuts += st.s0[near].tolist() + st.s1[near].tolist()
    if queue_est is not None:
        cuts += queue_est[0]
    c = np.unique(np.clip(np.asarray(cuts, float), a, end))
    u, v = c[:-1][c[1:] > c[:-1]], c[1:][c[1:] > c[:-1]]
    m = (u + v) / 2
    gap = np.minimum(np.searchsorted(tok, m, side="right"), len(tok) - 1)  # 0: before the first token
    at = np.searchsorted(st.s0, m, side="right") - 1
    inside = (at >= 0) & (m < st.s1[np.maximum(at, 0)]) if len(st.s0) else np.zeros(len(m), bool)
    preempted = np.zeros(len(m), bool)
    for j, p in enumerate(pre_s):
        preempted |= (m >= p) & (m < (re_s[j] if j < len(re_s) else math.inf))
    queued = np.zeros(len(m), bool)
    if queue_est is not None:
        for s_, e_ in queue_est[1]:
            queued |= (m >= s_) & (m < e_)
    elif math.isfinite(considered) and math.isfinite(admitted):
        queued = (m >= considered) & (m < admitted)
    join = _join_for(member, tok, a, st, near, source)
    covered = st.covered
    parts = np.zeros((len(tok), len(PARTS)))
    pieces = []
    for k in range(len(m)):
        d, g, step = float(v[k] - u[k]), int(gap[k]), int(at[k]) if inside[k] else -1
        split: list[tuple[int, float, int]]  # (part, seconds, step)
        if preempted[k]:  # out of the engine: whatever ran meanwhile was not its work
            split = [(_P["preemption"], d, -1)]
        elif queued[k]:
            split = [(_P["queued"], d, -1)]
        elif source in ("gauges", "none"):
            split = [(_P["unmeasured"], d, -1)]
        elif step < 0:
            # the engine's log covers its whole run; a server's profile only its window
            outside = source != "scheduler" and (covered is None or m[k] < covered[0] - EDGE_S
                                                 or m[k] > covered[1] + EDGE_S)
            split = [(_P["unmeasured" if outside else "host"], d, -1)]
        else:
            work = 1.0 - float(st.stall[step])
            split = [(_P["host"], d * (1.0 - work), step)] if work < 1.0 else []
            split += [(part, d * share * work, step) for part, share in _classify(step, g, join, st) if share > 0]
        for part, sec, at_step in split:
            parts[g, part] += sec
            pieces.append((rid, g, PARTS[part], sec, float(u[k]), float(v[k]), at_step))
    return parts, pieces


def _request_rows(rid: int, arrival: float, tok: np.ndarray, parts: np.ndarray
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """A request's row (TTFT, E2E, TPOT and their parts), its gaps' rows, and the largest relative gap
    between parts and measured latency."""
    n, end = len(tok), float(tok[-1])
    ttft, e2e = float(tok[0] - arrival), end - arrival
    ttft_p, e2e_p = parts[0], parts.sum(axis=0)
    tpot_p = parts[1:].sum(axis=0) / (n - 1) if n > 1 else np.full(len(PARTS), math.nan)
    row: dict[str, Any] = {"request_id": rid, "output_tokens": n, "ttft_s": ttft, "e2e_s": e2e,
                           "tpot_s": (end - float(tok[0])) / (n - 1) if n > 1 else math.nan}
    for p, name in enumerate(PARTS):
        row[f"ttft_{name}_s"], row[f"e2e_{name}_s"], row[f"tpot_{name}_s"] = ttft_p[p], e2e_p[p], tpot_p[p]
    worst = max(_err(ttft_p.sum(), ttft), _err(e2e_p.sum(), e2e))
    itl = np.diff(tok)
    gaps = []
    for g in range(1, n):
        gaps.append({"request_id": rid, "gap": g, "itl_s": float(itl[g - 1]), "start_s": float(tok[g - 1]),
                     "end_s": float(tok[g]), **{f"{name}_s": parts[g, p] for p, name in enumerate(PARTS)}})
        worst = max(worst, _err(parts[g].sum(), float(itl[g - 1])))
    return row, gaps, worst


def _err(parts: float, value: float) -> float:
    return abs(parts - value) / value if value > 0 else 0.0


def _unmeasured(source: str) -> tuple[str, ...]:
    if source == "gauges":
        return ("prefill", "head_of_line", "decode", "prefill_stall", "preemption", "host")
    if source == "none":
        return tuple(p for p in PARTS if p != "unmeasured")
    if source == "steps by time":
        return ("queued", "preemption")
    return ()


def _join_for(member: dict[int, tuple[str, int]] | None, tok: np.ndarray, arrival: float, st: _Steps,
              near: np.ndarray, source: str) -> _Join:
    if member is not None:
        own = {p for p, (role, _) in member.items() if role == "prefill"}
        return _Join(member, own, {})
    if source not in ("steps by time", "server steps by request id") or not len(near):
        return _Join({}, set(), {})
    # by time: the last step with prefill work that ended before (or at) the first token, after the arrival
    cand = [int(p) for p in near if st.phase[p] in (*_PREFILL_PHASES, *_MIXED_PHASES)
            and st.s1[p] <= tok[0] + 1e-9 and st.s0[p] >= arrival - 1e-9]
    if not cand:
        return _Join({}, set(), {})
    p = max(cand, key=lambda q: st.s1[q])
    seqs = st.pre_seqs[p] if math.isfinite(st.pre_seqs[p]) and st.pre_seqs[p] > 0 else (
        st.batch[p] if st.phase[p] in _PREFILL_PHASES and math.isfinite(st.batch[p]) and st.batch[p] > 0 else 1.0)
    return _Join({}, {p}, {p: 1.0 / float(seqs)})


def _classify(step: int, gap: int, join: _Join, st: _Steps) -> list[tuple[int, float]]:
    """(part, share of the piece) for a piece of a request's time inside ``step``."""
    other = _P["head_of_line"] if gap == 0 else _P["prefill_stall"]
    ph = st.phase[step]
    role = join.member.get(step)
    if role is not None:
        kind, n = role
        if kind == "recompute":
            return [(_P["preemption"], 1.0)]
        if kind == "prefill":
            total = st.tokens[step] if math.isfinite(st.tokens[step]) and st.tokens[step] > 0 else float(n)
            own = min(1.0, n / total) if total > 0 else 1.0
            return [(_P["prefill"], own), (other, 1.0 - own)]
        if kind in ("decode", "done"):
            d = 1.0 if ph in _DECODE_PHASES else float(st.dec_share[step])
            return [(_P["decode"], d), (other, 1.0 - d)]
    if step in join.own_prefill:
        own = join.own_share.get(step, 1.0)
        if ph in _MIXED_PHASES:
            d = float(st.dec_share[step])
            return [(_P["prefill"], (1.0 - d) * own), (_P["decode"], d), (other, (1.0 - d) * (1.0 - own))]
        return [(_P["prefill"], own), (other, 1.0 - own)]
    if ph in _PREFILL_PHASES:
        return [(other, 1.0)]
    if ph in _DECODE_PHASES:
        return [(_P["decode"], 1.0)]
    if ph in _MIXED_PHASES:
        d = float(st.dec_share[step])
        return [(_P["decode"], d), (other, 1.0 - d)]
    return [(_P["host"], 1.0)]  # a step of no known phase (idle, draft, verify): not prefill nor decode work


def _gauge_queue(req: pd.DataFrame, gauges: pd.DataFrame) -> dict[int, tuple[list[float], list[tuple[float, float]]]]:
    """Per request, (cut points, queued intervals) estimated from ``requests_waiting``: at each moment the
    waiting ones are, first come first served, the latest-sent of the requests sent and without a first token."""
    w = gauges[gauges["metric"].astype(object) == "requests_waiting"][["t_s", "value"]].dropna().sort_values("t_s")
    if not len(w) or not len(req):
        return {}
    wt, wv = w["t_s"].to_numpy(float, na_value=np.nan), w["value"].to_numpy(float, na_value=np.nan)
    sent = req["arrival_s"].to_numpy(float, na_value=np.nan)
    first = req["first_token_s"].to_numpy(float, na_value=np.nan) if "first_token_s" in req.columns else np.full(len(req), np.nan)
    ids = req["request_id"].astype("int64").to_numpy()
    out: dict[int, tuple[list[float], list[tuple[float, float]]]] = {}
    for i in range(len(req)):
        a, f = sent[i], first[i]
        if not (math.isfinite(a) and math.isfinite(f)) or f <= a:
            continue
        pts = np.unique(np.concatenate([[a, f], wt[(wt > a) & (wt < f)], sent[(sent > a) & (sent < f)],
                                        first[(first > a) & (first < f)]]))
        intervals = []
        for x, y in itertools.pairwise(pts):
            mid = (x + y) / 2
            k = int(np.searchsorted(wt, mid, side="right")) - 1
            if k < 0:
                continue
            waiting = wv[k]
            later = int(((sent > a) & (sent <= mid) & ~(first <= mid)).sum())  # sent after it, still without a token
            if waiting >= later + 1:
                intervals.append((float(x), float(y)))
        out[int(ids[i])] = (pts.tolist(), intervals)
    return out


# ---------------------------------------------------------------------------- the summary
def splits(report: Report) -> list[RunSplit]:
    """Every run of a load test, split (computed once per Report)."""
    def build() -> list[RunSplit]:
        from .loadtest import is_loadtest

        if not len(report.requests) or not is_loadtest(report):
            return []
        return [split_run(report, run) for run in _runs(report)]
    return memo(report, "tails:splits", build)


def percentile_parts(values: np.ndarray, parts: np.ndarray, q: float) -> tuple[float, np.ndarray, list[tuple[int, float]]]:
    """``numpy.percentile(values, q)`` (linear) with the same interpolation of ``parts``' rows, and the
    (row, weight) pairs it is made of."""
    ok = np.isfinite(values)
    idx = np.flatnonzero(ok)
    if not len(idx):
        return math.nan, np.full(parts.shape[1], math.nan), []
    order = idx[np.argsort(values[idx], kind="stable")]
    h = (len(order) - 1) * q / 100.0
    lo, hi = math.floor(h), math.ceil(h)
    f = h - lo
    a, b = order[lo], order[hi]
    value = float(values[a] + f * (values[b] - values[a]))
    mix = (1.0 - f) * np.nan_to_num(parts[a]) + f * np.nan_to_num(parts[b])
    made = [(int(a), 1.0 - f)] if lo == hi or f == 0 else [(int(a), 1.0 - f), (int(b), f)]
    return value, mix, made


def entry(split: RunSplit, metric: str, q: float) -> dict[str, Any]:
    """One percentile of one metric: ``value_s``, ``parts`` (seconds, adding up to it) and ``from``."""
    values, parts, rows = split.values(metric)
    value, mix, made = percentile_parts(values, parts, q)
    # the parts this join measures (unmeasured ones are not shown as 0), and the time it could not place
    out_parts = {p: float(mix[i]) for i, p in enumerate(PARTS) if p not in split.unmeasured
                 and (p != "unmeasured" or mix[i] > 0 or split.source in ("gauges", "none"))}
    src = []
    for pos, w in made:
        item: dict[str, Any] = {"request_id": int(rows["request_id"].iloc[pos]), "weight": round(float(w), 6)}
        if metric == "itl":
            item["gap"] = int(rows["gap"].iloc[pos])
        src.append(item)
    return {"value_s": value, "parts": out_parts, "from": src}


def run_tails(split: RunSplit) -> dict[str, Any]:
    """One run's ``tails`` entry: for each metric the p50 and p99 with their parts."""
    out: dict[str, Any] = {"run": split.run or None, "source": split.source, "requests": len(split.requests),
                           "gaps": len(split.gaps)}
    for metric in METRICS:
        out[metric] = {name: entry(split, metric, q) for name, q in QUANTILES}
    out["additivity_max_error_pct"] = split.additivity_error_pct
    out["unmeasured"] = list(split.unmeasured)
    out["notes"] = list(split.notes)
    return out


def tails_payload(report: Report) -> dict[str, Any] | None:
    """The ``tails`` section of ``--json``: one run's entry flat, several as ``runs``; None for a report
    without load-test requests."""
    found = splits(report)
    if not found:
        return None
    entries = [run_tails(s) for s in found]
    return entries[0] if len(entries) == 1 else {"runs": entries}


def tails_table(report: Report) -> pd.DataFrame:
    """One row per run, metric and percentile: ``value_s`` and ``<part>_s`` (missing where not measured),
    the table the HTML report and the dashboard show."""
    rows = []
    for split in splits(report):
        for metric in METRICS:
            for q, v in QUANTILES:
                e = entry(split, metric, v)
                rows.append({"run": split.run or None, "metric": metric, "percentile": q, "value_s": e["value_s"],
                             **{f"{p}_s": e["parts"].get(p, math.nan) for p in PARTS}, "joined_by": split.source})
    df = pd.DataFrame(rows)
    return df.dropna(axis=1, how="all") if len(df) else df


COMPARE_SAME_PCT = 10.0
"""A part of the p99 that moved by less than 10% of the p99 (of the larger run) is about the same:
tails move more from run to run than totals do."""


def compare_tails(a: Report, b: Report) -> pd.DataFrame:
    """How each part of the p99 moved from load test ``a`` to ``b`` (their first runs; a sweep's runs are
    compared one to one in order): one row per run pair, metric and part (``value`` first), with the
    seconds in A and B and the change."""
    sa, sb = splits(a), splits(b)
    rows = []
    for x, y in zip(sa, sb):
        for metric in METRICS:
            ea, eb = entry(x, metric, 99.0), entry(y, metric, 99.0)
            pairs = [("value", ea["value_s"], eb["value_s"])]
            for p in PARTS:  # the parts either run has (a part at 0 in both is left out)
                va, vb = ea["parts"].get(p, math.nan), eb["parts"].get(p, math.nan)
                if (p in ea["parts"] or p in eb["parts"]) and (va > 0 or vb > 0):
                    pairs.append((p, va, vb))
            for part, va, vb in pairs:
                rows.append({"run_a": x.run or None, "run_b": y.run or None, "metric": metric, "part": part,
                             "p99_a_s": va, "p99_b_s": vb, "change_s": vb - va})
    return pd.DataFrame(rows, columns=["run_a", "run_b", "metric", "part", "p99_a_s", "p99_b_s", "change_s"])


def tails_verdict(table: pd.DataFrame) -> list[str]:
    """Sentences on the p99s that moved and the part that moved them most (:func:`compare_tails`)."""
    out = []
    for (run_a, run_b, metric), g in table.groupby(["run_a", "run_b", "metric"], sort=False, dropna=False):
        v = g[g["part"] == "value"].iloc[0]
        a_, b_ = float(v["p99_a_s"]), float(v["p99_b_s"])
        if not (math.isfinite(a_) and math.isfinite(b_)) or max(a_, b_) <= 0:
            continue
        parts = g[(g["part"] != "value") & g["change_s"].notna()]
        if not len(parts):
            continue
        big = parts.loc[parts["change_s"].abs().idxmax()]
        if abs(float(big["change_s"])) < COMPARE_SAME_PCT / 100 * max(a_, b_):
            continue
        where = f" ({run_a} -> {run_b})" if isinstance(run_a, str) and isinstance(run_b, str) and run_a != run_b else ""
        out.append(f"p99 {metric.upper()}{where} {a_ * 1e3:.3g} -> {b_ * 1e3:.3g} ms: "
                   f"{PART_WORDS[str(big['part'])]} {float(big['p99_a_s']) * 1e3:.3g} -> "
                   f"{float(big['p99_b_s']) * 1e3:.3g} ms moved most")
    return out


def growth(split: RunSplit, metric: str) -> dict[str, float]:
    """Each part's seconds at the p99 minus at the p50 of ``metric`` (they sum to the p99 excess)."""
    lo, hi = entry(split, metric, 50.0), entry(split, metric, 99.0)
    return {p: hi["parts"].get(p, 0.0) - lo["parts"].get(p, 0.0) for p in PARTS if p in hi["parts"] or p in lo["parts"]}


def step_families(report: Report, split: RunSplit) -> pd.DataFrame:
    """Kernel time (ns) by category (the kernel's family: gemm, attention, ...) of each of the run's steps:
    one row per step position (:attr:`RunSplit.steps` ``pos``), one column per category; the kernels
    are those launched within the step's window on the trace (empty without kernels)."""
    def build() -> pd.DataFrame:
        from ..steps import launch_times_ns, step_of

        k, st = report.kernels, split.steps
        if not len(k) or not len(st) or not {"start_ns", "end_ns"} <= set(st.columns):
            return pd.DataFrame(index=pd.Index([], name="pos"))
        win = st[["start_ns", "end_ns", "pos"]].dropna()
        win = win.astype("int64").sort_values("start_ns", kind="stable").reset_index(drop=True)
        at = step_of(launch_times_ns(k, report.api), win)
        hit = at >= 0
        cat = (k["category"].astype(object).fillna("other").to_numpy() if "category" in k.columns
               else np.full(len(k), "other", dtype=object))[hit]
        pos = win["pos"].to_numpy()[at[hit]]
        frame = pd.DataFrame({"pos": pos, "category": cat, "ns": k["duration_ns"].to_numpy(float, na_value=np.nan)[hit]})
        return frame.pivot_table(index="pos", columns="category", values="ns", aggfunc="sum", fill_value=0.0)
    return memo(report, f"tails:families:{split.run}", build)


def request_timeline(split: RunSplit, request_id: int) -> pd.DataFrame:
    """One request's pieces in time order with the step each lies in (its phase, batch, tokens, and
    the request's role there): the dashboard's request view and the Perfetto export's request lanes."""
    seg = split.segments[split.segments["request_id"] == request_id].copy()
    if not len(seg):
        return seg
    st = split.steps
    cols = [c for c in ("step", "phase", "batch", "tokens", "prefill_tokens", "decode_seqs", "start_ns", "end_ns")
            if c in st.columns]
    pos = seg["step"].to_numpy()
    for c in cols:
        vals = st[c].to_numpy(dtype=object)
        seg[f"step_{c}" if c != "step" else "step_id"] = [vals[p] if p >= 0 else None for p in pos]
    return seg.sort_values(["start_s", "part"], kind="stable").reset_index(drop=True)


__all__ = [
    "METRICS",
    "PARTS",
    "PART_WORDS",
    "SOURCES",
    "RunSplit",
    "compare_tails",
    "entry",
    "growth",
    "percentile_parts",
    "request_timeline",
    "run_steps",
    "run_tails",
    "split_run",
    "splits",
    "step_families",
    "tails_payload",
    "tails_table",
    "tails_verdict",
]
