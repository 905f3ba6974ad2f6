"""generate(): sampling rules, step and request records, serving metrics and profiler ranges."""

from __future__ import annotations

import importlib
import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from perfscope.engine import SamplingParams, build_model, generate, random_prompts
from perfscope.engine.generate import common_prefix, sample


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return build_model("tiny", seed=2)


@pytest.fixture(scope="module")
def prompts(tiny) -> list[list[int]]:
    return [random_prompts(1, n, tiny.args.vocab_size, seed=n)[0] for n in (5, 9)]


def test_greedy_is_deterministic_and_equals_top_k_1(tiny, prompts) -> None:
    greedy = generate(tiny, prompts, 12).generated_ids
    assert generate(tiny, prompts, 12).generated_ids == greedy
    top1 = generate(tiny, prompts, 12, SamplingParams(temperature=0.8, top_k=1, seed=5)).generated_ids
    assert top1 == greedy


def test_sampling_repeats_with_a_seed_and_varies_across_seeds(tiny, prompts) -> None:
    runs = {seed: generate(tiny, prompts, 16, SamplingParams(temperature=1.5, seed=seed)).generated_ids
            for seed in (1, 1, 2)}
    again = generate(tiny, prompts, 16, SamplingParams(temperature=1.5, seed=1)).generated_ids
    assert again == runs[1]
    assert runs[1] != runs[2]


def test_top_k_draws_only_the_k_largest() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    allowed = torch.topk(logits, 5).indices
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        tok = sample(logits, SamplingParams(temperature=2.0, top_k=5), gen)
        assert all(t in allowed[row] for row, t in enumerate(tok.tolist()))


def test_top_p_draws_only_from_the_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.06, 0.04]])
    gen = torch.Generator().manual_seed(2)
    draws = Counter(sample(probs.log(), SamplingParams(temperature=1.0, top_p=0.8), gen).item()
                    for _ in range(3000))
    # smallest set reaching 0.8: {0, 1, 2} (0.5 + 0.25 < 0.8 <= 0.9)
    assert set(draws) == {0, 1, 2}
    share = draws[0] / 3000  # renormalised: 0.5 / 0.9
    assert share == pytest.approx(0.5 / 0.9, abs=0.04)


def test_temperature_follows_softmax_of_scaled_logits() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    gen = torch.Generator().manual_seed(3)
    n = 8000
    counts = Counter(sample(logits.expand(n, 4), SamplingParams(temperature=2.0), gen).tolist())
    want = torch.softmax(logits[0] / 2.0, dim=-1).tolist()
    for tok, p in enumerate(want):
        assert counts[tok] / n == pytest.approx(p, abs=0.02)


def test_steps_follow_the_generation_and_carry_bytes(tiny, prompts) -> None:
    result = generate(tiny, prompts, 6)
    steps = result.steps
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * 5
    assert [s.step for s in steps] == list(range(6))
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(steps))
    assert all(s.start_ns < s.end_ns for s in steps)
    params = dict(tiny.named_parameters())
    emb = params["tok_embeddings.weight"]
    matrices = sum(p.numel() * 4 for name, p in params.items() if name != "tok_embeddings.weight")
    a = tiny.args
    kv_per_slot_row = 2 * a.n_layer * a.n_kv_head * a.head_dim * 4
    pre = steps[0]
    assert (pre.batch, pre.tokens, pre.context_len) == (2, 14, 9)
    assert pre.weight_bytes == matrices + 2 * 9 * emb.shape[1] * 4
    assert pre.kv_cache_size_bytes == 2 * 9 * kv_per_slot_row
    last = steps[-1]
    assert (last.batch, last.tokens, last.context_len) == (2, 2, 9 + 5)
    assert last.weight_bytes == matrices + 2 * emb.shape[1] * 4
    assert last.kv_cache_bytes == last.kv_cache_size_bytes == 2 * 14 * kv_per_slot_row
    assert result.params["weight_bytes"] == sum(p.numel() * 4 for p in tiny.parameters())
    assert result.params["prompt_lens"] == [5, 9]


