"""The Report: one immutable object, read by every output, stored as a ``NAME.perfscope/`` folder.

Folder layout (see DESIGN.md)::

    NAME.perfscope/
      manifest.json        schema_version, source, device and roofs, params, warnings, ...
      kernels.parquet      one row per kernel execution (or CPU operator)
      ranges.parquet       NVTX / record_function ranges
      transfers.parquet    memcpy / memset
      api.parquet          CUDA runtime / driver calls
      counters.parquet     NVML samples
      requests.parquet     engine requests (TTFT, TPOT, ...)
      steps.parquet        engine steps (prefill / decode) of the profiled run
      requests_unprofiled.parquet, steps_unprofiled.parquet
                           the same workload run warm without the profiler (headline metrics)
      request_steps.parquet
                           a load test's requests joined to the steps they took part in
      idle.parquet         the device's idle slices, each with its cause (analysis/idle.py)
      host.parquet         the host's own activity behind them: CPU operators, Python functions, OS waits
      memory.parquet       allocations and frees over time (docs/memory.md)
      gauges.parquet       a load test's server gauges scraped from /metrics
      gemm_curve.parquet   GEMM time against rows, measured on the device (engine profiles)
      raw/                 the raw capture it was built from, when kept
      report.html          the standalone HTML report, when rendered

A table may also be a folder of Parquet files (a dataset partitioned by ``rank``).
Writing is atomic: everything goes to a temporary folder next to the target, which is then
renamed into place, so an existing report is never half-overwritten.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import shutil
import uuid
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ._version import __version__
from .device import DeviceSpec
from .errors import OutputExistsError, OutputWriteError, ReportFormatError, UsageError
from .format import dumps
from .schema import SCHEMA_VERSION, TABLES, conform, empty_table

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    import plotly.graph_objects as go

MANIFEST = "manifest.json"
REPORT_SUFFIX = ".perfscope"


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def default_manifest() -> dict[str, Any]:
    """The manifest keys every report carries, with neutral defaults."""
    return {
        "schema_version": SCHEMA_VERSION,
        "perfscope_version": __version__,
        "created": _now_iso(),
        "name": None,
        "source": source_info(None),
        "command": None,
        "device": None,
        "params": {},
        "warnings": [],
        "unavailable_metrics": [],
        "partial": False,
        "tables": {},
    }


@dataclass(frozen=True)
class Report:
    """A profile, analysed: the tables of DESIGN.md plus a manifest.

    Treat it as read-only: every step that changes something returns a new Report
    (:meth:`replace`). Build one with :meth:`build`, persist it with :meth:`save`, and
    read one with :meth:`load` or ``perfscope.load``.
    """

    manifest: Mapping[str, Any]
    kernels: pd.DataFrame
    ranges: pd.DataFrame = field(default_factory=lambda: empty_table("ranges"))
    transfers: pd.DataFrame = field(default_factory=lambda: empty_table("transfers"))
    api: pd.DataFrame = field(default_factory=lambda: empty_table("api"))
    counters: pd.DataFrame = field(default_factory=lambda: empty_table("counters"))
    requests: pd.DataFrame = field(default_factory=lambda: empty_table("requests"))
    steps: pd.DataFrame = field(default_factory=lambda: empty_table("steps"))
    requests_unprofiled: pd.DataFrame = field(default_factory=lambda: empty_table("requests_unprofiled"))
    steps_unprofiled: pd.DataFrame = field(default_factory=lambda: empty_table("steps_unprofiled"))
    request_steps: pd.DataFrame = field(default_factory=lambda: empty_table("request_steps"))
    idle: pd.DataFrame = field(default_factory=lambda: empty_table("idle"))
    host: pd.DataFrame = field(default_factory=lambda: empty_table("host"))
    memory: pd.DataFrame = field(default_factory=lambda: empty_table("memory"))
    gauges: pd.DataFrame = field(default_factory=lambda: empty_table("gauges"))
    gemm_curve: pd.DataFrame = field(default_factory=lambda: empty_table("gemm_curve"))
    path: Path | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def build(
        cls,
        tables: Mapping[str, pd.DataFrame],
        manifest: Mapping[str, Any] | None = None,
        *,
        source: str = "<memory>",
    ) -> Report:
        """Make a Report from tables (missing ones become empty) and manifest keys.

        Every table is checked with :func:`perfscope.schema.conform`; unknown table names
        are rejected so a typo cannot silently drop data.
        """
        cls._check_names(tables)
        return cls.assemble({name: conform(df, name, source=source) for name, df in tables.items()}, manifest)

    @classmethod
    def assemble(cls, conformed: Mapping[str, pd.DataFrame], manifest: Mapping[str, Any] | None = None) -> Report:
        """A Report from tables already conformed to their contracts (the import pipeline's
        finishing step, :func:`perfscope.analysis.readers.finish.finish`, conforms each once); missing
        tables become empty and the manifest gets the defaults and the table sizes."""
        cls._check_names(conformed)
        merged = default_manifest()
        for key, value in (manifest or {}).items():
            merged[key] = value
        tables = {name: conformed[name] if name in conformed else empty_table(name) for name in TABLES}
        merged["tables"] = {name: len(df) for name, df in tables.items()}
        return cls(manifest=merged, **tables)

    @staticmethod
    def _check_names(tables: Mapping[str, pd.DataFrame]) -> None:
        unknown = set(tables) - set(TABLES)
        if unknown:
            raise ValueError(f"unknown table(s): {sorted(unknown)}")

    def replace(self, **changes: Any) -> Report:
        """A new Report with some fields replaced (tables are re-checked)."""
        for name in TABLES:
            if name in changes:
                changes[name] = conform(changes[name], name, source="<replace>")
        new = dataclasses.replace(self, **changes)
        manifest = dict(new.manifest)
        manifest["tables"] = {name: len(getattr(new, name)) for name in TABLES}
        return dataclasses.replace(new, manifest=manifest)

    def with_manifest(self, **keys: Any) -> Report:
        """A new Report whose manifest has ``keys`` set."""
        return dataclasses.replace(self, manifest={**self.manifest, **keys})

    # ---------------------------------------------------------------- accessors
    @property
    def name(self) -> str:
        """Display name: the manifest's name, or the folder name."""
        if self.manifest.get("name"):
            return str(self.manifest["name"])
        if self.path is not None:
            return self.path.name.removesuffix(REPORT_SUFFIX)
        return "report"

    @property
    def device(self) -> DeviceSpec | None:
        """The device and its roofs, when known."""
        d = self.manifest.get("device")
        return DeviceSpec.from_dict(d) if d else None

    @property
    def warnings(self) -> list[str]:
        return list(self.manifest.get("warnings") or [])

    @property
    def unavailable_metrics(self) -> list[str]:
        return list(self.manifest.get("unavailable_metrics") or [])

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.manifest.get("params") or {})

    def table(self, name: str) -> pd.DataFrame:
        """One table by name (``kernels``, ``ranges``, ...)."""
        if name not in TABLES:
            raise KeyError(name)
        df: pd.DataFrame = getattr(self, name)
        return df

    # ---------------------------------------------------------------- persistence
    def save(
        self,
        path: str | os.PathLike[str],
        *,
        force: bool = False,
        extra_files: Mapping[str, bytes | str | Path] | None = None,
    ) -> Path:
        """Write the report folder atomically and return its path.

        Args:
            path: target folder, conventionally ``NAME.perfscope``.
            force: replace an existing report at ``path`` (only a perfscope report folder
                is ever replaced; any other existing path is refused).
            extra_files: more files to place in the folder, by relative name: bytes or
                text content, or a path to copy (``raw/trace.json.gz``, ``report.html``).

        Raises:
            OutputExistsError: ``path`` exists and ``force`` is false.
            UsageError: ``path`` exists and is not a perfscope report.
        """
        target = Path(path)
        try:
            check_replaceable(target, force)
        except OSError as exc:  # a name too long, a parent that cannot be read
            raise OutputWriteError(target, exc) from exc
        with writing(target) as tmp:
            tmp.mkdir()
            self._write_into(tmp, extra_files or {})
            move_into_place(tmp, target)
        return target

    def _write_into(self, folder: Path, extra_files: Mapping[str, bytes | str | Path]) -> None:
        for name in TABLES:
            df = getattr(self, name)
            if "rank" in df.columns and df["rank"].nunique(dropna=True) > 1:
                df.to_parquet(folder / name, partition_cols=["rank"], index=False)
            else:
                write_parquet(df, folder / f"{name}.parquet")
        manifest = dict(self.manifest)
        manifest["tables"] = {name: len(getattr(self, name)) for name in TABLES}
        if isinstance(manifest.get("device"), dict):  # a roof is never written as null: an invalid one is left out
            device = manifest["device"]
            checked = DeviceSpec.from_dict(device).to_dict()
            held = sum(len(device.get(g) or {}) for g in ("compute", "memory"))
            if held != sum(len(checked[g]) for g in ("compute", "memory")):
                manifest["device"] = {**device, "compute": checked["compute"], "memory": checked["memory"]}
                manifest["warnings"] = [*(manifest.get("warnings") or []),
                                        "roofs that were not finite numbers left out of the saved report"]
        write_manifest(folder, manifest)
        write_extra_files(folder, extra_files)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """Read and validate a report folder.

        Raises:
            ReportFormatError: the folder is missing, is not a report, was written by a newer
                major version, or has a missing or damaged table (the message names the file).
        """
        folder = Path(path)
        if not folder.exists():
            raise ReportFormatError(
                folder,
                "no such report",
                hint="give a NAME.perfscope folder written by `perfscope profile` or `perfscope import`",
            )
        if not folder.is_dir():
            raise ReportFormatError(
                folder,
                "is a file, not a report folder",
                hint="turn a profiler output into a report with `perfscope import FILE`",
            )
        manifest = _read_manifest(folder)
        tables = {name: _read_table(folder, name) for name in TABLES}
        return cls(manifest=manifest, path=folder, **tables)

    # ---------------------------------------------------------------- notebook conveniences
    def roofline(self, **options: Any) -> go.Figure:
        """The roofline plot (plotly Figure); options as in ``perfscope.dashboard.figures.roofline``."""
        from perfscope.dashboard import figures

        return figures.roofline(self, **options)

    def timeline(self, **options: Any) -> go.Figure:
        """The timeline plot (plotly Figure)."""
        from perfscope.dashboard import figures

        return figures.timeline(self, **options)

    def hierarchy(self, *, phase: str | None = None, collapse: bool = True) -> pd.DataFrame:
        """Where the time goes: the module -> op -> kernel tree's nodes (see
        ``perfscope.analysis.summaries.hierarchy``), for ``phase`` or all kernels; ``collapse=False`` lists
        every instance of repeated layers."""
        from perfscope.analysis.summaries.hierarchy import hierarchy

        return hierarchy(self, phase=phase, collapse=collapse).nodes.copy()

    def hierarchy_figure(self, *, phase: str | None = None, depth: int | None = None) -> go.Figure:
        """The tree as a plotly icicle (width: kernel time; colour: bound)."""
        from perfscope.dashboard.figures.tree import tree_figure

        return tree_figure(self, phase=phase, depth=depth)

    def whatif(self, **question: Any) -> Report | list[Report]:
        """This run projected onto another GPU, batch, prompt, context or dtype (``gpu="B200"``,
        ``batch=8``; a list of values sweeps: one Report per question). See docs/whatif.md."""
        from perfscope.analysis.projection.project import whatif

        out = whatif(self, **question)
        lists = any(isinstance(v, (list, tuple)) for v in question.values())
        return out if lists else out[0]

    def to_html(self, path: str | os.PathLike[str], **options: Any) -> Path:
        """Write the standalone, offline HTML report to ``path``."""
        from perfscope.dashboard.html_report import write_html

        return write_html(self, Path(path), **options)

    def summary(self) -> str:
        """The terminal summary as text."""
        from perfscope.text_report import render_text

        return render_text(self)


