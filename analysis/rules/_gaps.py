"""The evidence of the idle findings: the device's gaps grouped by what the host did in them, and the
advice those groups support (docs/idle.md). Shared by ``gpu-idle`` / ``time-outside-ops``,
``launch-overhead``, ``short-kernels`` and ``step-idle``; no rule lives here.

Each group of idle slices with the same kind (:data:`..idle.KINDS`: the cause, ``host`` split into
dispatch, cpu compute, waiting and host code) and the same subject (the operator and Python function
of a cpu compute, the wait and range of a wait, the sync call and the operator behind it...) becomes
one :class:`Item`, largest first. The advice is chosen from the kinds' shares: CUDA graphs and fusion
only when ``dispatch`` or ``launch`` holds the largest share, "move or overlap this host work" naming
its operators and functions for ``cpu compute`` and ``host code``, remove or defer the sync for
``sync``, pinned memory and overlap for copies. Time nothing explains (``unknown``, host code with no
range, function or operator around it) is an item that explains nothing.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.format import counted, duration, nbytes, si
from perfscope.format import pct as pct_text
from perfscope.schema import column_codes, decode, map_distinct, value_mask
from perfscope.shapes import shapes_text

from ..idle import (
    GRAPH_KINDS,
    HOST_KINDS,
    LAUNCH_API,
    function_label,
    gap_ids,
    gap_lengths,
    gap_sizes_text,
    graphs_help,
    kind_codes,
    kind_totals,
    kinds_of,
    largest_kind,
    measured,
    unrecorded_facts,
    weighted_median,
)
from ._base import Item, pct
from .evidence import spans_of

if TYPE_CHECKING:
    from collections.abc import Sequence

TOP_ITEMS = 8
"""How many groups a finding lists one by one; the rest of each kind is one item."""
ADVISE_MIN_PCT = 10.0
"""A kind that holds at least a tenth of the idle time gets its own advice."""
EXPLAINED = {"launch", "dispatch", "cpu compute", "waiting", "sync", "copy", "graph", "profiler", "unrecorded"}
"""Kinds whose cause the trace shows; ``host code`` explains only when a range, function or operator
names it, ``unknown`` never. ``unrecorded`` time is explained by the dispatches the trace lacks over it (the
device likely ran kernels it does not hold), not by the host."""



def range_family(name: object) -> str | None:
    """A range with its numbers as ``N`` (``ensure_layer_3_weights`` -> ``ensure_layer_N_weights``)."""
    if not isinstance(name, str) or not name:
        return None
    import re

    return re.sub(r"\d+", "N", name)


def function_name(name: object) -> str | None:
    """The function of a Python frame ``path.py(12): attention_cpu`` -> ``attention_cpu``."""
    if not isinstance(name, str) or not name:
        return None
    return name.split("): ", 1)[1] if "): " in name else name


def _text(df: pd.DataFrame, col: str) -> np.ndarray:
    """``df[col]`` as text, "" where missing or not text (decided once per distinct value)."""
    if col not in df:
        return np.full(len(df), "", dtype=object)
    return map_distinct(df[col], lambda x: x if isinstance(x, str) else "").to_numpy(object)


SUBJECT_FIELDS = ("op", "function", "wait", "api", "range")
USES = {
    "op": ("cpu compute", "host code", "sync", "copy"),
    "function": ("cpu compute", "host code", "untraced", "waiting", "sync"),
    "wait": ("waiting",),
    "api": ("sync", "copy", "launch", "graph", "profiler"),
    "range": ("dispatch", "cpu compute", "waiting", "host code", "untraced", "sync", "copy", "profiler", "unrecorded"),
}
"""Which fields name what the host did, by kind (empty where a kind does not use one)."""


def _field_codes(idle: pd.DataFrame, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, texts) of a subject field: ranges as their family, functions as their name, "" for missing."""
    if field not in idle or not len(idle):
        return np.full(len(idle), -1, np.int64), np.zeros(0, dtype=object)
    fix = {"range": lambda x: r if isinstance(r := range_family(x), str) else "",
           "function": lambda x: (function_name(x) or "") if isinstance(x, str) else ""}.get(
        field, lambda x: x if isinstance(x, str) else "")
    codes, distinct = column_codes(idle, field)
    texts = np.array([fix(v) for v in distinct.tolist()], dtype=object)
    # texts that coincide (two ranges of one family) share one code; "" is -1
    per, uniq = pd.factorize(texts)
    blank = [i for i, v in enumerate(uniq.tolist()) if v == ""]
    per = np.where(per == (blank[0] if blank else -2), -1, per)
    return np.append(per, -1)[codes].astype(np.int64), np.asarray(uniq, dtype=object)


