"""How well ``perfscope whatif`` moves a kernel to another GPU: every row of the published cross-GPU
tables (aiconfigurator A100 -> H100, vidur A100 -> H100 / A40, LLMCompass A100 -> MI210) projected onto
the target with its datasheet roofs, against the time measured there, beside two baselines.

    python benchmarks/whatif_crossgpu.py [--root tests/fixtures/crossgpu] [--every 1] [--csv OUT.csv]
        [--roofs a40=fp16:149.7,dram:696 --roofs mi210=fp16:181,dram:1638.4]

Prints the median absolute % error per table and GPU pair (docs/whatif.md has the numbers).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfscope.analysis.projection.crossgpu import error_table, parse_roofs, validate

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "crossgpu"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--every", type=int, default=1, help="take every N-th row of each table")
    ap.add_argument("--csv", type=Path, help="write every projected row here")
    ap.add_argument("--roofs", action="append", default=[],
                    help="roofs for a GPU perfscope has no datasheet row for, e.g. "
                         "a40=fp16:149.7,dram:696 (TFLOP/s, GB/s); its rows are labelled 'assumed roofs'")
    args = ap.parse_args()
    missing: list[str] = []
    assumed = dict(parse_roofs(text) for text in args.roofs)
    rows = validate(args.root, every=args.every, missing=missing, assumed=assumed)
    for line in missing:
        print(f"skipped: {line}", file=sys.stderr)
    if not len(rows):
        return 1
    table = error_table(rows)
    print(f"{'pair':<28} {'table':<44} {'rows':>6} {'model %':>8} {'ratio %':>8} {'roof %':>8} {'goal':>5}  beats both")
    for r in table.itertuples(index=False):
        print(f"{r.pair:<28} {r.table:<44} {int(r.rows):>6} {r.model_pct:>8.1f} {r.ratio_pct:>8.1f} {r.roof_pct:>8.1f} "
              f"{r.goal_pct:>5.0f}  {'yes' if r.beats_both else 'no'}")
    if args.csv:
        rows.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
