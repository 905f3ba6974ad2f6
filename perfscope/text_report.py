"""The terminal summary of a Report: device roofs, phases, requests, top kernels, findings.

``render_text(report) -> str`` is pure (no printing), so the CLI prints it and tests read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .format import (
    EVIDENCE_ITEMS_SHOWN,
    MISSING,
    evidence_item,
    evidence_more,
    evidence_share,
    si,
    terminal_text,
)
from .format import clip as _clip
from .format import finite as _finite
from .format import number as _num

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perfscope.analysis.findings import Finding

    from .report import Report

__all__ = ["render_text", "si", "table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "  ") -> str:
    """A plain left/right aligned text table (numbers right-aligned); cells shown terminal-safe."""
    headers = [terminal_text(h) for h in headers]
    rows = [[terminal_text(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]

    def fmt(cells: Sequence[str]) -> str:
        parts = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            numeric = i > 0 and (c[:1].isdigit() or c[:1] in "-+.") or c == MISSING
            parts.append(c.rjust(w) if numeric else c.ljust(w))
        return indent + "  ".join(parts).rstrip()

    return "\n".join([fmt(headers)] + [fmt(r) for r in rows])


def _no_kernels_why(report: Report) -> str:
    """Why a report has no kernels, in words (an endpoint load test measures the server from outside)."""
    if str((report.manifest.get("source") or {}).get("kind") or "").startswith("endpoint"):
        return ("a load test of an endpoint measures the server from outside; `perfscope loadtest --endpoint "
                "--profile` against a profiling server puts its steps beside the requests")
    return "this report holds no kernels"


def _device_lines(report: Report) -> list[str]:
    from perfscope.analysis.summaries.kernels import roof_methods, roofs_table
    from perfscope.vocab import speak

    dev = report.device
    if dev is None and not len(report.kernels):
        return [f"device: none profiled ({_no_kernels_why(report)})"]
    if dev is None:
        return ["device: unknown (no roofs: every bound is 'unknown')"]
    lines = [f"device: {dev.name} ({dev.kind}{_units(dev)})"]
    roofs = roofs_table(dev)
    if not len(roofs):
        lines.append("  roofs: none known (bound is 'unknown' for every kernel)")
    methods, notes = roof_methods(list(roofs["method"]))
    width = max((len(str(x)) for x in roofs["roof"]), default=5)
    for (_, r), method in zip(roofs.iterrows(), methods):
        unit = "FLOP/s" if r["kind"] == "compute" else "B/s"
        ridge = f", ridge {r['ridge_flop_per_byte']:.1f} FLOP/B" if r["kind"] == "compute" and r["ridge_flop_per_byte"] else ""
        clock = f", clock {r['clock']}" if r["clock"] else ""
        line = f"  {r['roof']:<{width}} {si(r['value'], unit):>14}  {r['provenance']}: {method}{clock}{ridge}"
        lines.append(speak(line, dev))
    lines += [f"  source of the roofs above: {speak(note, dev)}" for note in notes]
    return lines


def _units(dev: object) -> str:
    """``, 304 CUs`` / ``, 132 SMs``: the device's unit count in its vendor's word."""
    from perfscope.vocab import device_words

    count = getattr(dev, "properties", {}).get("sm_count") or getattr(dev, "properties", {}).get("numSms")
    return f", {count} {device_words(dev)['units']}" if count else ""


def _phase_lines(report: Report) -> list[str]:
    from perfscope.analysis.summaries.serving import has_unprofiled, phase_summary

    if not len(report.kernels) and not len(report.steps) and not len(report.steps_unprofiled):
        return []  # no steps nor kernels: no phase to show (an endpoint load test's requests are shown apart)
    ph = phase_summary(report)
    if not len(ph):
        return []
    rows = [[str(r["phase"]), str(r["steps"]), _num(r["tokens"], 1, 0), _num(r["wall_s"], 1e-3, 1),
             _num(r["tokens_per_s"], 1, 1), si(r["achieved_flops_per_s"], "FLOP/s"), _num(r["mfu"] * 100, 1, 1),
             si(r["achieved_bytes_per_s"], "B/s"), _num(r["mbu"] * 100, 1, 1)] for _, r in ph.iterrows()]
    head = ["phase", "steps", "tokens", "wall ms", "tok/s", "achieved", "MFU %", "bytes/s", "MBU %"]
    if ph["phase"].isin(["draft", "verify"]).any():  # speculative decoding: what drafting and verifying cost
        for row, (_, r) in zip(rows, ph.iterrows()):
            row.insert(4, _num(r["wall_share_pct"], 1, 1))
        head.insert(4, "wall %")
    framework = ph["framework"].dropna() if "framework" in ph else ph.iloc[:0, 0]
    if len(framework):  # a framework's steps: a mixed row's prefill and decode tokens, the outliers left out
        for row, (_, r) in zip(rows, ph.iterrows()):
            row[2] = _num(r["tokens"], 1, 0)
            row += [_num(r["prefill_tokens"], 1, 0), _num(r["decode_tokens"], 1, 0), _num(r["outlier_steps"], 1, 0)]
        head += ["prefill tok", "decode tok", "outliers"]
        who = ", ".join(sorted(set(framework.astype(str))))
        from perfscope.analysis.summaries.serving import phase_notes

        return [f"phases ({who} steps; outlier steps left out):", table(head, rows),
                *(f"  note: {n}" for n in phase_notes(ph))]
    if not has_unprofiled(report):
        engine = report.manifest.get("source", {}).get("kind") == "engine"
        return ["phases (the profiled run):" if engine else "phases:", table(head, rows)]
    prof = phase_summary(report, profiled=True).set_index("phase")
    for row, (_, r) in zip(rows, ph.iterrows()):
        p = prof.loc[r["phase"]] if r["phase"] in prof.index else {}
        row += ["|", _num(p.get("wall_s"), 1e-3, 1), _num(p.get("tokens_per_s"), 1, 1),
                _num(p.get("mfu", float("nan")) * 100, 1, 1), _num(p.get("mbu", float("nan")) * 100, 1, 1)]
    head += ["|", "prof. wall ms", "prof. tok/s", "prof. MFU %", "prof. MBU %"]
    from perfscope.analysis.summaries.runs import range_text

    rng = range_text(report)
    return ["phases (headline: warm unprofiled run | the profiled run, inflated by the profiler):", table(head, rows),
            *([f"  {rng}"] if rng else [])]


def _speculation_lines(report: Report) -> list[str]:
    from perfscope.analysis.rules.llm import speculation

    found = speculation(report)
    if not found:
        return []
    e = found[0].evidence
    head = (f"speculative decoding ({e['method']}): acceptance {_num(float(e['acceptance_rate']) * 100, 1, 1)}%, "
            f"mean accepted length {_num(e['mean_accepted_len'], 1, 2)}, {_num(e['tokens_per_verify_step'], 1, 2)} "
            f"tokens per verify step over {e['verify_steps']} steps")
    cost = (f"  draft {_num(e['draft_time_ns'], 1e6, 1)} ms vs verify {_num(e['verify_time_ns'], 1e6, 1)} ms; "
            f"verify step {_num(e['verify_step_ns'], 1e6, 1)} ms ({_num(e['verify_flop_per_byte'], 1, 2)} FLOP/B) vs "
            f"decode step {_num(e['decode_step_ns'], 1e6, 1)} ms ({_num(e['decode_flop_per_byte'], 1, 2)} FLOP/B)")
    return [head, cost, f"  {found[0].title}"]


def _kv_policy_lines(report: Report) -> list[str]:
    """A KV policy run: kept entries, K/V bytes and time per decode step against the full cache, MBU, capacity."""
    from perfscope.analysis.summaries.kv_policy import kv_policy_summary
    from perfscope.format import nbytes

    s = kv_policy_summary(report)
    if s is None or not s["policy_run"].get("decode_steps"):
        return []
    own, ref = s["policy_run"], s.get("full_cache") or {}
    lines = [f"KV policy {s['policy']}: decode reads {_num(own.get('kv_entries_mean'), 1, 1)} KV entries per sequence "
             f"and layer at context {_num(own.get('context_len_last'), 1, 0)}; "
             f"{nbytes(own.get('kv_bytes_per_step', float('nan')))} of K/V per step vs "
             f"{nbytes(s.get('full_kv_bytes_per_step', float('nan')))} with the full cache"]
    if ref:
        lines.append(f"  decode step {_num(own.get('step_ns'), 1e6, 2)} ms vs {_num(ref.get('step_ns'), 1e6, 2)} ms "
                     f"(full cache, same session); attention {_num(own.get('attention_ns_per_step'), 1e6, 2)} vs "
                     f"{_num(ref.get('attention_ns_per_step'), 1e6, 2)} ms per step; decode MBU "
                     f"{_num(own.get('mbu', float('nan')) * 100, 1, 1)}% vs {_num(ref.get('mbu', float('nan')) * 100, 1, 1)}%")
    if "sequences_fit_ratio" in s:
        lines.append(f"  KV per {s['sequence_tokens']}-token sequence {nbytes(s['kv_bytes_per_sequence'])} vs "
                     f"{nbytes(s['full_kv_bytes_per_sequence'])}: {_num(s['sequences_fit_ratio'], 1, 1)}x the sequences "
                     "fit (perfscope capacity --kv-policy)")
    return lines


def _request_lines(report: Report) -> list[str]:
    from perfscope.analysis.summaries.serving import has_unprofiled, request_summary

    s = request_summary(report)
    if not s:
        return []
    prompt = MISSING if _finite(s["prompt_tokens"]) is None else str(int(s["prompt_tokens"]))
    unknown = int(s.get("prompt_tokens_unknown", 0))
    lines = [
        f"requests: {int(s['requests'])}, {prompt} prompt + {int(s['output_tokens'])} output tokens"
        + (f" (prompt not counted for {unknown})" if unknown and prompt != MISSING else "")
        + (" (warm unprofiled run)" if has_unprofiled(report) else "")
        + (f"; {int(s['prompt_padding_tokens'])} padding tokens beside the prompt"
           if s.get("prompt_padding_tokens") else ""),
        f"  TTFT mean {_num(s['ttft_s_mean'], 1e-3)} ms (p99 {_num(s['ttft_s_p99'], 1e-3)})   "
        f"TPOT mean {_num(s['tpot_s_mean'], 1e-3)} ms (p99 {_num(s['tpot_s_p99'], 1e-3)})   "
        f"ITL mean {_num(s['itl_s_mean'], 1e-3)} ms   E2E mean {_num(s['e2e_s_mean'], 1, 3)} s",
        f"  throughput {_num(s['throughput_tokens_per_s'])} tok/s (all output tokens / run start to last token), "
        f"decode speed {_num(s['user_tokens_per_s'])} tok/s per user (1 / mean TPOT)",
    ]
    if has_unprofiled(report):
        p = request_summary(report, profiled=True)
        if p:
            lines.append(f"  profiled run: TTFT {_num(p['ttft_s_mean'], 1e-3)} ms   TPOT {_num(p['tpot_s_mean'], 1e-3)} ms   "
                         f"E2E {_num(p['e2e_s_mean'], 1, 3)} s   {_num(p['throughput_tokens_per_s'])} tok/s")
    return lines


def _client_lines(report: Report) -> list[str]:
    from perfscope.analysis.summaries.serving import client_results

    rows = client_results(report)
    return ["the benchmark client's results, as it reported them: " + ", ".join(f"{k} {v}" for k, v in rows)] if rows else []


def _tail_lines(report: Report) -> list[str]:
    """A load test's p50 and p99 of TTFT, ITL, TPOT and E2E with their parts (ms), per run."""
    from perfscope.analysis.summaries.tails import PARTS, entry, splits

    found = splits(report)
    if not found:
        return []
    words = {"head_of_line": "head of line", "prefill_stall": "prefill stall"}
    lines = []
    for split in found:
        shown = [p for p in PARTS if p not in split.unmeasured]
        rows, used = [], set()
        for metric in ("ttft", "itl", "tpot", "e2e"):
            for q, v in (("p50", 50.0), ("p99", 99.0)):
                e = entry(split, metric, v)
                used |= {p for p, x in e["parts"].items() if x > 0}
                rows.append((f"{metric.upper()} {q}", e))
        cols = [p for p in shown if p in used]
        table_rows = [[label, _num(e["value_s"], 1e-3, 2)] + [_num(e["parts"].get(p), 1e-3, 2) if p in e["parts"]
                                                               else MISSING for p in cols] for label, e in rows]
        run = f" {split.run}" if split.run and len(found) > 1 else ""
        lines.append(f"tails (p50 -> p99 split into causes{run}; ms, the parts add up to the value; joined by "
                     f"{split.source}):")
        lines.append(table(["", "value", *(words.get(p, p) for p in cols)], table_rows, indent="    "))
        lines += [f"    note: {n}" for n in split.notes]
    return lines


