"""Read-only access to an Nsight Systems SQLite export, with schema probing.

Exports differ by nsys version (FORMATS.md section 1.10): tables appear only when something
was captured, columns come and go (``greenContextId``, ``mangledName``), the metadata table
was renamed, and the ``ENUM_*`` lookup tables exist only in newer exports. Every query here
is built from what ``sqlite_master`` and ``PRAGMA table_info`` say is present. The user's
file is opened through the limits layer (:class:`perfscope.safedb.SafeDb`): read-only, only real
tables read (an nsys export has no views: a view in one is never run), rows fetched in counted
batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfscope.errors import InputFormatError
from perfscope.safedb import SafeDb
from perfscope.schema import whole_numbers

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from types import TracebackType

METADATA_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
NSYS_MARKER_TABLES = ("StringIds", *METADATA_TABLES)
PID_SHIFT = 24
"""A serialized globalTid's low 24 bits are the TID; masking them off gives the globalPid key."""
SQL_CHUNK = 900
NULL_SENTINEL = -9223372036854775807
"""Stands for SQL NULL in integer reads (no nsys id, time or size takes this value)."""

EXPORT_HINT = (
    "re-export it with `nsys export --type sqlite --force-overwrite true REPORT.nsys-rep`, "
    "or import the .nsys-rep directly"
)


def _bits(ids: pd.Series, fn: Callable[[np.ndarray], np.ndarray]) -> pd.Series:
    """``fn`` over the whole numbers of ``ids``; missing where an id is unknown (NULL, or a value no
    export has: :meth:`NsysDb.whole`), so one damaged id costs its row's thread or process, not the file."""
    values = whole_numbers(ids)
    missing = values.isna().to_numpy()
    bits = fn(values.to_numpy(dtype="int64", na_value=0))
    return pd.Series(pd.arrays.IntegerArray(bits, missing) if missing.any() else bits, index=ids.index)


def process_key(global_tid: pd.Series) -> pd.Series:
    """``globalTid & 0xFFFFFFFFFF000000``: the process key equal to the GPU tables' globalPid."""
    return _bits(global_tid, lambda v: (v >> PID_SHIFT) << PID_SHIFT)


def tid_of(global_tid: pd.Series) -> pd.Series:
    """Operating-system thread id (low 24 bits of a serialized globalTid)."""
    return _bits(global_tid, lambda v: v & 0xFFFFFF)


def pid_of(global_id: pd.Series) -> pd.Series:
    """Operating-system process id (bits 24-47 of a serialized globalTid / globalPid)."""
    return _bits(global_id, lambda v: (v >> PID_SHIFT) & 0xFFFFFF)