def check_replaceable(target: Path, force: bool) -> None:
    """Refuse to write ``target`` when it exists without ``force``, or is not a perfscope report.

    Raises:
        OutputExistsError: ``target`` exists and ``force`` is false.
        UsageError: ``target`` exists and is not a report folder (never replaced, even with force).
    """
    if not target.exists():
        return
    if not force:
        raise OutputExistsError(target)
    if not (target.is_dir() and (target / MANIFEST).is_file()):
        raise UsageError(f"{target} exists and is not a perfscope report; refusing to replace it",
                         hint="choose another --out")


def move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished folder ``tmp`` to ``target``, swapping out an existing report whole
    (put back if the second rename fails)."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


@contextmanager
def writing(target: Path) -> Iterator[Path]:
    """The one way an output is written: yields a temporary sibling path of ``target`` (not created)
    for the caller to fill and rename into place. On any failure the temporary file or folder and
    the parent folders made for it are removed; an ``OSError`` (permissions, a parent that is a
    file, a full disk, a failed rename) about the output becomes one :class:`OutputWriteError`
    naming ``target``."""
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
    except BaseException as exc:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)
        for folder in made:  # innermost first; only the empty ones we made
            with suppress(OSError):
                folder.rmdir()
        if isinstance(exc, OSError) and _is_output_error(exc, target, tmp):
            raise OutputWriteError(target, exc) from exc
        raise


