"""``whatif --kv-policy`` against the engine on this machine's CPU: project a measured full-cache run under
each policy, then measure the policy, and compare decode time per token (TPOT).

    python benchmarks/whatif_kv_policy.py [--model small] [--batch 4] [--prompt-len 1024] [--gen-len 16]
                                          [--policy P ...] [--rounds 3] [--passes 2]

Each round profiles every policy (``perfscope profile --kv-policy``: warm-up, ``--passes`` warm unprofiled
passes for the headline, alternating with the full cache's, then the profiled policy run and one
profiled full-cache run) and projects that full-cache run, measured in the same session, under the
policy (``whatif --kv-policy``): **TPOT error** = projected TPOT / the policy's measured TPOT - 1, both
from passes run in turn, so the machine's load drifts over both alike.

With ``--separate`` the round also profiles the full cache on its own first (``perfscope profile``, as a
user would, then ``whatif`` on that report): its error adds the machine's drift between two profiles
minutes apart, which on a shared machine can be larger than the projection's own.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from perfscope.analysis.projection.project import Question, project, projected_metrics
from perfscope.analysis.summaries.kv_policy import kv_policy_summary
from perfscope.sessions.profile import EngineRun, profile_engine

POLICIES = ("streaming:sink=4,window=64", "h2o:budget=64")


def one_round(args: argparse.Namespace, errors: dict[tuple[str, str], list[float]]) -> None:
    run = {"model": args.model, "batch": args.batch, "prompt_len": args.prompt_len, "gen_len": args.gen_len,
           "device": "cpu", "gemm_curve_s": 0}
    separate = profile_engine(EngineRun(**run), baseline=args.passes) if args.separate else None
    for policy in args.policy or POLICIES:
        refs: list = []
        measured = profile_engine(EngineRun(**run, kv_policy=policy), baseline=args.passes, on_reference=refs.append,
                                  roofs=separate.device if separate is not None else None)
        tpot = projected_metrics(measured)["tpot_s_mean"]
        s = kv_policy_summary(measured) or {}
        own = s.get("policy_run") or {}
        for label, full in (("same session", refs[0]), ("separate", separate)):
            if full is None:
                continue
            full_tpot = projected_metrics(full)["tpot_s_mean"]
            proj = projected_metrics(project(full, Question(kv_policy=policy)))["tpot_s_mean"]
            err = (proj / tpot - 1) * 100
            errors.setdefault((policy, label), []).append(err)
            print(f"  {policy:<30} {label:<12} full {full_tpot * 1e3:7.2f} ms -> projected {proj * 1e3:7.2f} ms, "
                  f"measured {tpot * 1e3:7.2f} ms ({err:+.1f}%); speed-up projected {full_tpot / proj:.3f}x", flush=True)
        print(f"  {policy:<30} KV per decode step {own.get('kv_bytes_per_step', float('nan')) / 1e6:.2f} MB vs "
              f"{s.get('full_kv_bytes_per_step', float('nan')) / 1e6:.2f} MB; measured speed-up (interleaved passes) "
              f"{s.get('step_ns_speedup', float('nan')):.3f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--separate", action="store_true", help="also project a full-cache run profiled on its own")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    errors: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        print(f"round {r + 1} of {args.rounds}", flush=True)
        one_round(args, errors)
    print("median TPOT error over the rounds (projected / measured - 1):")
    for (policy, what), v in errors.items():
        print(f"  {policy:<30} {what:<12} {statistics.median(v):+6.1f}%   (rounds: " + ", ".join(f"{x:+.1f}" for x in v) + ")")


if __name__ == "__main__":
    main()
