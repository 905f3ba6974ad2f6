"""How many sequences fit: weight bytes, KV-cache bytes per token and the activation peak of a
model on a device, and so the concurrent tokens and sequences at a context length.

The arithmetic (docs/memory.md, "Capacity"):

- weights = parameters x bytes of the weight dtype (parameters counted from the config: embedding,
  per-layer attention (MHA/GQA/MQA, or MLA's low-rank projections), MLP (dense or MoE experts),
  norms, the LM head unless tied);
- KV bytes per token of one layer = 2 x kv_heads x head_dim x kv dtype bytes (K and V), or for MLA
  (kv_lora_rank + qk_rope_head_dim) x kv dtype bytes (the latent and the RoPE key, as vLLM caches
  them); a sliding-window layer holds at most ``window`` tokens of a sequence;
- budget for the KV cache = device memory x utilization - weights - activation peak;
- concurrent sequences at context C = budget // (sum over layers of per-layer bytes x min(C, window));
  under a KV policy (``--kv-policy``, :mod:`perfscope.kv_policy`) a layer holds min(C, window, what the
  policy keeps): ``sink + window`` tokens for streaming, ``budget`` for h2o, all C for quest (plus one
  min and one max key per page, as many bytes as one token's K and V);
  concurrent tokens = budget // bytes per token (full-attention layers); vLLM's blocks = budget //
  (block_size x bytes per token).

The activation peak is the run's, measured (the memory timeline's peak less weights and KV), or
:func:`estimate_activation_bytes`, whose formula is stated there.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputFormatError, UsageError
from .kv_policy import KVPolicy, parse_kv_policy

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "tf32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0,
               "float16": 2.0, "half": 2.0, "auto": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
               "float8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5, "nvfp4": 0.5625, "mxfp4": 0.53125}
"""Bytes per element of each dtype name (``auto``: the model's 16-bit dtype, as vLLM means it;
nvfp4 / mxfp4 include their block scales: one fp8 per 16 and one e8m0 per 32 elements)."""

GIB = float(1 << 30)
MAX_LAYERS = 1 << 12
"""Layers a config may have (the largest published models have a few hundred)."""
MAX_DIM = 1 << 24
"""The largest size of any other config field (hidden size, heads, vocabulary, experts, ranks, windows)."""


def dtype_bytes(name: str) -> float:
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}", hint=f"use one of {', '.join(sorted(DTYPE_BYTES))}") from None


@dataclass(frozen=True)
class ModelShape:
    """What capacity needs of a model.

    Attributes:
        layer_windows: per layer, the tokens its KV cache holds at most (None: full attention).
        mla: (kv_lora_rank, qk_rope_head_dim) of an MLA model, else None.
        params: parameters (weights), counted from the config.
        dtype: the checkpoint's dtype (weights and KV unless told otherwise).
    """

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    params: float
    dtype: str = "bf16"
    layer_windows: tuple[int | None, ...] = ()
    mla: tuple[int, int] | None = None
    source: str = ""

    def kv_bytes_per_token_layer(self, kv_dtype: str | None = None) -> float:
        b = dtype_bytes(kv_dtype or self.dtype)
        if self.mla is not None:
            return float(self.mla[0] + self.mla[1]) * b
        return 2.0 * self.n_kv_heads * self.head_dim * b

    def windows(self) -> tuple[int | None, ...]:
        return self.layer_windows or (None,) * self.n_layers


# ---------------------------------------------------------------------------- models
def from_hf_config(cfg: dict[str, Any], name: str = "hf") -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (Llama, Mistral, Qwen, Gemma,
    GPT-2, DeepSeek-V2/V3 MLA and MoE; a multimodal config's ``text_config``)."""
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "torch_dtype": cfg.get("torch_dtype") or cfg["text_config"].get("torch_dtype")}

    def get(*keys: str, default: Any = None, limit: int = MAX_DIM, zero: bool = False) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return _size(name, k, cfg[k], limit, zero=zero)
        return default

    hidden = int(get("hidden_size", "n_embd", "d_model", default=0))
    n_layers = int(get("num_hidden_layers", "n_layer", "num_layers", default=0, limit=MAX_LAYERS))
    n_heads = int(get("num_attention_heads", "n_head", default=0))
    vocab = int(get("vocab_size", default=0))
    if not (hidden and n_layers and n_heads and vocab):
        raise InputFormatError(name, "config lacks hidden_size, num_hidden_layers, num_attention_heads or vocab_size",
                               hint="give a Hugging Face config.json")
    n_kv = int(get("num_key_value_heads", "n_kv_head", default=n_heads))
    head_dim = int(get("head_dim", default=0, zero=True) or hidden // n_heads)
    gpt2 = cfg.get("model_type") == "gpt2" or "n_embd" in cfg
    inter = int(get("intermediate_size", "n_inner", "ffn_dim", default=0, zero=True) or 4 * hidden)
    tied = bool(cfg.get("tie_word_embeddings", gpt2))
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bf16")
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = (int(get("kv_lora_rank")), int(get("qk_rope_head_dim", zero=True) or 64))
    for key in ("n_positions", "max_position_embeddings", "first_k_dense_replace", "n_shared_experts", "moe_layer_freq",
                "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "sliding_window", "sliding_window_pattern"):
        if cfg.get(key) is not None:  # every size the arithmetic below reads is checked first
            _size(name, key, cfg[key], MAX_DIM, zero=True)
    # parameters
    emb = vocab * hidden * (1 if tied else 2)
    if gpt2:
        emb += int(get("n_positions", "max_position_embeddings", default=0, zero=True)) * hidden
    per_layer_attn = _attention_params(cfg, hidden, n_heads, n_kv, head_dim, mla, gpt2)
    norms = (4 * hidden if gpt2 else 2 * hidden)
    first_dense = int(cfg.get("first_k_dense_replace") or 0)
    n_experts = int(get("n_routed_experts", "num_local_experts", "num_experts", default=0, zero=True))
    moe_inter = int(get("moe_intermediate_size", default=inter, zero=True))
    dense_mlp = (2 * hidden * inter + inter + hidden) if gpt2 else 3 * hidden * inter
    total = float(emb + hidden * (2 if gpt2 else 1))  # final norm (GPT-2: weight and bias)
    # MoE layers: from first_dense on, every moe_layer_freq-th (closed form: no loop over the layers)
    freq = int(cfg.get("moe_layer_freq") or 1)
    first_moe = -(-min(first_dense, n_layers) // freq) * freq
    n_moe = max(0, -(-(n_layers - first_moe) // freq)) if n_experts else 0
    shared = int(cfg.get("n_shared_experts") or 0)
    moe_mlp = (n_experts + shared) * 3 * hidden * moe_inter + n_experts * hidden
    total += n_layers * (per_layer_attn + norms) + n_moe * moe_mlp + (n_layers - n_moe) * dense_mlp
    return ModelShape(name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv,
                      head_dim=head_dim, vocab=vocab, intermediate=inter, params=total, dtype=dtype,
                      layer_windows=_windows(cfg, n_layers), mla=mla, source="config.json")


def _size(source: str, key: str, value: Any, limit: int, *, zero: bool = False) -> int:
    """A config size: a whole number (an integral float too) in [1, ``limit``] ([0, ``limit``] when ``zero``);
    anything else (negative, 1e30, NaN, text, a list) is the config's one error line."""
    ok = isinstance(value, int) and not isinstance(value, bool) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if not ok or not (0 if zero else 1) <= value <= limit:
        raise InputFormatError(source, f"config field {key} = {str(value)[:40]!r} is not a size in "
                               f"{0 if zero else 1}..{limit:,}", hint="give a Hugging Face config.json")
    return int(value)


def _attention_params(cfg: dict[str, Any], hidden: int, n_heads: int, n_kv: int, head_dim: int,
                      mla: tuple[int, int] | None, gpt2: bool) -> int:
    if gpt2:  # c_attn (3h x h + 3h bias) and c_proj (h x h + h)
        return 3 * hidden * hidden + 3 * hidden + hidden * hidden + hidden
    if mla is not None:
        nope = int(cfg.get("qk_nope_head_dim") or 128)
        rope = mla[1]
        v = int(cfg.get("v_head_dim") or nope)
        q_rank = cfg.get("q_lora_rank")
        q = (hidden * q_rank + q_rank + q_rank * n_heads * (nope + rope)) if q_rank else hidden * n_heads * (nope + rope)
        kv_a = hidden * (mla[0] + rope) + mla[0]  # projection and the latent's norm
        kv_b = mla[0] * n_heads * (nope + v)
        return int(q + kv_a + kv_b + n_heads * v * hidden)
    bias = (n_heads + 2 * n_kv) * head_dim if cfg.get("attention_bias") or cfg.get("qkv_bias") else 0
    if cfg.get("model_type") in ("qwen2", "qwen2_moe"):
        bias = (n_heads + 2 * n_kv) * head_dim
    return hidden * (n_heads + 2 * n_kv) * head_dim + bias + n_heads * head_dim * hidden


def _windows(cfg: dict[str, Any], n_layers: int) -> tuple[int | None, ...]:
    """Per layer, the sliding window (None: full attention): ``layer_types`` when given, else
    Gemma's ``sliding_window_pattern`` (every Nth layer is full), else Mistral's one window for all
    (Qwen's ``use_sliding_window`` false turns it off)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return ()
    window = int(window)
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return tuple(window if str(t).startswith("sliding") else None for t in types)
    pattern = cfg.get("sliding_window_pattern")
    if pattern:
        return tuple(None if (i + 1) % int(pattern) == 0 else window for i in range(n_layers))
    return (window,) * n_layers


def from_engine(name: str) -> ModelShape:
    """A :class:`ModelShape` of one of the engine's models (exact parameter count of its layers)."""
    from perfscope.engine.model import CONFIGS, ModelArgs

    if name not in CONFIGS:
        raise UsageError(f"unknown model {name!r}", hint=f"give an engine model ({', '.join(CONFIGS)}) or a config.json path")
    a = ModelArgs.from_name(name)
    qkv_bias = (a.n_head + 2 * a.n_kv_head) * a.head_dim if a.qkv_bias else 0
    attn = a.dim * (a.n_head + 2 * a.n_kv_head) * a.head_dim + qkv_bias + a.n_head * a.head_dim * a.dim
    layer = attn + 3 * a.dim * a.intermediate_size + 2 * a.dim
    params = a.vocab_size * a.dim * (1 if a.tie_embeddings else 2) + a.dim + a.n_layer * layer
    return ModelShape(name=name, n_layers=a.n_layer, hidden=a.dim, n_heads=a.n_head, n_kv_heads=a.n_kv_head,
                      head_dim=a.head_dim, vocab=a.vocab_size, intermediate=a.intermediate_size, params=float(params),
                      dtype="bf16", source="engine")


def resolve_model(model: str) -> ModelShape:
    """An engine model name, a ``config.json`` path, or a folder holding one."""
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            raise InputFormatError(p, "no such config file", hint="give a Hugging Face config.json or its folder")
        try:
            cfg = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise InputFormatError(p, f"not JSON ({exc})", hint="give a Hugging Face config.json") from None
        if not isinstance(cfg, dict):
            raise InputFormatError(p, "is not a JSON object", hint="give a Hugging Face config.json")
        return from_hf_config(cfg, name=p.parent.name or p.stem)
    return from_engine(model)


# ---------------------------------------------------------------------------- device
@dataclass(frozen=True)
class DeviceMemory:
    name: str
    total_bytes: float
    bandwidth_bytes_per_s: float | None = None
    peak_flops_per_s: float | None = None
    source: str = ""
    note: str | None = None
    """How the row was picked, where a family name was read as its most common part."""


def resolve_device_memory(gpu: str, *, memory_bytes: float | None = None) -> DeviceMemory:
    """The device's memory: ``memory_bytes`` when measured, else its datasheet row's
    ``memory_gb`` (taken as GiB, the size the board carries; drivers report about 1% less)."""
    from .datasheets import pick_datasheet

    try:
        sheet, note = pick_datasheet(gpu, "--gpu")
    except UsageError:
        if memory_bytes is None:
            raise
        return DeviceMemory(gpu, memory_bytes, source="measured")
    bw = sheet.bandwidth_gb_s * 1e9 if sheet.bandwidth_gb_s else None
    tf = sheet.tflops.get("bf16") or sheet.tflops.get("fp16")
    if memory_bytes is None and not sheet.memory_gb:
        raise UsageError(f"the datasheet row {sheet.model!r} has no memory size", hint="give --memory-gib")
    total = memory_bytes if memory_bytes is not None else float(sheet.memory_gb) * GIB  # type: ignore[arg-type]
    return DeviceMemory(sheet.model, total, bw, tf * 1e12 if tf else None,
                        "measured" if memory_bytes is not None else f"datasheet {sheet.model} ({sheet.memory_gb} GB)",
                        note)


# ---------------------------------------------------------------------------- capacity
def estimate_activation_bytes(m: ModelShape, tokens: int, seqs: int, act_dtype: str | None = None) -> float:
    """The activation peak of one forward of ``tokens`` tokens in ``seqs`` sequences, estimated:
    the MLP's live tensors at its widest point, tokens x (2 x hidden + 3 x intermediate) elements
    (residual, normed input, gate, up, their product), plus the logits of the last token of each
    sequence in fp32 twice (logits and probabilities), seqs x vocab x 8 bytes. It leaves out what
    lives outside torch's allocator (CUDA context, cuBLAS workspaces, NCCL buffers)."""
    a = dtype_bytes(act_dtype or m.dtype)
    return float(tokens * (2 * m.hidden + 3 * m.intermediate) * a + seqs * m.vocab * 8)


@dataclass(frozen=True)
class Capacity:
    model: str
    device: str
    device_source: str
    context: int
    weights_dtype: str
    kv_dtype: str
    memory_bytes: float
    gpu_memory_utilization: float
    weight_bytes: float
    params: float
    kv_bytes_per_token: float
    kv_bytes_per_sequence: float
    activation_bytes: float
    activation_source: str
    kv_budget_bytes: float
    max_tokens: int
    max_sequences: int
    block_size: int
    num_blocks: int
    decode: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kv_policy: str = "full"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def capacity(m: ModelShape, dev: DeviceMemory, *, context: int, kv_dtype: str | None = None,
             weights_dtype: str | None = None, gpu_memory_utilization: float = 0.9,
             activation_bytes: float | None = None, max_batched_tokens: int | None = None,
             max_seqs: int = 256, block_size: int = 16, kv_policy: str | KVPolicy | None = None) -> Capacity:
    """Concurrent tokens and sequences of ``m`` on ``dev`` at ``context`` tokens (module docstring);
    ``kv_policy``: what each sequence holds and a decode step reads under that policy."""
    if context <= 0:
        raise UsageError(f"context {context} must be positive")
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError(f"gpu_memory_utilization {gpu_memory_utilization} must be in (0, 1]")
    wd, kd = weights_dtype or m.dtype, kv_dtype or m.dtype
    weights = m.params * dtype_bytes(wd)
    per_layer = m.kv_bytes_per_token_layer(kd)
    windows = m.windows()
    policy = parse_kv_policy(kv_policy)
    per_token = per_layer * len(windows)  # every layer holds a token below its window
    held = policy.held(context)
    meta = policy.pages(context) * per_layer  # Quest: a min and a max key per page
    per_seq = sum(per_layer * (held if w is None else min(held, w)) + meta for w in windows)
    # a decode step reads, per layer, what the policy attends (Quest: its pages and the page metadata)
    read = [per_layer * ((policy.attended(context, i) + policy.metadata_entries(context, i)) if w is None
                         else min(policy.held(context), w)) for i, w in enumerate(windows)]
    read_seq = float(sum(read))
    attended = sum(policy.attended(context, i) if w is None else min(policy.held(context), w)
                   for i, w in enumerate(windows)) / max(len(windows), 1)
    notes = []
    if activation_bytes is None:
        tokens = max_batched_tokens or max(context, 2048)
        activation_bytes = estimate_activation_bytes(m, tokens, min(max_seqs, tokens))
        act_source = f"estimated for one {tokens}-token forward (estimate_activation_bytes)"
    else:
        act_source = "given"
    budget = dev.total_bytes * gpu_memory_utilization - weights - activation_bytes
    if budget <= 0:
        notes.append("the weights and activations alone exceed the usable memory: nothing fits")
    b = max(budget, 0.0)
    max_seqs_fit = int(b // per_seq) if per_seq > 0 else 0
    max_tokens = int(b // per_token) if per_token > 0 else 0
    blocks = int(b // (block_size * per_token)) if per_token > 0 else 0
    decode: dict[str, Any] = {}
    if max_seqs_fit > 0:
        n = max_seqs_fit
        step_bytes = weights + n * read_seq
        attn = 4.0 * m.n_layers * m.n_heads * m.head_dim * attended * n
        step_flops = 2.0 * m.params * n + attn
        decode = {"batch": n, "step_bytes": step_bytes, "step_flops": step_flops,
                  "intensity_flop_per_byte": step_flops / step_bytes}
        if dev.bandwidth_bytes_per_s:
            t = step_bytes / dev.bandwidth_bytes_per_s
            decode["step_time_s_at_bandwidth_roof"] = t
            decode["tokens_per_s_at_bandwidth_roof"] = n / t
            if dev.peak_flops_per_s:
                ridge = dev.peak_flops_per_s / dev.bandwidth_bytes_per_s
                decode["ridge_flop_per_byte"] = ridge
                decode["pct_of_ridge"] = 100.0 * decode["intensity_flop_per_byte"] / ridge
    return Capacity(model=m.name, device=dev.name, device_source=dev.source, context=context, weights_dtype=wd,
                    kv_dtype=kd, memory_bytes=dev.total_bytes, gpu_memory_utilization=gpu_memory_utilization,
                    weight_bytes=weights, params=m.params, kv_bytes_per_token=per_token, kv_bytes_per_sequence=per_seq,
                    activation_bytes=float(activation_bytes), activation_source=act_source, kv_budget_bytes=budget,
                    max_tokens=max_tokens, max_sequences=max_seqs_fit, block_size=block_size, num_blocks=blocks,
                    decode=decode, notes=notes, kv_policy=policy.text())


def sentence(c: Capacity, fp8: Capacity | None = None, full: Capacity | None = None) -> str:
    """The finding's sentence: sequences at the context, the decode roof at that batch, fp8 KV's."""
    from .format import nbytes, si

    ctx = f"{c.context // 1024}k" if c.context % 1024 == 0 else str(c.context)
    text = (f"at {ctx} context the KV cache ({nbytes(c.kv_budget_bytes)} free after {nbytes(c.weight_bytes)} of "
            f"weights) allows {c.max_sequences} concurrent sequences on {c.device}")
    if full is not None and c.kv_policy != "full":
        ratio = f" ({c.max_sequences / full.max_sequences:.1f}x)" if full.max_sequences else ""
        text += f" under --kv-policy {c.kv_policy}, against {full.max_sequences} with the full cache{ratio}"
    d = c.decode
    if d.get("tokens_per_s_at_bandwidth_roof"):
        text += (f"; decode at batch {d['batch']} reads {nbytes(d['step_bytes'])} a step, at most "
                 f"{si(d['tokens_per_s_at_bandwidth_roof'], 'tok/s')} at the bandwidth roof")
        if d.get("pct_of_ridge") is not None:
            text += f" ({d['pct_of_ridge']:.0f}% of the way to compute-bound)"
    if fp8 is not None and c.max_sequences:
        text += f"; {fp8.kv_dtype} KV gives {fp8.max_sequences} ({fp8.max_sequences / c.max_sequences:.1f}x)"
    return text


def safe_ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def capacity_report(model: str, gpu: str, *, context: int, kv_dtype: str | None = None,
                    weights_dtype: str | None = None, gpu_memory_utilization: float = 0.9,
                    memory_bytes: float | None = None, activation_bytes: float | None = None,
                    max_batched_tokens: int | None = None, block_size: int = 16,
                    kv_policy: str | KVPolicy | None = None) -> dict[str, Any]:
    """The ``perfscope capacity`` document: the capacity at the asked dtypes (and KV policy), with fp8
    KV (when the KV dtype asked is wider), the full cache's when a policy is asked, and the finding's
    sentence."""
    m = resolve_model(model)
    dev = resolve_device_memory(gpu, memory_bytes=memory_bytes)
    kw: dict[str, Any] = {"context": context, "weights_dtype": weights_dtype,
                          "gpu_memory_utilization": gpu_memory_utilization, "activation_bytes": activation_bytes,
                          "max_batched_tokens": max_batched_tokens, "block_size": block_size}
    policy = parse_kv_policy(kv_policy)
    c = capacity(m, dev, kv_dtype=kv_dtype, kv_policy=policy, **kw)
    if dev.note:
        from dataclasses import replace

        c = replace(c, notes=[dev.note, *c.notes])
    fp8 = capacity(m, dev, kv_dtype="fp8", kv_policy=policy, **kw) if dtype_bytes(c.kv_dtype) > 1 else None
    full = None if policy.is_full else capacity(m, dev, kv_dtype=kv_dtype, **kw)
    return {"capacity": c.to_dict(), "fp8_kv": fp8.to_dict() if fp8 else None,
            "full_cache": full.to_dict() if full else None, "finding": sentence(c, fp8, full)}


def render_capacity(doc: dict[str, Any]) -> str:
    """Text of :func:`capacity_report`'s document."""
    from .format import nbytes, si

    c = doc["capacity"]
    rows = [
        ("model", f"{c['model']} ({si(c['params'])} parameters)"),
        ("device", f"{c['device']}: {nbytes(c['memory_bytes'])} ({c['device_source']}), "
                   f"{c['gpu_memory_utilization']:.0%} usable"),
        ("weights", f"{nbytes(c['weight_bytes'])} ({c['weights_dtype']})"),
        ("activation peak", f"{nbytes(c['activation_bytes'])} ({c['activation_source']})"),
        ("KV per token", f"{nbytes(c['kv_bytes_per_token'])} ({c['kv_dtype']})"),
        ("KV per sequence", f"{nbytes(c['kv_bytes_per_sequence'])} at {c['context']} tokens"
                            + (f" under {c['kv_policy']}" if c.get("kv_policy", "full") != "full" else "")),
        ("KV budget", nbytes(c["kv_budget_bytes"])),
        ("max tokens", f"{c['max_tokens']:,} ({c['num_blocks']:,} blocks of {c['block_size']})"),
        ("max sequences", f"{c['max_sequences']:,} at {c['context']} tokens"),
    ]
    if doc.get("fp8_kv"):
        rows.append(("with fp8 KV", f"{doc['fp8_kv']['max_sequences']:,} sequences"))
    if doc.get("full_cache"):
        full = doc["full_cache"]
        rows.append(("full cache", f"{full['max_sequences']:,} sequences ({nbytes(full['kv_bytes_per_sequence'])} "
                                   "per sequence)"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows] + ["", doc["finding"]] + list(c["notes"])
    return "\n".join(lines) + "\n"



def replace_source(c: Capacity, text: str) -> Capacity:
    """``c`` with its activation source said."""
    from dataclasses import replace

    return replace(c, activation_source=text)
