"""The host's own activity in a Kineto trace: the ``host`` table that explains the device's idle time.

Three kinds of rows (docs/idle.md), each on its thread:

- ``op``: every outermost CPU operator (no operator around it), with the launch / copy / memset
  calls made inside it (``device_calls``) and whether it computed on the host (``host_compute``:
  it queued no device work, and it or an operator inside it is more than a view, an allocation or
  a scalar read: ``aten::bmm`` on CPU tensors, a host-to-host ``aten::copy_``). On a GPU trace an
  operator on device tensors always queues device work, so an operator that queued none ran on
  host tensors; its input shapes (``record_shapes``) say which.
- ``python``: the Python functions of the user's code (``with_stack``): not the standard library,
  not torch's own frames, not C built-ins (``<built-in method ...>``), not ``nn.Module`` calls
  (those are ranges already).
- ``wait``: the Python calls that block (``time.sleep``, a lock's ``acquire``, ``select``,
  ``poll``, socket and file reads), from the same ``with_stack`` events;
- ``math``: the outermost calls into a host math library (numpy, scipy: ``numpy.linalg.svd``, a
  ``numpy.ndarray`` method), math on host arrays that no CPU operator records.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ...costs.operators import category_of
from .ops import (
    API,
    OP,
    CpuNodes,
    one_text,
    op_inputs,
    per_distinct,
    per_distinct_text,
    texts,
    times_ns,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

DEVICE_CALL = re.compile(r"launch|memcpy|memset", re.IGNORECASE)
"""Runtime / driver calls that queue device work (a kernel, a graph, a copy, a memset)."""

PY_WAIT = re.compile(
    r"^<built-in (?:function|method) (sleep|acquire|select|poll|epoll_wait|wait|waitpid|recv\w*|read\w*|accept|"
    r"connect)\b")
"""Python calls that block: ``time.sleep``, ``Lock.acquire``, ``select``/``poll``, socket and file reads."""

LIBRARY_ROOTS = frozenset(getattr(sys, "stdlib_module_names", ())) | {
    "torch", "torchgen", "functorch", "triton", "typing_extensions", "_pytest", "pytest", "pluggy"}
"""Top-level packages whose frames are not the user's code: the standard library and torch's own."""

FRAME = re.compile(r"^(?P<path>[^()<>]+?)\((?P<line>\d+)\): (?P<func>.+)$")
"""``file.py(line): function``: how torch.profiler names a Python frame."""

MATH_ROOTS = frozenset({"numpy", "scipy", "sklearn", "numba", "numexpr"})
"""Packages whose calls are math on host arrays."""
PY_MATH = re.compile(r"^<built-in method (?P<func>\w+) of (?P<type>numpy\.(?:ndarray|ufunc|generic|\w+)) object")
"""A C method of a numpy object (``<built-in method sum of numpy.ndarray object at 0x...>``)."""


def _module_root(path: str) -> str:
    """The top-level package of a frame's file: ``torch/nn/modules/module.py`` -> ``torch``; an absolute
    path is cut after ``site-packages/`` (``/usr/lib/python3.11/threading.py`` -> ``threading``)."""
    p = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in p:
            p = p.rsplit(marker, 1)[1]
            break
    else:
        m = re.search(r"/lib/python\d[\d.]*/(.*)$", p)
        if m:
            p = m.group(1)
        elif p.startswith("/"):
            return ""  # the user's own file, by absolute path
    head = p.split("/", 1)[0]
    return head.removesuffix(".py")


def python_kind(name: str) -> str | None:
    """``python`` for a frame of the user's code, ``wait`` for a Python call that blocks, ``math`` for a call
    into a host math library, None otherwise."""
    text = str(name)
    if PY_WAIT.match(text):
        return "wait"
    if PY_MATH.match(text):
        return "math"
    m = FRAME.match(text)
    if m is None:
        return None
    root = _module_root(m.group("path"))
    return "math" if root in MATH_ROOTS else None if root in LIBRARY_ROOTS else "python"


def wait_name(name: str) -> str:
    """A blocking Python call's name without its address: ``<built-in function sleep>`` -> ``sleep``,
    ``<built-in method acquire of _thread.lock object at 0x..>`` -> ``_thread.lock.acquire``."""
    text = str(name)
    m = re.match(r"^<built-in method (\w+) of ([\w.]+) object", text)
    if m:
        return f"{m.group(2)}.{m.group(1)}"
    m = PY_WAIT.match(text)
    return m.group(1) if m else text


def math_name(name: str) -> str:
    """A math call's dotted name: ``numpy/linalg/_linalg.py(1667): svd`` -> ``numpy.linalg._linalg.svd``,
    ``<built-in method sum of numpy.ndarray object at 0x..>`` -> ``numpy.ndarray.sum``."""
    text = str(name)
    m = PY_MATH.match(text)
    if m:
        return f"{m.group('type')}.{m.group('func')}"
    f = FRAME.match(text)
    if f is None:
        return text
    path = f.group("path").replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        path = path.rsplit(marker, 1)[-1]
    module = path.removesuffix(".py")
    return f"{module.replace('/', '.')}.{f.group('func')}"


def host_rows(nodes: CpuNodes, py: Mapping[str, np.ndarray] | None, base: int, strings: np.ndarray) -> pd.DataFrame:
    """The ``host`` table of a Kineto trace: outermost ops, the user's Python functions, blocking calls."""
    frames = [f for f in (_op_rows(nodes), _python_rows(py, base, strings)) if len(f)]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).sort_values("start_ns", kind="stable").reset_index(drop=True)


