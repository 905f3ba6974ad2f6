"""Capacity against hand computations (docs/memory.md, "Capacity"), and vLLM's own num_gpu_blocks.

Configs are the published Hugging Face config.json values; the parameter counts they give are
checked against the published totals (Llama-3-8B 8,030,261,248; GPT-2 124,439,808;
DeepSeek-V2-Lite 15.7B), so the weights term is not taken on trust.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.capacity import (
    GIB,
    DeviceMemory,
    capacity,
    capacity_report,
    from_hf_config,
    resolve_model,
)
from perfscope.gauges import info_labels, parse_prometheus

LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
                    "num_key_value_heads": 16, "vocab_size": 102400, "intermediate_size": 10944,
                    "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
                    "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": None,
                    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                    "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False,
             "torch_dtype": "float16"}


def _h100() -> DeviceMemory:
    return DeviceMemory("H100 SXM5 80 GB", 80 * GIB, 3.35e12, 989.4e12, "datasheet")


def test_llama3_8b_gqa_by_hand() -> None:
    m = from_hf_config(LLAMA3_8B)
    assert m.params == 8_030_261_248
    act = 2 * GIB
    c = capacity(m, _h100(), context=8192, activation_bytes=act)
    weights = 8_030_261_248 * 2
    per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    assert c.kv_bytes_per_token == per_token == 131072
    budget = 0.9 * 80 * GIB - weights - act
    assert c.kv_budget_bytes == budget
    assert c.max_sequences == int(budget // (per_token * 8192)) == 55
    assert c.max_tokens == int(budget // per_token)
    fp8 = capacity(m, _h100(), context=8192, activation_bytes=act, kv_dtype="fp8")
    assert fp8.kv_bytes_per_token == per_token / 2 and fp8.max_sequences == int(budget // (per_token / 2 * 8192)) == 110
    w4 = capacity(m, _h100(), context=8192, activation_bytes=act, weights_dtype="int4")
    assert w4.weight_bytes == 8_030_261_248 * 0.5


def test_gpt2_mha_by_hand() -> None:
    m = from_hf_config({**GPT2, "torch_dtype": "float32"})
    assert m.params == 124_439_808 and m.n_kv_heads == 12
    dev = DeviceMemory("T4", 16 * GIB, None, None, "measured")
    c = capacity(m, dev, context=1024, activation_bytes=0.0, gpu_memory_utilization=1.0)
    per_token = 2 * 12 * 12 * 64 * 4  # MHA: every head keeps K and V, fp32
    assert c.kv_bytes_per_token == per_token == 73728
    assert c.max_sequences == int((16 * GIB - 124_439_808 * 4) // (per_token * 1024)) == 220


def test_deepseek_mla_by_hand() -> None:
    m = from_hf_config(DEEPSEEK_V2_LITE)
    assert round(m.params / 1e9, 1) == 15.7
    c = capacity(m, _h100(), context=32768, activation_bytes=GIB)
    per_token = 27 * (512 + 64) * 2  # the latent and the RoPE key per layer, bf16; no per-head K/V
    assert c.kv_bytes_per_token == per_token == 31104
    budget = 0.9 * 80 * GIB - m.params * 2 - GIB
    assert c.max_sequences == int(budget // (per_token * 32768))


def test_sliding_window_layers_hold_at_most_their_window() -> None:
    cfg = {**LLAMA3_8B, "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"] * 16}
    m = from_hf_config(cfg)
    c = capacity(m, _h100(), context=32768, activation_bytes=GIB)
    per_layer = 2 * 8 * 128 * 2
    assert c.kv_bytes_per_sequence == 16 * per_layer * 32768 + 16 * per_layer * 4096


def test_vllm_num_gpu_blocks_reproduced(fixtures_dir: Path) -> None:
    """vLLM 0.5.2 profiled Llama-2-7B on a 64 GB H100 (nvidia-smi: 65247 MiB) at
    gpu_memory_utilization 0.9 and reported 5644 blocks of 16 tokens. Assumption: the activation
    peak is estimate_activation_bytes for vLLM's profile forward (max_num_batched_tokens 2048, 256
    sequences; the launcher's --max-model-len 2048 --max-num-seqs 256), nothing outside torch."""
    folder = fixtures_dir / "serving/vllm_metrics_llama2_7b_h100_bsc"
    info = info_labels(parse_prometheus((folder / "cache_config_server_0.txt").read_text()), "vllm:cache_config_info")
    smi = (folder / "metrics_gpu_device_nvidia_smi_0_server_0.csv").read_text().splitlines()
    header = [h.strip() for h in smi[0].split(",")]
    total_mib = float(smi[1].split(",")[header.index("memory.total [MiB]")].strip().split()[0])
    assert total_mib == 65247 and info["num_gpu_blocks"] == "5644"
    m = from_hf_config(LLAMA2_7B, name="llama-2-7b")
    assert m.params == 6_738_415_616
    c = capacity(m, DeviceMemory("H100 64GB", total_mib * (1 << 20), None, None, "measured"), context=2048,
                 gpu_memory_utilization=float(info["gpu_memory_utilization"]), block_size=int(info["block_size"]),
                 max_batched_tokens=2048, max_seqs=256)
    reported = int(info["num_gpu_blocks"])
    assert abs(c.num_blocks - reported) / reported < 0.05
    # hand: (65247 MiB x 0.9 - 6738415616 x 2 - activation) // (16 x 524288)
    act = 2048 * (2 * 4096 + 3 * 11008) * 2 + 256 * 32000 * 8
    assert c.activation_bytes == act
    assert c.num_blocks == int((65247 * 2**20 * 0.9 - 6_738_415_616 * 2 - act) // (16 * 524288))


def test_engine_model_and_cli(tmp_path: Path) -> None:
    assert resolve_model("llama-3-8b").params == 8_030_261_248
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    doc = capacity_report(str(tmp_path), "H100 SXM5 80 GB", context=8192)
    assert doc["capacity"]["params"] == 8_030_261_248
    assert doc["fp8_kv"]["max_sequences"] >= 2 * doc["capacity"]["max_sequences"]
    assert "concurrent sequences" in doc["finding"]
    proc = subprocess.run([sys.executable, "-m", "perfscope", "capacity", "--model", str(tmp_path / "config.json"),
                           "--gpu", "H100 SXM5 80 GB", "--context", "8192", "--kv-dtype", "fp8", "--json"],
                          check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["capacity"]["kv_dtype"] == "fp8" and out["fp8_kv"] is None
    bad = subprocess.run([sys.executable, "-m", "perfscope", "capacity", "--model", "nope-7b", "--gpu", "H100"],
                         check=False, capture_output=True, text=True)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("gpu", ["MI300X", "H100 SXM5 80 GB"])
def test_datasheet_memory_is_used(gpu: str) -> None:
    doc = capacity_report("llama-3-8b", gpu, context=4096)
    assert doc["capacity"]["memory_bytes"] > 70 * GIB and "datasheet" in doc["capacity"]["device_source"]
