"""The below-roof causes' per-table passes at scale (analysis/rules/roof_causes.py): the committed H200 eager
Llama-1B trace's kernel table tiled to millions of rows (each copy shifted in time), timed in one process.

- stream order: the (device, stream) lanes from the columns' codes (``schema.column_codes``) against the text pass it
  replaced (``astype(str)`` + factorize of both columns), each on a fresh copy of the table;
- the launch scopes (``_scopes``: codes of ``capture_module`` / ``range``, each distinct path's parent once);
- the trace's shortest kernel per family (``_trace_floors``: one family decision per distinct category, precision,
  phase and low intensity).

    python benchmarks/roof_causes_scale.py [--copies 1400]   # 1400 copies: about 5M kernels
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from perfscope.analysis.readers.detect import import_file
from perfscope.analysis.rules import roof_causes as rc

FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/h200/h200_llama1b_engine_eager.pt.trace.json.gz"
COLUMNS = ["device", "stream", "start_ns", "category", "precision", "phase", "flops", "dram_bytes", "duration_ns",
           "range", "capture_module"]


def _seconds(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def _text_order(k: pd.DataFrame) -> None:
    """The stream order as it was built before: both lane columns through a text pass."""
    dev = pd.factorize(k["device"].astype(str))[0]
    stream = pd.factorize(k["stream"].astype(str))[0]
    order = np.lexsort((k["start_ns"].to_numpy("float64", na_value=np.nan), stream, dev))
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=1400)
    args = ap.parse_args()
    k0 = import_file(FIXTURE).kernels
    span = int(k0["end_ns"].max() - k0["start_ns"].min()) + 1
    big = pd.concat([k0[COLUMNS]] * args.copies, ignore_index=True)
    big["start_ns"] = big["start_ns"] + np.repeat(np.arange(args.copies), len(k0)) * span
    print(f"{len(big):,} kernels ({args.copies} copies of {FIXTURE.name})")
    warm = big.head(100_000).copy()  # the first call of each pays its one-time costs (allocations, lazy imports)
    for fn in (_text_order, rc._stream_order, rc._scopes, rc._trace_floors):
        fn(warm)
    for rep in range(2):
        a, b = big.copy(), big.copy()
        old, new = _seconds(_text_order, a), _seconds(rc._stream_order, b)
        print(f"  run {rep + 1}: stream order from text {old:.2f} s, from column codes {new:.2f} s ({new / old:.2f}x)")
    c = big.copy()
    rc._stream_order(c)  # the lane columns' codes, as the fuse cause leaves them
    print(f"  launch scopes {_seconds(rc._scopes, c):.2f} s; shortest kernel per family "
          f"{_seconds(rc._trace_floors, c):.2f} s (the column codes they take are shared with the other rules)")


if __name__ == "__main__":
    main()
