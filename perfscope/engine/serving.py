"""Continuous batching over the reference engine: a slot KV cache, a scheduler on a real clock.

Requests arrive over time (:class:`LoadRequest`, ``arrival_s`` from the run's start). The
scheduler (:func:`serve`) runs iterations; each iteration

1. moves arrived requests to the queue (an idle engine sleeps until the next arrival);
2. admits queued requests while a KV slot is free (``max_batch`` slots), each taking the lowest
   free slot;
3. runs one **prefill** forward over the admitted requests' prompt chunks (within the token budget
   ``max_batched_tokens`` left after the running requests' decode tokens: longer prompts are
   prefilled in chunks over several iterations) and one **decode** forward over the running
   requests (one token each);
4. retires a request at end-of-sequence (``eos_id``) or when it has its ``max_output_tokens``,
   frees its slot and moves the highest occupied slot into the hole (the cache stays compact, so
   most steps read a contiguous block of slots without a gather).

With a KV capacity (``kv_capacity``: cache positions shared by all running sequences, as a paged
cache's blocks are), a request is admitted only when its prompt fits beside what the running ones
hold after this iteration, and when the running ones outgrow it the most recently admitted is
**preempted** (vLLM's recompute preemption): its cache is dropped, it goes back to the front of the
queue, and when readmitted it prefills its prompt and every token it has made (``recompute``) and
goes on from there.

The scheduler's log says who took part in what: each step's rows (``request_ids``,
``request_tokens``, ``request_roles``: ``prefill``, ``recompute``, ``decode``), each request's
first look (``considered_s``: admitted then, or refused for want of a slot or KV room), admission,
preemptions and readmissions, so a request's latency can be split exactly over the steps it waited
through (:mod:`perfscope.analysis.summaries.tails`).

Each forward is one ``annotate("prefill")`` / ``annotate("decode")`` range and one
:class:`LoadStep` record (composition: prefill tokens, decode sequences, slots in use, queue
length), in that order, so a profiler trace's ranges match the records one to one.

``policy="static"`` is the baseline: a batch is admitted only when the engine is idle, and rows
that have finished keep computing (their tokens discarded) until the batch's longest request
ends, as ``generate()`` does.

The cache (:class:`SlotKVCache`) replaces each attention layer's ``kv_cache`` while
:class:`SlotEngine` is open: rows of a forward are slots, each with its own cache positions
([B, S]), rope positions and mask, so requests at different lengths share one forward. It stores
K and V in the model's dtype, or quantized (``kv_dtype="int8"``: symmetric, one scale per slot,
kv head and position; ``"fp8"``: float8 e4m3 with the same scales); the bytes behind MBU and the
roofline use that real element size (scales included).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from perfscope.annotate import annotate
from perfscope.errors import UsageError
from perfscope.kv_policy import KVPolicy, parse_kv_policy

from .kv_policies import PolicyCaches, dequantize, quantize
from .model import Transformer, out_of_vocab

KV_DTYPES = ("auto", "int8", "fp8")
POLICIES = ("continuous", "static")


# ---------------------------------------------------------------- requests and records
@dataclass(frozen=True)
class LoadRequest:
    """One request of a load test: it arrives at ``arrival_s`` (seconds from the run's start)."""

    request_id: int
    arrival_s: float
    prompt: tuple[int, ...]
    max_output_tokens: int


@dataclass
class RequestTrace:
    """What happened to one request (times in seconds from the run's start)."""

    request_id: int
    prompt_tokens: int
    max_output_tokens: int
    arrival_s: float
    admitted_s: float = math.nan
    token_times_s: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "length" | "eos"
    slot: int = -1  # the slot taken at admission
    considered_s: float = math.nan  # the first iteration after its arrival: admitted, or refused (no slot / KV room)
    preempted_s: list[float] = field(default_factory=list)  # its cache dropped for recompute (KV capacity)
    readmitted_s: list[float] = field(default_factory=list)  # back in a slot after each preemption

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)


