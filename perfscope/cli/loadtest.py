"""``perfscope loadtest``: continuous batching under Poisson arrivals; latency percentiles and goodput."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import click

from ._common import OUT_RULE, default_run_dir, echo_json, out_path, stage_progress

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from perfscope.report import Report


@click.command()
@click.option("--endpoint", default=None,
              help="Load-test this OpenAI-compatible server instead of the engine (e.g. http://127.0.0.1:8000/v1).")
@click.option("--api", default="completions", show_default=True, type=click.Choice(["completions", "chat"]),
              help="With --endpoint: /v1/completions or /v1/chat/completions.")
@click.option("--dataset", type=click.Path(dir_okay=False), default=None,
              help="With --endpoint: prompts (JSON lines with prompt or messages, or text one a line).")
@click.option("--tokenizer", default=None,
              help="With --endpoint: counts tokens without usage and makes text prompts (smollm2-135m, .gguf, "
                   "a folder with tokenizer.json; default: the served model's when it is one).")
@click.option("--max-concurrency", type=int, default=None, help="With --endpoint: at most this many requests in flight.")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="With --endpoint: a request's time limit, s.")
@click.option("--profile", "server_profile", is_flag=True,
              help="With --endpoint: profile the server (/start_profile, /stop_profile) and import its trace.")
@click.option("--server-trace-dir", type=click.Path(file_okay=False), default=None,
              help="With --endpoint --profile: where the server writes traces (vLLM's VLLM_TORCH_PROFILER_DIR); "
                   "perfscope serve says it itself.")
@click.option("--metrics", "scrape_metrics", is_flag=True,
              help="With --endpoint: scrape the server's Prometheus /metrics (vLLM, SGLang: KV-cache usage, running and "
                   "waiting requests, preemptions, ...) during the run, into the report's gauges table.")
@click.option("--metrics-interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="With --metrics: seconds between scrapes.")
@click.option("--burstiness", type=float, default=1.0, show_default=True,
              help="Gamma shape of the arrival gaps (1: Poisson; below 1 burstier).")
@click.option("--model", default="tiny", show_default=True,
              help="Engine config or a local HF checkpoint folder; with --endpoint, the served model's name "
                   "(default: the first of /v1/models).")
@click.option("--rate", default="10", show_default=True,
              help="Poisson arrival rate, requests/s; a comma-separated list (1,2,4,8) sweeps the rates.")
@click.option("--requests", "n_requests", type=int, default=None,
              help="Requests per rate (default 100, or all arriving within --duration).")
@click.option("--duration", type=float, default=None, help="Send only requests arriving within this many seconds.")
@click.option("--prompt-len", default="64", show_default=True,
              help="Prompt tokens: N, uniform:A,B, normal:MU,SIGMA or a file of lengths.")
@click.option("--output-len", default="32", show_default=True,
              help="Output tokens asked for (EOS may stop earlier): N, uniform:A,B, normal:MU,SIGMA or a file.")
@click.option("--max-batch", default=16, show_default=True, type=int, help="KV-cache slots: sequences in flight.")
@click.option("--max-batched-tokens", type=int, default=None,
              help="Token budget of one iteration (decode tokens first, prompts chunked into the rest).")
@click.option("--kv-capacity", type=int, default=None,
              help="KV-cache positions (tokens) of all running sequences together: when they outgrow it, the "
                   "newest request is preempted and recomputed later (default: a slot per sequence, no preemption).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of arrivals, lengths, prompts and weights.")
@click.option("--arrivals", type=click.Path(dir_okay=False), default=None,
              help="File of arrival times (s from the start, one a line) instead of Poisson arrivals.")
@click.option("--slo", default=None, help="Latency targets for goodput, seconds: ttft=0.5,tpot=0.05[,e2e=S].")
@click.option("--kv-dtype", default="auto", show_default=True, type=click.Choice(["auto", "int8", "fp8"]),
              help="KV-cache element type (auto: the model's dtype; int8 with per-head scales; fp8 e4m3).")
@click.option("--kv-policy", default=None, help="KV-cache policy: full, streaming:sink=S,window=W (StreamingLLM), h2o:budget=B[,recent=R] (heavy hitters) "
                   "or quest:budget=B[,page=P] (query-aware pages); docs/kv-policies.md.")
@click.option("--eos-id", type=int, default=None, help="Stop a request at this token (default: the model's EOS).")
@click.option("--ignore-eos", is_flag=True, help="Always generate the full output length.")
@click.option("--policy", default="continuous", show_default=True, type=click.Choice(["continuous", "static"]),
              help="static: admit a batch only when the engine is idle (the baseline).")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--no-profile", is_flag=True, help="No profiler (clean latencies; no kernels in the report).")
@click.option("--out", type=click.Path(), default=None, help=f"Report folder: {OUT_RULE} (default: runs/<timestamp>-loadtest.perfscope).")
@click.option("--force", is_flag=True, help="Replace an existing report folder.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def loadtest(model: str, rate: str, n_requests: int | None, duration: float | None, prompt_len: str,
             output_len: str, max_batch: int, max_batched_tokens: int | None, seed: int, arrivals: str | None,
             slo: str | None, kv_dtype: str, eos_id: int | None, ignore_eos: bool, policy: str, device: str,
             dtype: str, no_profile: bool, out: str | None, force: bool, no_html: bool, as_json: bool,
             endpoint: str | None = None, api: str = "completions", dataset: str | None = None,
             tokenizer: str | None = None, max_concurrency: int | None = None, timeout_s: float = 120.0,
             server_profile: bool = False, server_trace_dir: str | None = None, burstiness: float = 1.0,
             scrape_metrics: bool = False, metrics_interval: float = 1.0, kv_capacity: int | None = None,
             kv_policy: str | None = None) -> None:
    """Serve a stream of requests with continuous batching and report TTFT, TPOT, ITL, E2E
    percentiles, throughput and goodput, next to the roofline of the same run.

    With --endpoint URL, send the same workload to an OpenAI-compatible server (vLLM, SGLang,
    llama.cpp, transformers serve, perfscope serve) and report the same metrics."""
    if endpoint is not None and kv_policy is not None:
        from perfscope.errors import UsageError

        raise UsageError("--kv-policy runs in perfscope's own engine, not at an --endpoint",
                         hint="start the server with it: perfscope serve --kv-policy ...")
    if endpoint is not None:
        if kv_capacity is not None:
            from perfscope.errors import UsageError

            raise UsageError("--kv-capacity applies to the engine's load test, not to --endpoint",
                             hint="the server's own KV cache is its setting (vLLM: --gpu-memory-utilization)")
        ctx = click.get_current_context()
        model_given = ctx.get_parameter_source("model") == click.core.ParameterSource.COMMANDLINE
        _endpoint(endpoint=endpoint, api=api, served=model if model_given else None, rate=rate, n_requests=n_requests,
                  duration=duration, prompt_len=prompt_len, output_len=output_len, seed=seed, arrivals=arrivals,
                  burstiness=burstiness, max_concurrency=max_concurrency, dataset=dataset, tokenizer=tokenizer,
                  slo=slo, timeout_s=timeout_s, ignore_eos=ignore_eos, profile=server_profile,
                  trace_dir=server_trace_dir, out=out, force=force, no_html=no_html, as_json=as_json,
                  metrics=scrape_metrics, metrics_interval=metrics_interval)
        return
    only = {"--dataset": dataset, "--tokenizer": tokenizer, "--max-concurrency": max_concurrency,
            "--profile": server_profile or None, "--server-trace-dir": server_trace_dir,
            "--metrics": scrape_metrics or None}
    given = [k for k, v in only.items() if v is not None]
    if given:
        from perfscope.errors import UsageError

        raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} with --endpoint URL only",
                         hint="the engine's load test is profiled unless --no-profile")
    from perfscope.analysis.summaries.loadtest import parse_slo
    from perfscope.sessions.loadtest import (
        LoadRun,
        cli_payload,
        parse_rates,
        read_arrivals,
        run_loadtest,
    )
    from perfscope.sessions.profile import resolve_device

    rates = parse_rates(rate)
    if arrivals:
        read_arrivals(arrivals)  # fail early on a bad file
    run = LoadRun(model=model, rates=tuple(rates), burstiness=burstiness, requests=n_requests, duration_s=duration, prompt_len=prompt_len,
                  output_len=output_len, max_batch=max_batch, max_batched_tokens=max_batched_tokens, seed=seed,
                  arrivals=arrivals, slo=parse_slo(slo), profile=not no_profile, kv_dtype=kv_dtype, device=device,
                  dtype=dtype, eos_id=eos_id, ignore_eos=ignore_eos, policy=policy, kv_capacity=kv_capacity,
                  kv_policy=kv_policy)
    run.check()
    resolve_device(device)
    _write_and_print(lambda advance: run_loadtest(run, progress=advance), cli_payload, 5 + len(rates),
                     out=out, force=force, no_html=no_html, as_json=as_json)


def _write_and_print(run: Callable[[Any], Report], payload_of: Callable[[Report], dict[str, Any]], stages: int, *,
                     out: str | None, force: bool, no_html: bool, as_json: bool) -> tuple[Path, dict[str, Any]]:
    """Run a load test (engine or endpoint) into its report folder and print its summary (or JSON);
    the written folder and the payload."""
    from perfscope.api import save_with_html
    from perfscope.errors import OutputExistsError

    target = out_path(out, default=default_run_dir("loadtest"))
    if target.exists() and not force:
        raise OutputExistsError(target)
    with stage_progress(stages, enabled=not as_json) as advance:
        report = run(advance)
        advance("writing the report")
        written = save_with_html(report, target, force=force, html=not no_html)
    payload = payload_of(report)
    if as_json:
        echo_json({"report_path": str(written), **payload})
    else:
        click.echo(render_load_text(payload))
        click.echo(f"report: {written}")
        if not no_html:
            click.echo(f"html:   {written / 'report.html'}")
    return written, payload


def _endpoint(*, endpoint: str, api: str, served: str | None, rate: str, n_requests: int | None,
              duration: float | None, prompt_len: str, output_len: str, seed: int, arrivals: str | None,
              burstiness: float, max_concurrency: int | None, dataset: str | None, tokenizer: str | None,
              slo: str | None, timeout_s: float, ignore_eos: bool, profile: bool, trace_dir: str | None,
              out: str | None, force: bool, no_html: bool, as_json: bool, metrics: bool = False,
              metrics_interval: float = 1.0) -> None:
    import os

    from perfscope.analysis.summaries.loadtest import parse_slo
    from perfscope.sessions.endpoint import EndpointRun, cli_payload, run_endpoint_loadtest
    from perfscope.sessions.loadtest import parse_rates, read_arrivals

    rates = parse_rates(rate)
    if arrivals:
        read_arrivals(arrivals)
    run = EndpointRun(endpoint=endpoint, api=api, model=served, rates=tuple(rates), requests=n_requests,
                      duration_s=duration, prompt_len=prompt_len, output_len=output_len, seed=seed, arrivals=arrivals,
                      burstiness=burstiness, max_concurrency=max_concurrency, dataset=dataset, tokenizer=tokenizer,
                      slo=parse_slo(slo), timeout_s=timeout_s, ignore_eos=ignore_eos,
                      api_key=os.environ.get("OPENAI_API_KEY"), profile=profile, profile_dir=trace_dir,
                      metrics=metrics, metrics_interval_s=metrics_interval)
    run.check()
    written, payload = _write_and_print(lambda advance: run_endpoint_loadtest(run, progress=advance), cli_payload,
                                        3 + len(rates), out=out, force=force, no_html=no_html, as_json=as_json)
    if payload.get("partial"):
        from perfscope.sessions.endpoint import Interrupted

        raise Interrupted(f"interrupted: the partial report (every request, the unsent ones as not_sent) is {written}")


def _ms(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:.1f}"


def _num(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _tail_lines(tails: dict[str, Any] | None) -> list[str]:
    """One line per run: each p99 and the part that holds most of it (``perfscope analyze`` has them all)."""
    if not tails:
        return []
    out = []
    for t in tails.get("runs") or [tails]:
        cells = []
        for metric in ("ttft", "itl", "e2e"):
            e = t[metric]["p99"]
            parts = {k: v for k, v in e["parts"].items() if v is not None}
            if e["value_s"] is None or not parts:
                continue
            top = max(parts, key=lambda k: parts[k])
            share = parts[top] / e["value_s"] * 100 if e["value_s"] else 0.0
            cells.append(f"{metric.upper()} {_ms(e['value_s'])} ms, {share:.0f}% {top.replace('_', ' ')}")
        if cells:
            label = f"{t['run']}: " if t.get("run") and tails.get("runs") else ""
            out.append(f"{label}p99 tails (largest part; joined by {t['source']}): " + "; ".join(cells))
    return out


def render_load_text(payload: dict[str, Any]) -> str:
    """The terminal summary: one row per rate with throughputs and p50/p99 latencies (ms)."""
    from perfscope.format import terminal_text
    from perfscope.text_report import table

    runs = payload.get("runs") or [payload]
    head = ["run", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "ITL p99", "E2E p50",
            "E2E p99"]
    has_good = any("goodput_per_s" in r for r in runs)
    if has_good:
        head.append("goodput/s")
    rows = []
    knee_rate = payload.get("knee_rate_per_s")
    for r in runs:
        label = str(r.get("run")) + (" (knee)" if knee_rate is not None and r.get("rate_per_s") == knee_rate else "")
        row = [label, _num(r["request_throughput_per_s"]), _num(r["output_tokens_per_s"], ".1f"),
               _ms(r["ttft_s"]["p50"]), _ms(r["ttft_s"]["p99"]), _ms(r["tpot_s"]["p50"]), _ms(r["tpot_s"]["p99"]),
               _ms(r["itl_s"]["p99"]), _ms(r["e2e_s"]["p50"]), _ms(r["e2e_s"]["p99"])]
        if has_good:
            row.append(_num(r.get("goodput_per_s")))
        rows.append(row)
    lines = ["latencies in ms; TTFT and E2E from arrival (queueing included)", table(head, rows)]
    for r in runs:
        if "requests_sent" in r:
            fails = ", ".join(f"{k} {v}" for k, v in r.get("failures", {}).items()) or "none"
            lines.append(f"{r.get('run')}: {r['requests']} of {r['requests_sent']} requests completed (failed: {fails}); "
                         f"scheduled TTFT p50 {_ms(r['scheduled_ttft_s']['p50'])} ms, p99 "
                         f"{_ms(r['scheduled_ttft_s']['p99'])} ms; client dispatch delay p99 "
                         f"{_ms(r['dispatch_delay_s']['p99'])} ms")
    lines += _tail_lines(payload.get("tails"))
    err = payload.get("kv_logit_error")
    if err:
        what = " ".join(x for x in (err["kv_dtype"] if err["kv_dtype"] != "auto" else "",
                                    err.get("kv_policy", "full") if err.get("kv_policy", "full") != "full" else "") if x)
        lines.append(f"{what} KV cache vs the full {err.get('reference')} cache: logit max abs error "
                     f"{err['max_abs']:.3g}, relative RMS {err['rel_rms']:.3g}, top-1 agreement "
                     f"{err['top1_agreement'] * 100:.1f}% ({int(err['positions'])} positions)")
    return terminal_text("\n".join(lines))
