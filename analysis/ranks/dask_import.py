"""Import a distributed job's per-rank traces in parallel on Dask into one multi-rank Report.

One task per rank file runs on a Dask worker: it reads the trace (any format
:func:`perfscope.analysis.readers.detect.import_file` reads), writes its tables to Parquet files in a
staging folder next to the output, and sends back only small things (who the rank is, row counts,
its manifest, its per-rank analysis). So the client never holds the job, and a worker holds one
rank's trace at a time (workers run one task at a time). The client then decides which files make
the job (:func:`perfscope.analysis.ranks.job.plan_job`), moves the kept files into Parquet datasets
partitioned by rank (``kernels/rank=N/part-0.parquet``) and writes the manifest; the folder is
renamed into place at the end, so an existing report is never half-overwritten.

By default a ``LocalCluster`` sized to this machine runs the tasks; ``scheduler="tcp://host:8786"``
runs the same tasks on an existing cluster, whose workers must have perfscope installed and see
the input files and the output folder at the same paths (a shared file system).
"""

from __future__ import annotations

import glob
import logging
import os
import resource
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from perfscope.errors import InputFormatError, PerfscopeError, ToolNotFoundError, UsageError
from perfscope.format import records
from perfscope.report import (
    check_replaceable,
    default_manifest,
    move_into_place,
    write_extra_files,
    write_manifest,
)
from perfscope.schema import TABLES, empty_table

from .collectives import group_key, match, rank_waits, step_waits, with_keys
from .job import JobPlan, RankResult, plan_job, rank_identity, trace_meta
from .partial_read import job_summary, plain_frame, read_views, write_views
from .stats import TABLES_PER_RANK, RankTables, format_ranks, one_rank, parse_ranks
from .straggler import Stragglers, decide, empty_stragglers

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".db")
"""File names a rank folder is searched for: Kineto traces (and rocprofv3's ``*_results.json``), nsys
exports, rocpd and rocprof v1 databases."""

MEMORY_PER_TRACE_BYTE = 2.0
"""Worker memory per byte of uncompressed trace JSON, above the worker's baseline: measured by
``benchmarks/ranks.py`` at 1.1 (207 MB rank: worker peak 0.37 GiB) to 2.0 (62 MB rank: 0.27 GiB);
used to size the default local cluster so that the workers' traces fit in available memory."""
WORKER_BASE_BYTES = 256 << 20
"""A worker's own memory before it reads a trace (Python, pandas, pyarrow, dask, perfscope):
155 MiB measured, rounded up."""

_ARROW = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}

Render = Callable[[RankTables, Stragglers, Mapping[str, Any]], Mapping[str, str | bytes]]
Progress = Callable[[int, int, RankResult], None]


# ---------------------------------------------------------------------------- inputs
def _is_trace_name(name: str) -> bool:
    return name.lower().endswith(TRACE_SUFFIXES) and not name.startswith(".")


def discover(source: str | os.PathLike[str]) -> list[Path]:
    """The rank files of ``source``: a folder (its trace files), a glob pattern, or one file.

    Raises:
        InputFormatError: nothing matches.
    """
    text = str(source)
    p = Path(text)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and _is_trace_name(f.name))
    elif any(ch in text for ch in "*?["):
        files = sorted(Path(m) for m in glob.glob(text) if Path(m).is_file())
    elif p.is_file():
        files = [p]
    else:
        raise InputFormatError(p, "no such file, folder or glob match", hint="give a folder of per-rank traces or a quoted glob")
    if not files:
        raise InputFormatError(p, f"no rank trace files ({', '.join(TRACE_SUFFIXES)}) found",
                               hint="give a folder of per-rank traces or a quoted glob such as 'traces/*.json.gz'")
    return files