def _subjects(idle: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per slice, a group number over (kind, op, function, wait, api, range), each field kept only where its
    kind uses it (:data:`USES`); the kind codes and names; each field's (codes, texts)."""
    kc, kd = kind_codes(idle)
    key = kc.astype(np.int64) + 1
    fields = {}
    for f in SUBJECT_FIELDS:
        codes, texts = _field_codes(idle, f)
        used = np.array([k in USES[f] for k in kd.tolist()] + [False], dtype=bool)[kc]
        codes = np.where(used, codes, -1)
        fields[f] = (codes, texts)
        key = key * (len(texts) + 1) + (codes + 1)
    return pd.factorize(key)[0].astype(np.int64), kc, {"kind": (kc, kd), **fields}


FILLED_SHARE = 0.5
"""A group reads right as "N gaps of T" (T their length weighted by the group's time in them) only when its time
is at least half of both its gaps' time and N x T (what the words suggest); otherwise it is said as "half of it in
gaps of T or longer", which cannot be read as N x T."""


def gap_size_text(time_ns: float, gaps: int, typical_ns: float, gaps_ns: float,
                  one_gap: tuple[float, float] | None = None) -> str:
    """Where a group's ``time_ns`` lies: " in N gaps of T" when it fills at least :data:`FILLED_SHARE` of its gaps'
    time ``gaps_ns`` and of N x T (``typical_ns``: the gaps' length weighted by the group's time in them, a median);
    else " in N gaps, X of it in one gap of T" when one gap holds more than half of it (``one_gap``: its time
    there, that gap's length), or " in N gaps; half of it in gaps of T or longer"."""
    if not gaps:
        return ""
    if gaps == 1:
        return f" in 1 gap of {duration(typical_ns)}"
    filled = time_ns >= FILLED_SHARE * gaps * typical_ns and not (time_ns < FILLED_SHARE * gaps_ns)
    if filled:
        return f" in {gaps:,} gaps of {duration(typical_ns)}"
    if one_gap is not None:
        return f" in {gaps:,} gaps, {duration(one_gap[0])} of it in one gap of {duration(one_gap[1])}"
    return f" in {gaps:,} gaps; half of it in gaps of {duration(typical_ns)} or longer"


def _label(kind: str, key: dict[str, str], time_ns: float, slices: int, gaps: int, typical_ns: float,
           shapes: str | None, extra: str = "", where_all: str = "", one_gap: tuple[float, float] | None = None,
           gaps_ns: float = math.nan) -> str:
    """The item's line: its time and where it lies (:func:`gap_size_text`: ``gaps_ns``, the length of the gaps
    its slices lie in; ``one_gap``), where the host was and what it did."""
    where = []
    if key.get("function"):
        where.append(key["function"])
    if key.get("range"):
        where.append(key["range"])
    at = f" in {' / '.join(where)}" if where else ""
    size = gap_size_text(time_ns, gaps, typical_ns, gaps_ns, one_gap)
    head = f"{duration(time_ns)}{size}{where_all}"
    op = key.get("op") or ""
    if kind == "cpu compute":
        on = f" on host tensors {shapes}" if shapes else " on host tensors"
        return f"{head}: the host computed {op or 'on the CPU'}{on}{at}, no device work queued"
    if kind == "waiting":
        return f"{head}: the host waited in {key.get('wait') or 'a blocking call'}{at}"
    if kind == "host code":
        inside = f" inside {op}" if op else ""
        return (f"{head}: the host ran its own code{inside}{at}, no launch, copy or sync in flight" if (at or inside)
                else f"{head}: the host ran code no range, function or operator names")
    if kind == "untraced":
        return (f"{head}{at}: before kernels whose launch call the trace lacks (API records thinned, filtered or lost): "
                "the host's calls there are not all recorded, so what it did is unknown")
    if kind == "dispatch":
        return f"{head}: per-operator dispatch between launches (Python, framework, allocation){at}"
    if kind == "sync":
        behind = f" behind {op}" if op else ""
        return (f"{head}: after {key.get('api') or 'a synchronisation'}{behind}{at}: the host blocked until the "
                "device ran dry and could not queue ahead")
    if kind == "copy":
        return f"{head}: the host was in {key.get('api') or 'a copy'}{at}{extra}"
    if kind == "launch":
        return f"{head}: the host was inside {key.get('api') or 'launch calls'}"
    if kind == "graph":
        return f"{head}: between the nodes of a graph replay ({key.get('api') or 'graph launch'}); no host call queued them"
    if kind == "profiler":
        api = key.get("api")
        if api and LAUNCH_API.search(str(api)):
            return f"{head}: the profiler replaying kernels to count hardware counters, inside {api}"
        return f"{head}: the profiler's own work ({api or key.get('range') or 'buffer flushes'})"
    if kind == "unrecorded":
        return (f"{head}{extra}{at}: the GPU was likely running kernels the trace does not hold (a kernel filter, "
                "sampling or lost records); not idle time")
    return f"{head}: no host activity recorded there"


def idle_items(idle: pd.DataFrame, *, top: int = TOP_ITEMS, where: str = "") -> list[Item]:
    """The idle slices ``idle`` (one device's, or a subset) grouped by kind and subject, largest first: the
    ``top`` largest groups one by one, the rest of each kind as one more item. ``where`` says where every
    slice lies, after each label's size (" inside decode steps"). Grouped on integer codes: linear in the
    slices."""
    if not len(idle):
        return []
    gid, _, fields = _subjects(idle)
    dur = idle["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    gap_id = gap_ids(idle)
    gap_len = np.bincount(gap_id, weights=dur)[gap_id]
    n = int(gid.max()) + 1
    sums = np.bincount(gid, weights=dur, minlength=n)
    first = np.flatnonzero(~pd.Series(gid).duplicated().to_numpy())  # one row per group, in group order
    order = np.argsort(-sums, kind="stable")  # largest first, ties in order of first appearance
    keys = ["kind", *SUBJECT_FIELDS]

    def key_of(g: int) -> dict[str, str]:
        row = first[g]
        out = {}
        for name in keys:
            codes, texts = fields[name]
            c = codes[row]
            out[name] = str(texts[c]) if c >= 0 and texts[c] is not None else ""
        return out

    items: list[Item] = []
    starts, ends = idle["start_ns"].to_numpy(np.float64, na_value=np.nan), idle["end_ns"].to_numpy(np.float64, na_value=np.nan)
    device = str(idle["device"].iloc[0])
    sorter = np.argsort(gid, kind="stable")  # each group's rows, in row order, one after the other
    bounds = np.concatenate([[0], np.cumsum(np.bincount(gid, minlength=n))])

    def rows_of(g: int) -> np.ndarray:
        return sorter[bounds[g]:bounds[g + 1]]

    for g in order[:top].tolist():
        items.append(_item(idle, key_of(g), rows_of(g), float(sums[g]), dur, gap_id, gap_len, starts, ends, device,
                           where))
    rest: dict[tuple[str, bool], list[np.ndarray]] = {}
    for g in order[top:].tolist():  # the other groups by (kind, whether their cause is known), largest first
        k = key_of(g)
        rest.setdefault((k["kind"], _explains(k)), []).append(rows_of(g))
    if rest:
        for (kind, explains), parts in rest.items():
            pos = np.concatenate(parts)
            total = float(dur[pos].sum())
            gaps = len(pd.unique(gap_id[pos]))
            big = pos[np.argmax(dur[pos])]
            named = "" if explains or kind != "host code" else " that no range, function or operator names"
            items.append(Item("gaps", f"{duration(total)} more {kind}{named}{where} in {len(pos):,} slices of "
                                      f"{counted(gaps, 'gap')}",
                              total, explains, starts[big], ends[big],
                              {"kind": kind, "slices": len(pos), "gaps": gaps, "device": device},
                              spans=spans_of(starts[pos], ends[pos])))
    return items


def _explains(key: dict[str, str]) -> bool:
    """Whether a group's cause is known: its kind is, or host code that a range, function or operator names."""
    return key["kind"] in EXPLAINED or (key["kind"] == "host code" and any(key.get(c) for c in ("range", "function", "op")))


def _item(idle: pd.DataFrame, k: dict[str, str], pos: np.ndarray, total: float, dur: np.ndarray, gap_id: np.ndarray,
          gap_len: np.ndarray, starts: np.ndarray, ends: np.ndarray, device: str, where: str = "") -> Item:
    kind = k["kind"]
    gaps = len(pd.unique(gap_id[pos]))
    typical = weighted_median(gap_len[pos], dur[pos])
    big = pos[np.argmax(dur[pos])]
    in_gap = pd.Series(dur[pos]).groupby(gap_id[pos]).sum()  # this group's time in each of its gaps
    one_gap = ((float(in_gap.max()), float(gap_len[pos][gap_id[pos] == in_gap.idxmax()][0]))
               if gaps > 1 and in_gap.max() > total / 2 else None)
    shapes = shapes_text(idle["op_shapes"].iloc[big]) if "op_shapes" in idle else None
    extra = ""
    if kind == "copy":
        rows = idle.iloc[pos]
        once = rows[rows["correlation"].notna()].drop_duplicates("correlation")
        moved = float(once["bytes"].sum()) if len(once) and once["bytes"].notna().any() else math.nan
        pin = once["pinned"].dropna().astype(bool)
        pinned = "unknown" if not len(pin) else "pinned" if pin.all() else "pageable" if not pin.any() else "mixed"
        extra = f" ({len(once)} copies, {nbytes(moved)}, host memory {pinned})"
    if kind == "unrecorded":
        extra = _lacks_text(unrecorded_facts(idle.iloc[pos]))
    explains = _explains(k)
    fn_full = idle["function"].iloc[big] if "function" in idle else None
    attrs: dict[str, float | int | str | None] = {
        "kind": kind, "cause": str(idle["cause"].iloc[big]), "host_kind": kind if kind in HOST_KINDS else None,
        "range": k["range"] or None, "op": k["op"] or None, "function": function_label(fn_full) if k["function"] else None,
        "wait": k["wait"] or None, "api": k["api"] or None, "slices": len(pos), "gaps": gaps,
        "typical_gap_ns": typical, "largest_ns": float(dur[big]), "device": device, "op_shapes": shapes}
    kind_name = "gap" if len(pos) == 1 else "gaps"
    gaps_ns = float(pd.Series(gap_len[pos]).groupby(gap_id[pos]).first().sum())  # the length of its gaps
    label = _label(kind, k, total, len(pos), gaps, typical, shapes, extra, where, one_gap, gaps_ns)
    return Item(kind_name, label, total, explains, starts[big], ends[big], {a: v for a, v in attrs.items() if v is not None},
                spans=spans_of(starts[pos], ends[pos]) if len(pos) > 1 else ())


def _lacks_text(facts: dict[str, float | int]) -> str:
    """`` over which the trace lacks 4,590 dispatches (ids 188..4873)`` (:func:`..idle.unrecorded_facts`)."""
    n = int(facts["dispatches"])
    ids = f" (ids {facts['first']}..{facts['last']})" if int(facts["first"]) >= 0 else ""
    return f" over which the trace lacks {counted(n, 'dispatch')}{ids}"


def unrecorded_text(facts: dict[str, float | int]) -> str:
    """What the ``unrecorded`` gaps hold, as a finding says it: ``131 ms of the idle span lies in 5 gaps over which
    the trace lacks 4,590 dispatches (ids 188..4873): ...; that time is not idle``."""
    gaps = int(facts["gaps"])
    return (f"{duration(float(facts['ns']))} of the idle span lies in {counted(gaps, 'gap')}"
            f"{_lacks_text(facts)}: the GPU was likely running kernels the trace does not hold (a kernel filter, "
            "sampling or lost records); that time is not idle")


# ---------------------------------------------------------------------------- advice
def _names(items: Sequence[Item], kind: str, fields: Sequence[str], most: int = 3) -> list[str]:
    out: list[str] = []
    for it in items:
        if it.attrs.get("kind") != kind:
            continue
        for f in fields:
            v = it.attrs.get(f)
            if isinstance(v, str) and v:
                v = function_name(v.split(" (")[0]) if f == "function" else v
                if v and v not in out:
                    out.append(v)
                break
    return out[:most]


JIT_NAMES = re.compile(r"nvrtc|\bcompile(?:program|fusion|_fx|_ir)?\b|compile_fx|_inductor|_dynamo|convert_frame|"
                       r"gpulower|codegen|ptxas|\b(?:cu|hip)modulel(?:oad|oaddata)\b", re.IGNORECASE)
"""Names of a JIT compiler's host work (NVRTC, nvFuser's lowering and ``compileFusion``, TorchDynamo and Inductor,
Triton's ``compile``, module loading): host code under one of them is kernel compilation, a cost of a first run."""

JIT_SHARE = 0.5
"""Host-code time whose ranges or functions name a compiler (:data:`JIT_NAMES`) must hold this share of the host
code for the advice to be about compilation."""


def jit_time(idle: pd.DataFrame) -> tuple[float, float, list[str]]:
    """(ns of the idle table's ``host code`` slices under a compiler's range, function or operator
    (:data:`JIT_NAMES`), ns of all its ``host code`` slices, the compiler names, most time first). Read from the
    table's rows (each distinct name matched once), not from a finding's items, which gather small groups."""
    if not len(idle) or "host_kind" not in idle:
        return 0.0, 0.0, []
    host = value_mask(idle, "host_kind", lambda v: v == "host code")
    if not host.any():
        return 0.0, 0.0, []
    ns = idle["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    hit = np.zeros(len(idle), bool)
    by_name: dict[str, float] = {}
    for col in ("range", "function", "op"):  # a slice counts once, named by the first of its names that matches
        if col not in idle:
            continue
        here = np.flatnonzero(host & ~hit & value_mask(idle, col, lambda v: isinstance(v, str)
                                                       and JIT_NAMES.search(v) is not None))
        codes, distinct = column_codes(idle, col)
        for code, t in pd.Series(ns[here]).groupby(codes[here]).sum().items():
            by_name[str(distinct[int(code)])] = by_name.get(str(distinct[int(code)]), 0.0) + float(t)
        hit[here] = True
    return float(ns[hit].sum()), float(ns[host].sum()), sorted(by_name, key=lambda n: -by_name[n])


UNNAMED_SHARE = 0.1
"""Host code that no range, function or operator names (:func:`unnamed_host_ns`) gets its own sentence when it holds
at least this share of the host code, and the advice to move named host work only for the rest above it."""


def unnamed_host_ns(idle: pd.DataFrame) -> tuple[float, float]:
    """The idle time of host code that no range, function or operator names, and of all host code (ns)."""
    host = np.asarray(kinds_of(idle)) == "host code" if len(idle) else np.zeros(0, bool)
    named = np.zeros(len(idle), bool)
    for col in ("range", "function", "op"):
        if col in idle:
            named |= value_mask(idle, col, lambda v: isinstance(v, str) and bool(v))
    ns = idle["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    return float(np.nansum(ns[host & ~named])), float(np.nansum(ns[host]))


def lead_names(items: Sequence[Item], kind: str) -> list[str]:
    """What a kind's largest items name: functions, then ranges, then operators or calls."""
    return _names(items, kind, ("function", "range", "op", "wait", "api"))


GRAPHS_TEXT = ("capture the steady-state step in a CUDA graph (torch.compile(mode='reduce-overhead'), "
               "torch.cuda.CUDAGraph) so it is replayed with one launch, fuse small operators (torch.compile), "
               "and give each launch more work (a larger batch)")
"""The advice to capture graphs and fuse: given only when dispatch or launch holds the largest share."""


HOST_WORK = (
    ("warm-up", re.compile(r"warm[\s_-]?up", re.IGNORECASE),
     "a first run's costs (cuDNN's algorithm search, lazy initialisation, the allocator growing), not a step's: "
     "start the profile after the warm-up (torch.profiler.schedule(wait=..., warmup=..., active=...)) and read the "
     "steps after it"),
    ("the optimizer step", re.compile(r"optimizer|zero_grad", re.IGNORECASE),
     "a fused or foreach optimizer (torch.optim.AdamW(fused=True), foreach=True) updates every parameter in a few "
     "launches instead of a loop over tensors{foreach}"),
    ("data loading", re.compile(r"data[\s_-]?load|_next_data|collate|__next__", re.IGNORECASE),
     "load the next batch in worker processes (DataLoader(num_workers=N, pin_memory=True, persistent_workers=True)) "
     "so it is ready when the step starts"),
    ("metrics, logging or checkpoints", re.compile(r"metric|logg|\bprint|checkpoint|\bsave|tensorboard|wandb",
                                                  re.IGNORECASE),
     "compute them every N steps or in a background thread, off the step's critical path"),
    ("backward", re.compile(r"backward|autograd", re.IGNORECASE),
     "the autograd engine's own work and the hooks on it (DistributedDataParallel's reducer, gradient hooks and "
     "clipping); Python stacks (with_stack=True) or CPU sampling say which"),
)
"""What named host code is, from its range, Python function or operator name (first match), and the advice it
takes: :func:`host_work_advice`."""

HOST_WORK_SHARE = 0.1
"""The least share of the named host time a kind of host work needs to get its own clause."""


def host_work_advice(items: Sequence[Item], cpu: bool = False) -> str:
    """What the named host code of ``items`` (``host code`` items) is, by :data:`HOST_WORK`, each kind at
    :data:`HOST_WORK_SHARE` or more with its share, names and advice; the rest said to be named only by where it
    ran, with the generic advice to move it."""
    share: dict[str, float] = {}
    names: dict[str, list[str]] = {}
    ops: dict[str, list[str]] = {}
    for it in items:
        if it.attrs.get("kind") != "host code" or not any(isinstance(it.attrs.get(f), str) and it.attrs.get(f)
                                                          for f in ("function", "range", "op")):
            continue
        text = " ".join(str(it.attrs.get(f) or "") for f in ("range", "function", "path", "op"))
        what = next((label for label, pat, _ in HOST_WORK if pat.search(text)), "")
        share[what] = share.get(what, 0.0) + it.time_ns
        where = _names([it], "host code", ("function", "range", "op"))
        names.setdefault(what, []).extend(n for n in where if n not in names.get(what, []))
        if isinstance(it.attrs.get("op"), str) and it.attrs["op"] not in ops.setdefault(what, []):
            ops[what].append(str(it.attrs["op"]))
    total = sum(share.values())
    if not total > 0:
        return ". " + _MOVE_HOST_WORK[cpu]
    advice = {label: text for label, _, text in HOST_WORK}
    parts = []
    for what in sorted(share, key=lambda w: -share[w]):
        frac = share[what] / total
        if not what or frac < HOST_WORK_SHARE:
            continue
        foreach = [o for o in ops.get(what, []) if "_foreach_" in o]
        text = advice[what].format(foreach=(f"; this one already runs foreach ops ({', '.join(foreach[:2])}), so the "
                                            "rest is its own Python per step: step it less often, or profile it "
                                            "with with_stack=True" if foreach else ""))
        parts.append(f"{frac:.0%} of it is {what} ({', '.join(names[what][:2])}): {text}")
    if not parts:
        return ". " + _MOVE_HOST_WORK[cpu]
    rest = [w for w, v in share.items() if not w or v / total < HOST_WORK_SHARE]
    out = ". " + "; ".join(parts) + "."
    if sum(share[w] for w in rest) / total >= HOST_WORK_SHARE:
        where = [n for w in sorted(rest, key=lambda w: -share[w]) for n in names[w]][:2]
        out += (f" The other {sum(share[w] for w in rest) / total:.0%} is named only by where it ran "
                f"({', '.join(where)}): {_MOVE_HOST_WORK[cpu].split(': ', 1)[1]}")
    return out


_MOVE_HOST_WORK = {
    False: ("Move or overlap this host work: make it faster, take it out of the loop, or do it for the next step while "
            "the GPU runs this one (another thread or process)."),
    True: "Move or overlap this host work: make it faster, take it out of the loop, or do it in another thread.",
}
"""The advice for host work the trace names only by where it ran (a range, function or operator of the model)."""


def kind_advice(kind: str, share: float, items: Sequence[Item], idle: pd.DataFrame, *, cpu: bool = False,
                compiled_cpu: bool = False, graphs: bool = True, graph_run: str | None = None) -> str:
    """The sentence of advice for ``kind`` holding ``share`` % of the idle time, naming its items (``graphs``:
    whether graphs and fusion may be advised; ``graph_run``: the advice for a run that already replays graphs)."""
    names = lead_names(items, kind)
    where = f" in {', '.join(names)}" if names else ""
    if kind == "dispatch":
        if compiled_cpu:
            return (f"{share:.0f}% is host work between operators{where}: decode is compiled (compile=True), so this "
                    "is the guard check and launch code of the compiled graph, per-token Python (sampling, "
                    "bookkeeping) and the eager prefill's dispatch. Move per-token work into the compiled step and "
                    "keep the step's inputs static so that no guard fails and nothing recompiles.")
        if cpu:
            return (f"{share:.0f}% is per-operator dispatch between operators{where} (Python, framework overhead, "
                    "the profiler's own cost): fuse operator chains with torch.compile, give each operator more "
                    "work (a larger batch), and move per-token Python work (sampling, logging) out of the loop.")
        return _overhead(f"{share:.0f}% is the framework's per-operator work between launches{where}",
                         ": Python, dispatch and allocation (the launch calls themselves take less). To remove it, ",
                         graphs, graph_run)
    if kind == "launch":
        head = f"The host was inside launch calls for {share:.0f}% of the idle time"
        long = _long_launch(idle)
        if long is not None:  # blocked calls, not the per-launch cost: graphs would not remove it
            api, n, of_pct, longest_ns, first = long
            calls = (f"one {api} call of {duration(longest_ns)}" if n == 1 else
                     f"{n:,} {api} calls of {duration(LONG_LAUNCH_NS)} or longer (the longest {duration(longest_ns)})")
            return (f"{head}, {of_pct:.0f}% of it in {calls}: {blocked_launch_text(n, first=first, queue_empty=True)}; what "
                    "remains is the per-launch cost.")
        return _overhead(head, ": the CPU cannot queue kernels as fast as the GPU runs them. Remove launches rather "
                         "than speeding them up: ", graphs, graph_run)
    if kind == "cpu compute":
        ops = _names(items, kind, ("op",))
        fns = _names(items, kind, ("function", "range"))
        what = f": {', '.join(ops)}" if ops else ""
        inside = f" in {', '.join(fns)}" if fns else ""
        if cpu:
            return (f"For {share:.0f}% of the time between operators the host computed outside torch{what}{inside}. "
                    "Do that math with torch operators (or once, outside the loop), or overlap it in another thread.")
        return (f"For {share:.0f}% of the idle time the host computed on host tensors{what}{inside}, with no "
                "device work queued. Move or overlap this host work: keep the tensors and the math on the GPU, or "
                "run it for the next step while the GPU runs this one (another thread or a side stream). CUDA "
                "graphs cannot capture host math, so they would not help.")
    if kind == "waiting":
        return wait_advice(share, idle, where, cpu)
    if kind == "host code":
        jit, total, compilers = jit_time(idle)
        if total > 0 and jit >= JIT_SHARE * total:
            shown = [function_name(n) or n for n in compilers[:3]]
            named = "" if set(shown) <= set(names) else f" ({', '.join(shown)})"  # not the names said just before
            return (f"For {share:.0f}% of the {'time between operators' if cpu else 'idle time'} the host ran its own "
                    f"code{where}; {100 * jit / total:.0f}% of that is under a compiler{named}: kernels being "
                    "compiled (JIT), a cost of a first run, not of every step. Run the step once before profiling so "
                    "that compilation is not in the measured time, and keep compiled kernels cached across runs "
                    "(Inductor's and Triton's caches, nvFuser's kernel cache); if it recurs in a steady state, "
                    "shapes or guards change between steps and recompile. CUDA graphs would not remove it.")
        unnamed, host = unnamed_host_ns(idle)
        part = unnamed / host if host > 0 else 0.0
        span = "time between operators" if cpu else "idle time"
        said = []
        if part < 1.0 - UNNAMED_SHARE:  # the host code that a range, function or operator names
            head = (f"For {share * (1 - part):.0f}% of the time between operators the host ran its own code{where}"
                    if cpu else f"For {share * (1 - part):.0f}% of the idle time the host ran its own code{where}, "
                    "with no launch, copy or sync in flight")
            said.append(head + host_work_advice(items, cpu)
                        + ("" if cpu else " Launch overhead is not the cause: CUDA graphs would not remove it."))
        if part >= UNNAMED_SHARE:
            stacks = "function" in idle and bool(idle["function"].notna().any())  # the trace recorded Python calls
            record = ("Python stacks were recorded and none covers this time, so the host was in native code or "
                      "waited outside Python: ranges around the loop's host code (record_function, NVTX) or Nsight "
                      "Systems' CPU sampling (--sample=cpu) name it" if stacks else
                      "ranges around the loop's host code (record_function, NVTX), Python stacks (torch.profiler's "
                      "with_stack=True) or Nsight Systems' CPU sampling (--sample=cpu) name it")
            said.append(f"For {share * part:.0f}% of the {span} the host was in no recorded operator, range, Python "
                        f"function{'' if cpu else ' or CUDA call'}: the trace does not show what it did (its own code, a "
                        f"sleep, I/O or a lock wait look the same without a record). Record it before changing "
                        f"anything: {record}.{'' if cpu else ' No launch was in flight: CUDA graphs would not remove it.'}")
        return " ".join(said)
    if kind == "sync":
        return sync_advice(share, idle)
    if kind == "copy":
        return copy_advice(share, idle, where)
    if kind == "graph":
        return graph_gap_advice(share, idle)
    if kind == "untraced":
        return (f"For {share:.0f}% of the idle time the host ran no recorded call, in gaps before kernels whose launch "
                f"call the trace lacks{where}: the API trace is missing records there (thinned, filtered or lost), so "
                "whether the host ran its own code or sat in a launch, copy or sync is unknown. Record the full API "
                "trace (rocprofv3 --hip-trace without a filter) before moving host work.")
    if kind == "unrecorded":
        return (f"{unrecorded_text(unrecorded_facts(idle))}. Re-profile without the kernel filter (rocprofv3 without "
                "--kernel-include-regex / --kernel-exclude-regex, the whole dispatch range, no sampling) to measure it, "
                "or read the rest as measured.")
    if kind == "profiler":
        return _profiler_advice(share, idle[idle["cause"] == "profiler"])
    return (f"{share:.0f}% has no host activity around it: the host side was not recorded there, so its cause is "
            "unknown. Record the CPU side "
            "too (torch.profiler with ProfilerActivity.CPU and with_stack=True, nsys with --trace=cuda,nvtx,osrt) "
            "to see why the GPU waits.")


SMALL_COPY_BYTES = 4096
"""Copies to the host of this size or less on average are waits for the device, not transfers of data."""


def _pinned_text(pin: pd.Series) -> str:
    """``all`` / ``none`` / ``3 of 8`` / ``unknown``: how many of the copies read or wrote pinned host memory."""
    pin = pin.dropna().astype(bool)
    return "unknown" if not len(pin) else "all" if pin.all() else "none" if not pin.any() else \
        f"{int(pin.sum())} of {len(pin)}"


def copy_advice(share: float, idle: pd.DataFrame, where: str = "") -> str:
    """What the ``copy`` idle time (``share`` % of the idle time ``idle``) moved and which way (the direction its
    calls name: ``cudaMemcpyAsync (HtoD)``), each direction at :data:`HOST_WORK_SHARE` or more of the copy time
    with its advice: to the device, keep data used again resident, pin and prefetch new data (the trace does not
    show which it is); to the host, copy back less and read it later, or, for small copies
    (:data:`SMALL_COPY_BYTES`), read it later; a direction the trace does not record, both."""
    rows = idle[value_mask(idle, "cause", lambda v: v == "copy")]
    once = rows[rows["correlation"].notna()].drop_duplicates("correlation")
    moved = float(once["bytes"].sum()) if len(once) and once["bytes"].notna().any() else math.nan
    rate = moved / (float(rows["duration_ns"].sum()) / 1e9) if len(rows) else math.nan
    head = (f"For {share:.0f}% of the idle time the host was inside host<->device copies{where}: {len(once)} "
            f"copies of {nbytes(moved)} ({si(rate, 'B/s')} over the idle time they cause; host memory pinned: "
            f"{_pinned_text(once['pinned'])}). The GPU waits for data, not for launches, so CUDA graphs would change "
            "nothing.")
    way_of = rows["api"].astype(object).str.extract(r"\((HtoD|DtoH)\)$", expand=False).fillna("")
    ns = rows["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    total = float(np.nansum(ns))
    parts = []
    for way in ("HtoD", "DtoH", ""):
        mine = (way_of == way).to_numpy()
        if not total > 0 or float(np.nansum(ns[mine])) / total < HOST_WORK_SHARE:
            continue
        frac = float(np.nansum(ns[mine])) / total
        these = once[(way_of.loc[once.index] == way).to_numpy()]
        n, sizes = len(these), these["bytes"].dropna()
        pinned = _pinned_text(these["pinned"])
        pin_tip = "" if pinned == "all" else "pin the host memory and copy with non_blocking=True (a queued DMA), "
        amount = f"{n} cop{'ies' if n != 1 else 'y'}, {nbytes(float(sizes.sum())) if len(sizes) else 'size unknown'}"
        if way == "HtoD":  # the trace has no content: whether it is the same data each step is not shown
            parts.append(f"{frac:.0%} ({amount}) went to the device: if it is the same data each time (weights, "
                         "constants), keep it resident on the device; if it is new data (inputs), "
                         f"{pin_tip}and prefetch the next piece on a side stream while the GPU computes on this one")
        elif way == "DtoH":
            each = float(sizes.mean()) if len(sizes) else math.nan
            if each <= SMALL_COPY_BYTES:
                parts.append(f"{frac:.0%} ({amount}) came back to the host, {nbytes(each)} each on average: the "
                             "wait is for the device to finish, not for the bytes, so read the value a step later and "
                             "queue the next step first")
            else:
                parts.append(f"{frac:.0%} ({amount}) came back to the host: copy back only what the host reads (the "
                             f"chosen index or a reduced value, not the whole tensor), {pin_tip}and read it a step "
                             "later, so that the next step is queued first")
        else:
            parts.append(f"{frac:.0%} ({amount}) went a way the trace does not record: {pin_tip}keep data that "
                         "is used again resident on the device, and overlap the copies with compute on a side stream")
    return head + (" Of that time, " + "; ".join(parts) + "." if parts else "")


WAIT_CLASSES = (
    ("sleeps", re.compile(r"^(sleep|nanosleep|clock_nanosleep|usleep)$", re.IGNORECASE),
     "slept ({names})", "a sleep in the loop is time the host chose to lose: remove it, or wait on the event it "
     "stands for (a queue, a condition) instead of a fixed time"),
    ("locks", re.compile(r"^(acquire|futex|pthread_(cond_(timed)?wait|mutex_(timed)?lock|rwlock_\w+|join)|"
                         r"sem_(timed)?wait|wait|waitpid|wait4|waitid)$", re.IGNORECASE),
     "waited on a lock, another thread or a process ({names})",
     "it waited for a producer (a data-loader worker, a tokenizer or scheduler thread, another process) or for a "
     "lock another thread held: keep the producer ahead (more workers, a deeper queue, prefetch), and do not take "
     "locks on the launching thread"),
    ("polls", re.compile(r"^(select|poll|ppoll|pselect\d*|epoll_p?wait\d*)$", re.IGNORECASE),
     "waited for a file or socket to be ready ({names})",
     "an event loop or a pipe from a worker with nothing to read yet: in a server with an empty queue that is idle "
     "time, not a cost; otherwise feed it from a background thread so the next work is ready"),
    ("I/O", re.compile(r"^(p?read\w*|recv\w*|p?write\w*|send\w*|f?open\w*|fread|fwrite|accept\d*|connect|"
                       r"fsync|fdatasync|mmap\w*|stat\w*)$", re.IGNORECASE),
     "did file or network I/O ({names})",
     "read ahead or cache it in memory, and do it in a background thread or with non-blocking I/O"),
    ("driver calls", re.compile(r"^ioctl$", re.IGNORECASE),
     "was in driver calls ({names})",
     "the device driver's own work outside the traced CUDA API (memory allocation and mapping, a library's "
     "synchronisation); the trace does not say which: CPU samples of the thread with backtraces (nsys "
     "--sample=cpu --backtrace=dwarf) name the caller"),
)
"""What the host waited in, by the blocking call's name (Python's or the OS runtime's): (label, name pattern, what
the host did, advice); a call none names is said by its name, with the advice to take it off the launching
thread."""


def wait_advice(share: float, idle: pd.DataFrame, where: str = "", cpu: bool = False) -> str:
    """What the ``waiting`` idle time (``share`` % of the idle time ``idle``) blocked in, by its calls
    (:data:`WAIT_CLASSES`), each class at :data:`HOST_WORK_SHARE` or more with its share and its advice."""
    span = "the time between operators" if cpu else "the idle time"
    head = f"For {share:.0f}% of {span} the host waited{where}{'' if cpu else ', with the device queue empty'}"
    rows = idle[np.asarray(kinds_of(idle)) == "waiting"] if len(idle) else idle
    if not len(rows) or "wait" not in rows:
        return head + ". Take the wait off the launching thread, or queue the next device work before it."
    names = rows["wait"].astype(object).fillna("")
    ns = pd.Series(rows["duration_ns"].to_numpy(np.float64, na_value=np.nan), index=rows.index)
    label = map_distinct(names, lambda n: next((lab for lab, pat, _, _ in WAIT_CLASSES if pat.match(str(n))),
                                               f"call:{n}" if n else "call:")).to_numpy(object)
    by = ns.groupby(label).sum().sort_values(ascending=False, kind="stable")
    total = float(by.sum())
    what = {lab: (text, advice) for lab, _, text, advice in WAIT_CLASSES}
    parts = []
    for lab, t in by.items():
        if not total > 0 or t / total < HOST_WORK_SHARE:
            continue
        mine = label == lab
        called = ns[mine].groupby(names[mine].to_numpy(object)).sum().sort_values(ascending=False, kind="stable")
        shown = ", ".join(str(n) for n in called.index[:3] if n) or "unnamed calls"
        if str(lab).startswith("call:"):
            parts.append(f"{t / total:.0%} blocked in {shown}, a blocking call perfscope does not classify: take it off the "
                         "launching thread, or queue the next device work before it")
            continue
        text, advice = what[str(lab)]
        parts.append(f"{t / total:.0%} {text.format(names=shown)}: {advice}")
    rest = total - sum(t for t in by if total > 0 and t / total >= HOST_WORK_SHARE)
    if total > 0 and rest > 0:
        parts.append(f"the other {rest / total:.0%} in calls of under {HOST_WORK_SHARE:.0%} each")
    return head + (". Of that time, " + "; ".join(parts) + "." if parts else ".")


NODE_GAP_NS = 5_000
"""A gap between two nodes of a graph replay up to this long is the device's own cost per node (about 0.5-3 µs
measured between the nodes of a replay: 0.45 µs median on the H200, 1 ns on the MI300X's vLLM graph); a longer
one is the graph waiting on something inside itself."""


def graph_gap_advice(share: float, idle: pd.DataFrame) -> str:
    """What the ``graph`` idle time (``share`` % of the idle time ``idle``) is, by its gaps' lengths: gaps of
    :data:`NODE_GAP_NS` or less are the device's per-node cost (fewer, larger nodes shorten them), longer ones a
    dependency inside the graph the trace does not show (what to dump to see it)."""
    head = (f"{share:.0f}% lies between the nodes of graph replays: the device runs them back to back by itself and "
            "no host call is involved, so no host change shortens it")
    rows = idle[value_mask(idle, "cause", lambda v: v == "graph")] if len(idle) else idle
    if not len(rows):
        return head + "."
    gaps = rows.groupby([rows["device"].astype(object), rows["gap"].astype(object)], sort=False)["duration_ns"].sum()
    ns = gaps.to_numpy(np.float64, na_value=np.nan)
    total = float(np.nansum(ns))
    replays = int(rows["correlation"].nunique()) if "correlation" in rows else 0
    short = ns <= NODE_GAP_NS
    parts = []
    if total > 0 and float(ns[short].sum()) / total >= HOST_WORK_SHARE:
        parts.append(f"{float(ns[short].sum()) / total:.0%} in {int(short.sum()):,} gaps of {duration(NODE_GAP_NS)} "
                     f"or less (median {duration(float(np.median(ns[short])))}), the device's own cost per node: "
                     "fewer, larger nodes shorten it (fuse the small kernels inside the captured region, "
                     "torch.compile)")
    if total > 0 and float(ns[~short].sum()) / total >= HOST_WORK_SHARE:
        parts.append(f"{float(ns[~short].sum()) / total:.0%} in {int((~short).sum()):,} gaps over "
                     f"{duration(NODE_GAP_NS)} (median {duration(float(np.median(ns[~short])))}, the largest "
                     f"{duration(float(ns[~short].max()))}), far longer than a node's own cost: the graph waited "
                     "inside itself on something the trace does not show (an event from another stream or from the "
                     "host, a host-function node, a memory node); dump the graph (PyTorch's graph.enable_debug_mode() "
                     "before capture and graph.debug_dump(path) after, cudaGraphDebugDotPrint) to see what those "
                     "nodes wait on")
    where = f" ({counted(replays, 'replay')})" if replays else ""
    return head + (f". Of that time{where}, " + "; ".join(parts) + "." if parts else ".")


COPY_OPS = re.compile(r"^aten::(to|_to_copy|copy_|cpu|cuda|tolist|numpy)$")
"""The operators that copy between host and device: a sync behind one waited for its copy."""

SYNC_MECHANISMS = (
    ("reads", re.compile(r"^aten::(item|_local_scalar_dense)$"),
     "read a value to the host ({names}: .item(), int(t), float(t))",
     "keep the value on the device (torch.where and masked ops instead of a Python branch, sampling and stop "
     "checks on the GPU), or read it a step later"),
    ("branches", re.compile(r"^aten::(is_nonzero|equal|allclose)$"),
     "branched on a device tensor ({names}: a Python if, while or assert on a tensor)",
     "replace the branch with device ops (torch.where, masked_fill, torch._assert_async), or test it every N "
     "steps instead of every step"),
    ("sizes", re.compile(r"^aten::(nonzero|masked_select|unique|_unique2|unique_dim|unique_consecutive|"
                         r"repeat_interleave|bincount|index|index_put_|_index_put_impl_|masked_scatter|where)$"),
     "ran operators whose output size depends on the data ({names}: boolean-mask indexing, nonzero, unique, "
     "repeat_interleave), so the host had to read that size",
     "give the size ahead (torch.nonzero_static(size=...), repeat_interleave(output_size=...)) or keep the shapes "
     "static with masks (torch.where, masked_fill)"),
    ("copies to the host", COPY_OPS,
     "copied results to the host ({names}: .cpu(), .to('cpu'), .tolist())",
     "copy with non_blocking=True into pinned memory and wait on an event only where the value is used, or use it "
     "a step later"),
    ("copies from pageable memory", COPY_OPS,
     "copied data from pageable host memory to the device ({names}: .to('cuda') of an unpinned tensor, which "
     "returns only once the copy is done)",
     "pin the source (tensor.pin_memory(), DataLoader(pin_memory=True)) and copy with non_blocking=True, so the "
     "copy is queued like a kernel and overlaps the work queued before it"),
    ("copies", COPY_OPS,
     "copied between host and device ({names}; the trace does not say which way: a copy to the host waits for "
     "the device, and so does one from unpinned host memory)",
     "use pinned host memory with non_blocking=True and wait on an event only where the data is used"),
)
"""How a sync the trace shows behind an operator drained the queue, by that operator: (label, operator pattern,
what the host did, advice). Calls with no operator around them are explicit synchronisations
(:func:`sync_advice`); an operator none of these names synchronised for a reason the trace does not show."""

SYNC_EXPLICIT = ("called {names} outside any operator ({calls}, or a library's)",
                 "take them out of the step: to time code record CUDA events and read elapsed_time after the run; to "
                 "wait for one result wait on its stream's event, after queueing the next work")
"""The sync calls that no operator is behind in a trace that records operators: explicit synchronisations."""

SYNC_UNATTRIBUTED = ("called {names}, and the trace records no operators, so what made the call is not shown",
                     "record the CPU side (torch.profiler with ProfilerActivity.CPU; nsys with NVTX ranges from "
                     "torch.autograd.profiler.emit_nvtx) to see whether an operator (.item(), .cpu(), a size that "
                     "depends on the data) or the code itself synchronised")
"""The sync calls of a trace that records no operators (a GPU-only trace, Nsight Systems without NVTX)."""

SYNC_CALLS = ((re.compile(r"devicesynchroni[sz]e", re.IGNORECASE), "torch.cuda.synchronize()"),
              (re.compile(r"streamsynchroni[sz]e", re.IGNORECASE), "stream.synchronize()"),
              (re.compile(r"eventsynchroni[sz]e", re.IGNORECASE), "event.synchronize()"),
              (re.compile(r"memcpy.*dtoh|dtoh.*memcpy", re.IGNORECASE), ".cpu()"))
"""The Python call that makes each synchronising API call when no operator is behind it."""


def _copy_ways(idle: pd.DataFrame) -> pd.DataFrame:
    """Per (device, gap, op) of ``idle``, the direction its copy calls name (``way``: ``HtoD``, ``DtoH``, ``HtoH``,
    from their ``api``: ``cudaMemcpyAsync (HtoD)``), where one direction is named."""
    api = idle["api"].astype(object)
    rows = idle.assign(way=api.str.extract(r"\((HtoD|DtoH|HtoH)\)$", expand=False))
    rows = rows[rows["way"].notna().to_numpy()]
    key = [rows[c].astype(object) for c in ("device", "gap", "op")]
    ways = rows.groupby(key, sort=False)["way"].agg(["first", "nunique"])
    return ways.loc[ways["nunique"] == 1, ["first"]].rename(columns={"first": "way"}).rename_axis(
        ["device", "gap", "op"]).reset_index()


COPY_WAYS = {"DtoH": "copies to the host", "HtoD": "copies from pageable memory", "HtoH": "copies"}
"""The mechanism of a sync behind a copy operator, by the direction of the copy (:func:`_copy_ways`)."""


def _sync_label(op: object, ops_recorded: bool) -> str:
    """The mechanism of a sync behind ``op`` (:data:`SYNC_MECHANISMS`; ``copies`` for a copy operator, whose
    direction :func:`sync_groups` reads), ``explicit`` / ``unattributed`` with none, ``op:NAME`` for another."""
    if not isinstance(op, str) or not op:
        return "explicit" if ops_recorded else "unattributed"
    if COPY_OPS.match(op):
        return "copies"
    return next((lab for lab, pat, _, _ in SYNC_MECHANISMS if pat.match(op)), f"op:{op}")


def _ops_recorded(idle: pd.DataFrame) -> bool:
    """Whether the trace behind ``idle`` records operators in its gaps: the ``op`` column's categories are the
    whole table's, so a part of it (a phase's steps, where no gap holds one) still knows."""
    if "op" not in idle:
        return False
    op = idle["op"]
    return len(op.cat.categories) > 0 if isinstance(op.dtype, pd.CategoricalDtype) else bool(op.notna().any())


def sync_groups(idle: pd.DataFrame) -> list[tuple[str, float, int, list[str], list[str]]]:
    """The ``sync`` idle slices of ``idle`` by how they drained the queue (:data:`SYNC_MECHANISMS`; a copy
    operator's by its copy's direction, from the call (``cudaStreamSynchronize (HtoD)``) or the copy calls of its
    gap; ``explicit`` for calls with no operator behind them in a trace that records operators, ``unattributed``
    in one that records none, ``op:NAME`` for another operator): (label, ns, gaps, names, ranges), most time
    first; names are the operators (or the calls) most time first, ranges the ranges around them. Grouped on the
    distinct operators and calls, not row by row."""
    if not len(idle) or "cause" not in idle:
        return []
    rows = idle[value_mask(idle, "cause", lambda v: v == "sync")]
    if not len(rows):
        return []
    ops_recorded = _ops_recorded(idle)
    frame = pd.DataFrame({c: (rows[c].astype(object).to_numpy() if c in rows else np.full(len(rows), None, object))
                          for c in ("device", "gap", "op", "api", "range")})
    frame["ns"] = rows["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    frame["label"] = map_distinct(frame["op"], lambda o: _sync_label(o, ops_recorded)).to_numpy(object)
    copies = np.flatnonzero((frame["label"] == "copies").to_numpy())
    if len(copies):  # the direction: the call's own (named by the classification), else its gap's copy calls'
        part = frame.iloc[copies]
        own = part["api"].astype(object).str.extract(r"\((HtoD|DtoH|HtoH)\)$", expand=False)
        gap_way = part[["device", "gap", "op"]].merge(_copy_ways(idle), how="left", on=["device", "gap", "op"])["way"]
        way = own.fillna(pd.Series(gap_way.to_numpy(object), index=own.index))
        frame.loc[part.index, "label"] = way.map(lambda w: COPY_WAYS.get(w, "copies")).to_numpy(object)
    frame["name"] = frame["op"].where(frame["op"].map(lambda o: isinstance(o, str) and bool(o)), frame["api"])
    out = []
    for lab, g in frame.groupby("label", sort=False):
        names = g.groupby("name", sort=False)["ns"].sum().sort_values(ascending=False, kind="stable")
        rng = g[g["range"].map(lambda r: isinstance(r, str) and bool(r)).to_numpy()
                & (g["range"] != g["name"]).to_numpy()]
        ranges = rng.groupby("range", sort=False)["ns"].sum().sort_values(ascending=False, kind="stable")
        gaps = len(g[["device", "gap"]].drop_duplicates())
        out.append((str(lab), float(np.nansum(g["ns"])), gaps, [str(n) for n in names.index[:2]],
                    [str(r) for r in ranges.index[:2]]))
    return sorted(out, key=lambda x: -x[1])


def sync_advice(share: float, idle: pd.DataFrame) -> str:
    """What the ``sync`` idle time (``share`` % of the idle time ``idle``) was, from the operators behind
    its calls (:func:`sync_groups`), each group at :data:`HOST_WORK_SHARE` or more with its share and its advice;
    an operator that synchronised for a reason the trace does not show is said to be unexplained."""
    head = (f"For {share:.0f}% of the idle time the host was blocked in a synchronisation or had just returned from "
            "one, so the device ran dry with nothing queued ahead (CUDA graphs would not remove it)")
    groups = sync_groups(idle)
    total = sum(g[1] for g in groups)
    if not total > 0:
        return head + ". Remove or defer the sync, or queue the next work before it."
    what = {lab: (text, advice) for lab, _, text, advice in SYNC_MECHANISMS}
    what["explicit"], what["unattributed"] = SYNC_EXPLICIT, SYNC_UNATTRIBUTED
    parts = []
    for lab, ns, gaps, names, rngs in groups:
        if ns / total < HOST_WORK_SHARE:
            continue
        inside = f" in {', '.join(rngs)}" if rngs else ""
        count = counted(gaps, 'gap')
        if lab.startswith("op:"):
            parts.append(f"{ns / total:.0%} ({count}) behind {lab[3:]}{inside}, which synchronised for a reason the "
                         "trace does not show (an output size or a value read to the host): its Python stack "
                         "(with_stack=True) or its source says which, and that decides the fix")
            continue
        text, advice = what[lab]
        calls = [py for api in names for pat, py in SYNC_CALLS if pat.search(api)]
        text = text.format(names=", ".join(names) or "synchronisations",
                           calls=", ".join(dict.fromkeys(calls)) or "a synchronize call")
        parts.append(f"{ns / total:.0%} ({count}) {text}"
                     f"{inside}: {advice}")
    rest = [g for g in groups if g[1] / total < HOST_WORK_SHARE]
    if rest:
        names = list(dict.fromkeys(n for g in rest for n in g[3]))[:3]
        parts.append(f"the other {pct_text(100 * sum(g[1] for g in rest) / total, 0)} "
                     f"({counted(sum(g[2] for g in rest), 'gap')}) behind "
                     f"{', '.join(names) or 'other calls'}")
    return head + ". Of it, " + "; ".join(parts) + "."


def _profiler_advice(share: float, rows: pd.DataFrame) -> str:
    """What the profiler's own time (``rows``, :data:`..idle.CAUSES` ``profiler``) was, by the calls it fell in:
    launch calls in which it replayed each kernel to count hardware counters (a trace that says it collected
    them, ``report.params['counter_replays']``), else its buffer flushes and start-up."""
    calls = rows["api"].astype("object") if "api" in rows else pd.Series(None, index=rows.index, dtype=object)
    launch = value_mask(rows.assign(api=calls), "api", lambda a: a is not None and LAUNCH_API.search(str(a)) is not None)
    dur = rows["duration_ns"].to_numpy(np.float64, na_value=0.0)
    total = float(dur.sum())
    replay = pct(float(dur[launch].sum()), total) if total > 0 else 0.0
    said = []
    if replay > 0:
        names = calls[launch].dropna().astype(str)
        api = names.mode().iloc[0] if len(names) else "launch"
        said.append(f"For {share * replay / 100:.0f}% of the idle time the host was inside {int(launch.sum()):,} {api} "
                    f"calls (the longest {duration(float(dur[launch].max()))}) in which the "
                    "profiler replayed each kernel to collect hardware counters (the trace holds its counter records: "
                    "CUPTI's range profiler, torch.profiler's experimental_config profiler_metrics), not in the "
                    "launches themselves. This is measurement overhead, not the program's: time the run without "
                    "counter collection, and collect counters in a run of their own (or with Nsight Compute on the "
                    "kernels that matter).")
    if replay < 100:
        said.append(f"For {share * (100 - replay) / 100:.0f}% of the idle time the profiler itself was working (buffer "
                    "flushes, start-up). This is measurement overhead, not the program's: profile more steps after a "
                    "warm-up (torch.profiler.schedule), record fewer event kinds (with_stack, record_shapes off), and "
                    "read the other causes.")
    return " ".join(said)


LONG_LAUNCH_NS = 1_000_000
"""A launch slice this long is one blocked call (a launch itself takes 5-20 µs)."""


def blocked_launch_text(n: int, *, replays: int = 0, first: int | None = None, queue_empty: bool = False) -> str:
    """Why ``n`` launch calls of :data:`LONG_LAUNCH_NS` or more took that long, from what the trace shows, and what
    to do: the profiler's counter replay when the trace holds its records (``replays``: how many); else the
    causes the trace rules out (``queue_empty``: the GPU had nothing queued during the calls, idle or running
    each kernel as its call returned, so no full launch queue held them) and ``first``, how many of them
    launched a kernel for the first time in the trace (module loading), None when the trace does not say which
    kernels they launched."""
    calls = "this call was" if n == 1 else "these calls were"
    head = f"a launch costs 5-20 µs, so {calls} blocked"
    if replays:
        return (f"{head} by the profiler: it replayed each kernel inside its launch call to collect hardware counters "
                f"(the trace holds counter records of {replays:,} launches). Time the run without counter collection")
    ruled_out = "the trace records no counter collection"
    if queue_empty:
        ruled_out = (f"the GPU had nothing queued while {'it' if n == 1 else 'they'} ran (it was idle, or ran the "
                     f"kernel as the call returned), so no full launch queue held {'it' if n == 1 else 'them'}, and "
                     + ruled_out)
    load = ("loading its code module (lazy loading, JIT compilation). Run the step once before profiling so that "
            "loading is not in the measured time")
    unknown = "a driver lock, another process on the GPU, the host being descheduled" + ("" if queue_empty else
                                                                                       ", a full launch queue")
    if first is None:
        cause = f"The likeliest cause left is a kernel's first launch {load}"
    elif first == n:
        cause = (f"{'It' if n == 1 else 'Each'} launched a kernel for the first time in the trace: {load}")
    elif first:
        cause = (f"{first} of them launched a kernel for the first time in the trace ({load}); what blocked the "
                 f"other {n - first}, which launched kernels launched before, the trace does not show ({unknown})")
    else:
        cause = (f"{'It' if n == 1 else 'Each'} launched a kernel launched before in the trace, so it was not "
                 f"module loading: what blocked {'it' if n == 1 else 'them'} the trace does not show ({unknown})")
    return f"{head}; {ruled_out}. {cause}"


def blocked_calls(calls_ns: np.ndarray) -> np.ndarray | None:
    """Which launch calls (or launch slices) of ``calls_ns`` were blocked: those of :data:`LONG_LAUNCH_NS` or
    more, when together they hold at least half of the time (one blocked call, or a profiler's replay inside
    every launch); None when they do not, and the time is the per-launch cost."""
    long = calls_ns >= LONG_LAUNCH_NS
    return long if long.any() and float(calls_ns[long].sum()) >= 0.5 * float(np.nansum(calls_ns)) else None


def _long_launch(idle: pd.DataFrame) -> tuple[str, int, float, float, int | None] | None:
    """(call, how many, their % of the launch time, the longest's ns, how many launched the first kernel of its name
    in the trace: None where the table does not say for each) of the blocked launch slices of ``idle``
    (:func:`blocked_calls`), else None. ``call``: the longest one's API."""
    if not len(idle):
        return None
    at = np.flatnonzero(np.asarray(kinds_of(idle)) == "launch")
    if not len(at):
        return None
    dur = idle["duration_ns"].to_numpy(np.float64, na_value=np.nan)[at]
    long = blocked_calls(dur)
    if long is None:
        return None
    big = int(np.nanargmax(dur))
    api = idle["api"].iloc[at[big]] if "api" in idle else None
    first = None
    if "first_launch" in idle:
        said = idle["first_launch"].astype("boolean").to_numpy(dtype=object, na_value=None)[at[long]]
        first = None if any(v is None for v in said) else int(sum(bool(v) for v in said))
    return (str(api) if api else "launch", int(long.sum()), 100.0 * float(dur[long].sum()) / float(np.nansum(dur)),
            float(dur[big]), first)


def _overhead(head: str, why: str, graphs: bool, graph_run: str | None) -> str:
    """Advice on dispatch or launch time: what to do in a run that already replays graphs (``graph_run``),
    the fact alone when another kind leads (``graphs`` False), else why and :data:`GRAPHS_TEXT`."""
    if graph_run:
        return f"{head}. {graph_run}"
    return f"{head}{why}{GRAPHS_TEXT}." if graphs else f"{head}."


def idle_advice(idle: pd.DataFrame, items: Sequence[Item], *, cpu: bool = False, compiled_cpu: bool = False,
                graph_run: str | None = None) -> tuple[str, dict[str, float]]:
    """Advice for the gaps ``idle`` from their kinds, largest share first (each kind with at least
    :data:`ADVISE_MIN_PCT` of the time, the largest always), and the ns per kind."""
    totals = kind_totals(idle)
    # unrecorded time (dispatches the trace lacks) is said first and is not idle: the other kinds' shares are of
    # the idle time as measured, the rest
    total = sum(v for k, v in totals.items() if k != "unrecorded")
    graphs = graphs_remove(idle, totals)
    ranked_kinds = [k for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v > 0 and k != "unrecorded"]
    chosen = [k for i, k in enumerate(ranked_kinds) if i == 0 or pct(totals[k], total) >= ADVISE_MIN_PCT]
    if totals.get("unrecorded", 0.0) > 0:
        chosen.insert(0, "unrecorded")
    parts, told = [], False  # the graph advice (capture, or what a graph run leaves) is said once
    for k in chosen:
        share = pct(totals[k], total)
        if k in GRAPH_KINDS and told:
            fact = kind_advice(k, share, items, idle, cpu=cpu, compiled_cpu=compiled_cpu, graphs=False)
            parts.append(fact[:-1] + ": the same capture and fusion remove it." if graphs and not (cpu or graph_run)
                         else fact)
            continue
        parts.append(kind_advice(k, share, items, idle, cpu=cpu, compiled_cpu=compiled_cpu,
                                 graphs=graphs and k in GRAPH_KINDS, graph_run=graph_run))
        told |= graphs and k in GRAPH_KINDS
    return " ".join(parts), totals


def graphs_remove(idle: pd.DataFrame, totals: dict[str, float]) -> bool:
    """Whether CUDA graphs / fusion address the largest share of the gaps ``idle`` (kind totals ``totals``):
    dispatch or launch leads (:func:`graphs_help`), and when launch leads, its time is the per-launch cost,
    not calls blocked for a millisecond or more (:func:`_long_launch`), which a graph replay would not remove."""
    if not graphs_help(totals):
        return False
    return largest_kind(totals) != "launch" or _long_launch(idle) is None


def kind_evidence(totals: dict[str, float], idle: pd.DataFrame) -> dict[str, float | int | str]:
    """``idle_<kind>_ns`` / ``_pct`` for every kind (spaces as underscores), the largest kind, and the gap
    sizes weighted by time."""
    total = sum(totals.values())
    ev: dict[str, float | int | str] = {}
    for k in HOST_KINDS:
        key = k.replace(" ", "_")
        ev[f"idle_{key}_ns"] = totals.get(k, 0.0)
        ev[f"idle_{key}_pct"] = pct(totals.get(k, 0.0), total)
    lead = largest_kind(totals)  # the lead of the idle time as measured (never unrecorded)
    if lead is not None:
        ev["idle_kind"] = lead
    lengths = gap_lengths(measured(idle))  # gaps over which the trace lacks dispatches are not idle gaps
    if len(lengths):
        ev["gap_sizes"] = gap_sizes_text(lengths)
    return ev


def gap_table(idle: pd.DataFrame) -> pd.DataFrame:
    """One row per gap of ``idle``: device, gap, start_ns, end_ns, idle_ns and kind (the kind holding most of
    its time), sorted by device and end. Grouped on integer codes: linear in the slices."""
    cols = ["device", "gap", "start_ns", "end_ns", "idle_ns", "kind"]
    if not len(idle):
        return pd.DataFrame(columns=cols)
    gid = gap_ids(idle)
    n = int(gid.max()) + 1
    first = np.flatnonzero(~pd.Series(gid).duplicated().to_numpy())
    dur = idle["duration_ns"].to_numpy(np.float64, na_value=np.nan)
    start = pd.Series(idle["start_ns"].to_numpy(np.int64)).groupby(gid).min().to_numpy()
    end = pd.Series(idle["end_ns"].to_numpy(np.int64)).groupby(gid).max().to_numpy()
    kc, kd = kind_codes(idle)
    width = len(kd) + 1
    pair, _ = pd.factorize(gid * width + (kc + 1))  # (gap, kind), in order of first appearance
    pair_first = np.flatnonzero(~pd.Series(pair).duplicated().to_numpy())
    by_kind = pd.DataFrame({"gid": gid[pair_first], "kind": kc[pair_first],
                            "dur": np.bincount(pair, weights=dur)})
    lead = by_kind.sort_values("dur", ascending=False, kind="stable").drop_duplicates("gid")
    kind = np.full(n, -1, np.int64)
    kind[lead["gid"].to_numpy()] = lead["kind"].to_numpy()
    dc, dd = column_codes(idle, "device")
    dev = dc[first]
    rank = np.argsort(np.argsort(np.array([str(d) for d in dd.tolist()], dtype=object), kind="stable"), kind="stable")
    order = np.lexsort((end, np.append(rank, -1)[dev]))  # by device name, then end (stable)
    return pd.DataFrame({
        "device": pd.Series(decode(dev, dd)[order], dtype=object),
        "gap": idle["gap"].to_numpy(np.float64, na_value=np.nan)[first][order],
        "start_ns": start[order], "end_ns": end[order],
        "idle_ns": np.bincount(gid, weights=dur, minlength=n)[order],
        "kind": pd.Series(decode(kind, kd)[order], dtype=object),
    }, columns=cols)


def grouped_items(kinds: np.ndarray, time_ns: np.ndarray, starts: np.ndarray, ends: np.ndarray, what: str,
                  attrs: dict[str, float | int | str] | None = None) -> list[Item]:
    """One item per kind of the gaps in front of some work (``what``: "short kernels"), with the time each kind
    holds (``time_ns``, per gap) and the largest gap's place."""
    items = []
    for kind in pd.unique(kinds):
        at = np.flatnonzero(kinds == kind)
        total = float(time_ns[at].sum())
        if not total > 0:
            continue
        big = at[np.argmax(time_ns[at])]
        label = f"{duration(total)} in the {counted(len(at), 'gap')} before {what} that are mostly {kind}"
        items.append(Item("gaps", label, total, str(kind) in EXPLAINED, float(starts[big]), float(ends[big]),
                          {"kind": str(kind), "gaps": len(at), **(attrs or {})},
                          spans=spans_of(np.asarray(starts, np.float64)[at], np.asarray(ends, np.float64)[at])))
    return sorted(items, key=lambda i: -i.time_ns)


__all__ = [
    "GRAPHS_TEXT",
    "TOP_ITEMS",
    "function_name",
    "gap_table",
    "grouped_items",
    "idle_advice",
    "idle_items",
    "kind_advice",
    "kind_evidence",
    "lead_names",
    "range_family",
    "shapes_text",
    "unrecorded_text",
]
