"""PyTorch/Kineto trace -> Report: kernels linked to their ops, analytic costs, ranges, copies.

The trace is streamed into compact columns (:mod:`.kineto_parse`, :mod:`.kineto_json`); the
CPU annotations, ops and launch calls are nested and the kernels linked to their costed op
through the correlation / External id links (:mod:`.kineto_ops`, FORMATS.md §4.6). The op's
analytic FLOPs and bytes go to its kernels, split by kernel time when it launched several.
CPU-only traces have no kernels: each outermost costed operator (or leaf operator) becomes a
row with device ``cpu``. Kernels replayed from a CUDA graph (``cudaGraphLaunch``) link to no op;
:mod:`.kineto_graphs` gives them one, with FLOPs and bytes, from the eager launches in the trace.

Ranges are the ``user_annotation`` events (``record_function``); a row's ``range`` is the
'/'-joined path of the ranges around it (around its launch call, for kernels) and its ``phase``
is ``prefill`` or ``decode`` when one of those names is on the path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from perfscope.datasheets import ROOFS_FLAG, gpu_spec, roofs_note, unusable_properties
from perfscope.device import DeviceSpec
from perfscope.format import counted
from perfscope.kernel_names import short_kernel_name
from perfscope.memo import memo_peek, memo_seed
from perfscope.report import Report, source_info
from perfscope.schema import CODES_KEY, decode, factorize, map_distinct, recode
from perfscope.vocab import device_label, is_amd_device

from ...costs.operators import COMPOSITE_WHEN_PARENT, base_name
from ...tree import PHASES
from ..finish import Imported, finish
from .capture import CaptureLoader
from .graphs import Kernels, graph_costs
from .host import host_rows
from .memory_events import memory_table
from .modules import module_ranges
from .ops import (
    ANN,
    API,
    CpuNodes,
    attributed_costs,
    cpu_nodes,
    labels,
    launch_ops,
    launches,
    one_text,
    op_costs,
    op_inputs,
    per_distinct,
    select_cpu_rows,
    take_at,
    texts,
    times_ns,
)
from .parse import CPU_KINDS, ParsedTrace, _text, clean_text, parse_trace

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

BASE_LIMIT_NS = 1 << 62
"""A ``baseTimeNanoseconds`` at or beyond this (year 2116) is damage, not a time."""


def read_kineto(path: Path, *, device: DeviceSpec | None = None, capture: str | Path | None = None) -> Report:
    """Read a torch.profiler / Kineto trace (``.json`` or ``.json.gz``) into a Report.

    Args:
        path: the trace file.
        device: roofs to classify against; by default the trace's GPU from a datasheet table
            (CPU traces have no roofs unless given, so their bound stays ``unknown``).
        capture: the engine's CUDA-graph capture trace, or a folder of them, to join the
            graph replays to (default: a ``capture_traces/`` folder beside the trace, if any).
    """
    return finish(import_kineto(path, device=device, capture=capture))


def import_kineto(path: str | Path, *, device: DeviceSpec | None = None,
                  capture: str | Path | None = None, memory_known: Sequence[tuple[Any, ...]] = (),
                  memory_known_in_totals: bool = True) -> Imported:
    """A Kineto trace parsed into raw tables (the reader half of :func:`read_kineto`; the engine
    and load-test sessions add their own tables before :func:`.finish.finish`). ``memory_known``:
    allocations made before the trace that the caller knows (:func:`.memory_events.memory_table`)."""
    trace = parse_trace(Path(path))
    captures = CaptureLoader(path, capture)
    tables, warnings = build_tables(trace, captures, memory_known, memory_known_in_totals)
    n_kernels, n_ops = trace.count("kernel"), trace.count("op")
    meta, notes = trace.meta, trace.warnings
    n_py = trace.count("py")
    n_replays = trace.count("prof")
    has_gpu = n_kernels > 0 or gpu_calls(trace)
    frontend = frontend_markers(trace) if not has_gpu else ()
    manifest: dict[str, Any] = {"name": Path(path).name.split(".")[0], "partial": trace.partial,
                                "params": {"events": trace.n_events, "python_events": n_py,
                                           "with_stack": bool(meta.get("with_stack")) or n_py > 0}}
    if (record := captures.manifest()) is not None:
        manifest["params"]["capture_traces"] = record
    if n_replays:
        manifest["params"]["counter_replays"] = n_replays  # the kernel launches replayed for counters
        warnings.append(counter_replay_warning(n_replays, n_kernels))
    del trace  # its columns are no longer needed: free them before the tables are checked
    spec = device or device_from_meta(meta, has_gpu=has_gpu)
    warnings += device_properties_warning(meta)
    kernels = tables["kernels"]
    warnings += missing_formulas_warning(kernels)
    no_gpu_work = spec is not None and spec.properties.get("gpu_work") is False
    if no_gpu_work:
        manifest["params"].update({"gpu_work": False, "frontend": frontend[0] if frontend else None})
    if n_kernels == 0 and n_ops:
        warnings.append(no_gpu_work_warning(path, meta, spec, frontend) if no_gpu_work and spec is not None
                        else "no GPU kernel events in this trace: rows are CPU operators")
    note = roofs_note(spec) if device is None and not no_gpu_work else None
    if no_gpu_work:
        pass  # the warning above says why there are no roofs: nothing ran on the GPU in this process
    elif note or spec is None or not spec.compute:
        warnings.append(note or f"no device roofs known for this trace: bound is 'unknown'; {ROOFS_FLAG}")
    flops = kernels["flops"] if "flops" in kernels else pd.Series(dtype="float64")
    manifest.update({
        "source": source_info("kineto", path, "torch.profiler", _tool_version(meta)),
        "warnings": notes + warnings,
        "unavailable_metrics": [] if pd.to_numeric(flops, errors="coerce").notna().any() else ["flops", "dram_bytes"],
    })
    return Imported(tables, manifest, spec, origin=str(path))


read = read_kineto


def counter_replay_warning(replays: int, kernels: int) -> str:
    """What a trace whose profiler replayed ``replays`` kernel launches for hardware counters means for its times."""
    timed = "it records no kernel timings, and " if not kernels else ""
    return (f"the profiler collected hardware counters by replaying {counted(replays, 'kernel launch')} inside their launch "
            f"calls (the trace's cuda_profiler_range records: CUPTI's range profiler, torch.profiler's "
            f"experimental_config profiler_metrics): {timed}its launch and operator times include the replays. Time "
            f"the run without counter collection, and collect counters in a run of their own")


# ---------------------------------------------------------------------------- time
def _base_ns(meta: Mapping[str, Any]) -> int:
    """``baseTimeNanoseconds`` (0 when absent or unusable: absolute-us traces)."""
    base = meta.get("baseTimeNanoseconds")
    try:
        value = int(base) if base is not None else 0
    except (TypeError, ValueError, OverflowError):
        return 0
    return value if 0 <= value < BASE_LIMIT_NS else 0


# ---------------------------------------------------------------------------- tables
def build_tables(trace: ParsedTrace, captures: CaptureLoader | None = None, memory_known: Sequence[tuple[Any, ...]] = (),
                 memory_known_in_totals: bool = True) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """All report tables from a parsed trace, before roofline classification (``captures``: the
    capture traces to join its graph replays to)."""
    base = _base_ns(trace.meta)
    nodes = cpu_nodes(trace, base)
    warnings: list[str] = []
    amd = amd_trace(trace.meta)
    tables = {
        "kernels": _gpu_kernels(trace.cols["kernel"], base, nodes, warnings, captures, amd=amd)
        if trace.count("kernel") else _cpu_rows(nodes),
        "ranges": _with_modules(_ranges(nodes), trace.cols.get("py"), base, trace.strings),
        "transfers": _transfers(trace, base, nodes, amd=amd),
        "api": _api(nodes),
        "host": host_rows(nodes, trace.cols.get("py"), base, trace.strings),
    }
    if trace.count("mem") or memory_known:
        tables["memory"] = memory_table(trace.cols.get("mem"), base, nodes, tables["ranges"], memory_known,
                                        memory_known_in_totals)
    del nodes  # before the text columns take their final (larger) form
    return {name: _text_columns(df, MEMOIZED_CODES.get(name, ())) for name, df in tables.items()}, warnings


MEMOIZED_CODES = {"api": ("name",)}
"""Text columns whose factorization :func:`_text_columns` makes is kept as their
:func:`perfscope.schema.column_codes` (int32, 4 bytes a row while the report lives): the idle
classification asks four questions of every host call's name."""


