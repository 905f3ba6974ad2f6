"""Continuous vs static batching at the same Poisson rate and the same request lengths.

    python benchmarks/loadtest.py                      # tiny model, 20 req/s, 150 requests, 3 rounds
    python benchmarks/loadtest.py --model small --rate 4 --requests 60 --device cuda

Both policies serve the identical workload (seeded arrivals, prompts and output lengths) on the
reference engine with the same slots (``--max-batch``), unprofiled, on a real clock:

- continuous: requests are admitted into free KV slots every iteration and leave when done;
- static: a batch is admitted only when the engine is idle, and runs until its longest request
  ends (finished rows keep computing, as ``generate()`` does).

Rounds alternate the two policies; the medians are printed, and the last line is
``loadtest_throughput_ratio=X loadtest_p99_ttft_ratio=Y`` (continuous over static throughput;
static over continuous p99 TTFT: above 1 means continuous batching is better on both).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--prompt-len", default="uniform:16,128")
    ap.add_argument("--output-len", default="uniform:4,64")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from perfscope.engine.generate import build_model
    from perfscope.sessions.loadtest import LoadRun, cli_payload, run_loadtest
    from perfscope.sessions.profile import resolve_device

    device = resolve_device(args.device)
    model = build_model(args.model, device=device, dtype=getattr(torch, args.dtype), seed=args.seed)
    results: dict[str, list[dict]] = {"continuous": [], "static": []}
    for i in range(args.rounds):
        for policy in ("continuous", "static") if i % 2 == 0 else ("static", "continuous"):
            run = LoadRun(model=args.model, rates=(args.rate,), requests=args.requests, prompt_len=args.prompt_len,
                          output_len=args.output_len, max_batch=args.max_batch, seed=args.seed, profile=False,
                          device=device, dtype=args.dtype, policy=policy)
            m = cli_payload(run_loadtest(run, model=model))
            results[policy].append(m)
            print(f"round {i + 1} {policy:10s}: {m['request_throughput_per_s']:.2f} req/s, "
                  f"{m['output_tokens_per_s']:.1f} tok/s, p99 TTFT {m['ttft_s']['p99'] * 1e3:.1f} ms, "
                  f"p50 TPOT {m['tpot_s']['p50'] * 1e3:.2f} ms, p99 E2E {m['e2e_s']['p99'] * 1e3:.1f} ms", flush=True)

    def med(policy: str, key: str, stat: str | None = None) -> float:
        return statistics.median(m[key][stat] if stat else m[key] for m in results[policy])

    print(f"\n{args.model} on {device}, rate {args.rate:g}/s, {args.requests} requests, prompt {args.prompt_len}, "
          f"output {args.output_len}, {args.max_batch} slots, {torch.get_num_threads()} threads; "
          f"medians of {args.rounds} rounds")
    print(f"{'policy':12s}{'req/s':>8s}{'tok/s':>9s}{'TTFT p50':>10s}{'TTFT p99':>10s}{'TPOT p50':>10s}"
          f"{'E2E p99':>10s}  (ms)")
    for policy in ("continuous", "static"):
        print(f"{policy:12s}{med(policy, 'request_throughput_per_s'):8.2f}{med(policy, 'output_tokens_per_s'):9.1f}"
              f"{med(policy, 'ttft_s', 'p50') * 1e3:10.1f}{med(policy, 'ttft_s', 'p99') * 1e3:10.1f}"
              f"{med(policy, 'tpot_s', 'p50') * 1e3:10.2f}{med(policy, 'e2e_s', 'p99') * 1e3:10.1f}")
    thr = med("continuous", "request_throughput_per_s") / med("static", "request_throughput_per_s")
    ttft = med("static", "ttft_s", "p99") / med("continuous", "ttft_s", "p99")
    print(f"loadtest_throughput_ratio={thr:.2f} loadtest_p99_ttft_ratio={ttft:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
