"""Each serving framework's own words: which framework marked a report's steps, and the setting that
names a fix in its terms (CUDA graph capture sizes, the step's token budget). A floor below the rules
that advise with them (steps, timeline, llm), so none of them imports another for these."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def framework_of(steps: pd.DataFrame) -> str:
    """The framework that marked most of ``steps`` (``user`` when none says)."""
    fw = steps["framework"].dropna().astype("object")
    return str(fw.mode().iloc[0]) if len(fw) else "user"


def knob(framework: str, topic: str, *, graphs: bool | None = None, tokens: float = math.nan) -> str:
    """The framework's own setting for ``topic`` (``graphs``, ``batch_tokens``), true for the versions
    whose step annotations perfscope reads (vLLM V1, SGLang); empty when there is none to name."""
    if framework == "vllm" and topic == "graphs":
        if graphs:
            return (" vLLM replays CUDA graphs here: a batch size above the largest captured size runs eager, so "
                    "cover the batch sizes you serve with the compilation config's cudagraph_capture_sizes.")
        many = f" (these steps have up to {tokens:.0f} tokens)" if not math.isnan(tokens) else ""
        return (" vLLM ran these steps without graph replays: if --enforce-eager (enforce_eager=True) is set, drop it; "
                "a step with more tokens than the largest of the compilation config's cudagraph_capture_sizes runs "
                f"eager anyway{many}, so add capture sizes up to the step sizes you serve.")
    if framework == "sglang" and topic == "graphs":
        if graphs:
            return (" SGLang replays CUDA graphs here: batch sizes above --cuda-graph-max-bs run eager, so raise it "
                    "to the largest decode batch you serve.")
        return (" SGLang ran these steps eagerly: remove --disable-cuda-graph, and raise --cuda-graph-max-bs to "
                "the decode batch sizes you serve.")
    if framework == "vllm" and topic == "batch_tokens":
        return (" In vLLM the token budget of a step is --max-num-batched-tokens: a smaller one bounds how much "
                "prefill rides with the decodes (lower decode latency spikes), a larger one prefills in fewer steps.")
    if framework == "sglang" and topic == "batch_tokens":
        return (" In SGLang the prefill chunk of a step is --chunked-prefill-size: a smaller chunk bounds how much "
                "prefill rides with the decodes, a larger one prefills in fewer steps.")
    return ""
