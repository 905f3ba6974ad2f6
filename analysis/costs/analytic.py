"""Analytic FLOPs and bytes beside measured ones (Nsight Compute), from two sources.

1. ``with_engine_costs``: the useful work of the reference engine's kernels, from its model
   shapes (``perfscope import X.ncu-rep --engine MODEL --batch B --prompt-len S``);
2. ``with_trace_costs``: the cost of each kernel's launching op in a Kineto trace of the same
   program (``--analytic TRACE``), matched by range path, kernel name and launch order.

The engine route in detail:

perfscope's engine (``perfscope.engine``) launches, per layer and NVTX range, a known sequence of
matrix work: in ``attn`` the fused QKV GEMM, the attention (SDPA), the output projection; in
``mlp`` the fused gate/up GEMM and the down projection; the LM head in the phase's own range. Its
shapes follow from the model config and the run (batch, prompt length). So a kernel of an ncu
capture of the engine is matched to its op by NVTX range and launch order: the k-th GEMM kernel
of a range instance is the k-th GEMM of that block, an attention kernel is the SDPA.

Useful work, not the work of a particular algorithm:

- GEMM: ``2 x M x N x K`` FLOPs; bytes ``(M x K + K x N + M x N) x itemsize``;
- attention: causal (the engine's masks are causal: a prompt attends to itself and the cache, a
  decode token to the whole cache), so ``4 x B x H x head_dim x`` (query, key) pairs with
  ``pairs = S (S + 1) / 2`` for a prefill from position 0 and the context length for a decode
  token; bytes are Q, K, V and the output, not the mask.

A kernel that measures more than this does work the op does not need (masked tiles computed in
full, tiles padded past a small M): the ``excess-work`` finding names them. Limits: prefill is
taken from position 0 without chunking or prefix cache; a decode step's attention needs its
context (``decode_context``), else it stays missing; a capture whose kernel filter dropped some
GEMMs of a range misaligns the order (filter by NVTX range instead).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .operators import category_of
from .roofline import classify

if TYPE_CHECKING:
    from collections.abc import Mapping

    from perfscope.report import Report

LAYER_BLOCK = re.compile(r"(?:^|/)layer\.(\d+)/(attn|mlp)$")
SOURCE = "engine"
"""``analytic_source`` of the rows priced from the engine's shapes (``trace``: from a Kineto trace)."""


@dataclass(frozen=True)
class EngineShape:
    """What perfscope knows of an engine run: the model's dimensions and the run's shape.

    Attributes:
        model: config name (``llama-3.2-1b``) or checkpoint, for the record.
        dim, n_head, n_kv_head, head_dim, intermediate_size, vocab_size: the model's dimensions.
        batch: sequences per step.
        prompt_len: prompt tokens per sequence (a prefill from position 0).
        itemsize: bytes per element of weights and activations (2 for bf16/fp16).
        decode_context: cache length a profiled decode step attends to (prompt + tokens so far
            + 1); None leaves decode attention unpriced.
    """

    model: str
    dim: int
    n_head: int
    n_kv_head: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    batch: int
    prompt_len: int
    itemsize: int = 2
    decode_context: int | None = None

    @classmethod
    def from_args(cls, args: Any, *, batch: int, prompt_len: int, itemsize: int = 2,
                  decode_context: int | None = None) -> EngineShape:
        """From a :class:`perfscope.engine.model.ModelArgs` (or anything with its fields)."""
        return cls(model=str(args.name), dim=args.dim, n_head=args.n_head, n_kv_head=args.n_kv_head,
                   head_dim=args.head_dim, intermediate_size=args.intermediate_size,
                   vocab_size=args.vocab_size, batch=batch, prompt_len=prompt_len, itemsize=itemsize,
                   decode_context=decode_context)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AnalyticOp:
    """One op of the engine: its kind (``gemm`` or ``attention``), a label, its useful work."""

    kind: str
    label: str
    flops: float
    dram_bytes: float


def _gemm(label: str, m: int, n: int, k: int, itemsize: int) -> AnalyticOp:
    return AnalyticOp("gemm", f"{label} {m}x{n}x{k}", 2.0 * m * n * k, float(m * k + k * n + m * n) * itemsize)


