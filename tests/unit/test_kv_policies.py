"""KV-cache policies (``--kv-policy``): the parser, the caches against references written out here
(StreamingLLM's mask over a full recompute, H2O and Quest step by step on one layer), the engine's own
cache sizes behind the step bytes (the issue's 480-token check), the serving engine, capacity by hand for
Llama-3-8B, and the refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch

from perfscope.cli import main
from perfscope.engine import generate, random_prompts
from perfscope.engine.kv_policies import PolicyKVCache, PolicyStep
from perfscope.engine.model import KVCache, ModelArgs, build_random, sdpa_attention
from perfscope.engine.serving import (
    LoadRequest,
    ServeConfig,
    SimClock,
    SlotEngine,
    greedy_agreement,
    greedy_outputs,
    kv_logit_error,
    serve,
)
from perfscope.errors import UsageError
from perfscope.kv_policy import KVPolicy, parse_kv_policy, read_ratio

STREAM, H2O, QUEST = "streaming:sink=4,window=8", "h2o:budget=16", "quest:budget=16,page=4"


@pytest.fixture(scope="module")
def model():
    """tiny's shapes with four layers (Quest keeps the first two dense)."""
    return build_random(ModelArgs.from_name("tiny", n_layer=4))


@pytest.fixture(scope="module")
def prompts():
    p = random_prompts(3, 40, 512, seed=1)
    p[1] = p[1][:25]  # rows of different lengths: left padding in generate(), own positions in the slot engine
    return p


# ------------------------------------------------------------------ the parser
@pytest.mark.parametrize("text,want", [
    (None, KVPolicy()), ("full", KVPolicy()), ("streaming:window=64", KVPolicy("streaming", sink=4, window=64)),
    ("streaming:sink=0,window=8", KVPolicy("streaming", sink=0, window=8)),
    ("h2o:budget=64", KVPolicy("h2o", budget=64, recent=32)), ("H2O:budget=64,recent=8", KVPolicy("h2o", budget=64, recent=8)),
    ("quest:budget=64", KVPolicy("quest", budget=64, page=16)), ("quest:budget=64,page=8", KVPolicy("quest", budget=64, page=8)),
])
def test_parse(text, want) -> None:
    got = parse_kv_policy(text)
    assert got == want
    assert parse_kv_policy(got.text()) == got  # the canonical spelling parses back to the same policy


@pytest.mark.parametrize("text,words", [
    ("sliding:window=4", "unknown policy"), ("streaming:sink=4", "needs window"), ("streaming:window=0", "at least 1"),
    ("h2o:budget=64,window=3", "h2o takes budget, recent"), ("h2o:budget=8,recent=9", "recent <= budget"),
    ("quest:budget=8,page=16", "budget >= page"), ("h2o:budget=x", "not a whole number"),
    ("h2o:budget=64,budget=32", "given twice"), ("streaming:window=99999999", "out of range"), ("full:x=1", "no options"),
])
def test_bad_policies_are_one_line(text, words) -> None:
    with pytest.raises(UsageError, match=words):
        parse_kv_policy(text)


def test_kept_and_read_entries() -> None:
    s, h, q = parse_kv_policy("streaming:sink=4,window=64"), parse_kv_policy("h2o:budget=64"), parse_kv_policy("quest:budget=64")
    assert (s.held(480), s.held(20), h.held(480), q.held(480)) == (68, 20, 64, 480)
    assert s.read_entries(480, 12) == 68 and read_ratio(s, 480, 12) == pytest.approx(68 / 480)
    # Quest: 30 pages of 16, 4 read, plus one min and one max key per page; layers 0 and 1 dense
    assert q.attended(480, 0) == 480 and q.attended(480, 2) == 64 and q.metadata_entries(480, 2) == 30
    assert q.read_entries(480, 4) == pytest.approx((2 * 480 + 2 * (64 + 30)) / 4)
    assert q.attended(60, 5) == 60  # four pages fit the budget: dense
    assert s.held_bytes_per_sequence(480, 100.0, 2) == 2 * 68 * 100.0
    assert q.held_bytes_per_sequence(480, 100.0, 2) == 2 * (480 + 30) * 100.0


