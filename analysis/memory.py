"""Memory timeline: allocation events in, the ``memory`` table out (allocated and reserved bytes
over time, each allocation paired with its free and given a category).

Every source (Kineto ``[memory]`` events, CUDA memory snapshots, ``export_memory_timeline``)
reduces its events to :class:`MemEvents` (one device's events in time order) and calls
:func:`timeline`. The category rules are written down in docs/memory.md; :func:`categorize`
applies them in order, the first that matches wins, and ``category_rule`` says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

ALLOC, FREE, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, OOM = range(6)
ACTIONS = ("alloc", "free", "free_completed", "segment_alloc", "segment_free", "oom")
"""Action codes of :class:`MemEvents` and their names in the ``memory`` table."""

CATEGORIES = ("weights", "kv_cache", "activations", "workspace", "optimizer", "gradient", "cuda_graph_pool",
              "unknown")
"""Categories of an allocation; ``fragmentation`` (reserved but not allocated) is a quantity over
time, not an allocation's category (:func:`perfscope.analysis.summaries.memory.by_category`)."""

HINT_CATEGORIES = {"kv_cache", "optimizer", "gradient", "workspace", "cuda_graph_pool", "weights", "activations"}
"""Hints a source can give per event (snapshot frames, the engine's known tensors) that name a category."""


@dataclass
class MemEvents:
    """One device's allocation events, in time order.

    Attributes:
        device: ``cuda:0``, ``cpu``.
        t_ns: event times on the report's timeline.
        action: codes of :data:`ACTIONS`.
        size: bytes (positive) of the block or segment.
        addr: block address (NaN when unknown).
        stream: CUDA stream (NaN when unknown).
        op, module, source, hint: per event (None when unknown); ``hint`` a category a source knows.
        total_allocated / total_reserved: the allocator's own totals after the event, when the
            source records them (Kineto); NaN otherwise.
        preexisting: (addr, size, op, module, source, hint) of allocations made before the record
            began that are known from elsewhere (a snapshot's segments, the engine's tensors).
        reserved_start: bytes reserved when the record began (None: unknown).
        known_in_totals: ``total_allocated`` counts the ``preexisting`` allocations (a GPU caching
            allocator's totals do; torch's CPU allocator counts only what it saw while profiling).
    """

    device: str
    t_ns: np.ndarray
    action: np.ndarray
    size: np.ndarray
    addr: np.ndarray
    stream: np.ndarray | None = None
    op: np.ndarray | None = None
    module: np.ndarray | None = None
    source: np.ndarray | None = None
    hint: np.ndarray | None = None
    total_allocated: np.ndarray | None = None
    total_reserved: np.ndarray | None = None
    preexisting: list[tuple[Any, ...]] = field(default_factory=list)
    reserved_start: float | None = None
    known_in_totals: bool = True


def _objs(values: np.ndarray | None, n: int) -> np.ndarray:
    return np.full(n, None, dtype=object) if values is None else np.asarray(values, dtype=object)


