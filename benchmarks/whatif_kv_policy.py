"""``whatif --kv-policy`` against the engine on this machine's CPU: project a measured full-cache run under
each policy and compare its decode time per token (TPOT) with the policy's, measured.

    python benchmarks/whatif_kv_policy.py [--model small] [--batch 8] [--prompt-len 512] [--gen-len 12]
                                          [--policy P ...] [--rounds 3] [--runs 5] [--threads N]

The machine is shared: a decode step's time moves by tens of percent from one minute to the next,
more than a small KV policy saves. So the measurement is made robust, and the projection is compared
on the same footing:

1. each round profiles the full cache once (``perfscope profile``: the report ``whatif`` projects) and
   projects it under every policy: the projected TPOT / the full cache's TPOT of that report is the
   projection's ratio;
2. each round then times decode directly, ``--runs`` times in turn: the full cache, then every policy
   (``generate()``, the same batch and prompts; each run's median decode step), so that every config
   sees the same load; the measured TPOT of a config is the median over all its runs of all rounds;
3. projected TPOT = the full cache's measured TPOT x the median projection ratio; **error** = projected
   / measured policy TPOT - 1.

The raw figures are printed too: each round's report TPOT, projection, and the policy's runs.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from perfscope.analysis.projection.project import Question, project, projected_metrics
from perfscope.engine.generate import build_model, generate
from perfscope.sessions.profile import EngineRun, engine_prompts, profile_engine

POLICIES = ("streaming:sink=4,window=64", "h2o:budget=64")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=12)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each config per round, in turn")
    ap.add_argument("--passes", type=int, default=2, help="warm unprofiled passes of each full-cache profile")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    policies = list(args.policy or POLICIES)
    run = EngineRun(model=args.model, batch=args.batch, prompt_len=args.prompt_len, gen_len=args.gen_len,
                    device="cpu", gemm_curve_s=0)
    model = build_model(args.model)
    prompts = engine_prompts(run, model.args.vocab_size)
    ratios: dict[str, list[float]] = {p: [] for p in policies}
    steps: dict[str, list[float]] = {p: [] for p in ["full", *policies]}
    for p in steps:  # warm-up: every shape once
        generate(model, prompts, 3, kv_policy=None if p == "full" else p)
    print(f"{args.model}, batch {args.batch} x {args.prompt_len} prompt tokens, {args.gen_len} generated, "
          f"{torch.get_num_threads()} threads; {args.rounds} rounds of {args.runs} timed runs per config", flush=True)
    for r in range(args.rounds):
        full = profile_engine(run, baseline=args.passes, model=model)
        full_tpot = projected_metrics(full)["tpot_s_mean"]
        line = [f"round {r + 1}: full-cache report TPOT {full_tpot * 1e3:.2f} ms"]
        for p in policies:
            proj = projected_metrics(project(full, Question(kv_policy=p)))["tpot_s_mean"]
            ratios[p].append(proj / full_tpot)
            line.append(f"{p} projected {proj * 1e3:.2f} ms ({full_tpot / proj:.3f}x)")
        print("; ".join(line), flush=True)
        for _ in range(args.runs):
            for p, times in steps.items():
                res = generate(model, prompts, args.gen_len, kv_policy=None if p == "full" else p)
                times.append(statistics.median(s.end_ns - s.start_ns for s in res.steps if s.phase == "decode"))
        print("  timed decode steps (ms, this round): " + "; ".join(
            f"{p} " + ", ".join(f"{x / 1e6:.1f}" for x in v[-args.runs:]) for p, v in steps.items()), flush=True)
    full_ms = statistics.median(steps["full"]) / 1e6
    print(f"measured TPOT (median decode step of {len(steps['full'])} runs): full cache {full_ms:.2f} ms")
    print(f"{'policy':<30} {'projected':>10} {'measured':>10} {'error':>8} {'proj. speed-up':>15} {'meas. speed-up':>15}")
    for p in policies:
        measured = statistics.median(steps[p]) / 1e6
        projected = full_ms * statistics.median(ratios[p])
        print(f"{p:<30} {projected:8.2f}ms {measured:8.2f}ms {(projected / measured - 1) * 100:+7.1f}% "
              f"{full_ms / projected:14.3f}x {full_ms / measured:14.3f}x")


if __name__ == "__main__":
    main()
