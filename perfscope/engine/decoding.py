"""The pieces of batched generation with the reference engine, gpt-fast style, plus per-step and
per-request records; :mod:`perfscope.engine.generate` (plain) and :mod:`perfscope.engine.speculative`
both build on them, so neither imports the other's internals.

``prefill``, ``decode_one_token``, ``decode_n_tokens`` and ``generate`` are separate top-level
functions. Each prefill chunk and each decode step is one :class:`StepRecord` and one
``annotate("prefill")`` / ``annotate("decode")`` range, in that order, so a profiler can match the
records to the ranges of a trace. Timestamps are ``time.perf_counter_ns()`` on the CPU; on CUDA
they are CUDA events recorded between steps and read after the run (no sync per step), placed on
the host clock of a sync taken at the call's start. Serving metrics follow vLLM: TTFT from the call's start to a request's first token, TPOT =
(e2e - ttft) / (output_tokens - 1), ITL = gaps between consecutive tokens.

Prompts of different lengths are left-padded into shared cache slots: a per-row ``valid`` table
masks the pad slots, and rope positions are per row, so each row computes exactly what it would
alone. With ``prefix_cache`` the prompt prefix shared by all requests is computed once (batch 1)
and its K/V copied to the other rows; the rest of each prompt then follows it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from perfscope.annotate import annotate
from perfscope.errors import UnsupportedDeviceError, UsageError

from .model import CONFIGS, Linear, ModelArgs, Transformer, build_random, out_of_vocab

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from perfscope.request_metrics import RequestRecord

    from .kv_policies import PolicyCaches


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when ``temperature`` is 0; else softmax(logits / T) restricted to top-k and top-p."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise UsageError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class StepRecord:
    """One prefill chunk or decode step; bytes are what the step reads (KV size: in use after it).

    Speculative decoding adds ``draft`` and ``verify`` steps; a verify step records how many draft
    tokens it checked (``drafted``) and kept (``accepted``); other steps leave them None.
    """

    step: int
    phase: str  # "prefill" | "decode" | "draft" | "verify"
    batch: int
    tokens: int  # prompt or generated tokens processed, padding excluded
    context_len: int  # cache slots attended by the step (the KV length after it)
    start_ns: int
    end_ns: int
    weight_bytes: float
    kv_cache_bytes: float
    kv_cache_size_bytes: float
    drafted: int | None = None
    accepted: int | None = None
    flops: float | None = None  # model FLOPs of the step (Transformer.step_flops); None where not derived
    kv_entries: float | None = None  # KV entries one sequence's attention read (mean over layers; --kv-policy)


@dataclass(frozen=True)
class GenerationResult:
    prompt_ids: list[list[int]]
    generated_ids: list[list[int]]
    steps: list[StepRecord]
    requests: list[RequestRecord]
    wall_s: float
    params: dict[str, Any]


def resolve_device(device: str | torch.device) -> torch.device:
    """A torch device, checked to exist on this machine."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"unknown device {device!r}", hint="use cpu or cuda") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedDeviceError("CUDA was requested but no CUDA device is available",
                                     hint="use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"device {dev.type!r} is not supported", hint="use cpu or cuda")
    return dev


def build_model(name_or_path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                attention: str = "sdpa", seed: int = 0) -> Transformer:
    """A config name from ``CONFIGS`` (random weights, seeded), a local Hugging Face checkpoint folder,
    ``smollm2-135m`` or a GGUF file (``.gguf``; the model then carries its ``tokenizer``)."""
    dev = resolve_device(device)
    from .gguf_model import is_gguf_name, load_gguf

    if is_gguf_name(name_or_path):
        return load_gguf(name_or_path, device=dev, dtype=dtype, attention=attention)
    if name_or_path in CONFIGS:
        return build_random(ModelArgs.from_name(name_or_path, attention=attention), device=dev, dtype=dtype,
                            seed=seed)
    path = Path(name_or_path).expanduser()
    if path.exists() or "/" in name_or_path or name_or_path.startswith("."):
        from .weights import load_checkpoint

        return load_checkpoint(path, device=dev, dtype=dtype, attention=attention)
    raise UsageError(f"unknown model {name_or_path!r}",
                     hint=f"use one of {', '.join(CONFIGS)}, smollm2-135m, a .gguf file or a local Hugging Face "
                     "checkpoint folder")


