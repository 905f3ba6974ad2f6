"""What a KV-cache policy (``--kv-policy``, docs/kv-policies.md) bought in an engine run, measured.

:func:`decode_kv` reads one run's decode steps: the KV entries one sequence's attention read per
step (``kv_entries``), the K/V bytes per step, the step time (headline run), the time of the decode
attention kernels per step (profiled run: every operator inside the cache's ``kv_policy`` range, or,
with the full cache, the attention operator and the cache writes of each ``attn`` range) and decode
MBU. :func:`kv_policy_summary` sets a policy run's figures beside the full cache's: measured in the
same session (``params["kv_policy_reference"]``, :func:`perfscope.sessions.profile.profile_engine`),
the full cache's bytes from the engine's own formula, and the KV bytes per sequence and the
sequences that fit, counted by :mod:`perfscope.kv_policy` (the numbers ``capacity --kv-policy`` gives).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.kv_policy import KVPolicy, parse_kv_policy

from ..steps import headline_steps
from .serving import phase_summary, run_steps

if TYPE_CHECKING:
    from perfscope.report import Report

CACHE_WRITE_OPS = ("aten::index_copy_", "aten::index_put_", "aten::_index_put_impl_")
"""The full cache's writes of the new K/V (plain cache: ``index_copy_``; slot cache: ``index_put_``)."""


def attention_kernels(kernels: pd.DataFrame) -> pd.Series:
    """Which kernels (operators) are the decode attention's: inside a policy cache's ``kv_policy`` range,
    or, with the full cache, the attention operator and the cache writes directly inside an ``attn`` range."""
    if not len(kernels) or "range" not in kernels:
        return pd.Series(False, index=kernels.index)
    path = kernels["range"].astype("object").fillna("")
    policy = path.str.contains(r"(?:^|/)kv_policy(?:/|$)", regex=True)
    in_attn = path.str.contains(r"(?:^|/)attn$", regex=True)
    core = kernels["category"].astype("object").eq("attention") | kernels["op"].astype("object").isin(CACHE_WRITE_OPS)
    return policy | (in_attn & core)


def decode_kv(report: Report) -> dict[str, Any]:
    """One run's decode figures (NaN where the report does not hold them)."""
    steps = headline_steps(run_steps(report))
    dec = steps[steps["phase"] == "decode"] if len(steps) else steps
    out: dict[str, Any] = {"decode_steps": len(dec)}
    if not len(dec):
        return out
    entries = dec["kv_entries"] if "kv_entries" in dec and dec["kv_entries"].notna().any() else dec["context_len"]
    dur = dec["duration_ns"].astype(float)
    batch = pd.to_numeric(dec["batch"], errors="coerce").astype(float)
    out.update({
        "kv_entries_mean": float(pd.to_numeric(entries, errors="coerce").mean()),
        "kv_entries_last": float(pd.to_numeric(entries, errors="coerce").iloc[-1]),
        "context_len_last": float(pd.to_numeric(dec["context_len"], errors="coerce").iloc[-1]),
        "kv_bytes_per_step": float(pd.to_numeric(dec["kv_cache_bytes"], errors="coerce").mean()),
        "weight_bytes_per_step": float(pd.to_numeric(dec["weight_bytes"], errors="coerce").mean()),
        "step_ns": float(dur.median()),
        "ns_per_token": float((dur / batch).median()),
        "batch": float(batch.median()),
    })
    prof = report.steps[report.steps["phase"] == "decode"] if len(report.steps) else report.steps
    k = report.kernels
    if len(prof) and len(k):  # every profiled decode step's kernels (CPU operators carry no step number)
        attn = k[k["phase"].astype("object").eq("decode") & attention_kernels(k)]
        out["attention_ns_per_step"] = float(attn["duration_ns"].sum()) / len(prof) if len(attn) else math.nan
        out["profiled_step_ns"] = float(prof["duration_ns"].astype(float).median())
    table = phase_summary(report)
    row = table[table["phase"] == "decode"] if len(table) else table
    out["mbu"] = float(row["mbu"].iloc[0]) if len(row) else math.nan
    return out


