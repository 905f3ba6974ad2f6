"""Multi-rank benchmark: ``perfscope import --ranks`` on Dask, at up to a thousand ranks.

Two jobs, both built from a real rank trace committed under tests/fixtures:

- ``--job sync`` (default): ``--ranks`` ranks in tensor parallel groups of ``--group`` built from
  the B200 TP-8 vLLM prefill rank (``tracelens_b200__eager_trace``, 24,656 events, 768 kernels, 74
  collectives per step) with :class:`perfscope.analysis.ranks.tiling.SyncJob`: each rank repeats
  the trace ``--copies`` times, its work between two collectives jittered (``--jitter``, seeded),
  and every collective ends on all ranks of its group when the last has arrived; one rank
  (``--slow-rank``) works ``--slow`` times slower. perfscope imports the job on a LocalCluster of
  ``--workers`` process workers and must find that rank, and keep every kernel.
- ``--job stretch``: the older comparison with HolisticTraceAnalysis: ``--ranks`` ranks of about
  ``--events`` events each tiled from the A100 rank of a 16-rank job (108,936 events), one rank 10%
  slower in every timestamp, imported with 1 and 2 workers and by HTA (``TraceAnalysis`` then
  ``get_temporal_breakdown`` and ``get_comm_comp_overlap``; ``--hta-python`` names an interpreter
  with HolisticTraceAnalysis installed, by default this one).

Each contender runs in its own Python process, whose process tree (client, Dask nanny and worker
processes, HTA's multiprocessing pool) is sampled for resident memory every 0.2 s; the client's own
peak is its ``VmHWM`` and each worker's is what its tasks report.

Prints wall time, peak memory (whole tree, the client, each Dask worker), the rank tasks' time, the
load average of the machine before and after, and for ``sync`` whether the planted straggler was
found and every kernel kept.

Usage::

    python benchmarks/ranks.py --ranks 1000 [--workers 2] [--copies 2] [--keep --dir DIR] [--reuse]
    python benchmarks/ranks.py --job stretch --ranks 16 --events 1000000 --workers 1,2
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
import threading
import time
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "kineto"
FIXTURE = FIXTURES / "hta_negative_queue_length_values_check__rank0.json.gz"
SYNC_FIXTURE = FIXTURES / "tracelens_b200__eager_trace.json.gz"
GZIP_BYTES_PER_EVENT = 15
"""Disk per tiled event at gzip level 1 (measured on the default fixture), for the space check."""


# ---------------------------------------------------------------------------- the job
def build_job(fixture: Path, folder: Path, ranks: int, events: int, slow_rank: int) -> dict[str, Any]:
    """Write the rank files; returns events per rank and the sizes."""
    from perfscope.analysis.ranks.tiling import TileSpec, load_trace, tile_trace

    doc = load_trace(fixture)
    copies = max(1, math.ceil(events / len(doc["traceEvents"])))
    written = []
    for rank in range(ranks):
        stretch = 1.1 if rank == slow_rank else 1.0
        dst = folder / f"rank-{rank}.pt.trace.json.gz"
        written.append(tile_trace(doc, dst, TileSpec(rank, ranks, copies=copies, stretch=stretch)))
    from perfscope.analysis.ranks.dask_import import uncompressed_size

    files = sorted(folder.iterdir())
    return {"events_per_rank": written[0], "copies": copies,
            "gzip_bytes": sum(f.stat().st_size for f in files),
            "json_bytes_per_rank": uncompressed_size(files[0])}


def build_sync_job(fixture: Path, folder: Path, ranks: int, group: int, copies: int, slow_rank: int, slow: float,
                   jitter: float) -> dict[str, Any]:
    """Write a synchronized job (:class:`SyncJob`); returns its shape and sizes."""
    from perfscope.analysis.ranks.dask_import import uncompressed_size
    from perfscope.analysis.ranks.tiling import SyncJob, load_trace, write_sync_job

    doc = load_trace(fixture)
    job = SyncJob(world_size=ranks, group_size=group, copies=copies, slow=((slow_rank, slow),), jitter=jitter, seed=1)
    files = write_sync_job(doc, folder, job)
    kernels = copies * sum(1 for e in doc["traceEvents"] if str(e.get("cat", "")).lower() == "kernel")
    events = sum(1 for e in doc["traceEvents"] if not (copies > 1 and e.get("ph") == "M")) * copies
    return {"events_per_rank": events, "kernels_per_rank": kernels, "copies": copies, "group": group,
            "slow_rank": slow_rank, "slow": slow, "jitter": jitter,
            "gzip_bytes": sum(f.stat().st_size for f in files), "json_bytes_per_rank": uncompressed_size(files[0])}


# ---------------------------------------------------------------------------- contenders
def _vm_hwm() -> int:
    """This process's peak resident memory (``VmHWM``), bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_perfscope(folder: Path, out: Path, workers: int) -> dict[str, Any]:
    from perfscope.analysis.ranks.dask_import import import_ranks

    t0 = time.perf_counter()
    res = import_ranks(folder, out, workers=workers, force=True)
    t_import = time.perf_counter() - t0
    task_s = sum(r.seconds or 0.0 for r in res.results)
    summary = res.summary
    return {"import_s": t_import, "rank_tasks_s": task_s, "parallelism": task_s / t_import,
            "loadavg_after": os.getloadavg(), "client_peak_rss_bytes": _vm_hwm(),
            "worker_peak_rss_bytes": res.manifest["params"]["ranks"]["workers_peak_rss_bytes"],
            "kernels": res.manifest["tables"]["kernels"], "ranks_kept": len(res.plan.ranks),
            "skipped": len(res.plan.skipped), "straggler": summary["straggler"]["statement"],
            "straggler_ranks": [int(r["rank"]) for r in summary["straggler"]["stragglers"]],
            "stragglers": summary["stragglers"], "mean_overlap_pct": summary["job"].get("mean_overlap_pct")}


