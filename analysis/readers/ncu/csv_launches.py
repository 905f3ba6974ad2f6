"""Nsight Compute CSV (``ncu --csv``) in both shapes, to :class:`~.ncu_metrics.Launch` objects.

- long / details page: one row per (launch, metric or rule), columns ``Section Name``,
  ``Metric Name``, ``Metric Unit``, ``Metric Value`` (+ rule columns). ``Metric Name`` holds a
  real metric name with ``--metrics``, or a section *label* (``Duration``) on the details page,
  mapped back through :data:`LABELS` (FORMATS.md section 3.3);
- wide / ``--page raw``: one row per launch, one column per metric, a units row after the header.

The header is located rather than assumed (program output and ``==PROF==`` lines may come
first), numbers may carry thousands separators (``1,073,741,824``; ``27.595.520`` on
decimal-comma locales), ``n/a`` and empty cells are missing, and units are scaled to base
units (ns, bytes, Hz, per second). Broken rows are skipped with a warning; when nothing usable
remains, an InputFormatError names the first broken line. Host names are never kept.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import InputFormatError
from perfscope.inputs import read_bytes
from perfscope.kernel_names import short_kernel_name

from .metrics import Launch, Value

if TYPE_CHECKING:
    from collections.abc import Iterable

IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context",
            "Stream", "Block Size", "Grid Size", "Device", "CC")
LONG = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
RULES = ("Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup")
NVTX_COLUMN = "Push/Pop_Range"
"""Part of the header of the column ncu --nvtx adds (``thread Domain:Push/Pop_Range:PL_Type:...:Msg``)."""
NVTX_ENTRY = re.compile(r'"([^"]*)"')
NVTX_PAYLOAD_FIELDS = 6
"""Fields after the range name in one entry: PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg."""
NOISE = re.compile(r"^\s*==[A-Z]+==")
METRIC_NAME = re.compile(r"^[a-z0-9]+__[A-Za-z0-9_.]+$")
TRUNCATED = "the CSV file is truncated: "
"""The opening of the warning of a cut file (the report is then marked partial)."""
CSV_HINT = "export with `ncu --import REPORT.ncu-rep --csv --page raw --print-units base > out.csv`"

LABELS: dict[tuple[str, bool], str] = {
    ("Duration", False): "gpu__time_duration.sum",
    ("Compute (SM) Throughput", True): "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ("Memory Throughput", True): "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    ("Memory [%]", True): "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    ("Memory Throughput", False): "dram__bytes.sum.per_second",
    ("DRAM Throughput", True): "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    ("L1/TEX Cache Throughput", True): "l1tex__throughput.avg.pct_of_peak_sustained_active",
    ("L2 Cache Throughput", True): "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    ("Elapsed Cycles", False): "gpc__cycles_elapsed.max",
    ("SM Active Cycles", False): "sm__cycles_active.avg",
    ("SM Frequency", False): "gpc__cycles_elapsed.avg.per_second",
    ("DRAM Frequency", False): "dram__cycles_elapsed.avg.per_second",
    ("Waves Per SM", False): "launch__waves_per_multiprocessor",
    ("Registers Per Thread", False): "launch__registers_per_thread",
    ("Block Size", False): "launch__block_size",
    ("Grid Size", False): "launch__grid_size",
    ("Threads", False): "launch__thread_count",
    ("Static Shared Memory Per Block", False): "launch__shared_mem_per_block_static",
    ("Dynamic Shared Memory Per Block", False): "launch__shared_mem_per_block_dynamic",
    ("Driver Shared Memory Per Block", False): "launch__shared_mem_per_block_driver",
    ("Achieved Occupancy", True): "sm__warps_active.avg.pct_of_peak_sustained_active",
    ("Theoretical Occupancy", True): "sm__maximum_warps_per_active_cycle_pct",
    ("Achieved Active Warps Per SM", False): "sm__warps_active.avg.per_cycle_active",
    ("Theoretical Active Warps per SM", False): "sm__maximum_warps_avg_per_active_cycle",
}
"""(details-page label, unit is %) -> metric name (FORMATS.md section 3.3)."""

TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
           "second": 1e9, "s": 1e9}
PER_TIME = {"second": 1.0, "s": 1.0, "msecond": 1e3, "ms": 1e3, "usecond": 1e6, "us": 1e6,
            "nsecond": 1e9, "ns": 1e9}
PREFIX = {"K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
SCALABLE = ("byte", "hz", "Hz", "inst", "cycle", "warp", "sector", "request", "thread", "block", "flop")

GROUP_COMMA = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
GROUP_DOT = re.compile(r"[+-]?\d{1,3}(\.\d{3})+(,\d+)?")
DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")
DOT_LOCALE = re.compile(r"\d{1,3}(\.\d{3}){2,}|\d{1,3}(\.\d{3})+,\d+")
MISSING = {"", "n/a", "na", "nan", "-", "--", "none"}


# ------------------------------------------------------------------------------ values
def unit_scale(unit: str) -> float:
    """Factor to base units: time -> ns, rates -> per second, K/M/G prefixes removed."""
    unit = (unit or "").strip()
    num, _, den = unit.partition("/")
    scale = TIME_NS.get(num)
    if scale is None:
        scale = PREFIX[num[0]] if len(num) > 1 and num[0] in PREFIX and num[1:] in SCALABLE else 1.0
    return scale * PER_TIME.get(den, 1.0) if den else scale


def parse_number(text: str, *, decimal_comma: bool = False) -> float | str | None:
    """A CSV cell as a float, None when missing, or the text itself when not a number."""
    s = text.strip().replace("\u00a0", "").replace("\u202f", "")
    if s.lower() in MISSING:
        return None
    candidates = []
    if decimal_comma:
        if GROUP_DOT.fullmatch(s) or DECIMAL_COMMA.fullmatch(s):
            candidates.append(s.replace(".", "").replace(",", "."))
    elif GROUP_COMMA.fullmatch(s):
        candidates.append(s.replace(",", ""))
    elif GROUP_DOT.fullmatch(s) and s.count(".") > 1 or DECIMAL_COMMA.fullmatch(s):
        candidates.append(s.replace(".", "").replace(",", "."))
    candidates.append(s)
    for candidate in candidates:
        try:
            return float(candidate)
        except ValueError:
            continue
    return s


def _value(text: str, unit: str, decimal_comma: bool) -> Value | None:
    parsed = parse_number(text, decimal_comma=decimal_comma)
    if isinstance(parsed, float):
        return parsed * unit_scale(unit)
    return parsed


# ------------------------------------------------------------------------------ table
@dataclass
class _Table:
    path: Path
    header: list[str]
    rows: list[tuple[int, list[str]]]
    warnings: list[str] = field(default_factory=list)
    broken: list[int] = field(default_factory=list)
    cut_line: int | None = None
    """The line the file ends in the middle of (no newline after it: a truncated file), dropped."""
    short_launch: str | None = None
    """The last launch when it has fewer metric rows than every other (a file cut between rows)."""

    def col(self, name: str) -> int | None:
        return self.header.index(name) if name in self.header else None

    def cell(self, fields: list[str], name: str) -> str:
        """The stripped value of column ``name`` in a row ("" when absent)."""
        index = self.col(name)
        return fields[index].strip() if index is not None and index < len(fields) else ""


def is_header(line: str) -> bool:
    """Whether ``line`` is an ncu CSV's header: its first field is ``ID`` and it names the kernel (``Kernel
    Name``) or the process (``Process ID``), every field quoted as ncu writes it or only where needed, as a CSV
    writer leaves a file it rewrote (``pandas.DataFrame.to_csv``, a spreadsheet)."""
    if "ID" not in line:
        return False
    try:
        fields = [f.strip() for f in next(csv.reader([line]))]
    except (csv.Error, StopIteration):
        return False
    return bool(fields) and fields[0].lstrip("\ufeff") == "ID" and ("Kernel Name" in fields or "Process ID" in fields)


def looks_like_csv(head: bytes) -> bool:
    """Whether the first bytes of a file are an ncu CSV's: a header line (:func:`is_header`), ncu's own
    ``==PROF==`` lines, or its quoted ``"Kernel Name"`` column (a page without the ``ID`` column, which the
    reader then names in its own error line)."""
    if b"==PROF==" in head or b'"Kernel Name"' in head:
        return True
    return any(is_header(line) for line in head.decode("utf-8-sig", errors="replace").splitlines())


def _read_table(path: Path) -> _Table:
    raw = read_bytes(path)  # decompressed by content, memory budget checked as read
    text = raw.decode("utf-8-sig", errors="replace")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if is_header(line)), None)
    if start is None:
        raise InputFormatError(path, "no Nsight Compute CSV header (a line starting with \"ID\",\"Process ID\")",
                               hint=CSV_HINT)
    kept = [(i + 1, line) for i, line in enumerate(lines) if i > start and line.strip() and not NOISE.match(line)]
    header = next(csv.reader([lines[start]]))
    reader = csv.reader(io.StringIO("\n".join(line for _, line in kept)))
    rows: list[tuple[int, list[str]]] = []
    try:
        for fields in reader:
            rows.append((kept[min(reader.line_num, len(kept)) - 1][0], fields))
    except csv.Error as exc:
        raise InputFormatError(path, f"unreadable CSV near line {kept[min(reader.line_num, len(kept)) - 1][0]} ({exc})",
                               hint=CSV_HINT) from None
    table = _Table(path, header, rows)
    if rows and kept and not raw.endswith((b"\n", b"\r")):
        # ncu ends every line: a last line without its newline was cut (its last value may be too)
        table.cut_line = rows.pop()[0]
    return table


def _fit(table: _Table, fields: list[str], line: int, needed: int) -> list[str] | None:
    """The row padded to the header's width, or None (recorded as broken) when malformed."""
    width = len(table.header)
    if len(fields) > width and any(f.strip() for f in fields[width:]):
        table.broken.append(line)
        return None
    fields = (fields + [""] * width)[:width]
    id_col = table.col("ID")
    if len(fields) < needed or id_col is None or not fields[id_col].strip().isdigit():
        table.broken.append(line)
        return None
    return fields


