"""A large CUDA memory snapshot imports fast and in bounded memory (docs/memory.md, "Large snapshots").

Builds a snapshot of ``--size-gb`` by tiling the committed one's trace events (each tile shifted in
time and address), written by Python's C pickler, then in child processes (one at a time, each its
own peak RSS and wall time):

- perfscope's import (``import_snapshot``: read, replay, categories), whole and for a time window of
  ``--window`` of its span;
- a C-speed restricted ``pickle.load`` of the same file (``find_class`` refusing every global: the
  floor any safe reader of the format stands on), and the ratio of the two.

Layouts (``--layout``): ``tiled`` (default) writes every event with its full traceback and no memo,
as a snapshot written without shared frames is (about 9.7 kB an event); ``torch`` writes what
``torch.cuda.memory._dump_snapshot`` writes: frame dicts shared through the pickle's memo, one
traceback list per event (about 260 bytes an event: four times the events per GB, and every event's
emptied dict kept by the memo until the load ends).

    python benchmarks/memory_snapshot.py --size-gb 1.0
    python benchmarks/memory_snapshot.py --size-gb 0.25 --layout torch

Times are this machine's, in one run; nothing here is asserted by a test.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests/fixtures/memory/cs336_notHanmin_xl_forward/memory_snapshot_forward.pickle"


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> None:
        raise pickle.UnpicklingError(f"{module}.{name}")


def _source() -> dict[str, Any]:
    with open(SOURCE, "rb") as fh:
        return _PlainData(fh).load()  # type: ignore[no-any-return]


def build(target: Path, size_bytes: float, layout: str) -> int:
    """Write a snapshot of about ``size_bytes`` to ``target``; return its number of trace events."""
    snap = _source()
    events = snap["device_traces"][0]
    t0, t1 = events[0]["time_us"], events[-1]["time_us"]
    span = t1 - t0 + 1
    fast = layout == "tiled"
    probe = _pickled_size({**snap, "device_traces": [events]}, fast=fast)
    segments = _pickled_size({**snap, "device_traces": [[]]}, fast=fast)
    tiles = max(1, round((size_bytes - segments) / max(1, probe - segments)))
    out = []
    for k in range(tiles):
        for e in events:  # torch: a traceback list of its own per event, its frame dicts shared
            out.append({**e, "time_us": e["time_us"] + k * span, "addr": e["addr"] + k * (1 << 40),
                        "frames": e["frames"] if fast else list(e["frames"])})
    with open(target, "wb") as f:
        p = pickle.Pickler(f, protocol=4)
        p.fast = fast  # tiled: no memo, every event carries its own traceback
        p.dump({**snap, "device_traces": [out]})
    return len(out)


def _pickled_size(obj: Any, *, fast: bool) -> int:
    class Count:
        n = 0

        def write(self, b: bytes) -> None:
            self.n += len(b)

    c = Count()
    p = pickle.Pickler(c, protocol=4)  # type: ignore[arg-type]
    p.fast = fast
    p.dump(obj)
    return c.n


PEAK_RSS = """
def peak_rss_mb():
    # VmHWM: this process's own high-water mark (ru_maxrss of a child counts the parent's RSS at fork)
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

CHILD_IMPORT = """
import json, resource, sys, time, warnings
warnings.simplefilter("error")
from perfscope.analysis.readers.snapshot import import_snapshot
path, lo, hi = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.perf_counter()
im = import_snapshot(path, start_us=None if lo == "-" else float(lo), end_us=None if hi == "-" else float(hi))
wall = time.perf_counter() - t
print(json.dumps({"s": wall, "rows": len(im.tables["memory"]), "events": im.manifest["params"]["snapshot_events"],
                  "peak_rss_mb": peak_rss_mb()}))
"""

CHILD_PICKLE = """
import json, pickle, resource, sys, time
class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name}")
t = time.perf_counter()
with open(sys.argv[1], "rb") as fh:
    snap = PlainData(fh).load()
wall = time.perf_counter() - t
print(json.dumps({"s": wall, "events": sum(len(t) for t in snap["device_traces"]),
                  "peak_rss_mb": peak_rss_mb()}))
"""


def _child(code: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    first, rest = code.lstrip("\n").split("\n", 1)  # the imports, then the peak-RSS helper, then the body
    out = subprocess.run([sys.executable, "-c", f"{first}\n{PEAK_RSS}{rest}", *args], check=True, capture_output=True,
                         text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--layout", choices=("tiled", "torch"), default="tiled")
    ap.add_argument("--window", type=float, default=0.1, help="share of the span the windowed import keeps")
    ap.add_argument("--keep", type=Path, default=None, help="write the snapshot here and keep it")
    ap.add_argument("--no-pickle-load", action="store_true", help="skip the restricted pickle.load (its RSS is "
                    "several times the file's)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(dir=args.keep.parent if args.keep else None)
    path = args.keep or Path(tmp.name) / "snapshot.pickle"
    t = time.perf_counter()
    n = build(path, args.size_gb * 1e9, args.layout)
    size = path.stat().st_size
    print(f"built {path.name} ({args.layout}): {size / 1e9:.2f} GB, {n:,} trace events, in "
          f"{time.perf_counter() - t:.0f} s (builder peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")
    whole = _child(CHILD_IMPORT, str(path), "-", "-")
    print(f"perfscope import: {whole['s']:.1f} s, peak RSS {whole['peak_rss_mb']:.0f} MB, {whole['rows']:,} rows, "
          f"{size / 1e6 / whole['s']:.0f} MB/s")
    if not args.no_pickle_load:
        plain = _child(CHILD_PICKLE, str(path))
        print(f"restricted pickle.load (C): {plain['s']:.1f} s, peak RSS {plain['peak_rss_mb']:.0f} MB, "
              f"{plain['events']:,} events")
        print(f"ratio import / pickle.load: {whole['s'] / plain['s']:.2f} (time), "
              f"{whole['peak_rss_mb'] / plain['peak_rss_mb']:.2f} (peak RSS)")
    ev = _source()["device_traces"][0]
    t0 = ev[0]["time_us"]
    tiles = max(1, round(n / len(ev)))
    span = (ev[-1]["time_us"] - t0 + 1) * tiles
    lo = t0 + span * 0.45
    win = _child(CHILD_IMPORT, str(path), str(lo), str(lo + span * args.window))
    print(f"perfscope import, {args.window:.0%} window: {win['s']:.1f} s, peak RSS {win['peak_rss_mb']:.0f} MB, "
          f"{win['rows']:,} rows")
    tmp.cleanup()


if __name__ == "__main__":
    main()
