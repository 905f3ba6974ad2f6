"""The floor of the cost model that every formula module builds on: the op's inputs as the profiler
records them (:class:`OpInputs`), a cost (:class:`OpCost`), dtype sizes and names, the operator tables
(elementwise, reductions, copies, gathers, categories), and the GEMM formula (2·M·N·K) that the
quantized and framework formulas reuse. :mod:`.operators` (aten formulas and the dispatcher),
:mod:`.args`, :mod:`.attention`, :mod:`.quantized` and :mod:`.framework` import it; it imports
none of them, so the cost model has no import cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

Shape = list[int]

ITEMSIZE = {
    "float": 4, "float32": 4, "double": 8, "float64": 8,
    "c10::half": 2, "half": 2, "float16": 2, "c10::bfloat16": 2, "bfloat16": 2,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "c10::float8_e4m3fnuz": 1,
    "c10::float8_e5m2fnuz": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "long int": 8, "int64": 8, "long": 8, "int": 4, "int32": 4, "short int": 2, "int16": 2,
    "signed char": 1, "int8": 1, "unsigned char": 1, "uint8": 1, "bool": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}
"""Bytes per element for the dtype names torch.profiler writes (``Input type``) and torch's own."""

DTYPE_NAMES = {
    "float": "float32", "double": "float64", "c10::half": "float16", "c10::bfloat16": "bfloat16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool", "c10::float8_e4m3fn": "float8_e4m3fn",
    "c10::float8_e5m2": "float8_e5m2",
}
"""Profiler dtype names -> torch dtype names (``float`` -> ``float32``)."""

FLOPS_PER_ELEMENT = {
    "silu": 4, "silu_": 4,          # x * sigmoid(x): exp, add, div, mul
    "sigmoid": 3, "gelu": 8, "tanh": 4,
    "softmax": 5, "_softmax": 5, "log_softmax": 5, "_log_softmax": 5,  # max, sub, exp, sum, div
    "rms_norm": 4, "_fused_rms_norm": 4,   # square, mean, rsqrt, scale
    "layer_norm": 5, "native_layer_norm": 5,
}
"""Named FLOPs per output element; every other elementwise op counts 1."""

ZERO_COST = frozenset({
    "view", "_unsafe_view", "t", "transpose", "permute", "expand", "expand_as", "as_strided",
    "unsqueeze", "squeeze", "slice", "select", "narrow", "detach", "alias", "empty",
    "empty_like", "empty_strided", "resolve_conj", "resolve_neg", "lift_fresh", "split",
    "split_with_sizes", "chunk", "unbind", "view_as", "reshape", "flatten", "unflatten",
    "contiguous", "result_type", "is_nonzero", "item", "_local_scalar_dense", "lift_fresh_copy",
    "set_", "resize_", "_reshape_alias", "numpy_T", "movedim", "diagonal", "unfold",
    "_has_compatible_shallow_copy_type", "stride", "size", "dim", "is_same_size", "record_stream",
    "detach_", "_unsafe_view_", "requires_grad_", "_nested_tensor_from_mask_left_aligned", "to", "type_as",
})
"""Metadata-only ops. ``reshape``/``contiguous``/``flatten`` copy through a child op when they
have to, and that child is costed on its own."""

ELEMENTWISE = frozenset({
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "pow_", "neg", "neg_",
    "rsqrt", "rsqrt_", "sqrt", "exp", "exp_", "log", "cos", "sin", "abs", "reciprocal",
    "maximum", "minimum", "clamp", "clamp_", "clamp_min", "clamp_max", "where", "masked_fill",
    "masked_fill_", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_not", "relu", "relu_", "silu", "silu_", "gelu",
    "sigmoid", "tanh", "rsub", "floor_divide", "remainder", "fmod", "triu", "tril", "lerp",
    "addcmul", "addcdiv", "softmax", "_softmax", "log_softmax", "_log_softmax", "erf",
    "view_as_complex", "view_as_real", "sign", "round", "floor", "ceil", "isinf", "isnan",
    "nan_to_num", "sigmoid_", "mish", "hardtanh", "leaky_relu", "square", "mul_scalar",
})
"""Ops whose output is the broadcast of their tensor inputs, one value per element."""

REDUCTIONS = frozenset({
    "mean", "sum", "amax", "amin", "max", "min", "argmax", "argmin", "norm", "var", "std",
    "prod", "all", "any", "logsumexp", "cumsum", "topk", "sort", "argsort",
})

FILLS = frozenset({"fill_", "zero_", "zeros", "ones", "full", "arange", "zeros_like",
                   "ones_like", "full_like", "normal_", "uniform_", "random_", "rand", "randn",
                   "exponential_", "bernoulli_"})
"""Ops that only write their output (their first tensor input, or an output we cannot size)."""

COPIES = frozenset({"copy_", "clone", "_to_copy", "_copy_from", "roll", "flip"})
"""Ops that read their input once and write an output of its size (``roll``, ``flip``: the same
elements moved; the engine's RoPE rotates with ``roll``)."""

GATHERS = frozenset({"embedding", "index_select", "gather", "index", "take"})
SCATTERS = frozenset({"index_put_", "index_put", "index_copy_", "index_copy", "scatter_",
                      "scatter", "index_add_", "_index_put_impl_", "slice_scatter",
                      "select_scatter"})

