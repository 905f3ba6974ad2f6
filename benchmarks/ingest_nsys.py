"""Ingest benchmark: perfscope's nsys SQLite import against a bare sqlite3 + pandas read.

Builds a >= 1M-kernel export by replicating the kernel rows of a real fixture (shifted
timestamps, fresh correlation ids, each with a copy of its launch call in the runtime table)
in a COPY of the file in a temp dir, then times in one run, interleaved round by round:

- baseline: ``pandas.read_sql`` of every kernel row joined to StringIds for its name;
- perfscope: ``read_nsys_sqlite`` (kernels, api, transfers, NVTX ranges and projection,
  device, roofline classification, idle causes, schema checks);
- perfscope with the HTML: the same, then ``render_html`` of the report (what ``perfscope import``
  writes as report.html).

Prints the median wall and CPU time of each (CPU: this process's user + system time around the
call; on a shared machine wall time swings with the others' load, CPU time much less) and the
ratios to the bare read (issue #44: the import <= 1.2x).

Usage::

    python benchmarks/ingest_nsys.py [--kernels 1250000] [--fixture PATH] [--repeat 3] [--no-html]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
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


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    w0, c0 = _clock()
    result = fn()
    w1, c1 = _clock()
    return w1 - w0, c1 - c0, result


def _with_html(path: Path) -> object:
    from perfscope.dashboard.html_report import render_html

    report = read_nsys_sqlite(path)
    render_html(report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=1_250_000)
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-html", action="store_true", help="leave out the import with the HTML")
    parser.add_argument("--keep", type=Path, default=None, help="build the export here and keep it (reused)")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="perfscope-bench-")
    try:
        path = (args.keep or Path(tmp.name)) / "replicated.sqlite"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            n = build(args.fixture, path, args.kernels)
            print(f"built {path.name}: {n:,} kernels from {args.fixture.name} "
                  f"({path.stat().st_size / 2**20:.0f} MiB, {time.perf_counter() - t0:.1f} s)")
        contenders: dict[str, Callable[[], object]] = {
            "bare": lambda: bare_read(path), "import": lambda: read_nsys_sqlite(path)}
        if not args.no_html:
            contenders["import+html"] = lambda: _with_html(path)
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
        counts = {}
        for _ in range(args.repeat):  # interleaved: a change of load falls on every contender alike
            for name, fn in contenders.items():
                wall, cpu, result = _timed(fn)
                runs[name].append((wall, cpu))
                counts[name] = len(result) if name == "bare" else len(result.kernels)  # type: ignore[attr-defined]
                del result
        assert len(set(counts.values())) == 1, counts
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
        print(f"{counts['bare']:,} kernels; {os.cpu_count()} CPUs, load average "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; medians of {args.repeat}")
        labels = {"bare": "bare sqlite3 + pandas.read_sql (kernels + names)",
                  "import": "perfscope read_nsys_sqlite (full report)",
                  "import+html": "perfscope read_nsys_sqlite + report.html"}
        for name, (wall, cpu) in med.items():
            print(f"{labels[name]:<52} wall {wall:6.2f} s  CPU {cpu:6.2f} s  runs "
                  f"{[round(w, 2) for w, _ in runs[name]]}")
        base_w, base_c = med["bare"]
        for name in [n for n in med if n != "bare"]:
            w, c = med[name]
            print(f"ratio {name} / bare: wall {w / base_w:.2f}x, CPU {c / base_c:.2f}x"
                  + (" (goal <= 1.2x)" if name == "import" else ""))
        print(" ".join(f"nsys_{n.replace('+', '_')}_ratio={med[n][0] / base_w:.2f} "
                       f"nsys_{n.replace('+', '_')}_cpu_ratio={med[n][1] / base_c:.2f}" for n in med if n != "bare"))
    finally:
        tmp.cleanup()


if __name__ == "__main__":
    main()