def run_hta(folder: Path) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    analyzer = TraceAnalysis(trace_dir=str(folder))
    t_parse = time.perf_counter() - t0
    t1 = time.perf_counter()
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    overlap = analyzer.get_comm_comp_overlap(visualize=False)
    return {"parse_s": t_parse, "analysis_s": time.perf_counter() - t1, "ranks": len(temporal),
            "mean_overlap_pct": float(overlap["comp_comm_overlap_pctg"].mean())}


# ---------------------------------------------------------------------------- measurement
def _tree_rss(proc: Any) -> tuple[int, int]:
    import psutil

    total, largest = 0, 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            rss = p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += rss
        largest = max(largest, rss)
    return total, largest


def _kill_tree(proc: Any) -> None:
    import psutil

    for p in [*proc.children(recursive=True), proc]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def measure(args: list[str], cap_bytes: float, python: str = sys.executable) -> dict[str, Any]:
    """Run ``benchmarks/ranks.py --run ...`` in a child process; wall time and peak tree memory.

    The child's whole process tree is killed when it holds more than ``cap_bytes`` (this machine
    is shared: a contender that needs more is reported as such, not allowed to swap others out).
    """
    import psutil

    started = time.perf_counter()
    child = subprocess.Popen([python, __file__, *args], stdout=subprocess.PIPE, text=True)
    proc = psutil.Process(child.pid)
    peak = {"total": 0, "largest": 0, "capped": 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                total, largest = _tree_rss(proc)
            except psutil.NoSuchProcess:
                return
            peak["total"], peak["largest"] = max(peak["total"], total), max(peak["largest"], largest)
            if total > cap_bytes:
                peak["capped"] = time.perf_counter() - started
                _kill_tree(proc)
                return
            time.sleep(0.2)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, _ = child.communicate()
    done.set()
    thread.join()
    wall = time.perf_counter() - started
    if peak["capped"]:
        return {"error": f"killed at the {_gb(cap_bytes)} memory cap after {peak['capped']:.0f} s "
                         f"(tree peak {_gb(peak['total'])})", "wall_s": wall}
    if child.returncode != 0:
        return {"error": f"exit {child.returncode}", "wall_s": wall}
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "wall_s": wall, "peak_tree_rss_bytes": peak["total"], "peak_process_rss_bytes": peak["largest"]}


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def report(job: dict[str, Any], rows: dict[str, dict[str, Any]], load_before: tuple[float, ...]) -> None:
    print(f"\njob: {job['ranks']} ranks x {job['events_per_rank']:,} events "
          f"({job['json_bytes_per_rank'] / 1e6:.1f} MB JSON per rank, {job['gzip_bytes'] / 1e6:.0f} MB gzipped in all)")
    print(f"machine: {os.cpu_count()} CPUs (shared); load average (1, 5, 15 min) before "
          f"{_load(load_before)}, at the end {_load(os.getloadavg())}")
    print(f"{'contender':<22}{'wall s':>9}{'peak tree':>12}{'largest proc':>14}  notes")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<22}{r['wall_s']:>9.1f}  {r['error']}")
            continue
        note = ""
        if "worker_peak_rss_bytes" in r:
            note = f"client peak {_gb(r['client_peak_rss_bytes'])}; workers' own peaks: " + ", ".join(
                _gb(v) for v in r["worker_peak_rss_bytes"].values())
            note += f"; rank tasks {r['rank_tasks_s']:.0f} s in all, {r['parallelism']:.2f} running at once"
            note += f"; {r['kernels']:,} kernels from {r['ranks_kept']} ranks ({r['skipped']} skipped)"
            note += f"; {r['straggler']}"
            if r["stragglers"]:
                note += f"; step-time outliers: {[(x['rank'], round(x['margin_pct'], 1)) for x in r['stragglers']]}"
        print(f"{name:<22}{r['wall_s']:>9.1f}{_gb(r['peak_tree_rss_bytes']):>12}{_gb(r['peak_process_rss_bytes']):>14}  {note}")
    names = [n for n in rows if "error" not in rows[n]]
    ps = [n for n in names if n.startswith("perfscope")]
    if "slow_rank" in job:
        for n in ps:
            r = rows[n]
            found = r["straggler_ranks"] == [job["slow_rank"]]
            kept = r["kernels"] == job["ranks"] * job["kernels_per_rank"]
            print(f"{n}: planted straggler rank {job['slow_rank']} found: {'yes' if found else 'NO'} "
                  f"(found {r['straggler_ranks']}); every kernel kept: {'yes' if kept else 'NO'} "
                  f"({r['kernels']:,} of {job['ranks'] * job['kernels_per_rank']:,}); wall {r['wall_s']:.0f} s; "
                  f"client peak {_gb(r['client_peak_rss_bytes'])}")
    if len(ps) >= 2:
        print(f"speed-up {ps[-1]} vs {ps[0]}: {rows[ps[0]]['wall_s'] / rows[ps[-1]]['wall_s']:.2f}x")
    if "hta" in names:
        for n in ps:
            print(f"HTA / {n}: wall {rows['hta']['wall_s'] / rows[n]['wall_s']:.2f}x, peak tree memory "
                  f"{rows['hta']['peak_tree_rss_bytes'] / rows[n]['peak_tree_rss_bytes']:.2f}x")


