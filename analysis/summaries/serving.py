"""Serving metrics (vLLM's definitions) and per-phase speed-of-light figures.

- TTFT: request arrival to its first token; TPOT: (E2E − TTFT) / (output tokens − 1), excluding
  the first token; ITL: gaps between consecutive tokens; E2E: arrival to last token.
- Throughput: system (output tokens / makespan), user (1 / TPOT).
- Per phase (prefill, decode): wall time from the engine's steps, MFU = achieved FLOP/s ÷ the
  compute roof of the phase's dominant precision, MBU = bytes per second ÷ the DRAM roof. For
  engine reports FLOPs and bytes are the model's, from its steps (matmuls and attention, analytic;
  weights + KV cache read: ``mfu_source`` / ``mbu_source = "model"``); otherwise the kernels'
  (``"kernels"``): their FLOPs (bytes) are left missing, not summed from part of them, when kernels
  with a FLOP (byte) count cover under :data:`FLOPS_MIN_COVERAGE` of the phase's kernel time (the
  steps' rule, :mod:`..steps`).

Headline and profiled: an engine report holds two runs of one workload. The headline figures
(``profiled=False``, the default) come from the warm unprofiled run (``steps_unprofiled``,
``requests_unprofiled``): its wall times, with the FLOPs of the profiled run's kernels (the same
work). ``profiled=True`` gives the profiled run's figures, inflated by the profiler's per-launch
cost. Reports without an unprofiled run (imports, older reports) give the same figures both ways;
the ``timing`` column says which run a row's times come from.
"""

from __future__ import annotations

import operator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.schema import value_mask

from ..steps import (
    FLOPS_MIN_COVERAGE,
    RECORDED_FRAMEWORKS,
    has_framework_steps,
    headline_steps,
    step_windows,
)
from ..tree import PHASES

if TYPE_CHECKING:
    from perfscope.report import Report

SUMMARY_PHASES = ("prefill", "decode", "mixed", *PHASES[2:])
"""Phases of the phase table, in order: ``mixed`` is a step with prefill and decode tokens
(chunked prefill riding with decodes), a phase of framework steps only."""

PHASE_COLUMNS = ["phase", "steps", "tokens", "wall_s", "kernel_time_s", "flops", "dram_bytes",
                 "model_flops", "model_bytes", "achieved_flops_per_s", "achieved_bytes_per_s", "tokens_per_s",
                 "precision", "mfu", "mbu", "mfu_source", "mbu_source", "timing",
                 "prefill_tokens", "decode_tokens", "outlier_steps", "framework", "wall_share_pct"]
"""Columns of :func:`phase_summary`. The last four are framework steps' (vLLM, SGLang, ...; missing
on engine reports): a mixed row's prefill and decode tokens, the steps kept out as outliers, and
who marked the steps. ``wall_share_pct``: the phase's share of the phases' summed wall time (a
speculative run's draft and verify shares)."""


def has_unprofiled(report: Report) -> bool:
    """True when the report holds a warm unprofiled run (the headline) beside the profiled one."""
    return bool(len(report.steps_unprofiled) or len(report.requests_unprofiled))


def run_steps(report: Report, *, profiled: bool = False) -> pd.DataFrame:
    """The engine steps of the headline run (unprofiled when recorded) or of the profiled run."""
    return report.steps if profiled or not len(report.steps_unprofiled) else report.steps_unprofiled


def run_requests(report: Report, *, profiled: bool = False) -> pd.DataFrame:
    """The requests of the headline run (unprofiled when recorded) or of the profiled run."""
    return report.requests if profiled or not len(report.requests_unprofiled) else report.requests_unprofiled


def _dominant_precision(kernels: pd.DataFrame) -> str | None:
    k = kernels.loc[kernels["precision"].notna() & kernels["flops"].notna(), ["precision", "flops"]]
    if not len(k):
        return None
    return str(k.groupby("precision")["flops"].sum().idxmax())


