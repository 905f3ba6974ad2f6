"""Import time and peak memory of a rocprofv3 CSV run whose roctx ranges nest N deep (issue 43: 20,000
nested ranges in a 1.3 MB CSV needed over 6 GB; matching 40,000 ranges to kernels took 20.9 s, a pass
per range over every kernel). The run is the committed real decode kernel trace
(tests/fixtures/rocprof/rocprofv3_llamacpp_gfx1151_trimmed) with N ranges ``level_i`` around it, each
inside the one before. Each size runs in a fresh process (peak RSS is the process's own); the ratio for
2x the ranges is about 2 when the matching and the paths are linear.

    python benchmarks/roctx_nesting.py [--ranges 20000] [--sizes 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "tests/fixtures/rocprof/rocprofv3_llamacpp_gfx1151_trimmed/decode_kernel_trace.csv"


def write_run(folder: Path, n: int) -> Path:
    """A rocprofv3 run: the real kernel trace and ``n`` nested roctx ranges around all of it."""
    shutil.copy(KERNELS, folder / "bench_kernel_trace.csv")
    lines = KERNELS.read_text().splitlines()
    head = [h.strip('"') for h in lines[1].split('","')]
    cols = [h.strip('"') for h in lines[0].split('","')]
    start = int(head[cols.index("Start_Timestamp")]) - 10 * n - 10
    end = int(lines[-1].split('","')[cols.index("End_Timestamp")].strip('"')) + 10 * n + 10
    rows = ['"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"']
    rows += [f'"MARKER_CORE_API","level_{i}","1","2684120","{i}","{start + 10 * i}","{end - 10 * i}"' for i in range(n)]
    (folder / "bench_marker_api_trace.csv").write_text("\n".join(rows) + "\n")
    return folder


CHILD = """
import json, resource, sys, time
from perfscope.analysis.readers.detect import import_file
t = time.perf_counter()
r = import_file(sys.argv[1])
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "ranges": len(r.ranges), "kernels": len(r.kernels),
                  "in_range": int(r.kernels["range"].notna().sum()), "depth": int(r.ranges["depth"].max())}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranges", type=int, default=20_000, help="ranges of the smallest size")
    ap.add_argument("--sizes", type=int, default=3, help="sizes, each twice the one before")
    args = ap.parse_args()
    last = None
    for k in range(args.sizes):
        n = args.ranges * 2**k
        with tempfile.TemporaryDirectory() as tmp:
            run = write_run(Path(tmp), n)
            mb = (run / "bench_marker_api_trace.csv").stat().st_size / 1e6
            out = subprocess.run([sys.executable, "-c", CHILD, str(run)], capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = f"  x{got['s'] / last:.2f} for 2x" if last else ""
        print(f"{n:>7} nested ranges ({mb:.1f} MB CSV): {got['s']:.2f} s, peak RSS {got['rss_mb']:.0f} MB, "
              f"{got['kernels']} kernels, {got['in_range']} in a range, depth {got['depth']}{ratio}")
        last = got["s"]


if __name__ == "__main__":
    main()