def uncompressed_size(path: Path) -> int:
    """Bytes of the file once decompressed (gzip's trailer size, mod 4 GiB), else its size."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(-4, os.SEEK_END)
        isize = int.from_bytes(fh.read(4), "little")
    while isize < size:  # the trailer wraps at 4 GiB; a gzip trace is rarely < its compressed size
        isize += 1 << 32
    return isize


def default_workers(files: Sequence[Path], *, cpus: int | None = None, available_bytes: int | None = None) -> int:
    """Workers for a local cluster: one per CPU, no more than files, and no more than fit in memory
    when each holds the largest trace."""
    import psutil

    cpus = cpus or os.cpu_count() or 1
    available = available_bytes if available_bytes is not None else psutil.virtual_memory().available
    per_worker = WORKER_BASE_BYTES + MEMORY_PER_TRACE_BYTE * max(uncompressed_size(f) for f in files)
    fit = int(available // per_worker)
    return max(1, min(cpus, len(files), fit))


# ---------------------------------------------------------------------------- the rank task
def arrow_table(df: Any, table: str) -> pa.Table:
    """A table as Arrow with the contract's types (strings, int64, float64, bool), ``rank`` dropped.

    Fixed types make every rank's file agree, so the rank partitions read back as one dataset.
    Extra columns keep their inferred type; an all-missing one becomes a string column.
    """
    df = df.drop(columns=[c for c in ("rank",) if c in df.columns])
    t = pa.Table.from_pandas(df, preserve_index=False)
    contract = {c.name: _ARROW[c.kind] for c in TABLES[table]}
    fields = []
    for f in t.schema:
        typ = contract.get(f.name, f.type)
        if pa.types.is_null(typ) or pa.types.is_large_string(typ):
            typ = pa.string()
        fields.append(pa.field(f.name, typ))
    return t.cast(pa.schema(fields))


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _worker_name() -> str:
    try:
        from dask.distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return f"{socket.gethostname()}:{os.getpid()}"


def _stage(report: Any, folder: Path) -> tuple[dict[str, str], dict[str, int]]:
    folder.mkdir(parents=True, exist_ok=True)
    staged, rows = {}, {}
    for name in TABLES:
        df = report.table(name)
        rows[name] = len(df)
        if len(df):
            path = folder / f"{name}.parquet"
            pq.write_table(arrow_table(df, name), path)
            staged[name] = str(path)
    return staged, rows


def _stage_views(t: RankTables, folder: Path) -> dict[str, str]:
    """Write one rank's analysis tables (small) next to its staged report tables."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in VIEW_PARTS:
        df = getattr(t, name)
        path = folder / f"view_{name}.parquet"
        plain_frame(df).to_parquet(path, index=False)
        out[name] = str(path)
    return out


VIEW_PARTS = ("per_rank", "steps", "categories", "kernels", "collectives", "idle")


def read_rank(index: int, path: str, staging: str, device: DeviceSpec | None = None) -> RankResult:
    """The Dask task of one rank file: read it, stage its tables and its analysis, return a summary.

    Never raises for a bad file: the error is sent back (the plan skips the rank and says why).
    """
    from ..readers.detect import import_file

    started = time.perf_counter()
    result = RankResult(index=index, path=path, worker=_worker_name())
    p = Path(path)
    try:
        result.identity = rank_identity(p, trace_meta(p))
        report = import_file(p, device=device)
        if result.identity.rank is not None:
            here = Path(staging) / str(index)
            result.staged, result.rows = _stage(report, here)
            t = one_rank(result.identity.rank, {n: report.table(n) for n in TABLES_PER_RANK},
                         result.identity.groups)
            result.views = _stage_views(t, here)
            result.summary = records(t.per_rank)[0]
            result.sync_groups = sorted({str(g) for g in t.collectives["group"].tolist()}) if len(t.collectives) else []
        result.manifest = {k: report.manifest.get(k) for k in ("source", "device", "warnings", "partial",
                                                               "unavailable_metrics", "params")}
    except PerfscopeError as exc:
        result.error = str(exc)
    except (MemoryError, RecursionError) as exc:
        result.error = f"{type(exc).__name__} while reading"
    except Exception as exc:  # noqa: BLE001 - one bad rank must not stop the job; the reason is kept
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    result.peak_rss_bytes = _peak_rss_bytes()
    result.seconds = time.perf_counter() - started
    return result


# ---------------------------------------------------------------------------- cross-rank views, on the cluster
def match_group(gkey: str, parts: Sequence[tuple[int, str]], job_ranks: Sequence[int], roles: Mapping[int, Any],
                out: str) -> tuple[str, str]:
    """The Dask task of one group of ranks: match its collectives across its ranks
    (:func:`.collectives.match`) and write the ranks' waits and their waits per step to ``out``
    (two Parquet files); returns their paths. Reads only this group's ranks' collective rows."""
    import pandas as pd

    frames = [pd.read_parquet(f) for _, f in parts]
    coll = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else frames[0]
    keyed = with_keys(coll, roles)
    keyed = keyed[keyed["gkey"] == gkey]
    matched = match(keyed, job_ranks)
    Path(out).mkdir(parents=True, exist_ok=True)
    w, st = Path(out) / "waits.parquet", Path(out) / "steps.parquet"
    rank_waits(matched).to_parquet(w, index=False)
    step_waits(matched).to_parquet(st, index=False)
    return str(w), str(st)