def _attention(s: EngineShape, queries: int, pairs: float | None, context: int | None) -> AnalyticOp:
    b, h, kv, d = s.batch, s.n_head, s.n_kv_head, s.head_dim
    label = f"sdpa causal b{b} h{h} q{queries} kv{context if context is not None else '?'} d{d}"
    if pairs is None or context is None:
        return AnalyticOp("attention", label, math.nan, math.nan)
    nbytes = (2.0 * b * h * queries * d + 2.0 * b * kv * context * d) * s.itemsize
    return AnalyticOp("attention", label, 4.0 * b * h * d * pairs, nbytes)


def block_ops(shape: EngineShape, phase: str, block: str) -> list[AnalyticOp]:
    """The engine's matrix ops of one range (``attn``, ``mlp`` or ``head``) in launch order."""
    s, it = shape, shape.itemsize
    rows = s.batch * (s.prompt_len if phase == "prefill" else 1)
    if block == "attn":
        qkv = (s.n_head + 2 * s.n_kv_head) * s.head_dim
        if phase == "prefill":
            attn = _attention(s, s.prompt_len, s.prompt_len * (s.prompt_len + 1) / 2.0, s.prompt_len)
        else:
            ctx = s.decode_context
            attn = _attention(s, 1, float(ctx) if ctx else None, ctx)
        return [_gemm("wqkv", rows, qkv, s.dim, it), attn, _gemm("wo", rows, s.dim, s.n_head * s.head_dim, it)]
    if block == "mlp":
        return [_gemm("w13", rows, 2 * s.intermediate_size, s.dim, it),
                _gemm("w2", rows, s.dim, s.intermediate_size, it)]
    if block == "head":  # the prefill computes the last position's logits only
        return [_gemm("output", s.batch, s.vocab_size, s.dim, it)]
    return []


def kernel_kind(name: object) -> str | None:
    """``gemm`` or ``attention`` for the kernels the engine's matrix ops launch, else None."""
    category = category_of(None, str(name)) if isinstance(name, str) else None
    return category if category in ("gemm", "attention") else None


def _block_of(path: object, phase: object) -> str | None:
    if not isinstance(path, str) or phase not in ("prefill", "decode"):
        return None
    match = LAYER_BLOCK.search(path)
    if match:
        return match.group(2)
    return "head" if path.split("/")[-1] == phase else None


def attach_engine_costs(kernels: pd.DataFrame, shape: EngineShape) -> tuple[pd.DataFrame, list[str]]:
    """Fill ``flops_analytic``, ``dram_bytes_analytic``, ``analytic_op`` and ``analytic_source`` of
    the engine's GEMM and attention kernels (matched by NVTX range and launch order).

    Args:
        kernels: a kernel table in launch order with ``name``, ``range`` and ``phase``.
        shape: the engine run.

    Returns:
        The new table and warnings (kernels that could not be matched).
    """
    out = kernels.copy()
    flops = np.full(len(out), np.nan)
    nbytes = np.full(len(out), np.nan)
    labels: list[str | None] = [None] * len(out)
    unmatched = 0
    counters: dict[str, int] = {}
    previous: object = None
    for i, (name, path, phase) in enumerate(zip(out["name"], out["range"], out["phase"])):
        if path != previous:
            counters, previous = {}, path  # a new range instance
        kind, block = kernel_kind(name), _block_of(path, phase)
        if kind is None or block is None:
            continue
        ops = [op for op in block_ops(shape, str(phase), block) if op.kind == kind]
        if not ops:
            unmatched += 1
            continue
        op = ops[counters.get(kind, 0) % len(ops)]
        counters[kind] = counters.get(kind, 0) + 1
        flops[i], nbytes[i], labels[i] = op.flops, op.dram_bytes, op.label
    out["flops_analytic"] = flops
    out["dram_bytes_analytic"] = nbytes
    out["analytic_op"] = pd.Series(labels, index=out.index, dtype="object")
    out["analytic_source"] = pd.Series([SOURCE if label else None for label in labels], index=out.index,
                                       dtype="object")
    warnings = []
    priced = int(pd.notna(flops).sum())
    if not priced:
        warnings.append(f"--engine {shape.model}: no kernel matched an engine op (the capture needs the engine's "
                        "NVTX ranges, --nvtx, and its GEMM / attention kernels)")
    if unmatched:
        warnings.append(f"--engine {shape.model}: {unmatched} GEMM/attention kernel(s) in ranges without such an "
                        "engine op were left without analytic cost")
    return out, warnings


