"""Compiled CPU decode with and without inductor's C++ wrapper (``cpp_wrapper``), in one process.

``cpu_inductor_options`` leaves the C++ wrapper off; this measures that choice, both where
inductor's own loops do the matrix products (``path=threaded``: the engine's matrix-vector split,
batch <= 16 with large matrices) and where they are extern BLAS calls (``path=blas``). Two copies
of the same model, one compiled each way, called alternately (median of ``--calls`` calls per variant per
round, the order reversed every other round, the weight copies exchanged every round so that where
a copy lies in memory cancels out). It also prints which op names a profile sees for the products:
``aten::mm`` (with shapes, costed 2·M·N·K) or ``aoti_torch_cpu_mm_out`` (no shapes).

Each round starts with a 400 MB streaming read (this VM's bandwidth drifts between ~27 and ~60 GB/s);
``--min-roof GBPS`` keeps only rounds that start at least that fast.

Run: ``python benchmarks/cpu_wrapper_ab.py [--model tiny] [--batch 1] [--rounds 10] [--min-roof 45]``.
Last line: ``MODEL BATCH path=blas|threaded step_ratio_without_over_with=R`` (median over rounds;
below 1: faster without the C++ wrapper).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from cpu_decode_breakdown import ROOF_MB, add_round_options, fast_rounds, median_s, swap_weights

from perfscope.engine import build_model
from perfscope.engine.generate import cpu_inductor_options, decode_matmuls_in_kernels

N_SLOTS = 160


def product_ops(step, inputs) -> list[str]:
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        step(*inputs)
    return sorted({e.key for e in prof.key_averages() if e.key in ("aten::mm", "aten::addmm")
                   or e.key.startswith("aoti_torch_cpu_")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=11)
    add_round_options(parser)
    opts = parser.parse_args()
    with_cw, without = build_model(opts.model), build_model(opts.model)
    without.load_state_dict(with_cw.state_dict())
    for model in (with_cw, without):
        model.setup_caches(opts.batch, N_SLOTS)
        model.ranges = False
    path = "threaded" if decode_matmuls_in_kernels(with_cw, opts.batch) else "blas"
    steps = {
        "with": torch.compile(with_cw, fullgraph=True, dynamic=False,
                              options={**cpu_inductor_options(), "cpp_wrapper": True}),
        "without": torch.compile(without, fullgraph=True, dynamic=False,
                                 options=cpu_inductor_options()),
    }
    b = opts.batch
    inputs = (torch.full((b, 1), 5), torch.tensor([150]), torch.full((b, 1), 150),
              (torch.arange(N_SLOTS) <= 150).view(1, 1, 1, -1).expand(b, 1, 1, -1))
    with torch.inference_mode():
        assert torch.allclose(steps["with"](*inputs), steps["without"](*inputs), atol=1e-4)
        for step in steps.values():
            for _ in range(3):
                step(*inputs)
        for name, step in steps.items():
            print(f"{name} cpp_wrapper, the products in a profile: {product_ops(step, inputs)}")
        big = torch.rand(ROOF_MB * 2**20 // 4)
        ratios: list[float] = []
        for roof in fast_rounds(big, opts.rounds, opts):
            order = list(steps.items()) if len(ratios) % 2 == 0 else list(steps.items())[::-1]
            t = {name: median_s(lambda s=step: s(*inputs), opts.calls) for name, step in order}
            ratios.append(t["without"] / t["with"])
            swap_weights(with_cw, without)
            print(f"round {len(ratios)} (read {roof:.0f} GB/s): with {t['with'] * 1e3:.3f} ms, "
                  f"without {t['without'] * 1e3:.3f} ms, ratio {ratios[-1]:.3f}", flush=True)
    if not ratios:
        return
    print(f"{opts.model} {b} path={path} step_ratio_without_over_with={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