def _policy(report: Report) -> KVPolicy:
    return parse_kv_policy(report.params.get("kv_policy"))


def kv_policy_summary(report: Report) -> dict[str, Any] | None:
    """A policy run's decode and memory figures beside the full cache's; None for a full-cache run."""
    policy = _policy(report)
    if policy.is_full:
        return None
    p = report.params
    own = decode_kv(report)
    ref = p.get("kv_policy_reference") or {}
    per_token = p.get("kv_cache_bytes_per_token")
    n_layer = p.get("n_layer")
    out: dict[str, Any] = {"policy": policy.text(), "kind": policy.kind, "policy_run": own,
                           "full_cache": dict(ref) if ref else None}
    steps = headline_steps(run_steps(report))
    dec = steps[steps["phase"] == "decode"] if len(steps) else steps
    if per_token and len(dec):  # the full cache's K/V bytes at the same steps: the engine's own formula
        ctx = pd.to_numeric(dec["context_len"], errors="coerce").astype(float)
        rows = pd.to_numeric(dec["batch"], errors="coerce").astype(float)
        out["full_kv_bytes_per_step"] = float((ctx * rows).mean() * float(per_token))
        out["kv_bytes_saved_pct"] = 100.0 * (1.0 - own.get("kv_bytes_per_step", math.nan) / out["full_kv_bytes_per_step"])
    lens = [int(a) + int(p.get("gen_len") or p.get("max_new_tokens") or 0)
            for a in (p.get("prompt_lens") or [p.get("prompt_len") or 0])]
    longest = max(lens) if lens else 0
    if per_token and n_layer and longest > 0:
        per_layer = float(per_token) / float(n_layer)
        held = policy.held_bytes_per_sequence(longest, per_layer, int(n_layer))
        full = float(per_token) * longest
        out.update({"sequence_tokens": longest, "kv_bytes_per_sequence": held, "full_kv_bytes_per_sequence": full,
                    "sequences_fit_ratio": full / held if held > 0 else math.nan})
    if ref:
        for key in ("step_ns", "ns_per_token", "attention_ns_per_step"):
            a, b = own.get(key, math.nan), ref.get(key, math.nan)
            if math.isfinite(a) and math.isfinite(b) and a > 0:  # both measured
                out[f"{key}_speedup"] = b / a
    return out


def step_saving_ns(summary: dict[str, Any]) -> float:
    """Decode time per step the policy saved against the full cache (negative: it cost), NaN unknown."""
    ref = summary.get("full_cache") or {}
    own = summary.get("policy_run") or {}
    a, b = own.get("step_ns", math.nan), ref.get("step_ns", math.nan)
    return float(b - a) if np.isfinite(a) and np.isfinite(b) else math.nan


def kv_policy_line(report: Report) -> str | None:
    """One line for a (projected) policy run: KV read per decode step and held per sequence against the full
    cache, decode time per token against the reference's; None for a full-cache run."""
    from perfscope.format import nbytes

    s = kv_policy_summary(report)
    if s is None or not s["policy_run"].get("decode_steps"):
        return None
    own, ref = s["policy_run"], s.get("full_cache") or {}
    parts = [f"{s['policy']} reads {own.get('kv_entries_mean', math.nan):.0f} KV entries per sequence and layer "
             f"({nbytes(own.get('kv_bytes_per_step', math.nan))} vs {nbytes(s.get('full_kv_bytes_per_step', math.nan))} "
             "per decode step)"]
    if ref.get("ns_per_token"):
        parts.append(f"decode {own.get('ns_per_token', math.nan) / 1e6:.3g} vs {ref['ns_per_token'] / 1e6:.3g} ms per "
                     "token")
    if "sequences_fit_ratio" in s:
        parts.append(f"KV per {s['sequence_tokens']}-token sequence {nbytes(s['kv_bytes_per_sequence'])} vs "
                     f"{nbytes(s['full_kv_bytes_per_sequence'])}: {s['sequences_fit_ratio']:.1f}x the sequences fit")
    return "; ".join(parts)


__all__ = ["attention_kernels", "decode_kv", "kv_policy_line", "kv_policy_summary", "step_saving_ns"]
