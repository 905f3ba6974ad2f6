"""Read a multi-rank report partially: some ranks, some columns, one rank at a time.

A multi-rank report stores each table as a Parquet dataset partitioned by rank
(``kernels/rank=N/part-0.parquet``), so a reader opens only the files of the ranks it asks for and
decodes only the columns it asks for (pyarrow dataset filters and projection).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from perfscope.errors import ReportFormatError, UsageError
from perfscope.report import Report, read_manifest

from .stats import (
    RankTables,
    _records,
    category_matrix,
    coverage,
    format_ranks,
    job_overview,
    kernel_spread,
    one_rank,
    rank_summary,
    rank_tables,
    step_spread,
    stragglers,
)
from .straggler import Stragglers, analyse, empty_stragglers

if TYPE_CHECKING:
    from collections.abc import Sequence


def _dataset(folder: Path, table: str) -> Any:
    import pyarrow.dataset as ds

    part, single = folder / table, folder / f"{table}.parquet"
    try:
        if part.is_dir():
            return ds.dataset(part, format="parquet", partitioning="hive")
        if single.is_file():
            return ds.dataset(single, format="parquet")
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for damaged files
        raise ReportFormatError(part if part.exists() else single, f"damaged table ({str(exc).splitlines()[0]})",
                                hint="re-create the report") from None
    return None


def load_ranks(path: str | Path, table: str = "kernels", *, ranks: Sequence[int] | None = None,
               columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Read some ranks and columns of one table of a report folder, without loading the rest.

    Uses the Parquet dataset's rank partitions, so only the files of the asked ranks are opened
    and only the asked columns are decoded.

    Args:
        path: the ``NAME.perfscope`` folder.
        table: ``kernels``, ``ranges``, ``transfers``, ...
        ranks: ranks to read (default: all).
        columns: columns to read (default: all); ``rank`` is always added.

    Raises:
        UsageError: ``ranks`` is given but the table has no ``rank`` column.
        ReportFormatError: the table is damaged.
    """
    folder = Path(path)
    dset = _dataset(folder, table)
    if dset is None:
        return pd.DataFrame(columns=[*(columns or []), "rank"])
    names = dset.schema.names
    if ranks is not None and "rank" not in names:
        raise UsageError(f"{folder}: table {table} has no rank column", hint="load it whole with perfscope.load")
    import pyarrow.dataset as ds

    wanted = None if columns is None else list(dict.fromkeys([*columns, "rank"]))
    wanted = None if wanted is None else [c for c in wanted if c in names]
    filt = None if ranks is None else ds.field("rank").isin([int(r) for r in ranks])
    df = dset.to_table(columns=wanted, filter=filt).to_pandas()
    if "rank" in df.columns:
        df["rank"] = df["rank"].astype("int64")
    return df


def rank_tables_at(path: str | Path, ranks: Sequence[int]) -> RankTables:
    """:func:`rank_tables` for a report folder, reading one rank and only the needed columns at a time."""
    need = {
        "kernels": ["name", "short_name", "device", "start_ns", "end_ns", "duration_ns", "category"],
        "transfers": ["device", "start_ns", "end_ns"],
        "ranges": ["name", "start_ns", "end_ns"],
        "steps": ["step", "phase", "start_ns", "end_ns"],
    }
    parts = []
    for r in ranks:
        tables = {name: _with_columns(load_ranks(path, name, ranks=[r], columns=cols), cols)
                  for name, cols in need.items()}
        parts.append(one_rank(r, tables))
    return RankTables.concat(parts)


def rank_summary_at(path: str | Path) -> dict[str, Any]:
    """:func:`rank_summary` of a report folder without loading it whole (one rank at a time)."""
    folder = Path(path)
    manifest = read_manifest(folder)
    covered = ((manifest.get("params") or {}).get("ranks") or {}).get("ranks")
    if not covered:
        kernels = load_ranks(folder, "kernels", columns=[])
        covered = sorted(int(r) for r in kernels["rank"].unique()) if "rank" in kernels else [0]
    light = Report.build({}, {k: v for k, v in manifest.items() if k != "tables"})
    return rank_summary(light, tables=rank_tables_at(folder, covered))


