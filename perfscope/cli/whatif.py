"""``perfscope whatif REPORT [--gpu ...] [--batch ...]``: a measured run projected onto another GPU, batch,
prompt, context or dtype (several values per flag make a sweep); docs/whatif.md has the model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from perfscope.format import banded, duration, pct, seconds, si, terminal_text

from ._common import echo_json

if TYPE_CHECKING:
    from collections.abc import Callable

    from perfscope.analysis.projection.project import WhatifResult
    from perfscope.report import Report


MAX_VALUES = 64
"""Values one flag may sweep."""
LIMITS = {"--batch": 1 << 16, "--prompt-len": 1 << 24, "--context": 1 << 24, "--gen-len": 1 << 24, "--draft-len": 64}
"""The largest value of each flag: a projection allocates per sequence and per draft position, so a value is
checked before any of it (``--batch 1000000000`` asked for 7.45 GiB)."""


def _ints(flag: str) -> Callable[[click.Context, click.Parameter, str | None], list[int] | None]:
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
        if value is None:
            return None
        parts = value.split(",")
        if len(parts) > MAX_VALUES:
            raise click.BadParameter(f"{len(parts)} values: sweep at most {MAX_VALUES}")
        try:
            out = [int(v) for v in parts if v.strip() and len(v.strip()) <= 12]
        except ValueError:
            raise click.BadParameter(f"{value[:80]!r}: give whole numbers, comma-separated (e.g. 1,8,64)") from None
        if not out or len(out) != len([v for v in parts if v.strip()]) or any(not 1 <= v <= LIMITS[flag] for v in out):
            raise click.BadParameter(f"{value[:80]!r}: give whole numbers from 1 to {LIMITS[flag]:,}")
        return out
    return parse


def _texts(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


@click.command()
@click.argument("path", type=click.Path())
@click.option("--gpu", callback=_texts, help="Target GPU: a datasheet row (B200, H100, MI300X...) or a report "
              "measured there (its roofs); comma-separated for a sweep.")
@click.option("--batch", callback=_ints("--batch"), help="Sequences per step, e.g. 1,8,64.")
@click.option("--prompt-len", callback=_ints("--prompt-len"), help="Prompt tokens per sequence.")
@click.option("--context", callback=_ints("--context"), help="KV length the decode steps start from (default: the prompt).")
@click.option("--gen-len", callback=_ints("--gen-len"), help="Generated tokens per sequence.")
@click.option("--weights-dtype", callback=_texts, help="Weight dtype: bf16, fp16, fp8 (W8A8 GEMMs), int8, fp32.")
@click.option("--kv-dtype", callback=_texts, help="KV-cache dtype: bf16, fp16, fp8.")
@click.option("--kv-policy", "kv_policy", multiple=True,
              help="KV-cache policy the decode steps run under: streaming:sink=S,window=W, h2o:budget=B[,recent=R], "
                   "quest:budget=B[,page=P] (repeat the flag for a sweep; docs/kv-policies.md).")
@click.option("--draft-len", callback=_ints("--draft-len"),
              help="Speculative decoding: draft tokens per step (a run with drafting: tokens/s for each K).")
@click.option("--out", type=click.Path(), help="Where to save: one question, its report (X.perfscope, X or DIR/ for "
              "DIR/NAME__QUESTION.perfscope); several, a folder X with NAME__QUESTION.perfscope each.")
@click.option("--force", is_flag=True, help="Replace existing projected reports in --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the projections as JSON.")
def whatif(path: str, gpu: list[str] | None, batch: list[int] | None, prompt_len: list[int] | None,
           context: list[int] | None, gen_len: list[int] | None, weights_dtype: list[str] | None,
           kv_dtype: list[str] | None, draft_len: list[int] | None, out: str | None, force: bool,
           as_json: bool, kv_policy: tuple[str, ...] = ()) -> None:
    """Project a measured REPORT: what would it do on another GPU, batch, prompt, context or precision?

    Every number printed is a projection (docs/whatif.md: the model, its rules and its measured error).
    """
    from perfscope.analysis.projection.project import measured_metrics
    from perfscope.analysis.projection.speculative import speculative_sweep
    from perfscope.api import load, run_whatif

    measured = load(path)
    if draft_len is not None:
        table = speculative_sweep(measured, draft_len, gpu=gpu[0] if gpu else None)
        if as_json:
            echo_json(table.to_dict())
        else:
            click.echo(table.render())
        return
    results = run_whatif(measured, out=out, force=force, gpu=gpu, batch=batch,
                         prompt_len=prompt_len, context=context, gen_len=gen_len, weights_dtype=weights_dtype,
                         kv_dtype=kv_dtype, kv_policy=list(kv_policy) or None)
    base = measured_metrics(measured)
    if as_json:
        from perfscope.analysis.summaries.kv_policy import kv_policy_summary

        echo_json({"measured": {"report": path, "metrics": base},
                   "projections": [{**r.to_dict(), **({"kv_policy": kv_policy_summary(r.report)}
                                                      if r.question.kv_policy else {})} for r in results]})
        return
    click.echo(terminal_text(render_results(measured, base, results)))


def render_results(measured: Report, base: dict[str, float], results: list[WhatifResult]) -> str:
    """The terminal output of ``whatif``: the headline table (a run with steps) with each projection's band,
    then each projection's whole run (kernel, busy and wall time; by kernel family when the run has no
    steps), the notes, and where each report was written."""
    from perfscope.analysis.projection.project import metric_bands
    from perfscope.analysis.summaries.kv_policy import kv_policy_line
    from perfscope.analysis.summaries.projection import band_line, projection_lines

    lines = [f"measured: {measured.name} on {measured.device.name if measured.device else '?'}"]
    stepped = len(measured.steps) > 0

    def row(label: str, m: dict[str, float]) -> str:
        return (f"{label:<40} {duration(m.get('ttft_s_mean', float('nan')) * 1e9):>10} "
                f"{duration(m.get('tpot_s_mean', float('nan')) * 1e9):>10} {si(m.get('decode_tokens_per_s', float('nan'))):>10} "
                f"{pct(m.get('prefill_mfu', float('nan')) * 100):>12} {pct(m.get('decode_mbu', float('nan')) * 100):>11}")

    def band_of_row(r: WhatifResult) -> str:
        b = metric_bands(r.report, r.metrics)
        parts = []
        for key, label, fmt in (("ttft_s_mean", "TTFT", seconds), ("tpot_s_mean", "TPOT", seconds),
                                ("decode_tokens_per_s", "tok/s", si)):
            if key in r.metrics and r.metrics[key] == r.metrics[key]:
                parts.append(f"{label} {banded(r.metrics[key], b[key]['low'], b[key]['high'], fmt)}")
        return "  band: " + ", ".join(parts) if parts else ""

    if stepped:
        lines.append(f"{'question':<40} {'TTFT':>10} {'TPOT':>10} {'tok/s':>10} {'prefill MFU':>12} {'decode MBU':>11}")
        lines.append(row("measured", base))
        for r in results:
            lines.append(row(f"projected: {r.question.text()}"[:40], r.metrics))
            band = band_of_row(r)
            if band:
                lines.append(band)
    for r in results:
        proj = r.report.manifest.get("projection") or {}
        if stepped:
            whole = proj.get("whole_run") or {}
            parts = [f"{label} {banded((whole.get(key) or {}).get('projected'), (whole.get(key) or {}).get('low'), (whole.get(key) or {}).get('high'))}"
                     for key, label in (("kernel_time_s", "kernel time"), ("wall_s", "wall time"))]
            lines.append(f"whole run, projected: {r.question.text()}: {', '.join(parts)}")
        else:
            lines.append(f"projected: {r.question.text()} (the run has no steps: the whole run)")
            lines.extend(projection_lines(proj))
    if stepped:
        lines.extend(dict.fromkeys(band_line(r.report.manifest.get("projection") or {}) for r in results))
    for r in results:
        line = kv_policy_line(r.report)
        if line:
            lines.append(f"{r.question.text()[:40]}: {line}")
    seen: set[str] = set()
    for r in results:
        for note in (r.report.manifest.get("projection") or {}).get("notes", []):
            if note not in seen:
                seen.add(note)
                lines.append(f"note: {note}")
        if r.path is not None:
            lines.append(f"wrote {r.path}")
    return "\n".join(lines)
