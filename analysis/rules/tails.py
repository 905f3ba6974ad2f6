"""The serving-tail finding: why a load test's p99 is far above its p50.

It reads the ``tails`` summary (:mod:`perfscope.analysis.summaries.tails`: each request's latency split
into parts that add up to it) and names, for TTFT, ITL and E2E, the part that grows most from the
p50 to the p99 and the knob that moves it. Its time at stake is the p99 excess (p99 - p50); its items
are the steps (and requests) of the p99's samples that hold each growing part, with the time of the
growth they hold.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.format import duration

from ..summaries.tails import PART_WORDS, RunSplit, entry, growth, splits, step_families
from ._base import Finding, Item, ranked

if TYPE_CHECKING:
    from perfscope.report import Report

TAIL_RATIO = 2.0
"""A p99 at least twice its p50 is a tail worth explaining (below, the distribution is tight enough
that run-to-run noise on a shared machine is of its order)."""
MIN_EXCESS_S = 1e-4
"""And at least 0.1 ms above it (a gap of microseconds has no cause worth a knob)."""
TAIL_METRICS = ("ttft", "itl", "e2e")
HIGH_RATIO = 4.0
"""A p99 at four times its p50 or more is ``high``; a tail between 2x and 4x is ``medium``."""
METRIC_WORDS = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E"}
SHORT_PROMPT_TOKENS = 64
"""A prefill stall made of prompts this short is the separate forward's cost, not a long prompt's: a chunk
budget below it would cut every prompt into more steps than it saves, so chunking is not the advice."""
STEP_ITEMS = 3
"""Steps listed per growing part (the largest holders)."""


def serving_tails(report: Report) -> list[Finding]:
    """One finding per run and metric (TTFT, ITL, E2E) whose p99 is at least :data:`TAIL_RATIO` x its p50."""
    out = []
    for split in splits(report):
        for metric in TAIL_METRICS:
            f = _tail(report, split, metric)
            if f is not None:
                out.append(f)
    return out


def _tail(report: Report, split: RunSplit, metric: str) -> Finding | None:
    lo, hi = entry(split, metric, 50.0), entry(split, metric, 99.0)
    p50, p99 = lo["value_s"], hi["value_s"]
    if not (math.isfinite(p50) and math.isfinite(p99) and p50 > 0):
        return None
    excess = p99 - p50
    if p99 < TAIL_RATIO * p50 or excess < MIN_EXCESS_S:
        return None
    grow = growth(split, metric)
    ranked_parts = sorted(((g, p) for p, g in grow.items() if g > 0), reverse=True)
    if not ranked_parts:
        return None
    top = ranked_parts[0][1]
    word = METRIC_WORDS[metric]
    where = f" ({split.run})" if split.run and len(splits(report)) > 1 else ""
    items = _items(report, split, metric, hi["from"], ranked_parts)
    advice, facts = _advice(report, split, metric, top, hi, items)
    title = f"p99 {word} {duration(p99 * 1e9)} is {p99 / p50:.1f}x its p50 {duration(p50 * 1e9)}{where}: "
    if top == "unmeasured":
        title += (f"its causes are not measured here ({duration(grow[top] * 1e9)} of the "
                  f"{duration(excess * 1e9)} excess not joined to a server step)")
    else:
        title += (f"{PART_WORDS[top]} grows most (+{duration(grow[top] * 1e9)} of the {duration(excess * 1e9)} "
                  "excess)")
    chunk = _chunk_note(report, split, metric, hi, top)
    if chunk:
        title += "; " + chunk
    evidence: dict[str, float | int | str] = {
        "metric": metric, "p50_s": p50, "p99_s": p99, "excess_s": excess, "top_part": top,
        "top_part_growth_s": grow[top], "source": split.source, **facts}
    for p, g in grow.items():
        evidence[f"{p}_growth_s"] = g
        evidence[f"{p}_p99_s"] = hi["parts"].get(p, math.nan)
    if split.run:
        evidence["run"] = split.run
    f = ranked(report, "serving-tail", title, evidence, advice, excess * 1e9, items=tuple(items))
    severity = "high" if p99 >= HIGH_RATIO * p50 else "medium"
    return Finding(f.id, severity, f.title, f.evidence, f.recommendation, f.time_at_stake_ns, f.kernels, f.ranges,
                   f.items, f.explained_ns, f.run)


def _samples(split: RunSplit, metric: str, made: list[dict[str, Any]]) -> pd.DataFrame:
    """The pieces of the samples that make up a percentile, each with the sample's weight."""
    seg = split.segments
    parts = []
    for m in made:
        sel = seg["request_id"] == m["request_id"]
        if metric == "itl":
            sel &= seg["gap"] == m["gap"]
        elif metric == "ttft":
            sel &= seg["gap"] == 0
        elif metric == "tpot":
            sel &= seg["gap"] > 0
        parts.append(seg[sel].assign(weight=m["weight"], sample=m["request_id"]))
    return pd.concat(parts, ignore_index=True) if parts else seg.iloc[:0].assign(weight=0.0, sample=0)


