"""Where a compiled CPU decode step's time goes, against the memory's streaming-read speed measured
around it.

One process, the ~125M Llama of ``engine_vs_transformers.py`` (float32, batch 1, 191 cache slots).
Each round times, one after another (median of ``--calls`` calls each; the order reverses every
other round so that drift within a round cancels out):

- ``roof``: ``sum`` over one 400 MB tensor (a pure read stream);
- ``sums``: ``w.sum()`` over each of the 49 weight matrices (the ceiling with one call per matrix);
- ``products``: the 49 matrix-vector products alone, compiled as the engine compiles them;
- ``step``: the decode forward compiled with ``cpu_inductor_options()`` (what ``--compile`` runs);
- ``step_before``: the forward as ``--compile`` compiled it before 2026-12-01: inductor's defaults
  and SDPA (an opaque call per layer) for attention.

It prints each as a fraction of ``roof`` (for the steps: 405 MB of weights + KV cache against the
roof's 400 MB). The two models hold separate copies of the same weights, which trade places every
round (where a copy lies in memory moved a step by a few percent on this VM). This VM's read bandwidth drifts between ~30 and ~60 GB/s minute to minute;
``--min-roof GBPS`` keeps only rounds that start while the roof is at least that fast, to see the
fast-memory case, where the kernels and not the memory set the pace.

Run: ``python benchmarks/cpu_decode_breakdown.py [--rounds 8] [--min-roof 45] [--wait 600]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from engine_vs_transformers import CONFIG, NEW_TOKENS, PROMPT_LEN

from perfscope.engine import build_model
from perfscope.engine.generate import cpu_inductor_options
from perfscope.engine.model import Linear

ROOF_MB = 400


def median_s(fn: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def add_round_options(parser: argparse.ArgumentParser) -> None:
    """``--min-roof`` and ``--wait``: which rounds run, by the read bandwidth when they start."""
    parser.add_argument("--min-roof", type=float, default=0.0, help="GB/s; skip rounds that start below it")
    parser.add_argument("--wait", type=float, default=600.0, help="give up waiting for fast rounds after this many s")


def fast_rounds(big: torch.Tensor, rounds: int, opts: argparse.Namespace) -> Iterator[float]:
    """Up to ``rounds`` rounds, each yielded the read bandwidth (GB/s, ``big.sum``) it starts at, only
    when that is at least ``opts.min_roof``; gives up ``opts.wait`` seconds after the first call and
    then says so when no round ran."""
    done, deadline = 0, time.time() + opts.wait
    while done < rounds and time.time() < deadline:
        roof = big.numel() * big.element_size() / median_s(big.sum, 3) / 1e9
        if roof < opts.min_roof:
            time.sleep(0.3)
            continue
        done += 1
        yield roof
    if not done:
        print(f"no round started with the read roof at or above {opts.min_roof} GB/s within {opts.wait:.0f} s")


class Products(torch.nn.Module):
    """Every linear of the model applied to a vector: the decode step's matrix-vector products alone."""

    def __init__(self, linears: list[Linear]) -> None:
        super().__init__()
        self.linears = torch.nn.ModuleList(linears)

    def forward(self, by_width: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        return [lin(by_width[lin.in_features]) for lin in self.linears]  # type: ignore[index]


def sdpa_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def swap_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Exchange the two models' weight storage (same shapes; compiled graphs stay valid)."""
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        pa.data, pb.data = pb.data, pa.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=11)
    add_round_options(parser)
    opts = parser.parse_args()
    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        fixed, before = build_model(tmp), build_model(tmp)
    del hf
    n_slots = PROMPT_LEN + NEW_TOKENS - 1
    for model in (fixed, before):
        model.setup_caches(1, n_slots)
        model.ranges = False
    for attention in before.attentions():
        attention.attend = sdpa_call
    step = torch.compile(fixed, fullgraph=True, dynamic=False, options=cpu_inductor_options())
    step_before = torch.compile(before, fullgraph=True, dynamic=False)
    linears = [m for m in fixed.modules() if isinstance(m, Linear)]
    products = torch.compile(Products(linears), fullgraph=True, dynamic=False, options=cpu_inductor_options())
    matrices = [lin.weight for lin in linears]
    matrix_bytes = sum(w.numel() * w.element_size() for w in matrices)
    step_bytes = fixed.weight_bytes_read(1) + fixed.kv_bytes(1, n_slots)
    vectors = {k: torch.randn(1, 1, k) for k in {lin.in_features for lin in linears}}
    big = torch.rand(ROOF_MB * 2**20 // 4)
    inputs = (torch.tensor([[5]]), torch.tensor([150]), torch.tensor([[150]]),
              (torch.arange(n_slots) <= 150).view(1, 1, 1, -1))
    timed: dict[str, tuple[Callable[[], object], float]] = {
        "roof": (big.sum, big.numel() * 4),
        "sums": (lambda: [w.sum() for w in matrices], matrix_bytes),
        "products": (lambda: products(vectors), matrix_bytes),
        "step": (lambda: step(*inputs), step_bytes),
        "step_before": (lambda: step_before(*inputs), step_bytes),
    }
    with torch.inference_mode():
        assert torch.allclose(step(*inputs), step_before(*inputs), atol=1e-5), "the two compilations disagree"
        for fn, _ in timed.values():  # compile and warm
            for _ in range(3):
                fn()
        print(f"device: {torch.get_num_threads()} threads, torch {torch.__version__}; "
              f"{matrix_bytes / 1e6:.0f} MB of matrices, {step_bytes / 1e6:.0f} MB read per step")
        rows: list[dict[str, float]] = []
        for _ in fast_rounds(big, opts.rounds, opts):
            order = list(timed.items()) if len(rows) % 2 == 0 else list(timed.items())[::-1]  # cancel drift
            gbps = {name: nbytes / median_s(fn, opts.calls) / 1e9 for name, (fn, nbytes) in order}
            gbps = {name: gbps[name] for name in timed}
            rows.append(gbps)
            swap_weights(fixed, before)
            print(f"round {len(rows)}: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in gbps.items()), flush=True)
    if not rows:
        return
    fractions = {k: statistics.median(r[k] / r["roof"] for r in rows) for k in timed if k != "roof"}
    print("fraction of the streaming read, median over rounds: "
          + " ".join(f"{k}={v:.2f}" for k, v in fractions.items()))


if __name__ == "__main__":
    main()