def _ranges(nodes: CpuNodes) -> pd.DataFrame:
    """The annotations; ``id`` is the row number, ``parent`` the id of the enclosing range."""
    idx = nodes.of(ANN)
    nst = nodes.nesting
    parent = nst.range_parent[idx]
    return _table(sort=False, cols={
        "id": np.arange(len(idx), dtype="int64"),
        "name": nodes.names(idx),
        "start_ns": nodes["start_ns"][idx],
        "end_ns": nodes["end_ns"][idx],
        "duration_ns": nodes.durations(idx),
        "depth": nst.range_depth(idx),
        "parent": np.where(parent >= 0, np.searchsorted(idx, parent), np.nan),
        "path": nst.range_path_self(idx),
        "thread": nodes["tid"][idx],
        "source": "record_function",
    })


def _with_modules(ranges: pd.DataFrame, py: Mapping[str, np.ndarray] | None, base: int,
                  strings: np.ndarray) -> pd.DataFrame:
    """The annotation ranges followed by the module ranges (:func:`module_ranges`)."""
    first = int(ranges["id"].max()) + 1 if len(ranges) else 0
    mods = module_ranges(py, base, strings, first)
    if not len(mods):
        return ranges
    if not len(ranges):
        return mods
    return pd.concat([ranges, mods], ignore_index=True)


