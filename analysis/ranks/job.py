"""Which rank is each file, and which files make one job: identity, then the plan of what to keep.

A rank is known from the trace's own ``distributedInfo`` (Kineto writes ``rank``, ``world_size``
and ``backend`` into the trace's top-level metadata, before the events or, for on-demand traces,
after them) and otherwise from the file name (``rank-3``, ``rank_3``, ``rank3``). When both exist
and disagree, the trace wins and the disagreement is reported.

The plan keeps one job: the largest group of files with the same ``world_size`` (and the same
``trace_id`` where those ids name jobs, i.e. where several files share one; Kineto can also write
one id per process, which says nothing about the job). Files of another job, duplicate ranks,
ranks outside the world size, files with no rank and files that could not be read are skipped,
each with its reason; ranks of the world size with no file are listed as missing.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from .stats import format_ranks

if TYPE_CHECKING:
    from collections.abc import Sequence

RANK_IN_NAME = re.compile(r"rank[-_=]?(\d+)", re.IGNORECASE)
"""``rank-3``, ``rank_3``, ``rank3``, ``rank=3`` anywhere in a file name (HTA's and PyTorch's
``tensorboard_trace_handler`` names carry it this way)."""


@dataclass(frozen=True)
class RankIdentity:
    """Who wrote a trace file.

    Attributes:
        rank: the rank, or None when neither the trace nor the file name says.
        world_size: ranks in the job, when the trace says.
        backend: nccl, gloo, ... when the trace says.
        trace_id: the trace's ``trace_id`` metadata, if any.
        source: ``distributedInfo``, ``file name`` or ``none``.
        name_rank: the rank the file name gives (None when it gives none).
        groups: the process groups the trace lists (``distributedInfo.pg_config``) of more than one
            rank and fewer than the world: name, desc, ranks.
    """

    rank: int | None
    world_size: int | None = None
    backend: str | None = None
    trace_id: str | None = None
    source: str = "none"
    name_rank: int | None = None
    groups: tuple[dict[str, Any], ...] = ()

    @property
    def disagreement(self) -> str | None:
        """A sentence when the file name and the trace name different ranks."""
        if self.source == "distributedInfo" and self.name_rank is not None and self.name_rank != self.rank:
            return f"file name says rank {self.name_rank}, distributedInfo says rank {self.rank} (used)"
        return None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


META_BYTES = 4 << 20
"""How much of a trace's start (and end) is searched for its top-level metadata."""
_EVENTS_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENTS_END = re.compile(rb"\}\s*\]\s*,")


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")  # type: ignore[return-value]


def _object(text: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _head_meta(head: bytes) -> dict[str, Any]:
    """The keys written before ``"traceEvents": [``."""
    m = _EVENTS_START.search(head)
    return _object(head[: m.start()].rstrip().rstrip(b",") + b"}") if m else {}


def _tail_meta(tail: bytes) -> dict[str, Any]:
    """The keys written after the events array: the first ``}],`` whose remainder is an object."""
    for m in _EVENTS_END.finditer(tail):
        meta = _object(b"{" + tail[m.end():])
        if meta:
            return meta
    return {}


def trace_meta(path: Path) -> dict[str, Any]:
    """Top-level metadata of a Kineto JSON trace (without parsing its events); {} for other files.

    Reads the first few MB (where torch.profiler writes ``distributedInfo``) and, only when the
    key is not there, streams to the end for the keys written after the events.
    """
    try:
        with _open(path) as fh:
            head = fh.read(META_BYTES)
            if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] != b"{":
                return {}
            meta = _head_meta(head)
            if "distributedInfo" in meta:
                return meta
            tail = head[-META_BYTES:]
            while chunk := fh.read(1 << 20):
                tail = (tail + chunk)[-META_BYTES:]
    except (OSError, EOFError, gzip.BadGzipFile):
        return {}
    return {**_tail_meta(tail), **meta}