def _load(avg: tuple[float, ...]) -> str:
    return ", ".join(f"{x:.1f}" for x in avg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", choices=["sync", "stretch"], default="sync")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--events", type=int, default=1_000_000, help="stretch: events per rank (about)")
    ap.add_argument("--copies", type=int, default=2, help="sync: times each rank repeats the trace")
    ap.add_argument("--group", type=int, default=8, help="sync: ranks per tensor parallel group")
    ap.add_argument("--jitter", type=float, default=0.02, help="sync: relative jitter of each rank's work")
    ap.add_argument("--slow", type=float, default=1.12, help="sync: the slow rank's factor on its work")
    ap.add_argument("--workers", default=None, help="comma-separated local worker counts (sync: 2, stretch: 1,2)")
    ap.add_argument("--slow-rank", type=int, default=None, help="default: 5 (stretch), about 0.44 x ranks (sync)")
    ap.add_argument("--fixture", type=Path, default=None)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--hta-python", default=sys.executable, help="an interpreter with HolisticTraceAnalysis")
    ap.add_argument("--keep", action="store_true", help="keep the generated folder")
    ap.add_argument("--mem-cap-gb", type=float, default=12.0, help="kill a contender whose processes hold more")
    ap.add_argument("--dir", type=Path, default=None, help="where to generate (default: a temp dir)")
    ap.add_argument("--reuse", action="store_true", help="reuse the rank files of a kept --dir")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--run", choices=["perfscope", "hta"], help=argparse.SUPPRESS)
    ap.add_argument("--traces", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run == "perfscope":
        print(json.dumps(run_perfscope(args.traces, args.traces.parent / "job.perfscope", int(args.workers))))
        return
    if args.run == "hta":
        print(json.dumps(run_hta(args.traces)))
        return
    sync = args.job == "sync"
    workers = args.workers or ("2" if sync else "1,2")
    slow_rank = args.slow_rank if args.slow_rank is not None else (int(0.437 * args.ranks) if sync else 5)
    base = args.dir or Path(tempfile.mkdtemp(prefix="perfscope-ranks-"))
    per_rank = 900_000 * args.copies if sync else args.events * GZIP_BYTES_PER_EVENT
    need = args.ranks * per_rank * 2
    free = shutil.disk_usage(base if base.exists() else base.parent).free
    if free < need:
        sys.exit(f"not enough disk in {base}: {free / 1e9:.1f} GB free, ~{need / 1e9:.1f} GB needed")
    traces = base / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    try:
        t0 = time.perf_counter()
        saved = base / "job.json"
        if args.reuse and saved.is_file():
            job = json.loads(saved.read_text())
        elif sync:
            job = {"ranks": args.ranks, **build_sync_job(args.fixture or SYNC_FIXTURE, traces, args.ranks, args.group,
                                                         args.copies, slow_rank, args.slow, args.jitter)}
        else:
            job = {"ranks": args.ranks, **build_job(args.fixture or FIXTURE, traces, args.ranks, args.events, slow_rank)}
        saved.write_text(json.dumps(job))
        print(f"{args.ranks} ranks ready in {time.perf_counter() - t0:.0f} s in {traces}", flush=True)
        rows: dict[str, dict[str, Any]] = {}
        cap = args.mem_cap_gb * 2**30
        load_before = os.getloadavg()
        for n in (int(w) for w in workers.split(",")):
            rows[f"perfscope {n} worker{'s' if n > 1 else ''}"] = r = measure(
                ["--run", "perfscope", "--workers", str(n), "--traces", str(traces)], cap)
            print(f"perfscope workers={n}: {r.get('wall_s', 0):.1f} s", flush=True)
        if not args.no_hta and not sync:
            rows["hta"] = measure(["--run", "hta", "--traces", str(traces)], cap, args.hta_python)
            print(f"hta: {rows['hta'].get('wall_s', 0):.1f} s", flush=True)
        report(job, rows, load_before)
        if args.json:
            args.json.write_text(json.dumps({"job": job, "results": rows}, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(base if args.dir is None else traces, ignore_errors=True)
            shutil.rmtree(base / "job.perfscope", ignore_errors=True)
            (base / "job.json").unlink(missing_ok=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
