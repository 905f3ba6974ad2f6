"""Speculative decoding in the reference engine: draft k tokens cheaply, verify them in one forward.

Two drafts:

- ``ngram`` (prompt lookup): the last n tokens (n = 3, 2, 1) are looked up in the text so far
  (prompt and output); the k tokens that followed their latest earlier occurrence are the draft.
  Free to compute, and right when the answer repeats its input (rewrite, edit, summarise, code).
- ``self:N`` (self-speculative, layer skip): the model's first N layers, its final norm and its
  head draft k tokens one at a time. They share the full model's KV cache for those layers: the
  verify forward rewrites the same slots with the same tokens, so nothing is copied.

The full model then runs ``[pending, d1..dk]`` at positions ``p..p+k`` in one forward (k+1 tokens
per weight read) and keeps the longest accepted prefix plus one token of its own. Greedy: a draft
token is accepted when it is the model's argmax, so the output equals plain greedy decoding.
Sampling: Leviathan et al.'s rejection sampling (accept ``d`` with probability
``min(1, p(d)/q(d))``, else sample from ``norm(max(p - q, 0))``; a bonus token from ``p`` when all
are accepted), so the output distribution is the model's own. KV-cache rollback is a length:
slots past the last accepted token hold stale K/V that the causal mask never lets a query see
before the next forward overwrites them.

Each draft forward (or lookup) is a ``draft`` step and each verify forward a ``verify`` step
(StepRecord ``drafted`` / ``accepted``); a step with an empty draft is a plain ``decode`` step.
One request at a time (batch 1).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from perfscope.annotate import annotate
from perfscope.errors import UsageError
from perfscope.request_metrics import SpeculativeRequestRecord

from .model import Transformer, causal_mask

if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_NGRAM = 3
METHODS_HINT = "use --speculative ngram or --speculative self:N (N draft layers, fewer than the model's)"


@dataclass(frozen=True)
class Draft:
    """``kind`` ``ngram`` or ``self``; ``n_layers`` for ``self``."""

    kind: str
    n_layers: int | None = None

    @property
    def label(self) -> str:
        return self.kind if self.n_layers is None else f"{self.kind}:{self.n_layers}"


def parse_method(method: str, n_layer: int) -> Draft:
    """``"ngram"`` or ``"self:N"`` (1 <= N < n_layer) -> :class:`Draft`; anything else is a UsageError."""
    text = method.strip().lower()
    if text in ("ngram", "prompt-lookup", "lookup"):
        return Draft("ngram")
    if text.startswith("self:"):
        try:
            n = int(text.split(":", 1)[1])
        except ValueError:
            raise UsageError(f"--speculative {method!r}: N must be an integer", hint=METHODS_HINT) from None
        if not 1 <= n < n_layer:
            raise UsageError(f"--speculative {method!r}: N must be in [1, {n_layer - 1}] for this "
                             f"{n_layer}-layer model", hint=METHODS_HINT)
        return Draft("self", n)
    raise UsageError(f"unknown speculative method {method!r}", hint=METHODS_HINT)


def ngram_draft(seq: Sequence[int], k: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of ``seq``'s last n tokens."""
    if k < 1:
        return []
    seq = list(seq)
    end = len(seq)
    for n in range(min(max_ngram, end - 1), 0, -1):
        suffix = seq[end - n:]
        first = suffix[0]
        for j in range(end - n - 1, -1, -1):  # latest match first; the suffix itself is excluded
            if seq[j] == first and seq[j:j + n] == suffix:
                return seq[j + n:j + n + k]
    return []


