"""CUDA-graph capture traces: the graphs a serving engine captured, as eager launches with costs.

vLLM and SGLang can profile their CUDA-graph capture into a separate Kineto trace, one per
captured batch size, in a ``capture_traces/`` folder with an ``execution_details.json``
(``[{"file": ..., "batch_size": 32, "mode": "FULL"}, ...]``; ``mode`` is vLLM's ``FULL`` or
``PIECEWISE``, SGLang's ``DECODE``). While a stream is being captured its kernels do not run:
the trace holds no kernel events for them, only their launch calls (``hipLaunchKernel``,
``hipModuleLaunchKernel``, ``cudaLaunchKernel``, ...), each naming its kernel in ``args.kernel``
and linked by ``External id`` to the op that issued it, with that op's recorded shapes. A
capture range (``capture_32_FULL``, ``capture_32_DECODE``) brackets each graph.

This module reads such traces with the Kineto reader (:func:`.kineto_parse.parse_trace` and
:mod:`.kineto_ops`) into :class:`Graph` objects: the kernel-name sequence of each graph, and for
each kernel the op that launched it, its shapes and its analytic cost. Launches that did run
(a kernel event shares their correlation id: the engine's eager fills before capturing) are
not part of the graph. :mod:`.kineto_graphs` joins the replays of a trace to these graphs
(``flops_source`` ``graph-capture-trace``); see ``docs/cuda-graphs.md``.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfscope.errors import InputFormatError, PerfscopeError

from ...costs.operators import category_of
from .modules import modules_around
from .ops import ANN, CpuNodes, cpu_nodes, launches, launching_ops, op_costs, op_inputs, texts
from .parse import ParsedTrace, parse_trace

CAPTURE_DIR = "capture_traces"
"""The folder beside a trace where vLLM and SGLang write their capture traces."""

DETAILS = "execution_details.json"
"""The folder's index: one entry per capture trace (``file``, ``batch_size``, ``mode``)."""

SOURCE = "graph-capture-trace"
"""The ``flops_source`` / ``bytes_source`` of a replayed kernel costed from a capture trace."""

CAPTURE_RANGE = re.compile(r"^capture_(\d+)_([A-Za-z]+)$")
"""The range around one graph's capture (``capture_32_FULL``): batch size and mode."""

TRACE_SUFFIXES = (".json", ".json.gz")

COLUMNS = ("op", "op_shapes", "op_input_types", "dtype", "category")


@dataclass(frozen=True)
class Graph:
    """One captured graph: its kernels in launch order, each with its op and that op's cost.

    Attributes:
        file: the capture trace it came from.
        batch: the batch size it was captured for (None: not recorded).
        mode: ``FULL``, ``PIECEWISE``, ``DECODE``, ... (None: not recorded).
        names: kernel names, in launch order.
        cols: per kernel, the :data:`COLUMNS` of its op, the op's whole ``flops`` and
            ``dram_bytes`` (NaN: no formula or no shapes), ``inputs``: the op's recorded
            ``(Input Dims, Input type, Concrete Inputs)`` (a replay re-prices an op whose
            formula needs the step, attention, with them and the replay's step), ``unit``:
            the position of the first kernel of the same op (an op's cost is split over its
            kernels by replay time), and ``module``: the '/'-joined ``nn.Module`` calls around
            the launch inside the capture (None: none, or a trace recorded without
            ``with_stack``).
        problem: why the graph must not be joined (its index and its capture range disagree
            on the batch size), else None.
    """

    file: str
    batch: int | None
    mode: str | None
    names: np.ndarray
    cols: dict[str, np.ndarray]
    problem: str | None = None

    def label(self) -> str:
        return f"{self.file} (batch {'?' if self.batch is None else self.batch}, {self.mode or 'mode ?'}, " \
               f"{len(self.names)} kernels)"


