"""transformers ``generate()`` with speculative decoding and with padded batches, recorded with no
change to the user's code (collectors/hf_generate.py).

- Assisted generation (``assistant_model=draft``: a 4-layer target, a 1-layer draft, same vocab)
  and prompt lookup (``prompt_lookup_num_tokens``): the draft's forwards are ``draft`` steps, the
  target's first forward is the prefill and its later multi-token forwards ``verify`` steps, each
  with its drafted and accepted tokens. The truth is read from transformers itself: the forwards
  are counted with hooks of the test's own, and each forward's drafted tokens are matched against
  the tokens the call returned (a drafted token is accepted when it is the output's token at its
  position, up to the first mismatch).
- A left-padded batch of 4 prompts (20/14/9/5 tokens) with a static cache: 48 prompt tokens and
  32 padding, from the attention mask.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

import perfscope
from perfscope.collectors.hf_generate import GenerateRecorder
from perfscope.device import DeviceSpec

VOCAB = 128
NEW = 12


def llama(layers: int) -> Any:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    """A 4-layer target and a 1-layer draft that shares its embeddings, first layer, norm and head;
    the target's other layers are damped, so the draft agrees with it often but not always."""
    torch.manual_seed(0)
    target, draft = llama(4), llama(1)
    draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
    draft.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    draft.lm_head.load_state_dict(target.lm_head.state_dict())
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(0.3)
            layer.mlp.down_proj.weight.mul_(0.3)
    return target, draft


class Forwards:
    """The test's own count of a model's forwards and their input ids."""

    def __init__(self, model: Any) -> None:
        self.ids: list[list[int]] = []
        self.handle = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = kwargs.get("input_ids", args[0] if args else None)
        self.ids.append(x[0].tolist())

    def __enter__(self) -> Forwards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def truth(inputs: list[list[int]], prompt: int, out: list[int]) -> list[tuple[int, int]]:
    """Per target forward, (drafted, accepted) from the token ids alone: a forward's input is the
    tokens the cache has not seen (the prompt, then the last emitted token) followed by its drafts;
    a draft is accepted while it equals the output's token at its position."""
    pairs, length = [], prompt
    for k, ids in enumerate(inputs):
        base = prompt if k == 0 else 1
        if k:
            assert ids[0] == out[length - 1]  # the last emitted token, not yet cached
        drafts = ids[base:]
        accepted = 0
        for i, t in enumerate(drafts):
            if length + i >= len(out) or out[length + i] != t:
                break
            accepted += 1
        pairs.append((len(drafts), accepted))
        length += accepted + 1
    assert length >= len(out)  # every output token was emitted by some forward
    return pairs


def _check(rec: Any, target_inputs: list[list[int]], draft_forwards: int, prompt: int, out: list[int]) -> None:
    steps = rec.recording.steps
    want = truth(target_inputs, prompt, out)
    mine = [s for s in steps if s.phase != "draft"]
    assert len(mine) == len(target_inputs) and sum(s.phase == "draft" for s in steps) == draft_forwards
    assert mine[0].phase == "prefill" and mine[0].prefill_tokens == prompt
    assert all(s.phase in ("verify", "decode") for s in mine[1:])  # never prefill after the first
    assert [s.phase == "verify" for s in mine[1:]] == [d > 0 for d, _ in want[1:]]
    assert [(s.drafted or 0, s.accepted or 0) for s in mine] == want
    (req,) = rec.recording.requests
    drafted, accepted = sum(d for d, _ in want), sum(a for _, a in want)
    checks = sum(d > 0 for d, _ in want)
    assert (req["drafted_tokens"], req["accepted_tokens"]) == (drafted, accepted)
    assert req["acceptance_pct"] == pytest.approx(100 * accepted / drafted)
    assert req["mean_accepted_len"] == pytest.approx(accepted / checks)
    assert req["prompt_tokens"] == prompt and req["output_tokens"] == len(out) - prompt


