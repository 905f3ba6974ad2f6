"""A large CUDA memory snapshot imports fast and in bounded memory (docs/memory.md, "Large snapshots").

Builds a snapshot of ``--size-gb`` in each layout by tiling the committed one's trace events (each tile
shifted in time and address), written by Python's C pickler, then in child processes (one at a time,
each its own peak RSS and wall time), ``--rounds`` times interleaved:

- a C-speed restricted ``pickle.load`` of the file (``find_class`` refusing every global: the floor
  any safe reader of the format stands on), then
- perfscope's import of it (``import_snapshot``: read, replay, categories), and the ratio of the two;

then the import of a time window of ``--window`` of its span. Each line carries wall and CPU seconds
and the machine's load averages before and after (on a shared machine the wall time follows the load:
the ratios, and the CPU seconds, are the figures that hold).

Layouts (``--layout``, default both): ``tiled`` writes every event with its full traceback and no
memo, as a snapshot written without shared frames is (about 9.7 kB an event); ``torch`` writes what
``torch.cuda.memory._dump_snapshot`` writes: frame dicts shared through the pickle's memo, and
traceback lists shared as torch shares them (a free_requested and its free_completed, an alloc and
its block at the dump): about 250 bytes an event, forty times the events per GB.

    python benchmarks/memory_snapshot.py --size-gb 1.0
    python benchmarks/memory_snapshot.py --size-gb 1.0 --layout torch --rounds 2 --keep /tmp/snapshots

Times are this machine's, in one run; nothing here is asserted by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
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

    def tiled(tiles: int) -> list[dict[str, Any]]:
        out = []
        for k in range(tiles):
            # torch: the frame dicts shared, and the traceback lists as torch shares them (a free and its
            # free_completed one list; the first tile's allocs their block's): a copy of each per tile
            copies: dict[int, list[dict[str, Any]]] = {}
            for e in events:
                fr = e["frames"] if fast or k == 0 else copies.setdefault(id(e["frames"]), list(e["frames"]))
                out.append({**e, "time_us": e["time_us"] + k * span, "addr": e["addr"] + k * (1 << 40),
                            "frames": fr})
        return out

    one = _pickled_size({**snap, "device_traces": [tiled(1)]}, fast=fast)
    two_more = _pickled_size({**snap, "device_traces": [tiled(3)]}, fast=fast) - one
    tiles = max(1, round((size_bytes - one) * 2 / two_more) + 1)
    with open(target, "wb") as f:
        p = pickle.Pickler(f, protocol=4)
        p.fast = fast  # tiled: no memo, every event carries its own traceback
        p.dump({**snap, "device_traces": [tiled(tiles)]})
    return tiles * len(events)


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
t, cpu = time.perf_counter(), time.process_time()
im = import_snapshot(path, start_us=None if lo == "-" else float(lo), end_us=None if hi == "-" else float(hi))
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
print(json.dumps({"s": wall, "cpu_s": cpu, "rows": len(im.tables["memory"]),
                  "events": im.manifest["params"]["snapshot_events"], "peak_rss_mb": peak_rss_mb()}))
"""

CHILD_PICKLE = """
import json, pickle, resource, sys, time
class PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name}")
t, cpu = time.perf_counter(), time.process_time()
with open(sys.argv[1], "rb") as fh:
    snap = PlainData(fh).load()
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
print(json.dumps({"s": wall, "cpu_s": cpu, "events": sum(len(t) for t in snap["device_traces"]),
                  "peak_rss_mb": peak_rss_mb()}))
"""


def _child(code: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    first, rest = code.lstrip("\n").split("\n", 1)  # the imports, then the peak-RSS helper, then the body
    out = subprocess.run([sys.executable, "-c", f"{first}\n{PEAK_RSS}{rest}", *args], check=True, capture_output=True,
                         text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f}, {five:.1f}, {fifteen:.1f}"


def run(layout: str, args: argparse.Namespace) -> list[str]:
    """Build one layout's snapshot, then measure it; the lines printed, for the summary."""
    tmp = tempfile.TemporaryDirectory(dir=args.keep)
    path = (args.keep or Path(tmp.name)) / f"snapshot_{layout}_{args.size_gb:g}gb.pickle"
    t = time.perf_counter()
    if path.exists() and args.keep:
        n = int(path.with_suffix(".events").read_text())
    else:
        n = build(path, args.size_gb * 1e9, layout)
        path.with_suffix(".events").write_text(str(n))
    size = path.stat().st_size
    print(f"[{layout}] {path.name}: {size / 1e9:.2f} GB, {n:,} trace events, ready in {time.perf_counter() - t:.0f} s")
    lines = []
    for r in range(args.rounds):  # interleaved: each round the C load, then perfscope's import, back to back
        before = _load()
        plain = None if args.no_pickle_load else _child(CHILD_PICKLE, str(path))
        whole = _child(CHILD_IMPORT, str(path), "-", "-")
        after = _load()
        line = (f"[{layout}] round {r + 1}: perfscope import {whole['s']:.1f} s ({whole['cpu_s']:.1f} s CPU), peak RSS "
                f"{whole['peak_rss_mb']:,.0f} MB, {whole['rows']:,} rows")
        if plain is not None:
            line += (f"; restricted pickle.load (C) {plain['s']:.1f} s ({plain['cpu_s']:.1f} s CPU), peak RSS "
                     f"{plain['peak_rss_mb']:,.0f} MB; ratio {whole['s'] / plain['s']:.2f} (time), "
                     f"{whole['cpu_s'] / plain['cpu_s']:.2f} (CPU), {whole['peak_rss_mb'] / plain['peak_rss_mb']:.2f} (RSS)")
        line += f" [{before}; after: {after}]"
        print(line)
        lines.append(line)
    if args.window:
        ev = _source()["device_traces"][0]
        t0 = ev[0]["time_us"]
        tiles = max(1, round(n / len(ev)))
        span = (ev[-1]["time_us"] - t0 + 1) * tiles
        lo = t0 + span * 0.45
        before = _load()
        win = _child(CHILD_IMPORT, str(path), str(lo), str(lo + span * args.window))
        line = (f"[{layout}] perfscope import, {args.window:.0%} window: {win['s']:.1f} s ({win['cpu_s']:.1f} s CPU), "
                f"peak RSS {win['peak_rss_mb']:,.0f} MB, {win['rows']:,} rows [{before}]")
        print(line)
        lines.append(line)
    tmp.cleanup()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--layout", choices=("tiled", "torch", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=1, help="pickle.load then import, this many times, interleaved")
    ap.add_argument("--window", type=float, default=0.1, help="share of the span a windowed import keeps (0: none)")
    ap.add_argument("--keep", type=Path, default=None, help="a folder to write the snapshots to, kept (and reused)")
    ap.add_argument("--no-pickle-load", action="store_true", help="skip the restricted pickle.load (its RSS is "
                    "several times the file's)")
    args = ap.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    lines = [line for layout in (("tiled", "torch") if args.layout == "both" else (args.layout,))
             for line in run(layout, args)]
    print("\nsummary:\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
