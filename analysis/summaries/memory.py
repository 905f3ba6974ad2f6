"""Tables from a report's ``memory`` table: what is live at an instant (the peak, or an event, a step,
a phase, a time a user picks) by category, its largest tensors, with fragmentation and reserved
but unused bytes beside them; the peak per device, per phase and per step; and the gauges' summary
beside the latencies.

An instant is an event of a device's record (:mod:`perfscope.analysis.memory`): "after event k".
A snapshot without ``time_us`` has no other clock, and says "event 6,412 of 10,522".
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.errors import UsageError

if TYPE_CHECKING:
    from perfscope.report import Report

CATEGORY_ORDER = ("weights", "kv_cache", "activations", "workspace", "optimizer", "gradient", "cuda_graph_pool",
                  "before_recording", "unknown")

TOP_TENSORS = 12
"""Largest live tensors a breakdown lists."""


def memory_clock(report: Report) -> str:
    """``time`` (``t_ns`` is a time) or ``events`` (a snapshot without ``time_us``: ``t_ns`` counts events)."""
    return "events" if (report.params or {}).get("memory_clock") == "events" else "time"


def device_rows(report: Report, device: str) -> pd.DataFrame:
    """The memory rows of one device, in the record's order (before the record first)."""
    mem = report.memory
    if not len(mem):
        return mem
    return mem[mem["device"].to_numpy(dtype=object) == device]


def _events(dev: pd.DataFrame) -> np.ndarray:
    """Each row's event (-1: before the record). Reports written before the column had it: the row's
    position after the pre-existing rows."""
    if "event" in dev and dev["event"].notna().all():
        return dev["event"].to_numpy("int64")
    pre = dev["preexisting"].fillna(False).to_numpy(bool) if "preexisting" in dev else np.zeros(len(dev), bool)
    return np.where(pre, -1, np.cumsum(~pre) - 1).astype("int64")


def _free_events(dev: pd.DataFrame, events: np.ndarray) -> np.ndarray:
    """Per alloc row, the event that freed it (NaN: live at the end); older reports: from free_t_ns."""
    if "free_event" in dev and (dev["free_event"].notna().any() or dev["free_t_ns"].isna().all()):
        return dev["free_event"].to_numpy("float64", na_value=np.nan)
    free_t = dev["free_t_ns"].to_numpy("float64", na_value=np.nan)
    t = dev["t_ns"].to_numpy("int64")
    out = np.full(len(dev), np.nan)
    ok = ~np.isnan(free_t)
    out[ok] = events[np.clip(np.searchsorted(t, free_t[ok], side="left"), 0, len(t) - 1)]
    return out


def event_count(report: Report, device: str) -> int:
    """Events in the device's record (rows before it not counted)."""
    ev = _events(device_rows(report, device))
    return int(ev.max()) + 1 if len(ev) and ev.max() >= 0 else 0


def instant_label(report: Report, device: str, event: int) -> str:
    """``event 6,412 of 10,522`` and, when the record has a clock, ``+12.3 ms`` from its first event."""
    from perfscope.format import duration

    n = event_count(report, device)
    if event < 0:
        return "before the record's first event"
    text = f"event {event + 1:,} of {n:,}"
    if memory_clock(report) == "time":
        dev = device_rows(report, device)
        ev = _events(dev)
        t = dev["t_ns"].to_numpy("int64")
        at = t[ev == event]
        if len(at):
            text += f", +{duration(int(at[0]) - int(t.min()))}"
    return text