class NsysDb:
    """An open nsys export: probed tables and columns, strings, enums and metadata.

    Use as a context manager. Every SQLite error becomes an InputFormatError naming the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.db = SafeDb(self.path, hint=EXPORT_HINT)
        self._columns: dict[str, tuple[str, ...]] = {}
        self.notes: list[str] = []
        """What was read as unknown, naming its table and column (:meth:`whole`): for the report's warnings."""
        self.tables: frozenset[str] = self.db.tables
        self.views = sorted(self.db.views)  # an nsys export holds tables only: a view is never run
        if not any(t in self.tables for t in NSYS_MARKER_TABLES):
            self.close()
            raise InputFormatError(
                self.path,
                "is an SQLite database but not an Nsight Systems export (no StringIds or "
                "META_DATA_EXPORT table)",
                hint="give the file written by `nsys export --type sqlite`",
            )

    def __enter__(self) -> NsysDb:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ probing
    def has(self, table: str, column: str | None = None) -> bool:
        """Whether ``table`` (and ``column`` in it) exists."""
        if table not in self.tables:
            return False
        return column is None or column in self.columns(table)

    def columns(self, table: str) -> tuple[str, ...]:
        """Column names of ``table`` (empty when the table is absent)."""
        if table not in self.tables:
            return ()
        if table not in self._columns:
            self._columns[table] = self.db.columns(table)
        return self._columns[table]

    def present(self, table: str, wanted: Iterable[str]) -> list[str]:
        """The subset of ``wanted`` columns that ``table`` has, in the given order."""
        have = set(self.columns(table))
        return [c for c in wanted if c in have]

    # ------------------------------------------------------------------ reading
    def fetch(self, sql: str, params: Iterable[object] = ()) -> list[tuple[Any, ...]]:
        """All rows of a query (fetched in batches counted against the budget); SQLite errors and
        refusals become InputFormatError."""
        return self.db.rows(sql, params)

    def frame(self, sql: str, columns: list[str], params: Iterable[object] = ()) -> pd.DataFrame:
        """A query's rows as a DataFrame with the given column names."""
        rows = self.fetch(sql, params)
        if not rows:
            return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})
        return pd.DataFrame.from_records(rows, columns=columns, coerce_float=False)

    def int_frame(self, table: str, exprs: Mapping[str, str]) -> pd.DataFrame:
        """Integer columns of ``table`` (name -> SQL expression), read without per-cell objects.

        NULLs travel as a sentinel so the rows convert to one int64 array in C; columns with
        NULLs come back as nullable ``Int64``. Falls back to a generic read when a value is not
        an integer (SQLite columns are dynamically typed).
        """
        names = list(exprs)
        select = ", ".join(f"COALESCE({e}, {NULL_SENTINEL})" for e in exprs.values())
        parts = []
        try:
            # a batch of rows at a time into int64: one batch of Python ints alive, never the table's
            for batch in self.db.batches(f'SELECT {select} FROM "{table}"'):
                parts.append(np.array(batch, dtype="int64").reshape(len(batch), len(names)))
        except (TypeError, ValueError, OverflowError):
            parts = []
            frame = self.frame(f'SELECT {", ".join(exprs.values())} FROM "{table}"', names)
            return self.whole(table, frame, names)
        block = np.concatenate(parts) if parts else np.zeros((0, len(names)), dtype="int64")
        out = {}
        for j, name in enumerate(names):
            col = block[:, j]
            missing = col == NULL_SENTINEL
            out[name] = pd.arrays.IntegerArray(col, missing) if missing.any() else col
        return pd.DataFrame(out)

    def whole(self, table: str, frame: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
        """``frame`` (rows of ``table``) with ``columns`` as nullable whole numbers. nsys writes typed
        integer columns, but SQLite keeps whatever a cell was given: a value that is not a whole number in
        int64 (text, ±inf, past 2^63) is read as unknown, and each column's count is noted in :attr:`notes`
        under its table and column, so the report says what was lost and the rest of the file is read."""
        out = frame.copy()
        for col in columns:
            if col not in out:
                continue
            values = whole_numbers(out[col])
            lost = int((out[col].notna() & values.isna()).sum())
            if lost:
                self.notes.append(f"{table}.{col}: {lost} value(s) not a whole number (no nsys export writes "
                                  "one), read as unknown")
            out[col] = values
        return out

    def timed(self, table: str, frame: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
        """The rows of ``frame`` (rows of ``table``) whose ``columns`` (their times) are all known; the rows
        without (NULL, or unreadable: :meth:`whole`) are dropped and counted in :attr:`notes` under their
        table, so a report never loses rows without saying so."""
        cols = [c for c in columns if c in frame]
        known = frame[cols].notna().all(axis=1).to_numpy(bool) if cols else np.ones(len(frame), dtype=bool)
        if known.all():
            return frame
        self.notes.append(f"{table}: {int((~known).sum())} row(s) without a readable {'/'.join(cols)} dropped")
        return frame.loc[known]

    def strings(self, ids: Iterable[object]) -> dict[int, str]:
        """``StringIds`` values for the given ids (missing ids are absent from the result)."""
        values = pd.to_numeric(pd.Series(ids if isinstance(ids, pd.Series) else list(ids)), errors="coerce")
        wanted = pd.unique(values.dropna().astype("int64"))
        if not len(wanted) or not self.has("StringIds"):
            return {}
        out: dict[int, str] = {}
        for start in range(0, len(wanted), SQL_CHUNK):
            chunk = [int(v) for v in wanted[start:start + SQL_CHUNK]]
            marks = ",".join("?" * len(chunk))
            for key, value in self.fetch(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", chunk):
                out[int(key)] = _text(value)
        return out

    def enum(self, table: str, fallback: Mapping[int, str], *, field: str = "name") -> dict[int, str]:
        """An ``ENUM_*`` table as {id: name or label}, or ``fallback`` when the table is absent."""
        if not self.has(table, field) or not self.has(table, "id"):
            return dict(fallback)
        return {int(i): str(v) for i, v in self.fetch(f'SELECT id, "{field}" FROM "{table}"')}

    def metadata(self) -> dict[str, str]:
        """The export's key/value metadata (either table name), first value per key."""
        for table in METADATA_TABLES:
            if self.has(table, "name") and self.has(table, "value"):
                out: dict[str, str] = {}
                for key, value in self.fetch(f'SELECT name, value FROM "{table}"'):
                    out.setdefault(str(key), _text(value))
                return out
        return {}

    def max_timestamp(self, table: str) -> int | None:
        """The largest ``start``/``end`` value in ``table``, or None when empty."""
        cols = self.present(table, ("start", "end"))
        if not cols:
            return None
        # integers only: SQLite's MAX ranks text above every number, and a text cell is no time
        maxes = ", ".join(f"""MAX(CASE WHEN typeof("{c}") = 'integer' THEN "{c}" END)""" for c in cols)
        row = self.fetch(f'SELECT {maxes} FROM "{table}"')
        values = [int(v) for v in row[0] if v is not None] if row else []
        return max(values) if values else None


def lookup_strings(ids: pd.Series, table: dict[int, str], default: str | None = None) -> pd.Series:
    """Map integer ids to strings without a Python call per row (an index lookup + take)."""
    keys = np.fromiter(table.keys(), dtype="int64", count=len(table))
    values = np.array([*table.values(), default], dtype=object)
    codes = pd.to_numeric(ids, errors="coerce").fillna(-1).to_numpy(dtype="int64")
    pos = pd.Index(keys).get_indexer(codes)
    return pd.Series(values[pos], index=ids.index, dtype="object")


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)
