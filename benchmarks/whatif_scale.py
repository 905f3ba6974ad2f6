"""How long ``whatif`` takes on a 1M-kernel report, against the import of the same trace.

Tiles the H200 engine trace (tests/fixtures/h200/h200_llama1b_engine_eager.pt.trace.json.gz) with
shifted timestamps and ids (benchmarks/ingest.py's tiler) until it holds about ``--kernels`` kernels,
imports it once (timed), then projects the Report onto a B200 (another GPU: no re-costing); then tiles
the H200 engine report (which has steps) to the same size and projects it to batch 8 (every op's
formula evaluated once per distinct shape and step size). Prints the times.

    python benchmarks/whatif_scale.py [--kernels 1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from perfscope.analysis.projection.project import Question, project
from perfscope.analysis.readers.detect import import_file
from perfscope.report import Report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import build

H200 = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200"
FIXTURE = H200 / "h200_llama1b_engine_eager.pt.trace.json.gz"
ENGINE = H200 / "h200_llama1b_b1_p2048_g64.perfscope"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    args = ap.parse_args()
    one = import_file(FIXTURE)
    copies = max(1, -(-args.kernels // max(len(one.kernels), 1)))
    with tempfile.TemporaryDirectory() as tmp:
        _, packed, n_events = build(FIXTURE, Path(tmp), copies)
        t0 = time.perf_counter()
        report = import_file(packed)
        t_import = time.perf_counter() - t0
    print(f"{len(report.kernels):,} kernels ({copies} copies, {n_events:,} events), {len(report.steps)} steps: "
          f"import {t_import:.1f} s")
    t0 = time.perf_counter()
    p = project(report, Question(gpu="B200"))
    t = time.perf_counter() - t0
    print(f"whatif gpu=B200: {t:.1f} s ({t / t_import:.2f} x the import); {len(p.kernels):,} kernels projected")
    # a shape question needs engine steps: the H200 engine report (64 steps), its tables tiled alike
    engine = Report.load(ENGINE)
    copies = max(1, -(-args.kernels // len(engine.kernels)))
    span = int(engine.kernels["end_ns"].max() - min(engine.kernels["start_ns"].min(), engine.steps["start_ns"].min())) + 1
    ids = int(pd.to_numeric(engine.kernels["correlation"]).max()) + 1

    def tile(df: pd.DataFrame, time_cols: tuple[str, ...], id_cols: tuple[str, ...] = ()) -> pd.DataFrame:
        parts = []
        for c in range(copies):
            part = df.copy()
            for col in time_cols:
                part[col] = part[col] + c * span
            for col in id_cols:
                part[col] = part[col] + c * ids
            parts.append(part)
        return pd.concat(parts, ignore_index=True)

    steps = tile(engine.steps, ("start_ns", "end_ns"))
    steps["step"] = range(len(steps))
    big = Report.build({"kernels": tile(engine.kernels, ("start_ns", "end_ns"), ("correlation",)),
                        "api": tile(engine.api, ("start_ns", "end_ns"), ("correlation",)), "steps": steps},
                       dict(engine.manifest))
    t0 = time.perf_counter()
    p = project(big, Question(batch=8))
    t = time.perf_counter() - t0
    print(f"whatif batch=8 on the engine report tiled to {len(big.kernels):,} kernels, {len(steps)} steps: {t:.1f} s "
          f"({t / t_import:.2f} x the import above)")


if __name__ == "__main__":
    main()