def _root_of(ancestor: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The outermost op along ``ancestor`` from each ``start`` (itself when it has none; -1 stays -1)."""
    cur = start.astype("int64").copy()
    active = np.flatnonzero(cur >= 0)  # the walks still climbing (each round looks at those only)
    for _ in range(4096):
        up = ancestor[cur[active]]
        move = up >= 0
        active = active[move]
        if not len(active):
            break
        cur[active] = up[move]
    return cur


def _op_rows(nodes: CpuNodes) -> pd.DataFrame:
    ops = nodes.of(OP)
    if not len(ops):
        return pd.DataFrame()
    anc = nodes.nesting.op_ancestor
    root_of_op = _root_of(anc, ops)
    roots = ops[anc[ops] < 0]
    # the device calls under each root op
    api = nodes.of(API)
    calls = api[nodes.name_flags(api, lambda n: DEVICE_CALL.search(str(n)))] if len(api) else api
    call_root = _root_of(anc, anc[calls]) if len(calls) else np.zeros(0, np.int64)
    n_calls = np.bincount(call_root[call_root >= 0], minlength=len(nodes["kind"]))
    # ops that compute (more than a view, an allocation or a scalar read), per root
    computes = nodes.name_flags(ops, lambda n: category_of(str(n)) != "view")
    has_compute = np.zeros(len(nodes["kind"]), bool)
    has_compute[root_of_op[computes]] = True
    # the longest computing op inside each root (not the root itself)
    dur = nodes.durations(ops)
    inner = pd.DataFrame({"root": root_of_op, "op": ops, "dur": dur})[computes & (root_of_op != ops)]
    inner_op = np.full(len(nodes["kind"]), None, dtype=object)
    if len(inner):
        best = inner.sort_values("dur", ascending=False, kind="stable").drop_duplicates("root")
        inner_op[best["root"].to_numpy()] = nodes.names(best["op"].to_numpy())
    device_calls = n_calls[roots]
    inputs = op_inputs(nodes, roots)
    def text(values: np.ndarray) -> pd.Series:
        # an object column of the nodes' shared strings (pandas 3 would copy each row's text into an Arrow
        # string column, which conform turns back into shared strings)
        return pd.Series(np.asarray(values, dtype=object), dtype=object, copy=False)

    return pd.DataFrame({
        "kind": text(one_text("op", len(roots))), "name": text(nodes.names(roots)),
        "start_ns": nodes["start_ns"][roots], "end_ns": nodes["end_ns"][roots], "duration_ns": nodes.durations(roots),
        "thread": nodes["tid"][roots],
        "device_calls": device_calls.astype("int64"),
        "host_compute": (device_calls == 0) & has_compute[roots],
        "inner_op": text(inner_op[roots]),
        "op_shapes": text(inputs["op_shapes"]), "op_input_types": text(inputs["op_input_types"]),
    })


def _python_rows(py: Mapping[str, np.ndarray] | None, base: int, strings: np.ndarray) -> pd.DataFrame:
    if py is None or not len(py["ts"]):
        return pd.DataFrame()
    kind = per_distinct(strings, py["name"], python_kind)
    keep = np.flatnonzero(pd.notna(kind))
    if not len(keep):
        return pd.DataFrame()
    start, end, dur = times_ns({"ts": py["ts"][keep], "dur": py["dur"][keep]}, base)
    kinds, names, thread = kind[keep], texts(strings, py["name"][keep]), py["tid"][keep]
    rows = pd.DataFrame({"kind": kinds, "name": names, "start_ns": start, "end_ns": end, "duration_ns": dur,
                         "thread": thread})
    is_math = (kinds == "math")
    if is_math.any():  # the outermost math call only (the user's np.linalg.norm, not the numpy code inside)
        m = rows[is_math].sort_values(["thread", "start_ns", "end_ns"], ascending=[True, True, False], kind="stable")
        t, e = m["thread"].astype("float64").fillna(-1.0).to_numpy(), m["end_ns"].to_numpy(np.int64)
        prev_end = pd.Series(e).groupby(t).cummax().groupby(t).shift(1).to_numpy(np.float64, na_value=np.nan)
        inner = m.index[~np.isnan(prev_end) & (m["start_ns"].to_numpy(np.int64) < prev_end)]
        rows = rows.drop(index=inner)
        math_rows = rows["kind"] == "math"
        rows.loc[math_rows, "name"] = per_distinct_text(rows.loc[math_rows, "name"].to_numpy(object), math_name)
    waits = rows["kind"] == "wait"
    if waits.any():
        rows.loc[waits, "name"] = per_distinct_text(rows.loc[waits, "name"].to_numpy(object), wait_name)
    return rows.reset_index(drop=True)


__all__ = ["host_rows", "math_name", "python_kind", "wait_name"]