def _timing_line(report: Report) -> str | None:
    from perfscope.analysis.summaries.runs import timing_text

    text = timing_text(report)
    return f"timing: {text}" if text else None


def _kernel_lines(report: Report, n: int) -> list[str]:
    from perfscope.analysis.summaries.kernels import top_kernels

    top = top_kernels(report, n)
    if not len(top):
        return [] if len(report.requests) else ["kernels: none recorded"]
    rows = [[str(i + 1), _clip(r["name"], 46), str(int(r["count"])), _num(r["duration_ns"], 1e6, 2),
             _num(r["share_pct"], 1, 1), _num(r["arith_intensity"], 1, 2), si(r["achieved_flops_per_s"], "FLOP/s"),
             _bound_text(r), _num(r["pct_of_roof"], 1, 1), _clip(r.get("phase"), 8)]
            for i, (_, r) in enumerate(top.iterrows())]
    from perfscope.analysis.summaries.kernels import limiter_notes, roof_notes

    kind = "CPU operators" if (report.kernels["device"] == "cpu").all() else "kernels"
    head = ["#", "name", "calls", "total ms", "% time", "FLOP/B", "achieved", "bound", "% roof", "phase"]
    notes = [f"  above the roof: {n}" for n in roof_notes(top, report.device, width=60)]
    notes += [f"  measured limiter disagrees: {n}" for n in limiter_notes(top, width=60)]
    return [f"top {kind} by total time (one row per name and phase):", table(head, rows), *notes]