def _decimal_comma(values: Iterable[str]) -> bool:
    return any(DOT_LOCALE.fullmatch(v.strip()) for v in values)


def _launch(table: _Table, fields: list[str]) -> Launch:
    def get(name: str) -> str | None:
        return table.cell(fields, name) or None

    name = get("Kernel Name") or "(unnamed kernel)"
    nvtx_col = next((h for h in table.header if NVTX_COLUMN in h), None)
    return Launch(id=int(get("ID") or 0), name=name, short_name=short_kernel_name(name),
                  grid=_dims_text(get("Grid Size")), block=_dims_text(get("Block Size")),
                  device=get("Device"), cc=get("CC"), nvtx=nvtx_ranges(get(nvtx_col) if nvtx_col else None))


def nvtx_ranges(cell: str | None) -> list[str]:
    """Range names of an ncu CSV NVTX cell, outermost first.

    A cell reads ``12345  "<default domain>:prefill:none:none:none:none:none:none" "<default
    domain>:layer.0:none:..."``: the thread id, then one quoted ``domain:name:payload`` entry per
    open range. A named domain's ranges are shown ``domain:name`` (as the nsys reader does); the
    default domain's stack is taken when several domains have ranges.
    """
    stacks: dict[str, list[str]] = {}
    for entry in NVTX_ENTRY.findall(cell or ""):
        head = entry.rsplit(":", NVTX_PAYLOAD_FIELDS)[0] if entry.count(":") > NVTX_PAYLOAD_FIELDS else entry
        if head.startswith("<"):
            domain, _, message = head.partition(">:")
            stacks.setdefault("", []).append(message)
        else:
            domain, _, message = head.partition(":")
            stacks.setdefault(domain, []).append(f"{domain}:{message}" if domain else message)
    if not stacks:
        return []
    return stacks.get("", next(iter(stacks.values())))


