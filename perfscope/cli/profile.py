"""``perfscope profile``: profile the built-in engine (default) or a Python script."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import click

from perfscope.collectors import collector_names

from ._common import OUT_RULE, default_run_dir, echo_json, out_path, stage_progress

ENGINE_STAGES = 7


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--model", default="small", show_default=True,
              help="Engine config (tiny, small, qwen2.5-0.5b, llama-3-8b, ...) or a local HF checkpoint folder.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Requests in the batch.")
@click.option("--prompt-len", default=128, show_default=True, type=click.IntRange(min=1), help="Prompt tokens per request.")
@click.option("--gen-len", default=32, show_default=True, type=click.IntRange(min=1), help="Tokens to generate per request.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--attention", default="sdpa", show_default=True, type=click.Choice(["sdpa", "naive"]))
@click.option("--chunked-prefill", type=click.IntRange(min=1), default=None, help="Prefill in chunks of N tokens.")
@click.option("--prefix-cache", is_flag=True, help="Compute the prompts' shared prefix once and reuse its KV cache.")
@click.option("--temperature", default=0.0, type=click.FloatRange(min=0), help="Sampling temperature (0 = greedy).")
@click.option("--top-k", type=click.IntRange(min=1), default=None)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=None)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--compile/--no-compile", "compile", default=None,
              help="Compile decode with torch.compile (on CUDA: CUDA graphs, mode reduce-overhead). Default: "
                   "on for CUDA, off (eager) on the CPU. Compile time is reported apart (compile_s), never in TTFT.")
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Real prompts, one per line (.jsonl: one JSON string per line); needs a model with a "
                   "tokenizer (smollm2-135m, a .gguf file). The batch is the file's prompts.")
@click.option("--chat", is_flag=True, help="Wrap each --prompt-file prompt in the model's chat template.")
@click.option("--ignore-eos", is_flag=True, help="Generate --gen-len tokens even past the end-of-sequence token.")
@click.option("--speculative", default=None, help="Speculative decoding: ngram or self:N (batch 1).")
@click.option("--draft-len", default=4, show_default=True, type=click.IntRange(min=1),
              help="Tokens drafted per speculative step.")
@click.option("--kv-policy", default=None,
              help="KV-cache policy: full, streaming:sink=S,window=W (StreamingLLM), h2o:budget=B[,recent=R] (heavy hitters) "
                   "or quest:budget=B[,page=P] (query-aware pages); docs/kv-policies.md."[:-1] + " The full cache runs beside it, pass for pass: the report says "
                   "what the policy saved.")
@click.option("--gemm-curve-s", default=8.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds for the GEMM size curve measured after the profiled run (the engine's linears from 1 row "
                   "up, read by `whatif` for another batch, prompt or draft length on this device); 0: none.")
@click.option("--collector", default="torch", show_default=True, type=click.Choice(collector_names()),
              help="Profiler to run: torch (in-process), or a registered collector that runs a COMMAND "
                   "(nsys, ncu: the tool installed; nvml: samples the GPUs while it runs).")
@click.option("--memory", is_flag=True, help="Record every allocation (torch.profiler profile_memory; on CUDA also the "
              "allocator's history and a memory snapshot): the report's memory timeline, categories and peak "
              "(`analyze --memory`). The engine's weights and KV cache are named exactly.")
@click.option("--nvml", is_flag=True, help="Also sample GPU utilisation, clocks, power and memory with NVML "
              "(with any collector).")
@click.option("--nvml-rate", default=10.0, show_default=True, type=click.FloatRange(min=0.1, max=100),
              help="NVML samples per second.")
@click.option("--set", "ncu_set", default="roofline", show_default=True,
              type=click.Choice(["roofline", "detailed", "full", "basic"]), help="ncu section set.")
@click.option("--clock-control", default="base", show_default=True, type=click.Choice(["base", "none"]),
              help="ncu clock control (base: locked base clocks; recorded as the roofs' clock).")
@click.option("--kernel-name", default=None, help="ncu: profile only kernels matching this (regex:... allowed).")
@click.option("--launch-skip", type=click.IntRange(min=0), default=None, help="ncu: matching launches to skip first.")
@click.option("--launch-count", type=click.IntRange(min=1), default=None, help="ncu: matching launches to profile.")
@click.option("--nvtx-include", multiple=True, help="ncu: only kernels inside this NVTX range (e.g. decode/).")
@click.option("--top-n", type=click.IntRange(min=1), default=None,
              help="ncu: profile only the N kernels with the most GPU time (a cheap first pass finds them, "
              "then one profiled run per kernel).")
@click.option("--top-n-launches", type=click.IntRange(min=1), default=1, show_default=True,
              help="ncu --top-n: launches profiled per top kernel.")
@click.option("--no-baseline", is_flag=True,
              help="Skip the unprofiled run (the engine's warm passes; a script's second run with transformers "
                   "generate() step timing only) that gives the headline TTFT/TPOT and the profiler overhead ratio.")
@click.option("--stack", is_flag=True, help="With -- python SCRIPT: record Python stacks (torch.profiler with_stack), "
              "so the report has the nn.Module hierarchy (analyze --tree).")
@click.option("--timeout", type=click.FloatRange(min=1), default=None, help="Stop the profiled command after this many seconds.")
@click.option("--out", type=click.Path(), default=None, help=f"Report folder: {OUT_RULE} (default: runs/<timestamp>-<model>.perfscope).")
@click.option("--force", is_flag=True, help="Replace an existing report folder.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary; print only the report path.")
@click.option("--steps", "steps_regex", default=None, metavar="REGEX",
              help="With a COMMAND: make each NVTX / record_function range matching REGEX a step (framework `user`).")
@click.option("--phase-of", "phase_of", multiple=True, metavar="REGEX=PHASE",
              help="With --steps: steps whose range name matches REGEX have PHASE; repeatable.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def profile(command: tuple[str, ...], collector: str, out: str | None, force: bool, no_html: bool,
            as_json: bool, quiet: bool, nvml: bool, nvml_rate: float, ncu_set: str, clock_control: str,
            kernel_name: str | None, launch_skip: int | None, launch_count: int | None,
            nvtx_include: tuple[str, ...], top_n: int | None, top_n_launches: int, timeout: float | None,
            no_baseline: bool, stack: bool = False, steps_regex: str | None = None,
            phase_of: tuple[str, ...] = (), **engine: object) -> None:
    """Profile the built-in LLM engine (no COMMAND) or a Python script (-- python train.py ...).

    With no arguments it profiles the `small` model on the best available device and writes
    runs/<timestamp>-small.perfscope/ with report.html inside.
    """
    from perfscope.api import save_with_html
    from perfscope.errors import UsageError
    from perfscope.sessions.profile import (
        EngineRun,
        attach_counters,
        nvml_sampler,
        profile_engine,
        profile_external,
        profile_script,
        resolve_device,
    )
    from perfscope.text_report import render_text

    run = EngineRun(**engine)  # type: ignore[arg-type]
    run.check()
    if (steps_regex or phase_of) and not command:
        raise UsageError("--steps names the steps of a profiled command; the engine marks its own",
                         hint="perfscope profile --steps 'decode_step' -- python run.py")
    if phase_of and not steps_regex:
        raise UsageError("--phase-of goes with --steps REGEX")
    from perfscope.analysis.steps import StepRule

    rule = StepRule.parse(steps_regex, phase_of) if steps_regex else None
    if collector != "torch" and not command:
        raise UsageError(f"--collector {collector} profiles a command",
                         hint=f"perfscope profile --collector {collector} -- python run.py")
    if stack and (collector != "torch" or not command):
        raise UsageError("--stack records a Python script's module calls",
                         hint="perfscope profile --stack -- python run.py (the engine's hierarchy comes from its ranges)")
    if collector == "torch" and command:
        resolve_device(run.device)  # fail before any work when the device is absent (the engine's first step)
    from perfscope.redact import redact_text
    from perfscope.sessions.profile import script_name

    stem = (redact_text(Path(command[0]).stem) if collector != "torch" else script_name(command)) if command else \
        str(run.model).rstrip("/").split("/")[-1]
    target = out_path(out, default=default_run_dir(stem))
    if target.exists() and not force:
        from perfscope.errors import OutputExistsError

        raise OutputExistsError(target)
    raw: dict = {}
    with stage_progress(ENGINE_STAGES, enabled=not quiet and not as_json) as advance:
        if collector != "torch":
            options = _tool_options(collector, timeout, nvml_rate, ncu_set=ncu_set, clock_control=clock_control,
                                    kernel_name=kernel_name, launch_skip=launch_skip, launch_count=launch_count,
                                    nvtx_include=nvtx_include, top_n=top_n, top_n_launches=top_n_launches)
            report, raw = profile_external(command, collector=collector, options=options, nvml=nvml,
                                           nvml_rate_hz=nvml_rate, progress=advance)
        else:
            sampler = nvml_sampler(nvml_rate) if nvml else None
            with sampler if sampler is not None else nullcontext():
                report = (profile_script(command, device=run.device, progress=advance, baseline=not no_baseline,
                                         stack=stack, memory=run.memory)
                          if command else profile_engine(run, progress=advance, baseline=not no_baseline))
            if sampler is not None:
                report = attach_counters(report, sampler)
        if rule is not None:
            from perfscope.analysis.readers.finish import with_steps

            report = with_steps(report, rule)
        advance("writing the report")
        written = save_with_html(report, target, force=force, html=not no_html, extra_files=raw)
    if as_json:
        from .analyze import analysis_payload

        echo_json({"report_path": str(written), **analysis_payload(report, 12)})
        return
    if not quiet:
        click.echo(render_text(report), nl=False)
        click.echo(f"report: {written}")
        if not no_html:
            click.echo(f"html:   {written / 'report.html'}")
    else:
        click.echo(str(written))
    if report.params.get("interrupted"):
        click.echo("perfscope: interrupted; the partial report above holds what was collected", err=True)
        raise SystemExit(130)


def _tool_options(collector: str, timeout: float | None, nvml_rate: float, **ncu: object) -> object:
    """The collector's options dataclass from the command-line flags."""
    from perfscope.collectors import NcuOptions, NsysOptions, NvmlOptions, get_collector

    if collector == "nsys":
        return NsysOptions(timeout_s=timeout)
    if collector == "nvml":
        return NvmlOptions(rate_hz=nvml_rate, timeout_s=timeout)
    if collector != "ncu":  # a collector registered later: its own defaults
        return get_collector(collector).options_type()  # type: ignore[attr-defined]
    return NcuOptions(section_set=ncu["ncu_set"], clock_control=ncu["clock_control"],  # type: ignore[arg-type]
                      kernel_name=ncu["kernel_name"], launch_skip=ncu["launch_skip"],  # type: ignore[arg-type]
                      launch_count=ncu["launch_count"], nvtx_include=tuple(ncu["nvtx_include"]),  # type: ignore[arg-type]
                      top_n=ncu["top_n"], launches_per_kernel=ncu["top_n_launches"],  # type: ignore[arg-type]
                      timeout_s=timeout)