def instant(report: Report, device: str, *, event: int | None = None, t_ns: float | None = None,
            step: int | None = None, phase: str | None = None) -> int:
    """The event an instant names: an event itself; the last event at or before a time (``t_ns`` on
    the report's clock); the highest allocated bytes within a step or a phase.

    Raises:
        UsageError: the device has no such event, step or phase.
    """
    dev = device_rows(report, device)
    if not len(dev):
        raise UsageError(f"no memory timeline for {device}", hint="pick one of the report's devices")
    ev = _events(dev)
    n = int(ev.max()) + 1
    if event is not None:
        if not -1 <= event < n:
            raise UsageError(f"{device} has events 1 to {n:,}, not {event + 1:,}")
        return int(event)
    if t_ns is not None:
        t = dev["t_ns"].to_numpy("int64")
        k = int(np.searchsorted(t, t_ns, side="right")) - 1
        return int(ev[k]) if k >= 0 else -1
    key, value = ("step", step) if step is not None else ("phase", phase)
    if value is None or key not in dev:
        raise UsageError("an instant is an event, a time, a step or a phase")
    sel = (dev[key] == value).fillna(False).to_numpy(bool)  # a row outside every step (missing) is not in it
    if not sel.any():
        have = sorted({str(v) for v in dev[key].dropna().unique()})[:12] or ["none"]
        raise UsageError(f"{device}: no memory events in {key} {value!r}", hint=f"{key}s with events: {', '.join(have)}")
    alloc = dev["allocated_bytes"].to_numpy("float64", na_value=np.nan)
    rows = np.flatnonzero(sel)
    return int(ev[rows[int(np.nanargmax(alloc[rows]))]])


INSTANT = re.compile(r"(?:(event|step|phase|time):)?\s*(.+)")


def parse_instant(text: str) -> dict[str, Any]:
    """``event:6412`` (1-based, as printed), ``step:3``, ``phase:decode``, ``time:12.5ms`` or ``12.5ms``
    (from the record's first event) -> keyword arguments of :func:`instant` (``t_offset_ns`` for a time).

    Raises:
        UsageError: none of these.
    """
    m = INSTANT.fullmatch(text.strip())
    kind, value = (m.group(1), m.group(2).strip()) if m else (None, "")
    try:
        if kind == "event" or (kind is None and value.isdigit()):
            return {"event": int(value.replace(",", "")) - 1}
        if kind == "step":
            return {"step": int(value)}
        if kind == "phase":
            return {"phase": value}
        t = re.fullmatch(r"([0-9.]+)\s*(ns|us|µs|ms|s)", value)
        if t:
            scale = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}[t.group(2)]
            return {"t_offset_ns": float(t.group(1)) * scale}
    except ValueError:
        pass
    raise UsageError(f"--memory-at {text!r} is not an instant",
                     hint="give event:N, step:N, phase:NAME or a time from the first event (time:12.5ms)")


def resolve_instant(report: Report, device: str, spec: dict[str, Any]) -> int:
    """:func:`instant` of a :func:`parse_instant` result (a time is from the device's first event)."""
    spec = dict(spec)
    if "t_offset_ns" in spec:
        if memory_clock(report) != "time":
            raise UsageError("this memory record has no clock (a snapshot without time_us)",
                             hint="pick an instant by event:N")
        dev = device_rows(report, device)
        spec = {"t_ns": float(dev["t_ns"].min()) + spec.pop("t_offset_ns")}
    return instant(report, device, **spec)


def _live_mask(dev: pd.DataFrame, event: int) -> tuple[np.ndarray, np.ndarray]:
    events = _events(dev)
    alloc = dev["action"].to_numpy(dtype=object) == "alloc"
    free_ev = _free_events(dev, events)
    live = alloc & (events <= event) & (np.isnan(free_ev) | (free_ev > event))
    return live, events


def live_at(report: Report, device: str, event: int) -> pd.DataFrame:
    """The tensors of ``device`` live just after ``event``, largest first: size, category and its
    rule, op, module, source and stack, when made (event and time) and when freed (None: still live
    at the end). The allocator's untracked total (a row with no address) and the rows of an
    ``export_memory_timeline`` (category totals, not tensors) are not tensors and are left out."""
    dev = device_rows(report, device)
    if not len(dev) or (dev["memory_source"].to_numpy(dtype=object) == "memory_timeline").all():
        return pd.DataFrame(columns=["size_bytes", "category", "category_rule", "op", "module", "source", "stack",
                                     "alloc_event", "alloc_t_ns", "free_event", "free_t_ns", "addr", "preexisting"])
    live, events = _live_mask(dev, event)
    live &= ~np.isnan(dev["addr"].to_numpy("float64", na_value=np.nan))
    rows = dev[live]
    free_ev = _free_events(dev, events)[live]
    out = pd.DataFrame({
        "size_bytes": rows["size_bytes"].to_numpy("float64", na_value=np.nan),
        "category": rows["category"].to_numpy(dtype=object),
        "category_rule": rows["category_rule"].to_numpy(dtype=object),
        "op": rows["op"].to_numpy(dtype=object), "module": rows["module"].to_numpy(dtype=object),
        "source": rows["source"].to_numpy(dtype=object),
        "stack": rows["stack"].to_numpy(dtype=object) if "stack" in rows else np.full(len(rows), None, dtype=object),
        "alloc_event": events[live], "alloc_t_ns": rows["t_ns"].to_numpy("int64"),
        "free_event": free_ev, "free_t_ns": rows["free_t_ns"].to_numpy("float64", na_value=np.nan),
        "addr": rows["addr"].to_numpy("float64", na_value=np.nan), "preexisting": rows["preexisting"].fillna(False).to_numpy(bool),
    })
    return out.sort_values("size_bytes", ascending=False, kind="stable").reset_index(drop=True)