def test_request_metrics_follow_vllm_definitions(tiny, prompts) -> None:
    result = generate(tiny, prompts, 8)
    ends = np.array([s.end_ns for s in result.steps], dtype=np.int64)
    start = result.steps[0].start_ns
    for req, prompt in zip(result.requests, prompts):
        assert (req.prompt_tokens, req.output_tokens) == (len(prompt), 8)
        assert req.ttft_s >= (ends[0] - start) / 1e9  # from the call's start, before the first step
        e2e_from_ttft = req.ttft_s + (ends[-1] - ends[0]) / 1e9
        assert req.e2e_s == pytest.approx(e2e_from_ttft, rel=1e-9)
        assert req.tpot_s == pytest.approx((req.e2e_s - req.ttft_s) / 7, rel=1e-9)
        gaps = np.diff(ends) / 1e9
        assert req.itl_mean_s == pytest.approx(gaps.mean(), rel=1e-6)
        assert req.itl_p99_s == pytest.approx(np.percentile(gaps, 99), rel=1e-6)
    assert result.wall_s >= result.requests[0].e2e_s


def test_one_token_has_no_tpot(tiny) -> None:
    req = generate(tiny, [[1, 2]], 1).requests[0]
    assert req.tpot_s is None and req.itl_mean_s is None and req.e2e_s == req.ttft_s


def test_profiler_sees_one_range_per_step_and_layer(tiny, prompts) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = generate(tiny, prompts, 4, chunked_prefill=4)
    names = Counter(e.name for e in prof.events())
    n_prefill = sum(s.phase == "prefill" for s in result.steps)
    assert n_prefill == 3 and names["prefill"] == n_prefill
    assert names["decode"] == 3
    forwards = n_prefill + 3
    for i in range(tiny.args.n_layer):
        assert names[f"layer.{i}"] == forwards
    assert names["attn"] == names["mlp"] == forwards * tiny.args.n_layer


def test_common_prefix() -> None:
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert common_prefix([[1, 2], [1, 2]]) == 1
    assert common_prefix([[9], [1, 2]]) == 0


