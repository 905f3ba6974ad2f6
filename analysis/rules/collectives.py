"""What a collective kernel exchanged and in which pass, from what the trace records around it: the advice of
``exposed-comm`` follows these, not a paragraph chosen by the label.

- **kind** (:func:`collective_kind`): PyTorch's ProcessGroupNCCL records a range ``nccl:<collective>`` around each
  collective it issues (``nccl:all_reduce``, ``nccl:_all_gather_base``, ``nccl:all_to_all``); its c10d operators name
  it too (``c10d::allreduce_``, ``c10d::_reduce_scatter_base_``, ``c10d::alltoall_base_``); else the kernel's name
  (NCCL's ``ncclKernel_AllReduce_...`` / ``ncclDevKernel_AllGather_...``, RCCL's alike). The kernel name comes last:
  NCCL runs grouped point-to-point work and, in some versions, every collective as ``ncclKernel_SendRecv``, so a
  ``SendRecv`` kernel is a send/receive only where no range or operator says otherwise.
- **pass** (:func:`collective_pass`): the range path and operator around it, read from the innermost out:
  ``backward`` (``## backward ##``, ``*_bwd*``, autograd's ``...Backward``), ``optimizer`` (``Optimizer.step``,
  ``## optimizer ##``), ``forward``; ``unknown`` where none says.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from perfscope.schema import map_distinct

from ..intervals import inside, merge_intervals

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv", "barrier", "unknown")
"""The collective kinds :func:`collective_kind` tells apart."""

_SPELLINGS = (
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
    ("all_gather", re.compile(r"all_?gather", re.IGNORECASE)),
    ("all_reduce", re.compile(r"all_?reduce", re.IGNORECASE)),
    ("all_to_all", re.compile(r"all_?to_?all", re.IGNORECASE)),
    ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
    ("barrier", re.compile(r"barrier", re.IGNORECASE)),
    ("send_recv", re.compile(r"send_?recv|\b(?:c10d::)?(?:send|recv)_?\b|nccl:(?:send|recv)\b", re.IGNORECASE)),
)
"""Each kind's spellings, tried in this order, the first match wins (a TorchRec range such as
``reduce_scatter_base_bw (all_gather)`` names its own collective first)."""

NCCL_RANGE = re.compile(r"nccl:([A-Za-z_]+)")
"""ProcessGroupNCCL's range around a collective: ``nccl:all_reduce``, ``nccl:_all_gather_base``."""

_PASSES = (
    ("backward", re.compile(r"backward|_bwd\b|\bbwd\b|_bwd_", re.IGNORECASE)),
    ("optimizer", re.compile(r"optimizer|\.step\b|zero_grad", re.IGNORECASE)),
    ("forward", re.compile(r"forward|_fwd\b|\bfwd\b|_fwd_", re.IGNORECASE)),
)


def _kind_in(text: str) -> str | None:
    for kind, spelled in _SPELLINGS:
        if spelled.search(text):
            return kind
    return None


def collective_kind(name: object, op: object = None, path: object = None) -> tuple[str, str]:
    """The kind (:data:`KINDS`) of a collective kernel ``name`` launched by ``op`` under the range ``path``, and what
    said it (``range``, ``op``, ``name``, ``none``): the innermost ``nccl:<collective>`` range, else the operator's
    name, else the kernel's; ``unknown`` where none says."""
    if isinstance(path, str):
        found = NCCL_RANGE.findall(path)
        for inner in reversed(found):
            kind = _kind_in(inner)
            if kind is not None:
                return kind, "range"
    for text, source in ((op, "op"), (name, "name")):
        if isinstance(text, str) and text:
            kind = _kind_in(text)
            if kind is not None:
                return kind, source
    return "unknown", "none"


def unreliable_names(kinds: Sequence[tuple[str, str]], names: Sequence[object]) -> set[object]:
    """Kernel names that the trace shows running other collectives than their names say (NCCL versions that run
    every collective as ``ncclKernel_SendRecv``): a kind read from one of these names alone is not evidence."""
    out: set[object] = set()
    for (kind, source), name in zip(kinds, names):
        own = _kind_in(name) if isinstance(name, str) and source in ("range", "op") else None
        if own is not None and own != kind:
            out.add(name)
    return out


def collective_pass(op: object = None, path: object = None) -> str:
    """The pass a collective ran in: the innermost segment of the range ``path`` (then the operator ``op``) that
    names one of backward, optimizer or forward; ``unknown`` where none does."""
    parts = [p for p in (path.split("/") if isinstance(path, str) else []) if p]
    if isinstance(op, str) and op:
        parts.append(op)
    for part in reversed(parts):
        for phase, spelled in _PASSES:
            if spelled.search(part):
                return phase
    return "unknown"


