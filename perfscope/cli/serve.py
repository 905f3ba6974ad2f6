"""``perfscope serve``: the reference engine behind an OpenAI-compatible streaming API."""

from __future__ import annotations

import click


@click.command()
@click.option("--model", default="tiny", show_default=True,
              help="Engine config, smollm2-135m, a .gguf file or a local HF checkpoint folder.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", default=8000, show_default=True, type=int, help="Port (0: any free port).")
@click.option("--served-model-name", default=None, help="The model's id in /v1/models (default: --model).")
@click.option("--max-batch", default=8, show_default=True, type=int, help="KV-cache slots: sequences in flight.")
@click.option("--max-model-len", default=None, type=int,
              help="Longest prompt + completion, tokens (default: the model's context, at most 2048).")
@click.option("--max-batched-tokens", type=int, default=None, help="Token budget of one iteration (chunked prefill).")
@click.option("--kv-dtype", default="auto", show_default=True, type=click.Choice(["auto", "int8", "fp8"]))
@click.option("--kv-policy", default=None, help="KV-cache policy: full, streaming:sink=S,window=W (StreamingLLM), h2o:budget=B[,recent=R] (heavy hitters) "
                   "or quest:budget=B[,page=P] (query-aware pages); docs/kv-policies.md.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]))
@click.option("--profile-dir", type=click.Path(file_okay=False), default=None,
              help="Where /stop_profile writes traces (default: a new temporary folder).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of random weights.")
@click.option("--max-connections", default=256, show_default=True, type=click.IntRange(min=1),
              help="Connections served at once; one more is answered 503 and closed.")
@click.option("--read-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a client has to send its whole request (head and body); 408 after it.")
def serve(model: str, host: str, port: int, served_model_name: str | None, max_batch: int, max_model_len: int | None,
          max_batched_tokens: int | None, kv_dtype: str, device: str, dtype: str, profile_dir: str | None,
          seed: int, max_connections: int = 256, read_timeout: float = 30.0, kv_policy: str | None = None) -> None:
    """Serve the engine's continuous batching as an OpenAI-compatible API (/v1/completions,
    /v1/chat/completions, /v1/models, /start_profile, /stop_profile), streaming each token."""
    import torch

    from perfscope.engine.generate import build_model
    from perfscope.errors import UsageError
    from perfscope.hosts import is_loopback
    from perfscope.sessions.loadtest import _warm_up
    from perfscope.sessions.openai_server import (
        EngineServer,
        model_name_for,
        serve_http,
    )
    from perfscope.sessions.profile import resolve_device

    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {port}")
    if max_model_len is not None and max_model_len < 2:
        raise UsageError(f"--max-model-len must be at least 2 tokens, got {max_model_len}")
    if not is_loopback(host):
        click.echo(f"perfscope: warning: serving on {host}, reachable from other machines; the server has no "
                   "authentication. Use --host 127.0.0.1 unless you mean it.", err=True)
    from perfscope.kv_policy import parse_kv_policy

    policy = parse_kv_policy(kv_policy)
    dev = resolve_device(device)
    m = build_model(model, device=dev, dtype=getattr(torch, dtype), seed=seed)
    server = EngineServer(m, served_model_name or model_name_for(model), max_batch=max_batch, max_len=max_model_len,
                          max_batched_tokens=max_batched_tokens, kv_dtype=kv_dtype, kv_policy=policy.text(),
                          profile_dir=profile_dir,
                          cuda=str(dev).startswith("cuda"))
    _warm_up(m, kv_dtype, policy.text())

    def ready(bound: int) -> None:
        shown = host if ":" not in host else f"[{host}]"
        click.echo(f"serving {server.name} on http://{shown}:{bound}/v1 (max batch {max_batch}, max length "
                   f"{server.max_len}; Ctrl-C to stop)", )

    try:
        serve_http(server, host, port, ready=ready, max_connections=max_connections, read_timeout_s=read_timeout)
    except KeyboardInterrupt:
        click.echo("perfscope serve: stopped")
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="choose another --port (0: any free one)") from None
