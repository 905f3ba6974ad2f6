"""NVTX ranges of an nsys export: names and domains, nesting, and projection onto GPU work.

Nesting (depth, parent, path) is computed per thread for push/pop ranges, which a thread
opens and closes as a stack, by one sweep over sorted open/close events. Start/end ranges
are not stack-ordered (they may overlap and end on another thread), so they are kept as
top-level ranges. The projection follows NVIDIA's rule (FORMATS.md section 1.11, rule 6): a
GPU op belongs to the innermost push/pop range, on the thread of its launch call, that
encloses that call; it is found with ``merge_asof`` plus a walk up the parent chain, so the
cost grows with ops + ranges, never ops x ranges.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.schema import text_of

from ...tree import phase_of, range_paths
from .sqlite import NsysDb, lookup_strings, pid_of, tid_of

NVTX_TABLE = "NVTX_EVENTS"
PUSH_POP = (59, 70)
START_END = (60, 71)
DOMAIN_CREATE = 75
UNNAMED = "(unnamed)"


def read_ranges(db: NsysDb) -> tuple[pd.DataFrame, list[str]]:
    """NVTX push/pop and start/end ranges with display names, depth, parent and path.

    Returns:
        The ranges (report columns plus ``pid``, ``global_tid`` and ``push_pop``) and warnings.
    """
    wanted = ("start", "end", "eventType", "text", "textId", "globalTid", "endGlobalTid", "domainId")
    cols = db.present(NVTX_TABLE, wanted)
    if not {"start", "eventType", "globalTid"} <= set(cols):
        reason = "absent" if NVTX_TABLE not in db.tables else "lacks start/eventType/globalTid"
        warning = (f"no NVTX ranges: table {NVTX_TABLE} {reason} "
                   "(nothing was annotated, or the capture ran without --trace=nvtx)")
        return pd.DataFrame(), [warning]
    codes = (*PUSH_POP, *START_END, DOMAIN_CREATE)
    sql = (f'SELECT {", ".join(chr(34) + c + chr(34) for c in cols)} FROM {NVTX_TABLE} '
           f'WHERE eventType IN ({",".join(map(str, codes))})')
    ev = db.whole(NVTX_TABLE, db.frame(sql, cols), [c for c in cols if c != "text"])
    ev = ev.reindex(columns=list(wanted))
    ev["message"] = _messages(db, ev)
    is_domain = (ev["eventType"] == DOMAIN_CREATE).fillna(False).astype(bool)
    ranges = db.timed(NVTX_TABLE, ev.loc[~is_domain], ("start", "globalTid")).copy()
    warnings: list[str] = []
    if ranges.empty:
        return pd.DataFrame(), ["no NVTX ranges were recorded (NVTX_EVENTS holds no push/pop or start/end rows)"]
    open_count = int(ranges["end"].isna().sum())
    if open_count:
        last = db.max_timestamp(NVTX_TABLE)
        ranges["end"] = ranges["end"].fillna(ranges["start"] if last is None else last)
        warnings.append(f"{open_count} NVTX range(s) never closed; they end at the last NVTX timestamp")
    ranges["domain"] = _domains(ev.loc[is_domain], ranges)
    return nest(_shape(ranges)), warnings


def _messages(db: NsysDb, ev: pd.DataFrame) -> pd.Series:
    """Registered string (textId) when set, else the inline text."""
    text = ev["text"].astype("object")
    if ev["textId"].notna().any():
        registered = lookup_strings(ev["textId"], db.strings(ev["textId"]))
        text = registered.where(registered.notna(), text)
    return text.where(text.notna() & (text != ""), UNNAMED)


def _domains(created: pd.DataFrame, ranges: pd.DataFrame) -> pd.Series:
    """Domain name of each range, matched by (process, domainId); None for the default domain."""
    if created.empty or ranges["domainId"].isna().all():
        return pd.Series([None] * len(ranges), index=ranges.index, dtype="object")
    names = {
        (int(p), int(d)): m
        for p, d, m in zip(pid_of(created["globalTid"]), created["domainId"], created["message"])
        if pd.notna(d) and pd.notna(p)
    }
    keys = zip(pid_of(ranges["globalTid"]), ranges["domainId"])
    return pd.Series([names.get((int(p), int(d))) if pd.notna(d) and pd.notna(p) else None for p, d in keys],
                     index=ranges.index, dtype="object")


def _shape(r: pd.DataFrame) -> pd.DataFrame:
    start = r["start"].to_numpy(dtype="int64")
    end = np.maximum(r["end"].to_numpy(dtype="int64"), start)
    display = np.where(r["domain"].notna(), text_of(r["domain"]) + ":" + text_of(r["message"]),
                       r["message"])
    return pd.DataFrame({
        "name": display,
        "start_ns": start,
        "end_ns": end,
        "duration_ns": end - start,
        "domain": r["domain"],
        "thread": tid_of(r["globalTid"]),
        "pid": pid_of(r["globalTid"]),
        "global_tid": r["globalTid"].to_numpy(dtype="int64"),
        "push_pop": r["eventType"].isin(PUSH_POP),
        "cross_thread": r["endGlobalTid"].notna() & (r["endGlobalTid"] != r["globalTid"]),
        "source": "nvtx",
    })


def nest(r: pd.DataFrame) -> pd.DataFrame:
    """Assign ids (ordered by thread, start) and depth, parent, path of push/pop ranges."""
    r = r.sort_values(["global_tid", "start_ns", "end_ns"], ascending=[True, True, False],
                      kind="stable").reset_index(drop=True)
    r.insert(0, "id", np.arange(len(r), dtype="int64"))
    depth = np.zeros(len(r), dtype="int64")
    parent = np.full(len(r), -1, dtype="int64")
    pp = r.loc[r["push_pop"]]
    if len(pp):
        d, p = _hierarchy(pp)
        depth[pp.index] = d
        parent[pp.index] = p
    r["depth"] = depth
    r["parent"] = pd.Series(parent).where(parent >= 0).astype("Int64")
    r["path"] = range_paths(r["name"].to_numpy(dtype=object), parent, depth)
    return r


def _hierarchy(pp: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent id of stack-ordered ranges, from one sweep over open/close events.

    At equal times closes come before opens (adjacent ranges do not nest), opens are in id
    order (outer first), and a zero-length range closes right after it opens.
    """
    n = len(pp)
    ids = pp["id"].to_numpy()
    group = pd.factorize(pp["global_tid"])[0]
    start, end = pp["start_ns"].to_numpy(), pp["end_ns"].to_numpy()
    events = pd.DataFrame({
        "group": np.concatenate([group, group]),
        "t": np.concatenate([start, end]),
        "tie": np.concatenate([np.ones(n, "int8"), np.where(end > start, 0, 2).astype("int8")]),
        "id": np.concatenate([ids, ids]),
        "delta": np.concatenate([np.ones(n, "int64"), -np.ones(n, "int64")]),
    }).sort_values(["group", "t", "tie", "id"], kind="stable")
    events["level"] = events["delta"].cumsum() - 1
    opens = events.loc[events["delta"] > 0, ["group", "id", "level"]].copy()
    opens["pos"] = np.arange(len(opens))
    parents = opens.rename(columns={"id": "parent"}).assign(level=lambda f: f["level"] + 1)
    linked = pd.merge_asof(opens, parents[["pos", "group", "level", "parent"]], on="pos",
                           by=["group", "level"], direction="backward", allow_exact_matches=False)
    linked = linked.set_index("id").reindex(ids)
    depth = linked["level"].to_numpy(dtype="int64")
    parent = linked["parent"].fillna(-1).to_numpy(dtype="int64")
    return depth, parent