@dataclass(frozen=True)
class LoadStep:
    """One forward of the engine (a prefill or a decode step) and the scheduler state around it."""

    step: int
    iteration: int
    phase: str  # "prefill" | "decode"
    batch: int  # rows in the forward (sequences)
    tokens: int  # real tokens processed (prompt tokens or one per decoding sequence)
    prefill_tokens: int
    decode_seqs: int
    context_len: int  # cache positions attended (the longest row after the step)
    start_s: float  # from the run's start
    end_s: float
    start_ns: int  # perf_counter_ns (the run's origin + start_s)
    end_ns: int
    weight_bytes: float
    kv_cache_bytes: float  # K/V bytes the step reads (rows x positions attended)
    kv_cache_size_bytes: float  # K/V bytes held by the active requests after the step
    kv_slots_in_use: int
    kv_slots_total: int
    queue_len: int  # requests arrived and waiting for a slot when the step began
    flops: float  # model FLOPs of the step (matmuls and attention, analytic)
    preempted: int = 0  # requests preempted in this iteration before the step (its first step only)
    request_ids: tuple[int, ...] = ()  # the forward's rows: whose tokens it processed
    request_tokens: tuple[int, ...] = ()  # tokens of each row (a prompt chunk, or 1 to decode)
    request_roles: tuple[str, ...] = ()  # "prefill", "recompute" (a preempted request's cache rebuilt), "decode"
    kv_entries: float = math.nan  # KV entries one sequence's attention read (mean over layers; --kv-policy)


MEMBER_FIELDS = ("request_ids", "request_tokens", "request_roles")
"""The :class:`LoadStep` fields that list a step's rows (the ``request_steps`` table, not ``steps`` columns)."""


@dataclass
class LoadResult:
    requests: list[RequestTrace]
    steps: list[LoadStep]
    wall_s: float
    origin_ns: int  # perf_counter_ns() at the run's start (time 0)


# ---------------------------------------------------------------- clocks and executors
class Clock(Protocol):
    origin_ns: int

    def now(self) -> float: ...

    def wait_until(self, t: float) -> None: ...


class RealClock:
    """Seconds since construction on ``time.perf_counter``; waiting sleeps."""

    def __init__(self) -> None:
        self.origin_ns = time.perf_counter_ns()

    def now(self) -> float:
        return (time.perf_counter_ns() - self.origin_ns) / 1e9

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


class SimClock:
    """A virtual clock for tests and simulations: waiting jumps, executors ``advance`` it."""

    origin_ns = 0

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def advance(self, dt: float) -> None:
        self.t += dt


@dataclass(frozen=True)
class StepCost:
    """What a forward costs, for the step record."""

    weight_bytes: float = math.nan
    kv_cache_bytes: float = math.nan
    flops: float = math.nan
    kv_entries: float = math.nan


class RequestSource(Protocol):
    """Live arrivals for :func:`serve` (an HTTP server): called on the scheduler's thread."""

    stopped: bool  # True: stop now (requests in flight are dropped by the caller)

    def take(self, now: float) -> list[LoadRequest]:
        """Requests that arrived since the last call (``arrival_s`` on the scheduler's clock)."""
        ...

    def wait(self) -> bool:
        """Block while there is nothing to do; False: stop serving."""
        ...


TokenHook = Callable[["RequestTrace", int, float], "str | None"]
"""Called with each new token of a request; a returned finish reason (``stop``, ``abort``) ends it."""


