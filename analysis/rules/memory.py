"""Memory findings: the peak and what held it, how many sequences fit, and a TTFT rise tied to
the server's gauges (queueing, KV-cache saturation, preemptions)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import counted, nbytes
from perfscope.format import pct as pct_text

from ..summaries.memory import capacity_section, live_at, peaks, tensor_roles
from ._base import Finding, Item
from .evidence import ITEMS_TOP

if TYPE_CHECKING:
    from perfscope.report import Report

FRAGMENTATION_SHARE = 0.2
"""Reserved-but-unallocated above a fifth of the reserved bytes at the peak is worth a look
(``expandable_segments`` or fewer distinct sizes give it back)."""

TTFT_RISE = 2.0
"""TTFT of the last quarter of arrivals over the first quarter's (medians): a rise worth explaining."""
KV_SATURATED_PCT = 90.0
"""KV-cache usage at or above this is saturated: new requests wait for blocks (or preempt)."""
KV_BOUND_ADVICE = ("KV-cache bound: fewer concurrent sequences fit than arrive. More KV memory (fp8 KV, a higher "
                   "gpu_memory_utilization, a smaller model or tensor parallel), or a lower request rate.")

PEAK_ITEMS = 12
"""Live tensors a ``memory-peak`` finding lists as items (largest first)."""
ADVICE_SHARE = 0.05
"""A role (attention scores, logits, ...) gets its advice when its tensors hold at least this share of
the peak's bytes: below it, what it would save is within what a rerun moves."""
ADVICE_MIN_BYTES = 16 * 2**20
"""... and at least this many bytes: a kind of tensor that holds less is not worth a change."""
UNKNOWN_ROLES = ("before_recording", "unknown")
"""Roles that say nothing of what a tensor is: items of these count as unexplained."""

ROLE_NAMES = {"attention_scores": ("attention-score tensor", "attention-score tensors"),
              "attention": ("fused-attention tensor", "fused-attention tensors"),
              "logits": ("logits tensor", "logits tensors"), "kv_cache": ("KV-cache block", "KV-cache blocks"),
              "weights": ("weight", "weights"), "optimizer": ("optimizer state", "optimizer states"),
              "gradient": ("gradient", "gradients"), "workspace": ("workspace", "workspaces"),
              "activations": ("activation", "activations"), "cuda_graph_pool": ("CUDA-graph pool block",
                                                                              "CUDA-graph pool blocks"),
              "before_recording": ("block from before the record", "blocks from before the record"),
              "unknown": ("tensor of unknown kind", "tensors of unknown kind")}

SAVING = {"attention_scores": 1.0, "logits": 1.0, "kv_cache": 0.5, "weights": 0.5, "optimizer": 0.75}
"""Share of a role's bytes the advice gives back: a fused attention never materialises the scores, the
last position's logits (or chunked logits) need none of the rest; fp8 KV and int8 weights halve bf16;
8-bit optimizer states are a quarter of fp32 ones."""

ADVICE = {
    "attention_scores": "a fused attention (torch.nn.functional.scaled_dot_product_attention, FlashAttention; "
                        "attn_implementation=\"sdpa\" in transformers) never materialises the B x H x S x S scores",
    "logits": "only the last position's logits are needed to sample (transformers: logits_to_keep=1); for a loss, "
              "compute the logits and the loss in chunks of the sequence",
    "kv_cache": "a smaller KV dtype (fp8 halves a bf16 cache) or fewer concurrent sequences / a shorter context",
    "weights": "quantised weights (int8 keeps a byte per parameter: half of bf16, a quarter of fp32; int4 half "
               "that), or offload the layers not in use",
    "optimizer": "8-bit optimizer states (a quarter of fp32 Adam moments), or shard them across ranks (ZeRO / FSDP)",
    "gradient": "shard the gradients across ranks (ZeRO-2 / FSDP), or accumulate over micro-batches",
    "activations": "activation checkpointing (training), a smaller batch or shorter sequences, or free them "
                   "sooner",
    "workspace": "these temporaries are freed within their op: a smaller batch, or an op that needs none",
    "attention": "fused attention already: its memory grows with B x H x S x D, not S^2",
    "before_recording": "start the allocator's history before the model loads "
                        "(torch.cuda.memory._record_memory_history at the start) so the record says what they are",
}


