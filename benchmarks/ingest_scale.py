"""Imports at scale: a 5M-kernel Nsight Systems export and a 5M-kernel Kineto trace, each imported
whole by ``perfscope import`` in a fresh process, against a time and a memory budget (issue #44:
under 5 minutes and under 4 GB each, on the 2-core development machine).

- nsys: :func:`ingest_nsys.build` replicates the kernels of the nvFuser H100 export (and their
  launch calls, shifted in time, fresh correlation ids) up to ``--kernels``.
- Kineto: :func:`ingest.build`'s tiling (timestamps shifted by the trace's span, linking ids by the
  largest id) of a kernel-dense real trace, ``--kineto-fixture`` (default: the H200 CUDA-graph
  decode trace of perfscope's engine, 1,848 kernels in 7,824 events), as plain JSON, enough copies
  for ``--kernels`` kernels.

Each file is imported by ``perfscope import FILE --out DIR --no-html`` (the whole pipeline: parse,
costs, roofline, idle causes, Parquet written), then read back and its kernels counted. Printed:
the process's wall time, its peak resident memory (``ru_maxrss`` of the child, from ``wait4``: the
child is the whole import), its CPU time, kernels kept, and the machine's load averages.

Usage::

    python benchmarks/ingest_scale.py [--kernels 5000000] [--only nsys|kineto] [--dir DIR --keep]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
KINETO_FIXTURE = ROOT / "tests" / "fixtures" / "h200" / "h200_llama1b_engine_cudagraph.pt.trace.json.gz"
NSYS_FIXTURE = ROOT / "tests" / "fixtures" / "nsys" / "nvfuser_h100_matmul.sqlite"
BUDGET_S = 300.0
BUDGET_BYTES = 4 * 10**9


def _loadavg() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def build_kineto(fixture: Path, folder: Path, kernels: int) -> tuple[Path, int]:
    """A tiled plain-JSON trace with at least ``kernels`` kernels; (path, events)."""
    import gzip

    import orjson
    from ingest import build

    raw = fixture.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    per_copy = sum(1 for e in doc["traceEvents"] if str(e.get("cat", "")).lower() == "kernel")
    copies = math.ceil(kernels / per_copy)
    plain, _packed, n = build(fixture, folder, copies, gzip=False)
    return plain, n


def build_nsys(folder: Path, kernels: int) -> Path:
    from ingest_nsys import build

    path = folder / "replicated.sqlite"
    build(NSYS_FIXTURE, path, kernels)
    return path


def import_whole(path: Path, out: Path) -> dict[str, Any]:
    """``perfscope import PATH --out OUT --no-html`` in a fresh process: wall time and peak memory (the
    child's own ``ru_maxrss``, from ``wait4``)."""
    cmd = [sys.executable, "-m", "perfscope", "import", str(path), "--out", str(out), "--no-html", "--force"]
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            raise SystemExit(f"perfscope import {path} failed ({child.returncode}):\n"
                             f"{err.read().decode(errors='replace')[-2000:]}")
    with open(out / "manifest.json") as fh:
        manifest = json.load(fh)
    return {"wall_s": wall, "peak_bytes": usage.ru_maxrss * 1024, "kernels": manifest["tables"]["kernels"],
            "cpu_s": usage.ru_utime + usage.ru_stime}


def _line(name: str, r: dict[str, Any], want: int) -> str:
    ok = r["wall_s"] < BUDGET_S and r["peak_bytes"] < BUDGET_BYTES and r["kernels"] >= want
    return (f"{name:<8} {r['kernels']:>10,} kernels  {r['wall_s']:7.1f} s (CPU {r['cpu_s']:.1f} s)  "
            f"peak {r['peak_bytes'] / 1e9:5.2f} GB  "
            f"(budget {BUDGET_S:.0f} s, {BUDGET_BYTES / 1e9:.0f} GB: {'met' if ok else 'NOT met'})  "
            f"load average {r['load']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=5_000_000)
    ap.add_argument("--only", choices=["nsys", "kineto"], default=None)
    ap.add_argument("--kineto-fixture", type=Path, default=KINETO_FIXTURE)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the built inputs (reused by a later run)")
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="perfscope-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs; load average {_loadavg()}", flush=True)
    results = {}
    try:
        if args.only in (None, "nsys"):
            path = base / "replicated.sqlite"
            if not path.exists():
                t0 = time.perf_counter()
                build_nsys(base, args.kernels)
                print(f"built {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s", flush=True)
            results["nsys"] = {**import_whole(path, base / "nsys.perfscope"), "load": _loadavg()}
            print(_line("nsys", results["nsys"], args.kernels), flush=True)
            shutil.rmtree(base / "nsys.perfscope", ignore_errors=True)
        if args.only in (None, "kineto"):
            path = base / "plain" / "tiled.json"
            if not path.exists():
                t0 = time.perf_counter()
                path, n = build_kineto(args.kineto_fixture, base, args.kernels)
                print(f"built {path} ({path.stat().st_size / 1e9:.2f} GB, {n:,} events) in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            results["kineto"] = {**import_whole(path, base / "kineto.perfscope"), "load": _loadavg()}
            print(_line("kineto", results["kineto"], args.kernels), flush=True)
            shutil.rmtree(base / "kineto.perfscope", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(" ".join(f"{k}_s={v['wall_s']:.1f} {k}_peak_gb={v['peak_bytes'] / 1e9:.2f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
