"""SQLite outputs, read through the limits layer (:class:`perfscope.safedb.SafeDb`): rocprofv3's rocpd
database (schema v3 and later: the views ``kernels``, ``regions``, ``memory_copies``,
``counters_collection`` and ``rocpd_info_agent``) and rocprof v1's ``results.db`` (one ``KERN`` table, the
columns of ``results.csv``).

A rocpd view runs only when it is rocprofv3's own (:func:`trusted_view`): the per-run passthrough views
(``rocpd_kernel_dispatch`` = ``SELECT * FROM rocpd_kernel_dispatch_<run uuid>``, a real table) and the
analysis views whose SQL, compared without case and whitespace, is the one rocprofv3 writes
(:data:`KNOWN_VIEWS`). Any other view (a recursive ``kernels``, a ``zeroblob`` one) is never run: the
import ends with one line naming it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.errors import InputFormatError
from perfscope.safedb import SafeDb, normalized_sql

from .flat import flat_kernels, no_counter_note, pivot_counters
from .tables import api_table, gpu_label, innermost_range, ints, range_table
from .v3csv import DIRECTION

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

HINT = "the database is damaged or not a rocprof output; re-run rocprofv3 (--output-format rocpd)"
UNTRUSTED_HINT = ("perfscope runs only rocprofv3's own views (ROCm 7 rocpd schema v3); import the run's CSV or JSON "
                  "output instead (rocprofv3 --output-format csv)")
KNOWN_VIEWS: dict[str, frozenset[str]] = {
    "kernels": frozenset({"e5e11e1b306e7d8c"}),
    "regions": frozenset({"4a132327708ca53e"}),
    "memory_copies": frozenset({"1ef8723a315892a8"}),
    "counters_collection": frozenset({"8776e5744be5eab6"}),
}
"""The analysis views perfscope reads -> the SHA-256 (first 16 hex digits) of their SQL as rocprofv3 writes
them (rocpd schema v3: :func:`perfscope.safedb.normalized_sql` of the views of the committed R9700 rocpd
database, tests/fixtures/rocprof/llamacpp_r9700_rocpd, ROCm 7)."""
PASSTHROUGH = re.compile(r"create view (rocpd_\w+) as select \* from (rocpd_\w+)")


def view_digest(sql: str) -> str:
    return hashlib.sha256(normalized_sql(sql).encode()).hexdigest()[:16]


def trusted_view(db: SafeDb, name: str, sql: str) -> bool:
    """rocprofv3's own view: a passthrough onto its run's real table, or an analysis view of :data:`KNOWN_VIEWS`."""
    m = PASSTHROUGH.fullmatch(normalized_sql(sql))
    if m is not None:
        return m.group(1) == name and m.group(2).startswith(name + "_") and m.group(2) in db.tables
    return view_digest(sql) in KNOWN_VIEWS.get(name, frozenset())


def open_db(path: Path) -> SafeDb:
    return SafeDb(path, hint=HINT, trust=trusted_view)


def table_names(path: Path) -> set[str]:
    """Tables and views of an SQLite file (empty when damaged: the nsys reader's error then names it)."""
    try:
        with open_db(path) as db:
            return set(db.tables) | set(db.views)
    except InputFormatError:
        return set()


def _untrusted(db: SafeDb, name: str) -> InputFormatError:
    return InputFormatError(db.path, f"its `{name}` view is not rocprofv3's own definition: not run",
                            hint=UNTRUSTED_HINT)


def read_rocpd(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], DeviceSpec | None, dict[str, Any]]:
    from .device import agent_spec

    with open_db(path) as db:
        return _read_rocpd(db, path, warnings, agent_spec)


def _read_rocpd(db: SafeDb, path: Path, warnings: list[str], agent_spec: Any) -> tuple[
        dict[str, pd.DataFrame], DeviceSpec | None, dict[str, Any]]:
    if "kernels" not in db.tables and "kernels" not in db.views:
        raise InputFormatError(path, "a rocpd database without the `kernels` view (schema before v3?)",
                               hint="re-write it with rocprofv3 from ROCm 7 or later")
    if "kernels" in db.views and "kernels" not in db.trusted:
        raise _untrusted(db, "kernels")
    names = set(db.tables) | set(db.trusted)  # what may be read
    for view in ("regions", "memory_copies", "counters_collection", "rocpd_info_agent", "rocpd_metadata"):
        if view in db.views and view not in db.trusted:
            warnings.append(f"the `{view}` view is not rocprofv3's own definition: not read")
    meta = dict(db.meta("SELECT tag, value FROM rocpd_metadata")) if "rocpd_metadata" in names else {}
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
            tables["transfers"] = moved[s.notna() & e.notna()].reset_index(drop=True)  # no size: bytes missing
    agents = _frame(db, "SELECT absolute_index, type, name, product_name, extdata FROM rocpd_info_agent", path) \
        if "rocpd_info_agent" in names else pd.DataFrame()
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


def _frame(db: SafeDb, sql: str, path: Path | None = None) -> pd.DataFrame:
    return db.frame(sql)


def read_v1_db(path: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], None, dict[str, Any]]:
    with SafeDb(path, hint=HINT) as db:
        if "KERN" not in db.tables:
            raise InputFormatError(path, "no KERN table (a rocprof v1 results.db holds one)", hint=HINT)
        k = _frame(db, "SELECT * FROM KERN", path)
    kernels = flat_kernels(k, warnings, source="rocprof")
    no_counter_note(kernels, warnings)
    return {"kernels": kernels}, None, {}