def memory_peak(report: Report) -> list[Finding]:
    """What made each device's memory peak, in the words of the evidence: the live tensors at the
    peak instant (:func:`~perfscope.analysis.summaries.memory.breakdown`) grouped by what they are
    (:func:`~perfscope.analysis.summaries.memory.tensor_roles`), the largest group named with its
    size, count, op and source line; advice for each kind of tensor that holds at least
    :data:`ADVICE_SHARE` of the peak (and :data:`ADVICE_MIN_BYTES`), with the bytes it would give back;
    fragmentation beside."""
    out = []
    for p in peaks(report):
        b = p["breakdown"]
        peak = p["peak_allocated_bytes"]
        live = live_at(report, p["device"], p["event"])
        roles = tensor_roles(report, p["device"], live)
        live = live.assign(role=roles) if len(live) else live
        groups = _groups(live)
        items = tuple(_item(r, p["device"], b["clock"]) for r in _evidence(live).to_dict("records"))
        by_role = live.groupby("role")["size_bytes"].sum().sort_values(ascending=False) if len(live) else None
        known = float(by_role.drop([r for r in UNKNOWN_ROLES if r in by_role.index]).sum()) if by_role is not None else 0.0
        evidence: dict[str, float | int | str] = {
            "peak_allocated_bytes": peak, "event": p["event"] + 1, "events": p["events"],
            **({"t_ns": p["t_ns"]} if p["t_ns"] is not None else {}),
            **{f"{k}_bytes": v for k, v in b["by_category"].items()},
            "live_tensors": b["live_tensors"], "explained_bytes_pct": 100.0 * known / peak if peak > 0 else math.nan}
        for key in ("reserved_bytes", "reserved_unused_bytes", "fragmentation_bytes"):
            if b[key] is not None:
                evidence[key] = b[key]
        where = " / ".join(x for x in (p["op"], p["module"] or p["source"]) if isinstance(x, str) and x)
        title = f"{p['device']}: memory peaks at {nbytes(peak)} allocated, {b['at']}"
        head = _headline(groups, peak)
        title += f": {head}" if head else (f" ({where})" if where else "")
        advice = []
        if by_role is not None:
            for role, nb in by_role.items():
                if role in ADVICE and nb >= max(ADVICE_SHARE * peak, ADVICE_MIN_BYTES):
                    save = SAVING.get(str(role), 0.0) * float(nb)
                    advice.append(f"{ROLE_NAMES[str(role)][1].capitalize()} hold {nbytes(nb)} "
                                  f"({100 * nb / peak:.0f}% of the peak): {ADVICE[str(role)]}"
                                  + (f"; up to {nbytes(save)} less at this peak." if save > 0 else "."))
                    if save > 0:
                        evidence[f"{role}_saving_bytes"] = save
        # bytes the peak counts that no recorded allocation accounts for: made before the profiler recorded
        unrecorded = peak - float(live["size_bytes"].sum()) if len(live) else float(peak)
        if unrecorded >= max(ADVICE_SHARE * peak, ADVICE_MIN_BYTES):
            evidence["unrecorded_bytes"] = unrecorded
            advice.append(f"{nbytes(unrecorded)} ({100 * unrecorded / peak:.0f}% of the peak) was allocated before the "
                          "record began: the trace counts it in the total but records no tensor for it, so what it is "
                          "(weights and caches, most often) is not known here: " + ADVICE["before_recording"] + ".")
            items = (*items, Item("tensor", f"{nbytes(unrecorded)} allocated before the record began: no tensor "
                                            "recorded for it", explains=False,
                                  attrs={"bytes": unrecorded, "role": "before_recording"}))
        severity = "info"
        frag, reserved = b["fragmentation_bytes"], b["reserved_bytes"]
        unused = b["reserved_unused_bytes"]
        if unused is not None and reserved and unused / reserved > FRAGMENTATION_SHARE:
            severity = "low"
            title += f"; {nbytes(unused)} reserved but unallocated ({100 * unused / reserved:.0f}% of reserved)"
            advice.append(_unused_advice(unused, frag))
        if not advice:
            advice.append("No kind of tensor holds enough of the peak to act on; the items list the largest.")
        out.append(Finding("memory-peak", severity, title, evidence, " ".join(advice), math.nan, items=items))
    return out


def _made_by(source: Any, module: Any, op: Any) -> str:
    """``modeling_llama.py:330 forward (aten::div)``: the source line (a trace's module path when it has
    no line) and the op that made a tensor; "" when neither is known."""
    where = source if isinstance(source, str) else module if isinstance(module, str) else ""
    return " ".join(x for x in (where, f"({op})" if isinstance(op, str) else "") if x)