def _bound_text(row: Any) -> str:
    """The measured limiter's bound where Nsight Compute or rocprof-compute measured it (``compute (alu) 70%``,
    ``latency``), else ``memory`` / ``compute`` with the hierarchical roofline's binding level where one is
    known (``memory, l2 binds``)."""
    from perfscope.analysis.costs.limiter import bound_label
    from perfscope.format import is_missing

    limiter, share = row.get("limiter"), row.get("limiter_pct")
    if isinstance(limiter, str) and limiter and not is_missing(share):
        if row["bound"] == "latency":
            return f"latency ({limiter} {share:.0f}%)"
        return f"{bound_label(row['bound'], limiter)} {share:.0f}%"
    level = row.get("bound_level")
    return f"{row['bound']}, {level} binds" if isinstance(level, str) and level else str(row["bound"])


def _idle_lines(report: Report, n: int = 5) -> list[str]:
    """Why the device waits: its idle time per cause and the largest (cause, range) rows (docs/idle.md)."""
    from perfscope.analysis.idle import HOST_KINDS, idle_of, idle_overview

    lines = []
    for dev in idle_overview(idle_of(report), n):
        causes = " · ".join(f"{c['cause']} {_num(c['idle_pct'], 1, 0)}%" for c in dev["causes"]  # type: ignore[attr-defined]
                            if c["duration_ns"])
        host = " · ".join(f"{k['kind']} {_num(k['idle_pct'], 1, 0)}%" for k in dev["kinds"]  # type: ignore[attr-defined]
                          if k["duration_ns"] and k["kind"] in HOST_KINDS)
        unrec = dev.get("unrecorded") or {}
        if unrec.get("ns"):  # type: ignore[attr-defined]
            # gaps over which the trace lacks dispatches are not idle: left out of the idle time and its window
            lines.append(f"idle on {dev['device']}: {_num(dev['measured_idle_ns'], 1e6, 2)} ms, "
                         f"{_num(dev['measured_idle_pct'], 1, 1)}% of {_num(dev['measured_window_ns'], 1e6, 2)} ms as "
                         f"measured; {_num(unrec['ns'], 1e6, 2)} ms in {unrec['gaps']} gaps over which the trace lacks "  # type: ignore[index]
                         f"{unrec['dispatches']:,} dispatches left out (of {_num(dev['idle_ns'], 1e6, 2)} ms, "  # type: ignore[index]
                         f"{_num(dev['idle_pct'], 1, 1)}% of {_num(dev['window_ns'], 1e6, 2)} ms as traced): {causes}"
                         + (f" (host: {host})" if host else ""))
        else:
            lines.append(f"idle on {dev['device']}: {_num(dev['idle_ns'], 1e6, 2)} ms, {_num(dev['idle_pct'], 1, 1)}% of "
                         f"{_num(dev['window_ns'], 1e6, 2)} ms: {causes}" + (f" (host: {host})" if host else ""))
        if dev.get("gap_sizes_text"):
            lines.append(f"  gaps by time: {dev['gap_sizes_text']}")
        rows = [[str(r["cause"]) + (f" ({r['host_kind']})" if isinstance(r.get("host_kind"), str) else ""),  # type: ignore[attr-defined]
                 _clip(r["range"] or "(no range)", 46), _num(r["duration_ns"], 1e6, 2),
                 _num(r["idle_pct"], 1, 1), str(r["slices"])] for r in dev["ranges"]]  # type: ignore[attr-defined]
        lines.append(table(["cause", "range", "ms", "% idle", "gaps"], rows))
    return lines