@pytest.mark.slow
def test_compiled_decode_matches_eager_and_compiles_once(tiny, prompts) -> None:
    """--compile on the CPU (inductor, needs a C++ compiler): the same greedy tokens as eager, one
    graph for every decode step (a fixed-size cache attended with a mask), none added by a rerun."""
    from torch._dynamo.utils import counters

    eager = generate(tiny, prompts, 8)
    torch._dynamo.reset()
    counters.clear()
    first = generate(tiny, prompts, 8, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    again = generate(tiny, prompts, 8, compile=True)
    assert first.generated_ids == eager.generated_ids == again.generated_ids
    assert graphs == 1 and counters["stats"]["unique_graphs"] == 1
    assert first.params["compile"] is True and tiny.ranges  # ranges restored after the compiled run
    assert [s.phase for s in again.steps] == [s.phase for s in eager.steps]
    decode = [s for s in again.steps if s.phase == "decode"]
    assert {s.context_len for s in decode} == {max(len(p) for p in prompts) + 8 - 1}  # the whole fixed cache


def _row_product_loops(code: str, widths: set[int]) -> list[str]:
    """Inner loops of inductor's C++ reductions that stream a weight row of one of ``widths``
    (``x1 < K`` over ``x1 + K*x0``): their bodies up to the accumulation."""
    bodies = []
    for chunk in code.split("for(int64_t x1=")[1:]:
        _, _, rest = chunk.partition("x1<static_cast<int64_t>(")
        width = int(rest.split("L)")[0]) if rest and rest.split("L)")[0].isdigit() else None
        body = chunk.split("tmp_acc0_vec = tmp_acc0_vec +")[0]
        if width not in widths or len(body) == len(chunk):
            continue
        if any(load.split(")")[0].endswith(f"{width}L*x0") for load in body.split("loadu(")[1:]):
            bodies.append(body)
    return bodies


@pytest.mark.slow
def test_compiled_cpu_decode_streams_each_weight_row_with_two_loads(monkeypatch) -> None:
    """Compiled CPU decode (cpu_inductor_options): every matrix-vector loop loads a weight row and a
    stored activation, nothing else (inductor's default inlines the RMSNorm feeding wqkv, w13 and
    the head into that loop, recomputed per weight row), and attention is inductor's own code, not
    an opaque SDPA call per layer."""
    from torch._inductor.utils import run_and_get_code

    from perfscope.engine.model import SPLIT_MIN_WEIGHTS, ModelArgs, build_random

    gen_mod = importlib.import_module("perfscope.engine.decoding")  # where the compiled decode forward lives
    # every matrix large enough for the engine's threaded matrix-vector path (the one inductor compiles)
    args = ModelArgs.from_name("tiny", n_layer=1, dim=512, n_head=8, n_kv_head=4, head_dim=64,
                               intermediate_size=1024, vocab_size=512)
    model = build_random(args, seed=1)
    assert min(p.numel() for p in model.parameters() if p.dim() == 2) >= SPLIT_MIN_WEIGHTS
    n_slots = 16
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the split path needs 2 threads; CI may have 1 core
    model.setup_caches(1, n_slots)
    inputs = (torch.tensor([[3]]), torch.tensor([7]), torch.tensor([[7]]),
              (torch.arange(n_slots) <= 7).view(1, 1, 1, -1))

    def generated(options: dict) -> str:
        monkeypatch.setattr(gen_mod, "cpu_inductor_options", lambda: options)
        torch._dynamo.reset()
        try:
            with torch.inference_mode():
                _, codes = run_and_get_code(gen_mod._decode_forward(model, True), *inputs)
        finally:
            torch._dynamo.reset()
        return "\n".join(codes)

    widths, n_matrices = {args.dim, args.intermediate_size}, 5  # wqkv, wo, w13, w2 and the output head
    code = generated(gen_mod.cpu_inductor_options())
    fixed = _row_product_loops(code, widths)
    assert len(fixed) == n_matrices
    assert all(body.count("loadu(") == 2 for body in fixed)
    assert "scaled_dot_product" not in code
    default = _row_product_loops(generated({}), widths)  # the check sees the problem it guards against
    assert len(default) == n_matrices and max(body.count("loadu(") for body in default) > 2


def test_step_flops_equal_2mnk_of_every_matrix_plus_attention(tiny, prompts) -> None:
    """Each step's model FLOPs, checked against the tiny model's shapes written out by hand."""
    a = tiny.args
    assert (a.dim, a.n_head, a.n_kv_head, a.head_dim, a.intermediate_size, a.vocab_size, a.n_layer) == \
        (64, 4, 2, 16, 128, 512, 2)
    per_layer = 2 * (64 * (4 + 2 * 2) * 16 + 64 * 64 + 64 * 2 * 128 + 128 * 64)  # wqkv, wo, w13, w2
    head = 2 * 64 * 512

    def expected(rows: int, width: int, ctx: int) -> float:
        tokens = rows * width
        return a.n_layer * per_layer * tokens + head * rows + 4 * a.n_layer * 4 * 16 * tokens * ctx

    result = generate(tiny, prompts, 5)
    decode = [s for s in result.steps if s.phase == "decode"]
    prefill = [s for s in result.steps if s.phase == "prefill"]
    assert decode and all(s.flops == expected(2, 1, s.context_len) for s in decode)
    width = max(len(p) for p in prompts)  # one prefill step over the left-padded prompts
    assert len(prefill) == 1 and prefill[0].flops == expected(2, width, width)
