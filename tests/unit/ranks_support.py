"""Shared by the rank tests: rank sets tiled from the real fixtures, and direct computations on the
trace JSON (plain Python, independent of perfscope's numpy interval code) to check results against."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from perfscope.analysis.ranks.tiling import TileSpec, load_trace, tile_trace

K = "kineto"
RANK0 = f"{K}/hta_trace_filter__sampled_rank-0.json.gz"
RANK1 = f"{K}/hta_trace_filter__sampled_rank-1.json.gz"
B200 = f"{K}/tracelens_b200__eager_trace.json.gz"
STEP = re.compile(r"^ProfilerStep#(\d+)$")


def load_json(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def _ns(doc: dict[str, Any], ts: float) -> int:
    return round(ts * 1000.0) + int(doc.get("baseTimeNanoseconds") or 0)


def intervals(doc: dict[str, Any], cats: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """(start_ns, end_ns, name) of the complete events of these categories, as the reader times them."""
    out = []
    for e in doc["traceEvents"]:
        if e.get("cat") in cats and e.get("ph", "X") == "X" and "dur" in e:
            start = _ns(doc, e["ts"])
            out.append((start, start + max(round(e["dur"] * 1000.0), 0), e.get("name", "")))
    return out


def union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(iv):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def length(u: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in u)


def intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_collective(name: str) -> bool:
    """NCCL kernels, and the all-reduce of torch's symmetric memory (``multimem_all_reduce_kernel``,
    which the B200 trace uses instead of NCCL for its all-reduces)."""
    return "nccl" in name.lower() or "all_reduce" in name.lower()


def rank_times(doc: dict[str, Any]) -> dict[str, int]:
    """compute, comm (collective kernels), overlap, busy (kernels + copies) and span ns of a one-GPU trace."""
    kernels = intervals(doc, ("kernel",))
    comm = union([(s, e) for s, e, n in kernels if is_collective(n)])
    comp = union([(s, e) for s, e, n in kernels if not is_collective(n)])
    busy = union([(s, e) for s, e, _ in kernels + intervals(doc, ("gpu_memcpy", "gpu_memset"))])
    return {"compute_ns": length(comp), "comm_ns": length(comm), "overlap_ns": intersection(comm, comp),
            "busy_ns": length(busy), "span_ns": busy[-1][1] - busy[0][0]}


def step_durations(doc: dict[str, Any]) -> dict[int, int]:
    """ProfilerStep#N -> duration ns, from the user_annotation events."""
    out = {}
    for s, e, name in intervals(doc, ("user_annotation",)):
        m = STEP.match(name)
        if m and int(m.group(1)) not in out:
            out[int(m.group(1))] = e - s
    return out


def build_rank_set(fixtures: Path, folder: Path, plan: list[tuple[str, float]], *, copies: int = 1,
                   world_size: int | None = None) -> list[Path]:
    """Rank files ``trace_rank-N.json.gz`` from (fixture, stretch) pairs, rank N = position."""
    folder.mkdir(parents=True, exist_ok=True)
    docs: dict[str, dict[str, Any]] = {}
    paths = []
    for rank, (rel, stretch) in enumerate(plan):
        doc = docs.setdefault(rel, load_trace(fixtures / rel))
        dst = folder / f"trace_rank-{rank}.json.gz"
        tile_trace(doc, dst, TileSpec(rank, world_size or len(plan), copies=copies, stretch=stretch))
        paths.append(dst)
    return paths


def multi_rank_report(files: list[Path], world_size: int | None = None) -> Any:
    """The files read one by one and stacked with a ``rank`` column (what ``import_ranks`` stores)."""
    import pandas as pd

    from perfscope.analysis.ranks.job import rank_identity
    from perfscope.analysis.ranks.stats import format_ranks
    from perfscope.analysis.readers.kineto.reader import read_kineto
    from perfscope.report import Report
    from perfscope.schema import TABLES

    parts = []
    for rank, f in enumerate(files):
        r = read_kineto(f)
        parts.append({n: r.table(n).assign(rank=rank) for n in TABLES})
    tables = {n: pd.concat([p[n] for p in parts], ignore_index=True) for n in TABLES}
    groups = {}
    for f in files:  # the process groups the traces list, each once (as the import's manifest has them)
        for g in rank_identity(f).groups:
            groups.setdefault((g["name"], tuple(g["ranks"])), {**g, "ranks": format_ranks(g["ranks"])})
    return Report.build(tables, {"params": {"ranks": {"world_size": world_size or len(files),
                                                      "groups": list(groups.values())}}})


def collective_waits(docs: dict[int, dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Directly from the JSON of one group's ranks: each rank's wait in its collectives (its kernel
    time above the group's shortest kernel of the same collective, matched by order of name), how
    often it was the last to arrive (the shortest kernel), and the others' wait it caused."""
    seqs = {}
    for rank, doc in docs.items():
        per_name: dict[str, list[int]] = {}
        for s, e, name in sorted(intervals(doc, ("kernel",))):
            if is_collective(name):
                per_name.setdefault(name, []).append(e - s)
        seqs[rank] = per_name
    wait = dict.fromkeys(docs, 0.0)
    caused = dict.fromkeys(docs, 0.0)
    last = dict.fromkeys(docs, 0.0)
    names = set.intersection(*(set(p) for p in seqs.values()))
    for name in names:
        for k in range(min(len(seqs[r][name]) for r in docs)):
            d = {r: seqs[r][name][k] for r in docs}
            low = min(d.values())
            lasts = [r for r, v in d.items() if v - low <= max(2000, 0.02 * low)]
            total = sum(v - low for v in d.values())
            for r, v in d.items():
                wait[r] += v - low
            for r in lasts:
                caused[r] += total / len(lasts)
                last[r] += 1 / len(lasts)
    return {"wait": wait, "caused": caused, "last": last}
