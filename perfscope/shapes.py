"""The one reader of an operator's ``op_shapes`` text (its inputs' tensor shapes), for every module that reads it.

The forms it accepts are those the readers and the tables perfscope reads write:

- Kineto's reader (``analysis/readers/kineto/ops.py``): compact JSON of torch.profiler's ``Input Dims``,
  one entry per input, ``[]`` for a scalar or an absent input, a list of shapes for a tensor list:
  ``[[8,2,38],[8,38,128],[]]``, ``[[[32],[32]],[[32],[32]],[]]``;
- TraceLens's perf-report tables: the same JSON with spaces (``gemm_kernel_times.csv``: ``[[8944, 1024],
  [1024, 2816]]``) or Python's literal form with tuples (``ops_unique_args.csv``: ``((32, 4096), (4096,
  4096))``).

The Nsight Systems and rocprof readers write no ``op_shapes`` (their traces record no operator inputs). Each
distinct text is parsed once (:func:`parse_shapes` is memoized per string), so a kernel table of millions of
launches of a few hundred distinct shapes pays a few hundred parses.
"""

from __future__ import annotations

import ast
import functools
import json
from typing import Any

Shapes = tuple[Any, ...]
"""An operator's inputs, one entry each: a tensor's shape as a tuple of ints, ``()`` a scalar or absent input, a
tensor list as a tuple of shapes."""

CACHE_SIZE = 1 << 16
"""Distinct ``op_shapes`` texts kept parsed (a trace holds hundreds to a few thousand)."""


def _frozen(v: Any) -> Any:
    """Lists and tuples as tuples, all the way down (a memoized value must not be changed by a caller)."""
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


@functools.lru_cache(maxsize=CACHE_SIZE)
def _parse(text: str) -> Shapes | None:
    s = text.strip()
    if not s:
        return None
    try:
        v = json.loads(s)
    except ValueError:
        try:  # Python's literal form: tuples, None
            v = ast.literal_eval(s)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    except RecursionError:
        return None
    return _frozen(v) if isinstance(v, (list, tuple)) else None


def parse_shapes(text: object) -> Shapes | None:
    """An operator's input shapes from its ``op_shapes`` text (the forms in this module's docstring), as nested
    tuples; None where ``text`` is not text or not a list of inputs. Memoized per distinct string."""
    return _parse(text) if isinstance(text, str) else None


def is_shape(entry: object) -> bool:
    """Whether an input entry is one tensor's shape (a tuple of ints; ``()`` for a scalar counts)."""
    return isinstance(entry, tuple) and all(isinstance(d, int) and not isinstance(d, bool) for d in entry)


def tensor_shapes(text: object) -> list[tuple[int, ...]]:
    """One tensor shape per input of ``op_shapes`` text, ``()`` for an input that is not one tensor (a scalar, a
    tensor list, None); ``[]`` where the text gives no inputs."""
    shapes = parse_shapes(text)
    return [e if is_shape(e) else () for e in shapes] if shapes else []


def shapes_text(text: object, most: int = 3) -> str | None:
    """The tensor shapes of an operator's inputs as words: ``[[8,2,38],[8,38,128],[]]`` -> ``8x2x38, 8x38x128``
    (the first ``most`` tensors; scalars and tensor lists left out); None when none."""
    out = ["x".join(str(d) for d in s) for s in tensor_shapes(text) if s]
    return ", ".join(out[:most]) or None


__all__ = ["Shapes", "is_shape", "parse_shapes", "shapes_text", "tensor_shapes"]