def _cpu_rows(nodes: CpuNodes) -> pd.DataFrame:
    idx = select_cpu_rows(nodes)
    if not len(idx):
        return pd.DataFrame()
    costs = op_costs(nodes, idx)
    names = nodes.names(idx)
    zero_view = (costs["category"] == "view") | nodes.name_flags(
        idx, lambda n: base_name(n) in COMPOSITE_WHEN_PARENT)
    costs["flops"][zero_view] = 0.0
    costs["dram_bytes"][zero_view] = 0.0
    costs["category"][zero_view] = "view"
    known = ~np.isnan(costs["flops"])
    nst = nodes.nesting
    return _table({
        "name": names,
        "short_name": nodes.per_name(idx, base_name),
        "device": "cpu",
        "thread": nodes["tid"][idx],
        "start_ns": nodes["start_ns"][idx],
        "end_ns": nodes["end_ns"][idx],
        "duration_ns": nodes.durations(idx),
        "op": names,
        **op_inputs(nodes, idx),
        "category": costs["category"],
        "range": nst.range_path(idx),
        "phase": nst.phase(idx),
        "flops": costs["flops"],
        "dram_bytes": costs["dram_bytes"],
        "flops_source": labels(known, "analytic", None),
        "bytes_source": labels(known, "analytic", None),
    })


def _device_names(device: np.ndarray, *, amd: bool = False) -> np.ndarray:
    """The ``device`` column: ``cuda:N``, or ``gpu:N`` for an AMD trace (:func:`perfscope.vocab.device_label`)."""
    dev = np.where(np.isnan(device), 0, device).astype("int64")
    uniq, inverse = np.unique(dev, return_inverse=True)
    return np.array([device_label(d, amd=amd) for d in uniq.tolist()], dtype=object)[inverse.reshape(-1)]


def amd_trace(meta: Mapping[str, Any]) -> bool:
    """Whether a Kineto trace's GPUs are AMD: its metadata names the HIP runtime or roctracer, or
    its first device's name or 64-wide wavefront says so (:func:`perfscope.vocab.is_amd_device`;
    HTA's MI250 trace names the device ``AMD Radeon Graphics`` and records no HIP version)."""
    props = meta.get("deviceProperties") or []
    first = props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else {}
    return is_amd_device(_text(first.get("name", "")) if first else None, first, meta)