def _with_columns(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    for c in cols:
        if c not in df.columns:
            df[c] = pd.Series([None] * len(df), dtype="object", index=df.index)
    return df




# ---------------------------------------------------------------------------- stored rank views
VIEWS = "ranks"
"""The folder of a multi-rank report that holds its per-rank analysis (written by the import)."""
VIEW_TABLES = ("per_rank", "steps", "categories", "kernels", "idle", "waits", "groups")


def write_views(folder: str | Path, t: RankTables, s: Stragglers) -> None:
    """Store a job's per-rank tables and straggler analysis in ``folder/ranks/`` (Parquet): the
    steps carry each rank's wait in collectives and the wait it caused per step."""
    out = Path(folder) / VIEWS
    out.mkdir(parents=True, exist_ok=True)
    steps = t.steps
    if len(steps):
        waits = s.steps if len(s.steps) else pd.DataFrame(columns=["rank", "step", "wait_ns", "caused_ns"])
        steps = steps.merge(waits, on=["rank", "step"], how="left")
    frames = {"per_rank": t.per_rank, "steps": steps, "categories": t.categories, "kernels": t.kernels,
              "idle": t.idle, "waits": s.ranks, "groups": s.groups}
    for name, df in frames.items():
        plain_frame(df).to_parquet(out / f"{name}.parquet", index=False)


def plain_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with object columns of mixed None/str as strings (Parquet needs one type per column)."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            vals = out[c].dropna()
            if len(vals) and not all(isinstance(v, (str, bool)) for v in vals.tolist()):
                out[c] = out[c].map(lambda v: v if v is None else str(v))
    return out


def read_views(folder: str | Path | None) -> tuple[RankTables, Stragglers] | None:
    """The stored rank views of a report folder (:func:`write_views`), or None when it has none."""
    if folder is None:
        return None
    base = Path(folder) / VIEWS
    if not (base / "per_rank.parquet").is_file():
        return None
    try:
        frames = {name: pd.read_parquet(base / f"{name}.parquet") for name in VIEW_TABLES
                  if (base / f"{name}.parquet").is_file()}
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for damaged files
        raise ReportFormatError(base, f"damaged rank views ({str(exc).splitlines()[0]})",
                                hint="re-import the job with perfscope import --ranks") from None
    steps = frames.get("steps", pd.DataFrame())
    step_waits = (steps[["rank", "step", "wait_ns", "caused_ns"]].dropna(subset=["wait_ns"])
                  if "wait_ns" in steps else pd.DataFrame(columns=["rank", "step", "wait_ns", "caused_ns"]))
    t = RankTables(frames["per_rank"], steps,
                   frames.get("categories", pd.DataFrame()), frames.get("kernels", pd.DataFrame()),
                   pd.DataFrame(columns=["rank", "group", "process_group", "name", "seq", "step", "start_ns", "end_ns",
                                         "duration_ns"]),
                   frames.get("idle", pd.DataFrame()))
    waits = frames.get("waits")
    groups = frames.get("groups")
    if waits is None or groups is None:
        return t, empty_stragglers()
    return t, Stragglers(waits, groups, step_waits.reset_index(drop=True))




# ---------------------------------------------------------------------------- the job's summary
def _per_rank_with_waits(t: RankTables, s: Stragglers) -> pd.DataFrame:
    """The per-rank table with each rank's collective time split into transfer and wait, how often it
    arrived last and the wait it caused (summed over the groups it meets; NaN where nothing matched)."""
    pr = t.per_rank
    if not len(s.ranks) or not len(pr):
        return pr.assign(comm_transfer_ns=float("nan"), comm_wait_ns=float("nan"), caused_wait_ns=float("nan"),
                         last_share=float("nan"), straggler=False)
    w = s.ranks.groupby("rank").agg(comm_transfer_ns=("comm_transfer_ns", "sum"), comm_wait_ns=("comm_wait_ns", "sum"),
                                    caused_wait_ns=("caused_wait_ns", "sum"), last_share=("last_share", "max"),
                                    straggler=("straggler", "any")).reset_index()
    out = pr.merge(w, on="rank", how="left")
    out["straggler"] = out["straggler"].fillna(False).astype(bool)
    return out


def roles_of(per_rank: pd.DataFrame) -> dict[str, str]:
    """role (prefill, decode, mixed) -> the ranks with it, where the traces' steps say."""
    if "role" not in per_rank or not len(per_rank):
        return {}
    known = per_rank[per_rank["role"].notna()]
    return {str(role): format_ranks(g["rank"]) for role, g in known.groupby("role", sort=True)}


def job_summary(t: RankTables, s: Stragglers, *, top: int = 10) -> dict[str, Any]:
    """The job-level views, JSON-ready: job (mean shares, worst ranks), per_rank (with the collective
    time split into transfer and wait), stragglers (step-time outliers), straggler (who the others
    wait for, or why there is none), roles, groups, steps (spread per step), categories, kernels
    (the ``top`` kernels whose time differs most across ranks)."""
    pr = _per_rank_with_waits(t, s)
    ranks = t.ranks
    return {
        "job": job_overview(pr) if len(pr) else {},
        "per_rank": _records(pr),
        "stragglers": _records(stragglers(pr)),
        "straggler": s.to_dict(),
        "roles": roles_of(pr),
        "groups": _records(s.groups),
        "steps": _records(step_spread(t.steps)),
        "categories": _records(category_matrix(t.categories).reset_index()),
        "kernels": _records(kernel_spread(t.kernels, ranks, top)),
    }


def report_views(report: Report) -> tuple[RankTables, Stragglers]:
    """The rank views of a report: stored by the import, else computed from its tables."""
    stored = read_views(report.path) if report.path is not None else None
    if stored is not None:
        return stored
    t = rank_tables(report)
    return t, analyse(t)


def rank_summary_of(report: Report, *, top: int = 10) -> dict[str, Any]:
    """``perfscope analyze``'s ``ranks`` key: :func:`job_summary` of the report's views, with the
    ranks it covers (coverage: ranks, world size, missing ranks, skipped files)."""
    t, s = report_views(report)
    return {"coverage": coverage(report, t.ranks), **job_summary(t, s, top=top)}



# ---------------------------------------------------------------------------- one rank's step
STEP_METRICS = {
    "caused": ("the wait it causes, per other rank of its group", "waited_for_ns"),
    "wait": ("its own wait in collectives", "wait_ns"),
    "duration": ("step time", "duration_ns"),
    "compute": ("compute kernels", "compute_ns"),
    "idle": ("device idle", "idle_ns"),
}
"""The rank x step views: label and column of :func:`rank_steps`."""


def rank_steps(t: RankTables, s: Stragglers) -> pd.DataFrame:
    """One row per rank and step: its window, compute, collectives and idle, its wait in collectives
    (``wait_ns``) and the wait it caused each other rank of its group (``waited_for_ns``: the wait
    caused divided by the group's other ranks)."""
    steps = t.steps
    if not len(steps):
        return steps
    if "wait_ns" not in steps:
        waits = s.steps if len(s.steps) else pd.DataFrame(columns=["rank", "step", "wait_ns", "caused_ns"])
        steps = steps.merge(waits, on=["rank", "step"], how="left")
    others = {}
    if len(s.ranks) and len(s.groups):
        present = s.groups.set_index("gkey")["present"]
        for r, g in s.ranks.groupby("rank"):
            others[int(r)] = max(int(present.get(k, 2)) - 1 for k in g["gkey"])
    div = steps["rank"].map(lambda r: others.get(int(r), float("nan"))).astype("float64")
    return steps.assign(waited_for_ns=steps["caused_ns"].astype("float64") / div)


def one_rank_report(report: Report, rank: int) -> Report:
    """``rank``'s part of a multi-rank report as a report of its own (its tables, the job's manifest):
    read from its rank partitions when the report is a folder, else sliced from the loaded tables."""
    from perfscope.schema import TABLES

    if "rank" not in report.kernels.columns:
        return report
    tables = {}
    for name in TABLES:
        df = report.table(name)
        if "rank" in df.columns:
            tables[name] = df[(df["rank"] == rank).to_numpy(bool)].drop(columns="rank").reset_index(drop=True)
        else:
            tables[name] = df
    return Report.build(tables, {**report.manifest, "name": f"{report.name} rank {rank}"})


__all__ = ["STEP_METRICS", "VIEWS", "job_summary", "load_ranks", "one_rank_report", "rank_steps", "rank_summary_at",
           "rank_summary_of", "rank_tables_at", "read_views", "report_views", "roles_of", "write_views"]
