"""Serving tails on planted workloads: which part of the p99 each workload puts first, and what a knob moves.

    python benchmarks/tails.py                 # the engine's scheduler on the simulated clock (same on any machine)
    python benchmarks/tails.py --clock real    # on this machine's real clock (CPU timings: noisy when shared)

Workloads (the tiny model; its real forwards, its real scheduler):

- ``prefill``: every tenth prompt 480 tokens long among 16-token prompts, 32 output tokens, 16 slots;
  then the same with ``--max-batched-tokens 64`` (chunked prefill);
- ``queueing``: 16-token prompts arriving far above capacity for 2 slots;
- ``preemption``: a burst of 12 requests whose caches outgrow a 240-position KV capacity.

On the simulated clock a forward takes 2 ms plus 50 us per padded token
(:class:`perfscope.engine.serving.TimedExecutor`). For each run: the p50 and p99 of TTFT, ITL and E2E
with the part that holds most of each, the serving-tail findings, and for the prefill pair how each
part of the p99 ITL moved. The last line is ``tails_itl_stall_ratio=X`` (the stall in the p99 ITL
without chunking over with it) ``tails_additivity_max_error_pct=Y``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clock", choices=("sim", "real"), default="sim")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()

    import torch

    from perfscope.analysis.findings import run_rules
    from perfscope.analysis.summaries.compare import compare, tail_view
    from perfscope.analysis.summaries.tails import tails_payload
    from perfscope.device import DeviceSpec
    from perfscope.engine.generate import build_model
    from perfscope.engine.serving import SimClock, TimedExecutor
    from perfscope.sessions.loadtest import LoadRun, run_loadtest

    torch.set_num_threads(args.threads)
    tiny = build_model("tiny", seed=0)
    lens = Path(tempfile.mkdtemp(prefix="tails-")) / "lens.txt"
    lens.write_text("\n".join(["16"] * 9 + ["480"]) + "\n")
    sim = args.clock == "sim"
    rate = 100.0 if sim else 20.0

    def loadtest(**opts: object) -> object:
        run = LoadRun(model="tiny", profile=False, **opts)  # type: ignore[arg-type]
        if sim:
            return run_loadtest(run, model=tiny, roofs=DeviceSpec("cpu", "cpu"), clock_factory=SimClock,
                                executor_wrap=lambda engine, clock: TimedExecutor(engine, clock))
        return run_loadtest(run, model=tiny, roofs=DeviceSpec("cpu", "cpu"))

    runs = {
        "prefill": loadtest(rates=(rate,), requests=args.requests, prompt_len=str(lens), output_len="32", max_batch=16),
        "prefill, --max-batched-tokens 64": loadtest(rates=(rate,), requests=args.requests, prompt_len=str(lens),
                                                     output_len="32", max_batch=16, max_batched_tokens=64),
        "queueing": loadtest(rates=(2000.0,), requests=40, prompt_len="16", output_len="16", max_batch=2),
        "preemption": loadtest(rates=(2000.0,), requests=12, prompt_len="16", output_len="48", max_batch=12,
                               kv_capacity=240),
    }
    worst = 0.0
    for name, report in runs.items():
        tails = tails_payload(report)
        worst = max(worst, tails["additivity_max_error_pct"])
        print(f"== {name} ({args.clock} clock; joined by {tails['source']})")
        for metric in ("ttft", "itl", "e2e"):
            cells = []
            for q in ("p50", "p99"):
                e = tails[metric][q]
                top = max(e["parts"], key=e["parts"].get)
                cells.append(f"{q} {e['value_s'] * 1e3:8.2f} ms ({100 * e['parts'][top] / e['value_s']:3.0f}% "
                             f"{top})")
            print(f"  {metric.upper():4s} " + "   ".join(cells))
        for f in run_rules(report, rules=["serving-tail"]):  # type: ignore[arg-type]
            print(f"  [{f.severity}] {f.title}")
            print(f"      -> {f.recommendation}")
    c = compare(runs["prefill"], runs["prefill, --max-batched-tokens 64"])  # type: ignore[arg-type]
    print("== how each part of the p99 moved with --max-batched-tokens 64")
    print(tail_view(c).to_string(index=False))
    t = c.by_tail
    stall = t[(t["metric"] == "itl") & (t["part"] == "prefill_stall")]
    ratio = float(stall["p99_a_s"].iloc[0] / stall["p99_b_s"].iloc[0]) if len(stall) and stall["p99_b_s"].iloc[0] > 0 \
        else float("nan")
    print(f"tails_itl_stall_ratio={ratio:.3g} tails_additivity_max_error_pct={worst:.2g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