def _phase_wall_s(report: Report, phase: str, kernels: pd.DataFrame,
                  all_steps: pd.DataFrame) -> tuple[float, int, float]:
    """Wall time, steps and tokens of a phase; tokens are NaN (unknown, not 0) without engine steps.

    Framework steps read from a trace (not those timed in-process, :data:`RECORDED_FRAMEWORKS`,
    whose headline steps come from an unprofiled run) take the wall time of their windows
    (:func:`.framework_steps.step_windows`):
    from each step's start to its end or its last kernel's, whichever is later (CUDA-graph replays
    run after the CPU range closes), the first step's lead before its first kernel left out."""
    steps = all_steps[all_steps["phase"] == phase]
    if len(steps):
        tokens = pd.to_numeric(steps["tokens"], errors="coerce")
        n_tokens: float = (int(tokens.sum()) if tokens.notna().all()  # engine steps: an int, as before
                           else float(tokens.sum()) if tokens.notna().any() else float("nan"))
        if has_framework_steps(steps) and not steps["framework"].isin(RECORDED_FRAMEWORKS).all():
            ws, we = step_windows(steps, report.kernels)
            return float((we - ws).sum()) / 1e9, len(steps), n_tokens
        return float(steps["duration_ns"].sum()) / 1e9, len(steps), n_tokens
    ranges = report.ranges[report.ranges["name"] == phase]
    if len(ranges):
        return float((ranges["end_ns"] - ranges["start_ns"]).sum()) / 1e9, len(ranges), float("nan")
    if len(kernels):
        return float(kernels["end_ns"].max() - kernels["start_ns"].min()) / 1e9, 0, float("nan")
    return float("nan"), 0, float("nan")


WALL_RATES = ("tokens_per_s", "achieved_flops_per_s", "achieved_bytes_per_s", "mfu", "mbu")
"""The phase row's rates over its steps' wall time: missing when every step of the phase is an outlier."""


def _headline(steps: pd.DataFrame, phase: str) -> tuple[pd.DataFrame, int]:
    """A phase's steps without its outliers (all of them when every one is an outlier: the row
    then shows their times, no rate, and ``outlier_steps`` says so), and the number left out."""
    ph = steps[steps["phase"] == phase]
    head = headline_steps(ph)
    if not len(head):
        return ph, 0
    return head, len(ph) - len(head)


def phase_summary(report: Report, *, profiled: bool = False) -> pd.DataFrame:
    """One row per phase present (prefill, decode; ``all`` when the report has no phases).

    Times from the headline (warm unprofiled) run unless ``profiled``; see the module docstring.
    """
    kernels = report.kernels
    # the columns a phase row reads (copying the text columns of 1M rows per phase costs seconds)
    k = kernels[["start_ns", "end_ns", "duration_ns", "flops", "dram_bytes", "precision"]]
    steps = run_steps(report, profiled=profiled)
    timing = "unprofiled" if steps is report.steps_unprofiled and len(steps) else "profiled"
    framework = has_framework_steps(steps)
    in_phase = {p: value_mask(kernels, "phase", partial(operator.eq, p)) for p in SUMMARY_PHASES}
    phases = [p for p in SUMMARY_PHASES if in_phase[p].any() or (steps["phase"] == p).any()]
    if not phases and framework:  # steps that name no phase: one row over them and their kernels
        steps, phases = steps.assign(phase="all"), ["all"]
        in_phase["all"] = kernels["step"].isin(steps["step"]).to_numpy(bool)
    rows = []
    for p in phases:
        if not framework:
            rows.append(_phase_row(report, p, k[in_phase[p]], steps))
            continue
        head, dropped = _headline(steps, p)
        mask = in_phase[p]
        if dropped:  # the outliers' kernels leave with them
            out_ids = steps.loc[(steps["phase"] == p) & steps["outlier"].notna(), "step"].to_numpy()
            mask = mask & ~kernels["step"].isin(out_ids).to_numpy(bool)
        row = _phase_row(report, p, k[mask], head)
        kept_outliers = int(head["outlier"].notna().sum())  # > 0 only when every step of the phase is one
        if kept_outliers:  # a stalled or cold step's wall time is not the model's: no rate from it
            row.update({c: float("nan") for c in WALL_RATES})
        row.update(_token_split(head), outlier_steps=dropped + kept_outliers,
                   framework=", ".join(sorted(set(head["framework"].dropna().astype(str)))) or None)
        rows.append(row)
    if not phases:
        rows = [_phase_row(report, "all", k, steps)]
    total = sum(float(r["wall_s"]) for r in rows if pd.notna(r["wall_s"]) and r["phase"] != "all")
    for r in rows:
        r["timing"] = timing
        r["wall_share_pct"] = 100.0 * float(r["wall_s"]) / total if total > 0 and pd.notna(r["wall_s"]) \
            and r["phase"] != "all" else float("nan")
    return pd.DataFrame(rows, columns=PHASE_COLUMNS)


