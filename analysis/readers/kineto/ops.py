"""The CPU side of a Kineto trace: the nested annotations, ops and launch calls of every
thread, the analytic cost of each op, and the links kernel -> launch call -> costed op.

Linking (FORMATS.md §4.6): a GPU event's ``correlation`` names its launch call
(``cuda_runtime``/``cuda_driver``); the launch sits inside the CPU operator that issued it
(found by ``External id``, else by time containment on the launching thread). The costed op is
that operator or its nearest enclosing op that the cost model prices (``analysis.costs``); its
FLOPs and bytes go to its kernels, split by kernel time when it launched several. A kernel with
no costed op around its launch is named after the op that launched it, its cost missing.

Everything here works on arrays: names are int32 codes into the trace's string table, and
per-name or per-input work (cost formulas, JSON text) is done once per distinct value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.schema import factorize

from ...costs.framework import OpContext, kernel_precision, step_attention
from ...costs.operators import (
    COMPOSITE_WHEN_PARENT,
    base_name,
    category_of,
    has_formula,
    launched_aside,
    needs_step,
    op_cost,
)
from ...tree import Nesting, nest
from .parse import ParsedTrace, clean_text

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

ANN, OP, API = 0, 1, 2
"""Node kinds: the index of ``ann``, ``op``, ``api`` in ``kineto_parse.CPU_KINDS``."""


def per_distinct_text(values: np.ndarray, fn: Any) -> np.ndarray:
    """``fn(v)`` for each value of an object array, computed once per distinct value."""
    if not len(values):
        return np.empty(0, dtype=object)
    codes, uniq = factorize(pd.Series(values, dtype=object, copy=False))  # long shared names: by identity
    table = np.array([fn(u) for u in uniq] + [None], dtype=object)
    return table[codes]


def times_ns(cols: Mapping[str, np.ndarray], base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start_ns, end_ns, duration_ns) from ``ts``/``dur`` in microseconds; negative durations are 0."""
    scaled = np.multiply(cols["ts"], 1000.0)  # one scratch array, rounded in place
    start = np.rint(scaled, out=scaled).astype("int64")
    start += base
    np.multiply(cols["dur"], 1000.0, out=scaled)
    dur = np.rint(scaled, out=scaled).astype("int64")
    np.maximum(dur, 0, out=dur)
    return start, start + dur, dur


def one_text(text: str, n: int) -> np.ndarray:
    """An object column of ``n`` rows that all hold the one ``text`` object (``np.full`` would make a str per row;
    a pandas literal, an Arrow string column that :func:`perfscope.schema.conform` turns back into this)."""
    out = np.empty(n, dtype=object)
    out.fill(text)
    return out


def labels(mask: np.ndarray, yes: str | None, no: str | None) -> np.ndarray:
    """``yes`` where ``mask``, else ``no``: one shared object each (no string per row)."""
    choices = np.empty(2, dtype=object)
    choices[0], choices[1] = no, yes
    return choices[mask.astype("int8")]


@dataclass
class CpuNodes:
    """Annotations, ops and launch calls of every CPU thread, nested by time containment.

    ``cols`` holds one array per field (positions: annotations first, then ops, then calls;
    ``name`` and ``thread`` are codes into ``strings``); ``nesting`` their parents; ``sigs``
    the ops' distinct recorded inputs.
    """

    cols: dict[str, np.ndarray]
    nesting: Nesting
    sigs: list[tuple[Any, Any, Any]]
    strings: np.ndarray
    world_size: int | None = None
    """Ranks of the job (``distributedInfo``), for the costs of collectives and sharded layers."""
    memo: dict[str, Any] = field(default_factory=dict, repr=False)
    """What several tables ask of the nodes, made once (:func:`launch_calls`, :func:`launch_ops`)."""

    def __getitem__(self, key: str) -> np.ndarray:
        return self.cols[key]

    def of(self, kind: int) -> np.ndarray:
        return np.flatnonzero(self.cols["kind"] == kind)

    def names(self, idx: np.ndarray) -> np.ndarray:
        return texts(self.strings, self.cols["name"][idx])

    def durations(self, idx: np.ndarray) -> np.ndarray:
        return self.cols["end_ns"][idx] - self.cols["start_ns"][idx]

    def per_name(self, idx: np.ndarray | slice, fn: Any) -> np.ndarray:
        return per_distinct(self.strings, self.cols["name"][idx], fn)

    def name_flags(self, idx: np.ndarray | slice, fn: Any) -> np.ndarray:
        """``bool(fn(name))`` of each node ``idx`` (:func:`per_distinct_flag`)."""
        return per_distinct_flag(self.strings, self.cols["name"][idx], fn)