def _gpu_kernels(k: Mapping[str, np.ndarray], base: int, nodes: CpuNodes, warnings: list[str],
                 captures: CaptureLoader | None = None, *, amd: bool = False) -> pd.DataFrame:
    """Kernel rows; those of CUDA graph replays get their costs from :mod:`.kineto_graphs`."""
    strings = nodes.strings
    corr_index, api_pos, cost_pos = launches(nodes)
    link = corr_index.get_indexer(k["corr"]) if len(corr_index) else np.full(len(k["corr"]), -1)
    linked = link >= 0
    api_idx, cost_op = take_at(api_pos, link, -1), take_at(cost_pos, link, -1)
    launcher = take_at(launch_ops(nodes), link, -1)  # launches' own, not made again
    rng, phase = np.full(len(link), None, dtype=object), np.full(len(link), None, dtype=object)
    rng[linked] = nodes.nesting.range_path(api_idx[linked])
    phase[linked] = nodes.nesting.phase(api_idx[linked])
    start, end, dur = times_ns(k, base)
    names = texts(strings, k["name"])
    grid, block = Shared.of(strings, k["grid"]), Shared.of(strings, k["block"])
    costs = attributed_costs(names, dur, cost_op, nodes, launcher)
    launch_name = np.full(len(link), None, dtype=object)
    launch_name[linked] = nodes.names(api_idx[linked])
    launch_start = start.copy()
    launch_start[linked] = nodes["start_ns"][api_idx[linked]]
    warnings += graph_costs(Kernels(names, grid.values, block.values, start, dur, k["corr"], launch_name, launch_start, cost_op),
                            costs, nodes, captures)
    groups = {"process_group": texts(strings, k["pg"])} if "pg" in k and (k["pg"] >= 0).any() else {}
    return _table({
        "name": Shared(names, k["name"], strings),
        "short_name": per_distinct(strings, k["name"], short_kernel_name),
        "device": _device_names(k["device"], amd=amd),
        "stream": k["stream"],
        "start_ns": start, "end_ns": end, "duration_ns": dur,
        "correlation": k["corr"],
        "grid": grid, "block": block,
        "registers_per_thread": k["regs"],
        "shared_mem_bytes": k["smem"],
        "est_occupancy_pct": k["occupancy"],
        "range": rng, "phase": phase,
        **costs,
        **groups,
    })


SMALL_TABLE = 20_000
"""Rows below which a table is built the plain pandas way (its per-column overhead wins)."""


class Shared(NamedTuple):
    """A text column built shared and clean: its rows are ``words[codes]`` (None where a code is -1),
    ``words`` distinct, surrogate-free ``str``. :func:`_table` records it, and :func:`_text_columns`
    keeps it as built instead of hashing and cleaning it again (0.01 s a column at 340k rows)."""

    values: np.ndarray
    codes: np.ndarray
    words: np.ndarray

    @classmethod
    def of(cls, strings: np.ndarray, codes: np.ndarray) -> Shared:
        """The column of string-table ``codes``: :attr:`.parse.ParsedTrace.strings` are distinct and
        clean (the interner adds a text once, after :func:`.parse.clean_text`)."""
        return cls(texts(strings, codes), codes, strings)

    @classmethod
    def labels(cls, mask: np.ndarray, yes: str, no: str) -> Shared | np.ndarray:
        """:func:`.ops.labels` (a plain array where the two texts are not distinct and clean)."""
        values = labels(mask, yes, no)
        if yes == no or not all(_clean(w) for w in (yes, no)):
            return values
        return cls(values, mask.astype(np.int8), np.array([no, yes], dtype=object))


def _clean(text: Any) -> bool:
    """Whether ``text`` is a ``str`` that :func:`.parse.clean_text` leaves as it is."""
    return isinstance(text, str) and (text.isascii() or clean_text(text) == text)


SHARED_KEY = "kineto:shared:"
"""The memo key prefix under which :func:`_table` records a column's :class:`Shared` codes."""