def assemble_views(views: Sequence[Mapping[str, str]], groups: Sequence[tuple[str, list[int], str, str]],
                   job_ranks: Sequence[int], folder: str) -> dict[str, Any]:
    """The Dask task that joins the ranks' analysis and the groups' matches into the job's views
    (:func:`.partial_read.write_views` into ``folder``) and returns the job's summary (JSON-ready,
    its size independent of the kernels: one row per rank, step number and group)."""
    import pandas as pd

    def stack(name: str) -> pd.DataFrame:
        frames = [pd.read_parquet(v[name]) for v in views if name in v]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    t = RankTables(stack("per_rank"), stack("steps"), stack("categories"), stack("kernels"), pd.DataFrame(),
                   stack("idle"))
    waits = [pd.read_parquet(w) for _, _, w, _ in groups]
    steps = [pd.read_parquet(st) for _, _, _, st in groups]
    waits_df = pd.concat([w for w in waits if len(w)], ignore_index=True) if any(len(w) for w in waits) else pd.DataFrame()
    steps_df = pd.concat([x for x in steps if len(x)], ignore_index=True) if any(len(x) for x in steps) else \
        pd.DataFrame(columns=["rank", "step", "wait_ns", "caused_ns"])
    if len(steps_df):
        steps_df = steps_df.groupby(["rank", "step"], as_index=False)[["wait_ns", "caused_ns"]].sum()
    s = decide(waits_df, t.per_rank, t.steps, steps_df, job_ranks, {g: r for g, r, _, _ in groups}) \
        if len(waits_df) else empty_stragglers()
    write_views(folder, t, s)
    return job_summary(t, s)


def render_into(render: bytes, folder: str, manifest: Mapping[str, Any]) -> list[str]:
    """The Dask task that renders extra files (``ranks.html``) from the stored views into ``folder``.
    ``render`` arrives cloudpickled by value (:func:`_by_value`)."""
    import cloudpickle

    stored = read_views(folder)
    if stored is None:
        return []
    files = cloudpickle.loads(render)(stored[0], stored[1], manifest)
    write_extra_files(Path(folder), files)
    return sorted(files)


# ---------------------------------------------------------------------------- cluster
@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None, *, processes: bool = True,
                files: Sequence[Path] = ()) -> Iterator[Any]:
    """A ``dask.distributed.Client``: on ``scheduler``, or on a new local cluster of ``workers``.

    Raises:
        ToolNotFoundError: dask.distributed is not installed.
        UsageError: the scheduler cannot be reached.
    """
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise ToolNotFoundError("dask.distributed", hint='pip install "dask[distributed]"') from None
    if scheduler:
        as_file = Path(scheduler).is_file() or scheduler.endswith(".json")
        try:
            client = Client(scheduler_file=scheduler, timeout="5s") if as_file else Client(scheduler, timeout="5s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler} ({exc})",
                             hint="give its address (tcp://HOST:8786) or its scheduler file (dask scheduler "
                                  "--scheduler-file PATH), or drop --scheduler to run locally") from None
        with client:
            yield client
        return
    n = workers or (default_workers(files) if files else 1)
    # the scheduler always serves HTTP (health, metrics): on localhost, on any free port
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=processes, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        yield client


def _gather(client: Any, files: Sequence[Path], staging: Path, device: DeviceSpec | None,
            progress: Progress | None) -> list[RankResult]:
    from dask.distributed import as_completed

    futures = {client.submit(read_rank, i, str(f), str(staging), device, pure=False): (i, f)
               for i, f in enumerate(files)}
    results = []
    for future in as_completed(futures):
        i, f = futures.pop(future)
        try:
            res = future.result()
        except Exception as exc:  # noqa: BLE001 - a worker that died (out of memory) loses one rank only
            res = RankResult(index=i, path=str(f), error=f"the worker died while reading it ({type(exc).__name__}); "
                                                          "out of memory? use fewer --workers")
        results.append(res)
        if progress:
            progress(len(results), len(files), res)
    return results


# ---------------------------------------------------------------------------- assembly
def _place(plan: JobPlan, folder: Path) -> dict[str, list[Path]]:
    placed: dict[str, list[Path]] = {}
    for r in plan.kept:
        for table, staged in r.staged.items():
            dest = folder / table / f"rank={int(r.identity.rank or 0)}" / "part-0.parquet"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, dest)
            placed.setdefault(table, []).append(dest)
    return placed


