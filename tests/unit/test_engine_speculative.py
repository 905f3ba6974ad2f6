"""Speculative decoding: greedy output equals plain greedy token for token (n-gram and self drafts,
with rejections, so the KV-cache rollback is exercised); rejection sampling leaves the distribution
unchanged (chi-square on a small vocabulary, and the exact joint distribution of a 4-token model's
output); the step records and statistics add up."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from perfscope.engine import ModelArgs, SamplingParams, generate
from perfscope.engine.model import build_random, init_random_
from perfscope.engine.speculative import accept, ngram_draft, parse_method, speculative_stats
from perfscope.errors import UsageError

TINY = ModelArgs(name="t", vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, dim=32, intermediate_size=64,
                 max_seq_len=256)


@pytest.fixture(scope="module")
def model():
    m = build_random(TINY, seed=1)
    return init_random_(m, 1, std=0.3)  # peaky logits: greedy loops, so the n-gram draft gets accepted


def test_ngram_draft_takes_the_latest_longest_match() -> None:
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert ngram_draft(seq, 2) == [7, 8]  # "2 3" last seen before the suffix at index 6 -> 7, 8
    assert ngram_draft([4, 5, 6, 4, 5], 4) == [6, 4, 5]  # stops at the end of the text
    assert ngram_draft([1, 2, 3], 3) == []
    assert ngram_draft([1, 2, 1], 0) == []


@pytest.mark.parametrize("bad", ["self:0", "self:3", "self:x", "medusa"])
def test_bad_method_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_method(bad, 3)
    assert parse_method("self:2", 3).n_layers == 2


@pytest.mark.parametrize("method", ["ngram", "self:1", "self:2"])
@pytest.mark.parametrize("draft_len", [1, 3, 5])
def test_greedy_equals_plain_greedy(model, method: str, draft_len: int) -> None:
    prompt = [3, 9, 27, 17, 3, 9, 27, 40, 11, 3, 9]
    plain = generate(model, [prompt], 40)
    spec = generate(model, [prompt], 40, speculative=method, draft_len=draft_len)
    assert spec.generated_ids == plain.generated_ids
    s = spec.params["speculation"]
    assert s["method"] == method and 0 < s["verify_steps"]
    assert s["accepted_tokens"] <= s["drafted_tokens"]
    verify = [st for st in spec.steps if st.phase == "verify"]
    assert all(st.tokens == st.drafted + 1 and 0 <= st.accepted <= st.drafted for st in verify)
    # every generated token after the first comes from one full-model forward (verify or decode)
    emitted = sum(st.accepted + 1 for st in verify) + sum(st.phase == "decode" for st in spec.steps)
    assert emitted >= 39
    assert spec.requests[0].output_tokens == 40
    if method == "self:1":
        assert s["acceptance_rate"] < 1  # some rejections happened: rollback was exercised
    # the request carries the same speculative columns as transformers generate()'s requests
    req = spec.requests[0]
    assert (req.drafted_tokens, req.accepted_tokens) == (s["drafted_tokens"], s["accepted_tokens"])
    assert req.acceptance_pct == pytest.approx(100 * s["acceptance_rate"])
    assert req.mean_accepted_len == pytest.approx(s["accepted_tokens"] / s["verify_steps"])


def test_stop_ids_end_speculative_and_plain_runs_alike(model) -> None:
    prompt = [3, 9, 27, 17, 3, 9, 27, 40, 11, 3, 9]
    full = generate(model, [prompt], 30).generated_ids[0]
    stop = full[7]
    want = full[: full.index(stop) + 1]
    for method in (None, "ngram", "self:2"):
        r = generate(model, [prompt], 30, stop_ids=[stop], speculative=method)
        assert r.generated_ids[0] == want and r.requests[0].output_tokens == len(want)


def test_batch_stop_truncates_each_row(model) -> None:
    prompts = [[3, 9, 27], [5, 6, 7, 8]]
    full = generate(model, prompts, 20).generated_ids
    stop = full[0][4]
    r = generate(model, prompts, 20, stop_ids=[stop])
    for row, out in zip(full, r.generated_ids):
        end = row.index(stop) + 1 if stop in row else len(row)
        assert out == row[:end]
    assert [q.output_tokens for q in r.requests] == [len(o) for o in r.generated_ids]


def test_speculative_needs_one_request(model) -> None:
    with pytest.raises(UsageError, match="one request"):
        generate(model, [[1, 2], [3, 4]], 4, speculative="ngram")


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; outcomes expected fewer than 5 times are pooled into one cell."""
    probs = np.asarray(probs, dtype=np.float64) / np.sum(probs, dtype=np.float64)
    total = counts.sum()
    keep = probs * total >= 5
    observed = np.append(counts[keep], total - counts[keep].sum())
    expected = np.append(probs[keep] * total, total - (probs[keep] * total).sum())
    if expected[-1] < 1e-6:
        observed, expected = observed[:-1], expected[:-1]
    expected = expected * observed.sum() / expected.sum()
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(observed) - 1  # chi-square survival function: Q(dof / 2, stat / 2)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


