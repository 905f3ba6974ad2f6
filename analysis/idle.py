"""Why the device waits: every idle interval of the inference window, with a cause read from the host side.

A pure analysis step (:func:`idle_slices`, stored by the import pipeline as the ``idle`` table).
Idle time is the time inside the window when the device runs no kernel and no copy (the busy
timeline of :func:`.intervals.activity`, streams merged). The window is the inference window
when the report has a framework's steps (:func:`.steps.inference_windows`), else the device's
first to last piece of work (the leading and trailing gaps of ``nsys analyze``'s gpu_gaps rule
are not idle time). On a CPU report the rows are operators: idle is the time when no operator runs
on any thread, and the host-to-device synchronisation operators (``aten::item``,
``aten::_local_scalar_dense``) count as idle time of cause ``sync``, not as work: on a GPU they
are the host waiting for the device.

A *gap* is one idle interval, from the end of a piece of device work to the start of the next;
it is cut into *slices*, each with one cause, from what the host was doing at that moment (the
first that applies, in this order; docs/idle.md):

- ``unrecorded``: the trace lacks dispatches over the gap. AMD traces number every kernel dispatch of a
  process (rocprofv3 ``Dispatch_Id``, rocpd ``dispatch_id``, rocprof v1/v2 ``Index``; the kernel table's
  ``dispatch_id``), across agents and queues: when ids that no kernel of the whole trace holds lie between the
  last id dispatched before the gap and the first started after it, the device was likely running kernels the
  trace does not hold (a kernel filter, sampling, lost records). Such a gap is not evidence of idleness nor of
  host work, whatever the host did meanwhile (:func:`unrecorded_gaps`);
- ``graph``: the gap lies between two kernels of one CUDA / HIP graph replay: the device runs the
  graph's nodes back to back by itself, and no host call queued the next one;
- ``unknown``: the trace has no host side for that moment (a GPU-only trace, or before the first
  / after the last recorded host event);
- ``profiler``: inside the profiler's own calls (CUPTI / roctracer / cudaProfilerStart, buffer
  flushes) or a range the profiler itself records;
- ``sync``: inside a blocking synchronisation (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, their ``hip``/``cu`` forms; ``aten::item`` on a CPU report);
- ``copy``: inside a host<->device copy call (``cudaMemcpy*``, ``hipMemcpy*``, ``cuMemcpy*``) whose
  copy is HtoD, DtoH or HtoH (pageable copies stage through the host first; the copy's bytes,
  rate and pinned/pageable come with it);
- ``launch``: inside a launch call (``cudaLaunchKernel``, ``cuLaunchKernel``, ``hipLaunchKernel``,
  ``cudaGraphLaunch``... any runtime or driver call named ``*Launch*``; a memset or device-to-device
  copy call too: they only queue device work);
- ``host``: the host is in its own code, none of those calls. What it did there is its
  ``host_kind``, read from the ``host`` table (the outermost CPU operators, the user's Python
  functions, OS-runtime waits) on the thread that launched the most work:

  - ``waiting``: in an OS-runtime call (nsys OSRT: futex, poll, nanosleep, read, ioctl...) or a
    Python call that blocks (``time.sleep``, a lock, ``select``, a read);
  - ``cpu compute``: in a CPU operator that computed on host tensors (it queued no device work and
    is more than a view: ``aten::bmm`` on CPU tensors, a host-to-host ``aten::copy_``), or in a
    call into a host math library (numpy, scipy; recorded with_stack);
  - the queue model, before the two below: a gap that opened while the host was blocked in a sync
    (or a copy to the host) belongs to that sync. The host could not queue work ahead, so the
    device drained and stays idle until the host's next launch: the rest of the gap is ``sync``,
    its ``api`` the sync call and its ``op`` the operator behind it (``aten::item``, ``aten::to``);
  - ``dispatch``: in a gap under 50 µs (:data:`DISPATCH_GAP_NS`; 200 µs when the trace records no
    operators, :data:`DISPATCH_GAP_UNSEEN_NS`), or in a stretch of host time under that inside one
    operator or between two (the framework's per-operator work: Python, dispatch, allocation); in an
    operator that queues device work, a stretch under 1 ms (:data:`DISPATCH_OP_NS`: its host side,
    what a graph replay skips);
  - ``host code``: the rest: the user's own code (or one long operator's), named by its range,
    Python function and operator;
  - ``untraced``: what would be ``host code``, in a gap whose next kernel's launch call is not in the trace
    although the trace records the host's calls (its correlation id has no API row: API records thinned,
    filtered or lost; read where the kernels carry dispatch ids, the AMD traces whose API trace is every HIP
    call): the host may have been in calls the trace lacks, so what it did there is unknown, not its own code.

Every slice also carries the innermost range around it, whatever its cause, so a ``sync`` inside
``sampler`` says so, and the Python function and CPU operator the host was in.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.memo import memo, memo_peek, memo_seed, release_free_memory
from perfscope.schema import (
    CODES_KEY,
    column_codes,
    conform,
    decode,
    held_once,
    map_codes,
    map_distinct,
    recode,
    repeated,
    rows_where,
    seed_codes,
    subset,
)

from .intervals import ACTIVITY_KEY, inside, merge_intervals
from .steps import GPU_RANGE_SOURCES, has_framework_steps, inference_windows
from .summaries.kernels import is_cpu_report
from .tree import innermost_at, nesting_levels

if TYPE_CHECKING:
    from collections.abc import Callable

    from perfscope.report import Report

CAUSES = ("launch", "host", "sync", "copy", "graph", "profiler", "unrecorded", "unknown")
"""Every cause an idle slice can have (``idle.cause``)."""

HOST_KINDS = ("dispatch", "cpu compute", "waiting", "host code", "untraced")
"""What the host did in a ``host`` slice (``idle.host_kind``), each with its own fix (docs/idle.md)."""

KINDS = ("launch", "dispatch", "cpu compute", "waiting", "host code", "untraced", "sync", "copy", "graph", "profiler",
         "unrecorded", "unknown")
"""The causes with ``host`` split into its kinds: what the findings weigh and advise on."""

GRAPH_KINDS = ("launch", "dispatch")
"""The kinds CUDA graphs and fusion remove: advice to capture graphs is given only when one of them holds
the largest share of the gaps (the host's per-launch and per-operator work; not its math, waits or syncs)."""

PRIORITY = ("profiler", "sync", "copy", "launch")
"""The host-call causes, first wins where calls overlap (a sync inside a profiler flush is the profiler's)."""

DISPATCH_GAP_NS = 50_000
"""A gap under 50 µs with no operator, wait or sync recorded in it is the framework's per-operator work
between launches (Python, dispatch, allocation): the size of one eager operator's host cost."""

DISPATCH_OP_NS = 1_000_000
"""Host time inside one operator that queues device work, between its calls, is its dispatch (what a graph
replay skips) up to 1 ms in one stretch; a longer stretch is that operator's own host code (cuDNN autotuning
in a first conv2d, a first call's setup, a long allocation), which a graph would not remove."""
DISPATCH_GAP_UNSEEN_NS = 200_000
"""The same when the trace does not record the host's operators (nsys, a report saved before the host table):
99% of the dispatch time of the eager H200 engine and H100 Qwen traces, whose operators are recorded, lies in
gaps under 200 µs (time-weighted 99th percentile 187 µs and 138 µs)."""

PROFILER_API = re.compile(r"cupti|profiler|roctracer|rocprof|activity ?buffer", re.IGNORECASE)
PROFILER_RANGE = re.compile(r"^\s*\[?(cupti|kineto|profiler overhead|activity buffer)", re.IGNORECASE)
SYNC_API = re.compile(r"synchroni[sz]e", re.IGNORECASE)
SYNC_OPS = re.compile(r"^aten::(item|_local_scalar_dense)$")
COPY_API = re.compile(r"memcpy", re.IGNORECASE)
LAUNCH_API = re.compile(r"launch", re.IGNORECASE)
MEMSET_API = re.compile(r"memset", re.IGNORECASE)
GRAPH_API = re.compile(r"graphlaunch", re.IGNORECASE)
HOST_DEVICE_COPIES = ("HtoD", "DtoH", "HtoH")

IDLE_TABLE = "idle"


# ---------------------------------------------------------------------------- interval sets

def _merged(df: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = df[mask]
    keep = (rows["end_ns"].to_numpy(np.int64) > rows["start_ns"].to_numpy(np.int64))
    return merge_intervals(rows["start_ns"].to_numpy(np.int64)[keep], rows["end_ns"].to_numpy(np.int64)[keep])


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """The distinct values of an int64 array, sorted: a sort and a neighbour compare (numpy 2's hashing
    ``np.unique`` took 4 s on the 5M cut points of a 1.25M-kernel trace). ``x`` is sorted in place (the
    caller's own array: no second copy at the classification's peak)."""
    if not len(x):
        return x
    x.sort(kind="stable")  # in place; runs of already sorted pieces: the merge sort joins them in linear time
    keep = np.ones(len(x), bool)
    keep[1:] = x[1:] != x[:-1]
    return x[keep]


def idle_intervals(busy: tuple[np.ndarray, np.ndarray],
                   window: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The parts of ``window`` (merged intervals) that ``busy`` (merged intervals) does not cover:
    the holes between the busy intervals, each cut to the windows it overlaps (searchsorted, no sort)."""
    ws, we = (np.asarray(a, np.int64) for a in window)
    bs, be = (np.asarray(a, np.int64) for a in busy)
    if not len(ws):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo = np.concatenate([[min(int(ws[0]), int(bs[0]) if len(bs) else int(ws[0]))], be])
    hi = np.concatenate([bs, [max(int(we[-1]), int(be[-1]) if len(be) else int(we[-1]))]])
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    first = np.searchsorted(we, lo, side="right")  # the first window ending after the hole starts
    last = np.searchsorted(ws, hi, side="left")  # past the last window starting before it ends
    n = np.maximum(last - first, 0)
    hole = np.repeat(np.arange(len(lo)), n)
    win = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(first, n)
    s, e = np.maximum(lo[hole], ws[win]), np.minimum(hi[hole], we[win])
    ok = e > s
    return s[ok], e[ok]


# ---------------------------------------------------------------------------- dispatch ids
DISPATCH_ID_MAX = 1 << 53
"""The largest dispatch id read as one (float64 holds whole numbers exactly up to 2^53); a negative, fractional or
larger id is damage, read as missing."""


def dispatch_ids(kernels: pd.DataFrame) -> np.ndarray:
    """Per kernel row: its dispatch sequence number (the kernel table's ``dispatch_id``) as float64, NaN where it
    has none or a damaged one (text, negative, fractional, past :data:`DISPATCH_ID_MAX`)."""
    if "dispatch_id" not in kernels or not len(kernels):
        return np.full(len(kernels), np.nan)
    v = pd.to_numeric(kernels["dispatch_id"], errors="coerce").to_numpy(np.float64, na_value=np.nan, copy=True)
    with np.errstate(invalid="ignore"):
        v[~((v >= 0) & (v <= DISPATCH_ID_MAX) & (v == np.floor(v)))] = np.nan
    return v


def _process_groups(kernels: pd.DataFrame) -> np.ndarray:
    """Per kernel row: a number for its process (dispatch ids count per process); one group when the table names
    no process."""
    if "pid" not in kernels or not len(kernels):
        return np.zeros(len(kernels), np.int64)
    pid = pd.to_numeric(kernels["pid"], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    return pd.factorize(pid, use_na_sentinel=False)[0].astype(np.int64)


def held_ids(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
    """(per kernel row its dispatch id (:func:`dispatch_ids`), its process group, and per process group the sorted
    distinct ids the trace holds)."""
    ids = dispatch_ids(kernels)
    group = _process_groups(kernels)
    ok = ~np.isnan(ids)
    sets = {int(g): _sorted_unique(ids[ok & (group == g)].astype(np.int64)) for g in np.unique(group[ok]).tolist()}
    return ids, group, sets


def missing_between(held: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per pair: how many ids strictly between ``lo`` and ``hi`` (float; NaN: unknown) the sorted distinct ids
    ``held`` lack (0 where ``hi <= lo + 1`` or either is unknown)."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    with np.errstate(invalid="ignore"):
        some = hi > lo + 1  # NaN compares False
    out = np.zeros(len(lo), np.int64)
    if not some.any():
        return out
    a, b = lo[some].astype(np.int64), hi[some].astype(np.int64)
    inside = np.searchsorted(held, b, side="left") - np.searchsorted(held, a, side="right")
    out[some] = np.maximum(b - a - 1 - inside, 0)
    return out


def unrecorded_gaps(starts: np.ndarray, ids: np.ndarray, held: np.ndarray, ist: np.ndarray,
                    ien: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per gap ``ist``-``ien`` of one device whose kernels start at ``starts`` with dispatch ids ``ids`` (NaN: none):
    the ids the trace lacks (``held``: its sorted distinct ids, the whole process's, every device) between the
    highest id dispatched before the gap (of the kernels started before it) and the lowest started after it; and
    those two ids (NaN where the gap has no kernel with an id on one side). Dispatch ids are global across agents
    and queues: an id no kernel of the trace holds is a dispatch the trace lacks, and one that lies between the
    kernels either side of an idle gap was likely running in it. Sorts and searches: linear in the kernels."""
    n = len(ist)
    nan = np.full(n, np.nan)
    ok = ~np.isnan(ids)
    if not ok.any() or not n:
        return np.zeros(n, np.int64), nan, nan.copy()
    s, d = np.asarray(starts, np.int64)[ok], ids[ok]
    order = np.argsort(s, kind="stable")
    s, d = s[order], d[order]
    before = np.searchsorted(s, ist, side="left") - 1  # the kernels started before the gap: the highest id
    after = np.searchsorted(s, ien, side="left")  # those started at or after its end: the lowest id
    has = (before >= 0) & (after < len(s))
    lo = np.where(has, np.maximum.accumulate(d)[np.maximum(before, 0)], np.nan)
    hi = np.where(has, np.minimum.accumulate(d[::-1])[::-1][np.minimum(after, len(s) - 1)], np.nan)
    return missing_between(held, lo, hi), lo, hi


def unrecorded_summary(kernels: pd.DataFrame) -> dict[str, int] | None:
    """What the whole trace lacks of its dispatch ids: ``missing`` of ``ids`` (first to last, per process,
    summed), ``first`` / ``last`` (the lowest and highest id), ``runs`` (runs of missing ids) and ``largest_run``;
    None when the kernels carry no dispatch id."""
    ids, _, sets = held_ids(kernels)
    if not sets:
        return None
    missing = span = runs = largest = 0
    for held in sets.values():
        span += int(held[-1] - held[0] + 1)
        jump = np.diff(held) - 1
        missing += int(jump.sum())
        runs += int((jump > 0).sum())
        largest = max(largest, int(jump.max()) if len(jump) else 0)
    ok = ids[~np.isnan(ids)]
    return {"missing": missing, "ids": span, "first": int(ok.min()), "last": int(ok.max()), "runs": runs,
            "largest_run": largest}


def unrecorded_warning(kernels: pd.DataFrame) -> str | None:
    """The import's warning when the trace lacks dispatch ids between its first and last kernel (None: it lacks
    none, or numbers none)."""
    from perfscope.format import counted

    got = unrecorded_summary(kernels)
    if got is None or not got["missing"]:
        return None
    runs = got["runs"]
    return (f"the trace lacks {got['missing']:,} of the {got['ids']:,} dispatch ids between its first and last kernel "
            f"(ids {got['first']}..{got['last']}; {counted(runs, 'run')} of missing ids, the largest "
            f"{got['largest_run']:,}): the GPU ran kernels the trace does not hold (a kernel filter such as "
            "--kernel-include-regex, sampling or lost records). Idle gaps over them are cause 'unrecorded', not idle "
            "time nor host work (docs/idle.md); re-profile without the filter to measure them")


# ---------------------------------------------------------------------------- ranges
def _thread_order(df: pd.DataFrame) -> list[tuple[float, np.ndarray]]:
    """(thread, positions) of ``df``'s rows per thread, the thread with the most rows first."""
    thread = df["thread"].astype("float64").fillna(-1.0).to_numpy() if "thread" in df else np.full(len(df), -1.0)
    threads, inverse, counts = np.unique(thread, return_inverse=True, return_counts=True)
    order = np.argsort(inverse.reshape(-1), kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    parts = [(float(t), order[bounds[i]:bounds[i + 1]]) for i, t in enumerate(threads)]
    return [parts[i] for i in np.argsort(-counts, kind="stable")]


def _host_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    if len(ranges) and "source" in ranges:
        return ranges[~ranges["source"].astype("object").isin(GPU_RANGE_SOURCES).to_numpy(bool)]
    return ranges


def innermost_ranges(ranges: pd.DataFrame, x: np.ndarray) -> np.ndarray:
    """The name of the innermost host range around each time ``x`` (None where none is), looked up
    on the thread with the most ranges first, then the others."""
    vocab = _Vocab()
    return vocab.text(_RangeIndex(ranges, vocab).at(np.asarray(x, np.int64)))


# ---------------------------------------------------------------------------- the host's own activity
class _Vocab:
    """The text of the idle table's columns as integer codes while millions of pieces are classified and
    joined (comparing codes, not strings); -1 is None."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self.index: dict[str, int] = {}

    def code(self, word: object) -> int:
        if not isinstance(word, str):
            return -1
        if word not in self.index:
            self.index[word] = len(self.words)
            self.words.append(word)
        return self.index[word]

    def codes(self, words: np.ndarray | pd.Series) -> np.ndarray:
        """Codes of an array of text, each distinct value looked up once."""
        if not len(words):
            return np.zeros(0, np.int64)
        codes, uniq = pd.factorize(pd.Series(words, dtype="object"), use_na_sentinel=True)
        table = np.array([self.code(u) for u in uniq] + [-1], dtype=np.int64)
        return table[codes]

    def text(self, codes: np.ndarray) -> np.ndarray:
        table = np.array([*self.words, None], dtype=object)
        return table[np.where(codes >= 0, codes, len(self.words))]


def _take(values: np.ndarray, rows: np.ndarray, fill: int = -1) -> np.ndarray:
    """``values[rows]`` where ``rows >= 0``, ``fill`` elsewhere."""
    if not len(values):
        return np.full(len(rows), fill, dtype=values.dtype if len(values) else np.int64)
    return np.where(rows >= 0, values[np.maximum(rows, 0)], fill)


class _RangeIndex:
    """The host ranges per thread (the thread with the most ranges first), for the innermost one around points."""

    def __init__(self, ranges: pd.DataFrame, vocab: _Vocab) -> None:
        r = _host_ranges(ranges)
        r = r[(r["end_ns"] > r["start_ns"]).to_numpy(bool)] if len(r) else r
        self.s = r["start_ns"].to_numpy(np.int64) if len(r) else np.zeros(0, np.int64)
        self.e = r["end_ns"].to_numpy(np.int64) if len(r) else np.zeros(0, np.int64)
        self.names = vocab.codes(r["name"].astype("object").to_numpy()) if len(r) else np.zeros(0, np.int64)
        self.threads = _thread_order(r) if len(r) else []
        self.levels: list[list[np.ndarray]] | None = None  # per thread, nested once when first searched

    def at(self, x: np.ndarray) -> np.ndarray:
        """The name code of the innermost range around each point (-1: none)."""
        out = np.full(len(x), -1, self.names.dtype)
        todo = np.arange(len(x))
        if self.levels is None:
            self.levels = [nesting_levels(self.s[rows], self.e[rows]) for _, rows in self.threads]
        for (_, rows), levels in zip(self.threads, self.levels, strict=True):
            if not len(todo):
                break
            hit = innermost_at(self.s[rows], self.e[rows], x[todo], levels)
            found = hit >= 0
            out[todo[found]] = self.names[rows[hit[found]]]
            todo = todo[~found]
        return out


class _Track:
    """One kind of host activity on the launching thread (ops, Python functions or waits), for lookups
    of the innermost one around points."""

    def __init__(self, rows: pd.DataFrame) -> None:
        rows = rows[(rows["end_ns"] > rows["start_ns"]).to_numpy(bool)].reset_index(drop=True)
        # the bounds copied out of the rows' blocks, and only the text kept until :meth:`encode`: the rows
        # themselves (every column of the host table's operators) are not held through the classification
        self.s = rows["start_ns"].to_numpy(np.int64, copy=True)
        self.e = rows["end_ns"].to_numpy(np.int64, copy=True)
        hc = rows["host_compute"] if "host_compute" in rows else pd.Series(False, index=rows.index)
        self.computes = hc.astype("boolean").fillna(False).to_numpy(bool)
        calls = rows["device_calls"] if "device_calls" in rows else pd.Series(0, index=rows.index)
        self.queues = pd.to_numeric(calls, errors="coerce").fillna(0).to_numpy(np.float64, na_value=np.nan) > 0
        self.text: dict[str, np.ndarray] | None = {
            c: rows[c].astype("object").to_numpy() for c in ("name", "op_shapes") if c in rows}
        self.names = np.zeros(len(self.s), np.int64)
        self.shapes = np.full(len(self.s), -1, np.int64)
        self.levels: list[np.ndarray] | None = None

    def encode(self, vocab: _Vocab) -> _Track:
        """Code the names (and operator shapes) with ``vocab``."""
        text, self.text = self.text or {}, None
        if len(self.s):
            self.names = vocab.codes(text["name"])
            if "op_shapes" in text:
                self.shapes = vocab.codes(text["op_shapes"])
        return self

    def __len__(self) -> int:
        return len(self.s)

    def bounds(self) -> list[np.ndarray]:
        return [self.s, self.e]

    def at(self, x: np.ndarray) -> np.ndarray:
        """Row of the innermost one around each point (-1 where none); the track is nested once, on the first
        search (each chunk of the classification searches it)."""
        if not len(self) or not len(x):
            return np.full(len(x), -1, np.int64)
        if self.levels is None:
            self.levels = nesting_levels(self.s, self.e)
        return innermost_at(self.s, self.e, x, self.levels)


def api_names_map(report: Report, fn: Callable[[object], object]) -> np.ndarray:
    """``fn`` of each row's ``api`` ``name`` (an object array), called once per distinct name: on the
    api table's memoized codes (:func:`perfscope.schema.column_codes`: its reader seeds them; else the
    column is hashed once for all the classification's questions)."""
    return map_codes(*column_codes(report.api, "name"), fn)


def launching_thread(report: Report) -> float | None:
    """The thread that made the most launch, copy and sync calls (a CPU report: the most operators):
    the one that keeps the device's queue full, whose activity explains its gaps. None when unknown."""
    def pick(df: pd.DataFrame) -> float | None:
        if not len(df) or "thread" not in df:
            return None
        t = df["thread"].dropna()
        return float(t.value_counts().idxmax()) if len(t) else None

    if is_cpu_report(report):
        return pick(report.kernels)
    api = report.api
    if not len(api):
        return None
    calls = api_names_map(report, lambda n: bool(re.search(r"launch|memcpy|memset|synchroni", str(n), re.IGNORECASE)))
    return pick(api[calls.astype(bool)])


def _host_tracks(report: Report) -> dict[str, _Track]:
    """The ``host`` table's ops, Python functions and waits on the launching thread (rows without a
    thread count as its)."""
    h = report.host
    empty = pd.DataFrame({"start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64")})
    if not len(h):
        return {k: _Track(empty) for k in ("op", "python", "wait", "math")}
    thread = launching_thread(report)
    if thread is not None and "thread" in h:
        t = h["thread"].astype("float64").to_numpy()
        h = h[(t == thread) | np.isnan(t)]
    kind = h["kind"].astype("object").to_numpy()
    return {k: _Track(h[kind == k]) for k in ("op", "python", "wait", "math")}


def function_label(name: object) -> str | None:
    """A Python frame ``nanovllm/layers/attention.py(370): attention_cpu`` as ``attention_cpu
    (nanovllm/layers/attention.py:370)``; other text unchanged."""
    if not isinstance(name, str):
        return None
    m = re.match(r"^(?P<path>.+?)\((?P<line>\d+)\): (?P<func>.+)$", name)
    return f"{m.group('func')} ({m.group('path')}:{m.group('line')})" if m else name


# ---------------------------------------------------------------------------- the table
def idle_slices(report: Report) -> pd.DataFrame:
    """Every idle slice of every device's window with its cause (the ``idle`` table, conformed).

    Columns: device, start_ns, end_ns, duration_ns, cause (:data:`CAUSES`), host_kind
    (:data:`HOST_KINDS`), range (the innermost host range around it), api (the host call it fell
    in, or the sync whose return opened its gap), op / op_shapes (the CPU operator), function (the
    user's Python function), wait (the OS-runtime or blocking call), gap (its idle interval),
    correlation and bytes / pinned (copies: the copy the call made), window_ns (the device's window)
    and window_pct (the slice's share of it)."""
    return conform(idle_rows(report), IDLE_TABLE, source="<idle>")


def idle_of(report: Report) -> pd.DataFrame:
    """The report's ``idle`` table: the stored one, else computed (reports written before it existed or
    before its gaps were numbered, or built without the import pipeline), once per Report object."""
    idle = report.idle
    if len(idle) and idle["gap"].notna().all():
        return idle
    return memo(report, "idle:slices", lambda: idle_slices(report))


def _host_calls(report: Report) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The host's API calls (name, start_ns, end_ns, correlation, thread) and, per cause of
    :data:`PRIORITY`, which of them stand for it (none: a call that is none of them, such as
    cudaEventRecord). The cause is found once per distinct name and held as a small code per call,
    so each cause's rows are one integer compare (not an object compare of every call per cause)."""
    cols = [c for c in ("name", "start_ns", "end_ns", "correlation", "thread") if c in report.api]
    api = report.api[cols]
    if not len(api):
        return api, {c: np.zeros(0, bool) for c in PRIORITY}
    copy_kind = _copy_kinds(report)
    corr = api["correlation"].to_numpy(np.float64, na_value=np.nan)
    # a profiler that collected hardware counters replayed each kernel inside its launch call: that time is its
    replayed = bool((report.params or {}).get("counter_replays"))

    def cause_of(name: object) -> str | None:
        text = "" if name is None else str(name)
        if PROFILER_API.search(text):
            return "profiler"
        if SYNC_API.search(text):
            return "sync"
        if COPY_API.search(text):
            return "copy"
        if LAUNCH_API.search(text):
            return "profiler" if replayed else "launch"
        if MEMSET_API.search(text):
            return "launch"
        return None

    code_of: dict[str | None, int] = {c: i for i, c in enumerate(PRIORITY)}
    code_of[None] = -1
    codes, distinct = column_codes(report.api, "name")  # -1: a missing name, read as cause_of(None)
    per_name = np.array([code_of[cause_of(u)] for u in distinct] + [code_of[cause_of(None)]], dtype=np.int8)
    cause = per_name[codes]
    is_copy = cause == code_of["copy"]
    if is_copy.any() and len(copy_kind):
        kind = pd.Series(corr[is_copy]).map(copy_kind).to_numpy(object)
        device_side = np.array([k is not None and not (isinstance(k, float)) and k not in HOST_DEVICE_COPIES
                                for k in kind])
        idx = np.flatnonzero(is_copy)[device_side]
        cause[idx] = code_of["launch"]  # a device-to-device copy call only queues work, like a launch
    return api, {c: cause == i for c, i in code_of.items() if c is not None}


def _copy_kinds(report: Report) -> dict[float, str]:
    t = report.transfers
    if not len(t) or "correlation" not in t:
        return {}
    t = t[t["correlation"].notna()]
    return dict(zip(t["correlation"].astype("float64").tolist(), t["kind"].astype("object").tolist()))


def _windows(report: Report) -> tuple[np.ndarray, np.ndarray] | None:
    if has_framework_steps(report.steps):
        return inference_windows(report.steps, report.kernels, report.transfers)
    return None


def _graph_keys(report: Report, acts: pd.DataFrame, api: pd.DataFrame) -> np.ndarray:
    """Per activity row: the correlation of the graph replay it belongs to (NaN: launched one by one).

    A row belongs to a replay when its launch call is ``*GraphLaunch*`` (the replay's kernels and copies
    share that call's correlation id) or, for kernels, when the reader joined it to a graph's capture
    (``flops_source`` ``graph-*``: a ROCm trace records the replay's kernels under their graph launch)."""
    corr = acts["correlation"].to_numpy(np.float64, na_value=np.nan)
    replay = np.zeros(len(acts), bool)
    if len(api):
        graph_call = api_names_map(report, lambda n: bool(GRAPH_API.search(str(n)))).astype(bool)
        ids = np.sort(api.loc[graph_call, "correlation"].to_numpy(np.float64, na_value=np.nan))
        ids = ids[~np.isnan(ids)]
        if len(ids):
            at = np.clip(np.searchsorted(ids, corr), 0, len(ids) - 1)
            replay |= ids[at] == corr
    k = report.kernels
    if "flops_source" in k and len(k):
        flagged = map_distinct(k["flops_source"], lambda s: isinstance(s, str) and s.startswith("graph-")).to_numpy(bool)
        replay[:len(k)] |= flagged  # kernel rows come first in the device work, in the kernel table's order
    return np.where(replay, corr, np.nan)


def idle_rows(report: Report) -> pd.DataFrame:
    """The rows of :func:`idle_slices`, not yet conformed (``Report.replace(idle=...)`` conforms them)."""
    slices, words = _classified(report)
    rows = len(report.kernels) + len(report.transfers)
    release_free_memory(rows)  # what the classification read and its chunks' working arrays
    if not slices:
        return pd.DataFrame()
    out = _table(slices, words, rows)
    out["first_launch"] = _first_launch(report.kernels, out)
    return out


def first_launches(kernels: pd.DataFrame, positions: np.ndarray) -> np.ndarray:
    """For the kernels at ``positions`` (rows of ``kernels``), whether each is the first of its name on its device
    in the trace (by start): the launch that loads the kernel's code module where modules load lazily."""
    if not len(positions):
        return np.zeros(0, dtype=bool)
    cols = [c for c in ("device", "name") if c in kernels]
    order = np.argsort(kernels["start_ns"].to_numpy(np.int64), kind="stable")
    first = np.zeros(len(kernels), dtype=bool)
    first[order] = ~kernels.iloc[order][cols].astype("object").duplicated().to_numpy()
    return first[np.asarray(positions, dtype=np.int64)]


def _first_launch(kernels: pd.DataFrame, idle: pd.DataFrame) -> pd.arrays.BooleanArray:
    """The ``first_launch`` column of the idle table ``idle``: per launch slice whose call's correlation id names
    exactly one kernel, whether that kernel is its name's first on its device (:func:`first_launches`); missing
    elsewhere."""
    n = len(idle)
    known, value = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    corr = idle["correlation"].to_numpy(np.float64, na_value=np.nan)
    at = np.flatnonzero((idle["cause"] == "launch").to_numpy(bool) & ~np.isnan(corr))
    if len(at) and len(kernels) and "correlation" in kernels:
        kc = kernels["correlation"].to_numpy(np.float64, na_value=np.nan)
        one = ~np.isnan(kc) & ~pd.Series(kc).duplicated(keep=False).to_numpy()  # a graph replay's kernels share one
        hit = pd.Index(kc[one]).get_indexer(corr[at])
        found = hit >= 0
        known[at[found]] = True
        value[at[found]] = first_launches(kernels, np.flatnonzero(one)[hit[found]])
    return pd.arrays.BooleanArray(value, ~known)


def _device_work(report: Report) -> pd.DataFrame:
    """The rows of :func:`.intervals.activity` (kernels first, in the kernel table's order, then the copies
    with a device) with only the columns the classification reads: device, start_ns, end_ns, correlation, and
    name on a CPU report; the memoized activity itself when a caller made it. Not memoized: the full table
    copies every kernel's name, stream and kind as well (~120 bytes a kernel against 32 here, held at the
    classification's peak: 0.4 GB at 5M kernels)."""
    held = memo_peek(report, ACTIVITY_KEY)
    if held is not None:
        return held  # type: ignore[no-any-return]
    k, t = report.kernels, report.transfers
    if len(t):
        recorded = column_codes(k, "device")[1]
        dev = t["device"].astype("object")
        if len(recorded) == 1:
            dev = dev.where(dev.notna(), recorded[0])
        keep = dev.notna().to_numpy(bool)
        t = t[keep].assign(device=dev[keep], name=t.loc[keep, "kind"])
    parts = [f for f in (k, t) if len(f)]
    if not parts:
        return pd.DataFrame(columns=["device", "start_ns", "end_ns", "correlation", "name"])

    def joined(col: str, dtype: Any, **how: Any) -> np.ndarray:
        return np.concatenate([f[col].to_numpy(dtype, **how) for f in parts])

    cols: dict[str, Any] = {
        "device": pd.Series(joined("device", object), dtype=object, copy=False),
        "start_ns": joined("start_ns", np.int64), "end_ns": joined("end_ns", np.int64),
        "correlation": joined("correlation", np.float64, na_value=np.nan),
    }
    if is_cpu_report(report):
        cols["name"] = pd.Series(joined("name", object), dtype=object, copy=False)
    return pd.DataFrame(cols, copy=False)


def _classified(report: Report) -> tuple[list[_Slices], list[str]]:
    """Every device's idle slices, classified (text as codes of the returned vocabulary).

    Each device's gaps, and what each gap needs of the device work (its graph replay), are found first; the
    device work (32 bytes a kernel, and the graph keys) is then let go, so it is not held while the gaps'
    slices accumulate (the classification's peak)."""
    acts = _device_work(report)
    if not len(acts):
        return [], []
    ctx = _Context(report, acts)
    n_acts = len(acts)
    starts, ends = acts["start_ns"].to_numpy(np.int64), acts["end_ns"].to_numpy(np.int64)
    devices = acts["device"].astype("object").to_numpy()
    work = []
    for device in sorted({d for d in devices.tolist() if d is not None}, key=str):
        on = (devices == device) & ~ctx.sync_op
        if not on.any():
            continue
        busy = merge_intervals(starts[on], ends[on])
        window = ctx.windows if ctx.windows is not None else (busy[0][:1].copy(), busy[1][-1:].copy())
        if not len(window[0]):
            continue
        idle = idle_intervals(busy, window)
        del busy
        if len(idle[0]):
            work.append((str(device), idle, window, ctx.per_gap(idle, np.flatnonzero(on))))
    del acts, starts, ends, devices
    ctx.release_device_work()
    release_free_memory(n_acts)
    slices: list[_Slices] = []
    while work:
        got = ctx.classify(*work.pop(0))
        if len(got):
            slices.append(got)
        release_free_memory(n_acts)  # the chunks' working arrays
    return slices, ctx.vocab.words


def _sorted_calls(api: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(starts sorted, ends, names, correlation ids: NaN where none) of the calls ``mask`` selects."""
    rows = api[mask].sort_values("start_ns", kind="stable")
    corr = (rows["correlation"].to_numpy(np.float64, na_value=np.nan) if "correlation" in rows
            else np.full(len(rows), np.nan))
    return (rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64),
            rows["name"].astype("object").to_numpy(), corr)


def _with_copy_way(openers: tuple[np.ndarray, ...], copies: pd.DataFrame, ops: _Track | None) -> np.ndarray:
    """The names of the calls that open gaps (:func:`_sorted_calls`), a sync call named with the direction of the
    copy it waited for: the latest copy call before it inside the same operator (``aten::to``'s
    ``cudaMemcpyAsync`` then ``cudaStreamSynchronize``: ``cudaStreamSynchronize (HtoD)``), where the copy's
    transfer says its direction."""
    names = openers[2].copy()
    if not len(names) or not len(copies) or ops is None or not len(ops):
        return names
    cs = copies["start_ns"].to_numpy(np.int64)
    ways = copies["kind"].astype("object").to_numpy()
    i = np.searchsorted(cs, openers[0], side="right") - 1
    j = np.maximum(i, 0)
    op_at_sync, op_at_copy = ops.at(openers[0]), ops.at(cs[j])
    same = (i >= 0) & (op_at_sync >= 0) & (op_at_sync == op_at_copy)
    for k in np.flatnonzero(same):
        name, way = names[k], ways[j[k]]
        if isinstance(way, str) and way in HOST_DEVICE_COPIES and isinstance(name, str) and SYNC_API.search(name):
            names[k] = f"{name} ({way})"
    return names


def _copy_calls(report: Report, api: pd.DataFrame, is_copy: np.ndarray) -> pd.DataFrame:
    """The copy calls (``is_copy``) sorted by start, with their copy's bytes, pinned flag and kind (by correlation)."""
    calls = api[is_copy].sort_values("start_ns", kind="stable")
    t = report.transfers
    if len(calls) and len(t) and "correlation" in t:
        t = t[t["correlation"].notna()].drop_duplicates("correlation")
        info = t.set_index(t["correlation"].astype("float64"))[["bytes", "pinned", "kind"]]
        corr = calls["correlation"].astype("float64")
        calls = calls.assign(bytes=corr.map(info["bytes"]).to_numpy(), pinned=corr.map(info["pinned"]).to_numpy(),
                             kind=corr.map(info["kind"]).to_numpy())
    else:
        calls = calls.assign(bytes=np.nan, pinned=None, kind=None)
    return calls.reset_index(drop=True)


def _call_at(calls: tuple[np.ndarray, ...], x: np.ndarray, *, closed: bool = False) -> np.ndarray:
    """Per point, the row of the latest-started call around it (-1 where none; ``calls``: :func:`_sorted_calls`);
    ``closed``: a point at a call's end counts as inside it."""
    cs, ce = calls[0], calls[1]
    if not len(cs) or not len(x):
        return np.full(len(x), -1, np.int64)
    i = np.searchsorted(cs, x, side="right") - 1
    j = np.maximum(i, 0)
    ok = (i >= 0) & ((ce[j] >= x) if closed else (ce[j] > x))
    return np.where(ok, i, -1)


def _run_lengths(flag: np.ndarray, a: np.ndarray, b: np.ndarray, gap: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per piece where ``flag``: the length of the run of flagged pieces it belongs to (pieces that touch, in
    one gap, with the same ``key``); 0 elsewhere."""
    out = np.zeros(len(flag), np.int64)
    if not flag.any():
        return out
    joined = np.zeros(len(flag), bool)
    joined[1:] = flag[:-1] & (gap[1:] == gap[:-1]) & (a[1:] == b[:-1]) & (key[1:] == key[:-1])
    run = np.cumsum(flag & ~joined) - 1
    lengths = np.bincount(run[flag], weights=(b - a)[flag])
    out[flag] = lengths[run[flag]].astype(np.int64)
    return out


class _Context:
    """What every device's classification reads from the report, computed once."""

    def __init__(self, report: Report, acts: pd.DataFrame) -> None:
        self.report = report
        self.cpu = is_cpu_report(report)
        self.windows = _windows(report)
        api, is_cause = _host_calls(report)
        self.host_sets: dict[str, tuple[np.ndarray, np.ndarray]] = {c: _merged(api, is_cause[c]) for c in PRIORITY}
        self.ranges = _host_ranges(report.ranges)
        if len(self.ranges):
            prof = map_distinct(self.ranges["name"], lambda n: bool(PROFILER_RANGE.search(str(n)))).to_numpy(bool)
            ps, pe = self.host_sets["profiler"]
            rs, re_ = _merged(self.ranges, prof)
            self.host_sets["profiler"] = merge_intervals(np.concatenate([ps, rs]), np.concatenate([pe, re_]))
        self.sync_op = np.zeros(len(acts), bool)
        if self.cpu:
            self.sync_op = map_distinct(acts["name"], lambda n: bool(SYNC_OPS.match(str(n)))).to_numpy(bool)
            self.host_sets["sync"] = _merged(acts, self.sync_op)
        self.vocab = vocab = _Vocab()
        self.code = {w: vocab.code(w) for w in (*CAUSES, *HOST_KINDS, "graph replay")}
        self.tracks = {k: t.encode(vocab) for k, t in _host_tracks(report).items()}
        self.range_index = _RangeIndex(self.ranges, vocab)
        # the span over which the host side is recorded: outside it, idle time's cause is unknown
        spans = [(df["start_ns"].min(), df["end_ns"].max()) for df in (api, self.ranges) if len(df)]
        spans += [(t.s.min(), t.e.max()) for t in self.tracks.values() if len(t)]  # the launching thread's only
        if self.cpu:
            spans.append((acts["start_ns"].min(), acts["end_ns"].max()))
        self.recorded = (np.array([min(int(s) for s, _ in spans)], np.int64),
                         np.array([max(int(e) for _, e in spans)], np.int64)) \
            if spans else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.copies = _copy_calls(report, api, is_cause["copy"])
        # a copy call's slices name its direction where its transfer says it: cudaMemcpyAsync (HtoD)
        kinds = self.copies["kind"].astype("object").to_numpy() if len(self.copies) else np.zeros(0, object)
        self.copy_names = vocab.codes(np.array([f"{n} ({k})" if isinstance(k, str) and k in HOST_DEVICE_COPIES else n
                                                for n, k in zip(self.copies["name"].astype("object"), kinds,
                                                                strict=True)], object))
        self.calls = {c: _sorted_calls(api, is_cause[c]) for c in ("profiler", "sync", "launch")}
        self.call_names = {c: vocab.codes(calls[2]) for c, calls in self.calls.items()}
        # the calls whose return can open a gap the host could not queue into: syncs and copies to the host
        to_host = (self.copies["kind"].astype("object") == "DtoH").to_numpy(bool) if len(self.copies) else np.zeros(0, bool)
        to_host_calls = self.copies.loc[to_host, list(api.columns)]
        to_host_calls = to_host_calls.assign(name=[f"{n} (DtoH)" for n in to_host_calls["name"].astype("object")])
        opener = pd.concat([api[is_cause["sync"]], to_host_calls], ignore_index=True)
        self.openers = _sorted_calls(opener, np.ones(len(opener), bool)) if not self.cpu else \
            (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, object), np.zeros(0, np.float64))
        self.opener_names = vocab.codes(_with_copy_way(self.openers, self.copies, self.tracks.get("op")))
        self.graph = _graph_keys(report, acts, api)
        # each kernel's dispatch id (copies: none) and process, and the ids each process's kernels hold
        # (none, and no per-row array, where the kernels carry no dispatch id: Kineto and nsys traces, whose 5M-kernel
        # imports must not pay 3 arrays of 8 bytes a row here)
        self.held: dict[int, np.ndarray] = {}
        self.ids, self.process, self.untraced = np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool)
        if "dispatch_id" in report.kernels and len(report.kernels):
            ids, group, self.held = held_ids(report.kernels)
            if self.held:
                self.ids = np.full(len(acts), np.nan)
                self.ids[:len(ids)] = ids  # kernel rows come first in the device work, in the kernel table's order
                self.process = np.full(len(acts), -1, np.int64)
                self.process[:len(group)] = group
                self.untraced = self._untraced_launches(report, acts, api, ids)
        self.graph_call = {c: vocab.code(n) for c, n in self._graph_call_names(report, api).items()}
        self.acts: pd.DataFrame | None = acts
        # the slices' text codes while the chunks wait to be joined: the narrowest integers the vocabulary fits;
        # every code array a chunk's pieces take theirs from is in it too, so each chunk's code columns are made
        # in it (2 bytes a piece, not 8: a chunk's working arrays, and the heap they need, are that much smaller)
        code: type[np.signedinteger[Any]] = np.int16 if len(vocab.words) < np.iinfo(np.int16).max else np.int32
        self.code_dtype = code
        for track in self.tracks.values():
            track.names, track.shapes = track.names.astype(code), track.shapes.astype(code)
        self.range_index.names = self.range_index.names.astype(code)
        self.copy_names, self.opener_names = self.copy_names.astype(code), self.opener_names.astype(code)
        self.call_names = {c: names.astype(code) for c, names in self.call_names.items()}

    @staticmethod
    def _graph_call_names(report: Report, api: pd.DataFrame) -> dict[float, str]:
        if not len(api):
            return {}
        is_graph = api_names_map(report, lambda n: bool(GRAPH_API.search(str(n)))).astype(bool)
        rows = api[is_graph]
        return dict(zip(rows["correlation"].to_numpy(np.float64, na_value=np.nan).tolist(),
                        rows["name"].astype("object").tolist()))

    @staticmethod
    def _untraced_launches(report: Report, acts: pd.DataFrame, api: pd.DataFrame, ids: np.ndarray) -> np.ndarray:
        """Per device-work row: a kernel whose launch call the trace lacks (its correlation id has no API row) in a
        trace that records the host's calls by correlation id; read only where the kernels carry dispatch ids (AMD's
        traces: the HIP API trace holds every call, so a kernel without its call means API records are missing)."""
        out = np.zeros(len(acts), bool)
        if not len(api) or "correlation" not in api or not (~np.isnan(ids)).any():
            return out
        held = api["correlation"].to_numpy(np.float64, na_value=np.nan)
        held = np.unique(held[~np.isnan(held)])
        if not len(held):
            return out
        corr = acts["correlation"].to_numpy(np.float64, na_value=np.nan)[:len(report.kernels)]
        at = np.clip(np.searchsorted(held, corr), 0, len(held) - 1)
        out[:len(corr)] = ~np.isnan(corr) & (held[at] != corr)
        return out

    def release_device_work(self) -> None:
        """Let go of the device work (read by :meth:`per_gap` only) before the gaps are classified."""
        self.acts = None
        self.graph = np.zeros(0)
        self.ids, self.process, self.untraced = np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool)
        self.sync_op = np.zeros(0, bool)

    # ------------------------------------------------------------------ per device
    def per_gap(self, idle: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per gap of ``idle`` (a device's; ``rows``: its device work): its length, the call that opened it (row
        of :attr:`openers`, -1: none), the correlation of the graph replay it lies in (NaN: none), and the dispatch
        ids the trace lacks over it with the ids either side (:func:`unrecorded_gaps`; 0 and NaN: none)."""
        ist, ien = idle
        return ((ien - ist), _call_at(self.openers, ist, closed=True), self._graph_gaps(rows, ist, ien),
                *self._unrecorded(rows, ist, ien), self._untraced_after(rows, ien))

    def _untraced_after(self, rows: np.ndarray, ien: np.ndarray) -> np.ndarray:
        """Per gap: the device work that ends it (the first started at its end) is a kernel whose launch call the
        trace lacks (:meth:`_untraced_launches`)."""
        assert self.acts is not None, "the device work was released"
        if not len(self.untraced):
            return repeated(np.False_, len(ien))
        flag = self.untraced[rows]
        if not flag.any():
            return repeated(np.False_, len(ien))
        s = self.acts["start_ns"].to_numpy(np.int64)[rows]
        order = np.argsort(s, kind="stable")
        at = np.searchsorted(s[order], ien, side="left")
        ok = at < len(s)
        return ok & flag[order][np.minimum(at, len(s) - 1)]

    def _unrecorded(self, rows: np.ndarray, ist: np.ndarray, ien: np.ndarray) -> tuple[np.ndarray, ...]:
        """:func:`unrecorded_gaps` of the device's kernels, against the ids of their process (none when the device's
        kernels come from several processes: their ids are not one sequence)."""
        assert self.acts is not None, "the device work was released"
        none = (repeated(np.int64(0), len(ist)), repeated(np.float64(np.nan), len(ist)),
                repeated(np.float64(np.nan), len(ist)))
        if not self.held:
            return none
        ids = self.ids[rows]
        known = ~np.isnan(ids)
        procs = np.unique(self.process[rows][known])
        if len(procs) != 1 or int(procs[0]) not in self.held:
            return none
        starts = self.acts["start_ns"].to_numpy(np.int64)[rows]
        return unrecorded_gaps(starts, ids, self.held[int(procs[0])], ist, ien)

    def _graph_gaps(self, rows: np.ndarray, ist: np.ndarray, ien: np.ndarray) -> np.ndarray:
        """Per gap: the correlation of the graph replay whose kernels lie on both sides of it (NaN: none). The
        device work's copies are made one at a time and freed as soon as they are read (this runs while the
        report's tables are all held)."""
        assert self.acts is not None, "the device work was released"
        out = np.full(len(ist), np.nan)
        key = self.graph[rows]
        if not len(key) or np.isnan(key).all():
            return out
        s = self.acts["start_ns"].to_numpy(np.int64)[rows]
        order = np.argsort(s, kind="stable")
        s = s[order]
        key = key[order]
        e = self.acts["end_ns"].to_numpy(np.int64)[rows[order]]
        del order
        # the row holding the running end: its position where the end is the running maximum, else 0, accumulated
        setter = np.arange(len(e))
        setter[e != np.maximum.accumulate(e)] = 0
        del e
        np.maximum.accumulate(setter, out=setter)
        before = np.searchsorted(s, ist, side="left") - 1
        after = np.searchsorted(s, ien, side="left")
        ok = (before >= 0) & (after < len(s))
        prev = np.where(ok, key[setter[np.maximum(before, 0)]], np.nan)
        nxt = np.where(ok, key[np.minimum(after, len(s) - 1)], np.nan)
        same = ok & (prev == nxt)  # NaN equals nothing
        out[same] = prev[same]
        return out

    def classify(self, device: str, idle: tuple[np.ndarray, np.ndarray], window: tuple[np.ndarray, np.ndarray],
                 per_gap: tuple[np.ndarray, ...]) -> _Slices:
        """Cut the idle intervals at every host boundary, give each piece its cause, host kind and evidence,
        and join neighbouring pieces that agree (text as codes of :class:`_Vocab` until the join); ``per_gap``:
        :meth:`per_gap` of ``idle``."""
        ist, ien = idle
        cuts = [ist, ien]
        bounds = [*self.host_sets.values(), self.recorded]
        sources = [np.asarray(a, np.int64) for pair in bounds for a in pair]
        sources += [self.range_index.s, self.range_index.e]
        for track in self.tracks.values():
            sources += track.bounds()
        sources.append(self.openers[1])
        for p in sources:
            if len(p):
                cuts.append(p[inside(idle, p)])
        points = np.concatenate(cuts)
        del cuts, sources
        points = _sorted_unique(points)
        # the pieces (between neighbouring cut points, inside a gap) are made a chunk at a time from the points:
        # no full-length piece bounds, midpoints or gap numbers are held while the chunks' slices accumulate
        parts = []
        gap_type = np.int32 if len(ist) < 2**31 else np.int64
        for lo, hi in _point_chunks(points, ist, _chunk_size(self)):
            pts = points[lo:hi]
            mid = pts[:-1] + (pts[1:] - pts[:-1]) // 2
            keep = inside(idle, mid)
            a, b, mid = pts[:-1][keep], pts[1:][keep], mid[keep]
            gap = (np.searchsorted(ist, a, side="right") - 1).astype(gap_type)
            parts.append(self._pieces(a, b, mid, gap, per_gap))
        del points
        span = float((window[1] - window[0]).sum())
        return _Slices(device, span, parts)

    def _pieces(self, a: np.ndarray, b: np.ndarray, mid: np.ndarray, gap: np.ndarray,
                per_gap: tuple[np.ndarray, ...]) -> dict[str, Any]:
        """The cause, host kind and evidence of the pieces ``a``-``b`` (whole gaps), joined into slices
        (:meth:`_joined`); ``per_gap``: each gap's length, the call that opened it, its graph replay, the dispatch
        ids the trace lacks over it and the ids either side."""
        C = self.code
        n = len(a)
        code = self.code_dtype  # the text codes' dtype; rows of the host tracks in int32 (a piece: ~70 bytes, not ~190)
        cause = np.full(n, C["host"], code)
        unknown = ~inside(self.recorded, mid)
        cause[unknown] = C["unknown"]
        done = unknown.copy()
        for c in PRIORITY:
            hit = ~done & inside(self.host_sets[c], mid)
            cause[hit] = C[c]
            done |= hit
        api = np.full(n, -1, code)
        corr = np.full(n, np.nan)
        # the host's own activity: the operator, the Python function, the wait, the math call
        ops, py, waits, maths = (self.tracks[k] for k in ("op", "python", "wait", "math"))
        known = np.flatnonzero(~unknown)
        op_row = np.full(n, -1, np.int32)
        op_row[known] = ops.at(mid[known])
        fn_row = np.full(n, -1, np.int32)
        fn_row[known] = py.at(mid[known])
        host = cause == C["host"]
        at_host = np.flatnonzero(host)
        wait_row = np.full(n, -1, np.int32)
        wait_row[at_host] = waits.at(mid[at_host])
        math_row = np.full(n, -1, np.int32)
        math_row[at_host] = maths.at(mid[at_host])
        op = _take(ops.names, op_row)
        op_shapes = _take(ops.shapes, op_row)
        function = _take(py.names, fn_row)
        wait = _take(waits.names, wait_row)
        kind = np.full(n, -1, code)
        waiting = host & (wait_row >= 0)
        in_op = host & (op_row >= 0)
        in_math = host & ~waiting & (math_row >= 0)
        # host math: a CPU operator that queued no device work (on a GPU report: it ran on host tensors), or a
        # call into numpy / scipy (any report: math no operator records)
        op_math = in_op & _take(ops.computes, op_row, False).astype(bool) & (not self.cpu)
        computes = ~waiting & (op_math | in_math)
        by_math = in_math & ~op_math
        op[by_math] = _take(maths.names, math_row[by_math])
        op_shapes[by_math] = -1
        kind[waiting] = C["waiting"]
        kind[computes] = C["cpu compute"]
        # the queue model: the rest of a gap that opened inside a sync (or a copy to the host) is that sync's
        gap_opened = per_gap[1][gap]
        rest = host & ~waiting & ~computes
        queued = rest & (gap_opened >= 0)
        queued[queued] = mid[queued] >= self.openers[1][gap_opened[queued]]
        if queued.any():
            opener = gap_opened[queued]
            cause[queued] = C["sync"]
            api[queued] = self.opener_names[opener]
            behind = ops.at(self.openers[0][opener])
            op[queued] = _take(ops.names, behind)
            op_shapes[queued] = _take(ops.shapes, behind)
        rest &= ~queued
        # dispatch: inside an operator that queues device work (its host side, whatever its length: what a graph
        # replay skips), a short gap, a short operator, or a short stretch of host code between operators (the
        # Python between two eager operators); a long one is the host's own code
        queues = in_op & _take(ops.queues, op_row, False).astype(bool)
        limit = DISPATCH_GAP_NS if len(ops) else DISPATCH_GAP_UNSEEN_NS
        stretch = _run_lengths(rest, a, b, gap, op_row)  # host code in one operator (or between two), in one gap
        short = (per_gap[0][gap] < limit) | (stretch < np.where(queues, DISPATCH_OP_NS, limit))
        kind[rest & short] = C["dispatch"]
        kind[rest & ~short] = C["host code"]
        # host code before a kernel whose launch call the trace lacks: the host's calls there are not all recorded
        kind[rest & ~short & per_gap[6][gap]] = C["untraced"]
        # graph replays: the device runs the graph's nodes by itself, whatever the host does meanwhile
        replay = per_gap[2][gap]
        in_graph = ~np.isnan(replay)
        if in_graph.any():
            cause[in_graph] = C["graph"]
            corr[in_graph] = replay[in_graph]
            api[in_graph] = [self.graph_call.get(c, C["graph replay"]) for c in replay[in_graph].tolist()]
            for col in (kind, op, op_shapes, function, wait):
                col[in_graph] = -1
        # dispatches the trace lacks over the gap: the device likely ran kernels it does not hold, whatever the host
        # did (the range around it stays: where the host was)
        missing = per_gap[3][gap]
        unrecorded = missing > 0
        gone = np.full(n, np.nan)
        before, after = gone.copy(), gone.copy()
        if unrecorded.any():
            cause[unrecorded] = C["unrecorded"]
            corr[unrecorded] = np.nan
            for col in (kind, api, op, op_shapes, function, wait):
                col[unrecorded] = -1
            gone[unrecorded] = missing[unrecorded]
            before[unrecorded] = per_gap[4][gap][unrecorded]
            after[unrecorded] = per_gap[5][gap][unrecorded]
        names = np.full(n, -1, code)
        named = np.flatnonzero(~unknown & ~in_graph)
        names[named] = self.range_index.at(mid[named])
        wait[cause != C["host"]] = -1
        nbytes = np.full(n, np.nan)
        pinned = np.full(n, -1, np.int8)  # -1 unknown, 0 pageable, 1 pinned
        copies = self.copies
        is_copy = np.flatnonzero(cause == C["copy"])
        if len(is_copy) and len(copies):
            cs, ce = copies["start_ns"].to_numpy(np.int64), copies["end_ns"].to_numpy(np.int64)
            i = np.searchsorted(cs, mid[is_copy], side="right") - 1
            ok = (i >= 0) & (ce[np.maximum(i, 0)] > mid[is_copy])
            at, row = is_copy[ok], i[ok]
            corr[at] = copies["correlation"].to_numpy(np.float64, na_value=np.nan)[row]
            nbytes[at] = pd.to_numeric(copies["bytes"], errors="coerce").to_numpy(np.float64, na_value=np.nan)[row]
            pin = copies["pinned"].astype("object").to_numpy()[row]
            pinned[at] = np.array([1 if p is True else 0 if p is False else -1 for p in pin.tolist()], np.int8)
            api[at] = self.copy_names[row]
        for c, call_set in self.calls.items():
            at = np.flatnonzero((cause == C[c]) & (api < 0))
            row = _call_at(call_set, mid[at])
            api[at[row >= 0]] = self.call_names[c][row[row >= 0]]
            if c == "launch":  # which kernel the call launched (first_launch)
                corr[at[row >= 0]] = call_set[3][row[row >= 0]]
        return self._joined(a, b, gap, {
            "cause": cause, "host_kind": kind, "range": names, "api": api, "op": op, "op_shapes": op_shapes,
            "function": function, "wait": wait}, corr, nbytes, pinned,
            {"unrecorded_dispatches": gone, "dispatch_before": before, "dispatch_after": after})

    def _joined(self, a: np.ndarray, b: np.ndarray, gap: np.ndarray, codes: dict[str, np.ndarray], corr: np.ndarray,
                nbytes: np.ndarray, pinned: np.ndarray, per_gap: dict[str, np.ndarray]) -> dict[str, Any]:
        """Neighbouring pieces of one gap with the same cause and evidence, joined into one slice: the slices'
        columns, the text ones as codes of the vocabulary (-1: None); ``per_gap``: columns with one value per gap
        (float, NaN: none), taken from each slice's first piece."""
        key_change = np.ones(len(a), bool)
        if len(a) > 1:
            same = (a[1:] == b[:-1]) & (gap[1:] == gap[:-1]) & \
                ((corr[1:] == corr[:-1]) | (np.isnan(corr[1:]) & np.isnan(corr[:-1])))
            for values in codes.values():
                same &= values[1:] == values[:-1]
            key_change[1:] = ~same
        first = np.flatnonzero(key_change)
        last = np.append(first[1:] - 1, len(a) - 1)
        # a column with one value in every row is held once: an nsys export's slices carry no copy bytes, no
        # correlation, no operator, shapes, function or wait (25 of a slice's 53 bytes while chunks wait)
        return {"start_ns": a[first], "end_ns": b[last], "gap": gap[first].astype(np.int32),
                "correlation": held_once(corr[first]), "bytes": held_once(nbytes[first]),
                "pinned": held_once(pinned[first]),
                **{k: held_once(v[first]) for k, v in per_gap.items()},
                **{k: held_once(v[first].astype(self.code_dtype)) for k, v in codes.items()}}


def _join_pieces(pieces: list[np.ndarray]) -> np.ndarray:
    """The chunks' pieces of one column as one array; held once (:func:`.schema.held_once`) when every piece is
    one and the same value."""
    if pieces and all(p.strides == (0,) for p in pieces):
        firsts = held_once(np.concatenate([p[:1] for p in pieces]))
        if firsts.strides == (0,) or len(firsts) == 1:
            return repeated(firsts[:1].copy(), sum(len(p) for p in pieces))
    return np.concatenate(pieces)


PIECES_PER_CHUNK = 1 << 17
"""The idle classification works on this many cut points (at most as many pieces) at a time, whole gaps, so its
working arrays stay about 20 MB whatever the trace's size (a 5M-kernel nsys export cuts its gaps into ~20M
pieces); the pieces are made per chunk from the sorted cut points, not for the whole trace first. Small enough
that a chunk's arrays fit in the heap the reader's columns left free (1.09M-event Kineto trace, 247k pieces: 1 <<
19 grew the heap by ~45 MB, ~11,000 page faults; 1 << 17: none); each chunk costs ~2 ms of its own (lookups
per nesting level), ~0.3 s over a 5M-kernel trace's ~150 chunks."""


def _chunk_size(ctx: _Context) -> int:
    """Pieces per chunk: :data:`PIECES_PER_CHUNK` (each host track is nested once, not per chunk, so a chunk
    need not be as long as the largest track: at 5M Kineto kernels, 2.1M host operators made chunks of 2.1M
    pieces, ~0.45 GB of working arrays at the classification's peak)."""
    return PIECES_PER_CHUNK


def _point_chunks(points: np.ndarray, ist: np.ndarray, size: int) -> list[tuple[int, int]]:
    """(start, stop) of runs of about ``size`` of the sorted cut ``points`` (neighbouring runs share their
    boundary point), cut only at a gap's start (``ist``, each one a cut point), so every gap's pieces lie in
    one run."""
    n, out, lo = len(points), [], 0
    while lo < n - 1:
        hi = min(lo + size, n - 1)
        if hi < n - 1:
            # the last gap start at or before the point ``hi``; past it, the first one after ``lo``
            g = int(np.searchsorted(ist, points[hi], side="right")) - 1
            cut = int(np.searchsorted(points, ist[g])) if g >= 0 else lo
            if cut <= lo:
                g = int(np.searchsorted(ist, points[lo], side="right"))
                cut = int(np.searchsorted(points, ist[g])) if g < len(ist) else n - 1
            hi = cut
        out.append((lo, hi + 1))
        lo = hi
    return out


class _Slices:
    """One device's classified slices, in chunks of columns (text as vocabulary codes)."""

    def __init__(self, device: str, span: float, parts: list[dict[str, Any]]) -> None:
        self.device, self.span, self.parts = device, span, parts

    def __len__(self) -> int:
        return sum(len(p["start_ns"]) for p in self.parts)


GAP_ID_COLUMNS = ("unrecorded_dispatches", "dispatch_before", "dispatch_after")
"""The idle table's dispatch-id columns of ``unrecorded`` slices (one value per gap; missing elsewhere)."""
TEXT_COLUMNS = ("cause", "host_kind", "range", "api", "op", "op_shapes", "function", "wait")
"""The idle table's text columns, held as vocabulary codes while it is built."""


def _table(slices: list[_Slices], words: list[str], rows: int) -> pd.DataFrame:
    """The idle rows of every device's slices as one table, each column concatenated once (the chunks freed as
    it goes), the text decoded from the vocabulary; each text column's codes memoized on the table. ``rows``:
    the device work classified (the C heap is trimmed as the chunks go from ``memo.TRIM_MIN_ROWS`` of it)."""
    sizes = [len(s) for s in slices]
    n = sum(sizes)
    cols: dict[str, Any] = {}
    codes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    word_array = np.array(words, dtype=object)
    for c in ("start_ns", "end_ns", "gap", "correlation", "bytes", "pinned", *GAP_ID_COLUMNS, *TEXT_COLUMNS):
        # one copy: every device's chunks at once (a per-device join first would copy each column twice)
        cols[c] = _join_pieces([p[c] for s in slices for p in s.parts]) if n else np.zeros(0, np.int64)
        for s in slices:
            for p in s.parts:
                del p[c]  # each chunk's piece freed once the column holds it
        release_free_memory(rows)
        if c in TEXT_COLUMNS:
            v = cols[c]
            per, distinct = recode(v, word_array)  # renumbered as column_codes gives them; the vocabulary's freed
            # the text as a categorical: a byte or two a row (its codes), not an 8-byte pointer (10M slices x 6
            # columns: ~0.4 GB at 5M kernels); the categories are the values in order of first appearance, so
            # the categorical's codes are column_codes' values: memoized as they are (a read-only view, int8 or
            # int16), not as a second, int32 copy (4 bytes a row per column: ~0.3 GB at 5M kernels)
            cat = pd.Categorical.from_codes(per, categories=pd.Index(distinct, dtype=object))
            del per
            codes[c] = (cat.codes, distinct)
            cols[c] = pd.Series(cat, copy=False)
            del v
    start, end = cols.pop("start_ns"), cols.pop("end_ns")
    dur = end - start
    spans = np.array([s.span for s in slices], np.float64)
    # one device (the usual case): its window and name are one value each, held once (stride 0)
    span = repeated(spans[0], n) if len(slices) == 1 else np.repeat(spans, sizes)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(span > 0, dur / np.where(span > 0, span, 1.0) * 100.0, np.nan)
    devices = np.array([s.device for s in slices], dtype=object)
    device_codes = np.repeat(np.arange(len(slices), dtype=np.int32), sizes)
    out = pd.DataFrame({
        "device": pd.Series(repeated(devices[:1], n) if len(slices) == 1 else devices[device_codes],
                            dtype=object, copy=False),
        "start_ns": start, "end_ns": end, "duration_ns": dur,
        **{c: cols.pop(c) for c in TEXT_COLUMNS},
        # in the contract's dtypes already (Int64, boolean): conform keeps them as they are, no copy
        "gap": pd.arrays.IntegerArray(cols["gap"].astype(np.int64, copy=False), repeated(np.False_, n)),
        "correlation": _whole_numbers(cols["correlation"]),
        "bytes": cols["bytes"],
        "pinned": pd.arrays.BooleanArray(cols["pinned"] > 0, cols["pinned"] < 0),
        "window_ns": span, "window_pct": pct,
        **{c: _whole_numbers(cols[c]) for c in GAP_ID_COLUMNS},
    }, copy=False)
    # the text columns' codes, known from the classification: the rules and sections that group the table by
    # them hash no text (schema.column_codes; conform carries them to the stored table)
    for c, known in codes.items():
        memo_seed(out, CODES_KEY + c, known)
    seed_codes(out, "device", device_codes, devices)
    return out



def _whole_numbers(values: np.ndarray) -> pd.arrays.IntegerArray:
    """Float ids (NaN: none) as an Int64 array; one value held once stays held once."""
    if values.strides == (0,) and len(values):
        v = values[0]
        return pd.arrays.IntegerArray(repeated(np.int64(0 if np.isnan(v) else v), len(values)),
                                      repeated(np.bool_(np.isnan(v)), len(values)))
    return pd.arrays.IntegerArray(np.nan_to_num(values, nan=0.0).astype(np.int64), np.isnan(values))


# ---------------------------------------------------------------------------- kinds and gap sizes
def kinds_of(idle: pd.DataFrame) -> np.ndarray:
    """Per slice, its kind (:data:`KINDS`): the cause, with ``host`` split into its host kind (a host slice
    without one, from a report written before host kinds, is ``host code``)."""
    codes, names = kind_codes(idle)
    return decode(codes, names)


def kind_codes(idle: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """:func:`kinds_of` as (codes, -1 where the cause is missing; the distinct kinds), decided once per
    distinct (cause, host kind) and kept per table object: the rules and sections of one report ask
    for the same table's kinds several times."""
    return memo(idle, "idle:kind_codes", lambda: _kind_codes(idle))


def _kind_codes(idle: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    n = len(idle)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, dtype=object)
    cc, cd = column_codes(idle, "cause")
    hc, hd = column_codes(idle, "host_kind") if "host_kind" in idle else (np.full(n, -1), np.zeros(0, dtype=object))
    width = len(hd) + 1
    pair = (cc.astype(np.int64) + 1) * width + (hc.astype(np.int64) + 1)
    inv, upair = pd.factorize(pair)  # hashed, not sorted: linear
    kinds = []
    for p in upair.tolist():
        c, h = p // width - 1, p % width - 1
        cause = cd[c] if c >= 0 else None
        hk = hd[h] if h >= 0 else None
        kinds.append((hk if isinstance(hk, str) else "host code") if cause == "host" else cause)
    per_pair, names = pd.factorize(np.array(kinds, dtype=object), use_na_sentinel=True)
    return per_pair[inv].astype(np.int64), np.asarray(names, dtype=object)


def gap_ids(idle: pd.DataFrame) -> np.ndarray:
    """A dense number per gap (0, 1, ...; the slices of one gap share ``device`` and ``gap``)."""
    if not len(idle):
        return np.zeros(0, np.int64)
    dev = column_codes(idle, "device")[0].astype(np.int64)
    gap = idle["gap"].to_numpy(np.float64, na_value=np.nan) if "gap" in idle else np.full(len(idle), np.nan)
    g = np.where(np.isnan(gap), -1, gap).astype(np.int64)
    key = dev * (int(g.max()) + 2) + (g + 1)
    return pd.factorize(key)[0].astype(np.int64)


def kind_totals(idle: pd.DataFrame, device: str | None = None) -> dict[str, float]:
    """Idle ns per kind (every kind of :data:`KINDS`, 0 where none), for one device or all."""
    df = idle if device is None or not len(idle) else rows_where(idle, "device", device)
    out = dict.fromkeys(KINDS, 0.0)
    if len(df):
        by = pd.Series(df["duration_ns"].to_numpy(np.float64, na_value=np.nan)).groupby(kinds_of(df)).sum()
        out.update({str(k): float(v) for k, v in by.items()})
    return out


def largest_kind(totals: dict[str, float]) -> str | None:
    """The kind with the most idle time as measured (None when there is none): ``unrecorded`` time, where the trace
    lacks the dispatches the device likely ran, is not idle time and never leads."""
    live = {k: v for k, v in totals.items() if v > 0 and k != "unrecorded"}
    return max(live, key=lambda k: live[k]) if live else None


def graphs_help(totals: dict[str, float]) -> bool:
    """Whether CUDA graphs / fusion address the largest share of these gaps: the largest kind is
    ``dispatch`` or ``launch`` (:data:`GRAPH_KINDS`)."""
    return largest_kind(totals) in GRAPH_KINDS


def measured(idle: pd.DataFrame) -> pd.DataFrame:
    """The slices of ``idle`` outside the ``unrecorded`` gaps (whole gaps: every slice of such a gap is one):
    the idle time as measured; ``idle`` itself when it has none."""
    if not len(idle):
        return idle
    codes, distinct = column_codes(idle, "cause")
    hit = [i for i, v in enumerate(distinct.tolist()) if v == "unrecorded"]
    return idle if not hit else subset(idle, codes != hit[0])


def unrecorded_facts(idle: pd.DataFrame) -> dict[str, float | int]:
    """What the ``unrecorded`` slices of ``idle`` (one device's, or all) hold: ``ns`` (their time), ``gaps``,
    ``dispatches`` (the ids the trace lacks over them, each run of missing ids once: two gaps on either side of a
    copy share one run), ``first`` / ``last`` (the lowest and highest missing id, -1 when none)."""
    out: dict[str, float | int] = {"ns": 0.0, "gaps": 0, "dispatches": 0, "first": -1, "last": -1}
    if not len(idle) or "unrecorded_dispatches" not in idle:
        return out
    rows = rows_where(idle, "cause", "unrecorded")
    if not len(rows):
        return out
    out["ns"] = float(rows["duration_ns"].to_numpy(np.float64, na_value=np.nan).sum())
    out["gaps"] = len(np.unique(gap_ids(rows)))
    lo = rows["dispatch_before"].to_numpy(np.float64, na_value=np.nan)
    hi = rows["dispatch_after"].to_numpy(np.float64, na_value=np.nan)
    n = rows["unrecorded_dispatches"].to_numpy(np.float64, na_value=np.nan)
    runs = pd.DataFrame({"lo": lo, "hi": hi, "n": n}).dropna().drop_duplicates(["lo", "hi"])
    if len(runs):
        out["dispatches"] = int(runs["n"].sum())
        out["first"], out["last"] = int(runs["lo"].min()) + 1, int(runs["hi"].max()) - 1
    return out


GAP_BUCKETS_NS = (5_000, 50_000, 500_000, 5_000_000, 50_000_000)
"""Edges of the gap-size buckets: under 5 µs, 5-50 µs, 50-500 µs, 0.5-5 ms, 5-50 ms, 50 ms and over."""


def gap_lengths(idle: pd.DataFrame) -> np.ndarray:
    """The idle ns of each gap (its slices summed; slices of one gap share ``device`` and ``gap``)."""
    if not len(idle):
        return np.zeros(0)
    return np.bincount(gap_ids(idle), weights=idle["duration_ns"].to_numpy(np.float64, na_value=np.nan))


def weighted_median(sizes: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The size at which half the time lies in pieces at least that long (a median weighted by
    time, not count: 64 gaps of 10 ms among 1,983 of 1 us read as 10 ms). ``weights``: the time each
    piece stands for when it is not its size (a group's slices, each weighing the gap it lies in)."""
    sizes = np.asarray(sizes, np.float64)
    w = sizes if weights is None else np.asarray(weights, np.float64)
    if not len(sizes) or not w.sum() > 0:
        return float("nan")
    order = np.argsort(-sizes, kind="stable")
    c = np.cumsum(w[order])
    return float(sizes[order][int(np.searchsorted(c, c[-1] / 2.0))])


def gap_size_buckets(lengths: np.ndarray) -> list[dict[str, float]]:
    """The gaps grouped by size (:data:`GAP_BUCKETS_NS`), most time first: lo_ns, hi_ns, gaps, time_ns and
    typical_ns (the time-weighted median length in the bucket: where the bucket's time is)."""
    lengths = np.asarray(lengths, np.float64)
    lengths = lengths[lengths > 0]
    edges = np.array((0, *GAP_BUCKETS_NS, np.inf))
    which = np.searchsorted(edges, lengths, side="right") - 1
    out = []
    for i in np.unique(which).tolist():
        x = lengths[which == i]
        out.append({"lo_ns": float(edges[i]), "hi_ns": float(edges[i + 1]), "gaps": len(x),
                     "time_ns": float(x.sum()), "typical_ns": weighted_median(x)})
    return sorted(out, key=lambda d: -d["time_ns"])


def gap_sizes_text(lengths: np.ndarray, most: int = 3) -> str:
    """Gap sizes weighted by time: ``640 ms in 64 gaps of 10.0 ms; 1,983 gaps under 5 µs add 2 ms``."""
    from perfscope.format import counted, duration

    parts = []
    for i, b in enumerate(gap_size_buckets(lengths)[:most]):
        n = int(b["gaps"])
        gaps = counted(n, 'gap')
        if i == 0:
            parts.append(f"{duration(b['time_ns'])} in {gaps} of {duration(b['typical_ns'])}")
        elif b["lo_ns"] == 0:
            parts.append(f"{gaps} under {duration(b['hi_ns'])} add {duration(b['time_ns'])}")
        elif not np.isfinite(b["hi_ns"]):  # the last bucket has no upper edge
            parts.append(f"{gaps} of {duration(b['lo_ns'])} or longer add {duration(b['time_ns'])}")
        else:
            parts.append(f"{gaps} of {duration(b['lo_ns'])}-{duration(b['hi_ns'])} add {duration(b['time_ns'])}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------- summaries
def idle_summary(idle: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, cause, host_kind, range): duration_ns, slices, window_pct, idle_pct (share of
    the device's idle time) and, for copies, bytes (each copy once), copies and pinned (all / none / some).

    Grouped on the columns' integer codes (no text hashed per row, no scan per group): linear in the slices."""
    cols = ["device", "cause", "host_kind", "range", "duration_ns", "slices", "window_pct", "idle_pct", "bytes",
            "copies", "pinned"]
    if not len(idle):
        return pd.DataFrame(columns=cols)
    dc, dd = column_codes(idle, "device")
    cc, cd = column_codes(idle, "cause")
    kc, kd = kind_codes(idle)
    rc, rd = column_codes(idle, "range")
    is_host = decode(cc, cd) == "host"
    kc = np.where(is_host, kc, -1)  # the host kind keys host slices only
    empty = [i for i, v in enumerate(rd.tolist()) if v == ""]
    if empty:  # a missing range and an empty one are one group ("")
        rc = np.where(rc == empty[0], -1, rc)
    key = dc.astype(np.int64) + 1
    for codes, distinct in ((cc, cd), (kc, kd), (rc, rd)):
        key = key * (len(distinct) + 1) + (codes.astype(np.int64) + 1)
    gid, _ = pd.factorize(key)  # groups numbered in order of first appearance, as groupby(sort=False)
    first = np.flatnonzero(~pd.Series(gid).duplicated().to_numpy())
    n = len(first)
    dur = idle["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    total = np.bincount(gid, weights=dur, minlength=n)
    slices = np.bincount(gid, minlength=n)
    dev_idle = np.bincount(dc + 1, weights=dur)
    total_idle = dev_idle[dc[first] + 1]
    total_idle[dc[first] < 0] = np.nan  # no device: no share
    window = idle["window_ns"].to_numpy(np.float64, na_value=np.nan)[first]
    cause = decode(cc[first], cd)
    nbytes = np.full(n, np.nan)
    copies = np.where(cause == "copy", 0.0, np.nan)
    pinned = np.full(n, None, dtype=object)
    corr = idle["correlation"].to_numpy(np.float64, na_value=np.nan)
    has = np.flatnonzero(~np.isnan(corr))
    if len(has):
        sub = pd.DataFrame({"gid": gid[has], "corr": corr[has],
                            "bytes": pd.to_numeric(idle["bytes"], errors="coerce").to_numpy(np.float64, na_value=np.nan)[has],
                            "pinned": pd.Series(idle["pinned"].astype("object").to_numpy()[has], dtype=object)})
        once = sub.drop_duplicates(["gid", "corr"])  # each copy once per group: its first slice
        g = once.groupby("gid")
        moved = g["bytes"].sum(min_count=1)
        nbytes[moved.index.to_numpy()] = moved.to_numpy()
        counts = g.size()
        at = counts.index.to_numpy()
        copies[at] = np.where(cause[at] == "copy", counts.to_numpy(np.float64, na_value=np.nan), np.nan)
        pin = once[once["pinned"].notna()]
        if len(pin):
            stats = pin.assign(p=pin["pinned"].astype(bool)).groupby("gid")["p"].agg(["size", "sum"])
            word = np.where(stats["sum"] == stats["size"], "all", np.where(stats["sum"] == 0, "none", "some"))
            pinned[stats.index.to_numpy()] = word
    kind = decode(kc[first], kd)
    kind[pd.isna(kind) | (kind == "")] = None
    rng = decode(rc[first], rd)
    rng[pd.isna(rng) | (rng == "")] = None
    with np.errstate(divide="ignore", invalid="ignore"):
        out = pd.DataFrame({
            "device": decode(dc[first], dd), "cause": cause,
            "host_kind": kind, "range": rng,
            "duration_ns": total, "slices": slices,
            "window_pct": np.where(window > 0, total / window * 100, np.nan),
            "idle_pct": np.where(total_idle > 0, total / total_idle * 100, np.nan),
            "bytes": nbytes, "copies": copies, "pinned": pinned}, columns=cols)
    return out.sort_values(["device", "duration_ns"], ascending=[True, False], kind="stable").reset_index(drop=True)


def cause_totals(idle: pd.DataFrame, device: str | None = None) -> dict[str, float]:
    """Idle ns per cause (every cause of :data:`CAUSES`, 0 where none), for one device or all."""
    df = idle if device is None else rows_where(idle, "device", device)
    by = df.groupby("cause", observed=True)["duration_ns"].sum() if len(df) else pd.Series(dtype="float64")
    return {c: float(by.get(c, 0.0)) for c in CAUSES}


def idle_overview(idle: pd.DataFrame, top: int = 8) -> list[dict[str, object]]:
    """Per device: its window and idle ns, the idle ns and share per cause (every cause listed) and per
    kind (:data:`KINDS`, host split), the gap sizes weighted by time, and the ``top`` rows of
    :func:`idle_summary` (the ``--json`` key ``idle``, the text and HTML sections)."""
    out: list[dict[str, object]] = []
    if not len(idle):
        return out
    summary = idle_summary(idle)
    for device in sorted(column_codes(idle, "device")[1].tolist()):
        rows = rows_where(idle, "device", device)
        total = float(rows["duration_ns"].sum())
        window = float(rows["window_ns"].iloc[0])
        totals = cause_totals(rows)
        kinds = kind_totals(rows)
        lengths = gap_lengths(measured(rows))  # the gaps over which the trace lacks dispatches are not idle
        unrec = unrecorded_facts(rows)
        kept, kept_window = total - float(unrec["ns"]), window - float(unrec["ns"])
        out.append({
            "device": device, "window_ns": window, "idle_ns": total,
            "idle_pct": total / window * 100 if window > 0 else None,
            # the idle time as measured: the unrecorded gaps (dispatches the trace lacks) left out of idle and window
            "measured_idle_ns": kept, "measured_window_ns": kept_window,
            "measured_idle_pct": kept / kept_window * 100 if kept_window > 0 else None,
            "unrecorded": unrec,
            "causes": [{"cause": c, "duration_ns": ns, "idle_pct": ns / total * 100 if total > 0 else None}
                       for c, ns in sorted(totals.items(), key=lambda kv: -kv[1])],
            "kinds": [{"kind": k, "duration_ns": ns, "idle_pct": ns / total * 100 if total > 0 else None}
                      for k, ns in sorted(kinds.items(), key=lambda kv: -kv[1])],
            "gaps": len(lengths), "gap_sizes": gap_size_buckets(lengths), "gap_sizes_text": gap_sizes_text(lengths),
            "ranges": summary[summary["device"] == device].head(top).drop(columns="device").to_dict(orient="records"),
        })
    return out


__all__ = [
    "CAUSES",
    "DISPATCH_GAP_NS",
    "DISPATCH_GAP_UNSEEN_NS",
    "DISPATCH_ID_MAX",
    "DISPATCH_OP_NS",
    "GRAPH_KINDS",
    "HOST_KINDS",
    "KINDS",
    "cause_totals",
    "dispatch_ids",
    "function_label",
    "gap_ids",
    "gap_lengths",
    "gap_size_buckets",
    "gap_sizes_text",
    "graphs_help",
    "held_ids",
    "idle_intervals",
    "idle_of",
    "idle_overview",
    "idle_rows",
    "idle_slices",
    "idle_summary",
    "innermost_ranges",
    "kind_codes",
    "kind_totals",
    "kinds_of",
    "largest_kind",
    "launching_thread",
    "measured",
    "missing_between",
    "unrecorded_facts",
    "unrecorded_gaps",
    "unrecorded_summary",
    "unrecorded_warning",
    "weighted_median",
]
