"""``whatif`` against the engine on this machine's CPU: measure batch 1 with a 128-token prompt, project
batch 4, batch 8 and a 512-token prompt, then measure those and compare TTFT and TPOT.

    python benchmarks/whatif_engine.py [--model small] [--gen-len 16] [--passes 2]

Each run is a ``perfscope profile`` (warm-up, ``--passes`` unprofiled passes: the headline, then the
profiled run the projection reads). Prints projected vs measured TTFT / TPOT and the error; the
machine's load moves the measured times, so run it on a quiet machine (docs/whatif.md has a run).
"""

from __future__ import annotations

import argparse

from perfscope.analysis.projection.project import Question, project, projected_metrics
from perfscope.sessions.profile import EngineRun, profile_engine

CASES = (("batch 4", {"batch": 4}), ("batch 8", {"batch": 8}), ("prompt 512", {"prompt_len": 512}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    run = {"model": args.model, "gen_len": args.gen_len, "device": "cpu"}
    base = profile_engine(EngineRun(batch=1, prompt_len=128, **run), baseline=args.passes)
    print(f"measured {base.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in projected_metrics(base).items()
                                                if k in ("ttft_s_mean", "tpot_s_mean")))
    print(f"{'case':<12} {'metric':<6} {'projected':>10} {'measured':>10} {'error':>8}")
    for label, change in CASES:
        proj = projected_metrics(project(base, Question(**change)))
        meas_report = profile_engine(EngineRun(**{"batch": 1, "prompt_len": 128, **run, **change}),
                                     baseline=args.passes, roofs=base.device)
        meas = projected_metrics(meas_report)
        for key, name in (("ttft_s_mean", "TTFT"), ("tpot_s_mean", "TPOT")):
            p, m = proj[key], meas[key]
            print(f"{label:<12} {name:<6} {p * 1e3:>8.2f}ms {m * 1e3:>8.2f}ms {(p - m) / m * 100:>+7.1f}%")
    # the machine's noise, in the same units: batch 1 measured again at the end
    again = projected_metrics(profile_engine(EngineRun(batch=1, prompt_len=128, **run), baseline=args.passes,
                                             roofs=base.device))
    first = projected_metrics(base)
    print("noise: batch 1 measured again at the end: " + ", ".join(
        f"{name} {again[key] * 1e3:.2f}ms ({(again[key] - first[key]) / first[key] * 100:+.1f}% from the first)"
        for key, name in (("ttft_s_mean", "TTFT"), ("tpot_s_mean", "TPOT"))))


if __name__ == "__main__":
    main()