ATTENTION = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
    "_efficient_attention_forward", "_flash_attention_forward",
})

CATEGORIES = ("gemm", "attention", "comm", "memory", "view", "reduction", "norm", "softmax", "elementwise", "other")
"""Every category :func:`category_of` returns (each has its own colour in the figures)."""

CATEGORY_OF = {"gemm": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv",
                        "dot", "_scaled_mm", "einsum", "conv2d", "convolution")}
"""Ops that run as GEMM kernels, priced or not (``_scaled_mm``, convolutions have no formula yet)."""


@dataclass(frozen=True)
class OpCost:
    """FLOPs, compulsory bytes and a category for one operator call."""

    flops: float
    bytes: float
    category: str
    precision: str | None = None
    """The math precision when the dtypes do not say it (an fp8 GEMM), else None."""


@dataclass(frozen=True)
class OpInputs:
    """The recorded inputs of one call: shapes and dtype names aligned by position.

    Non-tensor inputs (scalars, lists, None) have ``shape`` None. Tensor lists (``cat``) are a
    list of shapes in ``lists``.
    """

    shapes: list[Shape | None]
    dtypes: list[str | None]
    lists: list[list[Shape] | None]
    concrete: list[str | None]
    context: Any = None
    """The :class:`.costs_framework.OpContext` of the call (framework formulas read it)."""

    def tensors(self) -> list[tuple[Shape, str]]:
        return [(s, d or "float") for s, d in zip(self.shapes, self.dtypes) if s is not None]


def _is_tensor_type(t: Any) -> bool:
    return isinstance(t, str) and t not in ("", "Scalar", "ScalarList", "TensorList",
                                            "GenericList", "None", "Device", "Layout")


def parse_inputs(dims: Any, types: Any, concrete: Any = None, context: Any = None) -> OpInputs:
    """Normalise the profiler's ``Input Dims`` / ``Input type`` / ``Concrete Inputs`` lists."""
    dims = dims if isinstance(dims, list) else []
    types = types if isinstance(types, list) else []
    concrete = concrete if isinstance(concrete, list) else []
    shapes: list[Shape | None] = []
    lists: list[list[Shape] | None] = []
    dtypes: list[str | None] = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else None
        is_list = isinstance(d, list) and bool(d) and all(isinstance(x, list) for x in d)
        if t == "TensorList" or is_list:
            lists.append([list(map(int, x)) for x in d if isinstance(x, list)])
            shapes.append(None)
            dtypes.append(None)
            continue
        lists.append(None)
        tensor = _is_tensor_type(t) or (t is None and isinstance(d, list) and bool(d))
        if tensor and isinstance(d, list) and all(isinstance(x, (int, float)) for x in d):
            shapes.append([int(x) for x in d])
            dtypes.append(str(t).lower() if t else None)
        else:
            shapes.append(None)
            dtypes.append(None)
    conc = [c if isinstance(c, str) and c != "" else None for c in concrete]
    conc += [None] * (len(dims) - len(conc))
    return OpInputs(shapes, dtypes, lists, conc, context)


def numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def itemsize(dtype: str | None) -> int:
    return ITEMSIZE.get((dtype or "float").lower(), 4)


def _nbytes(shape: Sequence[int], dtype: str | None) -> float:
    return float(numel(shape) * itemsize(dtype))


def broadcast(*shapes: Sequence[int]) -> Shape:
    """Broadcast shape of several shapes (numpy rules)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        dims = [s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0]
        big = [d for d in dims if d != 1]
        out.append(max(big) if big else 1)
    return out


def _matmul_flops_and_out(a: Shape, b: Shape) -> tuple[float, Shape] | None:
    if not a or not b:
        return None
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return None
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch = broadcast(a2[:-2], b2[:-2])
    out = batch + [m, n]
    if len(a) == 1:
        out = batch + [n]
    if len(b) == 1:
        out = batch + [m] if len(a) > 1 else batch
    return 2.0 * numel(batch) * m * n * k, out


def _gemm(name: str, ins: OpInputs) -> OpCost | None:
    t = ins.tensors()
    if name in ("addmm", "baddbmm", "addmv"):
        if len(t) < 3:
            return None
        bias, (a, da), (b, db) = t[0], t[1], t[2]
        res = _matmul_flops_and_out(a, b)
        if res is None:
            return None
        flops, out = res
        nbytes = _nbytes(bias[0], bias[1]) + _nbytes(a, da) + _nbytes(b, db) + _nbytes(out, da)
        return OpCost(flops, nbytes, "gemm")
    if name == "linear":
        if len(t) < 2:
            return None
        (x, dx), (w, dw) = t[0], t[1]
        if len(w) != 2 or not x or x[-1] != w[1]:
            return None
        out = x[:-1] + [w[0]]
        flops = 2.0 * numel(x[:-1]) * w[0] * w[1]
        nbytes = _nbytes(x, dx) + _nbytes(w, dw) + _nbytes(out, dx)
        if len(t) >= 3:
            nbytes += _nbytes(t[2][0], t[2][1])
        return OpCost(flops, nbytes, "gemm")
    if len(t) < 2:
        return None
    (a, da), (b, db) = t[0], t[1]
    res = _matmul_flops_and_out(a, b)
    if res is None:
        return None
    flops, out = res
    return OpCost(flops, _nbytes(a, da) + _nbytes(b, db) + _nbytes(out, da), "gemm")
