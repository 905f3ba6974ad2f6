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
  ``poll``, socket and file reads), from the same ``with_stack`` events.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ...costs.operators import category_of
from .ops import API, OP, CpuNodes, op_inputs, per_distinct, texts, times_ns

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
    """``python`` for a frame of the user's code, ``wait`` for a Python call that blocks, None otherwise."""
    text = str(name)
    if PY_WAIT.match(text):
        return "wait"
    m = FRAME.match(text)
    if m is None:
        return None
    return None if _module_root(m.group("path")) in LIBRARY_ROOTS else "python"


def host_rows(nodes: CpuNodes, py: Mapping[str, np.ndarray] | None, base: int, strings: np.ndarray) -> pd.DataFrame:
    """The ``host`` table of a Kineto trace: outermost ops, the user's Python functions, blocking calls."""
    frames = [f for f in (_op_rows(nodes), _python_rows(py, base, strings)) if len(f)]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).sort_values("start_ns", kind="stable").reset_index(drop=True)


def _root_of(ancestor: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The outermost op along ``ancestor`` from each ``start`` (itself when it has none; -1 stays -1)."""
    cur = start.astype("int64").copy()
    for _ in range(4096):
        up = np.where(cur >= 0, ancestor[np.maximum(cur, 0)], -1)
        move = up >= 0
        if not move.any():
            break
        cur[move] = up[move]
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
    calls = api[nodes.per_name(api, lambda n: bool(DEVICE_CALL.search(str(n)))).astype(bool)] if len(api) else api
    call_root = _root_of(anc, anc[calls]) if len(calls) else np.zeros(0, np.int64)
    n_calls = np.bincount(call_root[call_root >= 0], minlength=len(nodes["kind"]))
    # ops that compute (more than a view, an allocation or a scalar read), per root
    computes = nodes.per_name(ops, lambda n: category_of(str(n)) != "view").astype(bool)
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
    return pd.DataFrame({
        "kind": "op", "name": nodes.names(roots),
        "start_ns": nodes["start_ns"][roots], "end_ns": nodes["end_ns"][roots], "duration_ns": nodes.durations(roots),
        "thread": nodes["tid"][roots],
        "device_calls": device_calls.astype("int64"),
        "host_compute": (device_calls == 0) & has_compute[roots],
        "inner_op": inner_op[roots],
        "op_shapes": inputs["op_shapes"], "op_input_types": inputs["op_input_types"],
    })


def _python_rows(py: Mapping[str, np.ndarray] | None, base: int, strings: np.ndarray) -> pd.DataFrame:
    if py is None or not len(py["ts"]):
        return pd.DataFrame()
    kind = per_distinct(strings, py["name"], python_kind)
    keep = np.flatnonzero(pd.notna(kind))
    if not len(keep):
        return pd.DataFrame()
    start, end, dur = times_ns({"ts": py["ts"][keep], "dur": py["dur"][keep]}, base)
    return pd.DataFrame({
        "kind": kind[keep], "name": texts(strings, py["name"][keep]),
        "start_ns": start, "end_ns": end, "duration_ns": dur, "thread": py["tid"][keep],
    })


__all__ = ["host_rows", "python_kind"]