class Executor(Protocol):
    """What the scheduler needs from an engine; :class:`SlotEngine` is the real one."""

    n_slots: int

    def forward(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], starts: Sequence[int]) -> list[int]:
        """Process ``chunks[i]`` at positions ``starts[i]..`` of slot ``slots[i]``; next token per row."""
        ...

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` cache positions to slot ``dst``."""
        ...

    def cost(self, rows: int, width: int, context: int, last_only: bool) -> StepCost: ...

    def kv_bytes(self, positions: int) -> float:
        """K/V bytes one sequence of ``positions`` cache positions holds (all layers)."""
        ...


class TimedExecutor:
    """A real executor on a virtual clock: each forward runs on ``executor`` (the real engine: the same
    tokens, the same cache discipline) and advances ``clock`` by a cost model, ``fixed_s`` plus ``per_token_s``
    per padded token (rows x the longest chunk). Load tests then time the same on any machine (tests,
    ``benchmarks/tails.py``); the cost model is a stand-in for a device, not a measurement of one."""

    def __init__(self, executor: Executor, clock: SimClock, fixed_s: float = 2e-3, per_token_s: float = 5e-5) -> None:
        self.executor, self.clock, self.fixed_s, self.per_token_s = executor, clock, fixed_s, per_token_s
        self.n_slots = executor.n_slots

    def forward(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], starts: Sequence[int]) -> list[int]:
        out = self.executor.forward(slots, chunks, starts)
        self.clock.advance(self.fixed_s + self.per_token_s * len(chunks) * max(len(c) for c in chunks))
        return out

    def move(self, src: int, dst: int, length: int) -> None:
        self.executor.move(src, dst, length)

    def cost(self, rows: int, width: int, context: int, last_only: bool) -> StepCost:
        return self.executor.cost(rows, width, context, last_only)

    def kv_bytes(self, positions: int) -> float:
        return self.executor.kv_bytes(positions)


# ---------------------------------------------------------------- the slot cache
@dataclass
class _StepState:
    """The current forward's row layout, shared by every layer's cache."""

    rows: slice | Tensor = field(default_factory=lambda: slice(0, 0))  # cache slots of the forward's rows (a slice when contiguous)
    slot_idx: Tensor | None = None  # [B, S] cache slot of each token
    pos_idx: Tensor | None = None  # [B, S] cache position of each token (pads: the scratch position)
    t: int = 0  # positions attended


class SlotKVCache(nn.Module):
    """K/V of ``n_slots`` sequences x ``max_len`` positions (+1 scratch position for pad tokens).

    Stands in for :class:`perfscope.engine.model.KVCache`: ``update`` ignores the engine's
    shared ``input_pos`` and writes each token at its own (slot, position) from the shared
    :class:`_StepState`, then returns the rows of the forward ([B, K, max_len + 1, D] in the
    model's dtype; quantized caches return the first ``t`` positions dequantized).
    """

    def __init__(self, state: _StepState, n_slots: int, max_len: int, n_kv_head: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, kv_dtype: str) -> None:
        super().__init__()
        self.state, self.kind, self.dtype = state, kv_dtype, dtype
        shape = (n_slots, n_kv_head, max_len + 1, head_dim)
        store = {"auto": dtype, "int8": torch.int8, "fp8": torch.uint8}[kv_dtype]
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros(shape, dtype=store, device=device)
        if kv_dtype != "auto":
            self.k_scale = torch.zeros((*shape[:3], 1), dtype=torch.float32, device=device)
            self.v_scale = torch.zeros((*shape[:3], 1), dtype=torch.float32, device=device)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v: [B, K, S, D]; writes cache[slot_idx[b, s], :, pos_idx[b, s]] = k[b, :, s]
        st = self.state
        idx = (st.slot_idx, slice(None), st.pos_idx)
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [B, S, K, D]
        if self.kind == "auto":
            self.k[idx] = kt
            self.v[idx] = vt
            return self.k[st.rows], self.v[st.rows]
        for codes, scales, x in ((self.k, self.k_scale, kt), (self.v, self.v_scale, vt)):
            q, s = quantize(x, self.kind)
            codes[idx] = q
            scales[idx] = s
        t = st.t
        return (dequantize(self.k[st.rows, :, :t], self.k_scale[st.rows, :, :t], self.kind, self.dtype),
                dequantize(self.v[st.rows, :, :t], self.v_scale[st.rows, :, :t], self.kind, self.dtype))

    def move(self, src: int, dst: int, length: int) -> None:
        tensors = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.kind != "auto" else [])
        for x in tensors:
            x[dst, :, :length] = x[src, :, :length]


def kv_bytes_per_position(model: Transformer, kv_dtype: str) -> float:
    """K and V bytes of one cache position over all layers, at the cache's real element size."""
    a = model.args
    if kv_dtype == "auto":
        return float(2 * a.n_layer * a.n_kv_head * a.head_dim * model.dtype.itemsize)
    return float(2 * a.n_layer * a.n_kv_head * (a.head_dim * 1 + 4))  # 1-byte codes + a float32 scale per head


def check_kv_dtype(kv_dtype: str) -> str:
    if kv_dtype not in KV_DTYPES:
        raise UsageError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return kv_dtype


class SlotEngine:
    """The reference model with a slot KV cache: the real :class:`Executor` (a context manager).

    While open, every attention layer's ``kv_cache`` is a :class:`SlotKVCache`; ``close`` puts
    the model's own caches back.
    """

    def __init__(self, model: Transformer, n_slots: int, max_len: int, kv_dtype: str = "auto",
                 kv_policy: str | KVPolicy | None = None) -> None:
        check_kv_dtype(kv_dtype)
        self.policy = parse_kv_policy(kv_policy)
        if max_len > model.args.max_seq_len:
            raise UsageError(f"requests of up to {max_len} tokens (prompt + output) exceed the model's "
                             f"context of {model.args.max_seq_len}", hint="use shorter --prompt-len/--output-len")
        self.model, self.n_slots, self.max_len, self.kv_dtype = model, n_slots, max_len, kv_dtype
        self.device = model.device
        model.setup_caches(1, max_len)  # rope tables for max_len positions and the CPU matmul split
        self.state = _StepState()
        a = model.args
        self._saved = [attn.kv_cache for attn in model.attentions()]
        self.policy_caches = None if self.policy.is_full else PolicyCaches(model, self.policy, n_slots, max_len,
                                                                           kv_dtype)
        self.caches = [] if self.policy_caches is not None else [
            SlotKVCache(self.state, n_slots, max_len, a.n_kv_head, a.head_dim, model.dtype, self.device, kv_dtype)
            for _ in model.attentions()]
        for attn, cache in zip(model.attentions(), self.caches):
            attn.kv_cache = cache  # type: ignore[assignment]
        self._per_pos = kv_bytes_per_position(model, kv_dtype)

    def __enter__(self) -> SlotEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.policy_caches is not None:
            self.policy_caches.close()
        for attn, cache in zip(self.model.attentions(), self._saved):
            attn.kv_cache = cache
        self.caches = []

    def kv_bytes(self, positions: int) -> float:
        """K/V bytes one sequence of ``positions`` positions holds (under a KV policy: what it keeps)."""
        if self.policy_caches is not None:
            return self.policy_caches.held_bytes_for(positions)
        return self._per_pos * positions

    def cost(self, rows: int, width: int, context: int, last_only: bool) -> StepCost:
        """The last forward's cost: under a KV policy, the K/V its caches handed to the attention."""
        if self.policy_caches is not None:
            entries = self.policy_caches.read_per_row()
            return StepCost(weight_bytes=self.model.weight_bytes_read(rows * width),
                            kv_cache_bytes=self.policy_caches.read_bytes(),
                            flops=self.model.step_flops(rows, width, round(entries), last_only), kv_entries=entries)
        return StepCost(weight_bytes=self.model.weight_bytes_read(rows * width),
                        kv_cache_bytes=self._per_pos * rows * context,
                        flops=self.model.step_flops(rows, width, context, last_only), kv_entries=float(context))

    def move(self, src: int, dst: int, length: int) -> None:
        if self.policy_caches is not None:
            self.policy_caches.move(src, dst, length)
        for cache in self.caches:
            cache.move(src, dst, length)

    @torch.inference_mode()
    def logits(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], starts: Sequence[int]) -> Tensor:
        """Logits [B, V] of each row's last token after processing its chunk."""
        b, width = len(slots), max(len(c) for c in chunks)
        lens = torch.tensor([len(c) for c in chunks])
        start = torch.tensor(list(starts))
        cols = torch.arange(width)
        real = cols[None, :] < lens[:, None]  # [B, S]
        qpos = start[:, None] + torch.minimum(cols[None, :], lens[:, None] - 1)  # pads repeat the last position
        t = int((start + lens).max())
        if t > self.max_len:
            raise UsageError(f"a row reaches position {t} beyond the cache's {self.max_len}")
        idx = torch.zeros(b, width, dtype=torch.long)
        for row, chunk in enumerate(chunks):
            idx[row, : len(chunk)] = torch.tensor(list(chunk), dtype=torch.long)
        slot_t = torch.tensor(list(slots), dtype=torch.long)
        st = self.state
        lo = int(slot_t[0])
        contiguous = bool((slot_t == torch.arange(lo, lo + b)).all())
        dev = self.device
        st.rows = slice(lo, lo + b) if contiguous else slot_t.to(dev)
        st.slot_idx = slot_t[:, None].expand(b, width).to(dev)
        st.pos_idx = torch.where(real, qpos, torch.full_like(qpos, self.max_len)).to(dev)  # pads -> scratch
        st.t = t
        mask = (torch.arange(t)[None, None, :] <= qpos[:, :, None])[:, None].to(dev)  # [B, 1, S, T]
        if self.policy_caches is not None:
            self.policy_caches.set_step(list(slots), qpos, real)
        same = bool((lens == width).all())
        out = self.model(idx.to(dev), torch.arange(width, device=dev), qpos.to(dev), mask, last_only=same)
        if same:
            return out[:, -1]
        return out[torch.arange(b, device=dev), (lens - 1).to(dev)]

    def forward(self, slots: Sequence[int], chunks: Sequence[Sequence[int]], starts: Sequence[int]) -> list[int]:
        return self.logits(slots, chunks, starts).argmax(dim=-1).tolist()  # .tolist() syncs the device


# ---------------------------------------------------------------- the scheduler
@dataclass(frozen=True)
class ServeConfig:
    max_batch: int = 16  # KV slots (sequences in flight)
    max_batched_tokens: int | None = None  # token budget of one iteration; None: whole prompts
    eos_id: int | None = None
    policy: str = "continuous"
    kv_capacity: int | None = None  # cache positions of all running sequences together; None: a slot each

    def check(self) -> None:
        if self.max_batch < 1:
            raise UsageError(f"--max-batch must be at least 1, got {self.max_batch}")
        if self.kv_capacity is not None and self.kv_capacity < 1:
            raise UsageError(f"--kv-capacity must be at least 1 token, got {self.kv_capacity}")
        if self.kv_capacity is not None and self.policy == "static":
            raise UsageError("--kv-capacity preempts requests of continuous batching; the static policy holds "
                             "a batch until its longest request ends", hint="drop --kv-capacity or --policy static")
        if self.max_batched_tokens is not None and self.max_batched_tokens < self.max_batch:
            raise UsageError(f"--max-batched-tokens ({self.max_batched_tokens}) must be at least --max-batch "
                             f"({self.max_batch}): every running sequence decodes one token per iteration")
        if self.policy not in POLICIES:
            raise UsageError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")


@dataclass
class _Active:
    req: LoadRequest
    trace: RequestTrace
    slot: int
    seq: tuple[int, ...] = ()  # what its prefill processes: the prompt, or (recompute) prompt + tokens made
    base_out: int = 0  # tokens it had made when (re)admitted
    since: float = 0.0  # (re)admission time
    prefilled: int = 0  # tokens of ``seq`` in the cache
    done: bool = False  # finished (static batching keeps the row computing until the batch ends)

    @property
    def length(self) -> int:
        """Cache positions filled: ``seq`` so far, plus every token made since but the last."""
        return self.prefilled + max(self.trace.output_tokens - self.base_out - 1, 0)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.seq)


def check_requests(requests: Sequence[LoadRequest], vocab_size: int) -> None:
    if not requests:
        raise UsageError("the load test has no requests", hint="use --requests N (N >= 1) or a longer --duration")
    for r in requests:
        if not r.prompt or r.max_output_tokens < 1:
            raise UsageError(f"request {r.request_id} needs a prompt and at least one output token")
        if not (math.isfinite(r.arrival_s) and r.arrival_s >= 0):
            raise UsageError(f"request {r.request_id} has arrival time {r.arrival_s}; arrivals must be >= 0")
        bad = out_of_vocab([r.prompt], vocab_size)
        if bad:
            raise UsageError(f"request {r.request_id} has token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")


def serve(executor: Executor, requests: Sequence[LoadRequest], config: ServeConfig = ServeConfig(),
          clock: Clock | None = None, *, on_step: Callable[[LoadStep], None] | None = None,
          source: RequestSource | None = None, on_token: TokenHook | None = None) -> LoadResult:
    """Serve ``requests`` as they arrive on ``clock`` (a real clock by default) until all are done.

    With a ``source`` (live arrivals), serve until its :meth:`RequestSource.wait` returns False;
    ``on_token`` sees every token as it is made and may end its request.
    """
    config.check()
    if config.max_batch > executor.n_slots:
        raise UsageError(f"max_batch {config.max_batch} exceeds the engine's {executor.n_slots} slots")
    cap = config.kv_capacity
    if cap is not None:
        for r in requests:
            if len(r.prompt) + r.max_output_tokens > cap:
                raise UsageError(f"request {r.request_id} needs {len(r.prompt) + r.max_output_tokens} KV positions "
                                 f"(prompt + output), beyond --kv-capacity {cap}", hint="raise --kv-capacity")
    clk = clock or RealClock()
    pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.request_id)))
    queue: deque[LoadRequest] = deque()
    slots: list[_Active | None] = [None] * config.max_batch
    traces: list[RequestTrace] = []
    steps: list[LoadStep] = []
    considered: dict[int, float] = {}  # request id -> the first iteration that looked at it
    parked: dict[int, RequestTrace] = {}  # preempted requests waiting to be readmitted
    static = config.policy == "static"
    iteration = 0
    preempted_now = 0  # preemptions of this iteration, told by its first step

    def active() -> list[_Active]:
        return [a for a in slots if a is not None]

    def record(phase: str, rows: list[_Active], widths: list[int], t0: float, t1: float, queue_len: int,
               context: int, roles: list[str]) -> None:
        nonlocal preempted_now
        width = max(widths)
        cost = executor.cost(len(rows), width, context, last_only=len(set(widths)) == 1)
        live = active()
        step = LoadStep(
            step=len(steps), iteration=iteration, phase=phase, batch=len(rows), tokens=sum(widths),
            prefill_tokens=sum(widths) if phase == "prefill" else 0,
            decode_seqs=len(rows) if phase == "decode" else 0, context_len=context, start_s=t0, end_s=t1,
            start_ns=clk.origin_ns + round(t0 * 1e9), end_ns=clk.origin_ns + round(t1 * 1e9),
            weight_bytes=cost.weight_bytes, kv_cache_bytes=cost.kv_cache_bytes,
            kv_cache_size_bytes=sum(executor.kv_bytes(a.length) for a in live), kv_slots_in_use=len(live),
            kv_slots_total=config.max_batch, queue_len=queue_len, flops=cost.flops, preempted=preempted_now,
            request_ids=tuple(a.req.request_id for a in rows), request_tokens=tuple(widths),
            request_roles=tuple(roles), kv_entries=cost.kv_entries)
        preempted_now = 0
        steps.append(step)
        if on_step is not None:
            on_step(step)

    def emit(a: _Active, token: int, t: float) -> None:
        if a.done:
            return  # a finished row of a static batch: its token is discarded
        a.trace.output_ids.append(token)
        a.trace.token_times_s.append(t)
        reason = on_token(a.trace, token, t) if on_token is not None else None
        if reason is not None:
            a.trace.finish_reason, a.done = reason, True
        elif config.eos_id is not None and token == config.eos_id:
            a.trace.finish_reason, a.done = "eos", True
        elif a.trace.output_tokens >= a.req.max_output_tokens:
            a.trace.finish_reason, a.done = "length", True

    def free(a: _Active) -> None:
        # the highest occupied slot moves into the hole: active slots stay 0..n-1
        last = max(i for i, s in enumerate(slots) if s is not None)
        slots[a.slot] = None
        if last != a.slot:
            mover = slots[last]
            assert mover is not None
            executor.move(last, a.slot, mover.length)
            slots[a.slot], slots[last], mover.slot = mover, None, a.slot

    def retire() -> None:
        live = active()
        if static:
            if live and all(a.done for a in live):
                for a in live:
                    slots[a.slot] = None
            return
        for a in sorted((a for a in live if a.done), key=lambda a: -a.slot):
            free(a)

    def held() -> int:
        """KV positions the running requests hold after this iteration's forwards."""
        return sum(len(a.seq) if a.prefilling else a.length + 1 for a in active())

    def make_room(now: float) -> None:
        """Preempt the most recently admitted requests while the running ones outgrow the KV capacity."""
        nonlocal preempted_now
        assert cap is not None
        while held() > cap and len(active()) > 1:
            victim = max(active(), key=lambda a: (a.since, a.req.request_id))
            free(victim)
            victim.trace.preempted_s.append(now)
            parked[victim.req.request_id] = victim.trace
            queue.appendleft(victim.req)
            preempted_now += 1

    def admit(req: LoadRequest, slot: int, now: float) -> None:
        trace = parked.pop(req.request_id, None)
        if trace is None:
            trace = RequestTrace(req.request_id, len(req.prompt), req.max_output_tokens, req.arrival_s,
                                 admitted_s=now, slot=slot, considered_s=considered.pop(req.request_id, now))
            traces.append(trace)
            seq = req.prompt
        else:  # readmitted after a preemption: recompute its prompt and the tokens it made
            trace.readmitted_s.append(now)
            trace.slot = slot
            seq = req.prompt + tuple(trace.output_ids)
        slots[slot] = _Active(req, trace, slot, seq=seq, base_out=trace.output_tokens, since=now)

    while pending or queue or any(s is not None for s in slots) or source is not None:
        now = clk.now()
        while pending and pending[0].arrival_s <= now:
            queue.append(pending.popleft())
        if source is not None:
            if source.stopped:
                break
            queue.extend(source.take(now))
        live = active()
        if not queue and not live:
            if source is not None and not pending:
                if not source.wait():
                    break
                continue
            clk.wait_until(pending[0].arrival_s)
            continue
        if cap is not None:
            make_room(now)
            live = active()
        if not static or not live:
            while queue and len(live) < config.max_batch:
                req = queue[0]
                need = len(req.prompt) + (len(parked[req.request_id].output_ids) if req.request_id in parked else 0)
                if cap is not None and held() + need > cap:
                    break  # first come, first served: no room for the head of the queue
                queue.popleft()
                admit(req, len(live), now)  # the lowest free slot (the cache is compact)
                live = active()
        for req in queue:  # looked at and refused: no slot, no KV room, or the static policy's batch is running
            considered.setdefault(req.request_id, now)
        queue_len = len(queue)  # arrived and still waiting for a slot
        decoding = [a for a in live if not a.prefilling]
        budget = None if config.max_batched_tokens is None else config.max_batched_tokens - len(decoding)
        work: list[tuple[_Active, int]] = []
        for a in sorted((a for a in live if a.prefilling), key=lambda a: a.since):
            n = len(a.seq) - a.prefilled
            if budget is not None:
                n = min(n, budget)
                if n <= 0:
                    break
                budget -= n
            work.append((a, n))
        if work:
            work.sort(key=lambda w: w[0].slot)
            rows = [a for a, _ in work]
            chunks: list[Sequence[int]] = [a.seq[a.prefilled:a.prefilled + n] for a, n in work]
            starts = [a.prefilled for a in rows]
            roles = ["recompute" if a.trace.preempted_s else "prefill" for a in rows]
            t0 = clk.now()
            with annotate("prefill"):
                tokens = executor.forward([a.slot for a in rows], chunks, starts)
            t1 = clk.now()
            for (a, n), token in zip(work, tokens):
                a.prefilled += n
                if not a.prefilling:
                    emit(a, token, t1)  # the first token (after a recompute: the next one)
            record("prefill", rows, [len(c) for c in chunks], t0, t1, queue_len,
                   max(s + len(c) for s, c in zip(starts, chunks)), roles)
            retire()
        decoding = sorted((a for a in decoding if slots[a.slot] is a), key=lambda a: a.slot)
        if decoding:
            starts = [a.length for a in decoding]  # a finished row of a static batch rewrites its last position
            chunks = [(a.trace.output_ids[-1],) for a in decoding]
            roles = ["done" if a.done else "decode" for a in decoding]
            t0 = clk.now()
            with annotate("decode"):
                tokens = executor.forward([a.slot for a in decoding], chunks, starts)
            t1 = clk.now()
            for a, token in zip(decoding, tokens):
                emit(a, token, t1)
            record("decode", decoding, [1] * len(decoding), t0, t1, queue_len, max(starts) + 1, roles)
            retire()
        iteration += 1
    traces.sort(key=lambda t: t.request_id)
    return LoadResult(traces, steps, clk.now(), clk.origin_ns)


# ---------------------------------------------------------------- quantized or sparse cache: its error
def _prefill_rows(eng: SlotEngine, prompts: Sequence[Sequence[int]]) -> Tensor:
    """Prefill each prompt in its own slot (one forward per prompt: long prompts of different lengths
    need no padded batch); the next-token logits [N, V] in float32."""
    return torch.cat([eng.logits([row], [list(p)], [0]).float() for row, p in enumerate(prompts)])


@torch.inference_mode()
def kv_logit_error(model: Transformer, kv_dtype: str, prompts: Sequence[Sequence[int]], new_tokens: int,
                   kv_policy: str | KVPolicy | None = None) -> dict[str, float]:
    """Logit error of a quantized (``kv_dtype``) or sparse (``kv_policy``) KV cache against the full
    model-dtype cache, teacher-forced.

    Each prompt is prefilled, then ``new_tokens`` greedy tokens of the full-cache run are fed to both
    caches; every step's logits are compared (the first step's come from the prefill). Returns
    ``max_abs``, ``mean_abs``, ``rel_rms`` (RMS error / RMS of the reference logits),
    ``top1_agreement`` (fraction of steps whose argmax agrees) and ``positions``.
    """
    check_kv_dtype(kv_dtype)
    policy = parse_kv_policy(kv_policy)
    max_len = max(len(p) for p in prompts) + new_tokens
    n = len(prompts)
    slots = list(range(n))

    def run(kind: str, pol: KVPolicy | None, forced: list[list[int]] | None) -> tuple[list[Tensor], list[list[int]]]:
        out: list[Tensor] = []
        chosen: list[list[int]] = [[] for _ in prompts]
        with SlotEngine(model, n, max_len, kind, pol) as eng:
            cur = _prefill_rows(eng, prompts)
            for i in range(new_tokens):
                out.append(cur)
                nxt = cur.argmax(-1).tolist() if forced is None else [f[i] for f in forced]
                for row, tok in enumerate(nxt):
                    chosen[row].append(tok)
                if i + 1 < new_tokens:
                    cur = eng.logits(slots, [[t] for t in nxt], [len(p) + i for p in prompts]).float()
        return out, chosen

    ref, tokens = run("auto", None, None)
    test, _ = run(kv_dtype, policy, tokens)
    r, q = torch.stack(ref), torch.stack(test)
    err = (q - r).abs()
    return {"max_abs": float(err.max()), "mean_abs": float(err.mean()),
            "rel_rms": float(((q - r) ** 2).mean().sqrt() / (r ** 2).mean().sqrt()),
            "top1_agreement": float((q.argmax(-1) == r.argmax(-1)).float().mean()),
            "positions": float(r.shape[0] * r.shape[1])}


@torch.inference_mode()
def greedy_outputs(model: Transformer, prompts: Sequence[Sequence[int]], new_tokens: int, *,
                   kv_dtype: str = "auto", kv_policy: str | KVPolicy | None = None,
                   stop_ids: Sequence[int] = ()) -> list[list[int]]:
    """Each prompt's greedy continuation (up to ``new_tokens``, ending at a stop id) on the slot
    engine with this KV cache; the prompts decode together."""
    max_len = max(len(p) for p in prompts) + new_tokens
    n = len(prompts)
    stops = set(stop_ids)
    outs: list[list[int]] = [[] for _ in prompts]
    with SlotEngine(model, n, max_len, kv_dtype, kv_policy) as eng:
        nxt = _prefill_rows(eng, prompts).argmax(-1).tolist()
        for i in range(new_tokens):
            live = [row for row in range(n) if not (outs[row] and outs[row][-1] in stops)]
            for row in live:
                outs[row].append(int(nxt[row]))
            live = [row for row in live if outs[row][-1] not in stops]
            if i + 1 == new_tokens or not live:
                break
            # finished rows keep decoding (their tokens unused): one forward over every slot
            got = eng.forward(list(range(n)), [[outs[row][-1]] for row in range(n)],
                              [len(prompts[row]) + len(outs[row]) - 1 for row in range(n)])
            nxt = got
    return outs


def greedy_agreement(reference: Sequence[Sequence[int]], test: Sequence[Sequence[int]]) -> dict[str, float]:
    """How far greedy outputs agree: ``exact`` (share of prompts whose whole output is identical) and
    ``prefix`` (mean share of the reference output generated before the first difference)."""
    exact = [list(a) == list(b) for a, b in zip(reference, test)]
    shares = []
    for a, b in zip(reference, test):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shares.append(same / len(a) if a else 1.0)
    return {"exact": sum(exact) / max(len(exact), 1), "prefix": sum(shares) / max(len(shares), 1),
            "prompts": float(len(exact))}
