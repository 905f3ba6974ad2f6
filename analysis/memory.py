"""Memory timeline: allocation events in, the ``memory`` table out (allocated and reserved bytes
over time, each allocation paired with its free and given a category).

Every source (Kineto ``[memory]`` events, CUDA memory snapshots, ``export_memory_timeline``)
reduces its events to :class:`MemEvents` (one device's events in order) and calls
:func:`timeline`. The category rules are written down in docs/memory.md; :func:`categorize`
applies them in order, the first that matches wins, and ``category_rule`` says which.

The clock of an instant is the event: row ``event`` k of a device is the k-th event of its record
(0-based; -1 for what was there before it), and an allocation is live after event k when it was made
at or before k and its ``free_event`` is later (or missing: still live). Times can tie (or be
missing, in a snapshot without ``time_us``); event positions cannot.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perfscope.schema import MEMORY_COLUMNS, whole_numbers

ALLOC, FREE, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, OOM = range(6)
ACTIONS = ("alloc", "free", "free_completed", "segment_alloc", "segment_free", "oom")
"""Action codes of :class:`MemEvents` and their names in the ``memory`` table."""

CATEGORIES = ("weights", "kv_cache", "activations", "workspace", "optimizer", "gradient", "cuda_graph_pool",
              "before_recording", "unknown")
"""Categories of an allocation; ``fragmentation`` (free bytes inside segments that hold live blocks)
and reserved-but-unused bytes are quantities over time beside them, not an allocation's category
(:func:`perfscope.analysis.summaries.memory.breakdown`)."""

HINT_CATEGORIES = {"kv_cache", "optimizer", "gradient", "workspace", "cuda_graph_pool", "weights", "activations"}
"""Hints a source can give per event (snapshot frames, the engine's known tensors) that name a category."""

UNTRACKED = "untracked"
"""Hint of the row holding the bytes an allocator's own total counts before the record began that no
event names (Kineto's ``Total Allocated`` before its first event)."""

HINT_RULES = {"optimizer": "stack: allocated in torch/optim (an optimizer's state)",
              "gradient": "stack: allocated in autograd's backward engine",
              "workspace": "stack: a cuBLAS / cuDNN workspace",
              "cuda_graph_pool": "a CUDA-graph pool (stack in torch/cuda/graphs.py, or the segment's pool)",
              "kv_cache": "stack names a KV cache (kv_cache, transformers' cache_utils.py)",
              "weights": "stack: loading or moving a module's parameters (Module.to/_apply, load_state_dict, "
                         "from_pretrained, accelerate's set_module_tensor_to_device)",
              "activations": "the source names it"}
"""``category_rule`` of rule 1 (the source knows), per hint."""


@dataclass
class MemEvents:
    """One device's allocation events, in order.

    Attributes:
        device: ``cuda:0``, ``cpu``.
        t_ns: event times on the report's timeline (a snapshot without times: the events' positions).
        action: codes of :data:`ACTIONS`.
        size: bytes (positive) of the block or segment.
        addr: block address (NaN when unknown).
        stream: CUDA stream (NaN when unknown).
        op, module, source, hint, stack: per event (None when unknown); ``hint`` a category a source
            knows; ``stack`` the user frames above ``source``.
        total_allocated / total_reserved: the allocator's own totals after the event, when the
            source records them (Kineto); NaN otherwise.
        preexisting: (addr, size, op, module, source, hint[, stack]) of allocations made before the
            record began that are known from elsewhere (a snapshot's segments, the engine's tensors).
        reserved_start: bytes reserved when the record began (None: unknown).
        known_in_totals: ``total_allocated`` counts the ``preexisting`` allocations (a GPU caching
            allocator's totals do; torch's CPU allocator counts only what it saw while profiling).
        requested: bytes each event's caller asked for, before the allocator rounded them up (a
            snapshot's blocks at the dump; NaN unknown); preexisting tuples may carry it eighth.
        segments_end: (address, bytes) of the segments reserved at the end of the record (a snapshot's
            dump), from which the segments at its start are replayed back: they become
            ``segment_alloc`` rows before the first event, so the segments live at any event are known
            (fragmentation). None: not known.
        texts, text_code: instead of ``op`` ... ``stack``, the distinct (op, module, source, hint, stack)
            and each event's place among them (a snapshot's tracebacks: millions of events, a few
            thousand distinct readings).
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
    stack: np.ndarray | None = None
    total_allocated: np.ndarray | None = None
    total_reserved: np.ndarray | None = None
    preexisting: list[tuple[Any, ...]] = field(default_factory=list)
    reserved_start: float | None = None
    known_in_totals: bool = True
    segments_end: list[tuple[float, float]] | None = None
    requested: np.ndarray | None = None
    texts: list[tuple[Any, ...]] | None = None
    text_code: np.ndarray | None = None


def _objs(values: np.ndarray | None, n: int) -> np.ndarray:
    return np.full(n, None, dtype=object) if values is None else np.asarray(values, dtype=object)


WHOLE_NUMBERS = tuple(c.name for c in MEMORY_COLUMNS if c.kind == "int" and not c.required and c.name != "step")
"""The ``memory`` columns of whole numbers that may be missing (nullable ``Int64`` in the contract)."""

TEXTS = ("op", "module", "source", "hint", "stack")
"""The text columns an event carries (:class:`MemEvents`), in the order of its ``texts``."""


def _texts(ev: MemEvents, pre: list[tuple[Any, ...]], ms: int) -> dict[str, pd.Series]:
    """The text columns of the rows: ``pre`` (addr, size, op, module, source, hint, stack, ...), ``ms``
    segments (none), then the events."""
    n = len(ev.t_ns)
    if ev.text_code is None or ev.texts is None:
        return {name: _text(np.concatenate([_col([p[j] for p in pre]), np.full(ms, None, dtype=object),
                                            _objs(values, n)]))
                for j, (name, values) in enumerate(zip(TEXTS, (ev.op, ev.module, ev.source, ev.hint, ev.stack)),
                                                   start=2)}
    k = len(ev.texts)
    table = [*ev.texts, *(tuple(p[j] if len(p) > j else None for j in range(2, 7)) for p in pre), (None,) * 5]
    code = np.concatenate([np.arange(k, k + len(pre), dtype="int32"), np.full(ms, len(table) - 1, dtype="int32"),
                           np.asarray(ev.text_code, dtype="int32")])
    return {name: _text(_col([r[j] for r in table])[code]) for j, name in enumerate(TEXTS)}


def _same(value: Any, n: int) -> np.ndarray:
    """``n`` references to ``value`` (``np.full`` would make a copy of a string for each row)."""
    out = np.empty(n, dtype=object)
    out.fill(value)
    return out


def _text(values: np.ndarray) -> pd.Series:
    """A column of text as Python strings (None missing), each row a reference to a shared string: a
    million rows of one op's name are 8 MB, not a copy of the name each (the ``str`` dtype's)."""
    return pd.Series(values, dtype=object, copy=False)


def _col(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def timeline(ev: MemEvents, memory_source: str, *, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``memory`` rows of one device: what was there before the record first (event -1, at the
    first event's time), then every event, with ``allocated_bytes`` replayed from the events.

    Pairing: a free (``free``, or ``free_completed`` of a block whose ``free`` was not recorded)
    takes the live allocation at its address; a free with no live allocation there was made
    before the record began and becomes a pre-existing allocation. ``allocated_bytes`` is the
    running sum of ``delta_bytes`` over the rows, so the bytes live after any event, summed, are the
    allocated bytes there. Where the source records its own total (Kineto's ``Total Allocated``),
    the bytes it counts before the first event that no event names become one pre-existing row
    (``before_recording``), so the two agree at every event when no event is lost.
    """
    n = len(ev.t_ns)
    t = np.asarray(ev.t_ns, dtype="int64")
    action = np.asarray(ev.action, dtype="int8")
    size = np.abs(np.asarray(ev.size, dtype="float64"))
    addr = np.asarray(ev.addr, dtype="float64")
    alloc_id, delta, freed_at, pre_free_rows, completes, live = _pair(action, size, addr)
    # pre-existing allocations: frees without their alloc (who made them is not known), then the
    # source's known ones still live, then what the allocator's total counts and no event names
    pre: list[tuple[Any, ...]] = [(addr[i], size[i], None, None, None, None, None, i, np.nan)
                                  for i in pre_free_rows.tolist()]
    during = np.isin(np.array([p[0] for p in ev.preexisting], dtype="float64"),
                     np.concatenate([live, addr[pre_free_rows]]))
    for p, made in zip(ev.preexisting, during.tolist()):
        if made:
            continue  # allocated during the record after all
        pre.append((*p[:6], p[6] if len(p) > 6 else None, -1, p[7] if len(p) > 7 else np.nan))
    start = 0.0
    if ev.total_allocated is not None and n and np.isfinite(ev.total_allocated[0]):
        # the allocator's total before the record, less the pre-existing rows it counts
        pre_free = sum(float(p[1]) for p in pre if p[7] >= 0)
        known = sum(float(p[1]) for p in pre if p[7] < 0)
        start = float(ev.total_allocated[0]) - float(delta[0]) - pre_free - (known if ev.known_in_totals else 0.0)
        if start > 0:
            pre.append((np.nan, start, None, None, None, UNTRACKED, None, -1, np.nan))
            start = 0.0
    segs = _segments_at_start(ev.segments_end, action, size, addr)
    m = len(pre)
    ms = len(segs)
    t0 = int(t[0]) if n else 0
    pre_id = np.arange(next_id := (int(alloc_id.max()) + 1 if n and (alloc_id >= 0).any() else 0), next_id + m,
                       dtype="int64")
    for k, p in enumerate(pre):
        if p[7] >= 0:
            alloc_id[p[7]] = pre_id[k]
    alloc_id[completes[:, 0]] = alloc_id[completes[:, 1]]
    pre_size = np.array([p[1] for p in pre], dtype="float64")
    seg_size = np.array([s[1] for s in segs], dtype="float64")
    cols: dict[str, Any] = {
        "t_ns": np.concatenate([np.full(m + ms, t0, dtype="int64"), t]),
        "action": np.concatenate([np.full(m, ALLOC, dtype="int8"), np.full(ms, SEGMENT_ALLOC, dtype="int8"), action]),
        "size_bytes": np.concatenate([pre_size, seg_size, size]),
        "delta_bytes": np.concatenate([pre_size, np.zeros(ms), delta]),
        "addr": np.concatenate([np.array([p[0] for p in pre], dtype="float64"),
                                np.array([s[0] for s in segs], dtype="float64"), addr]),
        "stream": np.concatenate([np.full(m + ms, np.nan), np.asarray(ev.stream, dtype="float64")
                                  if ev.stream is not None else np.full(n, np.nan)]),
        "alloc_id": np.concatenate([pre_id, np.full(ms, -1, dtype="int64"), alloc_id]).astype("float64"),
        "preexisting": np.concatenate([np.ones(m + ms, dtype=bool), np.zeros(n, dtype=bool)]),
        "event": np.concatenate([np.full(m + ms, -1, dtype="int64"), np.arange(n, dtype="int64")]),
        "requested_bytes": np.concatenate([np.array([p[8] for p in pre], dtype="float64"), np.full(ms, np.nan),
                                           np.asarray(ev.requested, dtype="float64") if ev.requested is not None
                                           else np.full(n, np.nan)]),
    }
    cols.update(_texts(ev, pre, ms))
    cols["alloc_id"][cols["alloc_id"] < 0] = np.nan
    cols["allocated_bytes"] = start + np.cumsum(cols["delta_bytes"])
    # reserved: the source's totals, else segments replayed from the reserved bytes at the start
    if ev.total_reserved is not None:
        cols["reserved_bytes"] = np.concatenate([np.full(m + ms, ev.total_reserved[0] if n else np.nan),
                                                 np.asarray(ev.total_reserved, dtype="float64")])
    elif ev.reserved_start is not None:
        seg = np.where(action == SEGMENT_ALLOC, size, np.where(action == SEGMENT_FREE, -size, 0.0))
        cols["reserved_bytes"] = ev.reserved_start + np.cumsum(np.concatenate([np.zeros(m + ms), seg]))
    else:
        cols["reserved_bytes"] = np.full(m + ms + n, np.nan)
    # when (and at which event) each allocation was freed / made
    free_t = np.full(m + ms + n, np.nan)
    alloc_t = np.full(m + ms + n, np.nan)
    free_event = np.full(m + ms + n, np.nan)
    done = np.flatnonzero(freed_at >= 0)
    off = m + ms
    free_t[off + done] = t[freed_at[done]]
    free_event[off + done] = freed_at[done]
    alloc_t[off + freed_at[done]] = t[done]
    for k, p in enumerate(pre):
        if p[7] >= 0:
            free_t[k] = t[p[7]]
            free_event[k] = p[7]
            alloc_t[off + p[7]] = t0
    cols["free_t_ns"] = free_t
    cols["alloc_t_ns"] = alloc_t
    cols["free_event"] = free_event
    device = ev.device
    del alloc_id, delta, freed_at, t, action, size, addr, free_t, alloc_t, free_event
    _release(ev)
    df = pd.DataFrame(cols, copy=False)  # each column as it is (no block of them copied together)
    del cols
    df.insert(1, "device", _text(_same(device, len(df))))
    df["memory_source"] = _text(_same(memory_source, len(df)))
    df = categorize(df, steps, copy=False)
    df["action"] = _text(np.array(ACTIONS, dtype=object)[df["action"].to_numpy()])
    del df["hint"]
    # the contract's dtypes, a column at a time (conform() then keeps them as they are: no second table)
    for c in WHOLE_NUMBERS:
        df[c] = whole_numbers(df[c])
    df["preexisting"] = df["preexisting"].astype("boolean")
    return df


