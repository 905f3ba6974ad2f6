"""``perfscope generate``: run the reference engine on token ids or text and print what it generated."""

from __future__ import annotations

import json
import time
from typing import Any

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
              help="Config name (tiny, small, qwen2.5-0.5b, ...), smollm2-135m, a .gguf file or a local "
                   "Hugging Face checkpoint folder.")
@click.option("--prompt-ids", default=None, help="Prompt token ids, comma-separated (e.g. 1,2,3).")
@click.option("--prompt", default=None, help="Prompt text (a model with a tokenizer: smollm2-135m, .gguf).")
@click.option("--chat", is_flag=True, help="Wrap --prompt in the model's chat template as a user message.")
@click.option("--max-new-tokens", type=int, default=16, show_default=True)
@click.option("--ignore-eos", is_flag=True, help="Generate --max-new-tokens even past the end-of-sequence token.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling and random-weight seed.")
@click.option("--speculative", default=None,
              help="Speculative decoding: ngram (prompt lookup) or self:N (the first N layers draft).")
@click.option("--draft-len", type=click.IntRange(min=1), default=4, show_default=True,
              help="Tokens drafted per speculative step.")
@click.option("--kv-policy", default=None, help="KV-cache policy: full, streaming:sink=S,window=W (StreamingLLM), h2o:budget=B[,recent=R] (heavy hitters) "
                   "or quest:budget=B[,page=P] (query-aware pages); docs/kv-policies.md.")
@click.option("--attention", type=click.Choice(["sdpa", "naive"]), default="sdpa", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--compile/--no-compile", "compile", default=None,
              help="Compile decode with torch.compile (CUDA graphs on CUDA). Default: on for CUDA, eager on the "
                   "CPU. A compiled run is preceded by an identical warm-up that compiles (compile_s).")
@click.option("--json", "as_json", is_flag=True,
              help="Print prompt_ids, generated_ids, text, ttft_s, tpot_s (and acceptance when speculating) as JSON.")
def generate(model_name: str, prompt_ids: str | None, prompt: str | None, chat: bool, max_new_tokens: int,
             ignore_eos: bool, temperature: float, top_k: int | None, top_p: float | None, seed: int,
             speculative: str | None, draft_len: int, attention: str, dtype: str, device: str,
             compile: bool | None, as_json: bool, kv_policy: str | None = None) -> None:
    """Generate with the reference engine (greedy unless --temperature > 0).

    Give the prompt as token ids (--prompt-ids) or, for a model with a tokenizer (smollm2-135m,
    a .gguf file), as text (--prompt, with --chat for the chat template).
    """
    try:
        import torch

        from perfscope.engine import SamplingParams, build_model
        from perfscope.engine import generate as run_generate
        from perfscope.engine.generate import compile_seconds, default_compile
    except ImportError as exc:
        raise ToolNotFoundError("torch", hint="install the engine extra: pip install -e '.[engine]'") from exc
    if (prompt_ids is None) == (prompt is None):
        raise UsageError("give exactly one of --prompt-ids and --prompt",
                         hint='e.g. --prompt-ids 1,2,3, or --model smollm2-135m --prompt "Hello"')
    if chat and prompt is None:
        raise UsageError("--chat applies to a text --prompt")
    from perfscope.kv_policy import check_engine_options, parse_kv_policy

    policy = parse_kv_policy(kv_policy)  # a bad policy fails before the model is built
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    model = build_model(model_name, device=device, dtype=getattr(torch, dtype), attention=attention, seed=seed)
    tok = model.tokenizer
    if prompt is not None:
        if tok is None:
            raise UsageError(f"model {model_name!r} has no tokenizer, so it takes no text prompt",
                             hint="give --prompt-ids, or use --model smollm2-135m or a .gguf file")
        ids = tok.chat_ids(prompt) if chat else tok.encode(prompt)
    else:
        ids = parse_ids(prompt_ids or "")
    stop_ids = None if ignore_eos or tok is None else tok.stop_ids
    compiled = compile if compile is not None else (default_compile(model.device.type, speculative)
                                                     and policy.is_full)
    check_engine_options(policy, compile=compiled, speculative=speculative)
    options: dict[str, Any] = {"stop_ids": stop_ids, "speculative": speculative, "draft_len": draft_len,
                               "compile": compiled, "kv_policy": policy.text()}
    warmup_s = None
    if compiled:  # compile (and capture CUDA graphs) in an identical warm-up, so TTFT/TPOT exclude it
        t0 = time.perf_counter()
        run_generate(model, [ids], max_new_tokens, sampling, **options)
        warmup_s = time.perf_counter() - t0
    result = run_generate(model, [ids], max_new_tokens, sampling, **options)
    req = result.requests[0]
    # the warm-up's extra time over the warm run: compilation and graph capture (None if not measurable)
    compile_s = compile_seconds(warmup_s, result.wall_s)
    out = result.generated_ids[0]
    text = tok.decode(out) if tok is not None else None
    if as_json:
        payload = {"prompt_ids": ids, "generated_ids": out, "text": text, "output_tokens": req.output_tokens,
                   "ttft_s": req.ttft_s, "tpot_s": req.tpot_s, "compile": compiled, "compile_s": compile_s}
        decode = [s for s in result.steps if s.phase == "decode"]
        if not policy.is_full:
            payload["kv_policy"] = policy.text()
        if decode and not policy.is_full:
            payload.update(kv_entries_last=decode[-1].kv_entries, kv_cache_bytes_last=decode[-1].kv_cache_bytes,
                           kv_cache_size_bytes=decode[-1].kv_cache_size_bytes)
        spec = result.params.get("speculation")
        if spec:
            payload.update({"speculative": spec["method"], "draft_len": spec["draft_len"],
                            "acceptance_rate": spec["acceptance_rate"], "mean_accepted_len": spec["mean_accepted_len"],
                            "tokens_per_verify_step": spec["tokens_per_verify_step"]})
        click.echo(json.dumps(payload))
    elif text is not None:
        click.echo(text)
    else:
        click.echo(" ".join(str(t) for t in out))