def by_category(report: Report, device: str, event: int) -> dict[str, float]:
    """Bytes live just after ``event`` per category (their sum is the allocated bytes there): each
    category's running sum of ``delta_bytes`` over the rows up to the event."""
    dev = device_rows(report, device)
    if not len(dev):
        return {}
    upto = _events(dev) <= event
    delta = dev["delta_bytes"].to_numpy("float64", na_value=np.nan)[upto]
    cats = dev["category"].astype("object").to_numpy()[upto]
    moves = delta != 0
    sums = pd.Series(delta[moves]).groupby(pd.Series(cats[moves]).fillna("unknown").to_numpy()).sum()
    order = [c for c in CATEGORY_ORDER if c in sums.index] + sorted(c for c in sums.index if c not in CATEGORY_ORDER)
    return {c: float(sums[c]) for c in order if abs(float(sums[c])) > 0.5}


def _segments_at(dev: pd.DataFrame, events: np.ndarray, event: int) -> dict[float, float] | None:
    """Segments (address -> bytes) reserved just after ``event``; None when the record does not name them."""
    action = dev["action"].to_numpy(dtype=object)
    seg = ((action == "segment_alloc") | (action == "segment_free")) & (events <= event)
    if not ((action == "segment_alloc") & (events < 0)).any() and not seg.any():
        return None
    have: dict[float, float] = {}
    for a, kind, s in zip(dev["addr"].to_numpy("float64", na_value=np.nan)[seg].tolist(), action[seg].tolist(),
                          dev["size_bytes"].to_numpy("float64", na_value=np.nan)[seg].tolist()):
        if kind == "segment_alloc":
            have[a] = s
        else:
            have.pop(a, None)
    return have


def breakdown(report: Report, device: str, event: int, *, top: int = TOP_TENSORS) -> dict[str, Any]:
    """What is live on ``device`` just after ``event``: the allocated bytes, by category (adding up
    to them), the largest tensors (:func:`live_at`, with :func:`tensor_role`), and beside them the
    reserved bytes, the reserved but unused bytes (reserved - allocated) and of those the
    fragmentation: free bytes inside segments that hold a live block (the allocator can only reuse
    them for blocks that fit; the rest, whole free segments, ``empty_cache`` would return). None
    where the record does not say (no reserved bytes, no segments)."""
    dev = device_rows(report, device)
    events = _events(dev)
    at = np.flatnonzero(events <= event)
    row = dev.iloc[int(at[-1])] if len(at) else None
    allocated = float(row["allocated_bytes"]) if row is not None and pd.notna(row["allocated_bytes"]) else math.nan
    reserved = float(row["reserved_bytes"]) if row is not None and pd.notna(row["reserved_bytes"]) else math.nan
    cats = by_category(report, device, event)
    live = live_at(report, device, event)
    roles = tensor_roles(report, device, live)
    fragmentation = None
    segs = _segments_at(dev, events, event)
    if segs and math.isfinite(reserved) and abs(sum(segs.values()) - reserved) <= 0.01 * max(reserved, 1.0):
        starts = np.array(sorted(segs), dtype="float64")
        sizes = np.array([segs[a] for a in starts.tolist()], dtype="float64")
        k = np.searchsorted(starts, live["addr"].to_numpy("float64", na_value=np.nan), side="right") - 1
        inside = (k >= 0) & (live["addr"].to_numpy("float64", na_value=np.nan) < starts[np.maximum(k, 0)] + sizes[np.maximum(k, 0)])
        used = np.bincount(k[inside], weights=live["size_bytes"].to_numpy("float64", na_value=np.nan)[inside], minlength=len(starts))
        holding = used > 0
        fragmentation = float(np.sum(sizes[holding] - used[holding]))
    t = int(row["t_ns"]) if row is not None else None
    return {
        "device": device, "event": int(event), "events": event_count(report, device),
        "at": instant_label(report, device, int(event)), "clock": memory_clock(report),
        "t_ns": t if memory_clock(report) == "time" else None,
        "allocated_bytes": allocated, "by_category": cats,
        "category_rules": _rules(dev, events, event),
        "reserved_bytes": reserved if math.isfinite(reserved) else None,
        "reserved_unused_bytes": reserved - allocated if math.isfinite(reserved) and math.isfinite(allocated) else None,
        "fragmentation_bytes": fragmentation,
        "live_tensors": len(live),
        "tensors": [_tensor_record(r, role) for r, role in zip(live.head(top).to_dict("records"), roles[:top])],
    }