def _release(ev: MemEvents) -> None:
    """Let go of ``ev``'s per-event arrays once the table holds its own (a snapshot's are a few hundred
    MB; the caller keeps no other reference to them)."""
    ev.t_ns = ev.action = ev.size = ev.addr = np.empty(0)
    ev.stream = ev.op = ev.module = ev.source = ev.hint = ev.stack = ev.text_code = ev.requested = None
    ev.total_allocated = ev.total_reserved = None


def _pair(action: np.ndarray, size: np.ndarray, addr: np.ndarray) -> tuple[Any, ...]:
    """Each free paired with the live alloc at its address: (alloc ids, delta bytes, the row that
    freed each alloc row, the rows of frees without an alloc, [free_completed row, row whose id it
    takes] pairs, the addresses live at the end).

    At C speed, by address: each event's partner is the one before it at its address (a ``free``
    takes the alloc before it, a ``free_completed`` the alloc before it or the ``free`` before it,
    and through that free its alloc). An address whose events run otherwise (two frees in a row, a
    ``free_completed`` after a ``free_completed``) is paired by :func:`_pair_each`, event by event:
    the two agree on every order of events."""
    n = len(action)
    alloc_id = np.full(n, -1, dtype="int64")
    delta = np.zeros(n, dtype="float64")
    freed_at = np.full(n, -1, dtype="int64")
    is_alloc = action == ALLOC
    alloc_id[is_alloc] = np.arange(int(is_alloc.sum()), dtype="int64")
    delta[is_alloc] = size[is_alloc]
    rows = np.flatnonzero(is_alloc | (action == FREE) | (action == FREE_COMPLETED))
    order = rows[np.lexsort((rows, addr[rows]))]  # by address, in event order at each (no address: alone)
    a, act = addr[order], action[order]
    same = np.zeros(len(order), dtype=bool)
    same[1:] = a[1:] == a[:-1]  # NaN never equals: an event without an address pairs with none
    prev_act = np.full(len(order), -1, dtype="int64")
    prev_act[1:] = act[:-1]
    prev_act[~same] = -1
    if (((act == FREE) | (act == FREE_COMPLETED)) & ((prev_act == FREE) | (prev_act == FREE_COMPLETED))
            & ~((act == FREE_COMPLETED) & (prev_act == FREE))).any():
        return _pair_each(action, size, addr)
    prev_row = np.full(len(order), -1, dtype="int64")
    prev_row[1:] = order[:-1]
    prev_row[~same] = -1
    # a free (or a free_completed without its free) of the alloc before it
    takes = (act != ALLOC) & (prev_act == ALLOC)
    i, j = order[takes], prev_row[takes]
    alloc_id[i] = alloc_id[j]
    freed_at[j] = i
    delta[i] = np.where(np.isnan(size[j]), -size[i], -size[j])
    # a free with nothing before it at its address: allocated before the record began
    pre = (act == FREE) & (prev_act == -1)
    pre_free_rows = np.sort(order[pre])
    delta[pre_free_rows] = -size[pre_free_rows]
    # a free_completed after its free: the free's alloc (or the free itself, for a block from before)
    after = np.flatnonzero((act == FREE_COMPLETED) & (prev_act == FREE))
    f = after - 1  # the free, just before it at its address
    k = np.where(prev_act[f] == ALLOC, prev_row[f], order[f])
    done = np.stack([order[after], k], axis=1)
    done = done[np.argsort(done[:, 0], kind="stable")]
    # live at the end: an address whose last event is an alloc
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ~same[1:]
    end = last & (act == ALLOC) & ~np.isnan(a)
    return alloc_id, delta, freed_at, pre_free_rows, done, a[end]