@dataclass
class CaptureSet:
    """The graphs of a ``--capture`` path or of the ``capture_traces/`` folder beside a trace.

    Attributes:
        path: the file or folder given or found.
        found: how: ``--capture`` or ``beside the trace``.
        graphs: every graph of every capture trace.
        warnings: what was skipped while reading them.
    """

    path: Path
    found: str
    graphs: list[Graph] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class CaptureLoader:
    """Reads the capture traces when first called (only a trace with graph replays needs them):
    ``capture`` when given (errors raise), else the ``capture_traces/`` folder beside ``trace``
    when there is one (an unreadable one becomes a warning and the import goes on)."""

    def __init__(self, trace: str | Path, capture: str | Path | None = None) -> None:
        self.trace, self.capture = Path(trace), capture
        self.result: CaptureSet | None = None
        self.loaded = False

    def __call__(self) -> CaptureSet | None:
        if not self.loaded:
            self.loaded = True
            if self.capture is not None:
                self.result = read_captures(self.capture, found="--capture")
            elif (folder := beside(self.trace)) is not None:
                try:
                    self.result = read_captures(folder, found="beside the trace")
                except PerfscopeError as exc:
                    self.result = CaptureSet(folder, "beside the trace",
                                             warnings=[f"{CAPTURE_DIR}/ beside the trace not used: {exc}"])
        return self.result

    def manifest(self) -> dict[str, str] | None:
        """The report's record of the capture traces read (None: none were)."""
        cs = self.result
        return None if cs is None else {"path": str(cs.path), "found": cs.found, "graphs": str(len(cs.graphs))}


def beside(trace: str | Path) -> Path | None:
    """The ``capture_traces/`` folder next to ``trace``, if there is one."""
    folder = Path(trace).parent / CAPTURE_DIR
    return folder if folder.is_dir() else None


def read_captures(path: str | Path, *, found: str) -> CaptureSet:
    """The graphs of a capture trace, or of a folder of them (indexed by ``execution_details.json``
    when it has one; else each ``*.json[.gz]`` trace in it, batch sizes from their capture ranges).

    Raises:
        InputFormatError: no such path, a folder with no trace, an unreadable index or trace.
    """
    p = Path(path)
    if not p.exists():
        raise InputFormatError(p, "no such capture trace or folder", hint="give --capture a capture trace or "
                               f"the {CAPTURE_DIR}/ folder the engine wrote")
    out = CaptureSet(p, found)
    entries: list[tuple[Path, int | None, str | None]]
    if p.is_file():
        entries = [(p, None, None)]
    elif (p / DETAILS).is_file():
        entries = _details(p / DETAILS)
    else:
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.lower().endswith(TRACE_SUFFIXES))
        if not files:
            raise InputFormatError(p, f"has no {DETAILS} and no capture trace (*.json, *.json.gz)",
                                   hint="give the capture_traces/ folder vLLM or SGLang wrote, or one capture trace")
        out.warnings.append(f"{p} has no {DETAILS}: its {len(files)} trace(s) are matched to the replays by "
                            "kernel sequence, batch sizes taken from their capture_<bs>_<mode> ranges")
        entries = [(f, None, None) for f in files]
    for file, batch, mode in entries:
        graphs = _graphs(file, batch, mode)
        if not graphs:
            out.warnings.append(f"capture trace {file.name}: no captured kernel launches (launch calls naming "
                                "their kernel that did not run) in it")
        out.graphs += graphs
    return out


STEP_BATCH = (re.compile(r"^execute_(\d+)_context_"), re.compile(r"^(?:perfscope\.)?step\[[A-Za-z]+ [^]]*\bbs=(\d+)"))
"""Step ranges that name their batch: vLLM's ``execute_32_context_0(..)_generation_32(..)`` (the
first number: tokens in the step, a decode step's batch), SGLang's ``step[DECODE bs=32]`` and
``perfscope.step[decode bs=32 ...]``."""


def step_batch(name: str) -> int | None:
    """The batch size a step range's name gives, else None."""
    for pattern in STEP_BATCH:
        m = pattern.match(name)
        if m:
            return int(m.group(1))
    return None


def join_graph(captures: CaptureSet, names: tuple[str, ...], batch: int | None) -> tuple[Graph, int] | str:
    """The graph (and the position in it) whose kernel-name sequence holds the replay's
    ``names`` as a contiguous run, of the replay's ``batch`` when that is known; else why not.

    A graph of unknown batch size matches on its sequence alone; a replay of unknown batch
    size matches when every graph holding its sequence is of one batch size.
    """
    want = np.array(names, dtype=object)
    held = [(g, at) for g in captures.graphs if (at := _find(g.names, want)) >= 0]
    usable = [(g, at) for g, at in held if g.problem is None]
    if batch is not None:
        usable = [(g, at) for g, at in usable if g.batch is None or g.batch == batch]
    elif len({g.batch for g, _ in usable}) > 1:
        sizes = sorted({g.batch for g, _ in usable if g.batch is not None})
        return (f"the replay's kernel sequence is in graphs of batch sizes {sizes} and the trace names no step "
                "batch size to choose by")
    if usable:
        return usable[0]
    problems = [g.problem for g, _ in held if g.problem]
    if problems:
        return problems[0]
    if held:
        sizes = sorted({g.batch for g, _ in held if g.batch is not None})
        return f"the replay's step runs batch {batch}, its kernel sequence is in graphs of batch {sizes} only"
    return _difference(captures.graphs, want, batch)