def _step_words(split: RunSplit, report: Report, pos: int) -> tuple[str, dict[str, Any]]:
    st = split.steps.iloc[pos]
    phase, tokens, batch = str(st["phase"]), st.get("tokens"), st.get("batch")
    attrs: dict[str, Any] = {"step": int(st["step"]), "phase": phase,
                             "batch": int(batch) if pd.notna(batch) else None,
                             "tokens": int(tokens) if pd.notna(tokens) else None}
    words = f"{phase} step {int(st['step'])}"
    links = report.request_steps
    if len(links):
        run = split.run
        sel = links["step"] == int(st["step"])
        if run and "run" in links.columns:
            sel &= links["run"].astype(object) == run
        who = links[sel]
        pre = who[who["role"].isin(["prefill", "recompute"])]
        if len(pre):
            ids = ", ".join(f"{int(r)} ({int(t)} tokens)" for r, t in zip(pre["request_id"], pre["tokens"]))
            words += f", prefilling request{'s' if len(pre) > 1 else ''} {ids}"
            attrs["prefill_requests"] = ", ".join(str(int(r)) for r in pre["request_id"])
            attrs["largest_prefill_tokens"] = int(pre["tokens"].max())
        dec = int((who["role"] == "decode").sum())
        if dec:
            words += f", decoding {dec}"
    elif pd.notna(batch) or pd.notna(tokens):
        words += f" (batch {attrs['batch'] if attrs['batch'] is not None else '?'}, {attrs['tokens'] or '?'} tokens)"
    return words, attrs


def _items(report: Report, split: RunSplit, metric: str, made: list[dict[str, Any]],
           ranked_parts: list[tuple[float, str]]) -> list[Item]:
    """For each part that grows, the steps (or requests) of the p99's samples that hold it, with the
    share of the growth each holds."""
    seg = _samples(split, metric, made)
    items: list[Item] = []
    for g, part in ranked_parts:
        pieces = seg[seg["part"] == part]
        if not len(pieces):
            continue
        held = (pieces["seconds"] * pieces["weight"]).groupby([pieces["step"], pieces["sample"]]).sum()
        total = float(held.sum())
        if total <= 0:
            continue
        explains = part not in ("host", "unmeasured")
        for (pos, rid), sec in held.sort_values(ascending=False).head(STEP_ITEMS).items():
            share = float(sec) / total
            attrs: dict[str, Any] = {"part": part, "request_id": int(rid), "seconds_in_p99": float(sec)}
            if pos >= 0:
                words, more = _step_words(split, report, int(pos))
                attrs.update(more)
                st = split.steps.iloc[int(pos)]
                start = float(st["start_ns"]) if "start_ns" in st and pd.notna(st["start_ns"]) else math.nan
                end = float(st["end_ns"]) if "end_ns" in st and pd.notna(st["end_ns"]) else math.nan
                label = (f"{words}: {duration(sec * 1e9)} of {PART_WORDS[part]} in request {int(rid)}'s p99 "
                         f"{METRIC_WORDS[metric]}")
                items.append(Item("step", label, g * share * 1e9, explains, start, end, attrs))
            else:
                label = f"request {int(rid)}: {duration(sec * 1e9)} {PART_WORDS[part]} in its p99 {METRIC_WORDS[metric]}"
                items.append(Item("request", label, g * share * 1e9, explains, attrs=attrs))
    return items


def _framework(split: RunSplit) -> str:
    fw = split.steps.get("framework") if len(split.steps) else None
    names = set() if fw is None else {str(x) for x in fw.dropna()}
    return "vllm" if "vllm" in names else "sglang" if "sglang" in names else "engine"


def _knob(framework: str, kind: str) -> str:
    return {("engine", "chunk"): "--max-batched-tokens", ("vllm", "chunk"): "--max-num-batched-tokens (chunked prefill)",
            ("sglang", "chunk"): "--chunked-prefill-size", ("engine", "batch"): "--max-batch",
            ("vllm", "batch"): "--max-num-seqs", ("sglang", "batch"): "--max-running-requests",
            ("engine", "kv"): "--kv-capacity", ("vllm", "kv"): "--gpu-memory-utilization (KV blocks)",
            ("sglang", "kv"): "--mem-fraction-static (KV pool)"}[(framework, kind)]


def _chunk_note(report: Report, split: RunSplit, metric: str, hi: dict[str, Any], top: str) -> str | None:
    """When chunked prefill is on, what it leaves of other requests' prefill in the p99."""
    budget = report.params.get("max_batched_tokens")
    if not budget or metric == "e2e":
        return None
    part = "head_of_line" if metric == "ttft" else "prefill_stall"
    held = hi["parts"].get(part, math.nan)
    if not math.isfinite(held) or hi["value_s"] <= 0:
        return None
    return (f"chunked prefill (--max-batched-tokens {budget}) holds {PART_WORDS[part]} to {duration(held * 1e9)} "
            f"({100 * held / hi['value_s']:.0f}% of the p99)")


