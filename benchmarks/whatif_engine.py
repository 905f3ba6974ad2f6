"""``whatif`` against the engine on this machine's CPU: measure batch 1 with a 128-token prompt, project
batch 4, batch 8 and a 512-token prompt, then measure those and compare TTFT and TPOT.

    python benchmarks/whatif_engine.py [--model small] [--gen-len 16] [--passes 2] [--rounds 3] [--by-op]

Each run is a ``perfscope profile`` (warm-up, ``--passes`` unprofiled passes: the headline, then the
profiled run the projection reads). Prints projected vs measured TTFT / TPOT and the error; the
machine's load moves the measured times, so run it on a quiet machine (docs/whatif.md has a run).
"""

from __future__ import annotations

import argparse
import statistics

from perfscope.analysis.projection.project import Question, project, projected_metrics
from perfscope.sessions.profile import EngineRun, profile_engine

CASES = (("batch 4", {"batch": 4}), ("batch 8", {"batch": 8}), ("prompt 512", {"prompt_len": 512}))


def by_op(projected, measured, label: str) -> str:
    """Each op's kernel time per decode step, projected / measured (the five largest measured)."""
    def per_step(report):
        k = report.kernels
        dec = k[k["phase"] == "decode"]
        return dec.groupby("op")["duration_ns"].sum() / max(int((report.steps["phase"] == "decode").sum()), 1) / 1e6
    p, m = per_step(projected), per_step(measured)
    top = m.nlargest(5).index
    return "\n".join(f"  {label} decode {op:<40} {p.get(op, float('nan')):8.2f} / {m[op]:8.2f} ms per step" for op in top)


def one_round(args: argparse.Namespace, errors: dict[tuple[str, str], list[float]]) -> None:
    """Measure batch 1, project and measure each case, measure batch 1 again; errors appended per case."""
    run = {"model": args.model, "gen_len": args.gen_len, "device": "cpu"}
    base = profile_engine(EngineRun(batch=1, prompt_len=128, **run), baseline=args.passes)
    print(f"measured {base.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in projected_metrics(base).items()
                                                if k in ("ttft_s_mean", "tpot_s_mean")))
    print(f"{'case':<12} {'metric':<6} {'projected':>10} {'measured':>10} {'error':>8}")
    if args.out:
        base.save(f"{args.out}/base.perfscope", force=True)
    for label, change in CASES:
        proj_report = project(base, Question(**change))
        proj = projected_metrics(proj_report)
        meas_report = profile_engine(EngineRun(**{"batch": 1, "prompt_len": 128, **run, **change}),
                                     baseline=args.passes, roofs=base.device)
        meas = projected_metrics(meas_report)
        if args.out:
            tag = label.replace(" ", "")
            meas_report.save(f"{args.out}/{tag}.perfscope", force=True)
            proj_report.save(f"{args.out}/{tag}-projected.perfscope", force=True)
        if args.by_op:
            print(by_op(proj_report, meas_report, label))
        for key, name in (("ttft_s_mean", "TTFT"), ("tpot_s_mean", "TPOT")):
            p, m = proj[key], meas[key]
            errors.setdefault((label, name), []).append((p - m) / m * 100)
            print(f"{label:<12} {name:<6} {p * 1e3:>8.2f}ms {m * 1e3:>8.2f}ms {(p - m) / m * 100:>+7.1f}%")
    # the machine's noise, in the same units: batch 1 measured again at the end
    again = projected_metrics(profile_engine(EngineRun(batch=1, prompt_len=128, **run), baseline=args.passes,
                                             roofs=base.device))
    first = projected_metrics(base)
    for key, name in (("ttft_s_mean", "TTFT"), ("tpot_s_mean", "TPOT")):
        errors.setdefault(("noise", name), []).append((again[key] - first[key]) / first[key] * 100)
    print("noise: batch 1 measured again at the end: " + ", ".join(
        f"{name} {again[key] * 1e3:.2f}ms ({(again[key] - first[key]) / first[key] * 100:+.1f}% from the first)"
        for key, name in (("ttft_s_mean", "TTFT"), ("tpot_s_mean", "TPOT"))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="repeat the whole check; the median error per case is printed")
    ap.add_argument("--out", help="save the measured and projected reports in this folder (the last round's)")
    ap.add_argument("--by-op", action="store_true", help="print each op's decode time per step, projected / measured")
    args = ap.parse_args()
    errors: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        if args.rounds > 1:
            print(f"round {r + 1} of {args.rounds}")
        one_round(args, errors)
    if args.rounds > 1:
        print("median error over the rounds (each round projects from its own batch-1 run):")
        for (label, name), v in errors.items():
            print(f"  {label:<12} {name:<6} {statistics.median(v):+6.1f}%   (rounds: "
                  + ", ".join(f"{x:+.1f}" for x in v) + ")")


if __name__ == "__main__":
    main()
