"""Costs for kernels launched by a CUDA graph replay (``cudaGraphLaunch``).

A graph replay launches its kernels from one API call: Kineto links them to that call, not to
the aten ops that recorded them, so they carry no op and no shapes. Each replay's kernels get
their op and FLOPs/bytes here, by the first method that applies, recorded in ``flops_source``:

``graph-capture``
    The replay's exact kernel-name sequence was also launched eagerly in the trace (the
    warm-up / recording run of ``torch.compile(mode="reduce-overhead")``, or an eager run of
    the same compiled code): each kernel takes the op and cost of the kernel at the same
    position. Inductor's Triton kernel names and the cuBLAS kernels chosen for the same shapes
    are the same in the capture and in the replays.
``graph-capture-trace``
    The replay's kernel-name sequence is (a contiguous run of) a graph in a capture trace the
    engine wrote (``perfscope import --capture``, or a ``capture_traces/`` folder beside the
    trace; :mod:`.capture_traces`), of the batch size of the step around the replay: each
    kernel takes the op, shapes and cost of the captured launch at the same position (an op's
    cost split over its kernels by replay time), and the ``nn.Module`` calls around that launch
    inside the capture (column ``capture_module``). An op whose formula needs the step's sequence
    sums (attention), which the capture range lacks, is priced with its captured inputs and the
    step annotation around the replay's launch (:meth:`_Context._step_costs`, the same
    :func:`.costs.op_cost`), else left missing. A replay that matches no graph exactly is left
    to the methods below, and one warning names the mismatch: kernel names alone do not tell
    a graph of another batch size or model apart kernel by kernel, so there is no partial join.
``graph-match``
    Every kernel of the replay has an eager twin with the same name, grid and block (the
    grid encodes the problem size), and all the twins carry one cost: that cost.
``graph-shapes`` / ``graph-scaled``
    The model's step was also run eagerly in the trace (typically the prefill: the reference
    engine and most servers compile decode only). The replay's GEMM kernels are matched in
    order to that step's GEMM ops and its attention kernels to the step's attention ops (the
    counts must agree); their recorded shapes are re-derived for the replay's step (one token
    per sequence in decode, the KV length of that decode step: the reference's KV length plus
    the number of decode steps since) and priced by the analytic formulas of
    :mod:`.costs` (``graph-shapes``; a split-K reduction kernel shares its GEMM's cost by
    time). The fused elementwise kernels between two such anchors get the eager cost of the
    reference ops between the same anchors, scaled by the token count
    (``graph-scaled``: exact for per-token ops, and an upper bound on the bytes of a fused
    kernel, which does not write the intermediates the eager ops did).

The decode step index (for the KV length) counts the outermost ``decode`` ranges since the last
``prefill`` range: the reference engine's pattern. Where prefills of new requests interleave with
decode steps (continuous batching), the count restarts at each prefill, and the attention cost of
the other sequences is underestimated by the context they gained before that prefill (the GEMMs,
most of a decode step's FLOPs and bytes at short contexts, stay exact).

Replays none of these apply to keep NaN costs, and :func:`graph_costs` says why in a warning.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfscope.schema import factorize

from ...costs.args import OpContext, StepAttention, step_attention
from ...costs.base import ATTENTION, CATEGORY_OF
from ...costs.operators import base_name, category_of, launched_aside, needs_step, op_cost
from ...tree import PHASES
from .capture import SOURCE as CAPTURE_SOURCE
from .capture import CaptureLoader, CaptureSet, join_graph, step_batch
from .ops import ANN, CpuNodes, _first_dtype, _json, op_costs, pair_flags, split_by_time

GRAPH_LAUNCH = "GraphLaunch"
"""Substring of the launch calls that replay a graph (``cudaGraphLaunch``, ``cuGraphLaunch``,
``hipGraphLaunch`` and their ``_v``/``_ptsz`` variants)."""

SOURCES = ("graph-capture", "graph-capture-trace", "graph-match", "graph-shapes", "graph-scaled")
"""The ``flops_source`` values this module writes."""

GEMM_OPS = frozenset(CATEGORY_OF["gemm"])
ACTIVATION_ARG = {"addmm": 1, "baddbmm": 1, "addmv": 1}
"""Position of the activation (token-sized) input of a GEMM op; 0 when not listed."""

COLUMNS = ("op", "op_shapes", "op_input_types", "dtype", "category")

CAPTURE_MODULE = "capture_module"
"""The kernel column a replay joined to a capture trace gets: the '/'-joined ``nn.Module`` calls
around its captured launch, inside the capture (the hierarchy puts them below the modules around
the replay's graph launch)."""


def kernel_role(name: str) -> str:
    """``gemm``, ``reduce`` (a split-K reduction of the GEMM or attention before it), ``attention`` or
    ``fused`` (elementwise, norms, Triton kernels, anything else) for a kernel name."""
    text = name.lower()
    if text.startswith("triton") or "triton_" in text:
        # inductor's GEMM templates (max-autotune) are GEMMs; other Triton kernels are fusions
        return "gemm" if "_tem_" in text and ("_mm" in text or "_bmm" in text or "addmm" in text) else "fused"
    if any(s in text for s in ("splitkreduce", "splitk_reduce", "splitkv_combine")):
        return "reduce"
    if any(s in text for s in ("sdpa", "flash", "fmha", "attention", "attn")):
        return "attention"
    if "gemv" in text or category_of(None, name) == "gemm":
        return "gemm"
    return "fused"


def op_role(op: str) -> str:
    name = base_name(op)
    return "gemm" if name in GEMM_OPS else "attention" if name in ATTENTION else "fused"


@dataclass
class Kernels:
    """The kernel columns this module reads (aligned arrays, the trace's kernel order)."""

    names: np.ndarray
    grid: np.ndarray
    block: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    corr: np.ndarray
    launch_name: np.ndarray
    launch_start: np.ndarray
    cost_op: np.ndarray


@dataclass
class Step:
    """One outermost ``prefill``/``decode`` range: its phase and decode index (0 for prefill,
    k for the k-th decode step after it)."""

    phase: str
    index: int
    start: int
    end: int


def graph_costs(k: Kernels, cols: dict[str, np.ndarray], nodes: CpuNodes,
                captures: CaptureLoader | None = None) -> list[str]:
    """Fill the op, cost and source columns of ``cols`` (from :func:`~.kineto_ops.attributed_costs`,
    aligned with ``k``) for every graph-launched kernel; ``captures`` reads the capture traces
    to join the replays to (when there are replays). Returns warnings."""
    graph = _per_distinct(k.launch_name, lambda n: isinstance(n, str) and GRAPH_LAUNCH in n, bool)
    if not graph.any():
        return []
    for c in ("flops", "dram_bytes"):
        cols[c][graph] = np.nan
    for c in COLUMNS:
        cols[c][graph] = None
    cols["category"][graph] = _per_distinct(k.names[graph], lambda n: category_of(None, n), object)
    order = np.argsort(k.start, kind="stable")
    eager = order[~graph[order]]
    steps = _steps(nodes)
    step_of = _step_index(steps, k.launch_start)
    ctx = _Context(k, cols, nodes, eager, steps, step_of)
    ctx.captures = captures() if captures is not None else None
    replayed = order[graph[order]]
    corr = k.corr[replayed]
    corr = np.where(np.isnan(corr), -1.0 - np.arange(len(corr)), corr)  # no correlation: a replay each
    replays = pd.Series(replayed).groupby(corr, sort=False).indices  # positions into ``replayed``, in order
    failed = sum(not ctx.cost_replay(replayed[pos]) for pos in replays.values())
    known = ~np.isnan(cols["flops"])
    for c in ("flops_source", "bytes_source"):
        src = cols[c]
        src[graph & ~known] = None
        src[graph & known] = ctx.source[graph & known]
    notes = ctx.capture_notes(len(replays)) if ctx.captures is not None else []
    if failed and not ctx.mismatch:
        note = (f"{failed} of {len(replays)} CUDA graph replays have no eager twin or reference step in the "
                "trace: their kernels' FLOPs/bytes are left missing (profile a warm-up or an eager step too, "
                "or give the engine's capture traces: --capture)")
        return notes + [note]
    return notes


def _steps(nodes: CpuNodes) -> list[Step]:
    ann = nodes.of(ANN)
    names = nodes.names(ann)
    pick = np.array([n in PHASES for n in names.tolist()], dtype=bool)
    idx = ann[pick]
    if not len(idx):
        return []
    start, end = nodes["start_ns"][idx], nodes["end_ns"][idx]
    order = np.argsort(start, kind="stable")
    out: list[Step] = []
    decode_k = 0
    for j in order.tolist():
        s, e, name = int(start[j]), int(end[j]), str(names[pick][j])
        if out and s >= out[-1].start and e <= out[-1].end:
            continue  # nested in the previous step
        decode_k = 0 if name == "prefill" else decode_k + 1
        out.append(Step(name, decode_k, s, e))
    return out


def _step_index(steps: list[Step], t: np.ndarray) -> np.ndarray:
    if not steps:
        return np.full(len(t), -1, dtype="int64")
    starts = np.array([s.start for s in steps], dtype="int64")
    ends = np.array([s.end for s in steps], dtype="int64")
    pos = np.searchsorted(starts, t, side="right") - 1
    ok = (pos >= 0) & (t <= ends[np.maximum(pos, 0)])
    return np.where(ok, pos, -1)


@dataclass
class _RefOp:
    name: str
    dims: Any
    types: Any
    concrete: Any
    flops: float
    nbytes: float
    dtype: Any
    key: tuple[Any, ...] | None = None  # its content as text (memo key of :meth:`_Context._rescaled_cost`)


class _Context:
    def __init__(self, k: Kernels, cols: dict[str, np.ndarray], nodes: CpuNodes, eager: np.ndarray,
                 steps: list[Step], step_of: np.ndarray) -> None:
        self.k, self.cols, self.nodes, self.eager = k, cols, nodes, eager
        self.steps, self.step_of = steps, step_of
        self.source = np.full(len(k.names), None, dtype=object)
        self.eager_names = k.names[eager]
        self.memo: dict[Any, dict[str, np.ndarray] | None] = {}
        self._twins: dict[tuple[Any, Any, Any], tuple[int, ...] | None] | None = None
        self._refs: dict[int, tuple[list[_RefOp], list[str]]] = {}
        self._costs: dict[tuple[Any, ...], tuple[float, float]] = {}
        self._rescaled: dict[tuple[Any, ...], tuple[str | None, float, float]] = {}
        self._by_anchors: dict[tuple[str, ...], dict[str, list[int]]] | None = None
        self._eager_steps: dict[int, np.ndarray] | None = None
        self._roles: dict[tuple[str, ...], list[str]] = {}
        self._templates: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.captures: CaptureSet | None = None
        self.joined: list[int] = []  # kernels of each replay joined to a capture trace
        self.mismatch: dict[str, int] = {}  # why replays matched no captured graph -> how many
        self.why: dict[Any, str] = {}  # memo key of a failed join -> why
        self._step_ranges: dict[str, tuple[np.ndarray, np.ndarray, list[Any]]] = {}

    # ------------------------------------------------------------------ methods
    def cost_replay(self, idx: np.ndarray) -> bool:
        """Cost one replay's kernels (``idx``, in launch order); each kernel takes the first method
        that prices it. Returns whether any kernel was priced."""
        names = tuple(self.k.names[idx].tolist())
        step = int(self.step_of[idx[0]]) if len(idx) else -1
        dur = self.k.dur[idx].astype("float64")
        todo = np.ones(len(idx), dtype=bool)
        joining = self.captures is not None and bool(self.captures.graphs)
        for method in ((self._capture_trace,) if joining else ()) + (self._capture, self._match, self._shapes):
            key = (method.__name__, names, step if method.__name__ == "_shapes" else
                   self._join_key(idx) if method.__name__ == "_capture_trace" else None)
            if key not in self.memo:
                self.memo[key] = method(idx, names, step)
            found = self.memo[key]
            if found is None:
                if key in self.why:
                    self.mismatch[self.why[key]] = self.mismatch.get(self.why[key], 0) + 1
                continue
            if method.__name__ == "_capture_trace":
                # the join gives every kernel its captured op, shapes and module, costed or not
                for c in COLUMNS:
                    self.cols[c][idx[todo]] = found[c][todo]
                modules = self.cols.setdefault(CAPTURE_MODULE, np.full(len(self.k.names), None, dtype=object))
                modules[idx[todo]] = found["module"][todo]
                self.joined.append(len(idx))
            unit = found["unit"]
            if "aside" not in found:  # once per memoized result, not per replay
                found["aside"] = pair_flags(found["op"], self.k.names[idx], launched_aside)
            aside = found["aside"]
            flops = split_by_time(found["flops"][unit], unit, dur, ~aside)
            nbytes = split_by_time(found["dram_bytes"][unit], unit, dur, ~aside)
            # a unit (a GEMM and its reduction, the fused kernels of one segment) is priced whole
            # by one method, or its cost would be counted twice; a kernel launched aside its op's
            # work goes with its op, uncosted
            priced = ~np.isnan(flops) | (aside & ~np.isnan(found["flops"][unit]))
            take = todo & priced & ~np.isin(unit, unit[~todo])
            for c in COLUMNS:
                self.cols[c][idx[take]] = found[c][take]
            self.cols["flops"][idx[take]], self.cols["dram_bytes"][idx[take]] = flops[take], nbytes[take]
            self.source[idx[take]] = found["source"][take]
            todo &= ~take
            if not todo.any():
                break
        return not todo.all()

    def _capture_trace(self, idx: np.ndarray, names: tuple[str, ...], step: int) -> dict[str, np.ndarray] | None:
        """The replay joined to the captured graph of its batch size whose kernel sequence holds it."""
        if self.captures is None or not self.captures.graphs:
            return None
        key = self._join_key(idx)
        batch, work = key
        found = join_graph(self.captures, names, batch)
        if isinstance(found, str):
            self.why[("_capture_trace", names, key)] = found
            return None
        graph, at = found
        n = len(names)
        out = {c: graph.cols[c][at:at + n].copy() for c in (*COLUMNS, "flops", "dram_bytes", "module")}
        self._step_costs(out, graph.cols["inputs"][at:at + n], work)
        unit = graph.cols["unit"]
        cut = np.bincount(unit[at:at + n], minlength=len(unit)) < np.bincount(unit, minlength=len(unit))
        cut = cut[unit[at:at + n]]  # an op with kernels outside the run: its split is unknown
        out["flops"][cut], out["dram_bytes"][cut] = np.nan, np.nan
        out["unit"] = np.where(cut, np.arange(n), unit[at:at + n] - at)
        out["source"] = np.full(n, CAPTURE_SOURCE, dtype=object)
        return out

    def _join_key(self, idx: np.ndarray) -> tuple[int | None, StepAttention | None]:
        """What a replay's join depends on beyond its kernel names: the batch size of the step
        range around its launch (which graph) and the step's attention sums (its attention ops'
        cost); None where no range around the launch gives it."""
        return self._around(idx, "batch", step_batch), self._around(idx, "attention", step_attention)

    def _around(self, idx: np.ndarray, what: str, parse: Any) -> Any:
        """``parse(name)`` of the innermost annotation around the replay's launch for which it is
        not None (the step ranges: ``step_batch``, ``step_attention``), else None."""
        if not len(idx):
            return None
        if what not in self._step_ranges:
            ann = self.nodes.of(ANN)
            values = self.nodes.per_name(ann, parse).tolist()
            keep = np.array([v is not None for v in values], dtype=bool)
            self._step_ranges[what] = (self.nodes["start_ns"][ann][keep], self.nodes["end_ns"][ann][keep],
                                       [v for v in values if v is not None])
        starts, ends, found = self._step_ranges[what]
        t = self.k.launch_start[idx[0]]
        inside = np.flatnonzero((starts <= t) & (t <= ends))
        if not len(inside):
            return None
        return found[int(inside[np.argmax(starts[inside])])]  # the innermost

    def _step_costs(self, out: dict[str, np.ndarray], inputs: np.ndarray, work: StepAttention | None) -> None:
        """Price the joined ops whose formula needs the step (attention: the capture range gives
        no sequence lengths, so the capture left them missing) with their captured inputs and the
        replay's step sums, through the one :func:`.costs.op_cost`. Without a step annotation
        around the replay they stay missing."""
        if work is None:
            return
        ops = out["op"]
        todo = [i for i, o in enumerate(ops.tolist()) if o is not None and np.isnan(out["flops"][i])
                and inputs[i] is not None and needs_step(str(o))]
        context = OpContext(attention=work, world_size=self.nodes.world_size)
        for i in todo:
            dims, types, concrete = inputs[i]
            key = ("step", ops[i], _json(dims), _json(types), repr(concrete), work)
            if key not in self._costs:
                cost = op_cost(str(ops[i]), dims, types, concrete, context)
                self._costs[key] = (np.nan, np.nan) if cost is None else (cost.flops, cost.bytes)
            out["flops"][i], out["dram_bytes"][i] = self._costs[key]

    def capture_notes(self, n_replays: int) -> list[str]:
        """The report's lines on the capture traces: what was found and joined, and why not."""
        cs = self.captures
        assert cs is not None
        where = f"{cs.path}" + (" (found beside the trace)" if cs.found != "--capture" else "")
        notes = list(cs.warnings)
        graphs = ", ".join(g.label() for g in cs.graphs[:4]) + (f" + {len(cs.graphs) - 4} more" if len(cs.graphs) > 4
                                                               else "")
        if self.joined:
            notes.append(f"graph replays joined to the capture trace(s) {where}: {len(self.joined)} of {n_replays} "
                         f"replays, {sum(self.joined)} kernels take their captured op, shapes and cost "
                         f"(flops_source graph-capture-trace; graphs: {graphs or 'none'})")
        if self.mismatch:
            why = max(self.mismatch.items(), key=lambda kv: kv[1])[0]
            notes.append(f"{sum(self.mismatch.values())} of {n_replays} graph replays match no graph of the capture "
                         f"trace(s) {where}: {why}; their kernels stay uncosted (a capture of another model, "
                         "batch size or engine build?)")
        elif not self.joined and not cs.graphs:
            notes.append(f"the capture trace(s) {where} hold no captured graph: the replays were not joined")
        return notes

    def _capture(self, idx: np.ndarray, names: tuple[str, ...], step: int) -> dict[str, np.ndarray] | None:
        seq, n = self.eager_names, len(names)
        if not n or len(seq) < n:
            return None
        want = np.array(names, dtype=object)
        for c in np.flatnonzero(seq == names[0])[::-1].tolist():
            if c + n > len(seq) or not (seq[c:c + n] == want).all():
                continue
            pos = self.eager[c:c + n]
            if np.isnan(self.cols["flops"][pos]).all():
                continue
            out = {col: self.cols[col][pos].copy() for col in COLUMNS}
            out["flops"], out["dram_bytes"] = self.cols["flops"][pos].copy(), self.cols["dram_bytes"][pos].copy()
            out["unit"] = np.arange(n)
            out["source"] = np.full(n, "graph-capture", dtype=object)
            return out
        return None

    def _match(self, idx: np.ndarray, names: tuple[str, ...], step: int) -> dict[str, np.ndarray] | None:
        twins = self._twin_table()
        keys = list(zip(names, self.k.grid[idx].tolist(), self.k.block[idx].tolist()))
        found = [twins.get(key) for key in keys]
        if not any(f is not None for f in found):
            return None
        pos = np.array([f[0] if f is not None else -1 for f in found], dtype="int64")
        has = pos >= 0
        out: dict[str, np.ndarray] = {col: np.full(len(pos), None, dtype=object) for col in COLUMNS}
        for col in COLUMNS:
            out[col][has] = self.cols[col][pos[has]]
        out["flops"], out["dram_bytes"] = np.full(len(pos), np.nan), np.full(len(pos), np.nan)
        out["flops"][has], out["dram_bytes"][has] = self.cols["flops"][pos[has]], self.cols["dram_bytes"][pos[has]]
        out["unit"] = np.arange(len(pos))
        out["source"] = np.full(len(pos), "graph-match", dtype=object)
        return out

    def _twin_table(self) -> dict[tuple[Any, Any, Any], tuple[int, ...] | None]:
        """(name, grid, block) -> a costed eager kernel, when all such kernels share one cost
        (to 7 significant digits; a kernel of unknown cost is one more distinct cost)."""
        if self._twins is None:
            e = self.eager
            fl = self.cols["flops"][e].astype("float32")
            nb = self.cols["dram_bytes"][e].astype("float32")
            # the (flops, bytes) pair as one integer of the two float32 bit patterns (+ 0.0: -0.0 is 0.0)
            bits = [(np.nan_to_num(v, nan=-1.0) + np.float32(0.0)).view(np.uint32).astype(np.int64) for v in (fl, nb)]
            cost = pd.factorize((bits[0] << 32) | bits[1])[0]
            known = ~np.isnan(fl) & ~np.isnan(nb)
            # (name, grid, block) as one integer key (kernels missing any of them have no twin)
            parts = [factorize(pd.Series(np.asarray(v, dtype=object), dtype=object, copy=False))
                     for v in (self.k.names[e], self.k.grid[e], self.k.block[e])]
            key = np.zeros(len(e), dtype="int64")
            for codes, uniq in parts:
                key = key * (len(uniq) + 1) + codes
            rows = np.flatnonzero(np.all([codes >= 0 for codes, _ in parts], axis=0)) if len(e) else e[:0]
            rows = rows[np.argsort(key[rows], kind="stable")]  # by key, eager order within one
            k, c = key[rows], cost[rows]
            starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if len(rows) else rows
            # distinct costs per key: a cost unlike the previous one among the key's (cost-sorted) rows
            by_cost = np.lexsort((c, k))
            fresh = np.r_[True, (k[by_cost][1:] != k[by_cost][:-1]) | (c[by_cost][1:] != c[by_cost][:-1])]
            n_costs = np.add.reduceat(fresh.astype("int64"), starts) if len(rows) else rows
            all_known = np.logical_and.reduceat(known[rows], starts) if len(rows) else rows.astype(bool)
            first = rows[starts]
            (cn, un), (cg, ug), (cb, ub) = parts
            self._twins = {(un[cn[i]], ug[cg[i]], ub[cb[i]]): ((int(e[i]),) if m == 1 and ok else None)
                           for i, m, ok in zip(first.tolist(), n_costs.tolist(), all_known.tolist())}
        return self._twins

    # ------------------------------------------------------------------ reference step
    def _shapes(self, idx: np.ndarray, names: tuple[str, ...], step: int) -> dict[str, np.ndarray] | None:
        roles = self._roles.get(names)
        if roles is None:
            roles = self._roles[names] = [kernel_role(n) for n in names]
        anchors = tuple(r for r in roles if r in ("gemm", "attention"))
        if not anchors:
            return None
        phase = self.steps[step].phase if step >= 0 else None
        for ref in self._reference_steps(step, anchors):
            if self.steps[ref].phase != phase and not (phase == "decode" and self.steps[ref].phase == "prefill"):
                continue  # shapes are re-derived for a decode step from a prefill, or kept as they are
            ops, oroles = self._ref_ops(ref)
            return self._derive(names, roles, ops, oroles, self.steps[ref], self.steps[step] if step >= 0 else None)
        return None

    def _reference_steps(self, step: int, anchors: tuple[str, ...]) -> list[int]:
        """The eager step to re-derive ``step``'s shapes from, among those whose costed ops have the
        GEMM/attention sequence ``anchors``: the nearest of ``step``'s phase, else (a decode step)
        the nearest prefill; the earlier of two as near. Empty when there is none.

        A bisection in each phase's sorted steps (a long trace has a reference step per prefill:
        sorting them all for every replay made the import quadratic in the trace's length)."""
        if self._by_anchors is None:
            self._by_anchors = {}
            for ref in self._eager_by_step():
                key = tuple(r for r in self._ref_ops(ref)[1] if r != "fused")
                by_phase = self._by_anchors.setdefault(key, {})
                by_phase.setdefault(self.steps[ref].phase, []).append(ref)  # ascending: refs come sorted
        phase = self.steps[step].phase if step >= 0 else None
        by_phase = self._by_anchors.get(anchors, {})
        for p in (phase, "prefill") if phase == "decode" else (phase,):
            refs = by_phase.get(p) if p is not None else None
            if refs:
                return [_nearest(refs, step)]
        return []

    def _eager_by_step(self) -> dict[int, np.ndarray]:
        """Eager kernel positions (``self.eager``'s order) of each step, ascending steps (one
        grouping instead of a scan of every eager kernel per step)."""
        if self._eager_steps is None:
            of = self.step_of[self.eager]
            order = np.argsort(of, kind="stable")
            steps, first = np.unique(of[order], return_index=True)
            cuts = np.append(first, len(order))
            self._eager_steps = {int(s): self.eager[order[cuts[j]:cuts[j + 1]]]
                                 for j, s in enumerate(steps.tolist()) if s >= 0}
        return self._eager_steps

    def _ref_ops(self, ref: int) -> tuple[list[_RefOp], list[str]]:
        """The costed ops of an eager step in launch order, and their roles."""
        if ref not in self._refs:
            pos = self._eager_by_step().get(ref, self.eager[:0])
            op_ids = self.k.cost_op[pos]
            op_ids = np.unique(op_ids[op_ids >= 0])
            nodes = self.nodes
            op_ids = op_ids[np.argsort(nodes["start_ns"][op_ids], kind="stable")]
            costs = op_costs(nodes, op_ids)
            out = []
            for j, o in enumerate(op_ids.tolist()):
                s = int(nodes["sig"][o])
                dims, types, concrete = nodes.sigs[s] if s >= 0 else (None, None, None)
                out.append(_RefOp(str(nodes.strings[nodes["name"][o]]), dims, types, concrete,
                                  float(costs["flops"][j]), float(costs["dram_bytes"][j]), _first_dtype(types)))
            self._refs[ref] = (out, [op_role(o.name) for o in out])
        return self._refs[ref]

    def _cost(self, o: _RefOp, dims: Any) -> tuple[str | None, float, float]:
        """(dims as JSON, FLOPs, bytes) of ``o`` called with ``dims`` (memoised: steps repeat shapes)."""
        text = _json(dims)
        key = (o.name, text, _json(o.types), repr(o.concrete))
        if key not in self._costs:
            cost = op_cost(o.name, dims, o.types, o.concrete)
            self._costs[key] = (np.nan, np.nan) if cost is None else (cost.flops, cost.bytes)
        return (text, *self._costs[key])

    def _rescaled_cost(self, o: _RefOp, batch: int, t_ref: int, t_new: int, s_new: int) -> tuple[str | None, float, float]:
        """:meth:`_cost` of ``o`` at ``t_new`` tokens and KV length ``s_new`` (:func:`_rescale`),
        memoised on the op's content: every replay at one KV length after an equal reference op
        (each request's decode steps, each copy of a repeated run) is priced once."""
        if o.key is None:
            o.key = (o.name, _json(o.dims), _json(o.types), repr(o.concrete))
        key = (o.key, batch, t_ref, t_new, s_new)
        found = self._rescaled.get(key)
        if found is None:
            found = self._rescaled[key] = self._cost(o, _rescale(o, batch, t_ref, t_new, s_new))
        return found

    def _derive(self, names: tuple[str, ...], roles: list[str], ops: list[_RefOp], oroles: list[str],
                ref: Step, step: Step | None) -> dict[str, np.ndarray] | None:
        """The replay's costs from the reference step's ops: the step-independent part once per
        replay sequence and reference, then the attention kernels at this step's KV length."""
        attn = [o for o, r in zip(ops, oroles) if r == "attention"]
        geom = _geometry(attn[0]) if attn else None
        if geom is None and (step is None or step.phase != ref.phase):
            return None  # no token count to re-derive shapes with
        t_ref, s_ref = (geom[1], geom[2]) if geom is not None else (0, 0)
        t_new = 1 if (step is not None and step.phase == "decode" and ref.phase == "prefill") else t_ref
        s_new = s_ref + ((step.index if step is not None else ref.index) - ref.index)
        key = (names, ref.start, t_new)
        tpl = self._templates.get(key)
        if tpl is None:
            tpl = self._templates[key] = self._template(names, roles, ops, oroles, geom, t_new)
        if geom is None or s_new == s_ref or not tpl["attention"]:
            return tpl["out"]
        out = dict(tpl["out"])
        for c in ("op_shapes", "flops", "dram_bytes"):
            out[c] = out[c].copy()
        for i, o in tpl["attention"]:
            text, out["flops"][i], out["dram_bytes"][i] = self._rescaled_cost(o, geom[0], t_ref, t_new, s_new)
            out["op_shapes"][out["unit"] == i] = text
        return out

    def _template(self, names: tuple[str, ...], roles: list[str], ops: list[_RefOp], oroles: list[str],
                  geom: tuple[int, int, int] | None, t_new: int) -> dict[str, Any]:
        batch, t_ref, s_ref = geom if geom is not None else (0, 0, 0)
        n = len(names)
        out: dict[str, np.ndarray] = {c: np.full(n, None, dtype=object) for c in COLUMNS}
        flops, nbytes = np.full(n, np.nan), np.full(n, np.nan)
        unit = np.arange(n)
        source = np.full(n, None, dtype=object)
        attention: list[tuple[int, _RefOp]] = []
        # anchors: the i-th GEMM / attention kernel <-> the i-th GEMM / attention op
        anchor_ops = [o for o, r in zip(ops, oroles) if r != "fused"]
        anchors = [i for i, r in enumerate(roles) if r in ("gemm", "attention")]
        for i, o in zip(anchors, anchor_ops):
            dims = _rescale(o, batch, t_ref, t_new, s_ref) if geom is not None else o.dims
            out["op"][i] = o.name
            out["op_shapes"][i], flops[i], nbytes[i] = self._cost(o, dims)
            out["op_input_types"][i], out["dtype"][i] = _json(o.types), o.dtype
            out["category"][i] = roles[i]
            source[i] = "graph-shapes"
            if roles[i] == "attention":
                attention.append((i, o))
        # split-K reductions share their GEMM's cost
        last = -1
        for i, r in enumerate(roles):
            if r in ("gemm", "attention"):
                last = i
            elif r == "reduce" and last >= 0:
                unit[i] = last
                for c in COLUMNS:
                    out[c][i] = out[c][last]
                source[i] = source[last]
        # the fused kernels between two anchors <-> the eager ops between the same anchors
        scale = t_new / t_ref if t_ref else 1.0
        k_seg = _segments([r if r != "reduce" else "skip" for r in roles])
        o_seg = _segments(oroles)
        for s, kernels in k_seg.items():
            seg_ops = o_seg.get(s, [])
            known = [ops[j] for j in seg_ops if not np.isnan(ops[j].flops)]
            if not kernels or not known:
                continue
            head = kernels[0]
            label = _label([o.name for o in known if o.flops > 0 or o.nbytes > 0] or [known[0].name])
            biggest = max(known, key=lambda o: o.nbytes)
            flops[head] = sum(o.flops for o in known) * scale
            nbytes[head] = sum(o.nbytes for o in known) * scale
            for i in kernels:
                unit[i] = head
                out["op"][i], out["dtype"][i] = label, biggest.dtype
                out["category"][i] = category_of(biggest.name)
                source[i] = "graph-scaled"
        out.update(flops=flops, dram_bytes=nbytes, unit=unit, source=source)
        return {"out": out, "attention": attention}


def _label(names: list[str], limit: int = 4) -> str:
    """The distinct op names of a fused kernel, in order (``a + b + c + 2 more``)."""
    uniq = list(dict.fromkeys(names))
    more = f" + {len(uniq) - limit} more" if len(uniq) > limit else ""
    return " + ".join(uniq[:limit]) + more


def _per_distinct(values: np.ndarray, fn: Any, dtype: Any) -> np.ndarray:
    """``fn`` of each of ``values`` (an object array), called once per distinct value."""
    codes, uniq = pd.factorize(values, use_na_sentinel=False)
    return np.array([fn(u) for u in uniq], dtype=dtype)[codes] if len(uniq) else np.empty(0, dtype=dtype)


def _nearest(refs: list[int], step: int) -> int:
    """The element of the ascending ``refs`` nearest to ``step`` (the smaller of two as near)."""
    j = bisect.bisect_left(refs, step)
    if j == 0:
        return refs[0]
    if j == len(refs) or step - refs[j - 1] <= refs[j] - step:
        return refs[j - 1]
    return refs[j]


def _segments(roles: list[str]) -> dict[int, list[int]]:
    """Positions of the ``fused`` entries, keyed by how many anchors come before them."""
    out: dict[int, list[int]] = {}
    seen = 0
    for i, r in enumerate(roles):
        if r in ("gemm", "attention"):
            seen += 1
        elif r == "fused":
            out.setdefault(seen, []).append(i)
    return out


def _geometry(op: _RefOp) -> tuple[int, int, int] | None:
    """(batch, query tokens, KV length) of an attention op's recorded ``[B, H, L, E]`` inputs."""
    dims = op.dims
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    q, kv = dims[0], dims[1]
    if not (isinstance(q, list) and isinstance(kv, list) and len(q) == 4 and len(kv) == 4):
        return None
    try:
        if base_name(op.name) in ("_flash_attention_forward", "_efficient_attention_forward"):
            return int(q[0]), int(q[1]), int(kv[1])
        return int(q[0]), int(q[2]), int(kv[2])
    except (TypeError, ValueError):
        return None


def _rescale(op: _RefOp, batch: int, t_ref: int, t_new: int, s_new: int) -> Any:
    """The op's input dims for ``t_new`` query tokens per sequence and KV length ``s_new``."""
    dims = json.loads(json.dumps(op.dims))
    name = base_name(op.name)
    if name in GEMM_OPS:
        a = ACTIVATION_ARG.get(name, 0)
        if a < len(dims) and isinstance(dims[a], list):
            shape = dims[a]
            if len(shape) == 2 and shape[0] == batch * t_ref:
                shape[0] = batch * t_new
            elif len(shape) == 3 and shape[0] == batch and shape[1] == t_ref:
                shape[1] = t_new
        return dims
    blhe = name in ("_flash_attention_forward", "_efficient_attention_forward")
    lq, lk = (1, 1) if blhe else (2, 2)
    for j, shape in enumerate(dims[:4]):
        if not isinstance(shape, list) or len(shape) != 4:
            continue
        if j == 0:
            shape[lq] = t_new
        elif j in (1, 2):
            shape[lk] = s_new
        elif j == 3 and not blhe:  # the mask [B, 1, L, S]
            shape[2] = t_new if shape[2] == t_ref else shape[2]
            shape[3] = s_new
    return dims
