"""Decode speed of perfscope's engine against the DRAM roof measured on the same machine.

For each model (default llama-3.2-1b and llama-3-8b, random weights, bf16): batch 1, prompt 128,
128 new tokens, greedy, with the engine's default flags (on CUDA decode is compiled into CUDA
graphs; ``--no-compile`` for eager). Each measurement is an identical warm-up run (compilation and
graph capture happen there, timed as ``compile_s``), then ``--repeats`` warm runs; the fastest
counts. Every model runs at batch 1 first, then the first model's batch sweep (default 1, 8, 32,
128) continues while ``--budget-s`` lasts.

decode tokens/s = decode tokens / decode wall time (the engine's step records: CUDA events);
decode MBU = (weight + KV-cache bytes read per decode step, summed) / decode wall time / the DRAM
roof that ``perfscope devices`` measures (measured again at the start unless ``--cached-roofs``).

Run: ``python benchmarks/engine_gpu.py [--models llama-3.2-1b,llama-3-8b] [--batches 1,8,32,128]``
(on the CPU: ``--device cpu --dtype float32 --models tiny --batches 1,2``). One line per
measurement, ``model=M batch=B compile=C tokens_per_s=T decode_tokens_per_s=D mbu=U compile_s=S``;
points that would pass ``--budget-s`` are skipped and say so.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def measure(model: Any, batch: int, prompt_len: int, new_tokens: int, compile: bool, repeats: int,
            dram_bytes_per_s: float) -> dict[str, Any]:
    """Warm-up (compiles), then ``repeats`` timed runs; figures of the fastest."""
    import torch

    from perfscope.engine import generate, random_prompts

    prompts = random_prompts(batch, prompt_len, model.args.vocab_size, seed=batch)
    if compile:
        torch._dynamo.reset()  # one compile per shape: never the recompile limit's eager fallback
    t0 = time.perf_counter()
    generate(model, prompts, new_tokens, compile=compile)
    warmup_s = time.perf_counter() - t0
    best = min((generate(model, prompts, new_tokens, compile=compile) for _ in range(repeats)),
               key=lambda r: r.wall_s)
    decode = [s for s in best.steps if s.phase == "decode"]
    decode_s = sum(s.end_ns - s.start_ns for s in decode) / 1e9
    decode_bytes = sum(s.weight_bytes + s.kv_cache_bytes for s in decode)
    tokens = sum(s.tokens for s in decode)
    return {"batch": batch, "compile": compile, "wall_s": best.wall_s,
            "tokens_per_s": batch * new_tokens / best.wall_s,
            "decode_tokens_per_s": tokens / decode_s, "tpot_ms": decode_s / len(decode) * 1e3,
            "ttft_ms": best.requests[0].ttft_s * 1e3,
            "mbu": decode_bytes / decode_s / dram_bytes_per_s,
            "gb_per_step": decode_bytes / len(decode) / 1e9,
            "compile_s": warmup_s - best.wall_s if compile and warmup_s > best.wall_s else None}


def _line(name: str, m: dict[str, Any]) -> str:
    comp = f"{m['compile_s']:.1f}" if m["compile_s"] is not None else "-"
    return (f"model={name} batch={m['batch']} compile={m['compile']} tokens_per_s={m['tokens_per_s']:.1f} "
            f"decode_tokens_per_s={m['decode_tokens_per_s']:.1f} tpot_ms={m['tpot_ms']:.2f} "
            f"ttft_ms={m['ttft_ms']:.1f} gb_per_step={m['gb_per_step']:.3f} mbu={m['mbu']:.3f} compile_s={comp}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3.2-1b,llama-3-8b")
    parser.add_argument("--batches", type=_ints, default=[1, 8, 32, 128], help="batch sweep of the first model")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compile", dest="compile", action="store_true", default=None)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--cached-roofs", action="store_true",
                        help="use the roofs perfscope devices cached (default: measure them again now)")
    parser.add_argument("--budget-s", type=float, default=None, help="skip points that would start after this")
    opts = parser.parse_args()

    import torch

    from perfscope.collectors.roofs import device_roofs
    from perfscope.engine import build_model
    from perfscope.sessions.profile import resolve_device

    start = time.perf_counter()
    device = resolve_device(opts.device)
    compile = opts.compile if opts.compile is not None else device.startswith("cuda")
    spec = device_roofs(device, refresh=not opts.cached_roofs)
    bw = spec.peak_bandwidth("dram")
    if not bw:
        print(f"engine_gpu: no DRAM roof for {spec.name}; run perfscope devices --device {device} --refresh")
        return 1
    print(f"device: {spec.name}; DRAM roof {bw / 1e12:.3f} TB/s ({spec.memory['dram'].provenance}: "
          f"{spec.memory['dram'].method}); torch {torch.__version__}; compile={compile} "
          f"({'CUDA graphs, reduce-overhead' if compile and device.startswith('cuda') else 'default flags'})")
    print(f"workload: {opts.dtype}, prompt {opts.prompt_len}, {opts.gen_len} new tokens, greedy, random weights")
    models = [m for m in opts.models.split(",") if m]
    plan = [(m, 1) for m in models] + [(models[0], b) for b in opts.batches if b != 1]  # every model first
    loaded: tuple[str, Any] | None = None
    for name, b in plan:
        if opts.budget_s and time.perf_counter() - start > opts.budget_s:
            print(f"model={name} batch={b} skipped: the {opts.budget_s:.0f} s budget is spent")
            continue
        if loaded is None or loaded[0] != name:
            loaded = None
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            loaded = (name, build_model(name, device=device, dtype=getattr(torch, opts.dtype)))
        try:
            print(_line(name, measure(loaded[1], b, opts.prompt_len, opts.gen_len, compile, opts.repeats, bw)),
                  flush=True)
        except torch.OutOfMemoryError:
            print(f"model={name} batch={b} skipped: out of device memory")
    print(f"engine_gpu: {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