def _rules(dev: pd.DataFrame, events: np.ndarray, event: int) -> dict[str, list[str]]:
    """Per category live at the event, the rules that gave it (most bytes first)."""
    live, _ = _live_mask(dev, event)
    rows = dev[live]
    if not len(rows):
        return {}
    g = rows.groupby([rows["category"].astype("object").fillna("unknown"),
                      rows["category_rule"].astype("object").fillna("")], sort=False)["size_bytes"].sum()
    out: dict[str, list[str]] = {}
    for c, r in g.sort_values(ascending=False).index:
        if r:
            out.setdefault(str(c), []).append(str(r))
    return out


def _tensor_record(r: dict[str, Any], role: str) -> dict[str, Any]:
    def text(v: Any) -> str | None:
        return v if isinstance(v, str) else None

    def num(v: Any) -> float | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    free = num(r["free_event"])
    return {"bytes": float(r["size_bytes"]), "category": text(r["category"]), "category_rule": text(r["category_rule"]),
            "role": role, "op": text(r["op"]), "module": text(r["module"]), "source": text(r["source"]),
            "stack": text(r["stack"]), "alloc_event": int(r["alloc_event"]), "alloc_t_ns": int(r["alloc_t_ns"]),
            "free_event": None if free is None else int(free), "free_t_ns": num(r["free_t_ns"]),
            "still_live": free is None, "preexisting": bool(r["preexisting"])}


# ---------------------------------------------------------------------------- what a tensor is
ROLES = ("attention_scores", "attention", "logits", "kv_cache", "weights", "optimizer", "gradient", "workspace",
         "activations", "cuda_graph_pool", "before_recording", "unknown")
"""What a live tensor is, for the advice of the ``memory-peak`` finding (:func:`tensor_roles`)."""

SCORE_OPS = frozenset({"aten::bmm", "aten::matmul", "aten::baddbmm", "aten::div", "aten::mul", "aten::_softmax",
                       "aten::softmax", "aten::_safe_softmax", "aten::masked_fill", "aten::add", "aten::sub",
                       "aten::where", "aten::exp", "aten::native_dropout", "aten::dropout", "aten::_to_copy",
                       "aten::clone", "aten::einsum"})
"""Ops an eager attention makes its B x H x S x S scores with (QK^T, scale, mask, softmax, dropout)."""
SOFTMAX_OPS = frozenset({"aten::_softmax", "aten::softmax", "aten::_safe_softmax"})
FUSED_ATTENTION_OPS = frozenset({"aten::_scaled_dot_product_flash_attention", "aten::_flash_attention_forward",
                                 "aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_forward",
                                 "aten::_scaled_dot_product_cudnn_attention", "aten::scaled_dot_product_attention",
                                 "aten::_scaled_dot_product_flash_attention_for_cpu"})
LOGIT_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::_to_copy", "aten::_log_softmax",
                       "aten::log_softmax", "aten::_softmax", "aten::softmax", "aten::bmm", "aten::einsum"})
ATTENTION_WORDS = re.compile(r"attn|attention", re.IGNORECASE)
LOGIT_WORDS = re.compile(r"logits|lm_head|cross_entropy|\bloss\b|compute_loss", re.IGNORECASE)


