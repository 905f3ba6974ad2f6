"""Work at new shapes: an operator's recorded shapes rewritten for another batch, prompt, context or
dtype, and its cost formula evaluated again (:func:`perfscope.analysis.costs.operators.op_cost`).

The rules, per operator family (``docs/whatif.md``):

- **GEMM with a 2-D weight** (``mm``, ``addmm``, ``linear``, ``matmul`` whose second operand is a
  matrix): the activation's rows (every dimension but the last) are the step's tokens, scaled by
  ``tokens_new / tokens_old``, or, when they are one per sequence (a prefill's LM head on each
  sequence's last token), by the batch ratio; the weight keeps its shape and takes ``--weights-dtype``;
- **attention** (SDPA and its flash / efficient / cuDNN forms): q ``[B, H, Lq, E]`` takes the new
  batch and query length, k and v ``[B, Hkv, S, E]`` the new batch and KV length (the step's context,
  or the KV cache's capacity when they were allocated at it) and ``--kv-dtype``;
- **every other operator**: in each tensor of two or more dimensions, the leading dimension is the
  batch when it equals it (or, at batch 1, in tensors of three or more dimensions), a 2-D tensor's
  first dimension is the step's tokens when it equals them, and any other dimension but the last that
  equals the step's query length, context or KV capacity takes the new value; the last dimension is a feature (hidden size, head size, vocabulary) and is
  kept; a 1-D tensor is kept, unless it is the op's first input and as long as the step's tokens
  (positions, a per-token counter), when it takes the new token count. A 4-D tensor whose KV-length axis equals the cache capacity takes
  ``--kv-dtype`` (the cache itself).

Each kernel keeps its share of the op's cost: its FLOPs and bytes are multiplied by the op's new /
old cost. A kernel whose op has no formula keeps its work and is counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfscope.shapes import parse_shapes

from ..costs.base import ATTENTION
from ..costs.operators import base_name, op_cost

TORCH_DTYPES = {"bf16": "c10::BFloat16", "bfloat16": "c10::BFloat16", "fp16": "c10::Half", "float16": "c10::Half",
                "half": "c10::Half", "fp32": "float", "float32": "float", "fp8": "c10::Float8_e4m3fn",
                "float8_e4m3fn": "c10::Float8_e4m3fn", "int8": "signed char"}
"""``--weights-dtype`` / ``--kv-dtype`` values -> the dtype names torch.profiler records."""

LOW_PRECISION_GEMM = {"fp8": "fp8", "float8_e4m3fn": "fp8", "int8": "int8"}
"""Weight dtypes whose GEMMs are taken to run in that precision (W8A8: activations quantised too)."""

WEIGHT_GEMMS = ("mm", "addmm", "linear", "matmul")


@dataclass(frozen=True)
class Dims:
    """The sizes of one step that shapes are rewritten by."""

    batch: int
    q_len: int
    context: int
    capacity: int

    @property
    def tokens(self) -> int:
        return self.batch * self.q_len


def _thaw(v: Any) -> Any:
    return [_thaw(x) for x in v] if isinstance(v, tuple) else v


def parse_lists(text: Any) -> list[Any] | None:
    """The recorded shapes, dtypes or concrete inputs (a trace's ``op_shapes``, a TraceLens table's ``Input Dims``,
    ``Input type``, ``Concrete Inputs``; the one reader, :func:`perfscope.shapes.parse_shapes`) as fresh lists, the
    form the cost formulas (:func:`perfscope.analysis.costs.operators.op_cost`) read and :func:`rewrite` may change."""
    value = parse_shapes(text)
    return _thaw(value) if value is not None else None


def _is_shape(s: Any) -> bool:
    return isinstance(s, list) and bool(s) and all(isinstance(x, (int, float)) for x in s)


def _generic(shape: list[int], old: Dims, new: Dims) -> list[int]:
    if len(shape) < 2:
        return shape
    out = list(shape)
    subs = {}
    for o, n in ((old.q_len, new.q_len), (old.context, new.context), (old.capacity, new.capacity)):
        if o > 1 and o not in subs:
            subs[o] = n
    start = 0
    if (old.batch > 1 and shape[0] == old.batch) or (old.batch == 1 and len(shape) >= 3 and shape[0] == 1):
        out[0] = new.batch if old.batch > 1 or shape[0] == 1 else shape[0]
        start = 1
    elif len(shape) == 2 and shape[0] == old.tokens:
        out[0] = new.tokens
        start = 1
    for i in range(start, len(shape) - 1):
        if shape[i] in subs:
            out[i] = subs[shape[i]]
    return out


def _kv_len(s: int, old: Dims, new: Dims) -> int:
    for o, n in ((old.capacity, new.capacity), (old.context, new.context), (old.q_len, new.q_len)):
        if s == o:
            return n
    return s


def _weight_gemm(name: str, shapes: list[Any]) -> tuple[int, int] | None:
    """(activation position, weight position) of a GEMM with a 2-D weight, else None."""
    if name not in WEIGHT_GEMMS:
        return None
    tensors = [i for i, s in enumerate(shapes) if _is_shape(s)]
    if len(tensors) < 2:
        return None
    a_pos, w_pos = (tensors[1], tensors[2]) if name == "addmm" and len(tensors) >= 3 else (tensors[0], tensors[1])
    return (a_pos, w_pos) if len(shapes[w_pos]) == 2 else None


def _rows(a: list[int]) -> int:
    return math.prod(a[:-1]) if len(a) > 1 else 1


def _new_rows(rows: int, old: Dims, new: Dims) -> int:
    """A GEMM's activation rows at the new sizes: the step's tokens scaled, or the batch when they are one
    row per sequence (the LM head on each sequence's last token)."""
    if rows == old.batch and rows != old.tokens:
        return max(1, round(rows * new.batch / old.batch))
    return max(1, round(rows * new.tokens / max(old.tokens, 1)))


def gemm_rows(op: Any, shapes_text: Any, types_text: Any, old: Dims, new: Dims) -> tuple[int, int, int, int, str] | None:
    """(rows before, rows after, N, K, weight dtype) of a GEMM with a 2-D weight at the new step sizes (the
    keys of a :mod:`perfscope.collectors.gemm_curve` row), else None. N and K are the weight's output and
    input features whichever way it is laid out (``linear``'s [N, K], ``mm``'s [K, N])."""
    if not isinstance(op, str):
        return None
    shapes, types = parse_lists(shapes_text), parse_lists(types_text)
    if shapes is None:
        return None
    shapes = [list(s) if _is_shape(s) else s for s in shapes]
    gemm = _weight_gemm(base_name(op), shapes)
    if gemm is None:
        return _split_gemm_rows(base_name(op), shapes, types, old, new)
    a, w = shapes[gemm[0]], shapes[gemm[1]]
    k = int(a[-1])
    n = int(w[1] if w[0] == k and w[1] != k else w[0])
    wtype = types[gemm[1]] if types is not None and gemm[1] < len(types) else None
    rows = _rows(a)
    return int(rows), _new_rows(rows, old, new), n, k, str(wtype)


def _split_gemm_rows(name: str, shapes: list[Any], types: list[Any] | None, old: Dims,
                     new: Dims) -> tuple[int, int, int, int, str] | None:
    """A weight split by rows across threads (the engine's CPU ``Linear`` at a few rows: ``matmul`` of
    x [rows, K] by the weight viewed as [P, K, N/P]): rows before and after, N = P x N/P, K, dtype."""
    tensors = [i for i, s in enumerate(shapes) if _is_shape(s)]
    if name != "matmul" or len(tensors) < 2:
        return None
    a, w = shapes[tensors[0]], shapes[tensors[1]]
    if len(a) != 2 or len(w) != 3 or a[-1] != w[1]:
        return None
    wtype = types[tensors[1]] if types is not None and tensors[1] < len(types) else None
    return int(a[0]), _new_rows(int(a[0]), old, new), int(w[0] * w[2]), int(w[1]), str(wtype)


def rewrite(op: str, shapes: list[Any], types: list[Any], old: Dims, new: Dims, *,
            weights_dtype: str | None = None, kv_dtype: str | None = None) -> tuple[list[Any], list[Any]]:
    """The op's input shapes and dtypes at the new step sizes (see the module docstring)."""
    name = base_name(op)
    shapes = [list(s) if _is_shape(s) else s for s in shapes]
    types = list(types) + [None] * (len(shapes) - len(types))
    wd = TORCH_DTYPES.get(weights_dtype or "", None)
    kd = TORCH_DTYPES.get(kv_dtype or "", None)
    tensors = [i for i, s in enumerate(shapes) if _is_shape(s)]
    gemm = _weight_gemm(name, shapes)
    if gemm is not None:
        a_pos, w_pos = gemm
        a = shapes[a_pos]
        shapes[a_pos] = [_new_rows(_rows(a), old, new), a[-1]] if len(a) > 1 else a
        if wd:
            types[w_pos] = wd
        return shapes, types
    if name in ATTENTION and len(tensors) >= 3:
        blhe = name in ("_flash_attention_forward", "_efficient_attention_forward")
        for j, pos in enumerate(tensors[:3]):
            s = shapes[pos]
            if len(s) != 4:
                continue
            seq_axis = 1 if blhe else 2
            s = list(s)
            s[0] = new.batch if s[0] in (old.batch, 1) else s[0]
            s[seq_axis] = new.q_len if j == 0 and s[seq_axis] == old.q_len else _kv_len(s[seq_axis], old, new) if j else s[seq_axis]
            shapes[pos] = s
            if j and kd:
                types[pos] = kd
        for pos in tensors[3:]:
            shapes[pos] = _generic(shapes[pos], old, new)
            if len(shapes[pos]) == 4:  # the mask [B, 1, Lq, S]: its last axis is the KV length
                shapes[pos][-1] = _kv_len(shapes[pos][-1], old, new)
        return shapes, types
    for n_th, pos in enumerate(tensors):
        s = shapes[pos]
        if n_th == 0 and len(s) == 1 and s[0] == old.tokens:  # a per-token vector as the op's first input
            shapes[pos] = [new.tokens]
            continue
        shapes[pos] = _generic(s, old, new)
        if kd and len(s) == 4 and s[-2] == old.capacity and old.capacity > 1:
            types[pos] = kd
    return shapes, types


def recost(op: Any, shapes_text: Any, types_text: Any, old: Dims, new: Dims, *,
           weights_dtype: str | None = None, kv_dtype: str | None = None) -> tuple[float, float] | None:
    """(FLOPs ratio, bytes ratio) of ``op`` at the new sizes over its recorded sizes; None when the op
    has no formula (or its shapes do not fit it)."""
    if not isinstance(op, str):
        return None
    shapes, types = parse_lists(shapes_text), parse_lists(types_text)
    if shapes is None or types is None:
        return None
    before = op_cost(op, shapes, types)
    if before is None:
        return None
    ns, nt = rewrite(op, shapes, types, old, new, weights_dtype=weights_dtype, kv_dtype=kv_dtype)
    after = op_cost(op, ns, nt)
    if after is None:
        return None

    def ratio(a: float, b: float) -> float:
        return 1.0 if b == 0 and a == 0 else (a / b if b else math.nan)

    return ratio(after.flops, before.flops), ratio(after.bytes, before.bytes)
