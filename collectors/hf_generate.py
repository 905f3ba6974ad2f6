"""Steps of Hugging Face transformers' ``generate()``, recorded with no change to the user's code.

While a :class:`GenerateRecorder` is active, ``transformers.GenerationMixin.generate`` is wrapped
(patched when ``transformers.generation.utils`` is imported, now or later, and restored on exit).
For the duration of each ``generate()`` call the wrapper registers a forward pre-hook and a forward
hook on the model it was called on, so that every forward of that model is one step:

- ``prefill``: the call's first forward, or any forward with more than one new token per sequence
  (chunked prefill, assisted decoding's verification);
- ``decode``: one new token per sequence.

The new tokens of a forward are the width of its ``input_ids`` (``inputs_embeds``;
``decoder_input_ids`` for encoder-decoder models): ``generate()`` passes only the tokens the
cache has not seen, in every transformers version from 4.40 to 5.x. The context is the width of
the 2-D attention mask (the cache slots attended after the step; padding included), and the
real (unpadded) tokens come from the first forward's mask, read once after the call.

Timing follows the reference engine: on the CPU a step boundary is ``perf_counter_ns()``; on one
CUDA device it is a CUDA event on the current stream (no sync inside the call), read after the
call ends and placed on the host clock of a sync taken when the call began. While torch.profiler
records, each step is also an ``annotate("prefill")`` / ``annotate("decode")`` range (NVTX and
``record_function``), the same names as the engine's, so kernels take their phase from the range.

Each sequence of a call becomes a request (vLLM's definitions, :func:`request_records` of the
engine): TTFT from the ``generate()`` call to the end of its first forward; a sequence's last
token is the forward that produced its first end-of-sequence token (or the last forward).

Not covered: forwards of an assistant (draft) model, ``generate()`` overrides that do not call
``GenerationMixin.generate``, and the auto-compiled forward of a static cache (hooks inside a
compiled call break its graph).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from perfscope.annotate import annotate

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType, TracebackType

TARGET_MODULE = "transformers.generation.utils"
FRAMEWORK = "hf"


@dataclass(frozen=True)
class ModelFacts:
    """What one forward of a model reads, from the model object and its config.

    Attributes:
        weight_bytes: sum of ``numel() * element_size()`` over the parameters (the storage as
            loaded: quantized, dequantised GGUF, tied tables counted once).
        kv_layer_bytes: per attention layer, the K and V bytes of one token
            (2 x kv heads x head dim x dtype size); empty when the config does not say.
        kv_windows: per layer, its sliding window (tokens) or None (full attention).
        linear_weights: ``in x out`` summed over the linear layers (``nn.Linear``, GPT-2's
            ``Conv1D``) other than the output head; None for a mixture of experts (not every
            expert runs per token) or a model without linear layers.
        head_weights: ``in x out`` of the output head (None: no head found).
        attn_width: layers x query heads x head dim (attention's FLOPs per token and context slot / 4).
    """

    name: str
    architecture: str
    n_params: int
    weight_bytes: float
    dtype: str
    kv_layer_bytes: tuple[int, ...]
    kv_windows: tuple[int | None, ...]
    transformers_version: str
    linear_weights: int | None = None
    head_weights: int | None = None
    attn_width: int | None = None

    @property
    def kv_bytes_per_token(self) -> float | None:
        """K and V bytes of one token over all layers (None: unknown from the config)."""
        return float(sum(self.kv_layer_bytes)) if self.kv_layer_bytes else None

    def kv_bytes(self, batch: int, context: int) -> float:
        """KV-cache bytes ``batch`` sequences of ``context`` slots read (each layer up to its window);
        NaN when the config gives no KV shape."""
        if not self.kv_layer_bytes:
            return float("nan")
        return float(batch * sum(b * (context if w is None else min(context, w))
                                 for b, w in zip(self.kv_layer_bytes, self.kv_windows)))

    def step_flops(self, rows: int, width: int, context: int, logit_rows: int) -> float | None:
        """Model FLOPs of one forward over ``rows`` x ``width`` token slots attending ``context``
        slots, as the engine's ``step_flops`` and ``torch.utils.flop_counter`` count them: 2 x each
        linear's weights per token (the head only for the ``logit_rows`` positions per row whose
        logits are computed), plus attention's QK^T and PV (4 x width x heads x head dim per
        token and slot). None when the model's linear layers or attention shape are unknown."""
        if self.linear_weights is None or self.head_weights is None or self.attn_width is None:
            return None
        tokens = rows * width
        return float(2 * (self.linear_weights * tokens + self.head_weights * rows * logit_rows)
                     + 4 * self.attn_width * tokens * context)

    def params(self) -> dict[str, Any]:
        """The manifest params of the profiled model."""
        return {"hf_model": self.name, "hf_architecture": self.architecture, "n_params": self.n_params,
                "weight_bytes": self.weight_bytes, "dtype": self.dtype,
                "kv_cache_bytes_per_token": self.kv_bytes_per_token,
                "transformers_version": self.transformers_version}