def engine_params(shape: EngineShape) -> Mapping[str, Any]:
    """The manifest entry that records how the analytic columns were made."""
    return {"analytic": {"source": SOURCE, "engine": shape.to_dict(),
                         "method": "useful work of the engine's ops at its shapes: GEMM 2*M*N*K, causal "
                                   "attention 4*B*H*head_dim*(query, key) pairs; bytes compulsory"}}


def with_engine_costs(report: Report, shape: EngineShape) -> Report:
    """``report`` with the engine's analytic costs beside its kernels' measured ones."""
    kernels, warnings = attach_engine_costs(report.kernels, shape)
    return with_analytic(report, kernels, engine_params(shape), warnings)


def with_analytic(report: Report, kernels: pd.DataFrame, params: Mapping[str, Any], warnings: list[str]) -> Report:
    """``report`` with a kernel table whose analytic columns were filled, re-classified."""
    return report.replace(kernels=classify(kernels, report.device)).with_manifest(
        params={**report.params, **params}, warnings=report.warnings + warnings)


def with_trace_costs(report: Report, trace: Report) -> Report:
    """``report`` (measured: ncu) with the analytic costs of the same kernels in ``trace``, a
    Kineto trace of the same program priced by perfscope's cost model.

    The k-th launch of a kernel name inside a range path in ``report`` is matched to the k-th
    launch of that name in that path in ``trace`` (paths compared whole; kernels outside any
    range by name alone). The framework op is priced as it was called: an attention with an
    explicit mask costs the full product here, where ``--engine`` prices the causal work.
    """
    priced = trace.kernels[trace.kernels["flops_source"].eq("analytic") | trace.kernels["bytes_source"].eq("analytic")]
    lookup: dict[tuple[str, str, int], int] = {}
    seen: dict[tuple[str, str], int] = {}
    for i, (name, path) in enumerate(zip(priced["name"], priced["range"])):
        key = (str(path) if isinstance(path, str) else "", str(name))
        lookup[(*key, seen.get(key, 0))] = i
        seen[key] = seen.get(key, 0) + 1
    out = report.kernels.copy()
    flops, nbytes = np.full(len(out), np.nan), np.full(len(out), np.nan)
    labels: list[str | None] = [None] * len(out)
    seen = {}
    for j, (name, path) in enumerate(zip(out["name"], out["range"])):
        key = (str(path) if isinstance(path, str) else "", str(name))
        hit = lookup.get((*key, seen.get(key, 0)))
        seen[key] = seen.get(key, 0) + 1
        if hit is None:
            continue
        row = priced.iloc[hit]
        flops[j], nbytes[j] = row["flops"], row["dram_bytes"]
        labels[j] = f"{row['op']} {row['op_shapes']}" if isinstance(row["op"], str) else None
    out["flops_analytic"], out["dram_bytes_analytic"] = flops, nbytes
    out["analytic_op"] = pd.Series(labels, index=out.index, dtype="object")
    matched = pd.notna(flops) | pd.notna(nbytes)
    out["analytic_source"] = pd.Series(["trace" if m else None for m in matched], index=out.index, dtype="object")
    warnings = [] if matched.any() else [
        ("--analytic: no kernel matched the trace by range path and name (is it the same program, with the "
         "same NVTX / record_function ranges?)")]
    params = {"analytic": {"source": "trace", "trace": trace.manifest.get("source", {}).get("path"),
                           "matched_kernels": int(matched.sum()),
                           "method": "k-th launch of a kernel name in a range path, matched to the same in the "
                                     "trace; the trace's analytic cost (perfscope's cost model of the launching op)"}}
    return with_analytic(report, out, params, warnings)