def test_assisted_generation_draft_and_verify_steps(pair: tuple[Any, Any]) -> None:
    target, draft = pair
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with Forwards(target) as t, Forwards(draft) as d, GenerateRecorder() as rec:
        out = target.generate(ids, assistant_model=draft, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    _check(rec, t.ids, len(d.ids), 12, out[0].tolist())
    accepted = sum(s.accepted or 0 for s in rec.recording.steps)
    assert 0 < accepted < sum(s.drafted or 0 for s in rec.recording.steps)  # some, not all: acceptance decides
    draft_steps = [s for s in rec.recording.steps if s.phase == "draft"]
    assert {s.weight_bytes for s in draft_steps} == {sum(p.numel() * 4 for p in draft.parameters())}
    assert rec.recording.params()["speculation"]["method"] == "assisted generation (draft model)"


def test_prompt_lookup_verify_steps(pair: tuple[Any, Any]) -> None:
    target, _ = pair
    ids = torch.tensor([[5, 6, 7, 8, 9] * 4])
    with Forwards(target) as t, GenerateRecorder() as rec:
        out = target.generate(ids, prompt_lookup_num_tokens=3, max_new_tokens=NEW, min_new_tokens=NEW,
                              do_sample=False)
    _check(rec, t.ids, 0, 20, out[0].tolist())
    assert rec.recording.params()["speculation"]["method"] == "prompt lookup"


def test_padding_is_not_prompt_with_a_static_cache(pair: tuple[Any, Any]) -> None:
    target, _ = pair
    lens = [20, 14, 9, 5]
    ids = torch.zeros(4, 20, dtype=torch.long)
    mask = torch.zeros(4, 20, dtype=torch.long)
    gen = torch.Generator().manual_seed(5)
    for i, n in enumerate(lens):
        ids[i, 20 - n:] = torch.randint(3, VOCAB, (n,), generator=gen)
        mask[i, 20 - n:] = 1
    for given in ({"attention_mask": mask}, {}):  # the mask given, or derived by generate() from the pad token
        with GenerateRecorder() as rec:
            target.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0,
                            cache_implementation="static", **given)
        reqs = rec.recording.requests
        assert [r["prompt_tokens"] for r in reqs] == lens and sum(lens) == 48
        assert [r["prompt_padded_tokens"] for r in reqs] == [20] * 4
        assert sum(r["prompt_padded_tokens"] - r["prompt_tokens"] for r in reqs) == 32
        assert [r["prompt_padding_pct"] for r in reqs] == [0.0, 30.0, 55.0, 75.0]
        assert rec.recording.steps[0].prefill_tokens == 48


def test_profiled_assisted_generation_has_draft_and_verify_phases(pair: tuple[Any, Any]) -> None:
    from perfscope.analysis.rules.llm import speculation
    from perfscope.analysis.summaries.serving import phase_summary, request_summary

    target, draft = pair
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with perfscope.profile(roofs=DeviceSpec("cpu", "cpu")) as run:
        target.generate(ids, assistant_model=draft, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    r = run.report
    assert {"prefill", "draft", "verify"} <= set(r.steps["phase"])
    assert {"draft", "verify"} <= set(r.kernels["phase"].dropna())  # the draft's kernels are in the tree
    table = phase_summary(r, profiled=True).set_index("phase")
    assert {"draft", "verify"} <= set(table.index)
    assert table["wall_share_pct"].sum() == pytest.approx(100.0)
    assert table.loc["draft", "wall_share_pct"] > 0 and table.loc["verify", "wall_share_pct"] > 0
    (found,) = speculation(r)
    # the finding counts the headline verify steps (a step the machine stalled is an outlier, left out)
    from perfscope.analysis.steps import headline_steps

    head = headline_steps(r.steps)
    assert found.evidence["drafted_tokens"] == int(head.loc[head["phase"] == "verify", "drafted"].sum())
    assert "acceptance" in found.title
    assert request_summary(r, profiled=True)["requests"] == 1