def innermost_range(calls: pd.DataFrame, ranges: pd.DataFrame) -> np.ndarray:
    """Id of the innermost push/pop range enclosing each launch call on its thread (-1: none).

    Args:
        calls: ``global_tid``, ``api_start``, ``api_end`` per GPU op (NaN when the launch call
            is unknown), in the op's order.
        ranges: the output of :func:`nest`.
    """
    out = np.full(len(calls), -1, dtype="int64")
    pp = ranges.loc[ranges["push_pop"], ["id", "global_tid", "start_ns"]] if len(ranges) else None
    known = calls["api_start"].notna() & calls["global_tid"].notna()
    if pp is None or pp.empty or not known.any():
        return out
    left = pd.DataFrame({
        "row": np.flatnonzero(known.to_numpy()),
        "global_tid": calls.loc[known, "global_tid"].astype("int64").to_numpy(),
        "api_start": calls.loc[known, "api_start"].astype("int64").to_numpy(),
        "api_end": calls.loc[known, "api_end"].astype("int64").to_numpy(),
    }).sort_values("api_start", kind="stable")
    right = pp.sort_values(["start_ns", "id"], kind="stable")
    hit = pd.merge_asof(left, right, left_on="api_start", right_on="start_ns", by="global_tid",
                        direction="backward")
    cand = hit["id"].fillna(-1).to_numpy(dtype="int64")
    cand = _climb(cand, hit["api_end"].to_numpy(), ranges)
    out[hit["row"].to_numpy()] = cand
    return out


def _climb(cand: np.ndarray, api_end: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Walk up parents until the range also covers the call's end (or none is left)."""
    ends = ranges["end_ns"].to_numpy()
    parents = ranges["parent"].fillna(-1).to_numpy(dtype="int64")
    cand = cand.copy()
    while True:
        live = np.flatnonzero(cand >= 0)
        short = live[ends[cand[live]] < api_end[live]]
        if not len(short):
            return cand
        cand[short] = parents[cand[short]]


def range_columns(ids: np.ndarray, ranges: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """``range`` path and ``phase`` for ops given their innermost range ids (-1 = none)."""
    paths = ranges["path"].to_numpy(dtype=object) if len(ranges) else np.array([], dtype=object)
    path = pd.Series(np.where(ids >= 0, paths[np.maximum(ids, 0)] if len(paths) else None, None),
                     dtype="object")
    phases = {p: phase_of(p) for p in path.dropna().unique()}
    phase = path.map(phases).astype("object")
    return path, phase.where(phase.notna(), None)