def accept(target: Tensor, draft: Sequence[int], q: Tensor | None, sampling: Any,
           gen: torch.Generator | None) -> tuple[int, int]:
    """How many draft tokens to keep, and the token the target model adds after them.

    Args:
        target: the verify forward's logits [k+1, V] (row i predicts the token after draft i-1).
        draft: the k drafted ids.
        q: the draft's distributions [k, V] when it sampled them, None for a deterministic draft
            (greedy, or n-gram lookup: a point mass on each draft token).
        sampling: :class:`SamplingParams`; greedy when its temperature is 0.
    Returns:
        (accepted, next token). Greedy: the argmax rule; sampling: rejection sampling, which
        leaves the output distribution equal to the target's.
    """
    from .decoding import sampling_probs

    k = len(draft)
    if sampling.temperature == 0:
        best = target.argmax(dim=-1).tolist()
        n = 0
        while n < k and draft[n] == best[n]:
            n += 1
        return n, int(best[n])
    p = sampling_probs(target, sampling)  # [k+1, V]
    u = torch.rand(k, generator=gen, device=p.device).tolist() if k else []
    for i, d in enumerate(draft):
        p_d = float(p[i, d])
        q_d = 1.0 if q is None else float(q[i, d])
        if q_d > 0 and u[i] < min(1.0, p_d / q_d):
            continue
        residual = p[i].clone()
        if q is None:
            residual[d] = 0.0
        else:
            residual = (residual - q[i]).clamp_(min=0.0)
        total = float(residual.sum())
        if total <= 0:  # p == q exactly: rejection had probability 0; fall back to p
            residual = p[i]
        return i, int(torch.multinomial(residual, 1, generator=gen))
    return k, int(torch.multinomial(p[k], 1, generator=gen))


def _draft_weight_bytes(model: Transformer, n_layers: int) -> float:
    """Weight bytes one draft forward reads: the full model's, less the skipped layers'."""
    skipped = sum(p.numel() * p.element_size() for layer in model.layers[n_layers:] for p in layer.parameters())
    return model.weight_bytes_read(1) - float(skipped)


@torch.inference_mode()
def generate_speculative(model: Transformer, prompts: list[list[int]], max_new_tokens: int, sampling: Any, *,
                         method: str, draft_len: int = 4, stop_ids: Sequence[int] | None = None,
                         chunked_prefill: int | None = None) -> Any:
    """:func:`perfscope.engine.generate` with speculative decoding (one request)."""
    from perfscope.request_metrics import request_records

    from .decoding import (
        GenerationResult,
        _check_prompts,
        _Recorder,
        plan_slots,
        run_params,
        run_prefill,
        sample,
        sampling_probs,
    )

    if len(prompts) != 1:
        raise UsageError(f"speculative decoding runs one request at a time, got a batch of {len(prompts)}",
                         hint="use --batch 1 (or a prompt file with one prompt)")
    if draft_len < 1:
        raise UsageError(f"--draft-len must be at least 1, got {draft_len}")
    _check_prompts(prompts, model.args.vocab_size, max_new_tokens, chunked_prefill)
    spec = parse_method(method, model.args.n_layer)
    prompt = list(prompts[0])
    device = model.device
    rec = _Recorder(model)
    n_slots = len(prompt) + max_new_tokens + draft_len
    model.setup_caches(1, n_slots)
    slots = plan_slots(prompts, 0, n_slots, device)
    gen = torch.Generator(device=device).manual_seed(sampling.seed) if sampling.temperature > 0 else None
    stops = set(stop_ids or ())
    first, t_first = run_prefill(model, slots, chunked_prefill, sampling, gen, rec)
    out, times = [int(first[0])], [t_first]
    pos = len(prompt)  # slot and rope position of the pending token out[-1] (not in the cache yet)
    draft_bytes = _draft_weight_bytes(model, spec.n_layers) if spec.n_layers else 0.0
    kv_share = (spec.n_layers or 0) / model.args.n_layer

    def record(phase: str, tokens: int, width: int, ctx: int, weight_bytes: float, kv_bytes: float, t0: int,
               drafted: int | None = None, accepted: int | None = None) -> int:
        return rec.add(t0, phase=phase, batch=1, tokens=tokens, context_len=ctx, weight_bytes=weight_bytes,
                       kv_cache_bytes=kv_bytes, kv_cache_size_bytes=model.kv_bytes(1, ctx), drafted=drafted,
                       accepted=accepted)

    def forward(tokens: list[int], start: int, n_layers: int | None = None) -> Tensor:
        x = torch.tensor([tokens], dtype=torch.long, device=device)
        input_pos = torch.arange(start, start + len(tokens), device=device)
        mask = causal_mask(input_pos, start + len(tokens))
        return model(x, input_pos, input_pos[None], mask, n_layers=n_layers)[0]  # [S, V]

    while len(out) < max_new_tokens and out[-1] not in stops:
        k = min(draft_len, max_new_tokens - len(out) - 1)
        draft: list[int] = []
        q: Tensor | None = None
        if k > 0 and spec.kind == "ngram":
            t0 = rec.now()
            with annotate("draft"):
                draft = ngram_draft(prompt + out, k)
            record("draft", 0, 0, pos, 0.0, 0.0, t0)
        elif k > 0:
            qs = []
            tok = out[-1]
            for j in range(k):
                t0 = rec.now()
                with annotate("draft"):
                    logits = forward([tok], pos + j, spec.n_layers)[-1]
                    if sampling.temperature > 0:
                        qs.append(sampling_probs(logits, sampling))
                    tok = int(sample(logits[None], sampling, gen))
                draft.append(tok)
                record("draft", 1, 1, pos + j + 1, draft_bytes, model.kv_bytes(1, pos + j + 1) * kv_share, t0)
                if tok in stops:
                    break
            q = torch.stack(qs) if qs else None
        t0 = rec.now()
        phase = "verify" if draft else "decode"
        with annotate(phase):
            logits = forward([out[-1], *draft], pos)
            n_ok, extra = accept(logits, draft, q, sampling, gen)
        new = [*draft[:n_ok], extra]
        width = len(draft) + 1
        t_end = record(phase, width, width, pos + width, model.weight_bytes_read(width), model.kv_bytes(1, pos + width),
                       t0, drafted=len(draft) if draft else None, accepted=n_ok if draft else None)
        for t in new:
            out.append(t)
            times.append(t_end)
            if t in stops or len(out) >= max_new_tokens:
                break
        pos += n_ok + 1
    steps, mark_ns = rec.finish()
    wall_s = (time.perf_counter_ns() - rec.start_ns) / 1e9
    stats = speculative_stats(steps)
    params = run_params(model, prompts, max_new_tokens, sampling, chunked_prefill=chunked_prefill,
                        prefix_cache=False, prefix_tokens=0, compile=False,
                        stop_ids=list(stop_ids) if stop_ids else None,
                        speculation={"method": spec.label, "draft_len": draft_len, **stats})
    records = request_records(prompts, [mark_ns[t] for t in times], rec.start_ns, [len(out)])
    rate = stats["acceptance_rate"]
    requests = [SpeculativeRequestRecord(
        **dataclasses.asdict(r), drafted_tokens=int(stats["drafted_tokens"] or 0),
        accepted_tokens=int(stats["accepted_tokens"] or 0), acceptance_pct=None if rate is None else 100.0 * rate,
        mean_accepted_len=stats["mean_accepted_len"]) for r in records]
    return GenerationResult(prompt_ids=[prompt], generated_ids=[out], steps=steps,
                            requests=list(requests),
                            wall_s=wall_s,
                            params=params)