def phase_notes(table: pd.DataFrame) -> list[str]:
    """Why a row of :func:`phase_summary` has no rates, no MFU or no MBU, one line per reason (empty
    when every number is there): every step of the phase an outlier, or FLOPs (bytes) known for too
    little of its kernel time."""
    notes = []
    both = "timing" in table and table["timing"].nunique() > 1  # the headline run's rows and the profiled run's
    for _, r in table.iterrows():
        label = f"{r['phase']}" + (f" ({r['timing']})" if both else "")
        out, steps = r.get("outlier_steps"), r.get("steps")
        if pd.notna(out) and pd.notna(steps) and int(steps) > 0 and int(out) >= int(steps):
            notes.append(f"{label}: every step is an outlier ({int(out)} of {int(steps)}; see the step-outliers "
                         "finding), so its tok/s, FLOP/s, bytes/s, MFU and MBU are n/a")
            continue
        timed = float(r["kernel_time_s"] or 0) > 0
        if pd.isna(r["flops"]) and timed and r["mfu_source"] == "kernels":
            notes.append(f"{label}: MFU n/a: kernel FLOPs are known for under {100 * FLOPS_MIN_COVERAGE:.0f}% "
                         "of its kernel time (collectives have none; other kernels need recorded shapes)")
        if pd.isna(r["dram_bytes"]) and timed and r["mbu_source"] == "kernels":
            notes.append(f"{label}: bytes/s and MBU n/a: kernel bytes are known for under "
                         f"{100 * FLOPS_MIN_COVERAGE:.0f}% of its kernel time (they need recorded shapes or "
                         "measured counters)")
    return notes


def _token_split(steps: pd.DataFrame) -> dict[str, float]:
    """Prefill and decode tokens of framework steps (a mixed step has both): prefill tokens from the
    label, decode tokens the rest of its tokens (else one per decoding sequence); NaN when unknown."""
    pre = pd.to_numeric(steps["prefill_tokens"], errors="coerce")
    tok = pd.to_numeric(steps["tokens"], errors="coerce")
    seqs = pd.to_numeric(steps["decode_seqs"], errors="coerce")
    dec = (tok - pre).where(tok.notna() & pre.notna(), seqs)
    return {"prefill_tokens": float(pre.sum()) if pre.notna().any() else float("nan"),
            "decode_tokens": float(dec.sum()) if dec.notna().any() else float("nan")}