def _unused_advice(unused: float, frag: float | None) -> str:
    """What the reserved but unallocated bytes at the peak are, and what gives them back: free space
    inside segments that hold live blocks (fragmentation: expandable segments), or whole free segments
    the allocator caches (reused for requests that fit; ``empty_cache`` returns them)."""
    if frag is not None and frag < 0.5 * unused:
        return (f"Beside the peak, {nbytes(unused)} is reserved but unallocated, {nbytes(unused - frag)} of it in "
                "whole free segments the caching allocator keeps: they serve later requests that fit them, and "
                "torch.cuda.empty_cache() returns them to the device (for another process); "
                f"{nbytes(frag)} is fragmentation inside segments that hold live blocks.")
    what = f", {nbytes(frag)} of it free space inside segments that hold live blocks" if frag is not None else ""
    return (f"Beside the peak, {nbytes(unused)} is reserved but unallocated{what}: the caching allocator holds "
            "freed blocks it cannot reuse for the sizes asked: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
            "or fewer distinct tensor sizes.")


def _groups(live: pd.DataFrame) -> pd.DataFrame:
    """Live tensors grouped by what they are and their size, largest total first, each with who made
    them (``source (op)``, in the order of their sizes)."""
    if not len(live):
        return live
    who = [_made_by(s, m, o) for s, m, o in zip(live["source"].tolist(), live["module"].tolist(), live["op"].tolist())]
    g = live.assign(who=who).groupby(["role", "size_bytes"], sort=False).agg(
        count=("size_bytes", "size"), total=("size_bytes", "sum"), freed=("free_event", lambda s: int(s.notna().sum())),
        who=("who", lambda w: [x for x in dict.fromkeys(w) if x]))
    return g.sort_values("total", ascending=False).reset_index()


def _evidence(live: pd.DataFrame) -> pd.DataFrame:
    """The live tensors a finding lists: the largest few of each role (most bytes first), at most
    :data:`PEAK_ITEMS`, largest first."""
    if not len(live):
        return live
    order = live.groupby("role")["size_bytes"].sum().sort_values(ascending=False).index
    per = max(1, PEAK_ITEMS // max(1, len(order)))
    picked = pd.concat([live[live["role"] == r].head(per) for r in order])
    return picked.sort_values("size_bytes", ascending=False, kind="stable").head(PEAK_ITEMS)


def _headline(groups: pd.DataFrame, peak: float) -> str:
    """What made the peak in words: the largest group of tensors freed after it (what the peak holds
    and the end does not) when they hold :data:`ADVICE_SHARE` of it, else the largest group: "two
    1.07 GB attention-score tensors from modeling_llama.py:330 forward (aten::div) are live, freed
    after the peak"."""
    if not len(groups):
        return ""
    transient = groups[(groups["freed"] == groups["count"]) & (groups["total"] >= ADVICE_SHARE * peak)]
    g = transient.iloc[0] if len(transient) else groups.iloc[0]
    n = int(g["count"])
    kind = ROLE_NAMES.get(str(g["role"]), ("tensor", "tensors"))[0 if n == 1 else 1]
    count = COUNT_WORDS.get(n, f"{n:,}")
    size = nbytes(float(g["size_bytes"]))
    # "two 1.07 GB tensors" reads; "287 41.9 MB tensors" does not: a numeral count takes "of N each"
    text = f"{count} {size} {kind}" if n in COUNT_WORDS else f"{count} {kind} of {size} each"
    if g["who"]:
        text += " from " + " and ".join(g["who"][:2]) + (f" and {len(g['who']) - 2} more" if len(g["who"]) > 2 else "")
    text += " is live" if n == 1 else " are live"
    if int(g["freed"]) == n:
        text += ", freed after the peak"
    return text + f" ({100 * float(g['total']) / peak:.0f}% of it)" if peak > 0 else text


COUNT_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
               10: "ten", 11: "eleven", 12: "twelve"}


