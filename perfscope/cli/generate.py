"""``perfscope generate``: run the reference engine on token ids and print the generated ids."""

from __future__ import annotations

import json
import time

import click

from perfscope.errors import ToolNotFoundError, UsageError

DTYPES = ("float32", "bfloat16", "float16")


def parse_ids(text: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``; anything else is a UsageError."""
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError as exc:
        raise UsageError(f"--prompt-ids must be comma-separated integers, got {text!r}") from exc
    if not ids:
        raise UsageError("--prompt-ids is empty", hint="give at least one token id, e.g. --prompt-ids 1,2,3")
    return ids


@click.command()
@click.option("--model", "model_name", default="tiny", show_default=True,
              help="Config name (tiny, small, qwen2.5-0.5b, ...) or a local Hugging Face checkpoint folder.")
@click.option("--prompt-ids", required=True, help="Prompt token ids, comma-separated (e.g. 1,2,3).")
@click.option("--max-new-tokens", type=int, default=16, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling and random-weight seed.")
@click.option("--attention", type=click.Choice(["sdpa", "naive"]), default="sdpa", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--compile/--no-compile", "compile", default=None,
              help="Compile decode with torch.compile (CUDA graphs on CUDA). Default: on for CUDA, eager on the "
                   "CPU. A compiled run is preceded by an identical warm-up that compiles (compile_s).")
@click.option("--json", "as_json", is_flag=True,
              help="Print prompt_ids, generated_ids, ttft_s, tpot_s, compile and compile_s as JSON.")
def generate(model_name: str, prompt_ids: str, max_new_tokens: int, temperature: float, top_k: int | None,
             top_p: float | None, seed: int, attention: str, dtype: str, device: str, compile: bool | None,
             as_json: bool) -> None:
    """Generate token ids with the reference engine (greedy unless --temperature > 0)."""
    try:
        import torch

        from perfscope.engine import SamplingParams, build_model
        from perfscope.engine import generate as run_generate
    except ImportError as exc:
        raise ToolNotFoundError("torch", hint="install the engine extra: pip install -e '.[engine]'") from exc
    ids = parse_ids(prompt_ids)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    model = build_model(model_name, device=device, dtype=getattr(torch, dtype), attention=attention, seed=seed)
    compiled = compile if compile is not None else model.device.type == "cuda"
    warmup_s = None
    if compiled:  # compile (and capture CUDA graphs) in an identical warm-up, so TTFT/TPOT exclude it
        t0 = time.perf_counter()
        run_generate(model, [ids], max_new_tokens, sampling, compile=True)
        warmup_s = time.perf_counter() - t0
    result = run_generate(model, [ids], max_new_tokens, sampling, compile=compiled)
    req = result.requests[0]
    # the warm-up's extra time over the warm run: compilation and graph capture (None if not measurable)
    compile_s = warmup_s - result.wall_s if warmup_s is not None and warmup_s > result.wall_s else None
    if as_json:
        click.echo(json.dumps({"prompt_ids": ids, "generated_ids": result.generated_ids[0],
                               "ttft_s": req.ttft_s, "tpot_s": req.tpot_s, "compile": compiled,
                               "compile_s": compile_s}))
    else:
        click.echo(" ".join(str(t) for t in result.generated_ids[0]))