def _find(seq: np.ndarray, want: np.ndarray) -> int:
    """First position where ``want`` runs contiguously in ``seq``, else -1."""
    n = len(want)
    if not n or len(seq) < n:
        return -1
    for c in np.flatnonzero(seq[: len(seq) - n + 1] == want[0]).tolist():
        if (seq[c:c + n] == want).all():
            return c
    return -1


def _difference(graphs: list[Graph], want: np.ndarray, batch: int | None) -> str:
    """How the replay's kernels differ from the closest graph (same batch first, then length)."""
    if not graphs:
        return "it holds no captured graph"
    g = min(graphs, key=lambda g: (g.batch != batch, abs(len(g.names) - len(want))))
    n = min(len(g.names), len(want))
    diff = np.flatnonzero(g.names[:n] != want[:n])
    at = int(diff[0]) if len(diff) else n
    what = (f"from kernel {at} ({_short(want[at])} replayed, {_short(g.names[at])} captured)" if at < n
            else f"after kernel {at}")
    step = f"batch {batch}" if batch is not None else "unknown batch"
    return f"the replay ({step}, {len(want)} kernels) and {g.label()} differ {what}"


def _short(name: object, limit: int = 60) -> str:
    text = str(name)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _details(path: Path) -> list[tuple[Path, int | None, str | None]]:
    try:
        items = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputFormatError(path, f"is not readable JSON ({exc})",
                               hint="re-copy the capture_traces/ folder the engine wrote") from None
    if isinstance(items, dict):
        items = [items]
    ok = isinstance(items, list) and all(isinstance(i, dict) and isinstance(i.get("file"), str) for i in items)
    if not ok or not items:
        raise InputFormatError(path, 'is not a list of {"file": ..., "batch_size": ..., "mode": ...} entries',
                               hint="re-copy the capture_traces/ folder the engine wrote")
    out = []
    for item in items:
        file = path.parent / item["file"]
        if not file.is_file():
            raise InputFormatError(file, f"listed in {path.name} but missing", hint="copy the whole capture folder")
        batch = item.get("batch_size")
        out.append((file, int(batch) if isinstance(batch, int | float) and batch == int(batch) else None,
                    str(item["mode"]) if item.get("mode") is not None else None))
    return out


def _graphs(file: Path, batch: int | None, mode: str | None) -> list[Graph]:
    """The graphs captured in one trace (one per capture range, else all its captured launches)."""
    try:
        trace = parse_trace(file)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise InputFormatError(file, f"truncated or damaged compressed data ({exc})",
                               hint="re-copy the capture trace") from None
    if trace.partial:
        raise InputFormatError(file, "capture trace is truncated or damaged; its graphs would be cut short",
                               hint="re-copy the capture trace")
    nodes = cpu_nodes(trace, 0)
    ran = trace.cols.get("kernel", {}).get("corr", np.empty(0))
    corr_index, api_pos, cost_pos = launches(nodes)
    kernel = nodes["kernel"][api_pos]
    keep = (kernel >= 0) & ~np.isin(corr_index.to_numpy(), ran[~np.isnan(ran)])
    api, cost_op = api_pos[keep], cost_pos[keep]
    order = np.argsort(nodes["start_ns"][api], kind="stable")
    api, cost_op = api[order], cost_op[order]
    names = texts(nodes.strings, nodes["kernel"][api])
    cols = _kernel_costs(nodes, api, cost_op, names)
    start = nodes["start_ns"][api]
    out = []
    ranges = _capture_ranges(nodes)
    sizes = {b for b, *_ in ranges}
    cols["module"] = np.full(len(api), None, dtype=object)
    for b, m, lo, hi in ranges:
        sel = np.flatnonzero((start >= lo) & (start <= hi))
        cols["module"][sel] = _modules(trace, nodes, api[sel], lo, hi)
        problem = None
        if batch is not None and batch not in sizes:  # a file of several ranges keeps their own sizes
            problem = (f"{file.name}: {DETAILS} says batch {batch} but its capture range is capture_{b}_{m} "
                       "(which is right is unknown, so it is not used)")
        if len(sel):
            out.append(_graph(file.name, b, mode or m, names, cols, sel, problem))
    if not out and len(api) and not ranges:
        cols["module"] = _modules(trace, nodes, api, int(start.min()), int(nodes["end_ns"][api].max()))
        out.append(_graph(file.name, batch, mode, names, cols, np.arange(len(api))))
    return out


