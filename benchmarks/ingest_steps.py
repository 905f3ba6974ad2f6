"""What reading framework steps costs the Kineto import of a 1.09M-event trace (issue #21: <= 5%).

The trace is :mod:`ingest`'s (the A100 HTA fixture tiled 10 times, 1.09M events), in two forms:

- ``plain``: as built, no framework step annotations (the step reader only scans range names);
- ``stepped``: its ``ProfilerStep#N`` annotations renamed ``step[DECODE bs=8]``, so every one of
  its 50 steps is read and each of its kernels is assigned to one (the full cost of the step).

Each file is imported (``perfscope.analysis.readers.detect.import_file``, the whole pipeline) in a fresh
interpreter with the step reader on and off (off: :func:`perfscope.analysis.readers.finish.with_framework_steps`
replaced by a pass-through inside that child only), interleaved round by round. Two measures, because the machine may be shared: the step reader's own time inside each
"on" import over the rest of that same import (``steps_share_*``: immune to load changes between
runs), and the best "on" run over the best "off" run (``best_on_off_*``, minus 1).

Usage::

    python benchmarks/ingest_steps.py [--copies 10] [--repeat 3]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import FIXTURE, build


def child(mode: str, path: Path) -> None:
    import perfscope.analysis.readers.finish as fin
    from perfscope.analysis.readers.detect import import_file

    spent = [0.0]
    real = fin.with_framework_steps

    def timed(tables):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = real(tables) if mode == "on" else (dict(tables), [])
        spent[0] += time.perf_counter() - t
        return out

    fin.with_framework_steps = timed  # type: ignore[assignment]
    t0 = time.perf_counter()
    report = import_file(path)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "step_seconds": spent[0], "kernels": len(report.kernels),
                      "steps": len(report.steps), "in_steps": int(report.kernels["step"].notna().sum())}))


def run_child(mode: str, path: Path) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed on {path}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stepped_copy(plain: Path, out: Path) -> Path:
    text = plain.read_text()
    import re
    out.write_text(re.sub(r'"ProfilerStep#\d+"', '"step[DECODE bs=8]"', text))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        plain, _, n = build(FIXTURE, Path(tmp), args.copies)
        files = {"plain": plain, "stepped": stepped_copy(plain, Path(tmp) / "stepped.json")}
        print(f"{n:,} events; {args.repeat} fresh runs per file and mode, interleaved", flush=True)
        runs: dict[tuple[str, str], list[dict[str, float]]] = {(f, m): [] for f in files for m in ("off", "on")}
        for _ in range(args.repeat):
            for f, path in files.items():
                for m in ("off", "on"):
                    runs[(f, m)].append(run_child(m, path))
        ratios, shares = {}, {}
        for f in files:
            off = min(r["seconds"] for r in runs[(f, "off")])  # the least-disturbed run of each (shared machine)
            on = min(r["seconds"] for r in runs[(f, "on")])
            last = runs[(f, "on")][-1]
            ratios[f] = on / off - 1
            # inside each "on" run: the step reader's own time over the rest of that same import
            shares[f] = statistics.median(r["step_seconds"] / (r["seconds"] - r["step_seconds"]) for r in runs[(f, "on")])
            print(f"  {f:<8} best off {off:6.2f} s  best on {on:6.2f} s  ({100 * ratios[f]:+.1f}%)  "
                  f"step reader inside the import: {100 * shares[f]:.2f}% of the rest  "
                  f"kernels={int(last['kernels']):,} steps={int(last['steps'])} kernels in steps={int(last['in_steps']):,}  "
                  f"runs off {[round(r['seconds'], 2) for r in runs[(f, 'off')]]} on {[round(r['seconds'], 2) for r in runs[(f, 'on')]]}")
    print(f"steps_share_plain={shares['plain']:.4f} steps_share_stepped={shares['stepped']:.4f} "
          f"best_on_off_plain={ratios['plain']:.3f} best_on_off_stepped={ratios['stepped']:.3f}")


if __name__ == "__main__":
    main()