def timeline(ev: MemEvents, memory_source: str, *, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``memory`` rows of one device: pre-existing allocations first (at the first event's
    time), then every event, with ``allocated_bytes`` replayed from the events.

    Pairing: a free (``free``, or ``free_completed`` of a block whose ``free`` was not recorded)
    takes the live allocation at its address; a free with no live allocation there was made
    before the record began and becomes a pre-existing allocation. ``allocated_bytes`` is the
    running sum of ``delta_bytes`` over the rows; where the source records its own total
    (Kineto's ``Total Allocated``), the replay starts from the total before the first event, so
    the two agree at every event when no event is lost.
    """
    n = len(ev.t_ns)
    t = np.asarray(ev.t_ns, dtype="int64")
    action = np.asarray(ev.action, dtype="int8")
    size = np.abs(np.asarray(ev.size, dtype="float64"))
    addr = np.asarray(ev.addr, dtype="float64")
    op, module, source, hint = (_objs(v, n) for v in (ev.op, ev.module, ev.source, ev.hint))
    alloc_id = np.full(n, -1, dtype="int64")
    delta = np.zeros(n, dtype="float64")
    live: dict[float, int] = {}  # addr -> row of its live alloc
    pending: dict[float, int] = {}  # addr -> row (alloc, or free of a pre-existing block) not yet free_completed
    completes: list[tuple[int, int]] = []  # (free_completed row, the row whose alloc id it takes)
    freed_at = np.full(n, -1, dtype="int64")  # alloc row -> row of its free
    pre: list[tuple[Any, ...]] = []
    pre_free_rows: list[int] = []
    next_id = 0
    for i in range(n):
        a = action[i]
        if a == ALLOC:
            alloc_id[i] = next_id
            next_id += 1
            delta[i] = size[i]
            if not np.isnan(addr[i]):
                live[addr[i]] = i
        elif a == FREE or a == FREE_COMPLETED:
            j = live.pop(addr[i], -1) if not np.isnan(addr[i]) else -1
            if j < 0 and a == FREE_COMPLETED:
                k = pending.pop(addr[i], -1)
                if k >= 0:
                    completes.append((i, k))
                continue
            if a == FREE and j >= 0:
                pending[addr[i]] = j
            if j >= 0:
                alloc_id[i] = alloc_id[j]
                freed_at[j] = i
                delta[i] = -size[i] if np.isnan(size[j]) else -size[j]
            elif a == FREE:
                # freed without its alloc in the record: allocated before it began
                pre_free_rows.append(i)
                pending[addr[i]] = i
                delta[i] = -size[i]
            # a free_completed after its free (or of an unknown block) changes nothing
    # pre-existing allocations: frees without their alloc, then the source's known ones still live
    for i in pre_free_rows:
        pre.append((addr[i], size[i], op[i], module[i], source[i], hint[i], i))
    skip = set(live) | {addr[i] for i in pre_free_rows}
    for p in ev.preexisting:
        if p[0] in skip:
            continue  # allocated during the record after all
        pre.append((*p[:6], -1))
    m = len(pre)
    t0 = int(t[0]) if n else 0
    pre_id = np.arange(next_id, next_id + m, dtype="int64")
    for k, p in enumerate(pre):
        if p[6] >= 0:
            alloc_id[p[6]] = pre_id[k]
    for i, k in completes:
        alloc_id[i] = alloc_id[k]
    cols: dict[str, Any] = {
        "t_ns": np.concatenate([np.full(m, t0, dtype="int64"), t]),
        "action": np.concatenate([np.full(m, ALLOC, dtype="int8"), action]),
        "size_bytes": np.concatenate([np.array([p[1] for p in pre], dtype="float64"), size]),
        "delta_bytes": np.concatenate([np.array([p[1] for p in pre], dtype="float64"), delta]),
        "addr": np.concatenate([np.array([p[0] for p in pre], dtype="float64"), addr]),
        "stream": np.concatenate([np.full(m, np.nan), np.asarray(ev.stream, dtype="float64") if ev.stream is not None
                                  else np.full(n, np.nan)]),
        "alloc_id": np.concatenate([pre_id, alloc_id]).astype("float64"),
        "preexisting": np.concatenate([np.ones(m, dtype=bool), np.zeros(n, dtype=bool)]),
        "op": np.concatenate([np.array([p[2] for p in pre] + [None], dtype=object)[:-1], op]),
        "module": np.concatenate([np.array([p[3] for p in pre] + [None], dtype=object)[:-1], module]),
        "source": np.concatenate([np.array([p[4] for p in pre] + [None], dtype=object)[:-1], source]),
        "hint": np.concatenate([np.array([p[5] for p in pre] + [None], dtype=object)[:-1], hint]),
    }
    cols["alloc_id"][cols["alloc_id"] < 0] = np.nan
    start = 0.0
    if ev.total_allocated is not None and n and np.isfinite(ev.total_allocated[0]):
        # the allocator's total before the record, less the pre-existing rows it counts
        pre_free = sum(float(p[1]) for p in pre if p[6] >= 0)
        known = sum(float(p[1]) for p in pre if p[6] < 0)
        start = float(ev.total_allocated[0]) - float(delta[0]) - pre_free - (known if ev.known_in_totals else 0.0)
    cols["allocated_bytes"] = start + np.cumsum(cols["delta_bytes"])
    # reserved: the source's totals, else segments replayed from the reserved bytes at the start
    if ev.total_reserved is not None:
        cols["reserved_bytes"] = np.concatenate([np.full(m, ev.total_reserved[0] if n else np.nan),
                                                 np.asarray(ev.total_reserved, dtype="float64")])
    elif ev.reserved_start is not None:
        seg = np.where(action == SEGMENT_ALLOC, size, np.where(action == SEGMENT_FREE, -size, 0.0))
        cols["reserved_bytes"] = ev.reserved_start + np.cumsum(np.concatenate([np.zeros(m), seg]))
    else:
        cols["reserved_bytes"] = np.full(m + n, np.nan)
    # when each allocation was freed / made
    rows_t = cols["t_ns"]
    free_t = np.full(m + n, np.nan)
    alloc_t = np.full(m + n, np.nan)
    done = np.flatnonzero(freed_at >= 0)
    free_t[m + done] = t[freed_at[done]]
    alloc_t[m + freed_at[done]] = t[done]
    for k, p in enumerate(pre):
        if p[6] >= 0:
            free_t[k] = t[p[6]]
            alloc_t[m + p[6]] = t0
    cols["free_t_ns"] = free_t
    cols["alloc_t_ns"] = alloc_t
    df = pd.DataFrame(cols)
    df.insert(1, "device", ev.device)
    df["memory_source"] = memory_source
    df = categorize(df, rows_t[-1] if len(rows_t) else 0, steps)
    df["action"] = np.array(ACTIONS, dtype=object)[df["action"].to_numpy()]
    return df.drop(columns=["hint"])


def categorize(df: pd.DataFrame, t_end: int, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """``category`` and ``category_rule`` of each alloc row (and its free rows), by the rules of
    docs/memory.md, first match wins:

    1. ``hint``: the source knows (the engine's KV-cache and weight tensors; snapshot frames in an
       optimizer's step, in autograd's backward, a cuBLAS workspace, a CUDA-graph pool);
    2. ``weights``: allocated before the record began and still live at its end;
    3. ``workspace``: freed inside the op that allocated it (same op, no other allocation of
       another op in between: a temporary);
    4. ``optimizer`` / ``gradient``: held past an optimizer step's op / a backward op;
    5. ``activations``: any other allocation made during the record (freed later, or live at its end).
    """
    n = len(df)
    cat = np.full(n, "unknown", dtype=object)
    rule = np.full(n, None, dtype=object)
    is_alloc = df["action"].to_numpy() == ALLOC
    hint = df["hint"].to_numpy()
    pre = df["preexisting"].to_numpy()
    alive_end = np.isnan(df["free_t_ns"].to_numpy())
    has_hint = np.array([h in HINT_CATEGORIES for h in hint], dtype=bool)
    m = is_alloc & has_hint
    cat[m] = hint[m]
    rule[m] = "source"
    m = is_alloc & ~has_hint & pre & alive_end
    cat[m] = "weights"
    rule[m] = "before the record and live at its end"
    m = is_alloc & ~has_hint & pre & ~alive_end
    cat[m] = "activations"
    rule[m] = "before the record, freed during it"
    rest = is_alloc & ~has_hint & ~pre
    # a temporary: freed before the next allocation made by another op
    ops = df["op"].to_numpy()
    free_t = df["free_t_ns"].to_numpy()
    t = df["t_ns"].to_numpy()
    alloc_rows = np.flatnonzero(is_alloc)
    next_other = np.full(n, -1, dtype="int64")
    for k in range(len(alloc_rows) - 2, -1, -1):
        i, j = alloc_rows[k], alloc_rows[k + 1]
        next_other[i] = j if ops[j] != ops[i] else next_other[j]
    for i in np.flatnonzero(rest):
        j = next_other[i]
        temp = bool(ops[i] is not None and not np.isnan(free_t[i]) and (j < 0 or free_t[i] <= t[j]))
        if temp:
            cat[i], rule[i] = "workspace", "freed before another op allocated"
        elif hint[i] == "in_optimizer":
            cat[i], rule[i] = "optimizer", "allocated by an optimizer's step and held past it"
        elif hint[i] == "in_backward":
            cat[i], rule[i] = "gradient", "allocated in autograd's backward and held past its op"
        else:
            cat[i], rule[i] = "activations", "allocated during the record, held past its op"
    # free rows take their alloc's category
    ids = df["alloc_id"].to_numpy()
    by_id = {ids[i]: (cat[i], rule[i]) for i in np.flatnonzero(is_alloc) if not np.isnan(ids[i])}
    for i in np.flatnonzero(~is_alloc):
        got = by_id.get(ids[i])
        if got is not None:
            cat[i], rule[i] = got
        elif df["action"].iat[i] in (SEGMENT_ALLOC, SEGMENT_FREE):
            cat[i], rule[i] = None, None
    out = df.copy()
    out["category"] = cat
    out["category_rule"] = rule
    return out


def with_steps(memory: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``memory`` with ``step`` and ``phase`` of the step around each event (None outside steps)."""
    if not len(memory) or steps is None or not len(steps):
        return memory
    s = steps.sort_values("start_ns")
    starts = s["start_ns"].to_numpy(dtype="int64")
    ends = s["end_ns"].to_numpy(dtype="int64")
    t = memory["t_ns"].to_numpy(dtype="int64")
    k = np.searchsorted(starts, t, side="right") - 1
    inside = (k >= 0) & (t <= ends[np.maximum(k, 0)])
    out = memory.copy()
    step = np.full(len(t), np.nan)
    step[inside] = s["step"].to_numpy(dtype="float64")[k[inside]]
    phase = np.full(len(t), None, dtype=object)
    phase[inside] = s["phase"].to_numpy(dtype=object)[k[inside]]
    out["step"] = step
    out["phase"] = phase
    return out


def frames_summary(frames: list[Mapping[str, Any]],
                   cache: dict[int, tuple[Any, ...]] | None = None) -> tuple[str | None, str | None, str | None]:
    """(op, source line, category hint) of a snapshot traceback (innermost frame first).

    ``op``: the first ``at::_ops::NAME::call`` C++ frame, as ``aten::NAME``; ``source``: the
    first Python frame outside torch and site-packages, ``file.py:line function``; ``hint``
    (rule 1 of :func:`categorize`): ``optimizer`` when a frame is in ``torch/optim/``,
    ``gradient`` in autograd's backward engine, ``workspace`` a cuBLAS/cuDNN workspace,
    ``cuda_graph_pool`` inside a CUDA-graph capture, ``kv_cache`` a frame naming a KV cache.
    ``cache`` (id of a frame dict -> its reading) serves snapshots whose frames are shared objects.
    """
    op = source = hint = None
    for f in frames:
        got = cache.get(id(f)) if cache is not None else None
        if got is None:
            got = _frame(f)
            if cache is not None:
                cache[id(f)] = got
        if op is None:
            op = got[0]
        if source is None:
            source = got[1]
        if hint is None:
            hint = got[2]
    return op, source, hint


def _frame(f: Any) -> tuple[str | None, str | None, str | None]:
    """(op, source, hint) that one frame says (see :func:`frames_summary`)."""
    if not isinstance(f, Mapping):
        return None, None, None
    name, file = f.get("name"), f.get("filename")
    if not isinstance(name, str) or not isinstance(file, str):
        return None, None, None
    op = source = hint = None
    if name.startswith("at::_ops::") and "::call(" in name:
        op = "aten::" + name[len("at::_ops::"):name.index("::call(")]
    if file.endswith(".py"):
        low = file.replace("\\", "/")
        if "/torch/optim/" in low:
            hint = "optimizer"
        elif "/torch/cuda/graphs.py" in low:
            hint = "cuda_graph_pool"
        elif "kv_cache" in name or "kv_cache" in low or "/cache_utils.py" in low:
            hint = "kv_cache"
        if "site-packages" not in low and "/torch/" not in low and "/lib/python" not in low:
            source = f"{low.rsplit('/', 1)[-1]}:{f.get('line')} {name}"
    elif "torch::autograd::Engine" in name or "autograd::generated" in name:
        hint = "gradient"
    elif "Workspace" in name or "workspace" in name:
        hint = "workspace"
    return op, source, hint