# ------------------------------------------------------------------ against references
def _streaming_reference(m, prompt: list[int], n: int, sink: int, window: int) -> list[int]:
    """Greedy tokens from a full recompute of the whole sequence each step under StreamingLLM's mask."""
    seq, out = list(prompt), []
    m.setup_caches(1, len(prompt) + n)
    with torch.inference_mode():
        for _ in range(n):
            pos = torch.arange(len(seq))
            q, k = pos[:, None], pos[None, :]
            mask = ((k <= q) & ((k < sink) | (k > q - window)))[None, None]
            t = int(m(torch.tensor([seq]), pos, pos[None], mask)[:, -1].argmax(-1))
            out.append(t)
            seq.append(t)
    return out


@pytest.mark.parametrize("chunk", [None, 7])
def test_streaming_equals_a_full_recompute_under_its_mask(model, prompts, chunk) -> None:
    got = generate(model, prompts, 10, kv_policy="streaming:sink=3,window=6", chunked_prefill=chunk).generated_ids
    for p, row in zip(prompts, got):
        assert row == _streaming_reference(model, p, 10, 3, 6)


@pytest.mark.parametrize("policy", ["streaming:sink=4,window=64", "h2o:budget=64", "quest:budget=64,page=4"])
def test_a_budget_that_holds_everything_is_the_full_cache(model, prompts, policy) -> None:
    full = generate(model, prompts, 12).generated_ids
    assert generate(model, prompts, 12, kv_policy=policy).generated_ids == full
    assert greedy_outputs(model, prompts, 12, kv_policy=policy) == greedy_outputs(model, prompts, 12)


def test_h2o_keeping_only_recent_tokens_is_a_window(model) -> None:
    # prompts within the budget: no eviction in the prompt, then decode evicts the oldest token each step
    p = random_prompts(2, 10, 512, seed=3)
    a = generate(model, p, 20, kv_policy="h2o:budget=12,recent=12").generated_ids
    assert a == generate(model, p, 20, kv_policy="streaming:sink=0,window=12").generated_ids
    assert a != generate(model, p, 20).generated_ids  # and it did evict


def _one_layer(policy: str, n_rows: int = 1, max_len: int = 64, k_heads: int = 2, d: int = 8) -> PolicyKVCache:
    return PolicyKVCache(parse_kv_policy(policy), PolicyStep(), layer=2, n_rows=n_rows, max_len=max_len,
                         n_kv_head=k_heads, head_dim=d, dtype=torch.float32, device="cpu")


def _set(cache: PolicyKVCache, pos: int, n: int = 1) -> None:
    st = cache.step
    q = torch.arange(pos, pos + n)[None]
    st.rows_host, st.rows, st.row_idx = [0], slice(0, 1), torch.tensor([0])
    st.qpos, st.real, st.last = q, torch.ones(1, n, dtype=torch.bool), torch.tensor([pos + n - 1])
    st.n_real, st.end_host = [n], [pos + n]
    st.reset_host, st.reset = [pos == 0], torch.tensor([pos == 0])
    st.decode = n == 1


