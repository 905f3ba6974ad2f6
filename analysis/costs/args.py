"""What the framework cost formulas read: the op's recorded arguments by position, and the
:class:`OpContext` the trace gives around the call (the step's sequence sums from the vLLM step
annotation, the job's ranks from ``distributedInfo``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import OpInputs, Shape, itemsize, numel


@dataclass(frozen=True)
class StepAttention:
    """Sums over a step's sequences, for attention: query tokens ``sq``, key tokens ``sk``,
    ``sqsq`` = sum sq², ``sqsk`` = sum sq·sk. ``sk`` of a sequence counts its whole context
    (cached and new tokens)."""

    sq: int
    sk: int
    sqsq: int
    sqsk: int

    def pairs(self, *, causal: bool) -> float:
        """(query, key) pairs attended. Causal: query ``i`` of a sequence (0-based among its
        ``sq`` new tokens) sees ``sk - sq + i + 1`` keys, so a sequence contributes
        ``sq·sk - (sq² - sq)/2``; without a mask every query sees all ``sk`` keys."""
        if not causal:
            return float(self.sqsk)
        return float(self.sqsk) - (self.sqsq - self.sq) / 2.0

    def __add__(self, other: StepAttention) -> StepAttention:
        return StepAttention(self.sq + other.sq, self.sk + other.sk, self.sqsq + other.sqsq,
                             self.sqsk + other.sqsk)


@dataclass(frozen=True)
class OpContext:
    """What the trace says around one op call, beyond its own arguments.

    Attributes:
        attention: the sums of the step the call ran in (from the vLLM step annotation).
        world_size: ranks of the job (``distributedInfo``), for collectives and for the
            tensor-parallel share of a MoE layer.
    """

    attention: StepAttention | None = None
    world_size: int | None = None


VLLM_DETAILED = re.compile(r"(context|generation)_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)")
VLLM_SHORT_CONTEXT = re.compile(r"context_(\d+)\((\d+)_(\d+)\)")
VLLM_SHORT_GENERATION = re.compile(r"generation_(\d+)\((\d+)\)")


def step_attention(annotation: str | None) -> StepAttention | None:
    """The attention sums of a vLLM step annotation, or None when it is not one.

    ``execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)`` (the
    detailed form) gives every sum. The older ``execute_context_1(888_788544)_generation_0(0)``
    gives the prefill tokens and sum sq·sk, and the decode context: there sk is taken as sq
    for the prefills (no cached prefix, sqsq = sqsk), the decode sequences' sq as 1.
    """
    if not annotation or "execute" not in annotation:
        return None
    parts = VLLM_DETAILED.findall(annotation)
    if parts:
        total = StepAttention(0, 0, 0, 0)
        for _, _, sq, sk, sqsq, sqsk in parts:
            total = total + StepAttention(int(sq), int(sk), int(sqsq), int(sqsk))
        return total
    ctx, gen = VLLM_SHORT_CONTEXT.search(annotation), VLLM_SHORT_GENERATION.search(annotation)
    if ctx is None or gen is None:
        return None
    sq, sqsk = int(ctx.group(2)), int(ctx.group(3))
    seqs, sk_gen = int(gen.group(1)), int(gen.group(2))
    return StepAttention(sq, sq, sqsk, sqsk) + StepAttention(seqs, sk_gen, seqs, sk_gen)


def nbytes_of(shape: Shape, dtype: str | None) -> float:
    return float(numel(shape) * itemsize(dtype))


def tensor_arg(ins: OpInputs, pos: int) -> tuple[Shape, str] | None:
    if pos >= len(ins.shapes) or ins.shapes[pos] is None:
        return None
    return ins.shapes[pos] or [], ins.dtypes[pos] or "float"  # type: ignore[return-value]


def tensor_args(ins: OpInputs, *pos: int) -> list[tuple[Shape, str]] | None:
    out = [tensor_arg(ins, p) for p in pos]
    return None if any(t is None or not t[0] for t in out) else out  # type: ignore[misc,return-value]



def int_arg(ins: OpInputs, pos: int) -> int | None:
    """The integer ``Concrete Inputs`` value at ``pos`` (None when absent or not an integer)."""
    text = ins.concrete[pos] if pos < len(ins.concrete) else None
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
