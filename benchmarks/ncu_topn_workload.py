"""A small torch program for ncu top-N checks: bf16 GEMMs, an SDPA and elementwise ops, after
``torch.randn`` initialisation (whose start-up kernels share names with the elementwise ones).

The issue it guards against: a top-N second pass that profiles "the first N launches matching
any top name" catches the ``torch.randn`` / scaling kernels at start-up and none of the GEMMs.
Per step (inside an NVTX range ``step``): two GEMMs ``[M, K] @ [K, N]`` and ``[M, N] @ [N, K]``,
a causal SDPA ``[B, H, S, D]``, and ``silu(x) * 1.5 + 0.1``. The GEMMs and the SDPA have the most
GPU time at the default sizes; ``benchmarks/ncu_topn_check.py`` checks a report holds them.

Usage::

    perfscope profile --collector ncu --top-n 5 --out topn.perfscope -- \\
        python benchmarks/ncu_topn_workload.py
    python benchmarks/ncu_topn_check.py topn.perfscope
    python benchmarks/ncu_topn_workload.py --device cpu --size 64 --steps 2   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--size", type=int, default=4096, help="GEMM M = N = K (default 4096)")
    parser.add_argument("--seq", type=int, default=1024, help="SDPA sequence length (default 1024)")
    parser.add_argument("--steps", type=int, default=10, help="steps after the initialisation (default 10)")
    return parser.parse_args(argv)


def run(device: str, size: int, seq: int, steps: int) -> dict[str, float]:
    """Initialise with torch.randn, then ``steps`` steps of GEMMs, SDPA and elementwise ops."""
    import torch
    import torch.nn.functional as F

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("ncu_topn_workload: CUDA is not available (use --device cpu for a smoke run)")
    dtype = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(size, size, device=dev, dtype=dtype, generator=gen) * 0.02  # start-up: randn + a scaling kernel
    w1 = torch.randn(size, size, device=dev, dtype=dtype, generator=gen) * 0.02
    w2 = torch.randn(size, size, device=dev, dtype=dtype, generator=gen) * 0.02
    heads, head_dim = 16, 64
    q, k, v = (torch.randn(4, heads, seq, head_dim, device=dev, dtype=dtype, generator=gen) for _ in range(3))
    nvtx = torch.cuda.nvtx if dev.type == "cuda" else None
    start = time.perf_counter()
    checksum = 0.0
    for _ in range(steps):
        if nvtx:
            nvtx.range_push("step")
        h = a @ w1                                                   # GEMM 1
        out = h @ w2                                                 # GEMM 2
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SDPA (flash on Hopper)
        act = F.silu(out) * 1.5 + 0.1                                # elementwise
        if nvtx:
            nvtx.range_pop()
        checksum += float(act.float().mean()) + float(attn.float().mean())
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return {"steps": steps, "seconds": time.perf_counter() - start, "checksum": checksum}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args.device, args.size, args.seq, args.steps)
    print(f"ncu_topn_workload: {result['steps']} steps on {args.device} in {result['seconds']:.3f} s "
          f"(checksum {result['checksum']:.4g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
