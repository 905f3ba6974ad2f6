"""The reference LLM inference engine that ``perfscope profile`` runs (needs torch).

    from perfscope.engine import build_model, generate, random_prompts
    model = build_model("small")                       # or a local Hugging Face checkpoint folder
    result = generate(model, random_prompts(1, 128, model.args.vocab_size), max_new_tokens=64)
    result.steps, result.requests                      # per-step and per-request records
"""

from __future__ import annotations

from perfscope.request_metrics import RequestRecord

from .generate import (
    GenerationResult,
    SamplingParams,
    StepRecord,
    build_model,
    decode_n_tokens,
    decode_one_token,
    generate,
    prefill,
    random_prompts,
)
from .model import CONFIGS, KVCache, ModelArgs, Transformer

__all__ = [
    "CONFIGS", "GenerationResult", "KVCache", "ModelArgs", "RequestRecord", "SamplingParams", "StepRecord",
    "Transformer", "build_model", "decode_n_tokens", "decode_one_token", "generate", "prefill",
    "random_prompts",
]