def _pair_each(action: np.ndarray, size: np.ndarray, addr: np.ndarray) -> tuple[Any, ...]:
    """:func:`_pair`, event by event (any order of events at an address)."""
    n = len(action)
    alloc_id = np.full(n, -1, dtype="int64")
    delta = np.zeros(n, dtype="float64")
    live: dict[float, int] = {}  # addr -> row of its live alloc
    pending: dict[float, int] = {}  # addr -> row (alloc, or free of a pre-existing block) not yet free_completed
    completes: list[tuple[int, int]] = []
    freed_at = np.full(n, -1, dtype="int64")  # alloc row -> row of its free
    pre_free_rows: list[int] = []
    next_id = 0
    has_addr = ~np.isnan(addr)
    act, adr, known = action.tolist(), addr.tolist(), has_addr.tolist()
    for i in range(n):
        a = act[i]
        if a == ALLOC:
            alloc_id[i] = next_id
            next_id += 1
            delta[i] = size[i]
            if known[i]:
                live[adr[i]] = i
        elif a == FREE or a == FREE_COMPLETED:
            j = live.pop(adr[i], -1) if known[i] else -1
            if j < 0 and a == FREE_COMPLETED:
                k = pending.pop(adr[i], -1)
                if k >= 0:
                    completes.append((i, k))
                continue
            if a == FREE and j >= 0:
                pending[adr[i]] = j
            if j >= 0:
                alloc_id[i] = alloc_id[j]
                freed_at[j] = i
                delta[i] = -size[i] if np.isnan(size[j]) else -size[j]
            elif a == FREE:
                # freed without its alloc in the record: allocated before it began
                pre_free_rows.append(i)
                pending[adr[i]] = i
                delta[i] = -size[i]
            # a free_completed after its free (or of an unknown block) changes nothing
    done = np.array(completes, dtype="int64").reshape(-1, 2)
    return alloc_id, delta, freed_at, np.array(pre_free_rows, dtype="int64"), done, np.array(list(live), dtype="float64")


