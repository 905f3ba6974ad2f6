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

from .stats import RankTables, one_rank, rank_summary

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


__all__ = ["load_ranks", "rank_summary_at", "rank_tables_at"]