def _first(config: Any, names: Sequence[str]) -> Any:
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return None


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except TypeError:  # versions whose get_text_config takes no argument
            return get()
    return config


def kv_layer_shape(config: Any) -> tuple[int, int, int] | None:
    """(layers, kv heads, head dim) of a transformers config, or None when it does not say.

    KV heads: ``num_key_value_heads`` (GQA: Llama, Qwen2, Mistral), 1 for ``multi_query``
    (GPTBigCode, Falcon-7B), ``num_kv_heads`` / ``n_head_kv`` (Falcon), else the attention heads
    (multi-head: GPT-2's ``n_head``). Head dim: ``head_dim`` when set, else hidden / heads.
    """
    c = _text_config(config)
    layers = _first(c, ("num_hidden_layers", "n_layer", "num_layers", "n_layers"))
    heads = _first(c, ("num_attention_heads", "n_head", "num_heads", "n_heads"))
    hidden = _first(c, ("hidden_size", "n_embd", "d_model", "dim"))
    if not layers or not heads:
        return None
    if getattr(c, "multi_query", False) and not getattr(c, "new_decoder_architecture", False):
        kv = 1
    else:
        kv = _first(c, ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")) or heads
    head_dim = getattr(c, "head_dim", None) or (hidden // heads if hidden else None)
    if not head_dim:
        return None
    return int(layers), int(kv), int(head_dim)


def kv_windows(config: Any, layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, from ``layer_types`` (transformers 4.53+: ``sliding_attention``
    layers keep ``sliding_window`` tokens); full attention everywhere when the config has none."""
    c = _text_config(config)
    types = getattr(c, "layer_types", None)
    window = getattr(c, "sliding_window", None)
    if not types or not window or len(types) != layers:
        return (None,) * layers
    return tuple(int(window) if t == "sliding_attention" else None for t in types)


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _linear_sizes(model: Any) -> tuple[int | None, int | None]:
    """(``in x out`` of the linear layers but the head, of the head); None where unknown."""
    import torch
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers (4.40 to 5.x)

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body, head_size = 0, None
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            size = int(m.in_features) * int(m.out_features)  # quantized Linear subclasses keep the logical shape
        elif isinstance(m, Conv1D):
            size = int(m.weight.shape[0]) * int(m.nf)
        else:
            continue
        if m is head:
            head_size = size
        else:
            body += size
    if head is not None and head_size is None and getattr(head, "weight", None) is not None:
        head_size = int(head.weight.numel())
    return body or None, head_size


def model_facts(model: Any) -> ModelFacts:
    """The :class:`ModelFacts` of a transformers model."""
    import torch

    params = list(model.parameters())
    dtype = getattr(model, "dtype", None) or (params[0].dtype if params else torch.float32)
    config = model.config
    shape = kv_layer_shape(config)
    size = torch.empty((), dtype=dtype).element_size()
    layer_bytes = (2 * shape[1] * shape[2] * size,) * shape[0] if shape else ()
    try:
        import transformers

        version = str(transformers.__version__)
    except ImportError:  # pragma: no cover - a model object without transformers cannot exist
        version = ""
    archs = getattr(config, "architectures", None) or [type(model).__name__]
    text = _text_config(config)
    moe = any(getattr(text, k, None) for k in MOE_KEYS)
    body, head = _linear_sizes(model)
    heads = _first(text, ("num_attention_heads", "n_head", "num_heads", "n_heads"))
    return ModelFacts(
        name=str(getattr(config, "_name_or_path", "") or getattr(config, "model_type", "") or type(model).__name__),
        architecture=str(archs[0]), n_params=sum(p.numel() for p in params),
        weight_bytes=float(sum(p.numel() * p.element_size() for p in params)),
        dtype=str(dtype).removeprefix("torch."), kv_layer_bytes=layer_bytes,
        kv_windows=kv_windows(config, shape[0]) if shape else (), transformers_version=version,
        linear_weights=None if moe else body, head_weights=head,
        attn_width=shape[0] * int(heads) * shape[2] if shape and heads else None)


@dataclass(frozen=True)
class HFStep:
    """One forward inside ``generate()``: a row of the steps table (``generate_call`` extra)."""

    step: int
    phase: str
    batch: int
    tokens: int
    prefill_tokens: int
    prefill_seqs: int
    decode_seqs: int
    context_len: int
    context_tokens: int
    start_ns: int
    end_ns: int
    weight_bytes: float
    kv_cache_bytes: float
    kv_cache_size_bytes: float
    framework: str = FRAMEWORK
    label: str | None = None
    flops: float | None = None
    generate_call: int = 0
    drafted: int | None = None
    accepted: int | None = None


class _Clock:
    """Step boundaries of one call: CUDA events on a single CUDA device, else ``perf_counter_ns``
    (with a sync per mark when the model spans several devices)."""

    def __init__(self, model: Any) -> None:
        import torch

        self.torch = torch
        devices = {p.device for p in model.parameters()}
        cuda = {d for d in devices if d.type == "cuda"}
        self.events = len(devices) == 1 and len(cuda) == 1
        self.sync_each = bool(cuda) and not self.events
        self.device = next(iter(cuda)) if self.events else None
        self._sync()
        self.start_ns = time.perf_counter_ns()
        self.marks: list[Any] = []
        if self.events:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))

    def _sync(self) -> None:
        if self.events:
            self.torch.cuda.synchronize(self.device)
        elif self.sync_each:
            self.torch.cuda.synchronize()

    def mark(self) -> int:
        if self.events:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record(self.torch.cuda.current_stream(self.device))  # the model's device, not the current one
            self.marks.append(ev)
        else:
            if self.sync_each:
                self._sync()
            self.marks.append(time.perf_counter_ns())
        return len(self.marks) - 1

    def read(self) -> list[int]:
        """Every mark in ns on the host clock (one sync)."""
        self._sync()
        if self.events:
            return [self.start_ns + round(self._start.elapsed_time(ev) * 1e6) for ev in self.marks]
        return list(self.marks)


@dataclass
class _Forward:
    phase: str
    batch: int
    new: int
    context_len: int
    start: int
    logit_rows: int = 0
    end: int = -1
    draft: bool = False
    cached: int | None = None
    """Tokens in the model's KV cache before the forward (from its cache, ``cache_position``,
    the 2-D mask or ``position_ids``), None when none says."""
    ids: list[int] | None = None
    """The input ids of a speculative call's target forward (one row), for its last check."""


class _Call:
    """The hooks of one ``generate()`` call and what they saw."""

    def __init__(self, model: Any, prompt_mask: Any = None, *, speculative: bool = False,
                 draft_model: Any = None) -> None:
        self.model = model
        self.speculative = speculative
        """generate() with a draft (``assistant_model``) or prompt lookup: the target's later
        multi-token forwards verify drafted tokens."""
        self.draft_model = draft_model
        self.encdec = bool(getattr(model.config, "is_encoder_decoder", False))
        self.clock = _Clock(model)
        self.forwards: list[_Forward] = []
        self.prompt_mask = prompt_mask if hasattr(prompt_mask, "dim") and prompt_mask.dim() == 2 else None
        """The 2-D ``attention_mask`` given to ``generate()`` (1 = a prompt token, 0 = padding)."""
        self.mask0: Any = None
        self.real0: list[int] | None = None
        """Per row, the real tokens of the first forward read from its 4-D mask (a static cache's
        ``[b, 1, q, cache]`` mask: the last prompt position attends every real token)."""
        self._open: _Forward | None = None
        self._range: annotate | None = None
        self._inner = 0

    def before_draft(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward of the draft (assistant) model: a ``draft`` step."""
        self.before(module, args, kwargs, draft=True)

    def before(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, draft: bool = False) -> None:
        if self._open is not None:
            self._inner += 1  # a forward inside a forward: the outer one is the step
            return
        prefix = "decoder_" if self.encdec else ""
        x = kwargs.get(f"{prefix}input_ids")
        if x is None and not self.encdec and args:
            x = args[0]
        if x is None:
            x = kwargs.get(f"{prefix}inputs_embeds")
        if x is None or getattr(x, "dim", lambda: 0)() < 2:
            return  # not a generation forward we can read
        batch, new = int(x.shape[0]), int(x.shape[1])
        mask = kwargs.get(f"{prefix}attention_mask")
        mask = mask if hasattr(mask, "dim") else None  # a dict of masks per layer type: not read
        mine = [f for f in self.forwards if f.draft == draft]
        first = not mine
        if first and not draft and mask is not None and mask.dim() == 2:
            self.mask0 = mask
        elif first and not draft and mask is not None and mask.dim() == 4:
            self.real0 = _attended(mask)
        cached = _cached(kwargs, new, mask)
        before = mine[-1].context_len if mine else 0
        if cached is not None:
            ctx = cached + new
        else:
            ctx = int(mask.shape[-1]) if mask is not None and mask.dim() in (2, 4) else before + new
        if draft:
            phase = "draft"
        elif first:
            phase = "prefill"
        elif new > 1:
            phase = "verify" if self.speculative else "prefill"
        else:
            phase = "decode"
        ids = x[0].tolist() if self.speculative and not draft and batch == 1 and x.dim() == 2 \
            and not x.is_floating_point() else None
        self._open = _Forward(phase, batch, new, ctx, self.clock.mark(), logit_rows=_logit_rows(kwargs, new),
                              draft=draft, cached=cached, ids=ids)
        self._range = annotate(phase)
        self._range.__enter__()

    def after(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if self._inner:
            self._inner -= 1
            return
        self.close()

    def close(self) -> None:
        """End the open step (the forward hook; or an exception that skipped it)."""
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self._open is not None:
            self._open.end = self.clock.mark()
            self.forwards.append(self._open)
            self._open = None


def _cached(kwargs: dict[str, Any], new: int, mask: Any) -> int | None:
    """Tokens in the KV cache before a forward: the cache object's ``get_seq_length()``
    (``past_key_values``; ``cache`` in transformers 5.x), else ``cache_position[0]``, else the
    2-D mask's width less the new tokens, else the first new token's position (one row)."""
    for key in ("past_key_values", "cache"):
        cache = kwargs.get(key)
        length = getattr(cache, "get_seq_length", None)
        if callable(length):
            try:
                return int(length())
            except (TypeError, ValueError, RuntimeError, AttributeError):
                pass
    position: Any = kwargs.get("cache_position")
    if hasattr(position, "reshape") and position.numel():
        return int(position.reshape(-1)[0])
    if mask is not None and mask.dim() == 2:
        return int(mask.shape[-1]) - new
    ids: Any = kwargs.get("position_ids")
    if hasattr(ids, "dim") and ids.dim() == 2 and int(ids.shape[0]) == 1 and ids.numel():
        return int(ids[0, 0])
    return None


def _attended(mask: Any) -> list[int] | None:
    """Per row, the key slots the last query position of a 4-D attention mask attends: a bool
    mask's True, an additive mask's 0 (-inf elsewhere); None for another form."""
    last = mask[:, 0, -1, :]
    dtype = str(last.dtype)
    if dtype == "torch.bool":
        return [int(v) for v in last.sum(-1).tolist()]
    if "float" in dtype or "bfloat" in dtype or "half" in dtype:
        return [int(v) for v in (last == 0).sum(-1).tolist()]
    return None


def _logit_rows(kwargs: dict[str, Any], new: int) -> int:
    """Positions per row whose logits the forward computes: ``logits_to_keep`` (5.x; 4.45+:
    ``num_logits_to_keep``) when generate() passes it, else all ``new`` (0 also means all)."""
    keep = kwargs.get("logits_to_keep", kwargs.get("num_logits_to_keep"))
    if isinstance(keep, int) and not isinstance(keep, bool):
        return min(keep, new) if keep > 0 else new
    if keep is not None and hasattr(keep, "numel"):
        return int(keep.numel())  # a tensor of positions
    return new


def _eos_ids(model: Any, kwargs: dict[str, Any]) -> set[int]:
    eos = kwargs.get("eos_token_id")
    if eos is None:
        config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return set()
    if hasattr(eos, "tolist"):
        eos = eos.tolist()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def _input_width(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    x = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
    return int(x.shape[-1]) if x is not None and hasattr(x, "shape") and len(x.shape) == 2 else None


def _prompt_tokens(call: _Call, first: _Forward, batch: int, width: int | None = None) -> tuple[list[int], list[int]]:
    """(per row, the real tokens in the cache after the first forward; the real tokens among its
    new ones). Padding is not prompt: the rows' attention mask says which slots are real, read
    from ``generate()``'s own 2-D ``attention_mask``, else the first forward's 2-D mask, else its
    4-D mask (a static cache); with none, every slot of the prompt's width (``width``: the
    ``input_ids`` given to ``generate()``; else the first forward's) counts."""
    for mask in (call.prompt_mask, call.mask0):
        if mask is not None and int(mask.shape[0]) == batch:
            ctx = [int(v) for v in mask.sum(-1).tolist()]
            new = [int(v) for v in mask[:, -first.new:].sum(-1).tolist()]
            return ctx, new
    if call.real0 is not None and len(call.real0) == batch:
        return list(call.real0), list(call.real0)
    return [width or first.new] * batch, [width or first.new] * batch


SPECULATIVE_KEYS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")
"""generate() arguments (or generation-config fields) that turn on speculative decoding."""


def _is_speculative(model: Any, kwargs: dict[str, Any]) -> bool:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    return any(kwargs.get(k) is not None or getattr(config, k, None) is not None for k in SPECULATIVE_KEYS)


def _lookup(model: Any, kwargs: dict[str, Any]) -> bool:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    return kwargs.get("prompt_lookup_num_tokens") is not None or \
        getattr(config, "prompt_lookup_num_tokens", None) is not None


def _speculation(call: _Call, target: list[_Forward], width: int | None, result: Any) -> dict[Any, Any]:
    """Per target forward (by ``id``): (drafted, accepted) tokens, and ``emitted``: the tokens each
    forward added to the output, in order; {} when the cache positions are not known.

    A forward's input is what the cache has not seen: the prompt (first) or the last emitted token,
    then the drafted tokens. The next forward's cache length tells how many were kept: ``accepted =
    cached_next - cached - base`` (``base``: the prompt width, or 1). Each forward emits its accepted
    drafts and one token of its own; the last forward's drafts are matched against the output (which
    ends at ``max_new_tokens``, possibly before that forward's own token)."""
    seqs = result if hasattr(result, "shape") else getattr(result, "sequences", None)
    if width is None or any(f.cached is None for f in target) or target[0].batch != 1:
        return {}
    if seqs is None:
        return {}
    out: dict[Any, Any] = {}
    emitted = []
    total = int(seqs.shape[1])
    for k, f in enumerate(target):
        base = width if k == 0 else 1
        drafted = max(f.new - base, 0)
        if k + 1 < len(target):
            kept = int(target[k + 1].cached) - int(f.cached or 0) - base  # type: ignore[arg-type]
            accepted = min(max(kept, 0), drafted)
            emitted.append(accepted + 1)
        else:  # the last forward: its drafts against the output (which may end before its own token)
            start = int(f.cached or 0) + base
            row = seqs[0, start:start + drafted].tolist()
            drafts = (f.ids or [])[base:]
            accepted = next((i for i, (a, b) in enumerate(zip(drafts, row)) if a != b), min(len(drafts), len(row)))
            emitted.append(max(total - start, 0))
        if drafted:
            out[id(f)] = (drafted, accepted)
    out["emitted"] = emitted
    return out


def _speculative_request(row: dict[str, Any], spec: dict[Any, Any]) -> None:
    """The request's speculative columns: drafted and accepted tokens over the target forwards that
    checked drafts, the acceptance rate and the mean accepted drafts per such forward (the engine's
    ``speculative_stats`` convention; a forward emits that plus one token of its own)."""
    pairs = [v for k, v in spec.items() if k != "emitted"]
    if not pairs:
        return
    drafted, accepted = sum(d for d, _ in pairs), sum(a for _, a in pairs)
    row.update(drafted_tokens=drafted, accepted_tokens=accepted,
               acceptance_pct=100.0 * accepted / drafted if drafted else None,
               mean_accepted_len=accepted / len(pairs))


@dataclass
class Recording:
    """Everything a :class:`GenerateRecorder` saw: steps, requests, the model's facts, warnings."""

    steps: list[HFStep] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    facts: ModelFacts | None = None
    calls: int = 0
    generate_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    speculation: dict[str, Any] | None = None
    """``{"method": ...}`` when a call decoded speculatively (the speculation finding names it)."""
    _t0: int | None = None

    def params(self) -> dict[str, Any]:
        """Manifest params: the model's facts, how many calls and their summed wall time."""
        out: dict[str, Any] = {"hf_generate_calls": self.calls, "hf_generate_s": self.generate_s}
        if self.speculation:
            out["speculation"] = dict(self.speculation)
        return {**(self.facts.params() if self.facts else {}), **out}

    def add_call(self, call: _Call, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The records of one finished (or failed: ``result`` None) ``generate()`` call."""
        times = call.clock.read()
        end_ns = time.perf_counter_ns()
        facts = self.facts if self.facts is not None else model_facts(call.model)
        self.facts = facts
        start = call.clock.start_ns
        self._t0 = start if self._t0 is None else self._t0
        self.generate_s += (end_ns - start) / 1e9
        index = self.calls
        self.calls += 1
        fw = call.forwards
        target = [f for f in fw if not f.draft]
        if not target:
            return
        batch = target[0].batch
        width = _input_width(args, kwargs) if not call.encdec else None
        real_ctx, real_new = _prompt_tokens(call, target[0], batch, width)
        spec = _speculation(call, target, width, result) if call.speculative else {}
        if call.speculative:
            self.speculation = {"method": "assisted generation (draft model)" if call.draft_model is not None
                                else "prompt lookup" if _lookup(call.model, kwargs) else "speculative"}
        draft_facts = model_facts(call.draft_model) if call.draft_model is not None and any(f.draft for f in fw) \
            else None
        added = 0
        for f in fw:
            own = draft_facts if f.draft and draft_facts is not None else facts
            first = f is target[0]
            if not f.draft and not first:
                added += f.new
            drafted, accepted = spec.get(id(f), (None, None))
            prefill = f.phase == "prefill"
            tokens = sum(real_new) + f.batch * (drafted or 0) if first else f.batch * f.new
            if f.draft or call.speculative:
                context_tokens = f.batch * f.context_len
            else:
                context_tokens = sum(real_ctx) + f.batch * added if f.batch == batch else f.batch * f.context_len
            self.steps.append(HFStep(
                step=len(self.steps), phase=f.phase, batch=f.batch, tokens=tokens,
                prefill_tokens=sum(real_new) if first else (tokens if prefill else 0),
                prefill_seqs=f.batch if prefill else 0,
                decode_seqs=0 if prefill else f.batch, context_len=f.context_len,
                context_tokens=context_tokens,
                start_ns=times[f.start], end_ns=times[f.end], weight_bytes=own.weight_bytes,
                kv_cache_bytes=own.kv_bytes(f.batch, f.context_len),
                kv_cache_size_bytes=own.kv_bytes(f.batch, f.context_len), label=f.phase, generate_call=index,
                flops=own.step_flops(f.batch, f.new, f.context_len, f.logit_rows),
                drafted=drafted, accepted=accepted))
        if result is not None:
            padded = width if width is not None else (None if call.encdec else target[0].new)
            if call.speculative:
                emitted = spec.get("emitted")
                if emitted is None:
                    self.warnings.append(f"generate() call {index}: speculative decoding whose accepted tokens could "
                                         "not be read from the model's cache positions: no request rows for it")
                    return
                token_ns = [times[f.end] for f, e in zip(target, emitted) for _ in range(e)]
            else:
                token_ns = [times[f.end] for f in target]
            self._add_requests(call, result, args, kwargs, token_ns, start, real_ctx, index, padded)
            if call.speculative and self.requests and self.requests[-1].get("generate_call") == index:
                _speculative_request(self.requests[-1], spec)

    def _add_requests(self, call: _Call, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      token_ns: list[int], start_ns: int, prompt_lens: list[int], index: int,
                      padded: int | None = None) -> None:
        from perfscope.request_metrics import request_records

        seqs = result if hasattr(result, "shape") else getattr(result, "sequences", None)
        width = 1 if call.encdec else _input_width(args, kwargs)
        n = len(token_ns)
        if seqs is None or width is None or int(seqs.shape[1]) - width != n or int(seqs.shape[0]) != len(prompt_lens):
            self.warnings.append(
                f"generate() call {index}: its output does not hold one token per sequence per forward "
                "(beam search, assisted decoding or a custom return): no request rows for it")
            return
        eos = _eos_ids(call.model, kwargs)
        lens, reasons = [], []
        for row in seqs[:, -n:].tolist():
            hit = next((i for i, t in enumerate(row) if t in eos), None)
            lens.append(n if hit is None else hit + 1)
            reasons.append("length" if hit is None else "eos")
        arrival = (start_ns - (self._t0 or start_ns)) / 1e9
        max_new = getattr(kwargs.get("generation_config"), "max_new_tokens", None) or kwargs.get("max_new_tokens")
        first_id = len(self.requests)
        # request_records reads only the prompts' lengths
        for r, reason in zip(request_records([list(range(p)) for p in prompt_lens], token_ns, start_ns, lens), reasons):
            row = asdict(r)
            row.update(request_id=first_id + r.request_id, arrival_s=arrival, admitted_s=arrival,
                       first_token_s=arrival + r.ttft_s, end_s=arrival + r.e2e_s,
                       max_output_tokens=max_new, finish_reason=reason, generate_call=index)
            if padded is not None and padded >= row["prompt_tokens"] > 0:
                row.update(prompt_padded_tokens=padded,
                           prompt_padding_pct=100.0 * (padded - row["prompt_tokens"]) / padded)
            self.requests.append(row)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``transformers.generation.utils`` right after it is first imported."""

    def __init__(self, recorder: GenerateRecorder) -> None:
        self.recorder = recorder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        run = loader.exec_module
        recorder = self.recorder

        def exec_module(module: ModuleType) -> None:
            run(module)
            recorder._patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


class GenerateRecorder:
    """While active, every ``generate()`` of a transformers model records its steps and requests.

    Examples:
        >>> with GenerateRecorder() as rec:
        ...     pass  # model.generate(...) here
        >>> rec.recording.steps
        []
    """

    def __init__(self) -> None:
        self.recording = Recording()
        self._module: ModuleType | None = None
        self._original: Any = None
        self._finder: _PatchOnImport | None = None
        self._depth = 0

    def __enter__(self) -> GenerateRecorder:
        module = sys.modules.get(TARGET_MODULE)
        if module is not None:
            self._patch(module)
        else:
            self._finder = _PatchOnImport(self)
            sys.meta_path.insert(0, self._finder)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        if self._module is not None:
            self._module.GenerationMixin.generate = self._original  # type: ignore[attr-defined]
            self._module = None

    def _patch(self, module: ModuleType) -> None:
        mixin = getattr(module, "GenerationMixin", None)
        if mixin is None or self._module is not None:
            return
        original = mixin.generate
        recorder = self

        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            return recorder._call(original, model, args, kwargs)

        generate.__wrapped__ = original  # type: ignore[attr-defined]
        generate.__doc__ = original.__doc__
        self._module, self._original = module, original
        mixin.generate = generate

    def _call(self, original: Any, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._depth:  # generate() inside generate() (an assistant model): the outer call's steps only
            return original(model, *args, **kwargs)
        self._depth += 1
        draft = kwargs.get("assistant_model")
        call = _Call(model, kwargs.get("attention_mask"), speculative=_is_speculative(model, kwargs),
                     draft_model=draft if hasattr(draft, "register_forward_pre_hook") and draft is not model else None)
        hooks = [model.register_forward_pre_hook(call.before, with_kwargs=True),
                 model.register_forward_hook(call.after, with_kwargs=True)]
        if call.draft_model is not None:  # the draft's forwards (its own nested generate() passes through)
            hooks += [call.draft_model.register_forward_pre_hook(call.before_draft, with_kwargs=True),
                      call.draft_model.register_forward_hook(call.after, with_kwargs=True)]
        result = None
        try:
            result = original(model, *args, **kwargs)
        finally:
            for h in hooks:
                h.remove()
            call.close()
            self._depth -= 1
            self.recording.add_call(call, result, args, kwargs)
        return result
