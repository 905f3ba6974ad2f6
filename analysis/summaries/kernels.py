"""Aggregations over the kernel table: top kernels by name, time by category, device roofs.

Aggregates are re-classified on their totals (total FLOPs / total bytes / total time), so a
row "aten::mm x 240" sits on the roofline where its calls sit on average, time-weighted.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.format import clip
from perfscope.memo import memo
from perfscope.schema import column_codes, decode, value_mask

from ..costs.limiter import UNIT_COLUMNS, limiter_note
from ..costs.roofline import classify

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from perfscope.device import DeviceSpec
    from perfscope.report import Report


def _dominant(kernels: pd.DataFrame, key_codes: np.ndarray, col: str) -> pd.Series:
    """Per key code, the value of ``col`` that covers the most time (absent when always missing).

    Ties go to the (key, value) pair seen first. Computed on integer codes (the table's codes of
    ``col``, the (key, value) pairs hashed once), so a 1M-kernel table costs milliseconds.
    """
    col_codes, col_uniques = column_codes(kernels, col)
    if not len(col_uniques):  # an unrecorded column (no ops in an nsys import)
        return pd.Series(dtype="object")
    valid = col_codes >= 0
    width = len(col_uniques)
    pair = key_codes[valid].astype(np.int64) * width + col_codes[valid]
    inverse, pairs = pd.factorize(pair)  # hashed, not sorted; pairs in order of first appearance
    time_ns = np.bincount(inverse, weights=kernels["duration_ns"].to_numpy(np.float64, na_value=np.nan)[valid])
    keys, cols = pairs // width, pairs % width
    order = np.lexsort((np.arange(len(pairs)), -time_ns, keys))  # per key: most time, then first seen
    best = order[np.r_[True, keys[order][1:] != keys[order][:-1]]]
    return pd.Series(np.asarray(col_uniques, dtype=object)[cols[best]], index=keys[best], dtype="object")


def _phases_spanned(kernels: pd.DataFrame, key_codes: np.ndarray) -> pd.Series:
    """Per key code whose kernels ran in two or more phases, those phases joined by ``+``, most time first."""
    phase_codes, phases = column_codes(kernels, "phase")
    valid = phase_codes >= 0
    if len(phases) < 2 or not valid.any():
        return pd.Series(dtype="object")
    width = len(phases)
    time_ns = np.bincount(key_codes[valid].astype(np.int64) * width + phase_codes[valid],
                          weights=kernels["duration_ns"].to_numpy(np.float64, na_value=np.nan)[valid])
    per_key = np.pad(time_ns, (0, (-len(time_ns)) % width)).reshape(-1, width)
    spans = np.flatnonzero((per_key > 0).sum(axis=1) > 1)
    names = np.asarray(phases, dtype=object)
    return pd.Series(["+".join(names[np.argsort(-per_key[k], kind="stable")][: int((per_key[k] > 0).sum())])
                      for k in spans], index=spans, dtype="object")


def aggregate_by_name(kernels: pd.DataFrame, device: DeviceSpec | None, *, key: str = "name",
                      calls: np.ndarray | None = None, by_phase: bool = False) -> pd.DataFrame:
    """One row per kernel (or op) name with totals, re-classified on the totals.

    ``calls``: per row, the kernels it stands for, when ``kernels`` is already grouped (its
    ``duration_ns``, ``flops`` and ``dram_bytes`` then being those kernels' sums); 1 each when None.
    ``by_phase``: one row per (name, phase), so each row's intensity and bound are those of one
    phase's calls (a prefill and a decode call of one op are far apart on the roofline).

    Columns: name, count, duration_ns (total), mean_ns, share_pct, flops, dram_bytes,
    precision, phase, category, and the roofline columns of ``classify``. A row whose calls ran in
    more than one phase says so: its ``phase`` joins them, most time first (``decode+prefill``), and
    its intensity and bound are those of the calls together.
    FLOPs/bytes are summed over the calls where both are known (``flops_coverage_pct`` says
    which share of the time that is), and rates are taken over those calls' time.
    """
    if not len(kernels):
        return pd.DataFrame(columns=["name", "count", "duration_ns", "mean_ns", "share_pct"])
    total = float(kernels["duration_ns"].sum()) or 1.0
    known = kernels["flops"].notna() & kernels["dram_bytes"].notna()
    work = pd.DataFrame({"calls": 1 if calls is None else calls,
                         "duration_ns": kernels["duration_ns"], "known_ns": kernels["duration_ns"].where(known, 0),
                         "flops": kernels["flops"].where(known), "dram_bytes": kernels["dram_bytes"].where(known)})
    # the key (long C++ names) is hashed once; every grouping below runs on its integer codes
    key_codes, key_values = column_codes(kernels, key)
    if (key_codes < 0).any():  # missing names form their own group, as factorize(use_na_sentinel=False) does
        key_codes = np.where(key_codes < 0, len(key_values), key_codes)
        key_values = np.concatenate([key_values, np.array([None], dtype=object)])
    if by_phase and "phase" in kernels:
        phase_codes, _ = column_codes(kernels, "phase")
        pair = key_codes.astype(np.int64) * (int(phase_codes.max(initial=-1)) + 2) + (phase_codes + 1)
        pair_codes = pd.factorize(pair)[0]
        key_values = np.asarray(key_values, dtype=object)[key_codes[np.unique(pair_codes, return_index=True)[1]]]
        key_codes = pair_codes
    grouped = work.groupby(key_codes, sort=False)
    agg = pd.DataFrame({
        "count": grouped["calls"].sum(),
        "duration_ns": grouped["duration_ns"].sum(),
        "known_ns": grouped["known_ns"].sum(),
        "flops": grouped["flops"].sum(min_count=1),
        "dram_bytes": grouped["dram_bytes"].sum(min_count=1),
    })
    for col in ("l2_bytes", "l1_bytes", "shared_bytes"):  # hierarchical roofline: the binding level of the totals
        if col in kernels and kernels[col].notna().any():
            agg[col] = pd.to_numeric(kernels[col], errors="coerce").where(known).groupby(key_codes, sort=False).sum(min_count=1)
    dur = pd.to_numeric(kernels["duration_ns"], errors="coerce").astype("float64")
    for col in UNIT_COLUMNS:  # each measured unit's time-weighted % of peak: the totals' limiter (classify)
        if col in kernels and kernels[col].notna().any():
            v = pd.to_numeric(kernels[col], errors="coerce").astype("float64")
            weight = dur.where(v.notna())
            agg[col] = (v * dur).groupby(key_codes, sort=False).sum(min_count=1) / weight.groupby(
                key_codes, sort=False).sum(min_count=1)
    for col in ("precision", "phase", "category", "device", "op", "short_name", "family_intensity"):
        if col in kernels and col != key:
            agg[col] = _dominant(kernels, key_codes, col).reindex(agg.index)
    if "phase" in kernels and key != "phase":
        agg["phase"] = _phases_spanned(kernels, key_codes).reindex(agg.index).fillna(agg["phase"])
    agg.insert(0, "name", np.asarray(key_values, dtype=object)[agg.index.to_numpy()])
    agg = agg.reset_index(drop=True)
    agg["mean_ns"] = agg["duration_ns"] / agg["count"]
    agg["share_pct"] = agg["duration_ns"] / total * 100.0
    agg["flops_coverage_pct"] = agg["known_ns"] / agg["duration_ns"].where(agg["duration_ns"] > 0) * 100.0
    # rates come from the calls whose work is known, over those calls' time
    rates = agg.assign(duration_ns=agg["known_ns"], start_ns=0, end_ns=agg["known_ns"])
    classified = classify(rates.drop(columns=["known_ns"]), device)
    classified["duration_ns"] = agg["duration_ns"].to_numpy()
    keep = ["name", "count", "duration_ns", "mean_ns", "share_pct", "flops", "dram_bytes",
            "flops_coverage_pct", "precision",
            "phase", "category", "device", "op", "short_name", "arith_intensity", "achieved_flops_per_s",
            "achieved_bytes_per_s", "bound", "roof_flops_per_s", "pct_of_roof", "bound_level", "roofline_bound",
            "limiter", "limiter_pct"]
    out = classified[[c for c in keep if c in classified.columns]]
    return out.sort_values("duration_ns", ascending=False, kind="stable").reset_index(drop=True)


def top_kernels(report: Report, n: int = 15) -> pd.DataFrame:
    """The ``n`` kernel (or CPU operator) names with the most total time, with their roofline: one row
    per (name, phase), so that each row's intensity and bound are those of one phase's calls."""
    return aggregate_by_name(report.kernels, report.device, by_phase=True).head(n)


def time_by(report: Report, column: str) -> pd.DataFrame:
    """Total kernel time grouped by ``column`` (``category``, ``phase``, ``bound``, ``device``)."""
    k = report.kernels
    if not len(k):
        return pd.DataFrame(columns=[column, "duration_ns", "share_pct"])
    keys = k[column].astype("object").where(k[column].notna(), "(none)")
    out = k.groupby(keys)["duration_ns"].sum().rename("duration_ns").reset_index()
    out = out.rename(columns={"index": column})
    out["share_pct"] = out["duration_ns"] / float(k["duration_ns"].sum() or 1) * 100.0
    return out.sort_values("duration_ns", ascending=False).reset_index(drop=True)


def roofs_table(device: DeviceSpec | None) -> pd.DataFrame:
    """Every roof of ``device`` with its provenance and, for compute roofs, the ridge point."""
    rows = []
    if device is not None:
        for prec, roof in device.compute.items():
            rows.append({"roof": prec, "kind": "compute", "value": roof.value, "unit": "FLOP/s",
                         "ridge_flop_per_byte": device.ridge(prec), "provenance": roof.provenance,
                         "method": roof.method, "clock": roof.clock, "dense": roof.dense})
        for level, roof in device.memory.items():
            rows.append({"roof": level, "kind": "memory", "value": roof.value, "unit": "B/s",
                         "ridge_flop_per_byte": None, "provenance": roof.provenance,
                         "method": roof.method, "clock": roof.clock, "dense": None})
    return pd.DataFrame(rows, columns=["roof", "kind", "value", "unit", "ridge_flop_per_byte",
                                       "provenance", "method", "clock", "dense"])


def split_note(method: str) -> tuple[str, str | None]:
    """A roof's method without its trailing ``(status; source: ...)`` note, and the note (None when
    it has none): a datasheet's source sentence is the same for every roof of a row, so outputs say
    it once (:func:`roof_methods`)."""
    text = str(method or "").rstrip()
    if not text.endswith(")"):
        return text, None
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            inner = text[i + 1:-1]
            return (text[:i].rstrip(), inner) if "source:" in inner and i > 0 else (text, None)
    return text, None


def roof_methods(methods: Sequence[str]) -> tuple[list[str], list[str]]:
    """Each method with the notes it shares with others taken out, and those shared notes once each,
    in order. A note only one roof carries stays in its method."""
    split = [split_note(m) for m in methods]
    counts: dict[str, int] = {}
    for _, note in split:
        if note:
            counts[note] = counts.get(note, 0) + 1
    shared = [n for n in counts if counts[n] > 1]
    heads = [head if note in shared else (f"{head} ({note})" if note else head) for head, note in split]
    return heads, shared


def top_groups(kernels: pd.DataFrame, rows: np.ndarray, weights: np.ndarray | float = 1.0, n: int = 3) -> tuple[str, ...]:
    """The ``n`` :func:`group_key` names carrying the most weight (time, or 1 each) among the kernel
    rows at positions ``rows`` (a rule's subset of the report's table), heaviest first; ties go to
    the name the subset meets first. On the table's group codes, computed once."""
    codes, names = group_codes(kernels)
    sub = codes[np.asarray(rows, dtype=np.int64)]
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), sub.shape)
    known = sub >= 0
    local, seen = pd.factorize(sub[known])  # in the order the subset meets them: ties go to the first
    totals = np.bincount(local, weights=np.nan_to_num(w[known]), minlength=len(seen))
    return tuple(str(names[seen[i]]) for i in np.argsort(-totals, kind="stable")[:n])