def _item(r: dict[str, Any], device: str, clock: str) -> Item:
    """One live tensor at the peak as evidence: its size, what it is, who made it, when made and freed."""
    role = str(r.get("role") or r["category"])
    what = ROLE_NAMES.get(role, (role, role))[0]
    by = _made_by(r["source"], r["module"], r["op"])
    made = "before the record" if r["alloc_event"] < 0 else f"made at event {int(r['alloc_event']) + 1:,}"
    freed = "still live at the end" if pd.isna(r["free_event"]) else f"freed at event {int(r['free_event']) + 1:,}"
    label = f"{nbytes(r['size_bytes'])} {what} ({r['category']})" + (f" from {by}" if by else "") + f", {made}, {freed}"
    timed = clock == "time"
    return Item("tensor", label, explains=role not in UNKNOWN_ROLES,
                start_ns=float(r["alloc_t_ns"]) if timed and r["alloc_event"] >= 0 else math.nan,
                end_ns=float(r["free_t_ns"]) if timed and not pd.isna(r["free_t_ns"]) else math.nan,
                attrs={"bytes": float(r["size_bytes"]), "category": r["category"], "role": role,
                       "category_rule": r["category_rule"] if isinstance(r["category_rule"], str) else None,
                       "op": r["op"] if isinstance(r["op"], str) else None,
                       "source": r["source"] if isinstance(r["source"], str) else None,
                       "alloc_event": int(r["alloc_event"]) + 1 if r["alloc_event"] >= 0 else None,
                       "free_event": None if pd.isna(r["free_event"]) else int(r["free_event"]) + 1,
                       "device": device})


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

    def peak(metric: str, frame: pd.DataFrame = during) -> float:
        v = frame.loc[frame["metric"] == metric, "value"]
        return float(v.max()) if v.notna().any() else math.nan

    waiting, running, kv = peak("requests_waiting"), peak("requests_running"), peak("kv_cache_usage_pct")
    pre = during.loc[during["metric"] == "preemptions_total", "value"]
    preempted = float(pre.max() - pre.min()) if pre.notna().any() else math.nan
    slots = peak("requests_running", g)  # the most the server ran at once, seen over the whole run
    in_flight = _in_flight_max(req, last["arrival_s"].to_numpy(np.float64, na_value=np.nan))
    causes = []
    if kv >= KV_SATURATED_PCT:
        causes.append(f"the KV cache was {kv:.0f}% full")
    if preempted > 0:
        causes.append(f"{preempted:.0f} preemptions")
    if waiting > 0:
        causes.append(f"up to {waiting:.0f} requests waited in the queue behind {running:.0f} running")
    inferred = not waiting > 0 and slots >= 1 and in_flight > slots
    if inferred:
        # the queue gauge is sampled (--metrics-interval) and can miss a queue shorter than its interval; the
        # client's own requests cannot: more in flight than the server ever ran at once had to wait
        extra = in_flight - slots
        causes.append(f"up to {counted(extra, 'request')} waited in the queue (the client had {in_flight:.0f} "
                      f"in flight where the server's gauges never showed more than {slots:.0f} running; the "
                      "queue gauge's samples missed it)")
    evidence = {"ttft_first_quarter_s": t_first, "ttft_last_quarter_s": t_last, "requests_waiting_max": waiting,
                "requests_running_max": running, "kv_cache_usage_max_pct": kv, "preemptions_during": preempted,
                "requests_in_flight_max": in_flight, "requests_running_max_run": slots}
    items = _gauge_items(last, t_first, {"KV-cache usage": (kv, "%", kv >= KV_SATURATED_PCT),
                                         "preemptions": (preempted, "", preempted > 0),
                                         "requests waiting": (waiting, "", waiting > 0),
                                         "requests running": (running, "", False),
                                         "requests in flight at the client": (in_flight, "", inferred)})
    if not causes:
        title = (f"TTFT rose {t_last / t_first:.1f}x over the run ({t_first * 1e3:.0f} -> {t_last * 1e3:.0f} ms) "
                 "without queueing or KV saturation in the server's gauges")
        advice = "The server's own step time grew: profile it (--profile) to see which kernels slowed."
        return [Finding("ttft-gauges", "low", title, evidence, advice, math.nan, items=items)]
    title = (f"TTFT rose {t_last / t_first:.1f}x over the run ({t_first * 1e3:.0f} -> {t_last * 1e3:.0f} ms): "
             + "; ".join(causes))
    if kv >= KV_SATURATED_PCT or preempted > 0:
        advice = KV_BOUND_ADVICE
    else:
        advice = ("Queueing: requests arrive faster than the server admits them (max running sequences reached "
                  "while the KV cache has room). Raise max_num_seqs / the batch, or lower the rate.")
    return [Finding("ttft-gauges", "medium", title, evidence, advice, math.nan, items=items)]


