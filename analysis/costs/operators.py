"""Analytic cost model: FLOPs and compulsory DRAM bytes of a framework operator from its input
shapes and dtypes (as torch.profiler records them: ``Input Dims`` and ``Input type``).

Conventions (the same as ``torch.utils.flop_counter`` where it has a formula):

- matmul family (mm, addmm, bmm, baddbmm, matmul, linear): 2·M·N·K, bias adds not counted;
- attention (scaled_dot_product_attention and its flash / efficient / cpu variants): its two
  batched matmuls, 2·B·H·L·S·E + 2·B·H·L·S·Ev; a causal mask is not discounted (as
  FlopCounterMode);
- elementwise ops: FLOPs per output element (:data:`FLOPS_PER_ELEMENT`, 1 unless named);
  reductions one FLOP per input element; data movement (copy, cat, embedding, index) zero FLOPs;
- bytes are the compulsory traffic: each tensor input read once, each output written once;
- view and metadata ops (view, transpose, expand, empty, ...) cost nothing.

An operator with no formula gets ``None`` (NaN in tables) and is listed by the caller, never
guessed. Output shapes are not recorded by the profiler, so each formula derives them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from .base import (
    ATTENTION,
    CATEGORY_OF,
    COPIES,
    ELEMENTWISE,
    FILLS,
    FLOPS_PER_ELEMENT,
    GATHERS,
    REDUCTIONS,
    SCATTERS,
    ZERO_COST,
    OpCost,
    OpInputs,
    Shape,
    _gemm,
    _nbytes,
    broadcast,
    itemsize,
    numel,
    parse_inputs,
)


def attention_flops(q: Shape, k: Shape, v: Shape, *, layout: str = "bhle") -> float:
    """FLOPs of softmax(QK^T)V without a mask, as its two batched matmuls (FlopCounterMode's
    formula; :func:`.attention.attention_cost` is the one formula, this its unmasked dense case).

    ``layout`` is ``bhle`` ([B, H, L, E], the SDPA convention) or ``blhe`` ([B, L, H, E], the
    ``_flash_attention_forward`` convention).
    """
    from .attention import _dense_cost

    cost = _dense_cost((q, "float"), (k, "float"), (v, "float"), "bshd" if layout == "blhe" else "bhsd",
                       causal=False, align="top_left")
    return cost.flops


def _attention(name: str, ins: OpInputs) -> OpCost | None:
    """aten's attention ops, by the one shape-driven formula (:func:`.attention.sdpa`)."""
    from .attention import sdpa

    return sdpa(name, ins)


def _elementwise(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if not t:
        return None
    out = broadcast(*[s for s, _ in t])
    per = FLOPS_PER_ELEMENT.get(name, 1)
    nbytes = sum(_nbytes(s, d) for s, d in t) + _nbytes(out, t[0][1])
    if name in ("eq", "ne", "lt", "le", "gt", "ge", "isinf", "isnan"):
        nbytes = sum(_nbytes(s, d) for s, d in t) + numel(out)
    category = "norm" if name in ("rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm") \
        else ("softmax" if "softmax" in name else "elementwise")
    return OpCost(float(per * numel(out)), nbytes, category)


def _reduced_shape(shape: Shape, ins: OpInputs) -> Shape:
    dims_text = next((c for c in ins.concrete[1:] if c is not None), None)
    try:
        dims = json.loads(dims_text) if dims_text else None
    except ValueError:
        dims = None
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, list) or not dims:
        return [1]
    nd = len(shape)
    keep = [i for i in range(nd) if i not in {d % nd for d in dims if isinstance(d, int)}]
    return [shape[i] for i in keep] or [1]