def _phase_row(report: Report, phase: str, k: pd.DataFrame, all_steps: pd.DataFrame) -> dict[str, Any]:
    device = report.device
    wall_s, n_steps, tokens = _phase_wall_s(report, phase, k, all_steps)
    if phase == "all" and not n_steps:
        wall_s = float(k["end_ns"].max() - k["start_ns"].min()) / 1e9 if len(k) else float("nan")
    # a partial sum would understate the phase's FLOPs (bytes) without saying so: missing instead
    flops = _covered_sum(k, "flops")
    nbytes = _covered_sum(k, "dram_bytes")
    steps = all_steps[all_steps["phase"] == phase]
    model_bytes = float((steps["weight_bytes"] + steps["kv_cache_bytes"]).sum(min_count=1)) if len(steps) else float("nan")
    model_flops = _model_flops(steps)
    precision = _dominant_precision(k) if len(k) else None
    peak = device.peak_flops(precision) if device else None
    bw = device.peak_bandwidth("dram") if device else None
    use_model_flops = not np.isnan(model_flops)
    achieved_f = (model_flops if use_model_flops else flops) / wall_s if wall_s and wall_s > 0 else float("nan")
    use_model = not np.isnan(model_bytes)
    moved = model_bytes if use_model else nbytes
    achieved_b = moved / wall_s if wall_s and wall_s > 0 else float("nan")
    return {
        "phase": phase, "steps": n_steps, "tokens": tokens, "wall_s": wall_s,
        "kernel_time_s": float(k["duration_ns"].sum()) / 1e9 if len(k) else 0.0,
        "flops": flops, "dram_bytes": nbytes, "model_flops": model_flops, "model_bytes": model_bytes,
        "achieved_flops_per_s": achieved_f, "achieved_bytes_per_s": achieved_b,
        "tokens_per_s": tokens / wall_s if tokens and wall_s > 0 else float("nan"),
        "precision": precision,
        "mfu": achieved_f / peak if peak else float("nan"),
        "mbu": achieved_b / bw if bw else float("nan"),
        "mfu_source": "model" if use_model_flops else "kernels",
        "mbu_source": "model" if use_model else "kernels",
    }


def _model_flops(steps: pd.DataFrame) -> float:
    """The phase's model FLOPs from its engine steps; NaN unless every step has them (older
    reports, imports, speculative steps have none)."""
    if not len(steps) or "flops" not in steps:
        return float("nan")
    values = pd.to_numeric(steps["flops"], errors="coerce")
    return float(values.sum()) if values.notna().all() else float("nan")


def flops_coverage(k: pd.DataFrame, column: str = "flops") -> float:
    """Share of the kernel time of ``k`` spent in kernels whose FLOPs (``column``: bytes) are known
    (NaN without time)."""
    dur = k["duration_ns"].to_numpy("float64", na_value=np.nan)
    total = float(np.nansum(dur))
    if not total > 0:
        return float("nan")
    return float(np.nansum(dur[k[column].notna().to_numpy()])) / total


def _covered_sum(k: pd.DataFrame, column: str) -> float:
    """The sum of ``column`` over ``k``; NaN without rows, or when the kernels that have it cover under
    :data:`FLOPS_MIN_COVERAGE` of the kernel time (every kernel has ``0`` time: the rows' sum)."""
    if not len(k):
        return float("nan")
    share = flops_coverage(k, column)
    if share < FLOPS_MIN_COVERAGE:
        return float("nan")
    return float(k[column].sum(min_count=1))


STATS = ("p50", "p90", "p99", "mean")


def stats(values: Any) -> dict[str, float]:
    """p50, p90, p99 (linear interpolation) and mean of ``values``, missing ones dropped (NaN when
    none is left)."""
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce"), dtype=float)
    v = v[~np.isnan(v)]
    if not len(v):
        return {k: float("nan") for k in STATS}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(v.mean())}


def _stats(values: pd.Series, prefix: str) -> dict[str, float]:
    """``{prefix}_mean``, ``_p50`` and ``_p99`` of :func:`stats`."""
    s = stats(values)
    return {f"{prefix}_{k}": s[k] for k in ("mean", "p50", "p99")}