def _table(cols: Mapping[str, Any], *, sort: bool = True) -> pd.DataFrame:
    """A table (sorted by ``start_ns`` unless told not to). A large one is built without
    consolidating copies, its text kept in object columns of shared strings until
    :func:`_text_columns`."""
    start = np.asarray(cols["start_ns"])
    n = len(start)
    # a trace's kernels come in time order (as Kineto writes them): then no column is copied into a new order
    # (every column twice at the kernel table's peak, 1 GB at 5M kernels)
    order = np.argsort(start, kind="stable") if sort and n > 1 and not bool((start[1:] >= start[:-1]).all()) else None
    shared = {k: v if order is None else Shared(v.values[order], v.codes[order], v.words)
              for k, v in cols.items() if isinstance(v, Shared)}
    data = {k: shared[k].values if k in shared else v if order is None or not isinstance(v, np.ndarray) else v[order]
            for k, v in cols.items()}
    if n < SMALL_TABLE:
        return pd.DataFrame({k: _as_object(v, n) for k, v in data.items()}, index=pd.RangeIndex(n))
    for k, v in data.items():
        if not isinstance(v, np.ndarray) and _clean(v):  # one literal text in every row
            shared[k] = Shared(one_text(v, n), np.zeros(n, dtype=np.int8), np.array([v], dtype=object))
    arrays = {k: shared[k].values if k in shared else v if isinstance(v, np.ndarray) else np.full(n, v, dtype=object)
              for k, v in data.items()}
    df = pd.DataFrame({k: pd.Series(v, dtype=v.dtype, copy=False) for k, v in arrays.items()}, copy=False)
    for k, v in shared.items():
        memo_seed(df, f"{SHARED_KEY}{k}", (v.codes, v.words))
    return df


def _as_object(v: Any, n: int) -> Any:
    """A small table's column ``v``, text kept an object column of the strings it holds: pandas 3 would copy
    each row's text into an Arrow string column, which :func:`perfscope.schema.conform` turns back into an
    object column of the same values. Those copies were the import's first writes to Arrow's memory pool,
    which asks the kernel for huge pages: 0.003-0.13 s of system time for 20,000 short strings, by how
    fragmented the machine's memory was (the ranges' and transfers' tables of the 1.09M-event trace)."""
    if isinstance(v, np.ndarray):
        return pd.Series(v, dtype=object, copy=False) if v.dtype == object else v
    if isinstance(v, str):
        return pd.Series(one_text(v, n), dtype=object, copy=False)
    return v


def _text_columns(df: pd.DataFrame, memoized: Sequence[str] = ()) -> pd.DataFrame:
    """``df`` with each text column holding one shared, storable ``str`` per distinct value
    (:func:`_column`); the columns ``memoized`` keep their codes (:data:`MEMOIZED_CODES`)."""
    if len(df) < SMALL_TABLE:
        return df
    columns, kept = {}, {}
    for name in df.columns:
        built = memo_peek(df, f"{SHARED_KEY}{name}")
        if built is not None:  # built shared and clean (Shared): kept as it is, its codes renumbered, not hashed
            columns[name] = pd.Series(df[name].to_numpy(), dtype=object, copy=False)
            known = recode(*built) if name in memoized else None
        else:
            columns[name], known = _column(df[name].to_numpy())
        if known is not None and name in memoized:  # the factorization just made is the column's: not hashed again
            codes, words = known  # narrowed at once: no column's int64 codes wait for the others (0.5 GB at 5M kernels)
            kept[name] = (codes.astype(np.int32) if len(words) < np.iinfo(np.int32).max else codes, words)
        del known
    out = pd.DataFrame(columns, copy=False)
    for name, known in kept.items():
        memo_seed(out, f"{CODES_KEY}{name}", known)
    return out


def _column(v: np.ndarray) -> tuple[pd.Series, tuple[np.ndarray, np.ndarray] | None]:
    """A column of ``v``, and for text its :func:`perfscope.schema.column_codes` when they are known. Text
    stays an object column whose rows refer to one ``str`` per distinct value (each lone surrogate made
    U+FFFD, so it stores as UTF-8): 8 bytes a row, where pandas 3's ``str`` dtype holds each row's own
    bytes (a kernel table's text was 333 of its 406 MB at 626k kernels)."""
    if v.dtype != object:
        return pd.Series(v, copy=False), None
    codes, uniq = factorize(pd.Series(v, dtype=object, copy=False))
    if not len(uniq) or not all(isinstance(u, str) for u in uniq):
        return pd.Series(v), None
    words = np.array([u if u.isascii() else clean_text(u) for u in uniq], dtype=object)
    # cleaning can make two distinct texts one (two lone surrogates): then the codes are not the column's
    kept = all(w is u or w == u for w, u in zip(words, uniq))
    return pd.Series(decode(codes, words), dtype=object, copy=False), (codes, words) if kept else None