def _reduction(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if not t:
        return None
    shape, dtype = t[0]
    out = _reduced_shape(shape, ins)
    out_size = 8 if name in ("argmax", "argmin") else itemsize(dtype)
    if name in ("cumsum", "sort", "argsort"):
        out, out_size = shape, itemsize(dtype)
    return OpCost(float(numel(shape)), _nbytes(shape, dtype) + numel(out) * out_size, "reduction")


def _copy(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if not t:
        return None
    if name == "copy_" and len(t) >= 2:
        (dst, ddst), (src, dsrc) = t[0], t[1]
        return OpCost(0.0, _nbytes(dst, ddst) + _nbytes(src, dsrc), "memory")
    shape, dtype = t[0]
    return OpCost(0.0, 2 * _nbytes(shape, dtype), "memory")


SCALAR_TYPE_ITEMSIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 23: 1, 24: 1}
"""c10::ScalarType code (as ``Concrete Inputs`` print it) -> bytes per element."""


def _fill(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if t:
        return OpCost(0.0, _nbytes(*t[0]), "memory")
    shape = _concrete_list(ins.concrete[0] if ins.concrete else None)
    if name == "arange":
        values = [_concrete_number(c) for c in ins.concrete[:3]]
        numbers = [v for v in values if v is not None]
        if not numbers:
            return None
        start, end = (0.0, numbers[0]) if len(numbers) == 1 else (numbers[0], numbers[1])
        shape = [max(math.ceil(end - start), 0)]
    if shape is None:
        return None
    dtype_code = next((_concrete_number(c) for c in ins.concrete[1:2]), None)
    size = SCALAR_TYPE_ITEMSIZE.get(int(dtype_code), 4) if dtype_code is not None else 4
    return OpCost(0.0, float(numel(shape) * size), "memory")


def _concrete_list(text: str | None) -> list[int] | None:
    if not text or not text.startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return [int(v) for v in value] if isinstance(value, list) and all(isinstance(v, int) for v in value) else None


def _concrete_number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _gather(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if len(t) < 2:
        return None
    if name == "embedding":
        (w, dw), (idx, di) = t[0], t[1]
        rows = numel(idx) * (w[-1] if w else 1)
        return OpCost(0.0, _nbytes(idx, di) + 2.0 * rows * itemsize(dw), "memory")
    (src, ds), (idx, di) = t[0], t[-1]
    if name == "index_select" and len(src) >= 1:
        per_index = numel(src) // max(src[0], 1) if src else 1
        moved = numel(idx) * per_index * itemsize(ds)
    else:
        moved = numel(idx) * itemsize(ds)
    return OpCost(0.0, _nbytes(idx, di) + 2.0 * moved, "memory")


def _index(name: str, ins: OpInputs) -> OpCost | None:
    """``aten::index(self, indices)``: advanced indexing, a gather. It does no arithmetic, so its
    FLOPs are 0 whatever the indices. What it moves depends on them: with their shapes recorded
    (a tensor list), the output is their broadcast shape times the unindexed trailing dims, read
    once and written once, plus the int64 indices. PyTorch's profiler records the
    ``List[Optional[Tensor]]`` as ``[]`` (every trace seen so far), so the bytes are then missing,
    never guessed: the row counts as costed for FLOPs (MFU's coverage) and not for the roofline."""
    t = ins.tensors()
    if not t:
        return None
    src, ds = t[0]
    indices = next((lst for lst in ins.lists if lst), None)
    if not indices:
        return OpCost(0.0, math.nan, "memory")
    width = max(len(s) for s in indices)
    out = [1] * width
    for s in indices:  # numpy's broadcast of the index shapes
        for i, n in enumerate(s, start=width - len(s)):
            if n != 1 and out[i] not in (1, n):
                return None
            out[i] = n if n != 1 else out[i]
    moved = numel(out) * numel(src[len(indices):]) * itemsize(ds)
    return OpCost(0.0, sum(numel(s) * 8 for s in indices) + 2.0 * moved, "memory")


def _scatter(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if not t:
        return None
    values = t[-1]
    index_bytes = sum(_nbytes(s, d) for s, d in t[1:-1])
    if ins.lists and any(ins.lists):
        index_bytes += sum(numel(s) * 8 for lst in ins.lists if lst for s in lst)
    return OpCost(0.0, 2 * _nbytes(*values) + index_bytes, "memory")


def _cat(name: str, ins: OpInputs) -> OpCost | None:
    shapes = next((lst for lst in ins.lists if lst), None)
    if not shapes:
        return None
    dtype = next((d for d in ins.dtypes if d), "float")
    return OpCost(0.0, 2 * sum(_nbytes(s, dtype) for s in shapes), "memory")


def _norm(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if not t:
        return None
    x, dx = t[0]
    weights = sum(_nbytes(s, d) for s, d in t[1:])
    per = FLOPS_PER_ELEMENT.get(name, 4)
    return OpCost(float(per * numel(x)), 2 * _nbytes(x, dx) + weights, "norm")


def _zero(name: str, ins: OpInputs) -> OpCost:
    return OpCost(0.0, 0.0, "view")


Formula = Callable[[str, OpInputs], "OpCost | None"]


GEMMS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot")
NORMS = ("rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm")


def _registry() -> dict[str, Formula]:
    families: list[tuple[Iterable[str], Formula]] = [
        (GEMMS, _gemm), (ATTENTION, _attention), (ELEMENTWISE, _elementwise), (REDUCTIONS, _reduction),
        (COPIES, _copy), (FILLS, _fill), (GATHERS, _gather), (SCATTERS, _scatter), (NORMS, _norm),
        (("cat", "stack"), _cat), (ZERO_COST, _zero), (("index",), _index),
    ]
    return {name: formula for names, formula in families for name in names}


REGISTRY: dict[str, Formula] = _registry()
"""Operator base name (without ``aten::``) -> formula."""

COMPOSITE_WHEN_PARENT = frozenset({"reshape", "contiguous", "flatten", "to", "type_as"})
"""Ops that are free views when they have no child op, and delegate to a copying child when
they have one (so the child, not the op, is the costed row)."""


def base_name(op: str) -> str:
    """``aten::mm`` -> ``mm``; ``aten::add_.Tensor`` -> ``add_``."""
    name = op.split("::", 1)[-1]
    return name.split(".", 1)[0]


def formula_of(op: str) -> tuple[str, Formula] | None:
    """(the name the formula is called with, the formula) of ``op``: a framework op's own
    (:mod:`.costs_framework`, by qualified name) first, else the aten family of its base name.
    A non-aten op takes an aten formula only when its namespace is ``aten`` or ``prims`` or it
    has none (a framework op of the same base name has another argument order)."""
    from .framework import framework_formula, qualified

    own = framework_formula(op)
    if own is not None:
        return qualified(op), own
    ns = op.rpartition("::")[0]
    if ns not in ("", "aten", "prims"):
        return _by_name(op)
    name = base_name(op)
    formula = REGISTRY.get(name)
    return (name, formula) if formula is not None else None


def _by_name(op: str) -> tuple[str, Formula] | None:
    """Any other op whose name says attention: :func:`.attention.by_name` (its q, k, v read
    from its first tensors)."""
    from .attention import by_name, says_attention

    return (qualified_name(op), by_name) if says_attention(op) else None


def qualified_name(op: str) -> str:
    from .framework import qualified

    return qualified(op)


def needs_step(op: str) -> bool:
    """True when ``op``'s formula needs the step's sequence sums (a framework formula of
    :data:`.framework.NEEDS_STEP`, or an op priced by its attention name alone:
    :func:`.attention.by_name` reads the step for varlen inputs)."""
    from .attention import by_name
    from .framework import NEEDS_STEP, framework_formula

    if framework_formula(op) in NEEDS_STEP:
        return True
    found = formula_of(op)
    return found is not None and found[1] is by_name


def has_formula(op: str) -> bool:
    """True when the cost model knows ``op``."""
    return formula_of(op) is not None


def op_cost(op: str, dims: Any, types: Any, concrete: Any = None, context: Any = None) -> OpCost | None:
    """FLOPs and bytes of one operator call, or None when there is no formula or the shapes
    don't fit it. The one entry point for the cost of an op row (Kineto import, graph replays).

    Args:
        op: operator name as recorded (``aten::addmm``, ``vllm::unified_attention_with_output``).
        dims: the ``Input Dims`` list.
        types: the ``Input type`` list.
        concrete: the ``Concrete Inputs`` list (scalars such as reduction dims), if recorded.
        context: an :class:`.costs_framework.OpContext` (the step's sequence sums, the job's
            ranks) for the framework ops that need it; aten formulas ignore it.

    Examples:
        >>> op_cost("aten::mm", [[4, 8], [8, 16]], ["float", "float"]).flops
        1024.0
    """
    found = formula_of(op)
    if found is None:
        return None
    name, formula = found
    if context is None:
        from .framework import OpContext

        context = OpContext()
    try:
        return formula(name, parse_inputs(dims, types, concrete, context))
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return None


MATMUL_CATEGORIES = ("gemm", "attention")
"""Categories of the ops and kernels that do matrix multiplies."""
ASIDE_BY_NAME = ("elementwise", "memory")
"""Name-only categories (:func:`category_of` without the op) of the kernels a matmul op launches beside its
work (:func:`launched_aside`). A reduction kernel is not one: under a matmul op it is the split-K / split-KV
combine of the op's own work (cuBLAS ``splitKreduce_kernel``, vLLM's ``reduce_segments``)."""


def category_of(op: str | None, kernel_name: str | None = None) -> str:
    """A coarse category for an op or kernel name: gemm, attention, comm, memory, ...

    The op's category, else the kernel name's; a collective kernel is ``comm`` whatever launched it, and a
    kernel a matmul op launched beside its work (:func:`launched_aside`) keeps its own name's category."""
    by_name = _name_category(kernel_name)
    if by_name == "comm" or not op:
        return by_name
    own = _op_category(op)
    return by_name if own is None or _aside(own, by_name) else own


def launched_aside(op: str | None, kernel_name: str | None) -> bool:
    """True when a kernel ``op`` launched is not the op's own matmul: the op is a GEMM or attention op and the
    kernel's name says element-wise or copy (``aten::addmm``'s bias copy, an ``elementwise_kernel`` before the
    cuBLAS or Tensile GEMM). Such a kernel takes none of the op's FLOPs or bytes
    (:func:`..readers.kineto.ops.split_by_time`)."""
    return bool(op) and _aside(_op_category(str(op)), _name_category(kernel_name))


def _aside(op_category: str | None, name_category: str) -> bool:
    return op_category in MATMUL_CATEGORIES and name_category in ASIDE_BY_NAME


def _op_category(op: str) -> str | None:
    """The category an op's name gives (None: its name says none)."""
    from .framework import framework_category

    own = framework_category(op)
    if own is not None:
        return own
    name = base_name(op)
    if _by_name(op) is not None:
        return "attention"
    if name in CATEGORY_OF["gemm"]:
        return "gemm"
    if name in ATTENTION:
        return "attention"
    if name in ZERO_COST:
        return "view"
    if name in COPIES or name in GATHERS or name in SCATTERS or name in FILLS or name in ("cat", "stack"):
        return "memory"
    if name in REDUCTIONS:
        return "reduction"
    if "norm" in name:
        return "norm"
    if "softmax" in name:
        return "softmax"
    if name in ELEMENTWISE:
        return "elementwise"
    return None


def _name_category(kernel_name: str | None) -> str:
    """The category a kernel's name alone gives (``other``: none)."""
    text = (kernel_name or "").lower()
    if any(s in text for s in ("nccl", "allreduce", "all_reduce", "allgather", "reducescatter",
                               "all_to_all", "alltoall", "sendrecv")):
        return "comm"
    if any(s in text for s in ("flash", "fmha", "attention", "attn", "sdpa")):
        return "attention"  # before the GEMM markers: cuDNN's flash kernels are named ..._sm90_flash_fprop_wgmma_...
    if any(s in text for s in ("gemm", "cutlass", "cublas", "nvjet", "xmma", "sm90_", "sm80_", "wgmma", "matmul")):
        return "gemm"
    if "memcpy" in text or "memset" in text or "copy" in text:
        return "memory"
    if "elementwise" in text or "vectorized" in text:
        return "elementwise"
    if "reduce" in text or "norm" in text:
        return "reduction"
    return "other"
