"""``perfscope profile``: profile the built-in engine (default) or a Python script."""

from __future__ import annotations

from pathlib import Path

import click

from ._common import as_report_path, default_run_dir, echo_json, stage_progress

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
@click.option("--collector", default="torch", show_default=True, type=click.Choice(["torch", "nsys", "ncu"]),
              help="Profiler to run (nsys/ncu need a COMMAND and the tool installed).")
@click.option("--out", type=click.Path(), default=None, help="Report folder (default: runs/<timestamp>-<model>.perfscope).")
@click.option("--force", is_flag=True, help="Replace an existing report folder.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary; print only the report path.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def profile(command: tuple[str, ...], collector: str, out: str | None, force: bool, no_html: bool,
            as_json: bool, quiet: bool, **engine: object) -> None:
    """Profile the built-in LLM engine (no COMMAND) or a Python script (-- python train.py ...).

    With no arguments it profiles the `small` model on the best available device and writes
    runs/<timestamp>-small.perfscope/ with report.html inside.
    """
    from perfscope.api import save_with_html
    from perfscope.errors import UsageError
    from perfscope.session import EngineRun, profile_engine, profile_script, resolve_device
    from perfscope.text_report import render_text

    if collector != "torch":
        raise UsageError(f"--collector {collector} is not wired into `perfscope profile` yet",
                         hint="run the tool yourself and use `perfscope import`")
    run = EngineRun(**engine)  # type: ignore[arg-type]
    run.check()
    resolve_device(run.device)  # fail before any work when the device is absent
    stem = Path(command[-1]).stem if command else str(run.model).rstrip("/").split("/")[-1]
    target = as_report_path(out) if out else default_run_dir(stem)
    if target.exists() and not force:
        from perfscope.errors import OutputExistsError

        raise OutputExistsError(target)
    with stage_progress(ENGINE_STAGES, enabled=not quiet and not as_json) as advance:
        if command:
            report = profile_script(command, device=run.device, progress=advance)
        else:
            report = profile_engine(run, progress=advance)
        advance("writing the report")
        written = save_with_html(report, target, force=force, html=not no_html)
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
