"""A large CUDA memory snapshot imports in bounded memory (docs/memory.md, "Large snapshots").

Builds a snapshot of ``--size-gb`` by tiling the committed one's trace events (each tile shifted
in time and address, every event written with its full traceback: no pickle memo, as a snapshot
without shared frames is), streamed to disk so the builder stays small too; then imports it in a
child process (peak RSS of that process, and its wall time), whole and with a time window of
``--window`` of its span.

    python benchmarks/memory_snapshot.py --size-gb 1.0

Prints file size, events, and per import: seconds, peak RSS, rows. Times are this machine's, in
one run; nothing here is asserted by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests/fixtures/memory/cs336_notHanmin_xl_forward/memory_snapshot_forward.pickle"


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> None:
        raise pickle.UnpicklingError(f"{module}.{name}")


def build(target: Path, size_bytes: float) -> int:
    """Write a snapshot of about ``size_bytes`` to ``target``; return its number of trace events."""
    with open(SOURCE, "rb") as fh:
        snap = _PlainData(fh).load()
    events = snap["device_traces"][0]
    t0, t1 = events[0]["time_us"], events[-1]["time_us"]
    span = t1 - t0 + 1
    addr_step = 1 << 40
    n = 0
    with open(target, "wb") as f:
        p = pickle._Pickler(f, protocol=4)  # type: ignore[attr-defined]
        p.fast = True  # no memo: every event carries its own traceback
        p.write(b"\x80\x04" + pickle.EMPTY_DICT + pickle.MARK)
        p.save("segments")
        p.save(snap["segments"])
        p.save("device_traces")
        p.write(pickle.EMPTY_LIST + pickle.MARK + pickle.EMPTY_LIST)
        tile = 0
        while f.tell() < size_bytes:
            for k in range(0, len(events), 500):
                p.write(pickle.MARK)
                for e in events[k:k + 500]:
                    p.save({**e, "time_us": e["time_us"] + tile * span, "addr": e["addr"] + tile * addr_step})
                    n += 1
                p.write(pickle.APPENDS)
            tile += 1
        p.write(pickle.APPENDS + pickle.SETITEMS + pickle.STOP)
    return n


CHILD = """
import json, resource, sys, time
from perfscope.analysis.readers.snapshot import import_snapshot
path, lo, hi = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.perf_counter()
im = import_snapshot(path, start_us=None if lo == "-" else float(lo), end_us=None if hi == "-" else float(hi))
wall = time.perf_counter() - t
print(json.dumps({"s": wall, "rows": len(im.tables["memory"]), "events": im.manifest["params"]["snapshot_events"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def timed_import(path: Path, lo: float | None, hi: float | None) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), "-" if lo is None else str(lo),
                          "-" if hi is None else str(hi)], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--window", type=float, default=0.1, help="share of the span the windowed import keeps")
    ap.add_argument("--keep", type=Path, default=None, help="write the tiled snapshot here and keep it")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(dir=args.keep.parent if args.keep else None)
    path = args.keep or Path(tmp.name) / "tiled.pickle"
    t = time.perf_counter()
    n = build(path, args.size_gb * 1e9)
    built_s = time.perf_counter() - t
    size = path.stat().st_size
    print(f"built {path.name}: {size / 1e9:.2f} GB, {n} trace events, in {built_s:.0f} s "
          f"(builder peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")
    whole = timed_import(path, None, None)
    print(f"import whole: {whole['s']:.0f} s, peak RSS {whole['peak_rss_mb']:.0f} MB, {whole['rows']} rows, "
          f"{size / 1e6 / whole['s']:.1f} MB/s")
    with open(SOURCE, "rb") as fh:
        ev = _PlainData(fh).load()["device_traces"][0]
    t0 = ev[0]["time_us"]
    tiles = max(1, round(n / len(ev)))
    span = (ev[-1]["time_us"] - t0 + 1) * tiles
    lo = t0 + span * 0.45
    win = timed_import(path, lo, lo + span * args.window)
    print(f"import {args.window:.0%} window: {win['s']:.0f} s, peak RSS {win['peak_rss_mb']:.0f} MB, {win['rows']} rows")
    tmp.cleanup()


if __name__ == "__main__":
    main()
