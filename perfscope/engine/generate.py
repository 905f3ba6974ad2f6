"""Batched generation with the reference engine (``generate``): plain, or speculative when asked
(:mod:`perfscope.engine.speculative`). The pieces both build on (sampling, slots, prefill, decode,
the step and request records) are in :mod:`perfscope.engine.decoding`, re-exported here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from perfscope.errors import UsageError
from perfscope.kv_policy import KVPolicy, check_engine_options, parse_kv_policy
from perfscope.request_metrics import request_records

from .decoding import (
    STOP_CHECK_EVERY,
    GenerationResult,
    SamplingParams,
    StepRecord,
    _check_prompts,
    _decode_forward,
    _Recorder,
    build_model,
    chunk_mask,
    common_prefix,
    compile_seconds,
    cpu_inductor_options,
    decode_matmuls_in_kernels,
    decode_n_tokens,
    decode_one_token,
    default_compile,
    device_sync,
    plan_slots,
    prefill,
    prefill_chunks,
    random_prompts,
    resolve_device,
    run_params,
    run_prefill,
    sample,
    sampling_probs,
    truncate_at_stop,
)
from .kv_policies import PolicyCaches

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .model import Transformer

GREEDY = SamplingParams()
"""The default sampling: greedy (temperature 0)."""

__all__ = ["STOP_CHECK_EVERY", "GenerationResult", "SamplingParams", "StepRecord", "build_model", "chunk_mask", "common_prefix", "compile_seconds", "cpu_inductor_options", "decode_matmuls_in_kernels", "decode_n_tokens", "decode_one_token", "default_compile", "device_sync", "generate", "plan_slots", "prefill", "prefill_chunks", "random_prompts", "resolve_device", "run_params", "run_prefill", "sample", "sampling_probs", "truncate_at_stop"]


@torch.inference_mode()
def generate(model: Transformer, prompts: list[list[int]], max_new_tokens: int,
             sampling: SamplingParams = GREEDY, *, chunked_prefill: int | None = None,
             prefix_cache: bool = False, compile: bool = False, stop_ids: Sequence[int] | None = None,
             speculative: str | None = None, draft_len: int = 4,
             kv_policy: str | KVPolicy | None = None) -> GenerationResult:
    """Generate up to ``max_new_tokens`` for every prompt (one batch); tokens, step and request records.

    ``stop_ids``: a row ends at the first of these ids (kept in its output); generation ends when
    every row has. ``speculative`` (``ngram`` or ``self:N``) drafts ``draft_len`` tokens per step and
    verifies them in one forward (:mod:`perfscope.engine.speculative`). ``kv_policy``
    (``streaming:sink=4,window=64``, ``h2o:budget=64``, ``quest:budget=64,page=16``; docs/kv-policies.md)
    evicts or selects KV entries in the cache (:mod:`perfscope.engine.kv_policies`).
    """
    policy = parse_kv_policy(kv_policy)
    check_engine_options(policy, compile=compile, speculative=speculative)
    if speculative:
        from .speculative import generate_speculative

        if compile:
            raise UsageError("speculative decoding runs eagerly", hint="drop --compile or --speculative")

        return generate_speculative(model, prompts, max_new_tokens, sampling, method=speculative,
                                    draft_len=draft_len, stop_ids=stop_ids, chunked_prefill=chunked_prefill)
    _check_prompts(prompts, model.args.vocab_size, max_new_tokens, chunked_prefill)
    rec = _Recorder(model)
    prefix = common_prefix(prompts) if prefix_cache and len(prompts) > 1 else 0
    n_slots = max(len(p) for p in prompts) + max_new_tokens - 1
    model.setup_caches(len(prompts), n_slots)
    slots = plan_slots(prompts, prefix, n_slots, model.device)
    gen = torch.Generator(device=model.device).manual_seed(sampling.seed) if sampling.temperature > 0 else None
    ranges = model.ranges
    kv = None if policy.is_full else PolicyCaches(model, policy, len(prompts), n_slots)
    try:
        forward = _decode_forward(model, compile)
        first, t_first = run_prefill(model, slots, chunked_prefill, sampling, gen, rec, kv)
        stop = torch.tensor(list(stop_ids), dtype=torch.long, device=model.device) if stop_ids else None
        rest, times = decode_n_tokens(model, forward, first, slots, max_new_tokens - 1, sampling, gen, rec,
                                      full_mask=compile, stop=stop, kv=kv)
    finally:
        model.ranges = ranges
        if kv is not None:
            kv.close()
    generated = truncate_at_stop(torch.cat([first[:, None], rest], dim=1).tolist(), stop_ids)
    steps, mark_ns = rec.finish()
    wall_s = (time.perf_counter_ns() - rec.start_ns) / 1e9
    params = run_params(model, prompts, max_new_tokens, sampling, chunked_prefill=chunked_prefill,
                        prefix_cache=prefix_cache, prefix_tokens=prefix, compile=compile,
                        stop_ids=list(stop_ids) if stop_ids else None,
                        decode_matmuls_in_kernels=compile and decode_matmuls_in_kernels(model, len(prompts)),
                        kv_policy=policy.text())
    return GenerationResult(prompt_ids=[list(p) for p in prompts], generated_ids=generated, steps=steps,
                            requests=request_records(prompts, [mark_ns[t] for t in (t_first, *times)],
                                                     rec.start_ns, [len(g) for g in generated]),
                            wall_s=wall_s, params=params)