RANK_ROWS = 16
"""Ranks listed in the text summary of a bigger job: the stragglers and those whose groups wait
longest for them first (``--json`` has every rank)."""


def _rank_lines(report: Report) -> list[str]:
    if "rank" not in report.kernels.columns:
        return []
    import pandas as pd

    from perfscope.analysis.ranks.partial_read import job_summary, report_views
    from perfscope.analysis.ranks.stats import parse_ranks, stragglers

    t, s = report_views(report)
    summary = job_summary(t, s)
    pr = pd.DataFrame(summary["per_rank"])
    if not len(pr):
        return []
    lines = [f"ranks: {len(t.ranks)} ({', '.join(str(r) for r in t.ranks[:16])}{' ...' if len(t.ranks) > 16 else ''})"]
    for role, ranks in summary["roles"].items():
        lines.append(f"  {role} ranks: {ranks}")
    lines.append(f"  {summary['straggler']['statement']}")
    shown = pr
    if len(pr) > RANK_ROWS:
        order = pr.assign(_k=pr["caused_wait_ns"].astype("float64").fillna(-1.0)).sort_values("_k", ascending=False)
        shown = order.head(RANK_ROWS).sort_values("rank")
        lines.append(f"  the {RANK_ROWS} ranks whose groups wait longest for them (of {len(pr)}; --json lists all):")
    cols = [c for c in ("rank", "compute_ns", "comm_ns", "exposed_comm_ns", "comm_wait_ns", "idle_ns", "step_mean_ns")
            if c in shown]
    rows = [[str(int(r["rank"]))] + [_num(r[c], 1e6, 2) for c in cols[1:]] for _, r in shown.iterrows()]
    lines.append(table(["rank"] + [c.removesuffix("_ns") + " ms" for c in cols[1:]], rows))
    slow = stragglers(pr)
    waited = {r for g in summary["groups"] if g.get("stragglers") for r in parse_ranks(g["ranks"])}
    for _, row in slow[~slow["rank"].isin(waited)].iterrows():  # a group held back by its straggler: said above
        lines.append(f"  step-time outlier: rank {int(row['rank'])} on {str(row['metric']).removesuffix('_ns')}: "
                     f"{_num(row['value_ns'], 1e6, 2)} ms, {_num(row['margin_pct'])}% over the median of the others")
    return lines