def _transfers(trace: ParsedTrace, base: int, nodes: CpuNodes, *, amd: bool = False) -> pd.DataFrame:
    kinds = [k for k in ("memcpy", "memset") if trace.count(k)]
    if not kinds:
        return pd.DataFrame()
    cols = {c: np.concatenate([trace.cols[k][c] for k in kinds])
            for c in ("name", "device", "stream", "corr", "bytes", "ts", "dur")}
    is_memset = np.concatenate([np.full(trace.count(k), k == "memset") for k in kinds])
    parsed = per_distinct(trace.strings, cols["name"], parse_copy_name)
    part = {name: np.array([p[k] for p in parsed], dtype=object)
            for k, name in enumerate(("kind", "src_kind", "dst_kind", "pinned"))}
    corr_index, api_pos, _ = launches(nodes, costed=False)
    link = corr_index.get_indexer(cols["corr"]) if len(corr_index) else np.full(len(cols["corr"]), -1)
    rng = np.full(len(link), None, dtype=object)
    rng[link >= 0] = nodes.nesting.range_path(api_pos[link[link >= 0]])
    start, end, dur = times_ns(cols, base)
    return _table({
        "kind": np.where(is_memset, labels(is_memset, "memset", None), part["kind"]).astype(object),
        "bytes": cols["bytes"],  # missing where the event records none (ROCm's copies): never 0
        "start_ns": start, "end_ns": end, "duration_ns": dur,
        "device": _device_names(cols["device"], amd=amd),
        "stream": cols["stream"],
        "correlation": cols["corr"],
        "src_kind": part["src_kind"], "dst_kind": part["dst_kind"], "pinned": part["pinned"],
        "range": rng,
    })


def parse_copy_name(name: str) -> tuple[str, str | None, str | None, bool | None]:
    """``Memcpy HtoD (Pageable -> Device)`` -> (HtoD, Pageable, Device, pinned=False); ``Memcpy HtoD (Host -> Device)``
    (ROCm) -> pinned None: not recorded."""
    kind, src, dst = "other", None, None
    text = name.strip()
    if text.lower().startswith("memset"):
        inner = text[text.find("(") + 1: text.rfind(")")] if "(" in text else None
        return "memset", None, inner, None
    parts = text.split()
    if len(parts) >= 2 and text.lower().startswith("memcpy"):
        kind = parts[1]
    if "(" in text and "->" in text:
        inner = text[text.find("(") + 1: text.rfind(")")]
        src, dst = (s.strip() for s in inner.split("->", 1))
    host = src if kind.startswith("HtoD") else dst if kind.startswith("DtoH") else None
    # CUPTI names the host memory Pinned or Pageable; ROCm's traces say only "Host": its pinning is not recorded
    pinned = {"pinned": True, "pageable": False}.get(host.lower()) if host is not None else None
    return kind, src, dst, pinned


def _api(nodes: CpuNodes) -> pd.DataFrame:
    idx = nodes.of(API)
    return _table(sort=False, cols={
        "name": Shared.of(nodes.strings, nodes["name"][idx]),
        "start_ns": nodes["start_ns"][idx],
        "end_ns": nodes["end_ns"][idx],
        "duration_ns": nodes.durations(idx),
        "thread": nodes["tid"][idx],
        "correlation": nodes["corr"][idx],
        "kind": Shared.labels(nodes["driver"][idx], "driver", "runtime"),
    })


# ---------------------------------------------------------------------------- device
def _tool_version(meta: Mapping[str, Any]) -> str | None:
    parts = []
    for key in ("cupti_version", "cuda_runtime_version", "roctracer_version", "hip_runtime_version"):
        if key in meta:
            parts.append(f"{key}={meta[key]}")
    return ", ".join(parts) or None