def server_queue(report: Report) -> list[Finding]:
    """Requests that waited, read from the server's gauges alone (a saved ``/metrics`` time series, or a load
    test whose requests carry no arrival times): how long the queue was not empty, and what held it, chosen
    from what the gauges show while it was: the KV cache full or preempting, the most sequences the server
    ever ran at once reached with KV room left (its sequence limit), or neither (unexplained). The client's
    own latencies, where the report holds them (``params.client_results``), are quoted, not computed."""
    g, req = report.gauges, report.requests
    if not len(g) or (len(req) and "arrival_s" in req and req["arrival_s"].notna().any()):
        return []  # with the client's arrivals, ttft-gauges reads the queue against each request's latency
    wide = g.pivot_table(index="t_s", columns="metric", values="value", aggfunc="max").sort_index()
    if "requests_waiting" not in wide or wide["requests_waiting"].notna().sum() < 2:
        return []
    t = wide.index.to_numpy(np.float64, na_value=np.nan)
    held = np.diff(t, append=t[-1])  # each sample holds until the next one (the last: none)
    waiting = wide["requests_waiting"].to_numpy(np.float64, na_value=np.nan)
    queued = waiting > 0
    span = float(t[-1] - t[0])
    queued_s = float(held[queued].sum())
    if not (queued_s > 0 and span > 0):
        return []  # no queue, or one seen only in the last sample (no time measured after it)

    def col(name: str) -> np.ndarray:
        return wide[name].to_numpy(np.float64, na_value=np.nan) if name in wide else np.full(len(t), np.nan)

    running, kv, pre = col("requests_running"), col("kv_cache_usage_pct"), col("preemptions_total")
    slots = float(np.nanmax(running)) if np.isfinite(running).any() else math.nan
    at_limit = queued & (running >= slots) if math.isfinite(slots) else np.zeros(len(t), bool)
    kv_q = kv[queued]
    kv_peak = float(np.nanmax(kv_q)) if np.isfinite(kv_q).any() else math.nan
    preempted = float(np.nanmax(pre) - np.nanmin(pre)) if np.isfinite(pre).any() else math.nan
    limit_share = float(held[at_limit].sum()) / queued_s if queued_s > 0 else math.nan
    kv_full_share = float(held[queued & (kv >= KV_SATURATED_PCT)].sum()) / queued_s
    kv_bound = kv_peak >= KV_SATURATED_PCT or preempted > 0
    seq_bound = not kv_bound and limit_share >= 0.5
    evidence: dict[str, Any] = {
        "queued_s": queued_s, "run_s": span, "queued_share": queued_s / span,
        "requests_waiting_max": float(np.nanmax(waiting)), "requests_running_max": slots,
        "queued_at_running_max_share": limit_share, "kv_cache_usage_max_pct": kv_peak,
        "queued_at_kv_saturated_share": kv_full_share if math.isfinite(kv_peak) else math.nan, "preemptions": preempted}
    client = report.manifest.get("params", {}).get("client_results") or {}
    latency = ""
    if isinstance(client.get("median_ttft_ms"), (int, float)):
        latency = f"; the client measured a median TTFT of {client['median_ttft_ms'] / 1e3:.3g} s"
        if isinstance(client.get("p99_ttft_ms"), (int, float)):
            latency += f" (p99 {client['p99_ttft_ms'] / 1e3:.3g} s)"
        evidence["client_median_ttft_s"] = client["median_ttft_ms"] / 1e3
    head = (f"Requests waited for {queued_s:.0f} s of the {span:.0f} s the server's gauges cover "
            f"({pct_text(100 * queued_s / span, 0)}), up to {counted(float(np.nanmax(waiting)), 'request')} at once{latency}")
    items = [Item("metric", f"requests waiting: not zero in {counted(int(queued.sum()), 'sample')} of "
                  f"{len(t)}, peak {np.nanmax(waiting):.0f}", math.nan, False,
                  attrs={"gauge": "requests_waiting", "value": float(np.nanmax(waiting))})]
    if math.isfinite(slots):
        items.append(Item("metric", f"requests running: {slots:.0f} at most, reached in {pct_text(100 * limit_share, 0)} of "
                          "the queued time" + (" (a cause)" if seq_bound else ""), math.nan, seq_bound,
                          attrs={"gauge": "requests_running", "value": slots}))
    if math.isfinite(kv_peak):
        items.append(Item("metric", f"KV-cache usage: {kv_peak:.0f}% at most while requests waited"
                          + (" (a cause)" if kv_peak >= KV_SATURATED_PCT else ""), math.nan,
                          kv_peak >= KV_SATURATED_PCT, attrs={"gauge": "kv_cache_usage_pct", "value": kv_peak}))
    if math.isfinite(preempted):
        items.append(Item("metric", f"preemptions: {preempted:.0f} over the run" + (" (a cause)" if preempted > 0 else ""),
                          math.nan, preempted > 0, attrs={"gauge": "preemptions_total", "value": preempted}))
    busy = _util_while(report.counters, t, queued)
    if math.isfinite(busy):
        evidence["gpu_util_median_pct_queued"] = busy
        items.append(Item("metric", f"GPU utilisation (sampled beside the gauges): median {busy:.0f}% while requests "
                          "waited", math.nan, False, attrs={"counter": "gpu_util_pct", "value": busy}))
    if kv_bound:
        why = [f"the KV cache at {KV_SATURATED_PCT:.0f}% or more for {pct_text(100 * kv_full_share, 0)} of that time, "
               f"{kv_peak:.0f}% at most"] if kv_peak >= KV_SATURATED_PCT else []
        why += [counted(preempted, "preemption")] if preempted > 0 else []
        title, advice = f"{head}: KV-cache bound ({'; '.join(why)})", KV_BOUND_ADVICE
    elif seq_bound:
        room = (f" at most {kv_peak:.0f}% full" if math.isfinite(kv_peak) else " with no KV usage gauge to say how full")
        title = (f"{head}: held by the sequence limit ({slots:.0f} running, the most the server ran at once, for "
                 f"{pct_text(100 * limit_share, 0)} of that time) with the KV cache{room}")
        grow = (f" (KV usage grows with the tokens held: at {kv_peak:.0f}% for {slots:.0f} sequences, about "
                f"{slots * KV_SATURATED_PCT / kv_peak:.0f} would fit below {KV_SATURATED_PCT:.0f}% at this mix of "
                "lengths)") if math.isfinite(kv_peak) and kv_peak > 0 else ""
        advice = ("Raise the server's limit on running sequences (vLLM --max-num-seqs, SGLang "
                  f"--max-running-requests){grow}, or lower the request rate; each step then carries more "
                  "sequences, so check the step time (TPOT) as it grows.")
    else:
        most = f" ({slots:.0f})" if math.isfinite(slots) else ""
        title = (f"{head}, with neither the running sequences at their most{most} nor the KV cache full: "
                 "the gauges do not say what held them")
        advice = ("Unexplained by these gauges: a scheduler budget they do not show (vLLM --max-num-batched-tokens, "
                  "a prompt too long to admit) may; profile the server (loadtest --profile) to see its steps.")
    severity = "medium" if queued_s / span >= 0.1 else "low"
    return [Finding("server-queue", severity, title, evidence, advice, math.nan, items=tuple(items))]