def _finding_lines(report: Report, n: int = 5) -> list[str]:
    from perfscope.analysis.findings import run_rules, stake_clock

    found = run_rules(report)[:n]
    if not found:
        return []
    lines = [f"findings (most time at stake first; {stake_clock(report)}):"]
    for f in found:
        lines += finding_lines(f)
    return lines


def finding_lines(f: Finding) -> list[str]:
    """One finding as the terminal shows it: severity, title, time at stake and the run it is on,
    the advice, then its evidence: the share of its time at stake its items explain (or the time
    left unexplained) and its largest items, each with its share of that time."""
    from perfscope.analysis.findings import EVIDENCE_RULE_SHARE

    stake = f", {_num(f.time_at_stake_ns, 1e6, 2)} ms at stake" if f.time_at_stake_ns == f.time_at_stake_ns else ""
    run = f" [{f.run} run]" if f.run else ""
    lines = [f"  [{f.severity}] {f.title}{stake}{run}", f"      -> {f.recommendation}"]
    if not f.items:
        return lines
    share = evidence_share(f.time_at_stake_ns, f.explained_ns, EVIDENCE_RULE_SHARE)
    lines.append("      evidence" + (f" ({share}):" if share else ":"))
    for item in f.items[:EVIDENCE_ITEMS_SHOWN]:
        part, cause, label = evidence_item(item, f.time_at_stake_ns)
        lines.append(f"        {part:>4}  {label}" + ("  [cause unknown]" if cause == "unknown" else ""))
    more = evidence_more(f.items, EVIDENCE_ITEMS_SHOWN)
    if more:
        lines.append(f"              {more}")
    return lines