@pytest.mark.parametrize("draft_kind", ["sampled", "point-mass"])
def test_rejection_sampling_keeps_the_target_distribution(draft_kind: str) -> None:
    """The first emitted token of a step is distributed as the target's p, whatever the draft q."""
    v = 6
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(2, v, generator=gen) * 1.5  # logits: the draft position + the bonus
    p = torch.softmax(target, -1)
    q = torch.softmax(torch.randn(1, v, generator=gen) * 1.5, -1)
    sampling = SamplingParams(temperature=1.0)
    n = 4000
    draws = torch.multinomial(q[0], n, replacement=True, generator=gen).tolist()
    first = np.zeros(v)
    accepted = 0
    for i in range(n):
        draft = [draws[i]] if draft_kind == "sampled" else [int(p[0].argmin())]  # a poor point-mass guess
        n_ok, extra = accept(target, draft, q if draft_kind == "sampled" else None, sampling, gen)
        first[draft[0] if n_ok else extra] += 1
        accepted += n_ok
    assert 0 < accepted < n
    assert _chi2_pvalue(first, p[0].numpy()) > 1e-3
    # and the check has power: the draft's own distribution is rejected
    assert _chi2_pvalue(first, q[0].numpy()) < 1e-6


def test_greedy_accept_is_the_argmax_rule() -> None:
    target = torch.tensor([[0.0, 5, 1], [3, 0, 1], [0, 0, 9]])
    g = SamplingParams()
    assert accept(target, [1, 0], None, g, None) == (2, 2)
    assert accept(target, [1, 2], None, g, None) == (1, 0)
    assert accept(target, [0, 0], None, g, None) == (0, 1)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["self:1", "ngram"])
def test_sampled_output_distribution_is_exactly_the_models(method: str) -> None:
    """A 4-token vocabulary: the distribution of 3 generated tokens over 64 outcomes, from 800 seeded
    runs, against the exact product of the model's conditionals."""
    args = ModelArgs(name="v4", vocab_size=4, n_layer=2, n_head=2, n_kv_head=1, dim=16, intermediate_size=32,
                     max_seq_len=32)
    m = init_random_(build_random(args, seed=2), 2, std=0.6)
    prompt = [1, 2, 1, 2, 1]
    with torch.inference_mode():
        m.setup_caches(1, 16)
        exact = np.zeros(64)
        for seq in itertools.product(range(4), repeat=3):
            ids = torch.tensor([prompt + list(seq)])
            logp = torch.log_softmax(m(ids, torch.arange(ids.shape[1]))[0].double(), -1)
            exact[seq[0] * 16 + seq[1] * 4 + seq[2]] = float(sum(logp[len(prompt) - 1 + j, seq[j]] for j in range(3)).exp())
    counts = np.zeros(64)
    accepted = 0
    for seed in range(800):
        r = generate(m, [prompt], 3, SamplingParams(temperature=1.0, seed=seed), speculative=method, draft_len=2)
        a, b, c = r.generated_ids[0]
        counts[a * 16 + b * 4 + c] += 1
        accepted += r.params["speculation"]["accepted_tokens"]
    assert accepted > 50  # the drafts were used, not just rejected
    assert _chi2_pvalue(counts, exact) > 1e-3


def test_stats_from_steps() -> None:
    from perfscope.engine import StepRecord

    def step(phase: str, d=None, a=None, dur=10):
        return StepRecord(0, phase, 1, 1, 1, 0, dur, 1.0, 1.0, 1.0, drafted=d, accepted=a)

    s = speculative_stats([step("prefill"), step("draft", dur=2), step("verify", 4, 3), step("draft", dur=2),
                           step("verify", 4, 1), step("decode")])
    assert s["acceptance_rate"] == 0.5 and s["mean_accepted_len"] == 2.0 and s["tokens_per_verify_step"] == 3.0
    assert s["tokens_per_target_step"] == 7 / 3 and s["draft_time_s"] == 4e-9 and s["verify_time_s"] == 20e-9