def _dims_text(text: str | None) -> str | None:
    numbers = re.findall(r"\d+", text or "")
    return f"({', '.join(numbers)})" if len(numbers) == 3 else None


# ------------------------------------------------------------------------------ shapes
def _long(table: _Table) -> list[Launch]:
    needed = max(table.header.index(c) for c in (*LONG, "ID") if c in table.header) + 1
    comma = _decimal_comma(table.cell(f, "Metric Value") for _, f in table.rows)
    launches: dict[tuple[str, str], Launch] = {}
    rows_of: dict[tuple[str, str], int] = {}
    for line, raw in table.rows:
        fields = _fit(table, raw, line, needed)
        if fields is None:
            continue
        key = (table.cell(fields, "Process ID"), table.cell(fields, "ID"))
        launch = launches.setdefault(key, _launch(table, fields))
        label, unit = table.cell(fields, "Metric Name"), table.cell(fields, "Metric Unit")
        if not label:
            continue  # a rule row: guidance text, no metric
        rows_of[key] = rows_of.get(key, 0) + 1
        metric = label if METRIC_NAME.match(label) else LABELS.get((label, unit == "%"))
        value = _value(table.cell(fields, "Metric Value"), unit, comma)
        if metric and value is not None:
            launch.metrics.setdefault(metric, value)
    counts = list(rows_of.values())
    if len(counts) > 1 and counts[-1] < min(counts[:-1]):  # every launch has the same rows; the last lost some
        last = next(reversed(rows_of))
        table.short_launch = f"the last launch, ID {last[1]}, has {counts[-1]} of {min(counts[:-1])} metric rows"
    return list(launches.values())