DEGENERATE_SHORT_NAME = r"void|\d*|std"
"""Short names that are a C++ keyword or a number are a short-name parser's slip on names such as
``void (anonymous namespace)::kernel<...>(...)``; the full name is used instead."""


def group_key(kernels: pd.DataFrame) -> pd.Series:
    """The name rules group kernels by: ``short_name`` (no template arguments), else ``name``.

    Computed once per table object (several rules group the report's kernels)."""
    codes, names = group_codes(kernels)
    return pd.Series(decode(codes, names), index=kernels.index, name="short_name", dtype="object")


def group_codes(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """:func:`group_key` as (codes, -1 where missing; the distinct names), computed once per table
    object from the table's codes of ``short_name`` and ``name``, never hashing 1M strings."""
    return memo(kernels, "group_codes", lambda: _group_codes(kernels))


def _group_codes(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    degenerate = re.compile(DEGENERATE_SHORT_NAME)
    codes, names = column_codes(kernels, "short_name")
    usable = value_mask(kernels, "short_name", lambda v: v is not None and degenerate.fullmatch(str(v)) is None)
    if usable.all():
        return codes, names
    full_codes, full_names = column_codes(kernels, "name")
    # short names keep their codes; a full name takes the code of an equal short name, else a new one
    offset = {name: i for i, name in enumerate(names)}
    extra: list[object] = []
    remap = np.empty(len(full_names) + 1, dtype=np.int64)
    for j, name in enumerate(full_names):
        if name not in offset:
            offset[name] = len(names) + len(extra)
            extra.append(name)
        remap[j] = offset[name]
    remap[-1] = -1  # a missing full name stays missing
    combined = np.where(usable, codes, remap[full_codes])
    return combined, np.concatenate([names, np.array(extra, dtype=object)])


def is_cpu_report(report: Report) -> bool:
    """True when the rows are CPU operators (a CPU run, or a trace without GPU kernels)."""
    return memo(report, "is_cpu_report", lambda: _is_cpu_report(report))


def _is_cpu_report(report: Report) -> bool:
    dev = report.device
    if dev is not None and dev.kind == "cpu":
        return True
    k = report.kernels
    return bool(len(k)) and bool(value_mask(k, "device", lambda d: d == "cpu").all())


def roof_notes(rows: pd.DataFrame, device: DeviceSpec | None, width: int | None = None) -> list[str]:
    """A note for every row of a kernel table that sits above its roof (``name (phase): why``), in
    the table's order: above the roof, the roof or the count is wrong for that kernel, and the
    note says which (:func:`perfscope.analysis.costs.roofline.above_roof_note`)."""
    from ..costs.roofline import above_roof_note

    return _row_notes(rows, lambda r: above_roof_note(r, device), width)


def limiter_notes(rows: pd.DataFrame, width: int | None = None) -> list[str]:
    """A note for every row of a kernel table whose measured limiter contradicts its roofline reading
    (``name (phase): the FLOPs and bytes put it memory-bound ...; measured: compute (alu) ...``), in order:
    the point stays where its FLOPs and bytes put it, the bound is the measured one."""
    if "roofline_bound" not in rows or "limiter" not in rows:
        return []
    return _row_notes(rows, limiter_note, width)


def _row_notes(rows: pd.DataFrame, note: Callable[[Any], str | None], width: int | None) -> list[str]:
    """``name (phase): why`` for every row ``note`` has something to say of. With ``width``, the name is
    clipped to it and the row's number in the table is given (``name… (#3, decode): why``), so that a
    kernel's mangled name (often over 1,000 characters) does not fill the text report."""
    notes = []
    for i, (_, r) in enumerate(rows.iterrows()):
        why = note(r)
        if why:
            where = [f"#{i + 1}"] if width is not None else []
            if isinstance(r.get("phase"), str):
                where.append(r["phase"])
            name = clip(r["name"], width) if width is not None else r["name"]
            notes.append(f"{name}{' (' + ', '.join(where) + ')' if where else ''}: {why}")
    return notes
