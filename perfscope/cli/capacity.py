"""``perfscope capacity``: how many sequences of a model fit on a GPU at a context length."""

from __future__ import annotations

import click

from ._common import Finite, echo_json

MAX_TOKENS = 1 << 24
"""The longest context, or largest forward, taken (16M tokens)."""


@click.command()
@click.option("--model", "model", required=True, help="An engine model (llama-3-8b, qwen2.5-0.5b, ...), a Hugging "
              "Face config.json, or a folder holding one.")
@click.option("--gpu", required=True, help="A datasheet row (H100, 'H100 SXM5 80 GB', MI300X: `perfscope devices "
              "--datasheet`), or any name with --memory-gib.")
@click.option("--context", type=click.IntRange(min=1, max=MAX_TOKENS), default=8192, show_default=True, help="Tokens per sequence.")
@click.option("--kv-dtype", default=None, help="KV-cache dtype (bf16, fp16, fp8, ...; default: the model's).")
@click.option("--weights-dtype", default=None, help="Weight dtype (bf16, fp8, int4, nvfp4, ...; default: the model's).")
@click.option("--gpu-memory-utilization", type=Finite(0, 1, min_open=True), default=0.9, show_default=True,
              help="Share of the device memory the server may use (vLLM's gpu_memory_utilization).")
@click.option("--memory-gib", type=Finite(min=0, max=1 << 20, min_open=True), default=None,
              help="The device's memory, measured (GiB), instead of the datasheet's.")
@click.option("--activation-gib", type=Finite(min=0, max=1 << 20), default=None,
              help="The activation peak, measured (GiB; e.g. from `analyze --memory`); default: estimated.")
@click.option("--max-batched-tokens", type=click.IntRange(min=1, max=MAX_TOKENS), default=None,
              help="Tokens of the largest forward, for the activation estimate (default: max(context, 2048)).")
@click.option("--kv-policy", default=None, help="KV-cache policy: full, streaming:sink=S,window=W, "
              "h2o:budget=B[,recent=R] or quest:budget=B[,page=P] (what each sequence holds; docs/kv-policies.md).")
@click.option("--block-size", type=click.IntRange(min=1, max=1 << 16), default=16, show_default=True, help="KV block size (tokens).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def capacity(model: str, gpu: str, context: int, kv_dtype: str | None, weights_dtype: str | None,
             gpu_memory_utilization: float, memory_gib: float | None, activation_gib: float | None,
             max_batched_tokens: int | None, block_size: int, as_json: bool, kv_policy: str | None = None) -> None:
    """Weight bytes, KV bytes per token, and the concurrent tokens and sequences that fit."""
    from perfscope.capacity import GIB, capacity_report, render_capacity

    result = capacity_report(model, gpu, context=context, kv_dtype=kv_dtype, weights_dtype=weights_dtype,
                             gpu_memory_utilization=gpu_memory_utilization,
                             memory_bytes=None if memory_gib is None else memory_gib * GIB,
                             activation_bytes=None if activation_gib is None else activation_gib * GIB,
                             max_batched_tokens=max_batched_tokens, block_size=block_size, kv_policy=kv_policy)
    if as_json:
        echo_json(result)
    else:
        click.echo(render_capacity(result), nl=False)
