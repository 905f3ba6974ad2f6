"""Export benchmark: ``perfscope export`` of a ~1M-kernel report against that report's own import.

Builds a ~1M-kernel nsys export by tiling the real nvFuser fixture (``ingest_nsys.build``:
shifted timestamps, fresh correlation ids, launch calls copied with their kernels), imports it
once into a report folder, then, in fresh processes, interleaved round by round:

- import: ``import_file(EXPORT)`` (read, link, cost, classify) -> a Report in memory;
- export perfetto: ``lean_report(FOLDER)`` (what ``perfscope export FOLDER`` reads: the columns
  it needs, text as Arrow dictionaries) then ``export_trace(report, OUT)`` (protobuf);
- export chrome: the same with ``format="chrome"``.

Wall time is measured inside the child around the one call (imports and, for the exports, the
report's load excluded); peak memory is the child's peak resident set (``VmHWM``: the whole
process, the loaded report included). Medians over the repeats.

Goals (issue 23): export time at most the import's own time (``export_vs_import`` <= 1) and
peak RSS under 1 GB. The last line is ``export_vs_import=X chrome_vs_import=Y peak_rss_mib=Z``.

Usage::

    python benchmarks/export.py [--kernels 1000000] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import _rss_mib
from ingest_nsys import FIXTURE, build


def child(task: str, source: Path, folder: Path, out: Path) -> None:
    """Run one measured task in this (fresh) process and print its JSON result."""
    result: dict[str, Any] = {}
    if task == "import":
        from perfscope.analysis.readers.detect import import_file

        t0 = time.perf_counter()
        report = import_file(source)
        result["seconds"] = time.perf_counter() - t0
        result["kernels"] = len(report.kernels)
    else:
        from perfscope.dashboard.export.perfetto import export_trace, lean_report

        report = lean_report(folder)  # what `perfscope export FOLDER` reads
        result["loaded_rss_mib"] = _rss_mib()
        t0 = time.perf_counter()
        stats = export_trace(report, out, format=task, force=True)
        result["seconds"] = time.perf_counter() - t0
        result["kernels"] = stats.slices.get("kernel", 0)
        result["bytes"] = out.stat().st_size
    result["peak_rss_mib"] = _rss_mib()
    print(json.dumps(result))


def run_child(task: str, source: Path, folder: Path, out: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", task, str(source), str(folder), str(out)],
                          check=True, capture_output=True, text=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="build the inputs in DIR and keep them")
    parser.add_argument("--child", nargs=4, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        task, source, folder, out = args.child
        child(task, Path(source), Path(folder), Path(out))
        return
    with tempfile.TemporaryDirectory(prefix="perfscope-export-bench-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        source, folder = work / "tiled.sqlite", work / "tiled.perfscope"
        if not source.exists():
            print(f"built {build(FIXTURE, source, args.kernels):,} kernels in {source}", flush=True)
        if not folder.exists():
            from perfscope.analysis.readers.detect import import_file

            import_file(source).save(folder)
        runs: dict[str, list[dict[str, Any]]] = {"import": [], "perfetto": [], "chrome": []}
        for r in range(args.repeat):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for task in order:
                out = work / ("out.pftrace" if task == "perfetto" else "out.json")
                runs[task].append(run_child(task, source, folder, out))
                print(f"round {r + 1} {task}: {runs[task][-1]}", flush=True)
        med = {t: statistics.median(x["seconds"] for x in v) for t, v in runs.items()}
        rss = {t: max(x["peak_rss_mib"] for x in v) for t, v in runs.items()}
        for t in runs:
            print(f"{t:9s} median {med[t]:.2f} s  peak RSS {rss[t]:.0f} MiB  kernels {runs[t][0]['kernels']:,}")
        print(f"export_vs_import={med['perfetto'] / med['import']:.2f} chrome_vs_import={med['chrome'] / med['import']:.2f} "
              f"peak_rss_mib={max(rss['perfetto'], rss['chrome']):.0f}")


if __name__ == "__main__":
    main()