def _attend(q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    # q [H, D], k/v [T, K, D] for one row: probs [H, T] and out [H, D], grouped query heads
    h, d = q.shape
    kk = k.repeat_interleave(h // k.shape[1], dim=1)  # [T, H, D]
    vv = v.repeat_interleave(h // v.shape[1], dim=1)
    s = torch.einsum("hd,thd->ht", q, kk) / math.sqrt(d)
    p = torch.softmax(s, dim=-1)
    return torch.einsum("ht,thd->hd", p, vv), p


def test_h2o_decode_matches_the_algorithm_step_by_step() -> None:
    budget, recent, heads, kvh, d = 6, 2, 4, 2, 8
    cache = _one_layer(f"h2o:budget={budget},recent={recent}", k_heads=kvh, d=d)
    gen = torch.Generator().manual_seed(0)
    kept: list[list[tuple[int, torch.Tensor, torch.Tensor, float]]] = [[] for _ in range(kvh)]  # per KV head
    for pos in range(20):
        q = torch.randn(1, heads, 1, d, generator=gen)
        k, v = torch.randn(1, kvh, 1, d, generator=gen), torch.randn(1, kvh, 1, d, generator=gen)
        _set(cache, pos)
        y = cache.attend(q, k, v, lambda *a: None)  # type: ignore[arg-type]
        want = torch.zeros(heads, d)
        for h in range(kvh):  # the reference: evict the least attended outside the recent tokens, then attend
            entries = kept[h]
            if len(entries) == budget:
                cand = [i for i, e in enumerate(entries) if e[0] <= pos - recent]
                del entries[min(cand, key=lambda i: entries[i][3])]
            entries.append((pos, k[0, h, 0], v[0, h, 0], 0.0))
            ks = torch.stack([e[1] for e in entries])[:, None]
            vs = torch.stack([e[2] for e in entries])[:, None]
            group = slice(h * heads // kvh, (h + 1) * heads // kvh)
            out, p = _attend(q[0, group, 0], ks, vs)
            want[group] = out
            kept[h] = [(e[0], e[1], e[2], e[3] + float(p[:, i].sum())) for i, e in enumerate(entries)]
        assert torch.allclose(y[0, :, 0], want, atol=1e-5)
        for h in range(kvh):
            held = sorted(int(x) for x in cache.pos[0, h, : cache.count_host[0]])
            assert held == sorted(e[0] for e in kept[h])
            assert set(range(max(pos - recent + 1, 0), pos + 1)) <= set(held)  # the recent tokens stay


def test_quest_reads_the_pages_whose_keys_can_score_highest() -> None:
    page, budget, heads, kvh, d = 4, 8, 4, 2, 8
    cache = _one_layer(f"quest:budget={budget},page={page}", k_heads=kvh, d=d, max_len=30)  # not whole pages
    gen = torch.Generator().manual_seed(1)
    n = 29
    ks, vs = torch.randn(1, kvh, n, d, generator=gen), torch.randn(1, kvh, n, d, generator=gen)
    _set(cache, 0, n - 1)  # a prefill of 28 tokens (dense), then one decode token at position 28
    cache.attend(torch.randn(1, heads, n - 1, d, generator=gen), ks[:, :, :-1], vs[:, :, :-1], sdpa_attention)
    q = torch.randn(1, heads, 1, d, generator=gen)
    _set(cache, n - 1)
    y = cache.attend(q, ks[:, :, -1:], vs[:, :, -1:], sdpa_attention)
    assert cache.read_per_row == budget and cache.meta_elems == 2 * kvh * 8 * d  # 8 pages: their min and max keys
    for h in range(kvh):
        group = slice(h * heads // kvh, (h + 1) * heads // kvh)
        bounds = []
        for pg in range(8):
            kk = ks[0, h, pg * page:(pg + 1) * page]
            lo, hi = kk.min(dim=0).values, kk.max(dim=0).values
            bounds.append(float(sum(torch.maximum(qq * lo, qq * hi).sum() for qq in q[0, group, 0])))
        top = sorted(range(8), key=lambda i: -bounds[i])[: budget // page]
        idx = [t for pg in sorted(top) for t in range(pg * page, min((pg + 1) * page, n))]
        want, _ = _attend(q[0, group, 0], ks[0, h, idx][:, None], vs[0, h, idx][:, None])
        assert torch.allclose(y[0, group, 0], want, atol=1e-5)


# ------------------------------------------------------------------ what it buys: bytes from the cache's own sizes
def test_decode_attention_bytes_at_480_tokens_follow_the_kept_share() -> None:
    """The issue's check: at a 480-token context, streaming:sink=4,window=64 reads (4 + 64) / 480 of the full
    cache's decode attention bytes and h2o:budget=64 its budget share (within 5%), and each step's bytes are
    the engine's own cache tensors: the full cache's first 480 slots, the policy cache's whole rows."""
    m = build_random(ModelArgs.from_name("tiny"))  # max_seq_len 512
    prompt = random_prompts(1, 479, 512, seed=4)

    def at_480(policy: str | None):
        r = generate(m, prompt, 2, kv_policy=policy)
        (step,) = [s for s in r.steps if s.phase == "decode" and s.context_len == 480]
        return step

    full = at_480(None)
    cache = m.attentions()[0].kv_cache
    assert isinstance(cache, KVCache)
    own = sum(2 * a.kv_cache.k_cache[:1, :, :480].numel() * a.kv_cache.k_cache.element_size() for a in m.attentions())
    assert full.kv_cache_bytes == own and full.kv_entries == 480
    seen: list[PolicyKVCache] = []
    orig = PolicyKVCache.__init__

    def keep(self, *a, **kw):
        orig(self, *a, **kw)
        seen.append(self)

    for policy, kept in (("streaming:sink=4,window=64", 68), ("h2o:budget=64", 64)):
        seen.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(PolicyKVCache, "__init__", keep)
            step = at_480(policy)
        assert [c.k.shape[2] for c in seen] == [kept] * m.args.n_layer  # rows hold exactly what the policy keeps
        own = sum(2 * c.k[:1].numel() * c.k.element_size() for c in seen)
        assert step.kv_cache_bytes == own and step.kv_entries == kept
        assert step.kv_cache_bytes / full.kv_cache_bytes == pytest.approx(kept / 480, rel=0.05)


def test_the_serving_engine_records_what_its_caches_read(model) -> None:
    reqs = [LoadRequest(i, 0.0, tuple(random_prompts(1, 30 + 5 * i, 512, seed=i)[0]), 6) for i in range(3)]
    for policy, per_row in ((None, None), (STREAM, 12), (H2O, 16)):
        with SlotEngine(model, 3, 60, "auto", policy) as eng:
            res = serve(eng, reqs, ServeConfig(max_batch=3), SimClock())
        dec = [s for s in res.steps if s.phase == "decode"]
        if per_row is None:
            assert all(s.kv_entries == s.context_len for s in dec)
        else:
            per_entry = 2 * model.args.n_kv_head * model.args.head_dim * 4  # K and V of one KV head, float32
            assert all(s.kv_entries == per_row for s in dec)
            assert all(s.kv_cache_bytes == s.batch * per_row * per_entry * model.args.n_layer for s in dec)
            assert all(s.kv_cache_size_bytes <= s.kv_slots_in_use * per_row * per_entry * model.args.n_layer for s in dec)


# ------------------------------------------------------------------ works with the serving engine's machinery
@pytest.mark.parametrize("policy", [STREAM, H2O, QUEST])
def test_continuous_batching_moves_slots_with_their_state(model, policy) -> None:
    """Four requests through two slots (retirements move the highest slot down) give each request the
    tokens it gets alone (chunked prefill too, except for H2O, whose prompt evictions depend on the chunks)."""
    ps = [random_prompts(1, 20 + 7 * i, 512, seed=10 + i)[0] for i in range(4)]
    outs = [3, 9, 5, 7]
    reqs = [LoadRequest(i, 0.0, tuple(p), n) for i, (p, n) in enumerate(zip(ps, outs))]
    with SlotEngine(model, 2, 60, "auto", policy) as eng:
        res = serve(eng, reqs, ServeConfig(max_batch=2, max_batched_tokens=None if policy == H2O else 16), SimClock())
    for t in res.requests:
        assert t.output_ids == greedy_outputs(model, [ps[t.request_id]], outs[t.request_id], kv_policy=policy)[0]


def test_streaming_is_chunking_invariant_in_the_serving_engine(model) -> None:
    ps = [random_prompts(1, 33, 512, seed=20)[0]]
    reqs = [LoadRequest(0, 0.0, tuple(ps[0]), 8)]
    got = []
    for budget in (None, 9):
        with SlotEngine(model, 1, 50, "auto", STREAM) as eng:
            got.append(serve(eng, reqs, ServeConfig(max_batch=1, max_batched_tokens=budget), SimClock()).requests[0].output_ids)
    assert got[0] == got[1]


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_policies_with_quantized_kv(model, prompts, kv_dtype) -> None:
    for policy in (STREAM, H2O, QUEST):
        both = kv_logit_error(model, kv_dtype, prompts, 6, kv_policy=policy)
        alone = kv_logit_error(model, "auto", prompts, 6, kv_policy=policy)
        assert both["rel_rms"] == pytest.approx(alone["rel_rms"], abs=0.05)  # the dtype adds little to the policy's error


def test_prefix_cache_with_a_policy(model) -> None:
    base = random_prompts(1, 30, 512, seed=5)[0]
    ps = [base[:20] + random_prompts(1, 10, 512, seed=6 + i)[0] for i in range(3)]
    for policy in (STREAM, QUEST):  # their prompt phase does not depend on where the chunks fall
        assert (generate(model, ps, 6, kv_policy=policy, prefix_cache=True).generated_ids
                == generate(model, ps, 6, kv_policy=policy).generated_ids)
    r = generate(model, ps, 6, kv_policy=H2O, prefix_cache=True)
    assert r.params["prefix_tokens"] == 20 and all(len(g) == 6 for g in r.generated_ids)


def test_agreement_measures() -> None:
    assert greedy_agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == {"exact": 0.5, "prefix": 0.75, "prompts": 2.0}


# ------------------------------------------------------------------ refusals: one line, exit code 2
def test_refused_combinations(model, capsys) -> None:
    with pytest.raises(UsageError, match="runs eagerly"):
        generate(model, [[1, 2, 3]], 4, kv_policy=STREAM, compile=True)
    with pytest.raises(UsageError, match="--speculative"):
        generate(model, [[1, 2, 3]], 4, kv_policy=H2O, speculative="ngram")
    assert main(["generate", "--model", "tiny", "--prompt-ids", "1,2,3", "--kv-policy", "window:4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown policy" in err
    assert main(["generate", "--model", "tiny", "--prompt-ids", "1,2,3", "--kv-policy", STREAM, "--compile"]) == 2
    assert main(["loadtest", "--endpoint", "http://127.0.0.1:9/v1", "--kv-policy", STREAM]) == 2
    assert main(["loadtest", "--model", "tiny", "--kv-policy", STREAM, "--kv-capacity", "100", "--no-profile"]) == 2


def test_generate_cli_reports_the_policy(capsys) -> None:
    assert main(["generate", "--model", "tiny", "--prompt-ids", ",".join(map(str, range(1, 40))), "--max-new-tokens",
                 "4", "--kv-policy", "h2o:budget=16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["kv_policy"] == "h2o:budget=16,recent=8" and got["kv_entries_last"] == 16


# ------------------------------------------------------------------ capacity, by hand for Llama-3-8B
@pytest.mark.parametrize("window", [508, 1020, 4092])
def test_capacity_of_a_window_by_hand(window, capsys) -> None:
    assert main(["capacity", "--model", "llama-3-8b", "--gpu", "H100 SXM5 80 GB", "--context", "8192",
                 "--kv-policy", f"streaming:sink=4,window={window}", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    c = doc["capacity"]
    # Llama-3-8B: 32 layers, hidden 4096, 32 heads / 8 KV heads of 128, MLP 14336, vocabulary 128256, untied
    layer = 4096 * (32 + 2 * 8) * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    params = 2 * 128256 * 4096 + 4096 + 32 * layer
    weights = params * 2  # bf16
    activations = 8192 * (2 * 4096 + 3 * 14336) * 2 + 256 * 128256 * 8  # estimate_activation_bytes at 8192 tokens
    budget = 80 * 2**30 * 0.9 - weights - activations
    per_seq = 32 * (2 * 8 * 128 * 2) * (4 + window)  # every layer keeps sink + window tokens of K and V
    assert c["kv_bytes_per_sequence"] == per_seq
    assert c["max_sequences"] == int(budget // per_seq)
    assert doc["full_cache"]["max_sequences"] == int(budget // (32 * 4096 * 8192))
    assert c["kv_policy"] == f"streaming:sink=4,window={window}"


def test_capacity_of_quest_counts_its_page_metadata(capsys) -> None:
    assert main(["capacity", "--model", "llama-3-8b", "--gpu", "H100 SXM5 80 GB", "--context", "8192",
                 "--kv-policy", "quest:budget=1024,page=16", "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["capacity"]
    assert c["kv_bytes_per_sequence"] == 32 * 4096 * (8192 + 8192 // 16)  # nothing evicted, one min/max pair per page
    # a decode step reads 2 dense layers and 30 layers of 64 pages + 512 pages of metadata
    n = c["decode"]["batch"]
    assert c["decode"]["step_bytes"] == pytest.approx(c["weight_bytes"] + n * 4096 * (2 * 8192 + 30 * (1024 + 512)))
