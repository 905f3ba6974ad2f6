"""Nesting of time intervals on one thread: ranges around operators around launch calls.

Per thread, intervals sorted by (start, -end, kind) nest like a call stack: an interval's
parent is the innermost earlier one that contains it, i.e. the nearest earlier interval of
the same thread whose end is not before its own end (the classic "previous greater element").
That is computed for all intervals at once with numpy by pointer jumping: each interval keeps
a candidate such that every interval between the two ends earlier, and jumps to its
candidate's candidate until the candidate contains it (O(log n) rounds of array operations
instead of a Python loop per interval). The innermost enclosing op or range is found the same
way along the parent chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Callable

PHASES = ("prefill", "decode", "draft", "verify")
"""Range names that mark an inference phase (the reference engine's ranges; ``draft`` and
``verify`` are speculative decoding's steps)."""


def phase_of(path: str | None) -> str | None:
    """A name of :data:`PHASES` when that exact name is a component of ``path``, else None."""
    if not path or not any(p in path for p in PHASES):  # most paths name no phase: no split
        return None
    for part in reversed(path.split("/")):
        if part in PHASES:
            return part
    return None


@dataclass
class Nesting:
    """Where each interval sits (positions into the input arrays; -1 for none).

    Attributes:
        parent: innermost enclosing interval.
        op_ancestor: innermost enclosing interval of the op kind.
        range_parent: innermost enclosing interval of the range kind.
        ranges: positions of the range-kind intervals, ascending.
        range_self_depth: per range (aligned with ``ranges``): ranges around it, itself included.
        range_self_path: per range: the '/'-joined names of the ranges around it and itself,
            outermost first.
        range_self_phase: per range: :func:`phase_of` its path.
    """

    parent: np.ndarray
    op_ancestor: np.ndarray
    range_parent: np.ndarray
    ranges: np.ndarray
    range_self_depth: np.ndarray
    range_self_path: np.ndarray
    range_self_phase: np.ndarray

    def _of_ranges(self, values: np.ndarray, pos: np.ndarray, fill: object) -> np.ndarray:
        out = np.full(len(pos), fill, dtype=values.dtype)
        ok = pos >= 0
        out[ok] = values[np.searchsorted(self.ranges, pos[ok])]
        return out

    def range_path(self, idx: np.ndarray) -> np.ndarray:
        """Path of the ranges around each interval ``idx`` (None when there is none)."""
        return self._of_ranges(self.range_self_path, self.range_parent[idx], None)

    def phase(self, idx: np.ndarray) -> np.ndarray:
        """``prefill``/``decode``/None for each interval ``idx``, from the ranges around it."""
        return self._of_ranges(self.range_self_phase, self.range_parent[idx], None)

    def range_depth(self, idx: np.ndarray) -> np.ndarray:
        """Number of ranges around each interval ``idx``."""
        return self._of_ranges(self.range_self_depth, self.range_parent[idx], 0)

    def range_path_self(self, idx: np.ndarray) -> np.ndarray:
        """Each interval's own path if it is a range (None for other kinds)."""
        out = np.full(len(idx), None, dtype=object)
        if len(self.ranges):
            rank = np.minimum(np.searchsorted(self.ranges, idx), len(self.ranges) - 1)
            ok = self.ranges[rank] == idx
            out[ok] = self.range_self_path[rank[ok]]
        return out

    def op_children(self, kinds: np.ndarray, op_kind: int) -> np.ndarray:
        """Per interval, how many ops have it as their innermost enclosing op."""
        anc = self.op_ancestor[(kinds == op_kind) & (self.op_ancestor >= 0)]
        return np.bincount(anc, minlength=len(kinds)).astype("int64")


def nest(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray, kinds: np.ndarray,
         names: Callable[[np.ndarray], np.ndarray], *, range_kind: int, op_kind: int) -> Nesting:
    """Nest intervals (``starts``/``ends`` ns) within each group (integer codes, e.g. threads).

    ``names(positions)`` gives the names of intervals (only asked for ranges). Ties in start put
    the longer interval outside, and on equal intervals the lower kind outside (a range around
    an op around a launch call with the same times).
    """
    n = len(starts)
    order = np.lexsort((kinds, -ends, starts, groups)) if n else np.zeros(0, dtype="int64")
    par = _enclosing(groups[order], ends[order])
    k = kinds[order]
    op_anc = _first_of(par, k == op_kind)
    rng = _first_of(par, k == range_kind)
    sorted_ranges = np.flatnonzero(k == range_kind)
    depth, paths = _range_paths(rng, sorted_ranges, names(order[sorted_ranges]))
    out = [_unsorted(order, src) for src in (par, op_anc, rng)]
    ranges = order[sorted_ranges]
    by_pos = np.argsort(ranges, kind="stable")
    phases = np.array([phase_of(p) for p in paths] + [None], dtype=object)[:-1]
    return Nesting(out[0], out[1], out[2], ranges[by_pos], depth[by_pos], paths[by_pos], phases[by_pos])


def _unsorted(order: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Positions ``src`` into the sorted intervals (-1: none), as positions into the input, in input order."""
    vals = order[src]  # a -1 reads the last one: made -1 again below
    vals[src < 0] = -1
    out = np.empty(len(order), dtype="int64")
    out[order] = vals
    return out


def _enclosing(g: np.ndarray, e: np.ndarray) -> np.ndarray:
    """For sorted intervals: the nearest earlier one of the same group with end >= own end."""
    n = len(e)
    cand = np.arange(-1, n - 1)  # the previous interval, or -1 for the first of a group
    if n < 2:
        return cand
    same = g[1:] == g[:-1]
    cand[1:][~same] = -1
    # first round on views (every candidate is the previous interval): no gathers of n positions;
    # the intervals the previous one contains are done
    fail = e[:-1] < e[1:]
    fail &= same
    del same
    active = np.flatnonzero(fail)
    del fail
    active += 1
    nxt = cand[active - 1]
    cand[active] = nxt
    active = active[nxt >= 0]
    while active.size:
        c = cand[active]
        fail = e[c] < e[active]
        active, c = active[fail], c[fail]
        nxt = cand[c]  # every interval between nxt and c ends before c, hence before active
        cand[active] = nxt
        active = active[nxt >= 0]
    return cand


def _first_of(parent: np.ndarray, is_kind: np.ndarray) -> np.ndarray:
    """Nearest strict ancestor of the kind, by pointer jumping along ``parent``."""
    jump = parent.copy()
    active = np.flatnonzero(jump >= 0)
    active = active[~is_kind[jump[active]]]
    while active.size:
        nxt = jump[jump[active]]
        jump[active] = nxt
        active = active[nxt >= 0]
        active = active[~is_kind[jump[active]]]
    return jump


def _range_paths(rng: np.ndarray, ranges: np.ndarray, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per range (sorted positions ``ranges``, ascending): its depth (itself included) and path."""
    parent = np.full(len(ranges), -1, dtype="int64")
    above = rng[ranges] if len(ranges) else np.zeros(0, dtype="int64")
    has = above >= 0
    parent[has] = np.searchsorted(ranges, above[has])  # the enclosing range's rank among the ranges
    depth = depth_of(parent)
    return depth + 1, range_paths(names, parent, depth)


MAX_PATH_DEPTH = 64
"""Names a range path spells out: a range nested deeper is named ``<its 64 outermost>/…/<its own name>``,
so a path's length is bounded whatever the nesting (20,000 nested roctx ranges made paths of 20,000
names each: quadratic memory, over 6 GB for a 1.3 MB CSV)."""
MAX_PATH_NAME = 512
"""Characters of one name kept in a path (the range's own ``name`` column keeps it whole)."""
ELIDED = "/…/"


def depth_of(parent: np.ndarray) -> np.ndarray:
    """Ancestors of each node of a forest given by ``parent`` positions (-1: a root), by list ranking
    (pointer doubling): O(n log depth) array work, whatever the order of the nodes."""
    # list ranking: depth[i] counts the hops from i to jump[i]; each round adds jump[i]'s own count and
    # jumps on (both read before either is written), until every jump is past a root (-1)
    depth = (parent >= 0).astype("int64")
    jump = parent.copy()
    active = np.flatnonzero(jump >= 0)
    while active.size:
        nxt = jump[active]
        depth[active] += depth[nxt]
        jump[active] = jump[nxt]
        active = active[jump[active] >= 0]
    return depth


def range_paths(names: np.ndarray | pd.Series, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """'/'-joined names from the outermost range (``parent``: positions, -1 for a root; ``depth``: 0 for a
    root), built one depth level at a time, each bounded (:data:`MAX_PATH_DEPTH`, :data:`MAX_PATH_NAME`):
    the work and memory are linear in the ranges, not in ranges x depth."""
    names = np.asarray([_path_name(x) for x in np.asarray(names, dtype=object)], dtype=object)
    paths = names.copy()
    kept = names.copy()  # the path a range deeper than MAX_PATH_DEPTH keeps before its ELIDED part
    if not len(names):
        return paths
    order = np.argsort(depth, kind="stable")
    bounds = np.flatnonzero(np.diff(depth[order])) + 1
    for idx in np.split(order, bounds):
        level = int(depth[idx[0]])
        idx = idx[parent[idx] >= 0]
        if level == 0 or not len(idx):
            continue
        above = parent[idx]
        if level < MAX_PATH_DEPTH:
            paths[idx] = paths[above] + "/" + names[idx]
            kept[idx] = paths[idx]
        else:
            kept[idx] = kept[above]
            paths[idx] = kept[above] + ELIDED + names[idx]
    return paths


def _path_name(name: object) -> str:
    text = str(name)
    return text if len(text) <= MAX_PATH_NAME else text[:MAX_PATH_NAME - 1] + "…"


def nest_intervals(nodes: pd.DataFrame, *, group: str, range_kind: int, op_kind: int) -> pd.DataFrame:
    """Add nesting columns to ``nodes`` (``start_ns``, ``end_ns``, ``kind``, ``name``, ``group``).

    Added columns: ``parent`` (innermost enclosing node), ``op_ancestor`` (innermost enclosing
    node of ``op_kind``), ``op_children`` (ops whose op_ancestor is this node), ``range_parent``
    (innermost enclosing node of ``range_kind``), ``range_depth`` (ranges above it),
    ``range_path`` (names of the enclosing ranges, outermost first, '/'-joined),
    ``range_path_self`` (the same including the node itself when it is a range) and ``phase``.
    Node references are index labels of ``nodes`` (NaN for none).
    """
    kinds = nodes["kind"].to_numpy()
    names = nodes["name"].to_numpy()
    nst = nest(pd.factorize(nodes[group])[0], nodes["start_ns"].to_numpy(), nodes["end_ns"].to_numpy(),
               kinds, lambda pos: names[pos], range_kind=range_kind, op_kind=op_kind)
    labels = nodes.index.to_numpy()
    everyone = np.arange(len(nodes))

    def to_index(pos: np.ndarray) -> np.ndarray:
        res = np.full(len(pos), np.nan)
        res[pos >= 0] = labels[pos[pos >= 0]]
        return res

    out = nodes.copy()
    out["parent"] = to_index(nst.parent)
    out["op_ancestor"] = to_index(nst.op_ancestor)
    out["range_parent"] = to_index(nst.range_parent)
    out["range_depth"] = nst.range_depth(everyone)
    out["range_path"] = nst.range_path(everyone)
    out["range_path_self"] = nst.range_path_self(everyone)
    out["op_children"] = nst.op_children(kinds, op_kind)
    out["phase"] = nst.phase(everyone)
    return out


def nesting_levels(starts: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
    """The intervals ``[start, end)`` of one thread by nesting level, outermost first: each level's positions,
    sorted by start (within a level the intervals are disjoint). What :func:`innermost_at` searches; made once
    for an interval set that is searched many times (the idle classification's chunks)."""
    n = len(starts)
    if not n:
        return []
    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    order = np.lexsort((-e, s))
    par = _enclosing(np.zeros(n, np.int64), e[order])
    depth = np.zeros(n, np.int64)
    cur = par.copy()
    while True:
        active = np.flatnonzero(cur >= 0)
        if not len(active):
            break
        depth[active] += 1
        cur[active] = par[cur[active]]
    return [order[depth == level] for level in range(int(depth.max()) + 1)]


def innermost_at(starts: np.ndarray, ends: np.ndarray, x: np.ndarray,
                 levels: list[np.ndarray] | None = None) -> np.ndarray:
    """Per point ``x``, the position of the innermost interval ``[start, end)`` around it (-1 where none).

    The intervals are one thread's, nested or disjoint (a partial overlap answers with one of the two).
    The intervals are sorted and nested once (:func:`nesting_levels`, or ``levels`` as it gave them); then,
    from the deepest level out, each level's intervals (disjoint) are searched for the points not found yet:
    no loop over the points, and no sort of them (a million idle pieces against a few NVTX ranges costs a
    few binary searches)."""
    n, m = len(starts), len(x)
    out = np.full(m, -1, dtype="int64")
    if not n or not m:
        return out
    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    xs = np.asarray(x, np.int64)
    if levels is None:
        levels = nesting_levels(s, e)
    todo = np.arange(m)
    if len(levels) > 1:  # first drop the points that no outermost interval holds
        top = levels[0]
        i = np.searchsorted(s[top], xs, side="right") - 1
        todo = todo[(i >= 0) & (xs < e[top][np.maximum(i, 0)])]
    for sel in reversed(levels):
        if not len(todo):
            break
        xi = xs[todo]
        i = np.searchsorted(s[sel], xi, side="right") - 1
        hit = (i >= 0) & (xi < e[sel][np.maximum(i, 0)])
        out[todo[hit]] = sel[i[hit]]
        todo = todo[~hit]
    return out