def _families(report: Report, split: RunSplit, positions: list[int]) -> pd.Series:
    """Kernel time by category (family) of the steps at ``positions``."""
    fam = step_families(report, split)
    rows = fam.loc[fam.index.intersection(positions)]
    return rows.sum().sort_values(ascending=False) if len(rows) else pd.Series(dtype=float)


def _advice(report: Report, split: RunSplit, metric: str, top: str, hi: dict[str, Any],
            items: list[Item]) -> tuple[str, dict[str, float | int | str]]:
    p = report.params
    fw = _framework(split)
    facts: dict[str, float | int | str] = {}
    if top in ("head_of_line", "prefill_stall"):
        budget = p.get("max_batched_tokens")
        # the longest prompt chunk one request ran in those steps (the scheduler's log), else the step's tokens
        longest = max((int(str(i.attrs.get("largest_prefill_tokens") or i.attrs.get("tokens") or 0)) for i in items
                       if i.attrs.get("part") == top), default=0)
        if longest:
            facts["longest_prefill_tokens"] = longest
        if longest and longest <= SHORT_PROMPT_TOKENS and not budget:
            return (f"The stall is newly admitted requests' short prompts (at most {longest} tokens of one request in "
                    "a step), each prefilled in a forward of its own between the running requests' decodes: "
                    f"chunking ({_knob(fw, 'chunk')}) cannot shorten them. Fewer admissions per step (a lower rate "
                    "or a smaller batch) or a server that runs prefill tokens in the decode step itself (vLLM's and "
                    "SGLang's mixed steps) stalls decodes less.", facts)
        if budget and fw == "engine":
            return (f"Chunked prefill is on ({_knob(fw, 'chunk')} {budget}): other requests' prefill still holds "
                    f"the p99 gap; a smaller budget shortens each stall, at the cost of more steps per long prompt "
                    "(their TTFT grows).", facts)
        return (f"Chunk long prompts: {_knob(fw, 'chunk')} caps the prompt tokens a step runs beside the decodes, so a "
                f"long prompt{f' ({longest} tokens in one step here)' if longest else ''} is spread over several "
                "steps instead of holding every running request's next token (and the queue's first token) for its "
                "whole prefill.", facts)
    if top == "queued":
        batch = p.get("max_batch")
        facts["max_batch"] = batch if batch is not None else "n/a"
        return (f"Requests waited for a KV slot or KV room: raise {_knob(fw, 'batch')}"
                + (f" (now {batch})" if batch else "") + f" or the KV capacity ({_knob(fw, 'kv')}), or offer fewer "
                "requests per second: the arrival rate is above what the server admits.", facts)
    if top == "preemption":
        runs = (p.get("loadtest") or {}).get("runs") or []
        n = sum(int(r.get("preemptions") or 0) for r in runs if isinstance(r, dict))
        cap = p.get("kv_capacity")
        facts["preemptions"] = n
        return (f"Requests were preempted ({n} preemptions) and recomputed: the KV capacity"
                + (f" ({_knob(fw, 'kv')} {cap} tokens)" if cap else f" ({_knob(fw, 'kv')})")
                + f" holds fewer sequences than {_knob(fw, 'batch')} admits at these lengths: raise it, or lower "
                f"{_knob(fw, 'batch')} so that admitted requests are not evicted.", facts)
    if top in ("decode", "prefill"):
        fam = _families(report, split, _positions(split, items, top))
        what = "decode step" if top == "decode" else "prefill of its own prompt"
        if len(fam) and fam.sum() > 0:
            name, share = str(fam.index[0]), float(fam.iloc[0] / fam.sum())
            facts["slow_step_kernel_family"], facts["slow_step_kernel_family_pct"] = name, 100 * share
            tail = (f"{name} kernels hold {100 * share:.0f}% of those steps' kernel time: that family sets the step's "
                    "time" + (f"; a smaller {_knob(fw, 'batch')} shortens each decode step (fewer tokens per second "
                              "in total)." if top == "decode" else "."))
        else:
            tail = "profile the run (the engine: drop --no-profile; an endpoint: --profile) to see which kernel family sets it."
        return f"The {what} itself is what grows in the tail: {tail}", facts
    if top == "host":
        return ("No step ran for that time: the scheduler's own work between steps, the host (a shared CPU), or "
                "for an endpoint the token's trip to the client; profile the server to see its host time.", facts)
    return ("Nothing here says where this time went: load-test the server with --profile (its steps beside the "
            "requests: vLLM, SGLang, perfscope serve) or at least --metrics (its queue and KV gauges).", facts)


def _positions(split: RunSplit, items: list[Item], part: str) -> list[int]:
    ids = {int(str(i.attrs["step"])) for i in items if i.attrs.get("part") == part and i.attrs.get("step") is not None}
    if not ids or not len(split.steps):
        return []
    st = split.steps
    return [int(p) for p in st.loc[st["step"].astype("int64").isin(ids), "pos"]]


__all__ = ["HIGH_RATIO", "MIN_EXCESS_S", "SHORT_PROMPT_TOKENS", "TAIL_RATIO", "serving_tails"]