def device_from_meta(meta: Mapping[str, Any], *, has_gpu: bool) -> DeviceSpec | None:
    """The trace's first GPU (with datasheet roofs when its name is known), or the CPU host.

    The trace's own ``deviceProperties`` name wins whenever it is there: a process that ran no
    GPU work (a serving frontend, a tokenizer) but saw a GPU is that GPU, without roofs (nothing
    ran on it here) and with ``gpu_work`` False; only a trace that names no device is the CPU host.
    ROCm traces are kind ``rocm`` (:func:`amd_trace`)."""
    props = meta.get("deviceProperties") or []
    first = props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else None
    kind = "rocm" if amd_trace(meta) else "cuda"
    name = _text(first.get("name", "")).strip() if first is not None else ""
    if not has_gpu:
        if first is None or not name:
            return DeviceSpec(name="CPU (host of the trace)", kind="cpu")
        properties = {k: first.get(k) for k in ("numSms", "totalGlobalMem", "computeMajor", "computeMinor")
                      if k in first}
        return DeviceSpec(name=name, kind=kind, properties={**properties, "gpus_in_trace": len(props),
                                                            "gpu_work": False})
    if first is None:
        return DeviceSpec(name="GPU (not recorded in the trace)", kind=kind)
    properties = {k: first.get(k) for k in ("numSms", "totalGlobalMem", "computeMajor", "computeMinor") if k in first}
    properties["gpus_in_trace"] = len(props)
    return gpu_spec(_text(first.get("name", "GPU")), kind=kind, properties=properties)


FRONTENDS: tuple[tuple[str, str, str], ...] = (
    ("vLLM", r"AsyncLLM|async_llm\.py|vllm/entrypoints|vllm\.entrypoints|AsyncMPClient|core_client\.py",
     "the engine core's trace, `rank0.*.pt.trace.json.gz` (one per rank) in the same profiler folder"),
    ("SGLang", r"TokenizerManager|tokenizer_manager\.py|sglang/srt/entrypoints",
     "the scheduler's trace (`*-TP-0*.trace.json.gz`, one per TP rank) in the same profiler folder"),
)
"""Serving frontends whose process runs no GPU work: (engine, what its trace holds, where its GPU work is)."""


def gpu_calls(trace: ParsedTrace) -> bool:
    """Whether the process asked the GPU for work: copies, or launch / copy / set calls in its runtime
    events (a CUPTI-profiler trace records the launches but no kernel events)."""
    if any(trace.count(k) for k in ("kernel", "memcpy", "memset")):
        return True
    if not trace.cpu or not trace.count("api"):
        return False
    api = trace.cpu["kind"] == CPU_KINDS.index("api")
    names = texts(trace.strings, np.unique(trace.cpu["name"][api]))
    return any(re.search(r"Launch|Memcpy|Memset", str(n)) for n in names)


def frontend_markers(trace: ParsedTrace) -> tuple[str, str, tuple[str, ...]] | tuple[()]:
    """``(engine, where the GPU work is, markers seen)`` when the trace's Python or op names show a
    serving frontend's process (vLLM's ``AsyncLLM`` API server, SGLang's ``TokenizerManager``), else ()."""
    strings = [str(x) for x in trace.strings if isinstance(x, str)]
    for engine, pattern, where in FRONTENDS:
        seen = sorted({m.group(0) for text in strings for m in [re.search(pattern, text)] if m})
        if seen:
            return engine, where, tuple(seen[:4])
    return ()


def no_gpu_work_warning(path: str | Path, meta: Mapping[str, Any], spec: DeviceSpec,
                        frontend: tuple[str, str, tuple[str, ...]] | tuple[()]) -> str:
    """What a trace with a GPU but no GPU work is, and where its run's GPU work likely is."""
    here = Path(path).resolve().parent
    beside = sorted(p.name for p in here.glob("*rank*.trace.json*") if p.resolve() != Path(path).resolve())
    found = f" (beside it: {', '.join(beside[:4])}{', ...' if len(beside) > 4 else ''})" if beside else ""
    if frontend:
        engine, where, seen = frontend
        return (f"no GPU work in this trace: it is the {engine} frontend's (API server) process, which saw "
                f"{spec.name} but launched no kernels ({', '.join(seen)} in its events); the GPU work of this run "
                f"is in {where}{found}: import that file")
    return (f"no GPU work in this trace: the process saw {spec.name} but launched no kernels, so rows are CPU "
            f"operators and there are no roofs; if it served or fed a model (a frontend, tokenizer or data "
            f"loader), the GPU work is in another process's trace{found}")


