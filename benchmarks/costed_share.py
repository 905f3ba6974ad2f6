"""Share of GPU kernel time that the cost model prices (FLOPs and bytes), per trace.

``costed`` = share of kernel time with both FLOPs and bytes; ``bytes only`` = collectives
(bytes moved, FLOPs undefined); ``placed`` = classified memory or compute (needs the device's
roofs). Each trace is imported as ``perfscope import`` does (``import_file``: a
``capture_traces/`` folder beside a graph trace is joined to its replays).

With ``--capture CAPTURE REPLAY``, the eager ops of a CUDA-graph capture trace are priced as
the replays would be: each launch call of the capture is costed by its op (or its nearest
costed ancestor, as the Kineto import does), with the sequence sums of the replay trace's step
annotation, and weighted by the replay's kernel time of that kernel name (split evenly over
the capture's launches of that name). This measures the cost model on the captured ops; the
join of replays to captures is :mod:`analysis.kineto_graphs`'s.

Usage::

    python benchmarks/costed_share.py TRACE [TRACE ...] [--capture CAPTURE REPLAY]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def eager_share(path: Path) -> str:
    from perfscope.analysis.readers.detect import import_file

    k = import_file(path).kernels
    t = k["duration_ns"].astype(float)
    both = k["flops"].notna() & k["dram_bytes"].notna()
    only = k["flops"].isna() & k["dram_bytes"].notna()
    placed = k["bound"].isin(["memory", "compute"])
    pct = lambda m: 100.0 * t[m].sum() / t.sum()
    return f"{path.name}: costed {pct(both):.1f}%  bytes only {pct(only):.1f}%  placed {pct(placed):.1f}%"


def _events(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"], data


def capture_share(capture: Path, replay: Path) -> str:
    from perfscope.analysis.costs.framework import OpContext, step_attention
    from perfscope.analysis.costs.operators import has_formula, op_cost

    rev, _ = _events(replay)
    ktime: Counter[str] = Counter()
    for e in rev:
        if e.get("cat") == "kernel":
            ktime[e["name"]] += e.get("dur", 0.0)
    work = next((w for w in (step_attention(e["name"]) for e in rev if e.get("cat") == "user_annotation") if w), None)
    cev, meta = _events(capture)
    ranks = (meta.get("distributedInfo") or {}).get("world_size")
    ctx = OpContext(attention=work, world_size=ranks)
    ops = defaultdict(list)
    for e in cev:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ops[(e["pid"], e["tid"])].append(e)
    calls = [e for e in cev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "kernel" in e.get("args", {})]
    launches = Counter(e["args"]["kernel"] for e in calls)
    costed = total = 0.0
    for call in calls:
        name = call["args"]["kernel"]
        weight = ktime.get(name, 0.0) / launches[name]
        chain = sorted((o for o in ops[(call["pid"], call["tid"])] if o["ts"] <= call["ts"] <= o["ts"] + o["dur"]),
                       key=lambda o: (o["ts"], -o["dur"]))
        op = next((o for o in reversed(chain) if has_formula(o["name"])), None)
        total += weight
        if op is None:
            continue
        a = op.get("args", {})
        cost = op_cost(op["name"], a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs"), ctx)
        if cost is not None and not math.isnan(cost.flops) and not math.isnan(cost.bytes):
            costed += weight
    replayed = sum(ktime.values())
    return (f"{capture.name} (weighted by {replay.name}): costed {100 * costed / replayed:.1f}% of the replay's "
            f"kernel time ({100 * total / replayed:.1f}% has a captured launch)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--capture", nargs=2, type=Path, action="append", metavar=("CAPTURE", "REPLAY"), default=[])
    args = parser.parse_args()
    for path in args.traces:
        print(eager_share(path))
    for capture, replay in args.capture:
        print(capture_share(capture, replay))


if __name__ == "__main__":
    main()
