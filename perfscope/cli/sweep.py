"""``perfscope sweep``: profile the engine over batch sizes x prompt lengths into one report."""

from __future__ import annotations

import click

from ._common import OUT_RULE, default_run_dir, echo_json, out_path, records, stage_progress


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not items or min(items) < 1:
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return items


@click.command()
@click.option("--model", default="small", show_default=True, help="Engine config or local HF checkpoint folder.")
@click.option("--batch", "batches", default="1,4,16", show_default=True, callback=_int_list,
              help="Comma-separated batch sizes.")
@click.option("--prompt-len", "prompt_lens", default="64,256", show_default=True, callback=_int_list,
              help="Comma-separated prompt lengths.")
@click.option("--gen-len", default=8, show_default=True, type=click.IntRange(min=2), help="Tokens generated per request.")
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--attention", default="sdpa", show_default=True, type=click.Choice(["sdpa", "naive"]))
@click.option("--compile/--no-compile", "compile", default=None,
              help="Compile decode (torch.compile; CUDA graphs on CUDA). Default: on for CUDA, eager on the CPU.")
@click.option("--out", type=click.Path(), default=None, help=f"Report folder: {OUT_RULE} (default: runs/<timestamp>-sweep.perfscope).")
@click.option("--force", is_flag=True, help="Replace an existing report folder.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-run summary as JSON.")
def sweep(model: str, batches: list[int], prompt_lens: list[int], gen_len: int, device: str, dtype: str,
          attention: str, compile: bool | None, out: str | None, force: bool, no_html: bool, as_json: bool) -> None:
    """Profile every (batch, prompt length) combination: decode's roofline trajectory as batch grows,
    TTFT against prompt length, and the throughput-latency curve."""
    from perfscope.analysis.summaries.sweep import sweep_summary
    from perfscope.api import save_with_html
    from perfscope.errors import OutputExistsError
    from perfscope.sessions.profile import EngineRun, profile_sweep, resolve_device
    from perfscope.text_report import table

    base = EngineRun(model=model, gen_len=gen_len, device=device, dtype=dtype, attention=attention, compile=compile)
    base.check()
    resolve_device(device)
    target = out_path(out, default=default_run_dir("sweep"))
    if target.exists() and not force:
        raise OutputExistsError(target)
    with stage_progress(len(batches) * len(prompt_lens) + 1, enabled=not as_json) as advance:
        report = profile_sweep(base, batches, prompt_lens, progress=advance)
        advance("writing the report")
        written = save_with_html(report, target, force=force, html=not no_html)
    summary = sweep_summary(report)
    if as_json:
        echo_json({"report_path": str(written), "runs": records(summary)})
        return
    rows = [[r["run"], f"{r['decode_gemm_intensity']:.2f}", r["decode_gemm_bound"],
             f"{r['ttft_s'] * 1e3:.1f}", f"{r['tpot_s'] * 1e3:.1f}", f"{r['tokens_per_s']:.1f}",
             f"{r['decode_mbu'] * 100:.1f}", f"{r['prefill_mfu'] * 100:.1f}"] for _, r in summary.iterrows()]
    click.echo(table(["run", "decode FLOP/B", "decode bound", "TTFT ms", "TPOT ms", "tok/s", "decode MBU %",
                      "prefill MFU %"], rows))
    click.echo(f"report: {written}")