def speculative_stats(steps: Sequence[Any]) -> dict[str, float | int | None]:
    """Acceptance over a run's verify steps, and where its decode time went.

    ``acceptance_rate``: accepted / drafted tokens; ``mean_accepted_len``: accepted draft tokens
    per verify step; ``tokens_per_verify_step``: tokens the target model emitted per verify step
    (accepted + its own one); ``tokens_per_target_step``: generated tokens (after the first) per
    forward of the full model, verify and plain decode steps together. None when not measured.
    """
    verify = [s for s in steps if s.phase == "verify"]
    decode = [s for s in steps if s.phase == "decode"]
    drafts = [s for s in steps if s.phase == "draft"]
    drafted = sum(s.drafted or 0 for s in verify)
    accepted = sum(s.accepted or 0 for s in verify)
    target_steps = len(verify) + len(decode)
    emitted = accepted + target_steps
    return {
        "verify_steps": len(verify), "decode_steps": len(decode), "draft_steps": len(drafts),
        "drafted_tokens": drafted, "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_len": accepted / len(verify) if verify else None,
        "tokens_per_verify_step": (accepted + len(verify)) / len(verify) if verify else None,
        "tokens_per_target_step": emitted / target_steps if target_steps else None,
        "draft_time_s": sum(s.end_ns - s.start_ns for s in drafts) / 1e9,
        "verify_time_s": sum(s.end_ns - s.start_ns for s in verify) / 1e9,
        "decode_time_s": sum(s.end_ns - s.start_ns for s in decode) / 1e9,
    }