def _segments_at_start(end: list[tuple[float, float]] | None, action: np.ndarray, size: np.ndarray,
                       addr: np.ndarray) -> list[tuple[float, float]]:
    """The segments reserved before the first event: those at the end, replayed back through the
    record's ``segment_alloc`` / ``segment_free``. Empty when the replay does not hold together (a
    segment freed twice, expandable segments mapped in pieces): fragmentation is then not known."""
    if not end:
        return []
    have = {a: s for a, s in end if np.isfinite(a) and np.isfinite(s)}
    rows = np.flatnonzero((action == SEGMENT_ALLOC) | (action == SEGMENT_FREE))
    for i in rows[::-1].tolist():
        a = float(addr[i])
        if action[i] == SEGMENT_ALLOC:
            if have.pop(a, None) is None:
                return []
        elif a in have:
            return []
        else:
            have[a] = float(size[i])
    return sorted(have.items())


def categorize(df: pd.DataFrame, steps: pd.DataFrame | None = None,
               parameter_sizes: Counter[float] | None = None, parameter_source: str = "", *,
               copy: bool = True) -> pd.DataFrame:
    """``category`` and ``category_rule`` of each alloc row (and its free rows), by the rules of
    docs/memory.md, first match wins:

    1. ``hint``: the source knows (the engine's KV-cache and weight tensors; snapshot stacks in an
       optimizer's step, loading a module's parameters, in autograd's backward, a cuBLAS workspace,
       a CUDA-graph pool, a KV cache); the allocator's total before the record -> ``before_recording``;
    2. made during the record: ``workspace`` when freed before another op allocated (a temporary),
       ``optimizer`` / ``gradient`` when held past an optimizer step's op / a backward op, else
       ``activations``;
    3. made before the record (:func:`_before_record`): by their own stack, by size (a parameter of
       the model, a parameter-shaped optimizer state or gradient of the record, or the same size as
       tensors the record makes and frees: a leftover), freed during the record; else
       ``before_recording``, said so.

    ``copy=False`` adds the two columns to ``df`` itself.
    """
    n = len(df)
    cat = _same("unknown", n)
    rule = np.full(n, None, dtype=object)
    is_alloc = df["action"].to_numpy() == ALLOC
    hint = df["hint"].to_numpy(dtype=object)
    pre = df["preexisting"].to_numpy()
    has_hint = pd.Series(hint, dtype=object, copy=False).isin(list(HINT_CATEGORIES)).to_numpy()
    m = is_alloc & has_hint
    cat[m] = hint[m]
    rule[m] = pd.Series(hint[m], dtype=object).map(HINT_RULES).to_numpy(dtype=object)
    m = is_alloc & (hint == UNTRACKED)
    cat[m] = "before_recording"
    rule[m] = "in the allocator's total before the record began; no event names it"
    rest = is_alloc & ~has_hint & ~pre & (hint != UNTRACKED)
    _during_record(df, rest, cat, rule)
    _before_record(df, is_alloc & ~has_hint & pre & (hint != UNTRACKED), cat, rule, parameter_sizes,
                   parameter_source)
    _frees_follow(df, cat, rule)
    out = df.copy() if copy else df
    out["category"] = _text(cat)
    out["category_rule"] = _text(rule)
    return out