def _function_key(source: Any) -> str | None:
    """``file.py function`` of a ``file.py:line function`` source line."""
    if not isinstance(source, str) or ":" not in source:
        return None
    file, _, rest = source.partition(":")
    return f"{file} {rest.partition(' ')[2]}"


def tensor_roles(report: Report, device: str, live: pd.DataFrame) -> list[str]:
    """What each live tensor is (:data:`ROLES`), first match wins:

    - its category when it is weights, KV cache, optimizer state, gradient, a CUDA-graph pool or from
      before the record;
    - ``attention`` when a fused attention op made it (SDPA, flash, memory-efficient);
    - ``attention_scores``: made by a score op (:data:`SCORE_OPS`) where the user's stack names an
      attention function, or with the size of a softmax the same function makes (eager attention:
      QK^T, scale and softmax have the scores' size);
    - ``logits``: made by a projection, a cast or a (log-)softmax where the stack names the logits,
      the LM head or the loss;
    - otherwise its category (activations, workspace).
    """
    if not len(live):
        return []
    dev = device_rows(report, device)
    allocs = dev[dev["action"].to_numpy(dtype=object) == "alloc"]
    soft = allocs[allocs["op"].astype("object").isin(SOFTMAX_OPS).to_numpy()]
    softmax_sizes = {(k, float(s)) for k, s in zip(soft["source"].map(_function_key).tolist(),
                                                    soft["size_bytes"].tolist()) if k is not None}
    out = []
    for cat, op, src, stack, size in zip(live["category"].tolist(), live["op"].tolist(), live["source"].tolist(),
                                         live["stack"].tolist(), live["size_bytes"].tolist()):
        words = stack if isinstance(stack, str) else src if isinstance(src, str) else ""
        if cat in ("weights", "kv_cache", "optimizer", "gradient", "cuda_graph_pool", "before_recording"):
            out.append(str(cat))
        elif op in FUSED_ATTENTION_OPS:
            out.append("attention")
        elif op in SCORE_OPS and (ATTENTION_WORDS.search(words) or (_function_key(src), float(size)) in softmax_sizes):
            out.append("attention_scores")
        elif op in LOGIT_OPS and LOGIT_WORDS.search(words):
            out.append("logits")
        else:
            out.append(str(cat) if isinstance(cat, str) else "unknown")
    return out


def peaks(report: Report) -> list[dict[str, Any]]:
    """Per device: the peak of allocated bytes, at which event (and time), the op / module / source
    of the allocation that reached it, the reserved bytes then, and the :func:`breakdown` there."""
    mem = report.memory
    out = []
    for device in sorted(set(mem["device"].dropna())) if len(mem) else []:
        dev = device_rows(report, device)
        alloc = dev["allocated_bytes"].astype("float64").to_numpy()
        if not np.isfinite(alloc).any():
            continue
        i = int(np.nanargmax(alloc))
        row = dev.iloc[i]
        event = int(_events(dev)[i])
        b = breakdown(report, device, event)
        out.append({
            "device": device, "peak_allocated_bytes": float(alloc[i]), "event": event, "at": b["at"],
            "t_ns": b["t_ns"], "clock": b["clock"],
            "reserved_bytes": b["reserved_bytes"],
            "max_reserved_bytes": float(dev["reserved_bytes"].max()) if dev["reserved_bytes"].notna().any() else None,
            "op": _text(row["op"]), "module": _text(row["module"]), "source": _text(row["source"]),
            "phase": _text(row["phase"]), "step": None if pd.isna(row["step"]) else int(row["step"]),
            "by_category": b["by_category"], "breakdown": b, "events": b["events"],
            "memory_source": row["memory_source"],
        })
    return out


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def peak_by(report: Report, key: str) -> pd.DataFrame:
    """Peak allocated bytes per device and ``key`` (``phase`` or ``step``), rows in time order."""
    mem = report.memory
    if not len(mem) or mem[key].isna().all():
        return pd.DataFrame(columns=["device", key, "peak_allocated_bytes", "t_ns"])
    m = mem[mem[key].notna()]
    idx = m.groupby(["device", key], sort=False)["allocated_bytes"].idxmax()
    rows = m.loc[idx.dropna().astype(int), ["device", key, "allocated_bytes", "t_ns"]]
    return rows.rename(columns={"allocated_bytes": "peak_allocated_bytes"}).sort_values("t_ns").reset_index(drop=True)


