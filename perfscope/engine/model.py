"""A Llama-family decoder in plain PyTorch, gpt-fast style: one readable file.

RMSNorm, rotary embeddings (theta and Llama-3 scaling from the config), grouped-query attention
with a pre-allocated KV cache, SwiGLU MLP, fused QKV (``wqkv``) and gate/up (``w13``) projections,
optional QKV bias (Qwen2), tied or untied embeddings. Shapes in comments: B batch, S new tokens,
T attended cache slots, H query heads, K kv heads, D head dim, E model dim, V vocabulary.

Masks are boolean (True = attend) of shape [B, 1, S, T]: callers (``generate.py``) build them
from a per-row "valid slot" table, which is how prompts of different lengths (left padding) and
a shared prefix are handled. Rope positions are per row ([B, S]) for the same reason.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from perfscope.annotate import annotate
from perfscope.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

ATTENTION_IMPLS = ("sdpa", "naive")
# Below this many rows a CPU matmul is a matrix-vector product; MKL runs those on one thread.
SPLIT_MAX_ROWS = 16
SPLIT_MIN_WEIGHTS = 1 << 18  # smaller matrices stay in cache: not worth waking other threads


@dataclass
class ModelArgs:
    name: str = "custom"
    vocab_size: int = 32000
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 4
    dim: int = 768
    intermediate_size: int = 2048
    head_dim: int = 0  # 0: dim // n_head
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3"|"linear", "factor": ...}
    norm_eps: float = 1e-5
    qkv_bias: bool = False
    tie_embeddings: bool = False
    attention: str = "sdpa"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.dim // self.n_head
        if self.n_head % self.n_kv_head:
            raise UsageError(f"n_head {self.n_head} is not a multiple of n_kv_head {self.n_kv_head}")
        if self.attention not in ATTENTION_IMPLS:
            raise UsageError(f"unknown attention {self.attention!r}", hint=f"use one of {ATTENTION_IMPLS}")

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ModelArgs:
        if name not in CONFIGS:
            raise UsageError(f"unknown model config {name!r}", hint=f"use one of {', '.join(CONFIGS)} "
                             "or a local Hugging Face checkpoint folder")
        known = {f.name for f in fields(cls)}
        return cls(name=name, **{k: v for k, v in {**CONFIGS[name], **overrides}.items() if k in known})

    def with_(self, **changes: Any) -> ModelArgs:
        return replace(self, **changes)


_LLAMA3_SCALING = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": {"vocab_size": 512, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "dim": 64,
             "intermediate_size": 128, "max_seq_len": 512},
    "small": {"vocab_size": 32000, "n_layer": 12, "n_head": 12, "n_kv_head": 4, "dim": 768,
              "intermediate_size": 2048, "max_seq_len": 4096},
    "qwen2.5-0.5b": {"vocab_size": 151936, "n_layer": 24, "n_head": 14, "n_kv_head": 2, "dim": 896,
                     "intermediate_size": 4864, "max_seq_len": 32768, "rope_theta": 1e6, "norm_eps": 1e-6,
                     "qkv_bias": True, "tie_embeddings": True},
    "llama-3.2-1b": {"vocab_size": 128256, "n_layer": 16, "n_head": 32, "n_kv_head": 8, "dim": 2048,
                     "intermediate_size": 8192, "max_seq_len": 131072, "rope_theta": 500000.0,
                     "rope_scaling": {**_LLAMA3_SCALING, "factor": 32.0}, "tie_embeddings": True},
    "llama-3-8b": {"vocab_size": 128256, "n_layer": 32, "n_head": 32, "n_kv_head": 8, "dim": 4096,
                   "intermediate_size": 14336, "max_seq_len": 8192, "rope_theta": 500000.0},
}


def rope_inv_freq(args: ModelArgs) -> Tensor:
    # inv_freq: [D/2], float32, as Hugging Face computes it (default, linear and llama3 rope types)
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind != "llama3":
        raise UsageError(f"rope scaling type {kind!r} is not supported", hint="use default, linear or llama3")
    old_len = float(scaling["original_max_position_embeddings"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(args: ModelArgs, n_pos: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    # cos, sin: [n_pos, D] in Hugging Face's "rotate_half" layout; sin's first half is negated so
    # that rotate_half(x) * sin == roll(x, D/2) * sin_signed (one op instead of three)
    inv_freq = rope_inv_freq(args).to(device)
    freqs = torch.outer(torch.arange(n_pos, device=device, dtype=torch.float32), inv_freq)
    return torch.cat([freqs, freqs], dim=-1).cos().to(dtype), torch.cat([-freqs, freqs], dim=-1).sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    # x: [B, S, H, D]; cos, sin_signed: [B, S, 1, D]
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


class Linear(nn.Linear):
    """``nn.Linear`` (weight [out, in]) with a faster CPU path for a handful of rows.

    MKL runs matrix-vector products on one thread, which leaves decode at half the memory
    bandwidth of a 2-core CPU. Viewing the weight as [P, out/P, in] (no copy) and calling
    ``bmm`` gives each of the P threads its own slice of rows to stream.
    ``Transformer.setup_caches`` sets ``n_split`` to torch's thread count on the CPU.
    """

    n_split: int = 1

    def threaded(self, rows: int, device_type: str) -> bool:
        """Whether ``rows`` rows take the per-thread split (else ``F.linear``: BLAS, an extern call
        under inductor; the split's ``bmm`` is decomposed into inductor's own loops)."""
        n_split = self.n_split
        return (n_split >= 2 and rows <= SPLIT_MAX_ROWS and not self.out_features % n_split
                and self.weight.numel() >= SPLIT_MIN_WEIGHTS and device_type == "cpu")

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // self.in_features
        if not self.threaded(rows, x.device.type):
            return F.linear(x, self.weight, self.bias)
        n_split = self.n_split
        w = self.weight.view(n_split, self.out_features // n_split, self.in_features).transpose(1, 2)
        y = torch.matmul(x.reshape(rows, self.in_features), w)  # [P, rows, out/P] (broadcast bmm)
        y = y.transpose(0, 1).reshape(*x.shape[:-1], self.out_features)  # a view when rows == 1
        return y if self.bias is None else y.add_(self.bias)


class KVCache(nn.Module):
    k_cache: Tensor
    v_cache: Tensor

    def __init__(self, max_batch_size: int, max_seq_len: int, n_kv_head: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        shape = (max_batch_size, n_kv_head, max_seq_len, head_dim)
        # zeros, not empty: masked slots are still multiplied, and a NaN left in memory survives the mask
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: [S] cache slots; k, v: [B, K, S, D] -> caches [B, K, max_seq, D]
        b = k.shape[0]
        k_out, v_out = self.k_cache[:b], self.v_cache[:b]
        k_out.index_copy_(2, input_pos, k)
        v_out.index_copy_(2, input_pos, v)
        return k_out, v_out

    def share_prefix(self, n_slots: int, batch: int) -> None:
        """Copy row 0's first ``n_slots`` slots (a prefix computed once) to rows 1..batch-1."""
        for cache in (self.k_cache, self.v_cache):
            cache[1:batch, :, :n_slots] = cache[:1, :, :n_slots]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, S, E]; statistics in float32, normalised x cast back before the weight, like Hugging Face
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    # q: [B, H, S, D]; k, v: [B, K, T, D]; mask: [B, 1, S, T] -> [B, H, S, D]
    b, h, s, d = q.shape
    n_kv = k.shape[1]
    qg = q.reshape(b, n_kv, h // n_kv, s, d)  # query heads grouped by their kv head
    scores = qg @ k.unsqueeze(2).transpose(-1, -2) / math.sqrt(d)  # [B, K, H/K, S, T]
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return (probs @ v.unsqueeze(2)).reshape(b, h, s, d)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    # q: [B, H, S, D]; k, v: [B, K, T, D]; mask: [B, 1, S, T] -> [B, H, S, D]
    if q.device.type == "cpu" and torch.compiler.is_compiling():
        # Under inductor on the CPU SDPA stays an opaque call (~35 us per layer for one decode query,
        # mostly overhead) while the explicit form is fused into inductor's own kernels: compiled
        # CPU decode steps ~6% faster when memory is fast (benchmarks/RESULTS.md). Same math.
        return naive_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = args.n_head, args.n_kv_head, args.head_dim
        qkv_out = (args.n_head + 2 * args.n_kv_head) * args.head_dim
        self.wqkv = Linear(args.dim, qkv_out, bias=args.qkv_bias)
        self.wo = Linear(args.n_head * args.head_dim, args.dim, bias=False)
        self.kv_cache: KVCache | None = None
        self.attend = sdpa_attention if args.attention == "sdpa" else naive_attention

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Tensor, mask: Tensor) -> Tensor:
        # x: [B, S, E]; cos, sin: [B, S, 1, D]; input_pos: [S]; mask: [B, 1, S, T]
        b, s, _ = x.shape
        h, kv, d = self.n_head, self.n_kv_head, self.head_dim
        qk, v = self.wqkv(x).split([(h + kv) * d, kv * d], dim=-1)
        q, k = apply_rope(qk.view(b, s, h + kv, d), cos, sin).split([h, kv], dim=2)  # rope q and k at once
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(b, s, kv, d).transpose(1, 2)  # [B, H|K, S, D]
        assert self.kv_cache is not None, "call Transformer.setup_caches() first"
        if getattr(self.kv_cache, "attends", False):  # a KV policy cache selects and attends itself (kv_policies)
            y = self.kv_cache.attend(q, k, v, self.attend)  # type: ignore[operator]
            return self.wo(y.transpose(1, 2).reshape(b, s, h * d))
        k_all, v_all = self.kv_cache.update(input_pos, k, v)
        t = mask.shape[-1]
        y = self.attend(q, k_all[:, :, :t], v_all[:, :, :t], mask)  # [B, H, S, D]
        return self.wo(y.transpose(1, 2).reshape(b, s, h * d))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w13 = Linear(args.dim, 2 * args.intermediate_size, bias=False)  # [gate; up]
        self.w2 = Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)  # [B, S, F] each
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Tensor, mask: Tensor,
                ranges: bool) -> Tensor:
        with annotate("attn") if ranges else nullcontext():
            h = x + self.attention(self.attention_norm(x), cos, sin, input_pos, mask)
        with annotate("mlp") if ranges else nullcontext():
            return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layer))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.ranges = True  # NVTX / record_function ranges; off under torch.compile
        self.max_batch_size = self.max_seq_len = -1
        self.rope_cos: Tensor | None = None
        self.rope_sin: Tensor | None = None
        self._param_bytes: int | None = None
        self._linear_weights: int | None = None
        self.tokenizer: Any = None  # a GGUF model's tokenizer (gguf_model.GGUFTokenizer); None otherwise

    def attentions(self) -> list[Attention]:
        return [layer.attention for layer in self.layers]  # type: ignore[union-attr,misc]

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    def set_attention(self, impl: str) -> None:
        self.args = self.args.with_(attention=impl)
        for attn in self.attentions():
            attn.attend = sdpa_attention if impl == "sdpa" else naive_attention

    def setup_caches(self, max_batch_size: int, max_seq_len: int) -> None:
        if max_seq_len > self.args.max_seq_len:
            raise UsageError(f"{max_seq_len} tokens exceed the model's context of {self.args.max_seq_len}")
        n_split = torch.get_num_threads() if self.device.type == "cpu" else 1
        for module in self.modules():
            if isinstance(module, Linear):
                module.n_split = n_split
        if max_batch_size <= self.max_batch_size and max_seq_len <= self.max_seq_len:
            return
        a, dev, dt = self.args, self.device, self.dtype
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        for attn in self.attentions():
            attn.kv_cache = KVCache(max_batch_size, max_seq_len, a.n_kv_head, a.head_dim, dt, dev)
        self.rope_cos, self.rope_sin = rope_tables(a, max_seq_len, dev, dt)

    def forward(self, idx: Tensor, input_pos: Tensor, pos_ids: Tensor | None = None,
                mask: Tensor | None = None, last_only: bool = False, n_layers: int | None = None) -> Tensor:
        # idx: [B, S] token ids; input_pos: [S] cache slots; pos_ids: [B, S] rope positions
        # (default: the slots); mask: [B, 1, S, T] (default: causal over slots 0..input_pos[-1]);
        # n_layers: run only the first n layers, then the norm and head (a self-speculative draft)
        assert self.rope_cos is not None and self.rope_sin is not None, "call setup_caches() first"
        if pos_ids is None:
            pos_ids = input_pos.unsqueeze(0).expand(idx.shape[0], -1)
        if mask is None:
            mask = causal_mask(input_pos, int(input_pos[-1]) + 1).expand(idx.shape[0], 1, -1, -1)
        cos, sin = self.rope_cos[pos_ids].unsqueeze(2), self.rope_sin[pos_ids].unsqueeze(2)
        x = self.tok_embeddings(idx)  # [B, S, E]
        for i, layer in enumerate(self.layers if n_layers is None else self.layers[:n_layers]):
            with annotate(f"layer.{i}") if self.ranges else nullcontext():
                x = layer(x, cos, sin, input_pos, mask, self.ranges)
        if last_only:
            x = x[:, -1:]
        return self.output(self.norm(x))  # [B, S or 1, V]

    def weight_bytes_read(self, n_tokens: int) -> float:
        """Bytes of weights one forward pass reads: every matrix once, plus the gathered embedding rows."""
        if self._param_bytes is None:
            self._param_bytes = sum(p.numel() * p.element_size() for p in self.parameters())
        total = self._param_bytes
        emb = self.tok_embeddings.weight
        table = emb.numel() * emb.element_size()
        read_table = table if self.args.tie_embeddings else 0  # the tied table is read by the output head
        return float(total - table + read_table + n_tokens * emb.shape[1] * emb.element_size())

    def step_flops(self, rows: int, width: int, context: int, last_only: bool = True) -> float:
        """Model FLOPs of one forward over ``rows`` x ``width`` token slots attending ``context`` slots:
        every linear's 2 x weights per token (the output head only for each row's last token when
        ``last_only``), and attention's QK^T and PV over the mask's width."""
        if self._linear_weights is None:
            self._linear_weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, Linear))
        a, head = self.args, self.output.weight.numel()
        tokens = rows * width
        matmul = 2.0 * ((self._linear_weights - head) * tokens + head * (rows if last_only else tokens))
        return matmul + 4.0 * a.n_layer * a.n_head * a.head_dim * tokens * context

    def kv_bytes(self, batch: int, slots: int) -> float:
        """Bytes of K and V over all layers for ``batch`` rows of ``slots`` cache slots."""
        a = self.args
        return float(2 * a.n_layer * batch * a.n_kv_head * slots * a.head_dim * self.dtype.itemsize)


def out_of_vocab(prompts: Iterable[Sequence[int]], vocab_size: int) -> list[int]:
    """The token ids of ``prompts`` outside [0, vocab_size), sorted, each once."""
    return sorted({t for p in prompts for t in p if not 0 <= t < vocab_size})


def causal_mask(input_pos: Tensor, n_slots: int) -> Tensor:
    # [1, 1, S, T]: query at slot p attends slots <= p
    slots = torch.arange(n_slots, device=input_pos.device)
    return (slots[None, :] <= input_pos[:, None])[None, None]


def init_random_(model: Transformer, seed: int, std: float = 0.02) -> Transformer:
    """Fill every parameter in place from a seeded generator (uniform, std ``std``; norms = 1)."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    bound = std * math.sqrt(3.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.uniform_(-bound, bound, generator=gen)
    return model


def build_random(args: ModelArgs, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> Transformer:
    """A model with random weights: built on ``meta`` (no init cost), allocated once, filled seeded."""
    with torch.device("meta"):
        model = Transformer(args).to(dtype)
    model = model.to_empty(device=device)
    if args.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    return init_random_(model, seed).eval()