def texts(strings: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The strings of ``codes`` (None for -1)."""
    return per_distinct(strings, codes, lambda s: s)


def per_distinct(strings: np.ndarray, codes: np.ndarray, fn: Any) -> np.ndarray:
    """``fn(text)`` for each string code, computed once per distinct code (None for -1)."""
    table = np.full(len(strings) + 1, None, dtype=object)  # the last slot answers code -1
    for code in _distinct(strings, codes):
        table[code] = fn(strings[code])
    return table[codes]


def per_distinct_flag(strings: np.ndarray, codes: np.ndarray, fn: Any) -> np.ndarray:
    """``bool(fn(text))`` for each string code, once per distinct code (False for -1): what
    ``per_distinct(...).astype(bool)`` gives, gathered from a bool table (no object array of a
    Python bool per row to make and convert: 595k nodes, twice, took 0.024 s)."""
    table = np.zeros(len(strings) + 1, dtype=bool)  # the last slot answers code -1
    for code in _distinct(strings, codes):
        table[code] = bool(fn(strings[code]))
    return table[codes]


def _distinct(strings: np.ndarray, codes: np.ndarray) -> list[int]:
    """The distinct codes (-1 aside), ascending, by counting (codes index ``strings``): a tenth of
    np.unique's sort."""
    return np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(strings))).tolist()  # type: ignore[no-any-return]


def cpu_nodes(trace: ParsedTrace, base: int) -> CpuNodes:
    cols = dict(trace.cpu)
    cols["start_ns"], cols["end_ns"], _ = times_ns(cols, base)
    nesting = nest(cols["thread"], cols["start_ns"], cols["end_ns"], cols["kind"],
                   lambda pos: texts(trace.strings, cols["name"][pos]), range_kind=ANN, op_kind=OP)
    cols["op_children"] = nesting.op_children(cols["kind"], OP)
    return CpuNodes(cols, nesting, trace.sigs, trace.strings, world_size(trace.meta))


