"""KV-cache sparsification in the engine's cache: StreamingLLM, H2O and Quest (``--kv-policy``).

:class:`PolicyKVCache` stands in for a layer's ``kv_cache`` (the plain one of ``generate()`` or the
slot cache of the serving engine) and does the layer's attention itself (``Attention`` calls
:meth:`PolicyKVCache.attend`), so eviction and selection happen in the cache and the attention
reads only the entries kept. :class:`PolicyCaches` installs one per layer and holds the forward's
row layout (:meth:`PolicyCaches.set_step`: cache row, rope position and "real token" flag of each
token), which the driver sets before each forward.

Layout: per cache row and KV head, ``capacity`` entries (K, V, their original position; H2O also the
attention each entry has accumulated). Positions stay the original ones: keys are cached after RoPE
at their position in the text, as H2O and Quest do; StreamingLLM's paper re-numbers positions inside
the cache, which matters only past the model's trained context (docs/kv-policies.md).

- **decode** (one real token per row; streaming, h2o): when the row is full, one entry per KV head is
  evicted first (streaming: the oldest after the sinks; h2o: the lowest accumulated attention outside
  the ``recent`` most recent tokens), the new token is written in its place, and the attention reads
  the row's entries in place: exactly ``sink + window`` or ``budget`` of them.
- **prefill chunks** (streaming, h2o): the chunk attends the row's kept entries and its own keys
  (streaming: each query its sinks and window; h2o: everything, as the paper's prompt phase), then
  the row keeps the ``capacity`` entries the policy ranks first.
- **quest**: every token stays at its position; per page the element-wise min and max key. A decode
  query in a layer past the first two scores each page by sum_i max(q_i min_i, q_i max_i) (summed over
  the query heads of a KV head) and reads the top ``budget // page`` pages; prefill is dense.

Stored K/V may be quantized (``kv_dtype`` int8 / fp8, as :class:`perfscope.engine.serving.SlotKVCache`).
Each layer counts the K/V it hands to the attention (``read_entries``) and Quest's metadata it reads,
which is what the step records carry (``kv_cache_bytes``, ``kv_entries``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from perfscope.annotate import annotate
from perfscope.errors import UsageError
from perfscope.kv_policy import QUEST_DENSE_LAYERS, KVPolicy, parse_kv_policy

from .model import Transformer, naive_attention, sdpa_attention

Attend = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
_QMAX = {"int8": 127.0, "fp8": 448.0}


def quantize(x: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (codes [..., D]: int8, or fp8 e4m3 viewed as uint8; scale [..., 1] float32):
    symmetric, one scale per vector (per token and KV head)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / _QMAX[kind]
    if kind == "int8":
        return (xf / scale).round_().clamp_(-127, 127).to(torch.int8), scale
    return (xf / scale).to(torch.float8_e4m3fn).view(torch.uint8), scale


def dequantize(codes: Tensor, scale: Tensor, kind: str, dtype: torch.dtype) -> Tensor:
    values = codes.float() if kind == "int8" else codes.view(torch.float8_e4m3fn).float()
    return (values * scale).to(dtype)


def store_dtype(kv_dtype: str, dtype: torch.dtype) -> torch.dtype:
    return {"auto": dtype, "int8": torch.int8, "fp8": torch.uint8}[kv_dtype]


def entry_bytes(head_dim: int, dtype: torch.dtype, kv_dtype: str) -> float:
    """Bytes of one K and one V vector of one KV head at the cache's element size (scales included)."""
    if kv_dtype == "auto":
        return 2.0 * head_dim * dtype.itemsize
    return 2.0 * (head_dim + 4)  # 1-byte codes + one float32 scale, for K and for V


@dataclass
class PolicyStep:
    """The current forward's rows, set by the driver (:meth:`PolicyCaches.set_step`)."""

    row_idx: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # [B] cache row
    rows: slice | Tensor = field(default_factory=lambda: slice(0, 0))  # the same as a slice when contiguous
    qpos: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.long))  # [B, S] rope position
    real: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool))  # [B, S] a real token
    last: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # [B] last real position
    rows_host: list[int] = field(default_factory=list)
    n_real: list[int] = field(default_factory=list)  # real tokens per row
    end_host: list[int] = field(default_factory=list)  # last real position + 1 per row
    reset: Tensor | None = None  # [B] bool: the row starts a new sequence (a real token at position 0)
    reset_host: list[bool] = field(default_factory=list)
    decode: bool = False  # one real token per row