def rank_identity(path: Path, meta: dict[str, Any] | None = None) -> RankIdentity:
    """The rank of ``path`` from its ``distributedInfo``, else from its file name."""
    meta = trace_meta(path) if meta is None else meta
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    found = RANK_IN_NAME.findall(path.name)
    name_rank = int(found[-1]) if found else None
    trace_id = meta.get("trace_id")
    backend = dist.get("backend")
    dist_rank = _int(dist.get("rank"))
    rank, source = (dist_rank, "distributedInfo") if dist_rank is not None else (
        (name_rank, "file name") if name_rank is not None else (None, "none"))
    world = _int(dist.get("world_size"))
    return RankIdentity(rank=rank, world_size=world,
                        backend=str(backend) if backend else None, trace_id=str(trace_id) if trace_id else None,
                        source=source, name_rank=name_rank, groups=process_groups(dist.get("pg_config"), world))


def process_groups(config: Any, world: int | None) -> tuple[dict[str, Any], ...]:
    """The groups of ``distributedInfo.pg_config`` that hold more than one rank and fewer than the
    world (the world is every rank of the job anyway): name, desc, ranks."""
    out = []
    for g in config if isinstance(config, list) else []:
        if not isinstance(g, dict) or not isinstance(g.get("ranks"), list):
            continue
        ranks = sorted({r for r in (_int(x) for x in g["ranks"]) if r is not None})
        if len(ranks) < 2 or (world is not None and len(ranks) >= world):
            continue
        out.append({"name": str(g.get("pg_name")), "desc": str(g.get("pg_desc") or ""), "ranks": ranks})
    return tuple(out)


@dataclass
class RankResult:
    """What one rank task sends back: who the file is, where its tables were staged, its analysis.

    Attributes:
        index: the file's position in the sorted input list.
        path: the trace file.
        error: why it could not be read (None when it was).
        identity: the rank identity.
        staged: table name -> staged Parquet file (without the rank column).
        rows: table name -> row count.
        manifest: the rank's own report manifest (source, device, warnings, partial, ...).
        views: the rank's analysis (:func:`perfscope.analysis.ranks.stats.one_rank`), table name ->
            staged Parquet file.
        summary: its row of the per-rank table (a dict: small).
        sync_groups: the groups its collectives meet (``0-7``; "" when the trace lists none).
        peak_rss_bytes: the peak resident memory of the worker process after the task.
        worker: the worker that ran it.
        seconds: how long the task took.
    """

    index: int
    path: str
    error: str | None = None
    identity: RankIdentity = field(default_factory=lambda: RankIdentity(rank=None))
    staged: dict[str, str] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    views: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    sync_groups: list[str] = field(default_factory=list)
    peak_rss_bytes: int | None = None
    worker: str | None = None
    seconds: float | None = None


@dataclass
class JobPlan:
    """The ranks kept for the report, and every file left out with its reason."""

    kept: list[RankResult]
    skipped: list[dict[str, Any]]
    world_size: int | None
    missing: list[int]
    warnings: list[str]

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r.identity.rank) for r in self.kept if r.identity.rank is not None)

    def params(self) -> dict[str, Any]:
        """The ``ranks`` section of the report's params."""
        first = self.kept[0].identity if self.kept else RankIdentity(rank=None)
        return {
            "ranks": self.ranks, "world_size": self.world_size, "backend": first.backend,
            "missing": format_ranks(self.missing), "missing_count": len(self.missing),
            "skipped": self.skipped,
            "files": {str(r.identity.rank): r.path for r in self.kept},
            "rank_source": {str(r.identity.rank): r.identity.source for r in self.kept},
            "groups": self.groups(),
        }

    def groups(self) -> list[dict[str, Any]]:
        """The process groups of the kept ranks' traces, each once: name, desc, ranks (``0-7``)."""
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for r in self.kept:
            for g in r.identity.groups:
                text = format_ranks(g["ranks"])
                seen.setdefault((str(g["name"]), text), {"name": str(g["name"]), "desc": g["desc"], "ranks": text})
        return list(seen.values())


def _skip(r: RankResult, reason: str) -> dict[str, Any]:
    return {"path": r.path, "rank": r.identity.rank, "reason": reason}


def _job_key(r: RankResult, ids_name_jobs: bool) -> tuple[int | None, str | None]:
    return r.identity.world_size, (r.identity.trace_id if ids_name_jobs else None)


def _compatible(value: Any, kept: Any) -> bool:
    return value is None or kept is None or value == kept