def world_size(meta: Mapping[str, Any]) -> int | None:
    """``distributedInfo.world_size`` of a trace's metadata (None when absent or unusable)."""
    info = meta.get("distributedInfo")
    value = info.get("world_size") if isinstance(info, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def op_contexts(nodes: CpuNodes, idx: np.ndarray) -> tuple[np.ndarray, list[OpContext]]:
    """Per op ``idx``, a code into the distinct :class:`OpContext` list: the job's ranks for
    all, and for the ops whose formula needs it the step of the nearest enclosing step
    annotation (:func:`.costs_framework.step_attention`)."""
    base = OpContext(world_size=nodes.world_size)
    contexts, codes = [base], np.zeros(len(idx), dtype="int64")
    needs = nodes.name_flags(idx, needs_step)
    if needs.any():
        paths = nodes.nesting.range_path(idx[needs])
        memo: dict[Any, int] = {}
        out = np.zeros(int(needs.sum()), dtype="int64")
        for j, path in enumerate(paths.tolist()):
            if path not in memo:
                work = next((w for w in map(step_attention, reversed(str(path or "").split("/"))) if w), None)
                memo[path] = 0 if work is None else len(contexts)
                if work is not None:
                    contexts.append(OpContext(attention=work, world_size=nodes.world_size))
            out[j] = memo[path]
        codes[needs] = out
    return codes, contexts


def _json(v: Any) -> str | None:
    if not isinstance(v, list):
        return None
    try:
        return json.dumps(v, separators=(",", ":"))
    except (ValueError, RecursionError):
        return None


def _first_dtype(types: Any) -> str | None:
    from ...costs.base import DTYPE_NAMES

    if isinstance(types, list):
        for t in types:
            if isinstance(t, str) and t not in ("", "Scalar", "ScalarList", "TensorList", "GenericList"):
                return clean_text(DTYPE_NAMES.get(t.lower(), t))
    return None


def op_inputs(nodes: CpuNodes, idx: np.ndarray) -> dict[str, np.ndarray]:
    """``op_shapes``, ``op_input_types`` (JSON text) and ``dtype`` of the ops ``idx``."""
    sig = nodes["sig"][idx]
    def text(s: int) -> tuple[Any, Any, Any]:
        if s < 0:  # the op recorded no inputs
            return None, None, None
        dims, types, _ = nodes.sigs[s]
        return _json(dims), _json(types), _first_dtype(types)

    used, where = np.unique(sig, return_inverse=True)  # each distinct signature's text made once
    texts = [text(s) for s in used.tolist()]
    out = {}
    for k, name in enumerate(("op_shapes", "op_input_types", "dtype")):
        values = np.empty(len(texts), dtype=object)
        values[:] = [t[k] for t in texts]
        out[name] = values[where.reshape(-1)]
    return out


def op_costs(nodes: CpuNodes, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Analytic ``flops``, ``dram_bytes``, ``category`` and ``precision`` of the ops ``idx``
    (one cost per distinct name, recorded inputs and :class:`OpContext`)."""
    name, sig = nodes["name"][idx].astype("int64"), nodes["sig"][idx].astype("int64")
    ctx, contexts = op_contexts(nodes, idx)
    width = len(nodes.sigs) + 1
    keys, inverse = np.unique((ctx * len(nodes.strings) + name) * width + sig + 1, return_inverse=True)
    flops, nbytes, cats, precs = np.full(len(keys), np.nan), np.full(len(keys), np.nan), [], []
    for k, key in enumerate(keys.tolist()):
        rest, s = divmod(key, width)
        c, code = divmod(rest, len(nodes.strings))
        text = str(nodes.strings[code])
        dims, types, concrete = nodes.sigs[s - 1] if s >= 1 else (None, None, None)
        cost = op_cost(text, dims, types, concrete, contexts[c])
        if cost is not None:
            flops[k], nbytes[k] = cost.flops, cost.bytes
        cats.append(cost.category if cost is not None else category_of(text))
        precs.append(cost.precision if cost is not None else None)
    inverse = inverse.reshape(-1)
    empty = np.empty(0, dtype=object)
    return {"flops": flops[inverse], "dram_bytes": nbytes[inverse],
            "category": np.array(cats, dtype=object)[inverse] if len(keys) else empty,
            "precision": np.array(precs, dtype=object)[inverse] if len(keys) else empty}


def select_cpu_rows(nodes: CpuNodes) -> np.ndarray:
    """Outermost ops that have a formula (or are leaves): they never nest, so times add up."""
    ops = nodes.of(OP)
    chosen: list[int] = []
    covered_end: dict[str, int] = {}
    fits = nodes.name_flags(ops, lambda n: has_formula(n) and base_name(n) not in COMPOSITE_WHEN_PARENT)
    leaf = nodes["op_children"][ops] == 0
    for i, key, start, end, ok in zip(ops.tolist(), nodes["thread"][ops].tolist(), nodes["start_ns"][ops].tolist(),
                                      nodes["end_ns"][ops].tolist(), (leaf | fits).tolist()):
        if start < covered_end.get(key, -1):
            continue
        if ok:
            chosen.append(i)
            covered_end[key] = end
    return np.array(chosen, dtype="int64")


def _costed_flags(nodes: CpuNodes) -> np.ndarray:
    """Per node: an op the cost model prices itself (not a composite that delegates to a child)."""
    everyone = slice(None)
    priced = nodes.name_flags(everyone, has_formula)
    composite = nodes.name_flags(everyone, lambda n: base_name(n) in COMPOSITE_WHEN_PARENT)
    return (nodes["kind"] == OP) & priced & ~(composite & (nodes["op_children"] > 0))


def launches(nodes: CpuNodes, *, costed: bool = True) -> tuple[pd.Index, np.ndarray, np.ndarray]:
    """Launch calls by correlation id: (their ids, node positions, costed op positions or -1).

    The costed op is the launching op (by External id, else by time containment) or its
    nearest op ancestor that has a formula.
    """
    index, api = launch_calls(nodes)
    if not costed:
        return index, api, np.full(len(api), -1)
    return index, api, first_along(launch_ops(nodes), _costed_flags(nodes), nodes.nesting.op_ancestor)


def launch_calls(nodes: CpuNodes) -> tuple[pd.Index, np.ndarray]:
    """The launch calls with a correlation id, the first of each id: (their ids, node positions);
    made once per nodes (the kernel and the transfer tables both ask)."""
    got = nodes.memo.get("launch_calls")
    if got is None:
        api = nodes.of(API)
        corr = nodes["corr"][api]
        keep = ~np.isnan(corr) & ~pd.Series(corr).duplicated().to_numpy()
        got = nodes.memo["launch_calls"] = (pd.Index(corr[keep]), api[keep])
    return got  # type: ignore[no-any-return]


def launch_ops(nodes: CpuNodes) -> np.ndarray:
    """:func:`launching_ops` of the :func:`launch_calls`, made once per nodes."""
    got = nodes.memo.get("launch_ops")
    if got is None:
        got = nodes.memo["launch_ops"] = launching_ops(nodes, launch_calls(nodes)[1])
    return got  # type: ignore[no-any-return]


def launching_ops(nodes: CpuNodes, api: np.ndarray) -> np.ndarray:
    """The op that issued each launch call ``api`` (node positions): the op of the call's
    ``External id``, else the innermost op around the call; -1 where there is none."""
    ops = nodes.of(OP)
    ext = nodes["ext"][ops]
    has_ext = ~np.isnan(ext) & ~pd.Series(ext).duplicated().to_numpy()
    by_ext = pd.Index(ext[has_ext]).get_indexer(nodes["ext"][api])
    return np.where(by_ext >= 0, take_at(ops[has_ext], by_ext, -1), nodes.nesting.op_ancestor[api])


def take_at(values: np.ndarray, pos: np.ndarray, fill: Any) -> np.ndarray:
    """``values[pos]`` where ``pos >= 0``, ``fill`` elsewhere."""
    out = np.full(len(pos), fill, dtype=values.dtype if values.dtype != bool else object)
    ok = pos >= 0
    out[ok] = values[pos[ok]]
    return out


def first_along(start: np.ndarray, flag: np.ndarray, ancestor: np.ndarray, limit: int = 64) -> np.ndarray:
    """First node with ``flag`` on each chain start, ancestor(start), ... (at most ``limit`` steps;
    -1 where none): the costed op around a launch, the module around a Python call."""
    out = np.full(len(start), -1, dtype="int64")
    cur = start.astype("int64")
    active = np.flatnonzero(cur >= 0)
    for _ in range(limit):
        if not active.size:
            break
        hit = flag[cur[active]]
        out[active[hit]] = cur[active[hit]]
        active = active[~hit]
        cur[active] = ancestor[cur[active]]
        active = active[cur[active] >= 0]
    return out


def split_by_time(values: np.ndarray, group: np.ndarray, dur: np.ndarray,
                  takes: np.ndarray | None = None) -> np.ndarray:
    """Each kernel's share of its group's value (``values``: the group's, at each kernel), split over the
    group's kernels by kernel time (equally where their time is 0). With ``takes``, only the kernels it marks
    share the value and the others get NaN (a kernel :func:`launched_aside`), unless none of the group's
    kernels is marked: then all of them share it, so that no op's count is lost."""
    dur = np.asarray(dur, dtype="float64")
    if takes is None:
        takes = np.ones(len(group), dtype=bool)
    marked = np.bincount(group, weights=takes.astype("float64"), minlength=len(group))[group] > 0
    takes = takes | ~marked
    weight = np.where(takes, dur, 0.0)
    total = np.bincount(group, weights=weight, minlength=len(group))[group]
    count = np.bincount(group, weights=takes.astype("float64"), minlength=len(group))[group]
    frac = np.where(total > 0, weight / np.where(total > 0, total, 1.0), takes / np.where(count > 0, count, 1.0))
    return np.where(takes, values * frac, np.nan)


def per_pair(ops: np.ndarray, names: np.ndarray, fn: Callable[[Any, Any], Any]) -> list[Any]:
    """``fn(op, kernel name)`` for each kernel, computed once per distinct pair."""
    memo: dict[tuple[Any, Any], Any] = {}
    return [memo[key] if key in memo else memo.setdefault(key, fn(*key)) for key in zip(ops.tolist(), names.tolist())]


def pair_flags(ops: np.ndarray, names: np.ndarray, fn: Callable[[Any, Any], bool]) -> np.ndarray:
    """:func:`per_pair` of a yes/no test, as a boolean array."""
    return np.array(per_pair(ops, names, fn), dtype=bool).reshape(-1)


def attributed_costs(names: np.ndarray, dur: np.ndarray, cost_op: np.ndarray,
                      nodes: CpuNodes, launcher: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The costed op's name, inputs and FLOPs/bytes for each kernel, split by kernel time; a
    kernel with no costed op takes the name and inputs of its ``launcher`` (the op that issued
    it, when given), its FLOPs and bytes missing."""
    n = len(names)
    if launcher is not None:
        uncosted = (cost_op < 0) & (launcher >= 0)
        if uncosted.any():
            out = attributed_costs(names, dur, np.where(uncosted, launcher, cost_op), nodes)
            for c in ("flops", "dram_bytes"):
                out[c][uncosted] = np.nan
            out["precision"][uncosted] = per_distinct_text(names[uncosted], kernel_precision)
            for c, v in (("flops_source", out["flops"]), ("bytes_source", out["dram_bytes"])):
                out[c] = labels(~np.isnan(v), "analytic", None)
            return out
    has = cost_op >= 0
    cols: dict[str, np.ndarray] = {c: np.full(n, None, dtype=object)
                                   for c in ("op", "op_shapes", "op_input_types", "dtype", "precision")}
    flops, nbytes = np.full(n, np.nan), np.full(n, np.nan)
    ops, inverse = np.unique(cost_op[has], return_inverse=True)
    inverse = inverse.reshape(-1)
    cols["op"][has] = nodes.names(ops)[inverse]
    # each kernel's category and whether its op launched it beside its work, in one pass per distinct pair
    pairs = per_pair(cols["op"], names, lambda op, name: (category_of(op, name), launched_aside(op, name)))
    category = np.array([c for c, _ in pairs], dtype=object)
    if has.any():
        costs = op_costs(nodes, ops)
        for name, values in op_inputs(nodes, ops).items():
            cols[name][has] = values[inverse]
        takes = ~np.array([a for _, a in pairs], dtype=bool)[has]
        flops[has] = split_by_time(costs["flops"][inverse], inverse, dur[has], takes)
        nbytes[has] = split_by_time(costs["dram_bytes"][inverse], inverse, dur[has], takes)
        cols["precision"][has] = costs["precision"][inverse]
    stated = per_distinct_text(names, kernel_precision)
    cols["precision"] = np.where(has & pd.notna(stated), stated, cols["precision"])
    known = ~np.isnan(flops)
    moved = ~np.isnan(nbytes)
    return {**cols, "flops": flops, "dram_bytes": nbytes, "category": category,
            "flops_source": labels(known, "analytic", None), "bytes_source": labels(moved, "analytic", None)}