def conform_fragment(path: str, schema: pa.Schema) -> str:
    """Rewrite one rank's Parquet file to ``schema`` (missing columns become nulls)."""
    t = pq.read_table(path)
    cols = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(len(t), f.type) for f in schema]
    pq.write_table(pa.Table.from_arrays(cols, schema=schema), path)
    return path


def unify(client: Any, placed: Mapping[str, list[Path]]) -> int:
    """Give every rank file of a table one schema (rewriting the few that differ); returns how many."""
    jobs = []
    for files in placed.values():
        schemas = [pq.read_schema(f).remove_metadata() for f in files]
        target = pa.unify_schemas(schemas, promote_options="permissive")
        jobs += [(str(f), target) for f, s in zip(files, schemas) if not s.equals(target)]
    if jobs:
        client.gather([client.submit(conform_fragment, f, s, pure=False) for f, s in jobs])
    return len(jobs)


def job_manifest(plan: JobPlan, summary: Mapping[str, Any], source: str, workers: Mapping[str, int]) -> dict[str, Any]:
    """The manifest of the multi-rank report (``summary``: :func:`.partial_read.job_summary`)."""
    first = plan.kept[0].manifest
    src = dict(first.get("source") or {})
    rows = {name: sum(r.rows.get(name, 0) for r in plan.kept) for name in TABLES}
    ranks_param = {**plan.params(), "per_rank": list(summary.get("per_rank") or []),
                   "straggler": {k: v for k, v in (summary.get("straggler") or {}).items() if k != "groups"},
                   "roles": summary.get("roles") or {}, "workers_peak_rss_bytes": dict(workers)}
    manifest = default_manifest()
    manifest.update({
        "name": Path(source.rstrip("/*")).name or "ranks",
        "source": {**src, "kind": f"{src.get('kind') or 'trace'}-ranks", "path": source},
        "device": first.get("device"),
        "params": {"ranks": ranks_param,
                   "events": sum(int((r.manifest.get("params") or {}).get("events") or 0) for r in plan.kept) or None},
        "warnings": plan.warnings,
        "unavailable_metrics": sorted({m for r in plan.kept for m in (r.manifest.get("unavailable_metrics") or [])}),
        "partial": any(bool(r.manifest.get("partial")) for r in plan.kept) or bool(plan.missing),
        "tables": rows,
    })
    return manifest


def _finalize(tmp: Path, target: Path, force: bool) -> None:
    check_replaceable(target, force)
    move_into_place(tmp, target)


@dataclass(frozen=True)
class RankImport:
    """The outcome of :func:`import_ranks`: where the report is, what it covers, what was skipped.

    Attributes:
        path: the report folder.
        manifest: its manifest.
        summary: the job's views (:func:`.partial_read.job_summary`), computed on the cluster.
        plan: which files make the job, and why the others were left out.
        results: what each rank task sent back, in file order.
    """

    path: Path
    manifest: dict[str, Any]
    summary: dict[str, Any]
    plan: JobPlan
    results: list[RankResult]

    @property
    def tables(self) -> RankTables:
        """The per-rank tables, read back from the report's stored views."""
        stored = read_views(self.path)
        return stored[0] if stored is not None else RankTables.concat([])


def _groups_of_job(plan: JobPlan) -> dict[str, list[tuple[int, str]]]:
    """Group key -> (rank, its collectives file) for every group the kept ranks' collectives meet."""
    out: dict[str, list[tuple[int, str]]] = {}
    for r in plan.kept:
        role = r.summary.get("role")
        for g in r.sync_groups:
            out.setdefault(group_key(g, role), []).append((int(r.identity.rank or 0), r.views["collectives"]))
    return out


def _cross_rank(plan: JobPlan, tmp: Path, staging: Path, client: Any) -> dict[str, Any]:
    """Match each group's collectives on the cluster (one task per group), then join everything into
    the job's views there (one task); the client receives the summary only."""
    ranks = plan.ranks
    roles = {int(r.identity.rank or 0): r.summary.get("role") for r in plan.kept}
    groups = _groups_of_job(plan)
    futures = {gkey: client.submit(match_group, gkey, parts, ranks, {r: roles[r] for r, _ in parts},
                                   str(staging / "_groups" / str(i)), pure=False)
               for i, (gkey, parts) in enumerate(sorted(groups.items()))}
    done = []
    for gkey, future in futures.items():
        waits, steps = future.result()
        members = [r for r, _ in groups[gkey]] if gkey.startswith("all ") else [
            r for r in parse_ranks(gkey)]
        done.append((gkey, members, waits, steps))
    views = [r.views for r in plan.kept]
    return client.submit(assemble_views, views, done, ranks, str(tmp), pure=False).result()