def _choose_job(readable: list[RankResult]) -> tuple[tuple[int | None, str | None], bool]:
    ids = [r.identity.trace_id for r in readable if r.identity.trace_id]
    ids_name_jobs = len(ids) > len(set(ids))
    counts = Counter(_job_key(r, ids_name_jobs) for r in readable)
    known = {k: n for k, n in counts.items() if k != (None, None)} or dict(counts)
    key = max(known, key=lambda k: (known[k], -min(r.index for r in readable if _job_key(r, ids_name_jobs) == k)))
    return key, ids_name_jobs


def _other_job(r: RankResult, key: tuple[int | None, str | None], ids_name_jobs: bool) -> str | None:
    ws, tid = key
    if not _compatible(r.identity.world_size, ws):
        return f"another job: world_size {r.identity.world_size}, the job's is {ws}"
    if ids_name_jobs and not _compatible(r.identity.trace_id, tid):
        return f"another job: trace_id {r.identity.trace_id}, the job's is {tid}"
    return None


def plan_job(results: Sequence[RankResult]) -> JobPlan:
    """Decide which rank files make the job, and why each other file is skipped."""
    ordered = sorted(results, key=lambda r: r.index)
    skipped: list[dict[str, Any]] = []
    readable = []
    for r in ordered:
        if r.error:
            skipped.append(_skip(r, f"unreadable: {r.error}"))
        elif r.identity.rank is None:
            skipped.append(_skip(r, "no rank: no distributedInfo in the trace and no rank-N in the file name"))
        else:
            readable.append(r)
    if not readable:
        return JobPlan([], skipped, None, [], [])
    key, ids_name_jobs = _choose_job(readable)
    world = key[0] if key[0] is not None else next((r.identity.world_size for r in readable if r.identity.world_size), None)
    kept: dict[int, RankResult] = {}
    for r in readable:
        rank = int(r.identity.rank)  # type: ignore[arg-type]
        reason = _other_job(r, key, ids_name_jobs)
        if reason is None and world is not None and not 0 <= rank < world:
            reason = f"rank {rank} is outside world_size {world}"
        if reason is None and rank in kept:
            reason = f"duplicate rank {rank} (kept {kept[rank].path})"
        if reason:
            skipped.append(_skip(r, reason))
        else:
            kept[rank] = r
    missing = sorted(set(range(world)) - set(kept)) if world else []
    plan = JobPlan(sorted(kept.values(), key=lambda r: int(r.identity.rank or 0)), skipped, world, missing, [])
    plan.warnings = plan_warnings(plan)
    return plan


def plan_warnings(plan: JobPlan) -> list[str]:
    """The manifest warnings of a plan: skips, missing ranks, disagreements, partial ranks, and the
    ranks' own reader warnings (each text once, with the ranks it applies to)."""
    out = [f"skipped {Path(s['path']).name}: {s['reason']}" for s in plan.skipped]
    if plan.missing:
        out.append(f"{len(plan.missing)} of {plan.world_size} ranks have no trace (ranks {format_ranks(plan.missing)}); "
                   f"job-level results cover ranks {format_ranks(plan.ranks)} only")
    by_text: dict[str, list[int]] = {}
    for r in plan.kept:
        rank = int(r.identity.rank or 0)
        notes = list(r.manifest.get("warnings") or [])
        if r.identity.disagreement:
            notes.append(r.identity.disagreement)
        if r.manifest.get("partial"):
            notes.append("trace is partial (truncated or damaged); its rank holds what was read")
        for text in notes:
            by_text.setdefault(str(text), []).append(rank)
    devices = {str((r.manifest.get("device") or {}).get("name")) for r in plan.kept if r.manifest.get("device")}
    if len(devices) > 1:
        out.append(f"ranks ran on different devices ({', '.join(sorted(devices))}); the report's roofs are rank "
                   f"{plan.ranks[0]}'s")
    out.extend(f"rank {format_ranks(ranks)}: {text}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}: {text}"
               for text, ranks in by_text.items())
    return out


__all__ = ["JobPlan", "RankIdentity", "RankResult", "plan_job", "rank_identity", "trace_meta"]