def passes_by_time(ranges: pd.DataFrame, starts: np.ndarray, ranks: np.ndarray | None = None) -> np.ndarray:
    """For kernels launched at ``starts`` (of ``ranks``, where the ranges carry a ``rank``): the pass of the outermost
    pass ranges (a range whose name :func:`collective_pass` reads, no pass range above it in its ``path``, on any
    thread) that hold each time; ``unknown`` where none does, or ranges of two passes do. A collective issued from
    another thread than the step's (DDP's reducer on autograd's thread) records no pass on its own path; the step's
    ``## backward ##`` around it in time does. Each distinct name and path is read once (a thousand ranks repeat
    them)."""
    out = np.full(len(starts), "unknown", dtype=object)
    if not len(ranges) or not len(starts) or "name" not in ranges:
        return out
    phase = map_distinct(ranges["name"], lambda n: collective_pass(None, n)).to_numpy(object)
    above = (map_distinct(ranges["path"], lambda p: collective_pass(None, p.rsplit("/", 1)[0])
                          if isinstance(p, str) and "/" in p else "unknown").to_numpy(object)
             if "path" in ranges else np.full(len(ranges), "unknown", dtype=object))
    outer = (phase != "unknown") & (above == "unknown")
    if not outer.any():
        return out
    outer &= ranges["start_ns"].notna().to_numpy() & ranges["end_ns"].notna().to_numpy()
    r = ranges[outer]
    ph = phase[outer]
    rs, re_ = r["start_ns"].to_numpy(np.int64), r["end_ns"].to_numpy(np.int64)
    if ranks is not None and "rank" in r:  # each rank's own ranges, sliced from one sort by rank (no mask per rank)
        codes = pd.factorize(pd.concat([r["rank"].reset_index(drop=True), pd.Series(ranks)], ignore_index=True))[0]
        rk, qk = codes[:len(r)], codes[len(r):]
    else:
        rk, qk = np.zeros(len(r), np.int64), np.zeros(len(starts), np.int64)
    r_order, q_order = np.argsort(rk, kind="stable"), np.argsort(qk, kind="stable")
    bounds = np.arange(int(max(rk.max(initial=0), qk.max(initial=0))) + 2)
    r_cut, q_cut = np.searchsorted(rk[r_order], bounds), np.searchsorted(qk[q_order], bounds)
    for code in np.unique(qk[qk >= 0]):  # code -1: no rank
        mine_r = r_order[r_cut[code]:r_cut[code + 1]]
        at = q_order[q_cut[code]:q_cut[code + 1]]
        if not len(mine_r) or not len(at):
            continue
        t = starts[at]
        hits = np.zeros(len(at), dtype=np.int64)
        found = np.full(len(at), "unknown", dtype=object)
        for name in pd.unique(ph[mine_r]):  # per pass: does any of its ranges hold t
            mine = mine_r[ph[mine_r] == name]
            held = inside(merge_intervals(rs[mine], re_[mine]), t)
            hits += held
            found[held] = name
        one = hits == 1  # held by ranges of two passes (threads overlapping them): not told
        out[at[one]] = found[one]
    return out


ADVICE = {
    ("all_reduce", "backward"): (
        "gradient all-reduce in the backward pass: let it run during backward (DDP buckets: tune bucket_cap_mb, "
        "static_graph=True, no find_unused_parameters; gradient_as_bucket_view=True)"),
    ("all_reduce", "forward"): (
        "all-reduce in the forward pass (tensor-parallel layers, or a loss or metric reduction): overlap it with the "
        "next layer's independent work, fuse it with the norm after it (a custom all-reduce, as vLLM's and SGLang's), "
        "or split over fewer tensor-parallel ranks where the model fits"),
    ("all_reduce", "optimizer"): (
        "all-reduce in the optimizer step (gradient-norm clipping, an optimizer's statistics): reduce once per step, "
        "in one bucket, and start it before the step needs it"),
    ("all_reduce", None): (
        "all-reduce in a pass the trace does not name: gradients in training overlap with backward through DDP's "
        "buckets; a tensor-parallel forward's overlap with the next layer's work or fuse with the norm after it"),
    ("all_gather", "optimizer"): (
        "all-gather in the optimizer step (a sharded optimizer re-assembling its parameters): overlap it with the next "
        "forward pass (gather each shard just before its layer needs it)"),
    ("all_gather", None): (
        "parameter all-gathers (FSDP / ZeRO-3): prefetch the next unit's gather (FSDP forward_prefetch=True, "
        "backward_prefetch=BACKWARD_PRE) and wrap larger units so that fewer, larger gathers run"),
    ("reduce_scatter", None): (
        "gradient reduce-scatters (FSDP / ZeRO-2/3): let them run during backward behind the next unit's gradients "
        "(backward_prefetch), with larger units so that fewer, larger messages go"),
    ("all_to_all", None): (
        "all-to-all exchanges (sharded embedding tables, as TorchRec's, or expert-parallel MoE tokens): pipeline them "
        "against the neighbouring batch's compute (TorchRec's TrainPipelineSparseDist, MoE dispatch overlapped with "
        "the experts), balance the splits across ranks and send fewer bytes (quantized communication)"),
    ("send_recv", None): (
        "point-to-point sends and receives (pipeline-parallel stages, or an exchange built from them): more "
        "micro-batches per step (a 1F1B or interleaved schedule) hide them behind the other stages' compute"),
    ("broadcast", None): (
        "broadcasts (parameters or buffers synced from one rank: start-up, sync_module_states, DDP's buffer "
        "broadcast): where it recurs every step, broadcast_buffers=False removes DDP's"),
    ("barrier", None): (
        "barriers: each waits for the slowest rank and moves no data; drop the ones the data does not need"),
    ("unknown", None): (
        "collectives the trace does not name (no nccl: range, c10d operator or kernel name says which): record "
        "them with torch.profiler (record_shapes=True) to see which collective and pass each is"),
}
"""The advice for each (kind, pass), else the kind's for any pass (``None``)."""


def advice_for(kind: str, phase: str) -> str:
    """The advice for a collective ``kind`` in ``phase``: its own where :data:`ADVICE` has one, else its kind's."""
    return ADVICE.get((kind, phase)) or ADVICE.get((kind, None)) or ADVICE[("unknown", None)]


WORDS = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
         "all_to_all": "all-to-all", "broadcast": "broadcast", "send_recv": "send/recv", "barrier": "barrier",
         "unknown": "unnamed collective"}
"""How a kind reads in a label."""


__all__ = ["ADVICE", "KINDS", "WORDS", "advice_for", "collective_kind", "collective_pass", "passes_by_time", "unreliable_names"]
