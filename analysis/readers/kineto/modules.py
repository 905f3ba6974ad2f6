"""The ``nn.Module`` calls of a Kineto trace recorded ``with_stack``: module ranges, and the
modules around points of a capture.

torch.profiler records each ``nn.Module`` call as a ``python_function`` event named
``nn.Module: Class_N`` (N numbers the instances of the class). The reader keeps them as ranges
of source ``module`` (:func:`module_ranges`, their paths from the ``Python parent id`` links);
the capture-trace reader (:mod:`.capture`) asks which modules of a graph's capture enclose each
captured launch (:func:`modules_around`), since a replayed kernel's launch in the main trace
(one graph launch for the whole graph) says nothing about the module that recorded it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ...tree import nest
from .ops import first_along, texts, times_ns

if TYPE_CHECKING:
    from collections.abc import Mapping

MODULE_PREFIX = "nn.Module: "
"""How torch.profiler names the ``python_function`` event of an ``nn.Module`` call (``with_stack``)."""


def _is_module(names: np.ndarray) -> np.ndarray:
    return np.array([isinstance(n, str) and n.startswith(MODULE_PREFIX) for n in names.tolist()], dtype=bool)


def module_ranges(py: Mapping[str, np.ndarray] | None, base: int, strings: np.ndarray,
                  first_id: int = 0) -> pd.DataFrame:
    """The ``nn.Module:`` python events as ranges of source ``module`` (name without the prefix).

    A module's parent is its nearest ancestor module along the ``Python parent id`` links
    (through the plain python functions between them); ``path`` joins the module names from the
    outermost, ``depth`` counts the modules above it. Ids continue from ``first_id``.
    """
    if py is None or not len(py["ts"]):
        return pd.DataFrame()
    names = texts(strings, py["name"])
    is_mod = _is_module(names)
    mods = np.flatnonzero(is_mod)
    if not len(mods):
        return pd.DataFrame()
    ids = py["pyid"]
    first = np.flatnonzero(~(pd.Index(ids).duplicated() | np.isnan(ids)))
    hit = pd.Index(ids[first]).get_indexer(py["pyparent"])
    up = np.where(hit >= 0, first[np.maximum(hit, 0)], -1)  # python parent (position), -1 none
    # walk up through plain python functions to the nearest module
    mod_parent = first_along(up[mods], is_mod, up, limit=4096)
    rank = np.full(len(is_mod), -1, dtype="int64")
    rank[mods] = np.arange(len(mods))
    parent_rank = np.where(mod_parent >= 0, rank[np.maximum(mod_parent, 0)], -1)
    short = [str(n)[len(MODULE_PREFIX):] for n in names[mods].tolist()]
    paths: list[str | None] = [None] * len(mods)
    depth = np.zeros(len(mods), dtype="int64")

    def path_of(r: int) -> str:
        chain: list[int] = []
        q = r
        while q >= 0 and paths[q] is None and len(chain) < 4096:
            chain.append(q)
            q = int(parent_rank[q])
        above, d = (paths[q], int(depth[q]) + 1) if q >= 0 and paths[q] is not None else (None, 0)
        for c in reversed(chain):
            above = short[c] if above is None else f"{above}/{short[c]}"
            paths[c], depth[c] = above, d
            d += 1
        return str(paths[r])

    for r in range(len(mods)):
        path_of(r)
    start, end, dur = times_ns({"ts": py["ts"][mods], "dur": py["dur"][mods]}, base)
    return pd.DataFrame({
        "id": np.arange(first_id, first_id + len(mods), dtype="int64"),
        "name": np.array(short, dtype=object),
        "start_ns": start, "end_ns": end, "duration_ns": dur,
        "depth": depth,
        "parent": np.where(parent_rank >= 0, parent_rank + first_id, np.nan),
        "path": np.array(paths, dtype=object),
        "thread": py["tid"][mods],
        "source": "module",
    })




def modules_around(py: Mapping[str, np.ndarray] | None, strings: np.ndarray, thread: np.ndarray,
                   start_ns: np.ndarray, end_ns: np.ndarray, lo_ns: int, hi_ns: int) -> np.ndarray:
    """Per interval (``thread``: thread codes, ``start_ns``/``end_ns`` on the trace's own
    timeline, base 0), the '/'-joined names of the ``nn.Module`` calls around it, outermost
    first, counting only the calls that lie within ``[lo_ns, hi_ns]`` (a graph's capture: a
    module around the whole capture is not part of the graph, and at a replay it runs around
    the graph launch instead). None where no such module encloses the interval.

    Containment is by time on the thread (:func:`.tree.nest`), as for every other CPU interval.
    """
    n = len(start_ns)
    out = np.full(n, None, dtype=object)
    if py is None or not len(py["ts"]) or not n:
        return out
    names = texts(strings, py["name"])
    s, e, _ = times_ns(py, 0)
    keep = np.flatnonzero(_is_module(names) & (s >= lo_ns) & (e <= hi_ns))
    if not len(keep):
        return out
    m = len(keep)
    short = np.array([str(x)[len(MODULE_PREFIX):] for x in names[keep].tolist()], dtype=object)
    groups = pd.factorize(np.concatenate([py["thread"][keep], np.asarray(thread)]))[0]
    nst = nest(groups, np.concatenate([s[keep], start_ns]), np.concatenate([e[keep], end_ns]),
               np.concatenate([np.zeros(m, dtype="int8"), np.full(n, 2, dtype="int8")]),
               lambda pos: short[pos], range_kind=0, op_kind=1)
    return nst.range_path(np.arange(m, m + n))
