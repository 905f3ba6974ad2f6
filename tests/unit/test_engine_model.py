"""The reference engine's model: cached decoding equals a full forward pass, batching and padding,
chunked prefill, prefix caching, the KV cache and rope tables."""

from __future__ import annotations

import math

import pytest
import torch

from perfscope.engine import ModelArgs, SamplingParams, build_model, generate, random_prompts
from perfscope.engine.generate import chunk_mask, plan_slots
from perfscope.engine.model import CONFIGS, KVCache, Linear, build_random, rope_inv_freq
from perfscope.errors import UsageError

ATOL = 2e-5


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return build_model("tiny", seed=1)


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """One forward pass over the whole sequence, no padding: [S, V]."""
    model.setup_caches(1, len(ids))
    with torch.inference_mode():
        return model(torch.tensor([ids]), torch.arange(len(ids)))[0]


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_prefill_then_cached_decode_equals_full_forward(tiny, attention: str) -> None:
    tiny.set_attention(attention)
    ids = random_prompts(1, 24, tiny.args.vocab_size, seed=3)[0]
    ref = full_logits(tiny, ids)
    with torch.inference_mode():
        steps = [tiny(torch.tensor([ids[:10]]), torch.arange(10))[0]]
        for t in range(10, 24):
            steps.append(tiny(torch.tensor([[ids[t]]]), torch.tensor([t]))[0])
    cached = torch.cat(steps)
    assert cached.shape == ref.shape == (24, tiny.args.vocab_size)
    torch.testing.assert_close(cached, ref, atol=ATOL, rtol=1e-5)
    tiny.set_attention("sdpa")


def test_cached_decode_with_thread_split_linears_equals_full_forward() -> None:
    """Matrices large enough for the per-thread split path (decode) vs F.linear (full pass)."""
    args = ModelArgs(name="mid", vocab_size=1024, n_layer=2, n_head=8, n_kv_head=2, dim=512,
                     intermediate_size=1024, max_seq_len=64)
    model = build_random(args, seed=3)
    ids = random_prompts(1, 12, args.vocab_size, seed=6)[0]
    ref = full_logits(model, ids)
    model.setup_caches(1, 12)
    for layer in model.modules():
        if isinstance(layer, Linear):
            layer.n_split = 2
    with torch.inference_mode():
        steps = [model(torch.tensor([ids[:4]]), torch.arange(4))[0]]
        steps += [model(torch.tensor([[ids[t]]]), torch.tensor([t]))[0] for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps), ref, atol=ATOL, rtol=1e-5)


def test_naive_and_sdpa_attention_agree(tiny) -> None:
    ids = random_prompts(1, 30, tiny.args.vocab_size, seed=4)[0]
    sdpa = full_logits(tiny, ids)
    tiny.set_attention("naive")
    try:
        naive = full_logits(tiny, ids)
    finally:
        tiny.set_attention("sdpa")
    torch.testing.assert_close(naive, sdpa, atol=ATOL, rtol=1e-5)


def test_generate_logits_follow_the_full_forward(tiny) -> None:
    """Greedy tokens from generate() are the argmax of a full forward over prompt + generated."""
    prompt = random_prompts(1, 9, tiny.args.vocab_size, seed=5)[0]
    out = generate(tiny, [prompt], 12).generated_ids[0]
    ref = full_logits(tiny, prompt + out[:-1])
    assert ref[len(prompt) - 1:].argmax(-1).tolist() == out


def test_batched_prompts_of_different_lengths_equal_one_by_one(tiny) -> None:
    prompts = [random_prompts(1, n, tiny.args.vocab_size, seed=n)[0] for n in (3, 11, 7, 1)]
    batched = generate(tiny, prompts, 10).generated_ids
    alone = [generate(tiny, [p], 10).generated_ids[0] for p in prompts]
    assert batched == alone


def test_left_padded_prefill_logits_equal_unpadded(tiny) -> None:
    prompts = [random_prompts(1, n, tiny.args.vocab_size, seed=10 + n)[0] for n in (4, 13)]
    slots = plan_slots(prompts, 0, 13, torch.device("cpu"))
    tiny.setup_caches(2, 13)
    with torch.inference_mode():
        logits = tiny(slots.tokens, torch.arange(13), slots.pos, chunk_mask(slots.valid, 0, 13))
    short = full_logits(tiny, prompts[0])
    torch.testing.assert_close(logits[0, 13 - 4:], short, atol=ATOL, rtol=1e-5)
    assert torch.isfinite(logits).all()  # pad rows attend themselves: no NaN anywhere


@pytest.mark.parametrize("chunk", [1, 4, 5])
def test_chunked_prefill_gives_the_same_tokens(tiny, chunk: int) -> None:
    prompts = [random_prompts(1, n, tiny.args.vocab_size, seed=20 + n)[0] for n in (12, 6)]
    plain = generate(tiny, prompts, 6)
    chunked = generate(tiny, prompts, 6, chunked_prefill=chunk)
    assert chunked.generated_ids == plain.generated_ids
    prefill = [s for s in chunked.steps if s.phase == "prefill"]
    assert len(prefill) == math.ceil(12 / chunk)
    assert sum(s.tokens for s in prefill) == 18  # padding is not counted
    assert [s.context_len for s in prefill][-1] == 12


