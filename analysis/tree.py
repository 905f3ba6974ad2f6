"""Nesting of time intervals on one thread: ranges around operators around launch calls.

One pass per thread over the intervals sorted by (start, -end): a stack holds the open
intervals, and each interval's parent is the innermost one on the stack that contains it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PHASES = ("prefill", "decode")
"""Range names that mark an inference phase (the reference engine's ranges)."""


def phase_of(path: str | None) -> str | None:
    """``prefill`` or ``decode`` when that exact name is a component of ``path``, else None."""
    if not path:
        return None
    for part in reversed(path.split("/")):
        if part in PHASES:
            return part
    return None


def nest_intervals(nodes: pd.DataFrame, *, group: str, range_kind: int, op_kind: int) -> pd.DataFrame:
    """Add nesting columns to ``nodes`` (``start_ns``, ``end_ns``, ``kind``, ``name``, ``group``).

    Added columns: ``parent`` (innermost enclosing node), ``op_ancestor`` (innermost enclosing
    node of ``op_kind``), ``op_children`` (ops whose op_ancestor is this node), ``range_parent``
    (innermost enclosing node of ``range_kind``), ``range_depth`` (ranges above it),
    ``range_path`` (names of the enclosing ranges, outermost first, '/'-joined),
    ``range_path_self`` (the same including the node itself when it is a range) and ``phase``.
    """
    n = len(nodes)
    parent = np.full(n, -1, dtype="int64")
    op_anc = np.full(n, -1, dtype="int64")
    rng_parent = np.full(n, -1, dtype="int64")
    depth = np.zeros(n, dtype="int64")
    paths = np.full(n, None, dtype=object)
    self_paths = np.full(n, None, dtype=object)
    if n:
        groups = pd.factorize(nodes[group])[0]
        order = np.lexsort((nodes["kind"].to_numpy(), -nodes["end_ns"].to_numpy(),
                            nodes["start_ns"].to_numpy(), groups))
        _walk(order, groups, nodes["start_ns"].to_numpy(), nodes["end_ns"].to_numpy(),
              nodes["kind"].to_numpy(), nodes["name"].to_numpy(), range_kind, op_kind,
              parent, op_anc, rng_parent, depth, paths, self_paths)
    out = nodes.copy()
    idx = out.index.to_numpy()

    def to_index(pos: np.ndarray) -> np.ndarray:
        res = np.full(n, np.nan)
        ok = pos >= 0
        res[ok] = idx[pos[ok]]
        return res

    out["parent"] = to_index(parent)
    out["op_ancestor"] = to_index(op_anc)
    out["range_parent"] = to_index(rng_parent)
    out["range_depth"] = depth
    out["range_path"] = paths
    out["range_path_self"] = self_paths
    counts = pd.Series(op_anc[(op_anc >= 0) & (nodes["kind"].to_numpy() == op_kind)]).value_counts()
    op_children = np.zeros(n, dtype="int64")
    op_children[counts.index.to_numpy()] = counts.to_numpy()
    out["op_children"] = op_children
    out["phase"] = [phase_of(p) for p in paths]
    return out


def _walk(order, groups, starts, ends, kinds, names, range_kind, op_kind,  # type: ignore[no-untyped-def]
          parent, op_anc, rng_parent, depth, paths, self_paths) -> None:
    stack: list[int] = []
    op_stack: list[int] = []
    rng_stack: list[int] = []
    current = None
    for i in order:
        g = groups[i]
        if g != current:
            stack, op_stack, rng_stack, current = [], [], [], g
        s, e = starts[i], ends[i]
        while stack and not (starts[stack[-1]] <= s and e <= ends[stack[-1]]):
            top = stack.pop()
            if op_stack and op_stack[-1] == top:
                op_stack.pop()
            if rng_stack and rng_stack[-1] == top:
                rng_stack.pop()
        if stack:
            parent[i] = stack[-1]
        if op_stack:
            op_anc[i] = op_stack[-1]
        if rng_stack:
            rng_parent[i] = rng_stack[-1]
            paths[i] = self_paths[rng_stack[-1]]
        depth[i] = len(rng_stack)
        stack.append(i)
        if kinds[i] == op_kind:
            op_stack.append(i)
        elif kinds[i] == range_kind:
            rng_stack.append(i)
            self_paths[i] = f"{paths[i]}/{names[i]}" if paths[i] else str(names[i])
