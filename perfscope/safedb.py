"""SQLite inputs read under the limits layer: the SQLite half of it (nsys exports, rocpd, rocprof v1 ``.db``).

An SQLite file is a program as much as data: a view is a query that runs when it is read (a recursive
CTE spins or grows without end, ``zeroblob(4e9)`` allocates gigabytes, a sort spills to ``/var/tmp``).
:class:`SafeDb` opens one so that nothing in the file decides how much work or memory a read takes:

- opened read-only (``mode=ro``; ``immutable=1`` for files on read-only media), ``query_only``;
- temporary storage in memory (``temp_store=MEMORY``: no temporary file in ``/var/tmp``), bounded by
  :data:`TEMP_PAGES` pages of the temp database and SQLite's heap by :data:`HEAP_LIMIT` bytes while the
  file is open; a string or blob over :data:`MAX_VALUE_BYTES` is an error (``SQLITE_LIMIT_LENGTH``);
- an authorizer that lets a statement read real tables, and views only when the reader trusts them
  (``trusted``: the tool's own definition, compared by its SQL); it refuses recursive queries, every
  function outside :data:`FUNCTIONS` and every pragma but ``table_info``;
- a progress handler every :data:`PROGRESS_STEPS` virtual-machine steps that ends a statement past its
  step budget (:data:`STEPS_PER_BYTE` x the file's size, at least :data:`MIN_STEPS`) or past the
  import's deadline (:func:`perfscope.limits.check_deadline`);
- rows fetched in batches of :data:`BATCH_ROWS`, each batch counted against ``--max-events`` and the
  memory budget as it arrives (:func:`perfscope.limits.take`), never after a ``fetchall()``.

Every refusal and every SQLite error is one :class:`InputFormatError` line naming the file.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputFormatError, PerfscopeError
from .inputs import regular_file
from .limits import check_deadline, take

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import TracebackType

    import pandas as pd

BATCH_ROWS = 50_000
"""Rows fetched (and counted) at a time."""
PROGRESS_STEPS = 10_000
"""SQLite virtual-machine steps between two calls of the progress handler."""
STEPS_PER_BYTE = 2_000
MIN_STEPS = 200_000_000
"""A statement's step budget: ``max(MIN_STEPS, STEPS_PER_BYTE x file size)``. A plain scan or join of the
file's tables takes a few steps per byte; only a query that makes rows out of nothing (a recursive
view, a cross join of a table with itself) reaches it (about 1-5 s at MIN_STEPS)."""
HEAP_LIMIT = 768 << 20
"""Bytes SQLite may allocate while a guarded file is open (``PRAGMA hard_heap_limit``)."""
TEMP_PAGES = 65_536
"""Pages of the temporary database (``temp.max_page_count``; 256 MiB at 4 KiB pages)."""
MAX_VALUE_BYTES = 64 << 20
"""The longest string or blob a query may make or read (``SQLITE_LIMIT_LENGTH``)."""
FUNCTIONS = frozenset({"coalesce", "ifnull", "min", "max", "sum", "total", "count", "abs", "typeof", "length"})
"""SQL functions a statement may call (rocpd's own views use min, sum; perfscope's queries coalesce, max)."""
PRAGMAS = frozenset({"table_info", "table_xinfo"})
SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})


def normalized_sql(sql: str | None) -> str:
    """A view's SQL compared without case, backticks, quotes or whitespace differences."""
    return re.sub(r"\s+", " ", re.sub(r"[`\"\[\]]", "", sql or "")).strip().lower()


