"""How well ``perfscope whatif`` moves a kernel to another GPU, and the data its device models come from.

    python benchmarks/whatif_crossgpu.py [--write] [--csv OUT.csv] [--root tests/fixtures]

Every public measurement of the same work on two GPUs (``tests/fixtures/crossgpu/``: aiconfigurator A100 /
H100, vidur A100 / H100 / A40, LLMCompass A100 / MI210, TraceLens's BERT-small and TimeSformer on H100 /
MI300X, and TraceLens's per-op perf-report tables of three more models on both: GEMM, attention,
elementwise, norm, copy), projected from each GPU onto the other by device models fitted without it (four folds by a hash
of the work's key, each fitted on the other three: :func:`perfscope.analysis.projection.devicefit.cross_validate`), beside two baselines:
``ratio`` (the measured time x the datasheet ratio of the roof that binds) and ``roof`` (the kernel at the
target's roofline), and the previous model (``v1``: each kernel keeps its measured efficiency).

Prints, per table and GPU pair, then per pair and family group, then per vendor pair: the rows, the
model's median and p90 absolute error (%), both baselines' and v1's median, the goal and whether the model
beats both baselines. Then the bands (the p10-p90 of the held-out error, widened by their sampling
error and the variation between the folds' fits), their coverage (bands taken from the other folds' rows, checked
on each fold's), and the whole-model
check: each H100 trace of the two pairs projected onto the MI300X (``perfscope whatif --gpu MI300X``)
against the MI300X's measured total kernel time, with the shipped models (fitted on everything, these
pairs included) and with models fitted without that model's pair (held out).

``--rows 'SRC -> TGT:GROUP'`` prints every held-out row of that pair and family group (its work, times,
the measured and projected ratio, and the three errors), to diagnose a miss row by row.

``--write`` refits the shipped models on every observation and writes ``perfscope/device_models.json``
(the curves, floors, launch costs, the bands and this validation).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from perfscope.analysis.projection import devicefit as dfit
from perfscope.device_models import DATA

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SOURCE_DATA = Path(__file__).resolve().parents[1] / "perfscope" / DATA.name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--csv", type=Path, help="write every held-out pair row here")
    ap.add_argument("--write", action="store_true", help=f"refit on everything and write {DATA.name}")
    ap.add_argument("--rows", metavar="PAIR:GROUP", action="append", default=[],
                    help="print every held-out row of a device pair and family group (e.g. 'MI210 -> A100:other'; "
                         "each side matched as a substring of the device names), with the model's and both "
                         "baselines' errors; repeatable")
    ap.add_argument("--folds", type=int, default=dfit.OUTER_FOLDS,
                    help=f"outer folds of the cross-validation (default {dfit.OUTER_FOLDS}; 2 was the default until "
                         "this stop; not with --write: the shipped bands come from the default)")
    ap.add_argument("--wave", action="store_true",
                    help="offer the GEMM wave (tile occupancy) terms to the inner cross-validation too "
                         "(devicefit.WAVE_CANDIDATES; not with --write: the shipped models use the default terms)")
    ap.add_argument("--no-keep", action="store_true",
                    help="offer the candidates before the persistence term (devicefit.BASE_CANDIDATES: no 'keep'), "
                         "to measure what it changed (not with --write)")
    ap.add_argument("--keep-only", action="store_true",
                    help="offer the candidates before the run-level and op terms (devicefit.KEEP_CANDIDATES: the "
                         "persistence term for GEMMs only), to measure what they changed (not with --write)")
    args = ap.parse_args()
    if args.folds != dfit.OUTER_FOLDS and args.write:
        ap.error("--write ships the bands of the default folds")
    if (args.wave or args.no_keep or args.keep_only) and args.write:
        ap.error("--wave, --no-keep and --keep-only are measurements; --write fits the shipped (default) candidates")
    cands = (dfit.WAVE_CANDIDATES if args.wave else dfit.BASE_CANDIDATES if args.no_keep
             else dfit.KEEP_CANDIDATES if args.keep_only else None)
    t0 = time.perf_counter()
    obs = dfit.all_observations(args.root)
    launch = dfit.launch_costs(dfit.trace_reports(args.root))
    rows = dfit.cross_validate(obs, folds=args.folds, launch=launch, candidates=cands)
    table = dfit.error_table(rows)
    print(f"{len(obs):,} observations ({obs['device'].nunique()} GPUs, {obs['dataset'].nunique()} datasets); "
          f"{len(rows):,} held-out pair rows; {time.perf_counter() - t0:.1f} s")
    head = (f"{'pair':<36} {'table':<42} {'rows':>6} {'model':>6} {'p90':>6} {'ratio':>6} {'roof':>6} {'v1':>6} "
            f"{'goal':>5}  beats both")
    print(head)
    for r in table.itertuples(index=False):
        print(f"{r.pair:<36} {r.table[:42]:<42} {int(r.rows):>6} {r.model_median:>6.1f} {r.model_p90:>6.1f} "
              f"{r.ratio_median:>6.1f} {r.roof_median:>6.1f} {r.v1_median:>6.1f} {r.goal_pct:>5.0f}  "
              f"{'yes' if r.beats_both else 'no'}")
    for spec in args.rows:
        print_rows(rows, spec)
    print("\nbands (log measured / projected, held out):")
    for b in dfit.bands(rows):
        print(f"  {b.pair:<16} {b.group:<10} rows {b.rows:>6}  x{np.exp(b.q10):.3f} .. x{np.exp(b.q90):.3f}  "
              f"median |err| {b.median_abs_pct:.1f}%  p90 {b.p90_abs_pct:.1f}%")
    fold = rows["fold"].to_numpy()
    for name, fit_on in ((f"the other folds -> fold {k}", fold != k) for k in range(args.folds)):
        cov = dfit.coverage(rows, fit_on)
        parts = ", ".join(f"{c.pair} {c.group} {c.inside_pct:.0f}% of {c.rows}" for c in cov.itertuples(index=False)
                          if c.group != "ALL")
        print(f"coverage, bands from {name}: {cov.iloc[-1]['inside_pct']:.1f}% of {int(cov.iloc[-1]['rows'])} rows "
              f"inside ({parts})")
    models = dfit.shipped(obs, rows, launch, cands)
    print("\npair-correction terms, picked by the inner cross-validation of each fit (never the rows it is checked on):")
    for f, sel in rows.attrs.get("pair_selection", {}).items():
        print(f"  fit for held-out fold {f} (on the other folds): " + ", ".join(f"{g} {c}" for g, c in sorted(sel.items())))
    for g, v in sorted(models.pair_selection.items()):
        sc = ", ".join(f"{c} {x:.1f}%" for c, x in v["scores_pct"].items())
        print(f"  shipped fit (every row), {g}: {v['choice']}  (inner {v['inner_folds']}-fold error per candidate: {sc})")
    print("\nshipped persistence, run-level and op terms (factor exp(level); the five largest op levels per pair and family):")
    for pair, per in sorted(models.pairs.items()):
        for fam, c in sorted(per.items()):
            if not (c.uses_keep or c.uses_run or c.ops):
                continue
            top = sorted(c.ops.items(), key=lambda kv: -abs(kv[1]))[:5]
            ops = ", ".join(f"{o} x{np.exp(v):.2f}" for o, v in top)
            print(f"  {pair:<36} {fam:<18} keep {c.keep_coef:+.2f}  run {c.run_coef:+.2f}  ops ({len(c.ops)}): {ops}")
    print("\nwhole model, H100 trace projected onto the MI300X (total kernel time):")
    for label, per in (("shipped models (fitted on every dataset, this pair included)", None),
                       ("held out (fitted without this model's pair)", "lomo")):
        for name in dfit.PAIR_TRACES:
            m = models if per is None else dfit.fit(obs[obs["dataset"] != name], launch, candidates=cands)
            w = dfit.whole_model(m, args.root, [name]).iloc[0]
            band = f" (band {w.low_s * 1e3:.2f}-{w.high_s * 1e3:.2f} ms)" if per is None else ""
            print(f"  {label}: {name}: H100 {w.source_s * 1e3:.2f} ms -> projected {w.projected_s * 1e3:.2f} ms"
                  f"{band}, measured {w.measured_s * 1e3:.2f} ms: {w.error_pct:+.1f}%")
    if args.csv:
        rows.to_csv(args.csv, index=False)
    if args.write:
        print(f"\nwrote {models.write(SOURCE_DATA)}")
    return 0


def print_rows(rows, spec: str) -> None:
    """Every held-out row of one device pair (``SRC -> TGT``, substrings of the device names) and family group."""
    pair, _, group = spec.rpartition(":")
    src, _, tgt = pair.partition("->")
    sel = (rows["device_s"].str.contains(src.strip(), regex=False) & rows["device_t"].str.contains(tgt.strip(), regex=False)
           & (rows["group"] == group.strip()))
    sub = rows[sel].sort_values(["table", "roof_s_s"])
    print(f"\nheld-out rows, {spec} ({len(sub)}): measured ratio target / source, projected ratio, errors %")
    print(f"  {'table':<34} {'fold':>4} {'roof us':>9} {'FLOP/B':>8} {'src us':>9} {'tgt us':>9} {'meas x':>7} "
          f"{'proj x':>7} {'model':>6} {'ratio':>6} {'roof':>6}  key")
    for r in sub.itertuples(index=False):
        ai = r.flops_s / r.bytes_s if r.bytes_s > 0 else float("nan")
        print(f"  {r.table[:34]:<34} {r.fold:>4} {r.roof_s_s * 1e6:>9.2f} {ai:>8.1f} {r.time_s_s * 1e6:>9.2f} "
              f"{r.time_s_t * 1e6:>9.2f} {r.time_s_t / r.time_s_s:>7.3f} {r.pred_model_s / r.time_s_s:>7.3f} "
              f"{r.err_model_pct:>6.1f} {r.err_ratio_pct:>6.1f} {r.err_roof_pct:>6.1f}  {str(r.key)[-70:]}")


if __name__ == "__main__":
    sys.exit(main())
