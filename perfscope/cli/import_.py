"""``perfscope import PATH``: turn a profiler output into a report folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from perfscope.format import terminal_text

from ._common import OUT_RULE, out_path, roofs_spec

if TYPE_CHECKING:
    from perfscope.report import Report


@click.command(name="import")
@click.argument("path", type=click.Path())
@click.option("--out", type=click.Path(), default=None, help=f"Report folder to write: {OUT_RULE} (default: ./NAME.perfscope).")
@click.option("--force", is_flag=True, help="Replace an existing report folder.")
@click.option("--html/--no-html", default=True, show_default=True, help="Also write report.html inside the folder.")
# -- multi-rank import (logic in perfscope/cli/_ranks.py and perfscope.analysis.ranks.dask_import) --
@click.option("--ranks", is_flag=True, help="PATH is a folder or quoted glob of per-rank traces: import them in "
              "parallel on Dask into one multi-rank report.")
@click.option("--scheduler", default=None, metavar="ADDRESS", help="With --ranks: run on this Dask scheduler "
              "(tcp://HOST:8786) instead of a local cluster.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="With --ranks: local Dask workers "
              "(default: sized to this machine's CPUs and memory).")
# -- roofs and analytic costs --
@click.option("--roofs", "roofs", default=None, metavar="NAME|cuda|REPORT",
              help="Classify against other roofs: a datasheet row by name (MI300X, \"H100 SXM5\", B200: "
              "`perfscope devices --datasheet` lists them), `cuda` (this machine's GPU, measured and cached like "
              "`perfscope devices`) or a .perfscope report folder (its device roofs). Default: the file's own "
              "(ncu peak metrics x clock), else the datasheet row of the trace's device name or properties.")
@click.option("--capture", "capture", default=None, type=click.Path(), metavar="PATH",
              help="The engine's CUDA-graph capture trace, or a folder of them (vLLM/SGLang capture_traces/ with "
              "execution_details.json): graph replays take the op, shapes and cost of their captured kernels. "
              "Default: a capture_traces/ folder beside the trace.")
@click.option("--engine", "engine_model", default=None, metavar="MODEL",
              help="The capture is of perfscope's engine with this model config (llama-3.2-1b, ...): put the "
              "useful FLOPs and bytes of each GEMM / attention kernel beside the measured ones (needs NVTX ranges).")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="With --engine: sequences per step.")
@click.option("--prompt-len", type=click.IntRange(min=1), default=None, help="With --engine: prompt tokens.")
@click.option("--decode-context", type=click.IntRange(min=1), default=None,
              help="With --engine: cache length of the profiled decode step (prices decode attention).")
@click.option("--itemsize", type=click.IntRange(min=1), default=2, show_default=True,
              help="With --engine: bytes per weight/activation element (2: bf16/fp16).")
@click.option("--analytic", "analytic_trace", default=None, type=click.Path(), metavar="TRACE",
              help="A Kineto trace (or report) of the same program: its analytic FLOPs and bytes go beside the "
              "measured ones, matched by range path, kernel name and launch order.")
# -- steps of any engine (analysis/steps.py) --
@click.option("--steps", "steps_regex", default=None, metavar="REGEX",
              help="Make each NVTX / record_function range whose name matches REGEX a step (framework `user`); "
              "named groups (?P<batch>..) and (?P<tokens>..) fill the step's batch and tokens.")
@click.option("--phase-of", "phase_of", multiple=True, metavar="REGEX=PHASE",
              help="With --steps: steps whose range name matches REGEX have PHASE (prefill, decode, ...); repeatable.")
@click.option("--model", "memory_model", default=None, metavar="MODEL",
              help="For a memory record (a CUDA memory snapshot, a profile_memory trace): the model (an engine "
              "model or a Hugging Face config.json) whose parameter sizes name the weights among the blocks "
              "allocated before the record began (docs/memory.md).")
@click.option("--max-events", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stop with an error past N trace events (a bounded import; PERFSCOPE_MAX_MEMORY bounds "
              "its memory, e.g. 2G). Default: no limit. See docs/limits.md.")
def import_(path: str, out: str | None, force: bool, html: bool, ranks: bool, scheduler: str | None,
            workers: int | None, roofs: str | None, capture: str | None, engine_model: str | None, batch: int | None,
            prompt_len: int | None, decode_context: int | None, itemsize: int, analytic_trace: str | None,
            steps_regex: str | None = None, phase_of: tuple[str, ...] = (), max_events: int | None = None,
            memory_model: str | None = None) -> None:
    """Import a Kineto trace, an nsys SQLite export / .nsys-rep, an ncu report / CSV, or a rocprof output
    (rocprofv3 CSV / JSON / rocpd, rocprof v1/v2, a rocprof-compute workload folder)."""
    if ranks or scheduler or workers:
        from ._ranks import run_rank_import

        if not ranks:
            raise click.UsageError("--scheduler and --workers go with --ranks")
        run_rank_import(path, out=out, force=force, html=html, scheduler=scheduler, workers=workers)
        return
    from perfscope.analysis.readers.detect import import_file
    from perfscope.analysis.readers.finish import with_steps
    from perfscope.analysis.steps import StepRule
    from perfscope.api import save_with_html
    from perfscope.limits import budget

    if phase_of and not steps_regex:
        raise click.UsageError("--phase-of goes with --steps REGEX")
    rule = StepRule.parse(steps_regex, phase_of) if steps_regex else None
    with budget(max_events=max_events):
        report = import_file(path, device=roofs_spec(roofs) if roofs else None, capture=capture)
    if rule is not None:
        report = with_steps(report, rule)
    if memory_model:
        from perfscope.analysis.memory import with_model

        report = with_model(report, memory_model)
    if engine_model and analytic_trace:
        raise click.UsageError("give either --engine or --analytic, not both")
    if engine_model:
        report = _with_engine(report, engine_model, batch, prompt_len, decode_context, itemsize)
    elif batch or prompt_len or decode_context:
        raise click.UsageError("--batch, --prompt-len and --decode-context go with --engine MODEL")
    if analytic_trace:
        from perfscope.analysis.costs.analytic import with_trace_costs

        report = with_trace_costs(report, import_file(analytic_trace))
    target = out_path(out, default=Path(Path(path).name.split(".")[0] + ".perfscope"))
    written = save_with_html(report, target, force=force, html=html)
    k = report.kernels
    click.echo(terminal_text(f"imported {path}: {len(k)} kernels, {len(report.ranges)} ranges, "
               f"{len(report.transfers)} transfers -> {written}"))
    if rule is not None:
        click.echo(terminal_text(f"  steps: {len(report.steps)} ranges matching {rule.pattern.pattern!r}"))
    for w in report.warnings:
        click.echo(terminal_text(f"  warning: {w}"), err=True)


def _with_engine(report: Report, model: str, batch: int | None, prompt_len: int | None,
                 decode_context: int | None, itemsize: int) -> Report:
    from perfscope.analysis.costs.analytic import EngineShape, with_engine_costs
    from perfscope.engine.model import ModelArgs

    if batch is None or prompt_len is None:
        raise click.UsageError("--engine needs --batch and --prompt-len (the run's shape)")
    shape = EngineShape.from_args(ModelArgs.from_name(model), batch=batch, prompt_len=prompt_len,
                                  itemsize=itemsize, decode_context=decode_context)
    return with_engine_costs(report, shape)