def _util_while(counters: pd.DataFrame, t_s: np.ndarray, held: np.ndarray) -> float:
    """The median GPU utilisation (%) of the counter samples that fall while ``held`` is true, each gauge sample at
    ``t_s`` (s) holding until the next; NaN without such samples (counters on another clock are not joined)."""
    if not len(counters) or "gpu_util_pct" not in counters or not len(t_s):
        return math.nan
    at = counters["t_ns"].to_numpy(np.float64, na_value=np.nan) / 1e9
    util = counters["gpu_util_pct"].to_numpy(np.float64, na_value=np.nan)
    idx = np.searchsorted(t_s, at, side="right") - 1
    inside = (idx >= 0) & (at <= t_s[-1]) & np.isfinite(util)
    pick = inside.copy()
    pick[inside] = held[idx[inside]]
    return float(np.median(util[pick])) if pick.any() else math.nan


def _in_flight_max(req: pd.DataFrame, at_s: np.ndarray) -> float:
    """The most requests the client had in flight (sent, last token not yet received) at any of the moments
    ``at_s`` (s from the run's start); a request with no known end is left out; NaN where none has one."""
    arrival = req["arrival_s"].to_numpy(np.float64, na_value=np.nan)
    if "end_s" in req and req["end_s"].notna().any():
        end = req["end_s"].to_numpy(np.float64, na_value=np.nan)
    else:
        end = arrival + req["e2e_s"].to_numpy(np.float64, na_value=np.nan)
    known = np.isfinite(arrival) & np.isfinite(end)
    at = np.asarray(at_s, np.float64)
    at = at[np.isfinite(at)]
    if not known.any() or not len(at):
        return math.nan
    sent = np.searchsorted(np.sort(arrival[known]), at, side="right")
    ended = np.searchsorted(np.sort(end[known]), at, side="right")
    return float((sent - ended).max())


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

