"""Check that an ncu top-N report of ``benchmarks/ncu_topn_workload.py`` profiled the top kernels.

Passes when the report (a ``.perfscope`` folder, or anything ``perfscope import`` reads):

- holds at least one GEMM kernel and the SDPA (attention) kernel, with measured FLOPs;
- profiled only the kernels its first pass ranked (``params.top_kernels``), each at most
  ``--top-n-launches`` times;
- classified every GEMM and attention kernel (compute, memory, or latency where the measured limiter says
  no unit reached 60% of its peak) at no more than 100% of its roof (plus 2% for measurement noise).

Prints one line per kernel, then ``ncu_topn_check: OK`` (exit 0) or the failures (exit 1).

Usage::

    python benchmarks/ncu_topn_check.py topn.perfscope
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence

from perfscope.collectors.ncu import exact_name_regex

NOISE_PCT = 2.0


def check(path: str) -> list[str]:
    """The failures of the report at ``path`` (empty when it passes); prints its kernels."""
    from perfscope.analysis.readers.detect import import_file

    report = import_file(path)
    k = report.kernels
    params = report.params
    for row in k.itertuples():
        print(f"  {row.category!s:10s} {row.bound!s:8s} {row.pct_of_roof:6.1f}% roof  "
              f"{row.flops:10.3g} FLOP  {row.duration_ns / 1e3:9.1f} us  {str(row.name)[:90]}")
    failures: list[str] = []
    gemms = k[k["category"] == "gemm"]
    attention = k[k["category"] == "attention"]
    if gemms.empty:
        failures.append("no GEMM kernel in the report")
    if attention.empty:
        failures.append("no SDPA / attention kernel in the report")
    matrix = k[k["category"].isin(["gemm", "attention"])]
    if matrix["flops"].isna().any():
        failures.append("a GEMM or attention kernel has no measured FLOPs")
    unclassified = matrix[~matrix["bound"].isin(["compute", "memory", "latency"])]
    if len(unclassified):
        failures.append(f"{len(unclassified)} GEMM/attention kernel(s) not classified compute/memory/latency")
    over = matrix[matrix["pct_of_roof"] > 100 + NOISE_PCT]
    if len(over):
        failures.append(f"{len(over)} kernel(s) above {100 + NOISE_PCT:.0f}% of their roof")
    top = [t["name"] for t in params.get("top_kernels") or []]
    if not top:
        failures.append("the report has no params.top_kernels: was it made with --top-n?")
    per_kernel = int(params.get("launches_per_kernel") or 1)
    patterns = [re.compile(exact_name_regex(n).removeprefix("regex:")) for n in top]
    found = set()
    for name, count in k["name"].value_counts().items():
        ranks = [i for i, p in enumerate(patterns) if p.search(str(name))]
        found.update(ranks)
        if top and not ranks:
            failures.append(f"profiled a kernel the first pass did not rank: {str(name)[:100]}")
        elif count > per_kernel:
            failures.append(f"{count} launches of {str(name)[:80]} (at most {per_kernel} asked)")
    missing = [n[:60] for i, n in enumerate(top) if i not in found]
    if missing:
        print(f"  note: {len(missing)} ranked kernel(s) not in the report (ncu matched none): {missing}")
    if not math.isfinite(float(k["duration_ns"].sum())):
        failures.append("kernel durations missing")
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the .perfscope folder written by perfscope profile --collector ncu --top-n")
    args = parser.parse_args(argv)
    failures = check(args.report)
    for failure in failures:
        print(f"ncu_topn_check: FAIL {failure}")
    if not failures:
        print("ncu_topn_check: OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
