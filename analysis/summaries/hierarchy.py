"""Where in the model the time goes: the module -> op -> kernel hierarchy of a report.

One pure step, :func:`hierarchy`, builds the tree from a Report's tables; every output (the
text tree of ``perfscope analyze --tree``, ``--json``, the HTML section, the dashboard tab, the
notebook method, ``compare``) reads the :class:`Hierarchy` it returns.

Where a kernel sits, by the first source the report has:

``module``
    ``nn.Module`` calls of a trace recorded ``with_stack`` (the Kineto reader keeps them as
    ranges of source ``module``, their paths from the events' ``Python parent id`` links). A
    kernel's module is the innermost module around its launch call (its ``correlation`` in the
    api table, on the launching thread), or around the CPU operator itself in a CPU trace. A
    kernel replayed from a CUDA graph was launched by one graph launch for the whole graph: when
    the reader joined the replay to the engine's capture trace, the kernel's
    ``capture_module`` (the modules around its captured launch, inside the capture) goes below
    the modules around that graph launch, as TraceLens merges a capture into its replay.
``range``
    NVTX and ``record_function`` ranges (the reference engine's ``layer.N``, ``attn``,
    ``mlp``): the kernel's ``range`` path, without the components that mark a phase or a step
    (``prefill``, ``decode``, ``ProfilerStep#N``, the steps table's labels), since the tree is
    built per phase.
``op``
    Neither: the tree is op -> kernel, and :attr:`Hierarchy.note` says why.

Below the module or range levels come the launching op (``op``; ``(no op)`` when unknown) and the
kernel's short name. Each node's ``module`` is the class of the innermost module at or above it
(an op node's is TraceLens's ``parent_module``; None above every module and in range trees). Repeated siblings of one class (``Qwen3DecoderLayer_0`` ... ``_35``,
``layer.0`` ... ``layer.29``: a name ending in ``_N`` or ``.N``) collapse into one node
``Qwen3DecoderLayer ×36`` with the mean, min and max kernel time per instance and the slowest
instance named; ``collapse=False`` gives the tree with every instance (the expanded view).

Node numbers: kernel time and share of the phase's kernel time; calls (kernels); FLOPs and DRAM
bytes summed over the kernels where both are known, and missing when those cover under
:data:`COSTED_SHARE` of the node's time (``flops_coverage_pct`` says how much); FLOP/B; bound and
% of roof re-classified on the node's totals (:func:`.roofline.classify`, as the by-name table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.memo import memo
from perfscope.schema import column_codes, value_mask

from ..costs.roofline import classify
from ..tree import PHASES, nest

if TYPE_CHECKING:
    from perfscope.report import Report

CAPTURE_MODULE = "capture_module"
"""The kernel column the Kineto reader fills for a CUDA-graph replay joined to a capture trace
(its captured launch's modules, inside the capture)."""

COSTED_SHARE = 0.9
"""A node's FLOPs and bytes are given when the kernels whose work is known hold this share of its time."""

STEP_PARTS = re.compile(r"^(ProfilerStep#\d+|perfscope\.step\[.*\]|step\[.*\]|execute_.*|capture_\d+_.*)$")
"""Range names that mark a step (profiler steps, vLLM / SGLang / hand-marked step annotations):
dropped from range paths like the phase names."""

INSTANCE = re.compile(r"^(.+?)[._](\d+)$")
"""A name that numbers one instance of a class: ``Qwen3DecoderLayer_3``, ``layer.3``."""

NO_OP = "(no op)"

NODE_COLUMNS = (
    "node", "parent", "depth", "level", "name", "path", "module", "instances", "per_parent", "time_ns",
    "share_pct", "calls", "flops", "dram_bytes", "flops_coverage_pct", "arith_intensity", "achieved_flops_per_s",
    "bound", "pct_of_roof", "instance_mean_ns", "instance_min_ns", "instance_max_ns", "slowest",
)
"""Columns of :attr:`Hierarchy.nodes` (``level``: module, range, op or kernel; ``path``: the
node's names from the root, ' / '-joined; ``module``: the class of the innermost module at or
above the node, None when none; ``slowest``: the instance with the most kernel time)."""


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """The tree of one report (and phase): nodes in depth-first order, children by time.

    Attributes:
        nodes: one row per node (:data:`NODE_COLUMNS`).
        source: ``module``, ``range`` or ``op`` (see the module docstring).
        note: why the tree has no module or range levels (None when it has).
        phase: the phase the tree covers (None: all kernels).
        collapsed: repeated siblings are collapsed.
        kernel_rows: positions (into ``report.kernels``) of the kernels the tree covers.
        kernel_leaf: per covered kernel, its leaf node.
    """

    nodes: pd.DataFrame
    source: str
    note: str | None
    phase: str | None
    collapsed: bool
    kernel_rows: np.ndarray = field(repr=False)
    kernel_leaf: np.ndarray = field(repr=False)

    def kernel_mask(self, node: int, n_kernels: int) -> np.ndarray:
        """Boolean mask over ``report.kernels`` (``n_kernels`` rows): the kernels under ``node``."""
        nodes = self.nodes
        start = int(np.flatnonzero(nodes["node"].to_numpy() == node)[0])
        depth = int(nodes["depth"].iat[start])
        later = np.flatnonzero(nodes["depth"].to_numpy()[start + 1:] <= depth)
        stop = start + 1 + (int(later[0]) if len(later) else len(nodes) - start - 1)
        inside = np.zeros(int(nodes["node"].max()) + 1, dtype=bool)
        inside[nodes["node"].to_numpy()[start:stop]] = True
        mask = np.zeros(n_kernels, dtype=bool)
        mask[self.kernel_rows[inside[self.kernel_leaf]]] = True
        return mask

    def to_records(self, depth: int | None = None) -> list[dict[str, Any]]:
        """The nodes as plain dicts (down to ``depth`` levels; all when None)."""
        df = self.nodes if depth is None else self.nodes[self.nodes["depth"] < depth]
        return [{k: _plain(v) for k, v in row.items()} for row in df.to_dict("records")]


def _plain(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return None if np.isnan(v) else float(v)
    if v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return v


# ---------------------------------------------------------------------------- where kernels sit
def kernel_paths(report: Report) -> tuple[np.ndarray, str, str | None]:
    """Per kernel (positions of ``report.kernels``): its module or range path as a tuple of
    names (empty when none), the source used, and the note when the tree degrades to op -> kernel.
    Computed once per report."""
    return memo(report, "hierarchy:paths", lambda: _kernel_paths(report))


def _kernel_paths(report: Report) -> tuple[np.ndarray, str, str | None]:
    k, r = report.kernels, report.ranges
    n = len(k)
    captured = CAPTURE_MODULE in k and k[CAPTURE_MODULE].notna().any()
    if captured or (len(r) and "source" in r and (r["source"] == "module").any()):
        return _module_paths(report), "module", None
    has_range = "range" in k and k["range"].notna().any()
    if has_range:
        paths = _range_paths(report)
        if any(len(p) for p in paths[: min(n, 1 << 20)]):
            return paths, "range", None
    note = ("no nn.Module events and no NVTX / record_function ranges around the kernels: the tree is "
            "op -> kernel (record the trace with torch.profiler's with_stack=True, or `perfscope profile "
            "--stack`, or add ranges, for module levels)")
    if (report.params or {}).get("with_stack"):  # the advice would ask for what the trace already has
        note = ("no nn.Module calls and no NVTX / record_function ranges around the rows, although the trace "
                "was recorded with_stack (Python events present): no model's forward ran in this process, so "
                "the tree is op -> kernel")
    return _empty_paths(n), "op", note


def _empty_paths(n: int) -> np.ndarray:
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = ()
    return out


def _range_paths(report: Report) -> np.ndarray:
    k = report.kernels
    codes, distinct = pd.factorize(k["range"])
    # str per value, not astype(str): pandas 2.0 casts a categorical's codes there (a RuntimeWarning on a multi-rank
    # report's steps)
    labels = {str(v) for v in report.steps["label"].dropna().tolist()} if "label" in report.steps else set()

    def clean(path: Any) -> tuple[str, ...]:
        parts = str(path).split("/")
        return tuple(p for p in parts if p and p not in PHASES and p != "mixed" and p not in labels
                     and not STEP_PARTS.match(p))

    table = np.empty(len(distinct) + 1, dtype=object)
    table[:] = [clean(p) for p in distinct] + [()]
    return table[codes]


def _module_paths(report: Report) -> np.ndarray:
    """The innermost module around each kernel's launch point (launch call, or the CPU op),
    followed by the modules of its captured launch for a replay joined to a capture trace."""
    k, r, api = report.kernels, report.ranges, report.api
    mods = r[r["source"] == "module"] if len(r) and "source" in r else pd.DataFrame(
        columns=["name", "path", "start_ns", "end_ns", "thread"])
    n = len(k)
    thread = np.full(n, np.nan)
    point = np.full(n, -1, dtype="int64")
    if "correlation" in k and len(api) and "correlation" in api:
        a = api.dropna(subset=["correlation"]).drop_duplicates("correlation")
        at = pd.Index(a["correlation"].astype("int64")).get_indexer(
            pd.to_numeric(k["correlation"], errors="coerce").fillna(-1).astype("int64"))
        ok = at >= 0
        thread[ok] = pd.to_numeric(a["thread"], errors="coerce").to_numpy("float64", na_value=np.nan)[at[ok]]
        point[ok] = a["start_ns"].to_numpy("int64")[at[ok]]
    if "thread" in k:  # CPU operators (and kernels with no launch call found): their own thread and start
        own = (point < 0) & k["thread"].notna().to_numpy()
        thread[own] = pd.to_numeric(k["thread"], errors="coerce").to_numpy("float64", na_value=np.nan)[own]
        point[own] = k["start_ns"].to_numpy("int64")[own]
    out = _empty_paths(n)
    has = np.flatnonzero(point >= 0)
    if len(mods):
        out[has] = modules_at(mods, thread[has], point[has])
    if CAPTURE_MODULE in k:  # a replay's captured modules go below those around its graph launch
        codes, inside = pd.factorize(k[CAPTURE_MODULE])
        rows = np.flatnonzero(codes >= 0)
        if len(rows):
            parts = [tuple(str(p).split("/")) for p in inside]
            around, arounds = pd.factorize(pd.Series(out[rows], dtype=object))
            pair, pairs = pd.factorize(around.astype("int64") * len(parts) + codes[rows])
            joined = np.empty(len(pairs), dtype=object)
            joined[:] = [arounds[int(q) // len(parts)] + parts[int(q) % len(parts)] for q in pairs]
            out[rows] = joined[pair]
    return out


def modules_at(modules: pd.DataFrame, thread: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """The path (tuple of module names, outermost first; empty when none) of the innermost
    module range of ``modules`` (ranges of source ``module``) around each point: time ``t_ns``
    on thread ``thread``. Containment is by time on the thread (:func:`.tree.nest`)."""
    m = len(modules)
    groups = np.concatenate([pd.to_numeric(modules["thread"], errors="coerce").fillna(-1).to_numpy("float64", na_value=np.nan),
                             np.nan_to_num(np.asarray(thread, dtype="float64"), nan=-2.0)])
    starts = np.concatenate([modules["start_ns"].to_numpy("int64"), np.asarray(t_ns, dtype="int64")])
    kinds = np.concatenate([np.zeros(m, dtype="int8"), np.full(len(t_ns), 2, dtype="int8")])
    ends = np.concatenate([modules["end_ns"].to_numpy("int64"), np.asarray(t_ns, dtype="int64")])
    names = modules["name"].to_numpy(object)
    nst = nest(pd.factorize(groups)[0], starts, ends, kinds, lambda pos: names[pos], range_kind=0, op_kind=1)
    inner = nst.range_parent[m:]
    mod_paths = _empty_paths(m + 1)
    mod_paths[:m] = [tuple(str(p).split("/")) for p in modules["path"].fillna(modules["name"]).tolist()]
    return mod_paths[np.where(inner >= 0, inner, m)]


# ---------------------------------------------------------------------------- the tree
def instance_class(name: str) -> str:
    """``Qwen3DecoderLayer_3`` -> ``Qwen3DecoderLayer``, ``layer.3`` -> ``layer``; others unchanged."""
    m = INSTANCE.match(name)
    return m.group(1) if m else name


def hierarchy(report: Report, *, phase: str | None = None, collapse: bool = True) -> Hierarchy:
    """The module -> op -> kernel tree of ``report`` (its kernels of ``phase``, or all).

    Args:
        report: the report.
        phase: ``prefill``, ``decode``, ... (the kernels' ``phase`` column); None for all kernels.
        collapse: collapse repeated siblings of one class into one node (see the module docstring).
    """
    key = f"hierarchy:tree:{phase}:{collapse}"
    return memo(report, key, lambda: _hierarchy(report, phase, collapse))


def phases_of(report: Report) -> list[str]:
    """The phases with kernels in ``report``, prefill first."""
    if "phase" not in report.kernels:
        return []
    present = [str(p) for p in report.kernels["phase"].dropna().unique()]
    order = {p: i for i, p in enumerate(("prefill", "decode", "mixed", "draft", "verify"))}
    return sorted(present, key=lambda p: (order.get(p, 99), p))


Leaf = tuple[tuple[str, str], ...]
"""A leaf's components from the root: (level, name) of each module or range, then the op, then the kernel."""


SPANS_PHASES = "spans phases"
"""The ``bound`` of a tree node whose kernels ran in more than one phase (pick a phase to see theirs)."""


def kernel_leaves(report: Report) -> tuple[np.ndarray, list[Leaf], str, str | None]:
    """Per kernel (positions of ``report.kernels``), the code of its leaf: the distinct (module or
    range path, launching op, kernel name); each code's components; the source and the note of
    :func:`kernel_paths`. Computed once per report, on the table's memoized column codes, so the
    tree of one phase costs a lookup of its kernels' codes."""
    return memo(report, "hierarchy:leaves", lambda: _kernel_leaves(report))


def _kernel_leaves(report: Report) -> tuple[np.ndarray, list[Leaf], str, str | None]:
    paths, source, note = kernel_paths(report)
    k = report.kernels
    n = len(k)
    path_codes, path_values = pd.factorize(pd.Series(paths, dtype=object)) if n else (np.zeros(0, "int64"), [])
    if "op" in k:
        op_codes, op_values = column_codes(k, "op")
    else:
        op_codes, op_values = np.full(n, -1, dtype="int64"), np.array([], dtype=object)
    name_codes, name_values = column_codes(k, "name")
    label, label_values = name_codes, np.asarray(name_values, dtype=object)
    if "short_name" in k:  # the short name, unless it lost the name (``void``, a bare number)
        short_codes, short_values = column_codes(k, "short_name")
        usable = np.array([_usable_short(v) for v in short_values] + [False], dtype=bool)
        shift = len(short_values)
        label = np.where(usable[short_codes], short_codes, np.where(name_codes >= 0, name_codes + shift, -1))
        label_values = np.concatenate([np.asarray(short_values, dtype=object), label_values])
    n_ops, n_labels = len(op_values) + 1, len(label_values) + 1
    combo = (path_codes.astype("int64") * n_ops + (op_codes + 1)) * n_labels + (label + 1)
    leaf_codes, keys = pd.factorize(combo)
    comps: list[Leaf] = []
    for key in keys.tolist():
        rest, lc = divmod(int(key), n_labels)
        pc, oc = divmod(rest, n_ops)
        mods = tuple((source, str(p)) for p in path_values[pc] if p)
        op = str(op_values[oc - 1]) if oc > 0 else NO_OP
        name = str(label_values[lc - 1]) if lc > 0 else "?"
        comps.append((*mods, ("op", op), ("kernel", name)))
    return leaf_codes.astype("int64"), comps, source, note


def _hierarchy(report: Report, phase: str | None, collapse: bool) -> Hierarchy:
    codes, all_comps, source, note = kernel_leaves(report)
    k = report.kernels
    rows = np.arange(len(k)) if phase is None else np.flatnonzero(value_mask(k, "phase", lambda v: v == phase))
    # the phase's leaves, in the order its kernels first meet them
    leaf_codes, used = pd.factorize(codes[rows]) if len(rows) else (np.zeros(0, "int64"), np.zeros(0, "int64"))
    leaves = _leaf_table(k, rows, leaf_codes, len(used))
    comps = [all_comps[u] for u in used.tolist()]
    nodes, leaf_node = _build(comps, leaves, collapse, report)
    return Hierarchy(nodes, source, note, phase, collapse, rows, leaf_node[leaf_codes] if len(leaf_codes) else
                     np.zeros(0, dtype="int64"))


def _usable_short(name: object) -> bool:
    text = str(name)
    return len(text) > 2 and text != "void" and not text.isdigit()


def _leaf_table(k: pd.DataFrame, rows: np.ndarray, codes: np.ndarray, n: int) -> pd.DataFrame:
    """Per leaf: calls, kernel time, the time whose work is known, FLOPs and bytes of that work,
    and the first precision met (``codes``: each of the kernels ``rows``' leaf)."""
    dur = k["duration_ns"].to_numpy("float64", na_value=np.nan)[rows]
    flops = pd.to_numeric(k["flops"], errors="coerce").to_numpy("float64", na_value=np.nan)[rows]
    nbytes = pd.to_numeric(k["dram_bytes"], errors="coerce").to_numpy("float64", na_value=np.nan)[rows]
    known = ~np.isnan(flops) & ~np.isnan(nbytes)
    out = pd.DataFrame({
        "calls": np.bincount(codes, minlength=n),
        "time_ns": np.bincount(codes, weights=dur, minlength=n),
        "known_ns": np.bincount(codes, weights=np.where(known, dur, 0.0), minlength=n),
        "flops": np.bincount(codes, weights=np.where(known, flops, 0.0), minlength=n),
        "dram_bytes": np.bincount(codes, weights=np.where(known, nbytes, 0.0), minlength=n),
    })
    precision = np.full(n, None, dtype=object)
    if "precision" in k and n:
        prec_codes, prec_values = column_codes(k, "precision")
        chosen = prec_codes[rows]
        at = np.flatnonzero(chosen >= 0)
        leaf, first = np.unique(codes[at], return_index=True)
        precision[leaf] = np.asarray(prec_values, dtype=object)[chosen[at[first]]]
    out["precision"] = precision
    # the phases each leaf's kernels ran in, one bit per phase (a node spanning phases is flagged)
    phase_bits = np.zeros(n, dtype="int64")
    if "phase" in k and n:
        ph_codes = column_codes(k, "phase")[0][rows]
        at = np.flatnonzero((ph_codes >= 0) & (ph_codes < 62))
        np.bitwise_or.at(phase_bits, codes[at], np.left_shift(1, ph_codes[at]).astype("int64"))
    out["phase_bits"] = phase_bits
    return out


def _build(comps: list[tuple[tuple[str, str], ...]], leaves: pd.DataFrame, collapse: bool,
           report: Report) -> tuple[pd.DataFrame, np.ndarray]:
    """Nodes from the leaves' component paths; returns the node table and each leaf's node."""
    index: dict[tuple[str, ...], int] = {}
    level: list[str] = []
    names: list[str] = []
    parent: list[int] = []
    module: list[str | None] = []
    insts: list[dict[tuple[str, ...], float]] = []
    members: list[list[int]] = []
    leaf_node = np.zeros(len(comps), dtype="int64")
    t = leaves["time_ns"].to_numpy()
    for li, path in enumerate(comps):
        up = -1
        for d in range(len(path)):
            kind, name = path[d]
            structural = kind in ("module", "range")
            key = tuple(instance_class(n) if collapse and kd in ("module", "range") else n for kd, n in path[: d + 1])
            node = index.get(key)
            if node is None:
                node = index[key] = len(level)
                level.append(kind)
                names.append(instance_class(name) if collapse and structural else name)
                module.append(instance_class(name) if kind == "module" else module[up] if up >= 0 else None)
                parent.append(up)
                insts.append({})
                members.append([])
            actual = tuple(n for _, n in path[: d + 1])
            insts[node][actual] = insts[node].get(actual, 0.0) + float(t[li])
            members[node].append(li)
            up = node
        leaf_node[li] = up
    n = len(level)
    agg = {c: np.array([leaves[c].to_numpy()[m].sum() for m in members]) if n else np.zeros(0)
           for c in ("calls", "time_ns", "known_ns", "flops", "dram_bytes")}
    prec = leaves["precision"].to_numpy(object)
    dominant = []
    for m in members:
        by: dict[Any, float] = {}
        for li in m:
            by[prec[li]] = by.get(prec[li], 0.0) + float(t[li])
        dominant.append(max(by, key=lambda p: by[p]) if by else None)
    total = float(leaves["time_ns"].sum())
    counts = np.array([len(i) for i in insts], dtype="int64")
    per_parent = np.array([counts[i] / counts[p] if p >= 0 and counts[p] else counts[i] for i, p in
                           enumerate(parent)])
    inst_times = [np.array(list(i.values())) for i in insts]
    slowest = ["/".join(max(i.items(), key=lambda kv: kv[1])[0]) if i else None for i in insts]
    known_share = np.divide(agg["known_ns"], agg["time_ns"], out=np.zeros(n), where=agg["time_ns"] > 0)
    enough = known_share >= COSTED_SHARE
    flops = np.where(enough, agg["flops"], np.nan)
    nbytes = np.where(enough, agg["dram_bytes"], np.nan)
    rates = pd.DataFrame({"name": [str(x) for x in names], "device": "", "start_ns": 0,
                          "end_ns": agg["known_ns"].astype("int64"), "duration_ns": agg["known_ns"].astype("int64"),
                          "flops": flops, "dram_bytes": nbytes, "precision": dominant})
    c = classify(rates, report.device)
    bits = leaves["phase_bits"].to_numpy()
    spans = np.array([int(np.bitwise_or.reduce(bits[m])).bit_count() > 1 if m else False for m in members],
                     dtype=bool)
    # a node whose kernels ran in several phases (the tree of all kernels) has no one bound: its calls
    # sit far apart on the roofline (a prefill and a decode attention), so it says so instead
    c.loc[spans, "bound"] = SPANS_PHASES
    c.loc[spans, "pct_of_roof"] = np.nan
    labels = []
    for i in range(n):
        pp = round(float(per_parent[i]))
        collapsed = collapse and level[i] in ("module", "range") and counts[i] > 1 and pp > 1
        labels.append(f"{names[i]} ×{pp}" if collapsed else names[i])
    table = pd.DataFrame({
        "node": np.arange(n), "parent": np.array(parent, dtype="int64"), "level": level, "name": labels,
        "module": np.array(module, dtype=object),
        "instances": counts, "per_parent": per_parent,
        "time_ns": agg["time_ns"], "share_pct": agg["time_ns"] / (total or 1.0) * 100.0,
        "calls": agg["calls"].astype("int64"), "flops": flops, "dram_bytes": nbytes,
        "flops_coverage_pct": known_share * 100.0,
        "arith_intensity": c["arith_intensity"].to_numpy(), "achieved_flops_per_s": c["achieved_flops_per_s"].to_numpy(),
        "bound": c["bound"].to_numpy(object), "pct_of_roof": c["pct_of_roof"].to_numpy(),
        "instance_mean_ns": [float(x.mean()) if len(x) else np.nan for x in inst_times],
        "instance_min_ns": [float(x.min()) if len(x) else np.nan for x in inst_times],
        "instance_max_ns": [float(x.max()) if len(x) else np.nan for x in inst_times],
        "slowest": slowest,
    })
    order, depth, paths = _depth_first(table)
    table["depth"] = depth
    table["path"] = paths
    table = table.iloc[order].reset_index(drop=True)
    return table[list(NODE_COLUMNS)], leaf_node


def _depth_first(table: pd.DataFrame) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Depth-first order (children by time, most first), each node's depth and ' / '-joined path."""
    n = len(table)
    kids: dict[int, list[int]] = {}
    time = table["time_ns"].to_numpy()
    for i, p in enumerate(table["parent"].tolist()):
        kids.setdefault(p, []).append(i)
    depth = np.zeros(n, dtype="int64")
    paths = np.empty(n, dtype=object)
    names = table["name"].tolist()
    order: list[int] = []
    stack = [(i, 0, "") for i in sorted(kids.get(-1, []), key=lambda i: -time[i])][::-1]
    while stack:
        i, d, above = stack.pop()
        order.append(i)
        depth[i] = d
        paths[i] = f"{above} / {names[i]}" if above else names[i]
        stack.extend((c, d + 1, paths[i]) for c in sorted(kids.get(i, []), key=lambda c: -time[c])[::-1])
    return order, depth, paths


def by_phase(report: Report, *, collapse: bool = True) -> dict[str | None, Hierarchy]:
    """The tree for every phase with kernels (``None``: all kernels, when there is no phase)."""
    phases = phases_of(report)
    return {p: hierarchy(report, phase=p, collapse=collapse) for p in phases} if phases else \
        {None: hierarchy(report, collapse=collapse)}