def prompt_token_total(requests: pd.DataFrame) -> tuple[int | None, int]:
    """The prompt tokens of ``requests`` summed over the rows that know theirs, and how many do not
    (an endpoint's text prompt without usage nor tokenizer); the sum is None when no row knows it
    (0 for no rows)."""
    if "prompt_tokens" not in requests.columns:
        return (None if len(requests) else 0), len(requests)
    counts = pd.to_numeric(requests["prompt_tokens"], errors="coerce")
    unknown = int(counts.isna().sum())
    if len(requests) and unknown == len(requests):
        return None, unknown
    return int(counts.sum()), unknown


def request_summary(report: Report, *, profiled: bool = False) -> dict[str, float]:
    """TTFT/TPOT/ITL/E2E statistics and throughputs over the report's requests (empty: {}).

    The headline (warm unprofiled) run's requests unless ``profiled``."""
    r = run_requests(report, profiled=profiled)
    if not len(r):
        return {}
    prompt, unknown = prompt_token_total(r)
    out: dict[str, float] = {"requests": float(len(r)),
                             "output_tokens": float(r["output_tokens"].sum()),
                             "prompt_tokens": float("nan") if prompt is None else float(prompt)}
    if unknown:
        out["prompt_tokens_unknown"] = float(unknown)
    if "prompt_padded_tokens" in r.columns and r["prompt_padded_tokens"].notna().any():
        padded = pd.to_numeric(r["prompt_padded_tokens"], errors="coerce")
        real = pd.to_numeric(r["prompt_tokens"], errors="coerce")
        out["prompt_padding_tokens"] = float((padded - real)[padded.notna()].sum())
    out.update(_stats(r["ttft_s"], "ttft_s"))
    out.update(_stats(r["tpot_s"], "tpot_s"))
    out.update(_stats(r["e2e_s"], "e2e_s"))
    out.update(_stats(r["itl_mean_s"], "itl_s"))
    # load tests (requests arrive over time) end at their last token's time from the run's start
    ends = r["end_s"] if "end_s" in r.columns and r["end_s"].notna().any() else r["e2e_s"]
    makespan = float(ends.max())
    out["throughput_tokens_per_s"] = out["output_tokens"] / makespan if makespan > 0 else float("nan")
    tpot = out["tpot_s_mean"]
    out["user_tokens_per_s"] = 1.0 / tpot if tpot and tpot > 0 else float("nan")
    return out


CLIENT_RESULTS = (("completed", "requests completed", None), ("num_prompts", "requests sent", None),
                  ("request_rate", "request rate (per s)", None), ("duration", "duration", 1e9),
                  ("request_throughput", "requests per s", None), ("output_throughput", "output tokens per s", None),
                  ("median_ttft_ms", "TTFT median", 1e6), ("p99_ttft_ms", "TTFT p99", 1e6),
                  ("median_tpot_ms", "TPOT median", 1e6), ("p99_tpot_ms", "TPOT p99", 1e6),
                  ("median_itl_ms", "ITL median", 1e6), ("p99_itl_ms", "ITL p99", 1e6))
"""Keys of a benchmark client's result JSON (vLLM's ``benchmark_serving``) shown, their labels, and the scale of
a duration to ns (None: a count or a rate, shown as it is)."""


CLIENT_RESULTS_TITLE = "The benchmark client's results (as it reported them)"
"""The heading every output puts over :func:`client_results`."""


def client_results(report: Report) -> list[tuple[str, str]]:
    """The benchmark client's own results a report was imported with (``params.client_results``: the serving
    run's result JSON beside its saved ``/metrics``), labelled and formatted; quoted as the client reported them,
    never recomputed. Empty when there are none."""
    from perfscope.format import duration, finite

    got = (report.manifest.get("params") or {}).get("client_results") or {}
    out = []
    for key, label, to_ns in CLIENT_RESULTS:
        v = got.get(key)
        if isinstance(v, str) and to_ns is None:
            out.append((label, v))
        elif (x := finite(v)) is not None:
            out.append((label, duration(x * to_ns) if to_ns else f"{x:,.4g}"))
    return out