def device_properties_warning(meta: Mapping[str, Any]) -> list[str]:
    """One warning naming the ``deviceProperties`` values that are not numbers (``numSms: "lots"``,
    ``totalGlobalMem: [1]``, NaN): :func:`device_properties` leaves them out of the device."""
    props = meta.get("deviceProperties")
    if not isinstance(props, list):
        return []
    bad = [(i, k, v) for i, p in enumerate(props) if isinstance(p, dict) for k, v in unusable_properties(p).items()]
    if not bad:
        return []
    shown = ", ".join(f"GPU {i} {k}={_short(v)}" for i, k, v in bad[:6]) + (", ..." if len(bad) > 6 else "")
    return [f"deviceProperties values that are not numbers were ignored: {shown}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


NO_FORMULA = "no cost formula (FLOPs/bytes left missing) for: "
NO_SHAPES = ("no shapes recorded (FLOPs/bytes left missing; profile with "
             "torch.profiler.profile(record_shapes=True) to record them) for: ")
NO_STEP = ("no step annotation with the sequence lengths around the call (FLOPs/bytes left missing; "
           "vLLM writes it in its execute_..._context_..._generation_... range) for: ")
NO_FIT = "no cost formula fits the recorded inputs (FLOPs/bytes left missing) for: "
MISSING_COST = (NO_FORMULA, NO_SHAPES, NO_STEP, NO_FIT)
"""The openings of the uncosted-op warnings (``str.startswith`` takes the tuple)."""


def missing_formulas_warning(kernels: pd.DataFrame) -> list[str]:
    """The warnings naming the uncosted ops, each with why: no formula, no shapes recorded
    (``record_shapes`` off), no step annotation (attention of a framework), or shapes that do
    not fit. Collectives costed in bytes only (FLOPs undefined) are not listed."""
    from ...costs.operators import has_formula, needs_step

    groups = _uncosted(kernels)
    if groups is None:
        return []
    reasons: dict[str, list[str]] = {NO_FORMULA: [], NO_SHAPES: [], NO_STEP: [], NO_FIT: []}
    for (name, shaped), text in groups:
        key = NO_FORMULA if not has_formula(name) else NO_SHAPES if not shaped else \
            NO_STEP if needs_step(name) else NO_FIT
        reasons[key].append(text)
    return [head + ", ".join(items[:12]) for head, items in reasons.items() if items]


def _has_shapes(text: Any) -> bool:
    return isinstance(text, str) and any(ch.isdigit() for ch in text)


def _uncosted(kernels: pd.DataFrame) -> list[tuple[tuple[str, bool], str]] | None:
    """((op, shapes recorded), ``name (N rows, x% of time)``) of the ops whose rows have
    neither FLOPs nor bytes, most time first."""
    if "op" not in kernels or not len(kernels):
        return None
    names = kernels["op"].where(kernels["op"].notna(), None)
    if kernels["device"].eq("cpu").all():
        names = kernels["name"]
    nbytes = kernels["dram_bytes"] if "dram_bytes" in kernels else kernels["flops"]
    mask = kernels["flops"].isna() & pd.to_numeric(nbytes, errors="coerce").isna() & names.notna()
    if not mask.any():
        return None
    total = float(kernels["duration_ns"].sum()) or 1.0
    shapes = kernels["op_shapes"] if "op_shapes" in kernels else pd.Series(None, index=kernels.index)
    from ...costs.operators import has_formula

    # an op without a formula is one group, shapes or not (the shapes only tell the other reasons apart)
    # each distinct text tested once (a trace's uncosted rows repeat a few names and shapes)
    shaped = (map_distinct(shapes[mask], _has_shapes).astype(bool)
              | ~map_distinct(names[mask], lambda n: n is not None and has_formula(str(n))).astype(bool))
    grouped = kernels[mask].groupby([names[mask], shaped])["duration_ns"].agg(["count", "sum"])
    grouped = grouped.sort_values("sum", ascending=False)
    return [((str(n), bool(s)), f"{n} ({int(r['count'])} rows, {100 * r['sum'] / total:.1f}% of time)")
            for (n, s), r in grouped.iterrows()]


__all__ = ["PHASES", "parse_copy_name", "read", "read_kineto"]
