"""Ingest benchmark: perfscope's nsys SQLite import against a bare sqlite3 + pandas read.

Builds a >= 1M-kernel export by replicating the kernel rows of a real fixture (shifted
timestamps, fresh correlation ids, each with a copy of its launch call in the runtime table)
in a COPY of the file in a temp dir, then times in one run:

- baseline: ``pandas.read_sql`` of every kernel row joined to StringIds for its name;
- perfscope: ``read_nsys_sqlite`` (kernels, api, transfers, NVTX ranges and projection,
  device, roofline classification, schema checks).

Prints both times and the ratio (goal: perfscope within 1.5x of the bare read).

Usage::

    python benchmarks/ingest_nsys.py [--kernels 1000000] [--fixture PATH] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from perfscope.analysis.readers.nsys.reader import read_nsys_sqlite

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nsys" / "nvfuser_h100_matmul.sqlite"
BASELINE_SQL = (
    "SELECT k.*, s.value AS name FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
    "JOIN StringIds AS s ON s.id = k.demangledName"
)


def build(fixture: Path, target: Path, kernels: int) -> int:
    """Copy ``fixture`` to ``target`` and replicate its kernels (and their launch calls) there.

    Returns:
        The number of kernel rows in the result.
    """
    shutil.copyfile(fixture, target)
    conn = sqlite3.connect(target)
    try:
        base = conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        copies = -(-kernels // base)
        lo, hi = conn.execute(
            "SELECT MIN(start), MAX(end) FROM (SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL "
            "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_RUNTIME)").fetchone()
        max_corr = conn.execute("SELECT MAX(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        span, stride = hi - lo + 1, max_corr + 1
        conn.execute("CREATE TEMP TABLE copies(i INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO copies VALUES (?)", [(i,) for i in range(1, copies)])
        _replicate(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", span, stride,
                   "WHERE correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL)")
        _replicate(conn, "CUPTI_ACTIVITY_KIND_KERNEL", span, stride, "")
        conn.commit()
        return conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    finally:
        conn.close()


def _replicate(conn: sqlite3.Connection, table: str, span: int, stride: int, where: str) -> None:
    cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    shifted = {"start": f"t.start + c.i * {span}", "end": f"t.end + c.i * {span}",
               "correlationId": f"t.correlationId + c.i * {stride}"}
    select = ", ".join(shifted.get(c, f"t.{c}") for c in cols)
    conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) "
                 f"SELECT {select} FROM (SELECT * FROM {table} {where}) AS t, copies AS c "
                 "ORDER BY c.i")


def bare_read(path: Path) -> pd.DataFrame:
    """The baseline: every kernel row and its demangled name, with sqlite3 + pandas."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return pd.read_sql(BASELINE_SQL, conn)
    finally:
        conn.close()


def _time(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfscope-bench-") as tmp:
        path = Path(tmp) / "replicated.sqlite"
        t0 = time.perf_counter()
        n = build(args.fixture, path, args.kernels)
        print(f"built {path.name}: {n:,} kernels from {args.fixture.name} "
              f"({path.stat().st_size / 2**20:.0f} MiB, {time.perf_counter() - t0:.1f} s)")
        base_s, frame = _time(lambda: bare_read(path), args.repeat)
        ours_s, report = _time(lambda: read_nsys_sqlite(path), args.repeat)
        assert len(frame) == len(report.kernels) == n, (len(frame), len(report.kernels), n)
        print(f"bare sqlite3 + pandas.read_sql (kernels + names): {base_s:.2f} s")
        print(f"perfscope read_nsys_sqlite (full report):          {ours_s:.2f} s")
        print(f"ratio perfscope / bare: {ours_s / base_s:.2f}x (goal <= 1.5x; median of {args.repeat})")


if __name__ == "__main__":
    main()
