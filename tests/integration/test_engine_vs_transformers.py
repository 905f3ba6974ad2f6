"""The engine loads real Hugging Face checkpoints (Llama, Qwen2) and matches transformers:
float32 logits within 1e-4 relative error and 32 identical greedy tokens; bad checkpoints fail
with one CheckpointError line that names the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file

from perfscope.engine import build_model, generate
from perfscope.errors import CheckpointError

VOCAB = 320
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 256}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}
CASES = {
    "llama-untied-rope-scaling": ("llama", {"rope_scaling": LLAMA3_SCALING, "rope_theta": 500000.0,
                                                "tie_word_embeddings": False}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True, "rope_theta": 1e6}),
    "qwen2-untied-sharded": ("qwen2", {"tie_word_embeddings": False}),
}


def make_hf(family: str, extra: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, **extra))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, **extra))
    with torch.no_grad():  # larger than the default init so that every path moves the logits
        for p in model.parameters():
            p.normal_(0.0, 0.15)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    out = {}
    for i, (name, (family, extra)) in enumerate(CASES.items()):
        hf = make_hf(family, extra, seed=i)
        folder = tmp_path_factory.mktemp(name)
        shard = "60KB" if "sharded" in name else "5GB"
        hf.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
        out[name] = (hf, folder)
    return out


def test_sharded_save_really_has_shards(checkpoints) -> None:
    folder = checkpoints["qwen2-untied-sharded"][1]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(checkpoints, name: str) -> None:
    hf, folder = checkpoints[name]
    model = build_model(str(folder))
    assert model.args.tie_embeddings == hf.config.tie_word_embeddings
    ids = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        ref = hf(ids).logits
        model.setup_caches(2, 48)
        got = model(ids, torch.arange(48))
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < 1e-4, f"relative error {rel:.2e}"


@pytest.mark.parametrize("name", list(CASES))
def test_32_greedy_tokens_match_transformers(checkpoints, name: str) -> None:
    hf, folder = checkpoints[name]
    model = build_model(str(folder))
    prompt = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, pad_token_id=0)[0, 12:].tolist()
    got = generate(model, prompt.tolist(), 32).generated_ids[0]
    assert got == ref


def test_batch_of_different_lengths_matches_transformers_alone(checkpoints) -> None:
    hf, folder = checkpoints["llama-untied-rope-scaling"]
    model = build_model(str(folder))
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (4, 17, 9)]
    got = generate(model, prompts, 8).generated_ids
    for prompt, tokens in zip(prompts, got):
        x = torch.tensor([prompt])
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, min_new_tokens=8,
                          do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        assert tokens == ref


def copy_checkpoint(checkpoints, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(checkpoints[name][1], dst)
    return dst


def one_line_error(path: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        build_model(str(path))
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_missing_weights_file(checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints, "llama-tied", tmp_path)
    (folder / "model.safetensors").unlink()
    assert "neither model.safetensors nor model.safetensors.index.json" in one_line_error(folder)


def test_missing_folder_and_config(tmp_path: Path) -> None:
    assert "no such checkpoint folder" in one_line_error(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    assert "config.json is missing" in one_line_error(tmp_path / "empty")


def test_missing_shard(checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints, "qwen2-untied-sharded", tmp_path)
    shard = min(folder.glob("model-*.safetensors"))
    shard.unlink()
    assert f"shard files listed in model.safetensors.index.json are missing: {shard.name}" in one_line_error(folder)


def test_wrong_shapes_are_listed(checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints, "llama-tied", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    message = one_line_error(folder)
    assert "wrong shapes: model.layers.0.mlp.down_proj.weight [64, 96] (expected [64, 128])" in message
    assert "model.layers.1.mlp.up_proj.weight [96, 64] (expected [128, 64])" in message


def test_missing_and_unexpected_tensors_are_listed(checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints, "llama-tied", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    tensors["model.layers.9.extra.weight"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    message = one_line_error(folder)
    assert "missing tensors: model.layers.1.self_attn.k_proj.weight" in message
    assert "unexpected tensors: model.layers.9.extra.weight" in message


def test_unknown_architecture(checkpoints, tmp_path: Path) -> None:
    folder = copy_checkpoint(checkpoints, "llama-tied", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"], config["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (folder / "config.json").write_text(json.dumps(config))
    message = one_line_error(folder)
    assert "architecture GPT2LMHeadModel is not supported" in message
    assert "LlamaForCausalLM" in message


def test_generate_cli_loads_a_checkpoint(checkpoints, capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.cli import main

    hf, folder = checkpoints["qwen2-tied"]
    code = main(["generate", "--model", str(folder), "--prompt-ids", "5,6,7,8", "--max-new-tokens", "6",
                 "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=6, min_new_tokens=6,
                          do_sample=False, pad_token_id=0)[0, 4:].tolist()
    assert out["generated_ids"] == ref and out["prompt_ids"] == [5, 6, 7, 8]


def test_generate_cli_bad_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.cli import main

    code = main(["generate", "--model", str(tmp_path / "nothing"), "--prompt-ids", "1"])
    err = capsys.readouterr().err.strip()
    assert code == CheckpointError.exit_code
    assert err.count("\n") == 0 and "no such checkpoint folder" in err