def _frees_follow(df: pd.DataFrame, cat: np.ndarray, rule: np.ndarray) -> None:
    """Free rows take their alloc's category; segment rows have none."""
    action = df["action"].to_numpy()
    is_alloc = action == ALLOC
    ids = df["alloc_id"].to_numpy("float64", na_value=np.nan)
    rows = np.flatnonzero(is_alloc & ~np.isnan(ids))
    other = np.flatnonzero(~is_alloc)
    src = _alloc_rows(ids[rows], rows, ids[other])
    got = src >= 0
    cat[other[got]] = cat[src[got]]
    rule[other[got]] = rule[src[got]]
    seg = other[~got & ((action[other] == SEGMENT_ALLOC) | (action[other] == SEGMENT_FREE))]
    cat[seg] = None
    rule[seg] = None


def _alloc_rows(alloc_ids: np.ndarray, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The row (of ``rows``, whose ids are ``alloc_ids``) allocating each of ``ids``; -1 none. An id
    allocated twice is the later alloc's."""
    top = alloc_ids.max() if len(alloc_ids) else -1.0
    if len(alloc_ids) and alloc_ids.min() >= 0 and top < 4 * len(alloc_ids) + 1024 and \
            (alloc_ids == np.floor(alloc_ids)).all() and len(np.unique(alloc_ids)) == len(alloc_ids):
        lut = np.full(int(top) + 1, -1, dtype="int64")  # the ids a timeline gives: 0, 1, 2, ... (no hashing)
        lut[alloc_ids.astype("int64")] = rows
        whole = (ids >= 0) & (ids <= top) & (ids == np.floor(ids))
        src = np.full(len(ids), -1, dtype="int64")
        src[whole] = lut[ids[whole].astype("int64")]
        return src
    index = pd.Index(alloc_ids)
    if not index.is_unique:
        keep = ~index.duplicated(keep="last")
        rows, index = rows[keep], index[keep]
    at = index.get_indexer(ids)
    return np.where(at >= 0, rows[np.maximum(at, 0)], -1) if len(rows) else np.full(len(ids), -1, dtype="int64")


def _during_record(df: pd.DataFrame, rows: np.ndarray, cat: np.ndarray, rule: np.ndarray) -> None:
    """Rule 2: a temporary (freed before the next allocation made by another op), held past an
    optimizer step or a backward op, else an activation."""
    if not rows.any():
        return
    is_alloc = df["action"].to_numpy() == ALLOC
    ops = df["op"].to_numpy()
    hint = df["hint"].to_numpy()
    free_t = df["free_t_ns"].to_numpy()
    t = df["t_ns"].to_numpy()
    alloc_rows = np.flatnonzero(is_alloc)
    # the next alloc of another op: allocs in runs of one op; each run's next is the next run's first
    op_of = ops[alloc_rows]
    missing = pd.isna(op_of)
    new_run = np.ones(len(alloc_rows), dtype=bool)
    new_run[1:] = (op_of[1:] != op_of[:-1]) & ~(missing[1:] & missing[:-1])  # no op: one run of them
    run = np.cumsum(new_run) - 1
    run_first = alloc_rows[new_run]
    nxt = np.full(len(alloc_rows), -1, dtype="int64")
    has_next = run + 1 < len(run_first)
    nxt[has_next] = run_first[run[has_next] + 1]
    del run, has_next, new_run, op_of, missing
    i = np.flatnonzero(rows)
    j = nxt[np.searchsorted(alloc_rows, i)]  # the rows are alloc rows
    freed = ~np.isnan(free_t[i])
    temp = pd.notna(ops[i]) & freed & \
        ((j < 0) | (free_t[i] <= np.where(j >= 0, t[np.maximum(j, 0)], 0)))
    opt = ~temp & (hint[i] == "in_optimizer")
    bwd = ~temp & ~opt & (hint[i] == "in_backward")
    act = ~temp & ~opt & ~bwd
    for mask, c, r in ((temp, "workspace", "freed before another op allocated"),
                       (opt, "optimizer", "allocated by an optimizer's step and held past it"),
                       (bwd, "gradient", "allocated in autograd's backward and held past its op"),
                       (act, "activations", "allocated during the record, held past its op")):
        cat[i[mask]] = c
        rule[i[mask]] = r


def parameter_sizes(model: Any) -> tuple[Counter[int], str]:
    """The element counts of a model's parameters, as many of each as it has, and its checkpoint's dtype
    (``model``: a :class:`perfscope.capacity.ModelShape`): embeddings and LM head; per layer the
    attention projections (separate and fused QKV), the MLP's (separate and fused gate/up, GPT-2's
    4h), norms and biases. :func:`with_model` prices them in the dtype that names the most bytes."""
    h, nh, nkv, hd = model.hidden, model.n_heads, model.n_kv_heads, model.head_dim
    inter, vocab, layers = model.intermediate, model.vocab, model.n_layers
    per_layer = [nh * hd * h, nkv * hd * h, nkv * hd * h, h * nh * hd, (nh + 2 * nkv) * hd * h,
                 inter * h, inter * h, h * inter, 2 * inter * h, h, h, 3 * h * h, 3 * h, 4 * h, (nh + 2 * nkv) * hd]
    counts: Counter[int] = Counter({vocab * h: 2, h: 1})
    for numel in per_layer:
        counts[numel] += layers
    return counts, str(model.dtype)


def with_model(report: Any, model: str) -> Any:
    """``report`` with its memory blocks from before the record that have a parameter's size of
    ``model`` (an engine model or a Hugging Face config.json, :func:`perfscope.capacity.resolve_model`)
    named ``weights`` (rule 3b of :func:`categorize`), in the dtype that names the most bytes."""
    from perfscope.capacity import resolve_model

    shape = resolve_model(model)
    counts, dtype = parameter_sizes(shape)
    mem = report.memory
    if not len(mem):
        return report
    parts = []
    for _, dev in mem.groupby("device", sort=False):
        pre = dev[dev["preexisting"].fillna(False).to_numpy(bool) & (dev["action"] == "alloc").to_numpy()]
        have = Counter(pd.concat([pre["size_bytes"], pre["requested_bytes"]]).dropna().tolist()) \
            if "requested_bytes" in pre else Counter(pre["size_bytes"].dropna().tolist())
        best: tuple[float, Counter[float], str] = (0.0, Counter(), "")
        for name, nbytes in (("fp32", 4), ("bf16/fp16", 2), (dtype, {"fp32": 4, "fp8": 1}.get(dtype, 2))):
            sizes: Counter[float] = Counter()
            for numel, k in counts.items():  # the exact bytes, and the caching allocator's 512-byte block
                exact = float(numel * nbytes)
                for size in {exact, float(-(-exact // 512) * 512)}:
                    sizes[size] += k
            named = sum(min(k, have.get(size, 0)) * size for size, k in sizes.items())
            if named > best[0]:
                best = (named, sizes, name)
        cat = dev["category"].astype("object").to_numpy().copy()
        rule = dev["category_rule"].astype("object").to_numpy().copy()
        action = dev["action"].to_numpy(dtype=object)
        codes = np.array([ACTIONS.index(a) if a in ACTIONS else -1 for a in action.tolist()], dtype="int8")
        rows = (codes == ALLOC) & dev["preexisting"].fillna(False).to_numpy(bool) & np.array(
            [isinstance(r, str) and r.startswith(BEFORE_RECORD_RULES) for r in rule.tolist()], dtype=bool)
        raw = dev.assign(action=codes)
        _before_record(raw, rows, cat, rule, best[1] or None, f"{shape.name} ({best[2]})" if best[1] else "")
        _frees_follow(raw, cat, rule)
        parts.append(dev.assign(category=cat, category_rule=rule))
    return report.replace(memory=pd.concat(parts, ignore_index=True))


BEFORE_RECORD_RULES = ("before the record", "its size is that of a parameter", "parameter-shaped",
                       "a leftover from before the record", "allocated before the record began")
"""The starts of the ``category_rule`` texts rule 3 (:func:`_before_record`) gives."""


LEFTOVER_CATEGORIES = ("activations", "workspace")
"""Categories of the record's tensors whose size, matched by a block from before the record, names it a
leftover of an earlier run."""


def _before_record(df: pd.DataFrame, rows: np.ndarray, cat: np.ndarray, rule: np.ndarray,
                   parameter_sizes: Counter[float] | None, parameter_source: str) -> None:
    """Rule 3, for allocations made before the record began, first match wins:

    a. its own stack (a snapshot's block allocated while history was on, its event no longer in
       the ring): an activation of that op at that line;
    b. its size is that of a parameter of the model (``parameter_sizes``: numel x dtype bytes, as
       many as the model has), or of an optimizer state / a gradient held to the record's end, made
       during it or before it with a stack that says so (parameter-shaped): ``weights``;
    c. its size is that of tensors the record makes and frees: a leftover ``activations`` of an
       earlier run (the op and line that make them named);
    d. freed during the record: ``activations``;
    e. otherwise ``before_recording``: nothing in the record says what it is.
    """
    idx = np.flatnonzero(rows)
    if not len(idx):
        return
    size = df["size_bytes"].to_numpy("float64", na_value=np.nan)
    requested = df["requested_bytes"].to_numpy("float64", na_value=np.nan) if "requested_bytes" in df else np.full(len(df), np.nan)
    ops, src = df["op"].to_numpy(), df["source"].to_numpy()
    freed = ~np.isnan(df["free_t_ns"].to_numpy("float64", na_value=np.nan))
    is_alloc = df["action"].to_numpy() == ALLOC
    pre = df["preexisting"].to_numpy()
    recorded = is_alloc & ~pre
    # parameter-shaped sizes the record shows: optimizer states, gradients held to its end
    shaped: Counter[float] = Counter()
    for c, keep in (("optimizer", is_alloc), ("gradient", is_alloc & ~freed)):
        for s in size[keep & (cat == c)].tolist():
            shaped[s] += 1
    budget = Counter(parameter_sizes or {})
    # sizes of tensors the record makes and frees, with who makes them most
    transient = np.flatnonzero(recorded & freed & np.isin(cat, LEFTOVER_CATEGORIES) & np.isin(size, size[idx]))
    made: dict[float, Counter[tuple[Any, Any]]] = {}
    groups = pd.DataFrame({"s": size[transient], "o": pd.Series(ops[transient], dtype=object),
                           "w": pd.Series(src[transient], dtype=object)}).groupby(
        ["s", "o", "w"], dropna=False, sort=False).size()  # groups in the order they first appear
    for (s, o, w), count in groups.items():
        made.setdefault(float(s), Counter())[(o if isinstance(o, str) else None, w if isinstance(w, str) else None)] \
            += int(count)
    # largest first, so that a parameter size is given to the largest blocks it can explain
    for i in idx[np.argsort(-size[idx], kind="stable")].tolist():
        s = float(size[i])
        if isinstance(ops[i], str) or isinstance(src[i], str):
            cat[i] = "activations"
            rule[i] = "before the record's first event, by its own stack (" + " at ".join(
                x for x in (ops[i], src[i]) if isinstance(x, str)) + ")"
        elif budget.get(r := float(requested[i]) if np.isfinite(requested[i]) else s, 0) > 0:
            budget[r] -= 1
            cat[i], rule[i] = "weights", f"its size is that of a parameter of {parameter_source or 'the model'}"
        elif shaped.get(s, 0) > 0:
            shaped[s] -= 1
            cat[i], rule[i] = "weights", ("parameter-shaped: the record holds an optimizer state or gradient "
                                          "of this size")
        elif s in made:
            (o, w), _ = made[s].most_common(1)[0]
            by = " at ".join(x for x in (o, w) if isinstance(x, str)) or "the record"
            cat[i] = "activations"
            rule[i] = (f"a leftover from before the record: the record makes and frees "
                       f"{sum(made[s].values())} tensors of this size ({by})")
        elif freed[i]:
            cat[i], rule[i] = "activations", "before the record, freed during it"
        else:
            cat[i], rule[i] = "before_recording", "allocated before the record began; nothing in the record says what it is"


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
    step[inside] = s["step"].to_numpy(dtype="float64", na_value=np.nan)[k[inside]]
    phase = np.full(len(t), None, dtype=object)
    phase[inside] = s["phase"].to_numpy(dtype=object)[k[inside]]
    out["step"] = step
    out["phase"] = phase
    return out


FACTORY_OPS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_",
                         "empty_memory_format", "empty_permuted", "as_strided"})
"""Ops that only allocate for another op (the one that allocated, for :func:`frames_summary`, is the
innermost op outside these)."""

OVERLOAD_SUFFIXES = ("out", "dim", "int", "start", "step", "memory_format", "dtype", "self", "names", "default")
"""Lower-case overload names of ``at::_ops`` structs (``mean_dim``, ``arange_start_out``) dropped from the op."""

PLUMBING = ("/einops/", "/opt_einsum/", "/accelerate/hooks.py", "/transformers/utils/",
            "/transformers/modeling_layers.py", "/transformers/integrations/")
"""Python packages whose frames wrap the line that allocated (einops' reduce, accelerate's forward
hook, transformers' decorators and attention dispatch): skipped when looking for the source line."""

WEIGHT_LOADERS = (("/torch/nn/modules/module.py", ("_apply", "to", "cuda", "_load_from_state_dict",
                                                    "load_state_dict", "to_empty")),
                  ("/transformers/modeling_utils.py", ()), ("/accelerate/utils/modeling.py", ()),
                  ("/safetensors/", ()), ("/torch/serialization.py", ()))
"""(path, functions) of Python frames that load or move a module's parameters: an allocation under
one holds weights (rule 1 of :func:`categorize`; ``()``: any function of the file)."""

STACK_DEPTH = 4
"""User frames kept in the ``stack`` column (innermost first)."""


def aten_name(struct: str) -> str:
    """``aten::div`` from the ``at::_ops`` struct name ``div_Tensor`` (the overload dropped: the part
    from ``_`` and a capital letter, then :data:`OVERLOAD_SUFFIXES`)."""
    m = re.search(r"_[A-Z]", struct[1:])
    name = struct[:m.start() + 1] if m else struct
    changed = True
    while changed:
        changed = False
        for s in OVERLOAD_SUFFIXES:
            if name.endswith("_" + s) and len(name) > len(s) + 1:
                name, changed = name[:-len(s) - 1], True
    return "aten::" + name


FrameReading = tuple[str | None, bool, str | None, str | None]
"""(op, op is a factory, user source line, category hint) of one frame."""


def frames_summary(frames: Any, cache: dict[Any, FrameReading] | None = None, *, by_id: bool = False
                   ) -> tuple[str | None, str | None, str | None, str | None]:
    """(op, source, hint, stack) of a snapshot traceback (innermost frame first).

    ``op``: the innermost ``at::_ops::NAME::call`` C++ frame outside :data:`FACTORY_OPS`, as
    ``aten::NAME`` (:func:`aten_name`); ``source``: the innermost Python frame outside torch, the
    standard library and :data:`PLUMBING`, ``file.py:line function``; ``stack``: that frame and the
    user frames above it (at most :data:`STACK_DEPTH`, `` < ``-joined); ``hint`` (rule 1 of
    :func:`categorize`): ``optimizer`` when a frame is in ``torch/optim/``, ``weights`` under a
    :data:`WEIGHT_LOADERS` frame, ``gradient`` in autograd's backward engine, ``workspace`` a
    cuBLAS/cuDNN workspace, ``cuda_graph_pool`` inside a CUDA-graph capture, ``kv_cache`` a frame
    naming a KV cache. ``cache`` maps (name, file, line) to a frame's reading, or with ``by_id`` the
    frame dict's ``id`` (only while every frame dict stays alive, as an unpickler's memo keeps them).
    """
    op = factory = hint = None
    users: list[str] = []
    if not isinstance(frames, list):
        return None, None, None, None
    for f in frames:
        if f.__class__ is not dict:
            continue
        key = id(f) if by_id else (f.get("name"), f.get("filename"), f.get("line"))
        got = cache.get(key) if cache is not None else None
        if got is None:
            try:
                got = _frame(f.get("name"), f.get("filename"), f.get("line"))
            except TypeError:  # an unhashable name or file: nothing to say
                continue
            if cache is not None and len(cache) < FRAME_CACHE:
                cache[key] = got
        o, is_factory, src, h = got
        if o is not None:
            if not is_factory and op is None:
                op = o
            elif is_factory and factory is None:
                factory = o
        if src is not None and len(users) < STACK_DEPTH:
            users.append(src)
        if hint is None and h is not None:
            hint = h
    return (op or factory, users[0] if users else None, hint, " < ".join(users) if users else None)


FRAME_CACHE = 1 << 18
"""Distinct frames whose reading is kept (a hostile file cannot grow the cache past this)."""


def _frame(name: Any, file: Any, line: Any) -> FrameReading:
    """What one frame says (see :func:`frames_summary`)."""
    if not isinstance(name, str) or not isinstance(file, str):
        return None, False, None, None
    if name.startswith("at::_ops::") and "::call(" in name:
        struct = name[len("at::_ops::"):name.index("::call(")]
        op = aten_name(struct)
        return op, op[len("aten::"):] in FACTORY_OPS, None, None
    if not file.endswith(".py"):
        if "torch::autograd::Engine" in name or "autograd::generated" in name:
            return None, False, None, "gradient"
        if "Workspace" in name or "workspace" in name:
            return None, False, None, "workspace"
        return None, False, None, None
    low = "/" + file.replace("\\", "/").lstrip("/")
    hint = None
    if "/torch/optim/" in low:
        hint = "optimizer"
    elif "/torch/cuda/graphs.py" in low:
        hint = "cuda_graph_pool"
    elif "kv_cache" in name or "kv_cache" in low or "/cache_utils.py" in low:
        hint = "kv_cache"
    elif any(path in low and (not fns or name in fns) for path, fns in WEIGHT_LOADERS):
        hint = "weights"
    stdlib = "/lib/python" in low and "-packages/" not in low
    if "/torch/" in low or stdlib or any(p in low for p in PLUMBING):
        return None, False, None, hint
    return None, False, f"{low.rsplit('/', 1)[-1]}:{line} {name}", hint