def _is_output_error(exc: OSError, target: Path, tmp: Path) -> bool:
    """The OSError is about the output (no file named, as for a full disk; the target, its temporary
    sibling or what is inside them; a parent folder), not about an input copied into it (an extra
    file that is missing)."""
    if not exc.filename:
        return True
    name = os.path.abspath(os.fsdecode(exc.filename))
    ours = [os.path.abspath(p) for p in (target, tmp)]
    return any(name == p or name.startswith(p + os.sep) or p.startswith(name + os.sep) for p in ours)


def write_manifest(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` into a report folder (strict JSON: NaN and inf become null)."""
    (folder / MANIFEST).write_text(dumps(manifest), encoding="utf-8")


def write_extra_files(folder: Path, extra_files: Mapping[str, bytes | str | Path]) -> None:
    """Place more files in a report folder by relative name: bytes, text, or a path to copy.

    Raises:
        ValueError: a name would land outside ``folder`` (``../x``, an absolute path).
    """
    root = folder.resolve()
    for rel, content in extra_files.items():
        dest = folder / rel
        if dest.resolve().parent != root and root not in dest.resolve().parents:
            raise ValueError(f"extra file {rel!r} would land outside the report")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, dest)
        elif isinstance(content, bytes):
            dest.write_bytes(content)
        else:
            dest.write_text(content, encoding="utf-8")


def source_info(kind: str | None, path: str | os.PathLike[str] | None = None, tool: str | None = None,
                tool_version: str | None = None, **extra: Any) -> dict[str, Any]:
    """The manifest's ``source`` record: what kind of capture, which file, which tool and version."""
    return {"kind": kind, "path": None if path is None else str(path), "tool": tool,
            "tool_version": tool_version, **extra}


def read_manifest(folder: Path) -> dict[str, Any]:
    """A report folder's manifest, checked: present, readable, and of a schema major this version reads.

    Raises:
        ReportFormatError: the manifest is missing, damaged, or of another schema major version.
    """
    return _read_manifest(folder)


def _read_manifest(folder: Path) -> dict[str, Any]:
    mf = folder / MANIFEST
    if not mf.is_file():
        raise ReportFormatError(
            folder,
            "not a perfscope report (no manifest.json)",
            hint="profiler outputs are read with `perfscope import FILE`; reports are NAME.perfscope folders",
        )
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportFormatError(mf, f"unreadable manifest ({exc})", hint="re-create the report") from None
    if not isinstance(manifest, dict) or "schema_version" not in manifest:
        raise ReportFormatError(mf, "manifest has no schema_version", hint="re-create the report")
    major = str(manifest["schema_version"]).split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise ReportFormatError(
            mf,
            f"schema_version {manifest['schema_version']} is not readable by perfscope "
            f"{__version__} (reads {SCHEMA_VERSION.split('.')[0]}.x)",
            hint="upgrade perfscope, or re-create the report",
        )
    merged = default_manifest()
    merged.update(manifest)
    return merged


def _read_table(folder: Path, name: str) -> pd.DataFrame:
    file, dataset = folder / f"{name}.parquet", folder / name
    source = file if file.exists() else dataset
    if not source.exists():
        if name == "kernels":
            raise ReportFormatError(folder, "kernels.parquet is missing", hint="re-create the report")
        return empty_table(name)
    try:
        df = pd.read_parquet(source)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for damaged files
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReportFormatError(source, f"damaged table ({first})", hint="re-create the report") from None
    if "rank" in df.columns and isinstance(df["rank"].dtype, pd.CategoricalDtype):
        df["rank"] = df["rank"].astype("int64")
    out = conform(df, name, source=str(source))
    if name in ("requests", "requests_unprofiled") and len(out):
        # endpoint reports before schema 1.2's missing counts wrote -1 for a prompt nobody counted
        out["prompt_tokens"] = out["prompt_tokens"].mask(out["prompt_tokens"] < 0)
    return out


ROW_GROUP = 1 << 18
"""Rows a large table is written in at a time (:func:`write_parquet`)."""


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """``df`` as a Parquet file, a large one :data:`ROW_GROUP` rows at a time: Arrow holds the text of
    one slice, never of a five-million-row table at once (a memory snapshot's stacks are gigabytes as
    Arrow strings). The file reads back the same either way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if len(df) <= ROW_GROUP:
        df.to_parquet(path, index=False)
        return
    schema = pa.Schema.from_pandas(df.iloc[:ROW_GROUP], preserve_index=False)
    for i, name in enumerate(df.columns):
        if df[name].dtype == object:  # text (or nothing) in every slice: the first slice cannot tell
            kind = pd.api.types.infer_dtype(df[name], skipna=True)
            if kind not in ("string", "empty"):
                df.to_parquet(path, index=False)  # values of other kinds: as one table
                return
            schema = schema.set(i, pa.field(name, pa.string() if kind == "string" else pa.null()))
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, len(df), ROW_GROUP):
            writer.write_table(pa.Table.from_pandas(df.iloc[start:start + ROW_GROUP], schema=schema,
                                                    preserve_index=False))