def _attend_kv_mask(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, attend: Attend,
                    need_probs: bool = False) -> tuple[Tensor, Tensor | None]:
    """Attention with a mask per KV head: q [B, H, S, D]; k, v [B, K, T, D]; mask [B, K or 1, S, T].

    With ``need_probs`` (H2O) the explicit form, returning the probabilities [B, K, H/K, S, T];
    else the model's own attention (SDPA or naive) with the mask repeated per query head."""
    b, h, s, d = q.shape
    n_kv = k.shape[1]
    if need_probs or attend is not sdpa_attention:
        qg = q.reshape(b, n_kv, h // n_kv, s, d)
        scores = qg @ k.unsqueeze(2).transpose(-1, -2) / math.sqrt(d)  # [B, K, G, S, T]
        scores = scores.masked_fill(~mask.unsqueeze(2), float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1)
        y = (probs.to(q.dtype) @ v.unsqueeze(2)).reshape(b, h, s, d)
        return y, probs if need_probs else None
    full = mask if mask.shape[1] == 1 else mask.repeat_interleave(h // n_kv, dim=1)
    return attend(q, k, v, full), None


class PolicyKVCache(nn.Module):
    """One layer's K/V under a :class:`perfscope.kv_policy.KVPolicy` (module docstring).

    ``attends`` tells :class:`perfscope.engine.model.Attention` to hand the layer's attention to
    :meth:`attend` instead of reading the cache back through ``update``.
    """

    attends = True

    def __init__(self, policy: KVPolicy, step: PolicyStep, layer: int, n_rows: int, max_len: int,
                 n_kv_head: int, head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 kv_dtype: str = "auto") -> None:
        super().__init__()
        self.policy, self.step, self.layer, self.kind, self.dtype = policy, step, layer, kv_dtype, dtype
        self.n_kv, self.d = n_kv_head, head_dim
        quest = policy.kind == "quest"
        kept = policy.kept()
        self.capacity = max_len if kept is None else min(kept, max_len)
        # Quest: whole pages (a selected last page is read whole) and one scratch entry for pad tokens
        slots = policy.pages(max_len) * policy.page + 1 if quest else self.capacity
        shape = (n_rows, n_kv_head, slots, head_dim)
        sd = store_dtype(kv_dtype, dtype)
        # zeros, not empty: masked entries are still multiplied, and a NaN in memory survives the mask
        self.k = torch.zeros(shape, dtype=sd, device=device)
        self.v = torch.zeros(shape, dtype=sd, device=device)
        self.k_scale = self.v_scale = None
        if kv_dtype != "auto":
            self.k_scale = torch.zeros((*shape[:3], 1), dtype=torch.float32, device=device)
            self.v_scale = torch.zeros((*shape[:3], 1), dtype=torch.float32, device=device)
        self.pos = torch.full(shape[:3], -1, dtype=torch.long, device=device)
        self.score = torch.zeros(shape[:3], dtype=torch.float32, device=device) if policy.kind == "h2o" else None
        self.count = torch.zeros(n_rows, dtype=torch.long, device=device)
        self.count_host = [0] * n_rows
        self.n_pages = policy.pages(max_len) if quest else 0
        if quest:  # [row, page, KV head, D], one scratch page for pad tokens
            self.kmin = torch.full((n_rows, self.n_pages + 1, n_kv_head, head_dim), math.inf, dtype=dtype, device=device)
            self.kmax = torch.full_like(self.kmin, -math.inf)
        self.sparse = quest and layer >= QUEST_DENSE_LAYERS
        self.entry_bytes = entry_bytes(head_dim, dtype, kv_dtype)
        self.read_entries = 0  # K/V entries (row x KV head x position) handed to the last forward's attention
        self.read_per_row = 0  # of them, per row and KV head (the tensor's length)
        self.meta_elems = 0  # Quest: metadata elements the last forward read

    # ------------------------------------------------------------------ storage
    def _pack(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        return (x, None) if self.kind == "auto" else quantize(x, self.kind)

    def _unpack(self, codes: Tensor, scale: Tensor | None) -> Tensor:
        return codes if scale is None else dequantize(codes, scale, self.kind, self.dtype)

    def _put(self, idx: tuple[Tensor, ...], k: Tensor, v: Tensor) -> None:
        """Write K/V vectors [..., D] at the broadcast index (row, head, entry)."""
        for store, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            codes, scale = self._pack(x)
            store.index_put_(idx, codes)
            if scales is not None and scale is not None:
                scales.index_put_(idx, scale)

    def _prefix(self, rows: slice | Tensor, t: int) -> tuple[Tensor, Tensor]:
        """The rows' first ``t`` entries, in the model's dtype: [B, K, t, D] each."""
        ks = None if self.k_scale is None else self.k_scale[rows, :, :t]
        vs = None if self.v_scale is None else self.v_scale[rows, :, :t]
        return self._unpack(self.k[rows, :, :t], ks), self._unpack(self.v[rows, :, :t], vs)

    def _gather(self, idx: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        ks = None if self.k_scale is None else self.k_scale[idx]
        vs = None if self.v_scale is None else self.v_scale[idx]
        return self._unpack(self.k[idx], ks), self._unpack(self.v[idx], vs)

    def _tensors(self) -> list[Tensor]:
        out = [self.k, self.v, self.pos, self.count]
        out += [t for t in (self.k_scale, self.v_scale, self.score) if t is not None]
        if self.policy.kind == "quest":
            out += [self.kmin, self.kmax]
        return out

    def move(self, src: int, dst: int, length: int = 0) -> None:
        """Copy row ``src``'s whole state to row ``dst`` (the serving engine compacting its slots)."""
        for x in self._tensors():
            x[dst] = x[src]
        self.count_host[dst] = self.count_host[src]

    def share_prefix(self, n_slots: int, batch: int) -> None:
        """Rows 1..batch-1 take row 0's state (a shared prefix computed once, ``generate(prefix_cache=True)``)."""
        for x in self._tensors():
            x[1:batch] = x[:1]
        self.count_host[1:batch] = [self.count_host[0]] * (batch - 1)

    def _reset(self) -> None:
        st = self.step
        if not any(st.reset_host):
            return
        assert st.reset is not None
        rows = st.row_idx[st.reset]
        self.count[rows] = 0
        self.pos[rows] = -1
        if self.score is not None:
            self.score[rows] = 0.0
        if self.policy.kind == "quest":
            self.kmin[rows] = math.inf
            self.kmax[rows] = -math.inf
        for r, flag in zip(st.rows_host, st.reset_host):
            if flag:
                self.count_host[r] = 0

    def held_entries(self, rows: Sequence[int]) -> int:
        """Entries (per KV head) the ``rows`` hold now."""
        return sum(self.count_host[r] for r in rows)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise RuntimeError("a policy cache does the attention itself (PolicyKVCache.attend)")

    # ------------------------------------------------------------------ attention
    def attend(self, q: Tensor, k: Tensor, v: Tensor, attend: Attend) -> Tensor:
        """The layer's attention for q [B, H, S, D] and the new k, v [B, K, S, D]: [B, H, S, D]."""
        with annotate("kv_policy"):
            self._reset()
            self.meta_elems = 0
            if self.policy.kind == "quest":
                return self._quest(q, k, v, attend)
            if self.step.decode:
                return self._decode(q, k, v, attend)
            return self._chunk(q, k, v, attend)

    def _note_read(self, b: int, t: int) -> None:
        self.read_entries, self.read_per_row = b * self.n_kv * t, t

    def _heads(self, device: torch.device) -> Tensor:
        return torch.arange(self.n_kv, device=device)

    def _decode(self, q: Tensor, k: Tensor, v: Tensor, attend: Attend) -> Tensor:
        st, cap = self.step, self.capacity
        b = q.shape[0]
        dev = q.device
        ri, heads = st.row_idx, self._heads(dev)
        n = self.count[ri]  # [B]
        p = st.qpos[:, 0]  # [B]
        slot = n[:, None].expand(b, self.n_kv)
        if any(self.count_host[r] >= cap for r in st.rows_host):
            pos = self.pos[ri]  # [B, K, cap]
            if self.policy.kind == "streaming":  # the oldest token after the sinks
                prio = pos.float().masked_fill(pos < self.policy.sink, math.inf)
            else:  # h2o: the least attended token outside the most recent ones
                assert self.score is not None
                recent = pos > (p - self.policy.recent)[:, None, None]
                prio = self.score[ri].masked_fill(recent, math.inf)
            slot = torch.where((n >= cap)[:, None], prio.argmin(dim=-1), slot)
        idx = (ri[:, None], heads[None, :], slot)
        self._put(idx, k[:, :, 0], v[:, :, 0])
        self.pos.index_put_(idx, p[:, None].expand(b, self.n_kv))
        if self.score is not None:
            self.score.index_put_(idx, torch.zeros(b, self.n_kv, device=dev))
        self.count[ri] = torch.clamp(n + 1, max=cap)
        for r in st.rows_host:
            self.count_host[r] = min(self.count_host[r] + 1, cap)
        t = max(self.count_host[r] for r in st.rows_host)
        ks, vs = self._prefix(st.rows, t)
        valid = torch.arange(t, device=dev)[None, :] < self.count[ri][:, None]  # [B, t]
        mask = valid[:, None, None, :]  # [B, 1, 1, t]
        self._note_read(b, t)
        if self.score is None:
            return attend(q, ks, vs, mask)
        y, probs = _attend_kv_mask(q, ks, vs, mask, attend, need_probs=True)
        assert probs is not None
        got = probs.sum(dim=(2, 3))  # [B, K, t]: attention each entry received, over the group's query heads
        self.score.index_put_((ri[:, None, None], heads[None, :, None], torch.arange(t, device=dev)[None, None, :]),
                              got, accumulate=True)
        return y

    def _chunk(self, q: Tensor, k: Tensor, v: Tensor, attend: Attend) -> Tensor:
        st, cap, pol = self.step, self.capacity, self.policy
        b, _, s, _ = q.shape
        dev = q.device
        ri, heads = st.row_idx, self._heads(dev)
        tc = max(self.count_host[r] for r in st.rows_host)
        kc, vc = self._prefix(st.rows, tc)
        keys, vals = torch.cat([kc, k], dim=2), torch.cat([vc, v], dim=2)  # [B, K, T, D]
        t = tc + s
        n = self.count[ri]
        qpos = st.qpos
        kpos = torch.cat([self.pos[ri, :, :tc], qpos[:, None, :].expand(b, self.n_kv, s)], dim=-1)  # [B, K, T]
        kvalid = torch.cat([(torch.arange(tc, device=dev)[None, :] < n[:, None])[:, None, :].expand(b, self.n_kv, tc),
                            st.real[:, None, :].expand(b, self.n_kv, s)], dim=-1)  # [B, K, T]
        # the pattern is the same for every KV head (cached entries all precede the chunk): head 0's
        kp, qp = kpos[:, :1, None, :], qpos[:, None, :, None]  # [B, 1, 1, T], [B, 1, S, 1]
        allowed = kvalid[:, :1, None, :] & (kp <= qp)
        if pol.kind == "streaming":
            allowed = allowed & ((kp < pol.sink) | (kp > qp - pol.window))
        own = torch.zeros(s, t, dtype=torch.bool, device=dev)
        own[torch.arange(s, device=dev), tc + torch.arange(s, device=dev)] = True
        allowed = allowed | ((~st.real)[:, None, :, None] & own)  # a pad query attends itself (stays finite)
        self._note_read(b, t)
        if pol.kind == "streaming":
            y = attend(q, keys, vals, allowed)
            last = st.last[:, None, None]
            keep = kvalid & ((kpos < pol.sink) | (kpos > last - pol.window))
            prio = torch.where(keep, kpos.float(), -math.inf)
        else:
            y, probs = _attend_kv_mask(q, keys, vals, allowed, attend, need_probs=True)
            assert probs is not None and self.score is not None
            got = (probs * st.real[:, None, None, :, None]).sum(dim=(2, 3))  # [B, K, T]: real queries only
            score = torch.cat([self.score[ri, :, :tc], torch.zeros(b, self.n_kv, s, device=dev)], dim=-1) + got
            recent = kpos > (st.last - pol.recent)[:, None, None]
            prio = torch.where(kvalid, torch.where(recent, math.inf, score), -math.inf)
        m = min(cap, t)
        top = prio.topk(m, dim=-1).indices  # [B, K, m], kept entries first
        dst = (ri[:, None, None], heads[None, :, None], torch.arange(m, device=dev)[None, None, :])
        take = top[..., None].expand(b, self.n_kv, m, self.d)
        if self.kind == "auto":
            self.k.index_put_(dst, keys.gather(2, take))
            self.v.index_put_(dst, vals.gather(2, take))
        else:  # keep the cached codes as they are; quantize only the chunk's new vectors
            for store, scales, new in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
                assert scales is not None
                codes, scale = quantize(new, self.kind)
                all_codes = torch.cat([store[ri, :, :tc], codes], dim=2)
                all_scales = torch.cat([scales[ri, :, :tc], scale], dim=2)
                store.index_put_(dst, all_codes.gather(2, take))
                scales.index_put_(dst, all_scales.gather(2, top[..., None]))
        self.pos.index_put_(dst, kpos.gather(2, top))
        if self.score is not None:
            self.score.index_put_(dst, score.gather(2, top))
        n_valid = [self.count_host[r] + nr for r, nr in zip(st.rows_host, st.n_real)]
        kept = torch.tensor([min(x, cap) for x in n_valid], dtype=torch.long)
        self.count[ri] = kept.to(dev)
        for r, x in zip(st.rows_host, kept.tolist()):
            self.count_host[r] = x
        return y

    def _quest(self, q: Tensor, k: Tensor, v: Tensor, attend: Attend) -> Tensor:
        st, pol = self.step, self.policy
        b, h, s, d = q.shape
        dev = q.device
        ri, heads = st.row_idx, self._heads(dev)
        scratch = self.k.shape[2] - 1
        where = torch.where(st.real, st.qpos, scratch)  # [B, S] entry = position (pads: the scratch entry)
        idx = (ri[:, None, None], heads[None, :, None], where[:, None, :])
        self._put(idx, k, v)
        # per page the element-wise min and max key (pads: the scratch page)
        page = torch.where(st.real, st.qpos // pol.page, self.n_pages)  # [B, S]
        width = self.n_pages + 1
        flat = (ri[:, None] * width + page).reshape(-1)
        src = k.transpose(1, 2).reshape(b * s, self.n_kv, d).to(self.kmin.dtype)
        where_page = flat[:, None, None].expand(-1, self.n_kv, d)
        self.kmin.view(-1, self.n_kv, d).scatter_reduce_(0, where_page, src, "amin")
        self.kmax.view(-1, self.n_kv, d).scatter_reduce_(0, where_page, src, "amax")
        for r, end in zip(st.rows_host, st.end_host):
            self.count_host[r] = max(self.count_host[r], end)
        self.count[ri] = torch.tensor([self.count_host[r] for r in st.rows_host], dtype=torch.long).to(dev)
        t = max(self.count_host[r] for r in st.rows_host)
        n_sel = pol.budget // pol.page
        n_pages = -(-t // pol.page)
        if not (st.decode and self.sparse and n_pages > n_sel):  # dense: prefill, the first layers, short rows
            ks, vs = self._prefix(st.rows, t)
            mask = (torch.arange(t, device=dev)[None, None, :] <= st.qpos[:, :, None])[:, None]  # [B, 1, S, T]
            own = (~st.real)[:, None, :, None] & (torch.arange(t, device=dev)[None, None, None, :] == 0)
            self._note_read(b, t)
            return attend(q, ks, vs, mask | own)
        lens = self.count[ri]  # [B]
        kmin = self.kmin[ri, :n_pages].transpose(1, 2)  # [B, K, P, D]
        kmax = self.kmax[ri, :n_pages].transpose(1, 2)
        qg = q.reshape(b, self.n_kv, h // self.n_kv, d).to(kmin.dtype)  # S == 1
        bound = torch.maximum(qg[:, :, :, None, :] * kmin[:, :, None], qg[:, :, :, None, :] * kmax[:, :, None])
        score = bound.sum(dim=-1).sum(dim=2)  # [B, K, P]: the group's query heads together
        used = (torch.arange(n_pages, device=dev)[None, :] * pol.page < lens[:, None])[:, None, :]
        score = score.masked_fill(~used, -math.inf)
        top = score.topk(n_sel, dim=-1).indices  # [B, K, n_sel]
        ent = (top[..., None] * pol.page + torch.arange(pol.page, device=dev)).reshape(b, self.n_kv, -1)
        ks, vs = self._gather((ri[:, None, None], heads[None, :, None], ent))  # [B, K, n_sel * page, D]
        mask = (ent < lens[:, None, None])[:, :, None, :]  # [B, K, 1, T]
        self._note_read(b, ent.shape[-1])
        self.meta_elems = 2 * b * self.n_kv * n_pages * d
        y, _ = _attend_kv_mask(q, ks, vs, mask, attend)
        return y


class PolicyCaches:
    """A policy cache on every attention layer of ``model`` while open (a context manager);
    ``close`` puts the layers' own caches back."""

    def __init__(self, model: Transformer, policy: KVPolicy | str, n_rows: int, max_len: int,
                 kv_dtype: str = "auto") -> None:
        self.policy = parse_kv_policy(policy)
        if self.policy.is_full:
            raise UsageError("the full cache needs no policy cache")
        self.model, self.n_rows, self.max_len = model, n_rows, max_len
        a = model.args
        self.step = PolicyStep()
        self._saved = [attn.kv_cache for attn in model.attentions()]
        self.caches = [PolicyKVCache(self.policy, self.step, i, n_rows, max_len, a.n_kv_head, a.head_dim, model.dtype,
                                     model.device, kv_dtype) for i in range(a.n_layer)]
        for attn, cache in zip(model.attentions(), self.caches):
            attn.kv_cache = cache  # type: ignore[assignment]
        self.entry_bytes = self.caches[0].entry_bytes
        self.meta_itemsize = model.dtype.itemsize

    def __enter__(self) -> PolicyCaches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.caches:
            for attn, cache in zip(self.model.attentions(), self._saved):
                attn.kv_cache = cache
        self.caches = []

    def set_step(self, rows: Sequence[int], qpos: Tensor, real: Tensor) -> None:
        """The next forward's rows: cache row of each batch row, rope position [B, S] and real-token
        flags [B, S] of each token (host tensors)."""
        dev = self.model.device
        rows = [int(r) for r in rows]
        qpos, real = qpos.to("cpu", torch.long), real.to("cpu", torch.bool)
        st = self.step
        st.rows_host = rows
        lo = rows[0]
        st.rows = slice(lo, lo + len(rows)) if rows == list(range(lo, lo + len(rows))) else torch.tensor(rows, device=dev)
        st.row_idx = torch.tensor(rows, dtype=torch.long).to(dev)
        st.n_real = real.sum(dim=1).tolist()
        last = torch.where(real, qpos, -1).amax(dim=1)
        st.end_host = (last + 1).tolist()
        first = torch.where(real, qpos, torch.iinfo(torch.long).max).amin(dim=1)
        reset = first == 0
        st.reset_host = reset.tolist()
        st.reset = reset.to(dev)
        st.decode = qpos.shape[1] == 1 and bool(real.all())
        st.qpos, st.real, st.last = qpos.to(dev), real.to(dev), last.to(dev)

    def read_bytes(self) -> float:
        """K/V (and Quest metadata) bytes the last forward's attention read, all layers."""
        return float(sum(c.read_entries * c.entry_bytes + c.meta_elems * self.meta_itemsize for c in self.caches))

    def read_per_row(self) -> float:
        """KV entries one sequence's attention read in the last forward, mean over the layers."""
        return sum(c.read_per_row for c in self.caches) / max(len(self.caches), 1)

    def held_bytes(self, rows: Sequence[int]) -> float:
        """K/V bytes the ``rows`` hold now, all layers (Quest: its page metadata too)."""
        total = 0.0
        for c in self.caches:
            total += c.held_entries(rows) * c.n_kv * c.entry_bytes
            if self.policy.kind == "quest":
                pages = sum(self.policy.pages(c.count_host[r]) for r in rows)
                total += pages * 2 * c.n_kv * c.d * self.meta_itemsize
        return total

    def held_bytes_for(self, length: int) -> float:
        """K/V bytes one sequence of ``length`` tokens holds under the policy, all layers."""
        c = self.caches[0]
        meta = self.policy.pages(length) * 2 * c.n_kv * c.d * self.meta_itemsize
        return float(len(self.caches)) * (min(length, c.capacity) * c.n_kv * c.entry_bytes + meta)

    def move(self, src: int, dst: int, length: int = 0) -> None:
        for c in self.caches:
            c.move(src, dst, length)


__all__ = ["PolicyCaches", "PolicyKVCache", "PolicyStep", "dequantize", "entry_bytes",
           "naive_attention", "quantize", "store_dtype"]
