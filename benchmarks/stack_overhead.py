"""What ``--stack`` (torch.profiler ``with_stack=True``) costs: the same small model run under
``perfscope.profile(stack=False)`` and ``perfscope.profile(stack=True)``, interleaved, against the
unprofiled run. Prints the median wall time of each and the ratios (profiled / unprofiled).

Usage::

    python benchmarks/stack_overhead.py [--repeat 5] [--layers 6] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import perfscope
from perfscope.device import DeviceSpec


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x + self.attn(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(256) for _ in range(args.layers)]).eval()
    x = torch.randn(8, 256)

    def work() -> None:
        with torch.no_grad():
            for _ in range(args.steps):
                model(x)

    roofs = DeviceSpec("cpu", "cpu")
    times: dict[str, list[float]] = {"none": [], "profile": [], "profile --stack": []}
    work()  # warm-up, and one profiled run of each kind (first-use imports)
    for stack in (False, True):
        with perfscope.profile(roofs=roofs, stack=stack):
            work()
    for _ in range(args.repeat):
        for label, runs in times.items():
            if label == "none":
                t = time.perf_counter()
                work()
                runs.append(time.perf_counter() - t)
            else:
                with perfscope.profile(roofs=roofs, stack=label.endswith("stack")) as run:
                    t = time.perf_counter()
                    work()  # the profiled work alone: not the trace export and analysis on exit
                    runs.append(time.perf_counter() - t)
                modules = int((run.report.ranges.get("source") == "module").sum()) if len(run.report.ranges) else 0
                assert (modules > 0) == label.endswith("stack")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:16s} median {v * 1e3:8.1f} ms")
    print(f"profile_overhead={med['profile'] / med['none']:.2f} stack_overhead={med['profile --stack'] / med['none']:.2f} "
          f"stack_vs_profile={med['profile --stack'] / med['profile']:.2f}")


if __name__ == "__main__":
    main()