def _wide(table: _Table) -> list[Launch]:
    rows = list(table.rows)
    units = [""] * len(table.header)
    id_col = table.col("ID")
    if rows and id_col is not None and len(rows[0][1]) > id_col and not rows[0][1][id_col].strip():
        units = (rows.pop(0)[1] + units)[: len(table.header)]
    metric_cols = [i for i, h in enumerate(table.header) if h not in IDENTITY and NVTX_COLUMN not in h]
    comma = _decimal_comma(f[i] for _, f in rows for i in metric_cols if i < len(f))
    launches = []
    for line, raw in rows:
        fields = _fit(table, raw, line, len(table.header))
        if fields is None:
            continue
        launch = _launch(table, fields)
        for i in metric_cols:
            value = _value(fields[i], units[i], comma)
            if value is not None:
                launch.metrics[table.header[i]] = value
        launches.append(launch)
    return launches


def read_csv_launches(path: str | Path) -> tuple[list[Launch], list[str], str]:
    """Parse an ncu CSV file.

    Returns:
        The launches, warnings (broken rows), and the shape (``long`` or ``wide``).

    Raises:
        InputFormatError: no header, or no usable row (naming the first broken line).
    """
    table = _read_table(Path(path))
    shape = "long" if all(c in table.header for c in ("Metric Name", "Metric Value")) else "wide"
    launches = _long(table) if shape == "long" else _wide(table)
    warnings = []
    if table.cut_line is not None or table.short_launch:
        what = "; ".join(filter(None, (f"it ends in the middle of line {table.cut_line}, dropped"
                                       if table.cut_line is not None else None, table.short_launch)))
        warnings.append(f"{TRUNCATED}{what}: the report holds what was read and is marked partial")
    if table.broken:
        lines = ", ".join(map(str, table.broken[:5])) + (" ..." if len(table.broken) > 5 else "")
        warnings.append(f"{len(table.broken)} malformed CSV row(s) skipped (line {lines}); "
                        "the report holds the rest")
    if not launches:
        where = f"line {table.broken[0]} is malformed" if table.broken else "no data rows after the header"
        raise InputFormatError(path, f"no usable Nsight Compute results ({where})", hint=CSV_HINT)
    return launches, warnings, shape
