"""Kineto ``[memory]`` events (``profile_memory=True``) -> the ``memory`` table.

Each event is one allocation (``Bytes`` > 0) or free (``Bytes`` < 0) with the allocator's
``Total Allocated`` and ``Total Reserved`` after it, its ``Addr`` and device. The op that made it
is the innermost CPU op around the event on its thread; the module, the innermost ``nn.Module``
range around it (traces recorded ``with_stack``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...memory import ALLOC, FREE, MemEvents, timeline
from .ops import OP, CpuNodes

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

DEVICE_TYPE_CPU = 0
"""c10::DeviceType of the host; CUDA is 1, and ROCm builds record HIP (6) for the GPU, named ``cuda:N`` as torch does."""


def memory_table(mem: Mapping[str, np.ndarray] | None, base: int, nodes: CpuNodes, ranges: pd.DataFrame,
                 known: Sequence[tuple[Any, ...]] = (), known_in_totals: bool = True) -> pd.DataFrame:
    """The ``memory`` rows of a trace's ``[memory]`` events, one device after another.

    Args:
        mem: the parsed ``mem`` columns (:data:`.parse.FIELDS`).
        known: allocations made before the trace that the caller knows (the engine's weights and
            KV cache): (addr, bytes, op, module, source, category, device).
        known_in_totals: whether the allocator's totals count ``known`` (a GPU caching allocator
            does; torch's CPU allocator counts only what it saw while profiling).
    """
    if mem is None or not len(mem.get("ts", ())):
        if not known:
            return pd.DataFrame()
        mem = {k: np.empty(0) for k in ("ts", "tid", "mbytes", "total_alloc", "total_res", "addr", "dev_id", "dev_type")}
    t_ns = np.rint(mem["ts"] * 1000.0).astype("int64") + base
    order = np.argsort(t_ns, kind="stable")
    cols = {k: v[order] for k, v in mem.items()}
    t_ns = t_ns[order]
    dev_type, dev_id = cols["dev_type"], cols["dev_id"]
    names = np.where(dev_type == DEVICE_TYPE_CPU, "cpu", np.array(
        [f"cuda:{int(d) if not np.isnan(d) and d >= 0 else 0}" for d in dev_id.tolist()] + [""], dtype=object)[:-1])
    ops, in_backward = _innermost_ops(nodes, cols["tid"], t_ns)
    modules = _innermost_range(ranges, t_ns, "module")
    annotations = _innermost_range(ranges, t_ns, "record_function")
    hints = np.full(len(t_ns), None, dtype=object)
    hints[in_backward] = "in_backward"
    in_optimizer = np.array([isinstance(a, str) and "Optimizer." in a for a in annotations], dtype=bool)
    hints[in_optimizer] = "in_optimizer"
    out = []
    devices = sorted(set(names.tolist()) | {k[6] for k in known})
    for dev in devices:
        sel = np.flatnonzero(names == dev)
        nbytes = cols["mbytes"][sel]
        ev = MemEvents(device=dev, t_ns=t_ns[sel], action=np.where(nbytes >= 0, ALLOC, FREE).astype("int8"),
                       size=np.abs(nbytes), addr=cols["addr"][sel], op=ops[sel], module=modules[sel], hint=hints[sel],
                       total_allocated=cols["total_alloc"][sel],
                       # torch's CPU allocator reserves nothing of its own: its Total Reserved is always 0
                       total_reserved=None if dev == "cpu" else cols["total_res"][sel],
                       preexisting=[k[:6] for k in known if k[6] == dev], known_in_totals=known_in_totals)
        out.append(timeline(ev, "kineto"))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


BACKWARD_MARKS = ("Backward", "autograd::engine")
"""An op whose name holds one of these runs in autograd's backward pass."""

WALK_LIMIT = 4096
"""Ops looked at backwards from an event for the ones around it."""


def _innermost_ops(nodes: CpuNodes, tid: np.ndarray, t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per event, the name of the innermost CPU op running on its thread at its time (None outside
    ops), and whether an op around it is autograd's backward."""
    out = np.full(len(t_ns), None, dtype=object)
    backward = np.zeros(len(t_ns), dtype=bool)
    idx = nodes.of(OP)
    if not len(idx) or not len(t_ns):
        return out, backward
    op_tid = nodes["tid"][idx]
    start, end = nodes["start_ns"][idx], nodes["end_ns"][idx]
    names = nodes.names(idx)
    is_bwd = np.array([isinstance(n, str) and any(m in n for m in BACKWARD_MARKS) for n in names], dtype=bool)
    for th in np.unique(tid[~np.isnan(tid)]).tolist():
        mine = np.flatnonzero(op_tid == th)
        if not len(mine):
            continue
        mine = mine[np.argsort(start[mine], kind="stable")]
        s, e = start[mine], end[mine]
        for i in np.flatnonzero(tid == th):
            t = t_ns[i]
            k = int(np.searchsorted(s, t, side="right")) - 1
            stop = max(-1, k - WALK_LIMIT)
            while k > stop:
                if e[k] >= t:
                    if out[i] is None:
                        out[i] = names[mine[k]]
                    if is_bwd[mine[k]]:
                        backward[i] = True
                        break
                k -= 1
    return out, backward


def _innermost_range(ranges: pd.DataFrame, t_ns: np.ndarray, source: str) -> np.ndarray:
    """Per event, the path of the innermost range of ``source`` (``module``: nn.Module calls;
    ``record_function``: annotations) around it (None outside)."""
    out = np.full(len(t_ns), None, dtype=object)
    if not len(ranges) or "source" not in ranges or not len(t_ns):
        return out
    mods = ranges[ranges["source"].to_numpy() == source].sort_values("start_ns", kind="stable")
    if not len(mods):
        return out
    s, e = mods["start_ns"].to_numpy("int64"), mods["end_ns"].to_numpy("int64")
    paths = mods["path"].to_numpy(dtype=object) if "path" in mods else mods["name"].to_numpy(dtype=object)
    for i, t in enumerate(t_ns.tolist()):
        k = int(np.searchsorted(s, t, side="right")) - 1
        while k >= 0 and e[k] < t:
            k -= 1
        if k >= 0:
            out[i] = paths[k]
    return out