def random_prompts(batch: int, prompt_len: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """``batch`` prompts of ``prompt_len`` uniform random token ids (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, prompt_len), generator=gen).tolist()


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample(logits: Tensor, params: SamplingParams, gen: torch.Generator | None) -> Tensor:
    """Next token per row from logits [B, V] -> [B]."""
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    return torch.multinomial(sampling_probs(logits, params), 1, generator=gen).squeeze(-1)


def sampling_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution ``sample`` draws from (temperature > 0): logits [..., V] -> probs [..., V]."""
    logits = logits.float() / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        outside = probs.cumsum(dim=-1) - probs >= params.top_p  # the nucleus ends where the sum reaches p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(outside, float("-inf")))
    return torch.softmax(logits, dim=-1)


def prefill(model: Transformer, x: Tensor, input_pos: Tensor, pos_ids: Tensor, mask: Tensor) -> Tensor:
    """Run prompt tokens x [B, S] at cache slots input_pos [S]; logits of the last slot [B, V]."""
    return model(x, input_pos, pos_ids, mask, last_only=True)[:, -1]


def decode_one_token(model: Callable[..., Tensor], x: Tensor, input_pos: Tensor, pos_ids: Tensor,
                     mask: Tensor, sampling: SamplingParams, gen: torch.Generator | None) -> Tensor:
    """One token per row: x [B, 1] at slot input_pos [1] -> next tokens [B]."""
    logits = model(x, input_pos, pos_ids, mask)[:, -1]
    return sample(logits, sampling, gen)


@dataclass
class _Slots:
    """Cache-slot layout of a batch: prompts left-padded after an optional shared prefix."""

    tokens: Tensor  # [B, L] token id at each prompt slot (0 on pads)
    pos: Tensor  # [B, L] rope position at each prompt slot
    valid: Tensor  # [B, L + new - 1] True where a slot holds a real token (decode sets its slot)
    valid_cpu: Tensor  # the prompt part of ``valid`` on the host, for counting
    prefix: int  # slots [0, prefix) hold the prefix shared by all rows
    length: int  # L, the first decode slot
    prompt_lens: Tensor  # [B] rope position of each row's first generated token


def plan_slots(prompts: list[list[int]], prefix: int, n_slots: int, device: torch.device) -> _Slots:
    b, suffix = len(prompts), max(len(p) for p in prompts) - prefix
    length = prefix + suffix
    tokens = torch.zeros(b, length, dtype=torch.long)
    pos = torch.zeros(b, length, dtype=torch.long)
    valid = torch.zeros(b, n_slots, dtype=torch.bool)
    for row, p in enumerate(prompts):
        start = length - (len(p) - prefix)
        tokens[row, :prefix], tokens[row, start:] = torch.tensor(p[:prefix]), torch.tensor(p[prefix:])
        pos[row, :prefix], pos[row, start:] = torch.arange(prefix), torch.arange(prefix, len(p))
        valid[row, :prefix] = valid[row, start:length] = True
    lens = torch.tensor([len(p) for p in prompts])
    return _Slots(tokens.to(device), pos.to(device), valid.to(device), valid[:, :length].clone(), prefix,
                  length, lens.to(device))


def chunk_mask(valid: Tensor, start: int, end: int) -> Tensor:
    """[B, 1, S, end]: slot q attends valid slots <= q, and always itself (pad rows stay finite)."""
    keys = torch.arange(end, device=valid.device)
    queries = torch.arange(start, end, device=valid.device)[:, None]
    return ((valid[:, None, None, :end] & (keys <= queries)) | (keys == queries))


def prefill_chunks(slots: _Slots, chunk: int | None) -> list[tuple[int, int, int]]:
    """(rows, start, end) of each prefill step: the prefix with one row, then the rest with all rows."""
    spans = []
    for rows, lo, hi in ((1, 0, slots.prefix), (slots.tokens.shape[0], slots.prefix, slots.length)):
        step = chunk or max(hi - lo, 1)
        spans += [(rows, s, min(s + step, hi)) for s in range(lo, hi, step)]
    return spans


class _Recorder:
    """Step timestamps and records of one generate() call, read once after the run.

    On CUDA each step boundary is a CUDA event recorded on the stream (no device sync inside the
    run); after the run one sync reads every event's offset from a start event taken right after
    a sync, on the host clock of that moment. On the CPU a boundary is ``perf_counter_ns()``.
    """

    def __init__(self, model: Transformer) -> None:
        self.model, self.device = model, model.device
        self.events = self.device.type == "cuda"
        self._marks: list[Any] = []
        self._pending: list[tuple[int, int, dict[str, Any]]] = []
        device_sync(self.device)
        self.start_ns = time.perf_counter_ns()
        if self.events:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()

    def now(self) -> int:
        """A mark for this point of the run (an index; :meth:`finish` turns it into ns)."""
        if self.events:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(time.perf_counter_ns())
        return len(self._marks) - 1

    def record(self, phase: str, batch: int, tokens: int, width: int, rows_in_use: int, ctx: int,
               start: int, kv: PolicyCaches | None = None) -> int:
        """Close a step of ``batch`` rows x ``width`` slots (``tokens`` real ones) begun at mark ``start``;
        with a KV policy (``kv``) the KV bytes and entries are what its caches read and hold."""
        m = self.model
        if kv is not None:
            entries = kv.read_per_row()
            return self.add(start, phase=phase, batch=batch, tokens=tokens, context_len=ctx,
                            weight_bytes=m.weight_bytes_read(batch * width), kv_cache_bytes=kv.read_bytes(),
                            kv_cache_size_bytes=kv.held_bytes(range(rows_in_use)), kv_entries=entries,
                            flops=m.step_flops(batch, width, round(entries)))
        return self.add(start, phase=phase, batch=batch, tokens=tokens, context_len=ctx,
                        weight_bytes=m.weight_bytes_read(batch * width), kv_cache_bytes=m.kv_bytes(batch, ctx),
                        kv_cache_size_bytes=m.kv_bytes(rows_in_use, ctx), kv_entries=float(ctx),
                        flops=m.step_flops(batch, width, ctx))

    def add(self, start: int, **fields: Any) -> int:
        """Close a step begun at mark ``start`` with these :class:`StepRecord` fields; its end mark."""
        end = self.now()
        self._pending.append((start, end, fields))
        return end

    def finish(self) -> tuple[list[StepRecord], list[int]]:
        """Sync once; the step records and the ns time of every mark."""
        device_sync(self.device)
        if self.events:
            times = [self.start_ns + round(self._start.elapsed_time(ev) * 1e6) for ev in self._marks]
        else:
            times = list(self._marks)
        steps = [StepRecord(step=i, start_ns=times[t0], end_ns=times[t1], **fields)
                 for i, (t0, t1, fields) in enumerate(self._pending)]
        return steps, times


def run_prefill(model: Transformer, slots: _Slots, chunk: int | None, sampling: SamplingParams,
                gen: torch.Generator | None, rec: _Recorder, kv: PolicyCaches | None = None) -> tuple[Tensor, int]:
    """All prefill steps; returns the first generated token per row [B] and its time mark (``kv``: the
    KV policy's caches, told each chunk's rows, positions and real tokens)."""
    n_rows = slots.tokens.shape[0]
    spans = prefill_chunks(slots, chunk)
    token, t_end = None, 0
    for i, (rows, lo, hi) in enumerate(spans):
        t0 = rec.now()
        with annotate("prefill"):
            input_pos = torch.arange(lo, hi, device=model.device)
            mask = chunk_mask(slots.valid[:rows], lo, hi)
            if kv is not None:
                kv.set_step(range(rows), slots.pos[:rows, lo:hi], slots.valid_cpu[:rows, lo:hi])
            logits = prefill(model, slots.tokens[:rows, lo:hi], input_pos, slots.pos[:rows, lo:hi], mask)
            shared = rows == 1 and n_rows > 1 and hi == slots.prefix
            if shared:
                for attn in model.attentions():
                    assert attn.kv_cache is not None
                    attn.kv_cache.share_prefix(slots.prefix, n_rows)
            if i == len(spans) - 1:
                token = sample(logits, sampling, gen)
        in_use = n_rows if shared or rows == n_rows else rows
        t_end = rec.record("prefill", rows, int(slots.valid_cpu[:rows, lo:hi].sum()), hi - lo, in_use, hi, t0, kv)
    assert token is not None
    return token, t_end


STOP_CHECK_EVERY = 8
"""Decode steps between two reads of the "every row has stopped" flag on CUDA."""


def decode_n_tokens(model: Transformer, forward: Callable[..., Tensor], token: Tensor, slots: _Slots,
                    n: int, sampling: SamplingParams, gen: torch.Generator | None, rec: _Recorder,
                    full_mask: bool = False, stop: Tensor | None = None,
                    kv: PolicyCaches | None = None) -> tuple[Tensor, list[int]]:
    """``n`` decode steps after the prompt; returns the tokens [B, n'] and each step's end mark.

    With ``stop`` (token ids [S]) the loop ends early once every row has produced one of them
    (n' <= n; a finished row keeps computing until then, the caller truncates its output). On
    CUDA that check reads the device every :data:`STOP_CHECK_EVERY` steps only, so it does not
    stall the GPU each step.
    """
    b = token.shape[0]
    out = torch.empty(b, n, dtype=torch.long, device=token.device)
    slot_ids = torch.arange(slots.valid.shape[1], device=token.device)
    times: list[int] = []
    done = None if stop is None else torch.isin(token, stop)
    lens = slots.prompt_lens.cpu() if kv is not None else None
    for i in range(n):
        if done is not None and (i % STOP_CHECK_EVERY == 0 or not rec.events) and bool(done.all()):
            return out[:, :i], times
        slot = slots.length + i
        t0 = rec.now()
        with annotate("decode"):
            slots.valid[:, slot] = True
            width = slots.valid.shape[1] if full_mask else slot + 1
            mask = slots.valid[:, None, None, :width]
            if kv is not None and lens is not None:
                kv.set_step(range(b), (lens + i)[:, None], torch.ones(b, 1, dtype=torch.bool))
            token = decode_one_token(forward, token[:, None], slot_ids[slot:slot + 1],
                                     (slots.prompt_lens + i)[:, None], mask, sampling, gen)
            out[:, i] = token
            if done is not None:
                done |= torch.isin(token, stop)  # type: ignore[arg-type]
        times.append(rec.record("decode", b, b, 1, b, width, t0, kv))
    return out, times


def _check_prompts(prompts: list[list[int]], vocab: int, max_new_tokens: int, chunk: int | None) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UsageError("every request needs a prompt of at least one token")
    bad = out_of_vocab(prompts, vocab)
    if bad:
        raise UsageError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if chunk is not None and chunk < 1:
        raise UsageError(f"chunked_prefill must be >= 1 token, got {chunk}")


def common_prefix(prompts: list[list[int]]) -> int:
    """Length of the prefix shared by all prompts, leaving each at least one token of its own."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for i in range(n):
        if any(p[i] != first[i] for p in prompts[1:]):
            return i
    return max(n, 0)


def truncate_at_stop(rows: list[list[int]], stop_ids: Sequence[int] | None) -> list[list[int]]:
    """Each row up to and including its first stop id (unchanged without stop ids)."""
    if not stop_ids:
        return rows
    stops = set(stop_ids)
    out = []
    for row in rows:
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        out.append(row[:end])
    return out


def default_compile(device_type: str, speculative: str | None = None) -> bool:
    """Whether decode is compiled when the user did not say: on CUDA (CUDA graphs), eager on the
    CPU; speculative decoding always runs eagerly."""
    return device_type == "cuda" and not speculative


def compile_seconds(warmup_s: float | None, warm_s: float | None) -> float | None:
    """Compile (and CUDA-graph capture) time: the identical warm-up's extra time over a warm run;
    None when it cannot be measured (no warm-up, or the warm-up was not slower)."""
    if warmup_s is None or warm_s is None or warmup_s <= warm_s:
        return None
    return warmup_s - warm_s


def cpu_inductor_options() -> dict[str, Any]:
    """Inductor settings for compiled decode on the CPU (A/B in ``benchmarks/RESULTS.md``).

    - ``realize_opcount_threshold=0``: by default inductor inlines pointwise producers into their
      consumers' loops, e.g. the RMSNorm feeding ``w13`` into the product's inner loop (recomputed
      once per weight row, 4,096 times) and the attention's scaling and masking into its
      reductions. Storing each such activation once (a few KB) costs nothing measurable; without it
      the explicitly written attention (see ``sdpa_attention``) made a step 24% slower.
    - ``cpp.enable_kernel_profile=True``: each kernel is a range in torch.profiler traces, so a
      profile shows the compiled step's kernels instead of time between operators.

    Not ``cpp_wrapper`` (C++ launch code instead of Python): in a paired A/B
    (``benchmarks/cpu_wrapper_ab.py``) a step without it took 0.96-0.98x the time with it for
    ``small`` at batch 1 (slow and fast memory), 0.99x at batch 32 and 0.89x for ``tiny``; and it
    calls BLAS through ``aoti_torch_cpu_mm_out``, a profiler range with no shapes, where the Python
    wrapper's ``aten::mm`` carries them, so a profile costs each product (2·M·N·K).
    """
    import torch._inductor.config as inductor_config

    wanted = {"realize_opcount_threshold": 0, "cpp.enable_kernel_profile": True}
    return {key: value for key, value in wanted.items() if _has_setting(inductor_config, key)}


def _has_setting(config: Any, dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    return hasattr(config, head) and (not rest or _has_setting(getattr(config, head), rest))


def decode_matmuls_in_kernels(model: Transformer, batch: int) -> bool:
    """Whether compiled decode runs every matrix product of a step inside inductor's generated CPU
    code (all linears take the threaded split, which inductor lowers to its own loops), so that the
    profiled kernels of a step hold all of its model work (see ``analysis.compiled_steps``)."""
    return all(m.threaded(batch, model.device.type) for m in model.modules() if isinstance(m, Linear))


def _decode_forward(model: Transformer, compile: bool) -> Callable[..., Tensor]:
    if not compile:
        return model
    model.ranges = False  # NVTX pushes would break the graph
    if model.device.type == "cuda":
        return torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False)
    return torch.compile(model, fullgraph=True, dynamic=False, options=cpu_inductor_options())


def run_params(model: Transformer, prompts: list[list[int]], max_new_tokens: int, sampling: SamplingParams,
               **options: Any) -> dict[str, Any]:
    """What a run was: model, sizes, dtype, device and options (the manifest's ``params``)."""
    n_params = sum(p.numel() for p in model.parameters())
    return {"model": model.args.name, "n_params": n_params,
            "weight_bytes": float(sum(p.numel() * p.element_size() for p in model.parameters())),
            "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device),
            "attention": model.args.attention, "batch": len(prompts), "prompt_lens": [len(p) for p in prompts],
            "max_new_tokens": max_new_tokens, "sampling": asdict(sampling), "threads": torch.get_num_threads(),
            "kv_cache_bytes_per_token": model.kv_bytes(1, 1), "n_layer": model.args.n_layer, **options}
