"""Memory findings: the peak and what held it, how many sequences fit, and a TTFT rise tied to
the server's gauges (queueing, KV-cache saturation, preemptions)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from perfscope.format import nbytes

from ..summaries.memory import capacity_section, peaks
from ._base import Finding, Item
from .evidence import ITEMS_TOP

if TYPE_CHECKING:
    import pandas as pd

    from perfscope.report import Report

FRAGMENTATION_SHARE = 0.2
"""Reserved-but-unallocated above a fifth of the reserved bytes at the peak is worth a look
(``expandable_segments`` or fewer distinct sizes give it back)."""

TTFT_RISE = 2.0
"""TTFT of the last quarter of arrivals over the first quarter's (medians): a rise worth explaining."""
KV_SATURATED_PCT = 90.0
"""KV-cache usage at or above this is saturated: new requests wait for blocks (or preempt)."""


def memory_peak(report: Report) -> list[Finding]:
    out = []
    for p in peaks(report):
        cats = {k: v for k, v in p["by_category"].items() if k != "fragmentation" and v > 0}
        parts = ", ".join(f"{k} {nbytes(v)}" for k, v in sorted(cats.items(), key=lambda kv: -kv[1])[:4])
        where = " / ".join(str(x) for x in (p["op"], p["module"] or p["source"]) if isinstance(x, str) and x)
        evidence = {"peak_allocated_bytes": p["peak_allocated_bytes"], "t_ns": p["t_ns"],
                    **{f"{k}_bytes": v for k, v in p["by_category"].items()}}
        frag = p["by_category"].get("fragmentation")
        reserved = p["reserved_bytes"]
        title = f"{p['device']}: memory peaks at {nbytes(p['peak_allocated_bytes'])} allocated" + (
            f" ({where})" if where else "")
        advice = f"Held at the peak: {parts or 'unknown'}."
        severity = "info"
        if frag is not None and reserved and frag / reserved > FRAGMENTATION_SHARE:
            severity = "low"
            title += f"; {nbytes(frag)} reserved but unallocated ({100 * frag / reserved:.0f}% of reserved)"
            advice += (" The caching allocator holds freed blocks it cannot reuse for the sizes asked: "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or fewer distinct tensor sizes.")
        out.append(Finding("memory-peak", severity, title, evidence, advice, math.nan))
    return out


def server_gauges(report: Report) -> list[Finding]:
    """A TTFT rise over the run tied to what the server's gauges show during it."""
    g, req = report.gauges, report.requests
    if not len(g) or not len(req) or "arrival_s" not in req or req["arrival_s"].isna().all():
        return []
    ok = req[req["ttft_s"].notna() & req["arrival_s"].notna()].sort_values("arrival_s")
    if len(ok) < 8:
        return []
    q = max(2, len(ok) // 4)
    first, last = ok.iloc[:q], ok.iloc[-q:]
    t_first, t_last = float(first["ttft_s"].median()), float(last["ttft_s"].median())
    if not (t_first > 0 and t_last / t_first >= TTFT_RISE):
        return []
    lo, hi = float(last["arrival_s"].min()), float((last["arrival_s"] + last["ttft_s"]).max())
    during = g[(g["t_s"] >= lo) & (g["t_s"] <= hi)]
    if not len(during):
        during = g

    def peak(metric: str) -> float:
        v = during.loc[during["metric"] == metric, "value"]
        return float(v.max()) if v.notna().any() else math.nan

    waiting, running, kv = peak("requests_waiting"), peak("requests_running"), peak("kv_cache_usage_pct")
    pre = during.loc[during["metric"] == "preemptions_total", "value"]
    preempted = float(pre.max() - pre.min()) if pre.notna().any() else math.nan
    causes = []
    if kv >= KV_SATURATED_PCT:
        causes.append(f"the KV cache was {kv:.0f}% full")
    if preempted > 0:
        causes.append(f"{preempted:.0f} preemptions")
    if waiting > 0:
        causes.append(f"up to {waiting:.0f} requests waited in the queue behind {running:.0f} running")
    evidence = {"ttft_first_quarter_s": t_first, "ttft_last_quarter_s": t_last, "requests_waiting_max": waiting,
                "requests_running_max": running, "kv_cache_usage_max_pct": kv, "preemptions_during": preempted}
    items = _gauge_items(last, t_first, {"KV-cache usage": (kv, "%", kv >= KV_SATURATED_PCT),
                                         "preemptions": (preempted, "", preempted > 0),
                                         "requests waiting": (waiting, "", waiting > 0),
                                         "requests running": (running, "", False)})
    if not causes:
        title = (f"TTFT rose {t_last / t_first:.1f}x over the run ({t_first * 1e3:.0f} -> {t_last * 1e3:.0f} ms) "
                 "without queueing or KV saturation in the server's gauges")
        advice = "The server's own step time grew: profile it (--profile) to see which kernels slowed."
        return [Finding("ttft-gauges", "low", title, evidence, advice, math.nan, items=items)]
    title = (f"TTFT rose {t_last / t_first:.1f}x over the run ({t_first * 1e3:.0f} -> {t_last * 1e3:.0f} ms): "
             + "; ".join(causes))
    if kv >= KV_SATURATED_PCT or preempted > 0:
        advice = ("KV-cache bound: fewer concurrent sequences fit than arrive. More KV memory (fp8 KV, a higher "
                  "gpu_memory_utilization, a smaller model or tensor parallel), or a lower request rate.")
    else:
        advice = ("Queueing: requests arrive faster than the server admits them (max running sequences reached "
                  "while the KV cache has room). Raise max_num_seqs / the batch, or lower the rate.")
    return [Finding("ttft-gauges", "medium", title, evidence, advice, math.nan, items=items)]


def _gauge_items(last: pd.DataFrame, t_first: float, gauges: dict[str, tuple[float, str, bool]]) -> tuple[Item, ...]:
    """The evidence of a TTFT rise: the slowest requests of the last quarter (their TTFT over the
    first quarter's median; requests are on the client's clock, not the trace's, so they have no
    place on the timeline) and the server's gauges at their peak during them (a cause when it says
    the server was full)."""
    slow = last.nlargest(min(len(last), ITEMS_TOP), "ttft_s")
    items = [Item("request", f"request {r.request_id}: TTFT {r.ttft_s * 1e3:.0f} ms ({r.ttft_s / t_first:.1f}x the "
                  f"first quarter's median), sent at {r.arrival_s:.2f} s", float(r.ttft_s) * 1e9, False,
                  attrs={"request_id": str(r.request_id), "ttft_s": float(r.ttft_s), "arrival_s": float(r.arrival_s)})
             for r in slow.itertuples(index=False)]
    for name, (value, unit, cause) in gauges.items():
        if math.isfinite(value):
            items.append(Item("metric", f"{name} peaked at {value:.0f}{unit} during them"
                              + (" (a cause)" if cause else ""), math.nan, cause, attrs={"gauge": name, "value": value}))
    return tuple(items)


def kv_capacity(report: Report) -> list[Finding]:
    """How many sequences fit on the report's GPU at its context (an engine or HF report on a GPU
    whose datasheet row gives its memory)."""
    sec = capacity_section(report)
    if sec is None:
        return []
    c = sec["capacity"]
    evidence = {"max_sequences": c["max_sequences"], "context_tokens": c["context"],
                "kv_bytes_per_token": c["kv_bytes_per_token"], "weight_bytes": c["weight_bytes"],
                "kv_budget_bytes": c["kv_budget_bytes"]}
    if sec.get("fp8_kv"):
        evidence["max_sequences_fp8_kv"] = sec["fp8_kv"]["max_sequences"]
    items = (Item("metric", f"weights: {nbytes(c['weight_bytes'])}", attrs={"bytes": c["weight_bytes"]}),
             Item("metric", f"KV budget: {nbytes(c['kv_budget_bytes'])}, {nbytes(c['kv_bytes_per_token'])} per token",
                  attrs={"bytes": c["kv_budget_bytes"], "kv_bytes_per_token": c["kv_bytes_per_token"]}),
             Item("metric", f"{c['max_sequences']} sequences of {c['context']} tokens fit",
                  attrs={"max_sequences": c["max_sequences"], "context_tokens": c["context"]}))
    return [Finding("kv-capacity", "info", sec["finding"][0].upper() + sec["finding"][1:], evidence,
                    "Batch up to this many sequences at this context; fp8 KV (or a shorter context) fits more.",
                    math.nan, items=items)]