def top_sources(report: Report, device: str, n: int = 8, event: int | None = None) -> pd.DataFrame:
    """The allocations live at ``event`` (default: the device's peak) grouped by (category, op,
    source), largest first."""
    if event is None:
        p = next((p for p in peaks(report) if p["device"] == device), None)
        if p is None:
            return pd.DataFrame()
        event = p["event"]
    live = live_at(report, device, event)
    if not len(live):
        return live
    keys = ["category", "op", "source", "module"]
    g = live.astype({k: "object" for k in keys}).fillna({k: "" for k in keys}).groupby(keys, sort=False)[
        "size_bytes"].agg(["sum", "count"])
    return g.sort_values("sum", ascending=False).head(n).reset_index().rename(
        columns={"sum": "bytes", "count": "allocations"})


def memory_payload(report: Report, at: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` key ``memory``: peaks per device (each with its :func:`breakdown`), per phase
    and per step, and with ``at`` (:func:`parse_instant`) the breakdown at that instant per device."""
    if not len(report.memory):
        return {"peaks": [], "by_phase": [], "by_step": []}
    from perfscope.format import jsonable

    doc: dict[str, Any] = {"peaks": peaks(report), "clock": memory_clock(report),
                           "by_phase": peak_by(report, "phase").to_dict("records"),
                           "by_step": peak_by(report, "step").to_dict("records")}
    if at is not None:
        doc["at"] = [breakdown(report, d, resolve_instant(report, d, at))
                     for d in sorted(set(report.memory["device"].dropna()))]
    return jsonable(doc)  # type: ignore[no-any-return]


def gauge_summary(report: Report) -> pd.DataFrame:
    """Per gauge: samples, min, max, last (the report's gauges table)."""
    g = report.gauges
    if not len(g):
        return pd.DataFrame()
    return g.groupby("metric", sort=True)["value"].agg(["count", "min", "max", "last"]).reset_index()


DEFAULT_CONTEXT = 8192
"""The context of a report's capacity section when the run does not say its own (prompt + output)."""


def capacity_section(report: Report) -> dict[str, Any] | None:
    """The capacity section of an LLM report: its model (the engine's, or an HF config the manifest
    names) on its GPU (the datasheet row of the report's device), at the run's context (prompt +
    output tokens, else :data:`DEFAULT_CONTEXT`), with the activation peak measured in the run
    when the report has a memory timeline. None when the model or the GPU's memory is unknown."""
    from perfscope.capacity import (
        InputFormatError,
        UsageError,
        capacity,
        dtype_bytes,
        replace_source,
        resolve_device_memory,
        resolve_model,
        sentence,
    )
    from perfscope.datasheets import find_datasheet

    params = report.params
    name = params.get("model")
    dev = report.device
    if not isinstance(name, str) or dev is None or dev.kind == "cpu":
        return None
    sheet = find_datasheet(dev.name, dev.properties)
    if sheet is None or not sheet.memory_gb:
        return None
    try:
        m = resolve_model(name)
    except (UsageError, InputFormatError):
        return None
    ctx = params.get("prompt_len", 0) + params.get("gen_len", 0) if isinstance(params.get("prompt_len"), int) else 0
    context = int(ctx) if isinstance(ctx, int) and ctx > 0 else DEFAULT_CONTEXT
    act = None
    mem = getattr(report, "memory", None)
    if mem is not None and len(mem):
        got = [p for p in peaks(report) if str(p["device"]).startswith("cuda")]
        if got:
            cats = got[0]["by_category"]
            act = float(cats.get("activations", 0.0) + cats.get("workspace", 0.0))
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(params.get("dtype")), None)
    dm = resolve_device_memory(sheet.model)
    kw: dict[str, Any] = {"context": context, "weights_dtype": dtype, "activation_bytes": act}
    c = capacity(m, dm, kv_dtype=dtype, **kw)
    fp8 = capacity(m, dm, kv_dtype="fp8", **kw) if dtype_bytes(c.kv_dtype) > 1 else None
    if act is not None:
        c = replace_source(c, "measured in this run (activations + workspace at the peak)")
    return {"capacity": c.to_dict(), "fp8_kv": fp8.to_dict() if fp8 else None, "finding": sentence(c, fp8)}