def _by_value(render: Render) -> bytes:
    """``render`` pickled whole (cloudpickle by value). Dask pickles a module-level function by its name,
    and a worker that cannot import that module (a caller's script or test module, absent from a
    worker's path or node) fails to read the task message and drops its connection to the scheduler:
    the job then waits for a worker forever. By value, the function needs only what it calls."""
    import cloudpickle

    module = sys.modules.get(getattr(render, "__module__", "") or "")
    if module is None or module.__name__.startswith("perfscope") or \
            module.__name__ in cloudpickle.list_registry_pickle_by_value():  # ours, or the caller's own choice kept
        return cloudpickle.dumps(render)
    cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(render)
    finally:
        cloudpickle.unregister_pickle_by_value(module)


def _write(plan: JobPlan, tmp: Path, staging: Path, client: Any, source: str,
           render: Render | None) -> tuple[dict[str, Any], dict[str, Any]]:
    if not plan.kept:
        reasons = "; ".join(f"{Path(s['path']).name}: {s['reason']}" for s in plan.skipped[:5])
        raise InputFormatError(source, f"no rank could be imported ({reasons})", hint="check the files named above")
    placed = _place(plan, tmp)
    if "kernels" not in placed:  # every report has a kernels table, even an empty one
        empty_table("kernels").to_parquet(tmp / "kernels.parquet", index=False)
    unify(client, placed)
    summary = _cross_rank(plan, tmp, staging, client)
    workers: dict[str, int] = {}
    for r in plan.kept:
        if r.worker and r.peak_rss_bytes:
            workers[r.worker] = max(workers.get(r.worker, 0), r.peak_rss_bytes)
    manifest = job_manifest(plan, summary, source, workers)
    write_manifest(tmp, manifest)
    if render is not None:
        client.submit(render_into, _by_value(render), str(tmp), manifest, pure=False).result()
    return manifest, summary


def import_ranks(source: str | os.PathLike[str], out: str | os.PathLike[str], *, scheduler: str | None = None,
                 workers: int | None = None, device: DeviceSpec | None = None, force: bool = False,
                 processes: bool = True, render: Render | None = None, progress: Progress | None = None) -> RankImport:
    """Import a folder or glob of per-rank traces into one multi-rank report folder.

    The client holds no rank's tables: each rank task writes its own, the groups' collectives are
    matched by one task per group, and the job's views are joined by one more task, all on the
    cluster; the client receives small summaries (per rank: who it is, its row counts and headline
    numbers) and the job's summary.

    Args:
        source: a folder of per-rank trace files, a glob pattern, or one file.
        out: the report folder to write (``NAME.perfscope``).
        scheduler: an existing Dask scheduler's address (``tcp://host:8786``) or scheduler file;
            default: a local cluster.
        workers: local workers (default: :func:`default_workers`).
        device: roofs to classify against (default: each trace's own device).
        force: replace an existing report at ``out``.
        processes: local workers as processes (True) or threads in this process.
        render: extra files to write into the report from the rank tables, the straggler analysis and
            the manifest (``{"ranks.html": ...}``), run on the cluster before the folder is renamed
            into place.
        progress: called as ``progress(done, total, result)`` after each rank.

    Raises:
        InputFormatError: no rank file, or none could be imported (each reason is named).
        OutputExistsError: ``out`` exists and ``force`` is false.
    """
    files = discover(source)
    target = Path(out)
    check_replaceable(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging = tmp / "_staging"
    try:
        staging.mkdir(parents=True)
        with dask_client(scheduler, workers, processes=processes, files=files) as client:
            results = _gather(client, files, staging, device, progress)
            plan = plan_job(results)
            manifest, summary = _write(plan, tmp, staging, client, str(source), render)
        shutil.rmtree(staging, ignore_errors=True)
        _finalize(tmp, target, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return RankImport(target, manifest, summary, plan, sorted(results, key=lambda r: r.index))


__all__ = [
    "RankImport",
    "default_workers",
    "discover",
    "format_ranks",
    "import_ranks",
    "match_group",
    "read_rank",
    "uncompressed_size",
]