def render_text(report: Report, *, top: int = 12, findings: bool = True) -> str:
    """The terminal summary of ``report``."""
    src = report.manifest.get("source") or {}
    head = f"perfscope report: {report.name}"
    if src.get("kind"):
        tool = " ".join(str(t) for t in (src.get("tool") or "?", src.get("tool_version")) if t)
        head += f"   (source: {src.get('kind')}, {tool})"
    if report.manifest.get("partial"):
        head += "   [PARTIAL]"
    projection = report.manifest.get("projection")
    if projection:
        from perfscope.analysis.summaries.projection import projection_lines

        head += (f"\nPROJECTED, not measured: {projection.get('measured_name')} on {projection.get('source_device')} "
                 f"-> {projection.get('question_text')} (docs/whatif.md: the model and its measured error)")
        if projection.get("whole_run"):
            head += "\n" + "\n".join(projection_lines(projection))
    timing = _timing_line(report)
    if timing:
        head += "\n" + timing
    sections = [[head], _device_lines(report), _phase_lines(report), _speculation_lines(report), _kv_policy_lines(report),
                _request_lines(report), _client_lines(report), _tail_lines(report),
                _kernel_lines(report, top), _idle_lines(report), _rank_lines(report)]
    if findings:
        sections.append(_finding_lines(report))
    if report.warnings:
        sections.append(["warnings:"] + [f"  - {w}" for w in report.warnings])
    return terminal_text("\n".join("\n".join(s) for s in sections if s) + "\n")
