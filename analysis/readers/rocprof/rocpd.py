"""SQLite outputs, opened read-only: rocprofv3's rocpd database (schema v3 and later: the views
``kernels``, ``regions``, ``memory_copies``, ``counters_collection`` and ``rocpd_info_agent``) and
rocprof v1's ``results.db`` (one ``KERN`` table, the columns of ``results.csv``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.errors import InputFormatError
from perfscope.limits import take

from .flat import flat_kernels, no_counter_note, pivot_counters
from .tables import api_table, gpu_label, innermost_range, ints, range_table
from .v3csv import DIRECTION

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

HINT = "the database is damaged or not a rocprof output; re-run rocprofv3 (--output-format rocpd)"


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)


def table_names(path: Path) -> set[str]:
    try:
        with connect(path) as db:
            return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except (sqlite3.DatabaseError, UnicodeDecodeError, ValueError):  # damaged: the nsys reader's error names it
        return set()


def _frame(db: sqlite3.Connection, sql: str, path: Path | None = None) -> pd.DataFrame:
    cur = db.execute(sql)
    rows = cur.fetchall()
    take(path or "<rocpd>", len(rows))
    return pd.DataFrame(rows, columns=[d[0] for d in cur.description])


def read_rocpd(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], DeviceSpec | None, dict[str, Any]]:
    from .device import agent_spec

    try:
        db = connect(path)
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        if "kernels" not in names:
            raise InputFormatError(path, "a rocpd database without the `kernels` view (schema before v3?)",
                                   hint="re-write it with rocprofv3 from ROCm 7 or later")
        meta = dict(db.execute("SELECT tag, value FROM rocpd_metadata").fetchall()) if "rocpd_metadata" in names else {}
        k = _frame(db, "SELECT name, agent_abs_index, start, end, corr_id, dispatch_id, stream_id, queue_id, "
                       "grid_x, grid_y, grid_z, workgroup_x, workgroup_y, workgroup_z, vgpr_count, lds_size, pid "
                       "FROM kernels ORDER BY start", path)
        k = k.rename(columns={"name": "kernel_name", "corr_id": "correlation_id_", "dispatch_id": "dispatch_id"})
        k["Correlation_Id"] = k.pop("correlation_id_")
        if "counters_collection" in names:
            c = _frame(db, "SELECT dispatch_id AS Dispatch_Id, counter_name AS Counter_Name, value AS Counter_Value "
                           "FROM counters_collection", path)
            if len(c):
                wide = pivot_counters(c)
                k = k.merge(wide, left_on="dispatch_id", right_on="Dispatch_Id", how="left")
        kernels = flat_kernels(k, warnings, source="rocprofv3")
        no_counter_note(kernels, warnings)
        tables: dict[str, pd.DataFrame] = {"kernels": kernels}
        api = pd.DataFrame()
        if "regions" in names:
            r = _frame(db, "SELECT category, name, tid, start, end, corr_id FROM regions", path)
            hip = r[r["category"].astype(str).str.startswith("HIP")]
            if len(hip):
                api = api_table(hip["name"], hip["start"], hip["end"], thread=hip["tid"], correlation=hip["corr_id"],
                                kind=hip["category"].astype(str).str.contains("COMPILER").map({True: "compiler",
                                                                                               False: "runtime"}))
                tables["api"] = api
            marks = r[r["category"].astype(str).str.startswith("MARKER")]
            marks = marks[marks["end"] > marks["start"]]
            if len(marks):
                ranges = range_table(marks["name"], marks["start"], marks["end"], marks["tid"])
                tables["ranges"] = ranges
                innermost_range(kernels, api, ranges)
        if "memory_copies" in names:
            m = _frame(db, "SELECT name, start, end, size, corr_id, stream_id FROM memory_copies", path)
            if len(m):
                s, e = ints(m["start"]), ints(m["end"])
                kind = m["name"].astype(str).str.replace("MEMORY_COPY_", "", regex=False).map(DIRECTION).fillna("other")
                moved = pd.DataFrame({"kind": kind, "bytes": ints(m["size"]), "start_ns": s, "end_ns": e,
                                      "duration_ns": e - s, "correlation": ints(m["corr_id"]),
                                      "stream": ints(m["stream_id"])})
                tables["transfers"] = moved[moved["bytes"].notna() & s.notna() & e.notna()].reset_index(drop=True)
        agents = _frame(db, "SELECT absolute_index, type, name, product_name, extdata FROM rocpd_info_agent", path) \
            if "rocpd_info_agent" in names else pd.DataFrame()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise InputFormatError(path, f"damaged SQLite database ({type(exc).__name__}: {str(exc)[:120]})",
                               hint=HINT) from None
    spec = agent_spec(_agent(agents, kernels), warnings)
    return tables, spec, {"rocpd_schema_version": meta.get("schema_version")}


def _agent(agents: pd.DataFrame, kernels: pd.DataFrame) -> dict[str, Any] | None:
    if agents.empty:
        return None
    gpus = agents[agents["type"].astype(str) == "GPU"]
    if gpus.empty:
        return None
    busy = kernels["device"].value_counts().index[0] if len(kernels) else None
    hit = gpus[gpus["absolute_index"].map(gpu_label) == busy]
    row = (hit if len(hit) else gpus).iloc[0]
    try:
        ext = json.loads(row["extdata"]) if row["extdata"] else {}
    except (TypeError, ValueError):
        ext = {}
    return {**ext, "name": row["name"], "product_name": row["product_name"] or ext.get("product_name")}


def read_v1_db(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], None, dict[str, Any]]:
    try:
        with connect(path) as db:
            k = _frame(db, "SELECT * FROM KERN", path)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise InputFormatError(path, f"damaged SQLite database ({type(exc).__name__}: {str(exc)[:120]})",
                               hint=HINT) from None
    kernels = flat_kernels(k, warnings, source="rocprof")
    no_counter_note(kernels, warnings)
    return {"kernels": kernels}, None, {}