def _modules(trace: ParsedTrace, nodes: CpuNodes, api: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The ``nn.Module`` path (inside the capture ``[lo, hi]``) around each captured launch call."""
    return modules_around(trace.cols.get("py"), trace.strings, nodes["thread"][api], nodes["start_ns"][api],
                          nodes["end_ns"][api], lo, hi)


def _capture_ranges(nodes: CpuNodes) -> list[tuple[int, str, int, int]]:
    ann = nodes.of(ANN)
    out = []
    for i, name in zip(ann.tolist(), nodes.names(ann).tolist()):
        m = CAPTURE_RANGE.match(str(name))
        if m:
            out.append((int(m.group(1)), m.group(2), int(nodes["start_ns"][i]), int(nodes["end_ns"][i])))
    return sorted(out, key=lambda r: r[2])


def _graph(file: str, batch: int | None, mode: str | None, names: np.ndarray, cols: dict[str, np.ndarray],
           sel: np.ndarray, problem: str | None = None) -> Graph:
    sub = {c: v[sel] for c, v in cols.items()}
    sub["unit"] = _first_of(sub.pop("owner"))
    return Graph(file, batch, mode, names[sel], sub, problem)


def _first_of(owner: np.ndarray) -> np.ndarray:
    """For each position, the first position holding the same owner (-1: its own)."""
    out = np.arange(len(owner))
    seen: dict[int, int] = {}
    for i, o in enumerate(owner.tolist()):
        if o >= 0:
            out[i] = seen.setdefault(o, i)
    return out


def _kernel_costs(nodes: CpuNodes, api: np.ndarray, cost_op: np.ndarray, names: np.ndarray) -> dict[str, np.ndarray]:
    """Each captured kernel's op (the costed op, else the op that launched it), inputs and
    the op's whole FLOPs/bytes; ``owner`` is the op's node (-1: none)."""
    owner = np.where(cost_op >= 0, cost_op, launching_ops(nodes, api)).astype("int64")
    n = len(api)
    out: dict[str, np.ndarray] = {c: np.full(n, None, dtype=object) for c in (*COLUMNS, "inputs")}
    out["flops"], out["dram_bytes"] = np.full(n, np.nan), np.full(n, np.nan)
    has = owner >= 0
    if has.any():
        uniq, inverse = np.unique(owner[has], return_inverse=True)
        inverse = inverse.reshape(-1)
        out["op"][has] = nodes.names(uniq)[inverse]
        for c, values in op_inputs(nodes, uniq).items():
            out[c][has] = values[inverse]
        sigs = nodes["sig"][uniq].tolist()
        recorded = np.empty(len(uniq), dtype=object)
        recorded[:] = [nodes.sigs[s] if s >= 0 else None for s in sigs]
        out["inputs"][has] = recorded[inverse]
        costs = op_costs(nodes, uniq)
        priced = np.isin(uniq, cost_op[cost_op >= 0])[inverse]
        flops, nbytes = costs["flops"][inverse], costs["dram_bytes"][inverse]
        out["flops"][has] = np.where(priced, flops, np.nan)
        out["dram_bytes"][has] = np.where(priced, nbytes, np.nan)
    out["category"] = np.array([category_of(o, k) for o, k in zip(out["op"].tolist(), names.tolist())], dtype=object)
    out["owner"] = owner
    return out


__all__ = [
    "CAPTURE_DIR",
    "DETAILS",
    "SOURCE",
    "CaptureLoader",
    "CaptureSet",
    "Graph",
    "beside",
    "join_graph",
    "read_captures",
    "step_batch",
]
