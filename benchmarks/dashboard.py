"""Dashboard responsiveness on a 1M-kernel report built by tiling a real H100 trace.

Measures, through the same callback functions the Dash app binds:
- the timeline callback (full view = busy bins, then zoom windows down to individual kernels),
- the roofline callback (per kernel, per name, with a name filter and a phase filter),
each as median latency over repeats and as the size of the figure JSON Dash sends
(goals: < 300 ms and < 3 MB per update); the first call (which builds the per-report
indexes) is reported apart. Then the first page load in headless Chromium (time until the
overview is rendered), or the overview callback when Chromium is absent.
Every figure is also measured on the untiled report, and the ratio is printed.

Run: python benchmarks/dashboard.py [--kernels 1000000] [--repeats 5] [--loads 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from plotly.io.json import to_json_plotly

from perfscope.analysis.readers.detect import import_file
from perfscope.dashboard import callbacks as cb
from perfscope.dashboard import ids
from perfscope.dashboard.store import ReportStore
from perfscope.report import Report

FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/kineto/tracelens_h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def tile(report: Report, n_kernels: int) -> Report:
    """``report`` repeated back to back (timestamps shifted) until it holds ``n_kernels`` kernels."""
    k = report.kernels
    span = int(max(k["end_ns"].max(), report.transfers["end_ns"].max()) - k["start_ns"].min()) + 10_000
    copies = -(-n_kernels // len(k))

    def repeat(df: pd.DataFrame, cols: tuple[str, ...]) -> pd.DataFrame:
        shifts = np.repeat(np.arange(copies, dtype="int64") * span, len(df))
        out = pd.concat([df] * copies, ignore_index=True)
        for col in cols:
            out[col] = out[col].astype("int64") + shifts
        return out

    kernels = repeat(k, ("start_ns", "end_ns")).head(n_kernels)
    phases = np.where((np.arange(len(kernels)) // len(k)) % 8 == 0, "prefill", "decode")
    kernels["phase"] = pd.Series(phases, dtype="object")  # alternate phases so the phase filter has work
    tiled = report.replace(kernels=kernels, transfers=repeat(report.transfers, ("start_ns", "end_ns")),
                           ranges=repeat(report.ranges, ("start_ns", "end_ns")).assign(
                               id=lambda d: np.arange(len(d)), parent=pd.NA))
    return tiled.with_manifest(name=f"tiled-{n_kernels}")


def measure(fn: Callable[[], object], repeats: int) -> tuple[float, float, int]:
    """(first call ms, median of the following calls ms, JSON bytes of the last result)."""
    t = time.perf_counter()
    out = fn()
    first = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return first, statistics.median(times), len(to_json_plotly(out).encode())


def scenarios(store: ReportStore, key: str) -> dict[str, Callable[[], object]]:
    """The callback invocations measured, by name."""
    full = cb.on_timeline(store, key, "timeline", None, ids.REPORT)
    lo, hi = full.layout.xaxis.range
    span = hi - lo

    def zoom(frac: float) -> Callable[[], object]:
        start = lo + span * 0.37
        window = {"xaxis.range[0]": start, "xaxis.range[1]": start + span * frac}
        return lambda: cb.on_timeline(store, key, "timeline", window, ids.TIMELINE_ZOOM)

    def roof(per: str, phase: str = "all", name: str | None = None) -> Callable[[], object]:
        return lambda: cb.on_roofline(store, key, "roofline", per, "bound", phase, None, name)

    from perfscope.analysis.summaries.hierarchy import hierarchy

    top = hierarchy(store.load(key)).nodes
    biggest = {"points": [{"customdata": int(top["node"].iat[0])}]}
    deeper = {"points": [{"customdata": int(top["node"].iat[min(2, len(top) - 1)])}]}
    every = hierarchy(store.load(key), collapse=False).nodes
    top_instance = {"points": [{"customdata": int(every["node"].iat[0])}]}
    return {
        "tree icicle": lambda: cb.on_tree(store, key, "tree", "all"),
        "tree click top node": lambda: cb.on_tree_select(store, key, "tree", "all", biggest)[0],
        "tree click deeper node": lambda: cb.on_tree_select(store, key, "tree", "all", deeper)[0],
        "tree phase=decode": lambda: cb.on_tree(store, key, "tree", "decode"),
        "tree every instance": lambda: cb.on_tree(store, key, "tree", "all", "expanded"),
        "tree click, every instance": lambda: cb.on_tree_select(store, key, "tree", "all", top_instance, None, "expanded")[0],
        "timeline full (bins)": lambda: cb.on_timeline(store, key, "timeline", None, ids.REPORT),
        "timeline zoom 10%": zoom(0.10), "timeline zoom 1%": zoom(0.01), "timeline zoom 0.01%": zoom(1e-4),
        "roofline per kernel": roof("kernel"), "roofline per name": roof("name"),
        "roofline name~gemm": roof("kernel", name="gemm"), "roofline phase=decode": roof("kernel", "decode"),
    }


def page_load_ms(root: Path, loads: int = 1) -> tuple[str, list[float], list[float]]:
    """Times to a rendered overview, and to its findings (drawn after it), in headless Chromium,
    each from a fresh app (cold server cache) and a fresh browser profile; a load ends when its
    findings are drawn, so no rule run of one load overlaps the next. Without Chromium: the
    overview and findings callbacks."""
    from perfscope.dashboard.app import create_app

    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        times, done = [], []
        for _ in range(loads):
            store = ReportStore([root])
            key = store.entries()[0].key
            t = time.perf_counter()
            cb.on_overview(store, key)
            times.append((time.perf_counter() - t) * 1e3)
            cb.on_findings(store, key)
            done.append((time.perf_counter() - t) * 1e3)
        return "overview callback (no chromium)", times, done
    import logging
    import threading

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no request log in the results
    times, done = [], []
    for _ in range(loads):
        server = make_server("127.0.0.1", 0, create_app([root]).server, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        opts = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    f"--user-data-dir={tempfile.mkdtemp(prefix='perfscope-bench-chrome-')}"):
            opts.add_argument(arg)
        drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
        try:
            t = time.perf_counter()
            drv.get(f"http://127.0.0.1:{server.server_port}/")
            WebDriverWait(drv, 300).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#headline"))
            times.append((time.perf_counter() - t) * 1e3)
            WebDriverWait(drv, 300).until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#{ids.FINDINGS} h3"))
            done.append((time.perf_counter() - t) * 1e3)
        finally:
            drv.quit()
            server.shutdown()
    return "first page load, headless Chromium (cold server cache)", times, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--loads", type=int, default=5, help="first page loads to time (each cold)")
    args = parser.parse_args(argv)
    base = import_file(args.fixture)
    t = time.perf_counter()
    big = tile(base, args.kernels)
    print(f"tiled {len(base.kernels):,} -> {len(big.kernels):,} kernels in {time.perf_counter() - t:.1f} s")
    with tempfile.TemporaryDirectory(prefix="perfscope-bench-") as tmp:
        roots = {}
        for name, report in (("base", tile(base, len(base.kernels))), ("big", big)):
            roots[name] = Path(tmp) / name
            report.save(roots[name] / f"{name}.perfscope")
        results = {}
        for name, root in roots.items():
            store = ReportStore([root])
            key = store.entries()[0].key
            store.load(key)
            results[name] = {label: measure(fn, args.repeats) for label, fn in scenarios(store, key).items()}
        print(f"\n{'update':26} {'first ms':>9} {'median ms':>10} {'JSON MB':>8} {'x base':>7}  goal <300 ms, <3 MB")
        for label, (first, med, size) in results["big"].items():
            ratio = med / max(results["base"][label][1], 1e-6)
            ok = "ok" if med < 300 and size < 3e6 else "MISSED"
            print(f"{label:26} {first:9.0f} {med:10.1f} {size / 1e6:8.2f} {ratio:7.1f}  {ok}")
        what, times, done = page_load_ms(roots["big"], args.loads)
        worst = max(times)
        print(f"\n{what}, {len(times)} loads:")
        print(f"  overview drawn: min {min(times):.0f} ms, median {statistics.median(times):.0f} ms, "
              f"max {worst:.0f} ms  goal <=3000 ms: {'ok' if worst <= 3000 else 'MISSED'}")
        print(f"  findings drawn: min {min(done):.0f} ms, median {statistics.median(done):.0f} ms, max {max(done):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