class SafeDb:
    """One guarded SQLite file (see the module doc); a context manager.

    Attributes:
        tables: the file's real tables.
        views: each view's SQL (by name).
        trusted: the views statements may read.
    """

    def __init__(self, path: str | Path, *, hint: str, trust: Callable[[SafeDb, str, str], bool] | None = None) -> None:
        self.path = regular_file(path)
        self.hint = hint
        self.steps = 0
        self.step_budget = max(MIN_STEPS, STEPS_PER_BYTE * self.path.stat().st_size)
        self.refused: str | None = None
        self.conn = _connect(self.path, hint)
        self._heap: int | None = None
        self.description: Any = ()
        try:
            self._guard()
            rows = self.conn.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'view')")
            schema = [(str(t), str(n), s if isinstance(s, str) else None) for t, n, s in rows.fetchall()]
        except (sqlite3.DatabaseError, UnicodeDecodeError, ValueError) as exc:
            self.close()
            raise self.error(exc) from None
        except BaseException:
            self.close()
            raise
        self.tables: frozenset[str] = frozenset(n for t, n, _ in schema if t == "table")
        self.views: dict[str, str | None] = {n: s for t, n, s in schema if t == "view"}
        self.trusted: frozenset[str] = frozenset(n for n, s in self.views.items() if trust and trust(self, n, s or ""))

    # ------------------------------------------------------------------ guards
    def _guard(self) -> None:
        c = self.conn
        c.execute("PRAGMA temp_store = MEMORY")
        self.temp_store = int(c.execute("PRAGMA temp_store").fetchone()[0])  # 2: MEMORY
        c.execute(f"PRAGMA temp.max_page_count = {TEMP_PAGES}")
        c.execute("PRAGMA query_only = 1")
        c.execute("PRAGMA trusted_schema = 0")
        heap = c.execute("PRAGMA hard_heap_limit").fetchone()
        self._heap = int(heap[0]) if heap else 0
        if not self._heap or self._heap > HEAP_LIMIT:
            c.execute(f"PRAGMA hard_heap_limit = {HEAP_LIMIT}")
        c.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        c.set_authorizer(self._authorize)
        c.set_progress_handler(self._progress, PROGRESS_STEPS)

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if action == sqlite3.SQLITE_SELECT:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            if source is not None and source not in self.trusted and not self._cte(source):
                return self._refuse(f"the view `{source}`, which is not the tool's own definition")
            if arg1 in SCHEMA_TABLES or arg1 in self.tables or arg1 in self.trusted or (arg1 and self._cte(arg1)):
                return sqlite3.SQLITE_OK
            return self._refuse(f"`{arg1}`, a view that is not the tool's own definition")
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in FUNCTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in PRAGMAS:
            return sqlite3.SQLITE_OK
        what = {sqlite3.SQLITE_FUNCTION: f"the SQL function {arg2}()", sqlite3.SQLITE_RECURSIVE: "a recursive query",
                sqlite3.SQLITE_PRAGMA: f"PRAGMA {arg1}"}.get(action, f"a statement of kind {action}")
        return self._refuse(what)

    def _cte(self, name: str) -> bool:
        """A common table expression's name (not an object of the file): its reads are checked as they go."""
        return name not in self.tables and name not in self.views and name not in SCHEMA_TABLES

    def _refuse(self, what: str) -> int:
        self.refused = self.refused or what
        return sqlite3.SQLITE_DENY

    def _progress(self) -> int:
        self.steps += PROGRESS_STEPS
        if self.steps > self.step_budget:
            self.refused = (f"a query past its budget of {self.step_budget:,} SQLite steps "
                            "(a view or table that makes rows without end)")
            return 1
        try:
            check_deadline(self.path)
        except PerfscopeError:
            self.refused = "the import's deadline"
            return 1
        return 0

    # ------------------------------------------------------------------ errors
    def error(self, exc: BaseException) -> InputFormatError:
        """The one error line of an SQLite failure (or refusal) while reading this file."""
        if self.refused is not None:
            return InputFormatError(self.path, f"a read of this database was refused: {self.refused}",
                                    hint=self.hint)
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        if isinstance(exc, sqlite3.DatabaseError) and "memory" in first.lower():
            first += f" (past the {HEAP_LIMIT >> 20} MiB SQLite may take)"
        return InputFormatError(self.path, f"damaged or truncated SQLite database ({first})", hint=self.hint)

    # ------------------------------------------------------------------ reading
    def rows(self, sql: str, params: Iterable[object] = ()) -> list[tuple[Any, ...]]:
        """Every row of a query, fetched in batches of :data:`BATCH_ROWS` counted against the budget."""
        self.steps, self.refused = 0, None
        out: list[tuple[Any, ...]] = []
        try:
            cur = self.conn.execute(sql, tuple(params))
            while batch := cur.fetchmany(BATCH_ROWS):
                take(self.path, len(batch))
                out.extend(batch)
        except (sqlite3.DatabaseError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
            raise self.error(exc) from None
        self.description = cur.description
        return out

    def batches(self, sql: str, params: Iterable[object] = ()) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of a query, a batch of :data:`BATCH_ROWS` at a time (each counted against the
        budget as :meth:`rows` does): a caller that turns each batch into arrays holds one batch of
        Python objects, never the whole result."""
        self.steps, self.refused = 0, None
        try:
            cur = self.conn.execute(sql, tuple(params))
            while batch := cur.fetchmany(BATCH_ROWS):
                take(self.path, len(batch))
                yield batch
        except (sqlite3.DatabaseError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
            raise self.error(exc) from None
        self.description = cur.description

    def meta(self, sql: str, params: Iterable[object] = ()) -> list[tuple[Any, ...]]:
        """A small query's rows (schema probes, metadata), not counted as events."""
        self.steps, self.refused = 0, None
        try:
            return self.conn.execute(sql, tuple(params)).fetchmany(BATCH_ROWS)
        except (sqlite3.DatabaseError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
            raise self.error(exc) from None

    def columns(self, name: str) -> tuple[str, ...]:
        """Column names of a real table or trusted view (empty when there is no such object)."""
        if name not in self.tables and name not in self.trusted:
            return ()
        return tuple(str(r[1]) for r in self.meta(f'PRAGMA table_info("{name}")'))

    def frame(self, sql: str, params: Iterable[object] = ()) -> pd.DataFrame:
        """:meth:`rows` as a DataFrame named by the query's columns."""
        import pandas as pd

        rows = self.rows(sql, params)
        return pd.DataFrame(rows, columns=[d[0] for d in self.description])

    def close(self) -> None:
        try:
            self.conn.set_authorizer(None)
            self.conn.set_progress_handler(None, 0)
            if self._heap is not None and (not self._heap or self._heap > HEAP_LIMIT):
                self.conn.execute(f"PRAGMA hard_heap_limit = {self._heap}")
        except sqlite3.Error:
            pass
        self.conn.close()

    def __enter__(self) -> SafeDb:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _connect(path: Path, hint: str) -> sqlite3.Connection:
    """Open read-only; fall back to ``immutable=1`` for files on read-only media."""
    # imported here: urllib.request imports http, ssl and email (about 10 ms of every start)
    from urllib.request import pathname2url

    url = pathname2url(str(path.resolve()))
    last: BaseException | None = None
    for options in ("mode=ro", "mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(f"file:{url}?{options}", uri=True)
            conn.text_factory = _decode_text
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return conn
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            last = exc
    first = (str(last).splitlines() or [type(last).__name__])[0][:160]
    raise InputFormatError(path, f"is damaged or truncated: SQLite cannot open it ({first})", hint=hint)


def _decode_text(raw: bytes) -> str:
    """Text columns decoded leniently: a non-UTF-8 kernel name must not stop the import."""
    return raw.decode("utf-8", errors="replace")


__all__ = ["BATCH_ROWS", "FUNCTIONS", "HEAP_LIMIT", "MAX_VALUE_BYTES", "SafeDb", "normalized_sql"]