def test_prefix_cache_computes_the_shared_prefix_once(tiny) -> None:
    shared = random_prompts(1, 8, tiny.args.vocab_size, seed=30)[0]
    tails = [random_prompts(1, n, tiny.args.vocab_size, seed=31 + n)[0] for n in (3, 5, 1)]
    prompts = [shared + t for t in tails]
    plain = generate(tiny, prompts, 7)
    cached = generate(tiny, prompts, 7, prefix_cache=True)
    assert cached.generated_ids == plain.generated_ids
    assert cached.params["prefix_tokens"] == 8
    first, second = cached.steps[0], cached.steps[1]
    assert (first.phase, first.batch, first.tokens, first.context_len) == ("prefill", 1, 8, 8)
    assert (second.phase, second.batch, second.tokens) == ("prefill", 3, 3 + 5 + 1)
    assert first.kv_cache_size_bytes == tiny.kv_bytes(3, 8)  # shared to every row after the step


def test_prefix_cache_when_prompts_share_nothing(tiny) -> None:
    prompts = [[1, 2, 3], [4, 5, 6]]
    result = generate(tiny, prompts, 3, prefix_cache=True)
    assert result.params["prefix_tokens"] == 0
    assert result.generated_ids == generate(tiny, prompts, 3).generated_ids


def test_identical_prompts_keep_one_token_of_their_own(tiny) -> None:
    prompts = [[7, 8, 9, 10]] * 3
    result = generate(tiny, prompts, 4, prefix_cache=True)
    assert result.params["prefix_tokens"] == 3
    assert result.generated_ids == [generate(tiny, prompts[:1], 4).generated_ids[0]] * 3


def test_kv_cache_update_writes_the_given_slots() -> None:
    cache = KVCache(2, 8, 3, 4, torch.float32, "cpu")
    k = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).view(2, 3, 2, 4)
    k_all, v_all = cache.update(torch.tensor([5, 6]), k, -k)
    assert k_all.shape == (2, 3, 8, 4)
    torch.testing.assert_close(k_all[:, :, 5:7], k)
    torch.testing.assert_close(v_all[:, :, 5:7], -k)
    assert k_all[:, :, :5].abs().sum() == 0 and k_all[:, :, 7:].abs().sum() == 0
    cache.share_prefix(7, 2)
    torch.testing.assert_close(cache.k_cache[1, :, :7], cache.k_cache[0, :, :7])


def test_split_linear_matches_f_linear() -> None:
    layer = Linear(512, 1024, bias=True)  # large enough to split
    layer.n_split = 2  # one weight slice per thread
    for rows in (1, 3, 16, 40):  # 40 rows take the plain F.linear path
        x = torch.randn(1, rows, 512)
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_llama3_rope_scaling_formula() -> None:
    """Independent evaluation of Llama 3.1's frequency rule for each frequency."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    args = ModelArgs(head_dim=32, n_head=2, n_kv_head=1, dim=64, rope_theta=500000.0, rope_scaling=scaling)
    got = rope_inv_freq(args)
    for i, freq in enumerate(got.tolist()):
        base = 1.0 / 500000.0 ** (2 * i / 32)
        wavelen = 2 * math.pi / base
        if wavelen < 64 / 4.0:
            want = base
        elif wavelen > 64 / 1.0:
            want = base / 8.0
        else:
            smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
            want = (1 - smooth) * base / 8.0 + smooth * base
        assert freq == pytest.approx(want, rel=1e-5)


def test_configs_and_sizes() -> None:
    small = ModelArgs.from_name("small")
    with torch.device("meta"):
        from perfscope.engine.model import Transformer

        n = sum(p.numel() for p in Transformer(small).parameters())
    assert 100e6 <= n <= 150e6
    assert {"tiny", "small", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3-8b"} <= set(CONFIGS)
    with pytest.raises(UsageError, match="unknown model config"):
        ModelArgs.from_name("gpt-5")
    with pytest.raises(UsageError, match="unknown model"):
        build_model("no-such-model")


def test_random_weights_are_seeded_and_tied_when_asked() -> None:
    args = ModelArgs.from_name("tiny", tie_embeddings=True)
    a, b = build_random(args, seed=7), build_random(args, seed=7)
    assert a.output.weight is a.tok_embeddings.weight
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(build_random(args, seed=8).tok_embeddings.weight, a.tok_embeddings.weight)


def test_bad_generate_arguments(tiny) -> None:
    with pytest.raises(UsageError, match="outside the vocabulary"):
        generate(tiny, [[1, 2, 10_000]], 2)
    with pytest.raises(UsageError, match="at least one token"):
        generate(tiny, [[]], 2)
    with pytest.raises(UsageError, match="max_new_tokens"):
        generate(tiny, [[1]], 0)
    with pytest.raises(UsageError, match="exceed the model's context"):
        generate(tiny, [[1] * 500], 100)
    with pytest.raises(UsageError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=1.5)
