"""Detect a profiler output's format from its content and turn it into a Report.

Each format has a reader module exposing ``read(path, *, device=None) -> Report`` that returns
a fully analysed report (costs attributed, roofline classified). Detection looks at the
bytes, not only at the extension, so a renamed file still imports and a wrong file gets a
clear message instead of a parser traceback.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from perfscope.errors import InputFormatError, PerfscopeError, UsageError
from perfscope.inputs import DAMAGED, damaged, head_bytes, is_compressed, regular_file
from perfscope.limits import counting
from perfscope.outpaths import single_report
from perfscope.report import MANIFEST, Report

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

SNIFF_BYTES = 1 << 16
IN_PLACE = ((b"SQLite format 3\x00", "SQLite"), (b"PAR1", "Parquet"), (b"NVR\x00", "Nsight Compute report"))
"""Formats read in place (random access), which a compressed copy of cannot be: one line says to decompress it."""

READERS: dict[str, str] = {
    "kineto": "perfscope.analysis.readers.kineto.reader",
    "nsys-sqlite": "perfscope.analysis.readers.nsys.reader",
    "nsys-rep": "perfscope.analysis.readers.nsys.reader",
    "ncu-rep": "perfscope.analysis.readers.ncu.reader",
    "ncu-csv": "perfscope.analysis.readers.ncu.reader",
    "nvml": "perfscope.analysis.readers.nvml",
    **{fmt: "perfscope.analysis.readers.rocprof.reader" for fmt in (
        "rocprofv3-csv", "rocprofv3-json", "rocpd", "rocprof-csv", "rocprof-db", "rocprof-json", "rocprof-stats",
        "rocprof-compute")},
    "memory-snapshot": "perfscope.analysis.readers.snapshot",
    "memory-timeline": "perfscope.analysis.readers.memory_timeline",
    "server-metrics": "perfscope.analysis.readers.server_metrics",
    "nvidia-smi": "perfscope.analysis.readers.nvidia_smi",
}
"""Format name -> module with ``read(path, *, device=None) -> Report`` (``read_nsys_rep`` etc.
are chosen inside the module by the format name when one module serves several)."""

SUPPORTED = (
    "PyTorch/Kineto trace (.json, .json.gz), Nsight Systems SQLite export (.sqlite) or "
    ".nsys-rep, Nsight Compute report (.ncu-rep) or CSV (ncu --csv), NVML samples (nvml.parquet), rocprofv3 output (CSV run, *_results.json, "
    "rocpd *_results.db), rocprof v1/v2 results.csv/.db/.json, a rocprof-compute workload folder, CUDA memory snapshot (.pickle), "
    "torch.profiler export_memory_timeline (.json), a server's /metrics (saved text, a scraped time series CSV, or a "
    "folder of them), nvidia-smi --query-gpu CSV logs"
)


ROCPROF_JSON_HINTS = (b'"rocprof', b'Ns"')
"""Bytes every JSON head that AMD's sniff can claim holds (rocprofv3's ``"rocprofiler-sdk-tool"``, rocprof v1's
``"BeginNs"`` / ``"DispatchNs"``): a JSON head with none of them, not named ``*.csv`` (rocprof-compute's files), is
not AMD's, and the rocprof reader (with its SQLite, CSV and counter modules) is not imported to say so."""


def sniff_rocprof(path: Path, head: bytes) -> str | None:
    """The rocprof format of ``path`` (:func:`.rocprof.reader.sniff`), or None; the rocprof reader is imported only
    when the head could be one of its formats (a Kineto trace's JSON head is decided here, :data:`ROCPROF_JSON_HINTS`)."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if (text[:1] in (b"{", b"[") and not path.name.lower().endswith(".csv")
            and not any(hint in head for hint in ROCPROF_JSON_HINTS)):
        return None
    from .rocprof.reader import sniff

    return sniff(path, head)


class Reader(Protocol):
    def __call__(self, path: Path, *, device: DeviceSpec | None = None) -> Report: ...


def _head(path: Path) -> bytes:
    """The first :data:`SNIFF_BYTES` bytes, decompressed by content (:func:`perfscope.inputs.head_bytes`;
    a stream damaged before its first bytes is one error line)."""
    head = head_bytes(path, SNIFF_BYTES)
    if not head:
        raise InputFormatError(path, "damaged or truncated compressed data (nothing decompresses)",
                               hint="re-export or re-download the file")
    return head


def detect_format(path: str | Path) -> str:
    """Name of the format of ``path`` (a key of :data:`READERS`, or ``report``).

    Raises:
        InputFormatError: missing, empty, or not a format perfscope reads.
    """
    p = Path(path)
    if p.is_dir():
        if (p / MANIFEST).is_file() or single_report(p) is not None:
            return "report"
        amd = sniff_rocprof(p, b"")
        if amd is not None:
            return amd
        from .server_metrics import folder_files

        if folder_files(p):
            return "server-metrics"
        raise InputFormatError(p, "is a folder, not a profiler output or a perfscope report",
                               hint=f"give one file: {SUPPORTED}")
    if regular_file(p).stat().st_size == 0:  # a FIFO, a device, a link loop: one line, never opened
        raise InputFormatError(p, "is empty", hint="the profiler wrote nothing; re-run the capture")
    name = p.name.lower()
    if name.endswith((".nsys-rep", ".qdrep")):
        return "nsys-rep"
    head = _head(p)
    if p.name == MANIFEST and b'"perfscope_version"' in head:
        return "report"  # a report's manifest opens its folder
    container = next((name for magic, name in IN_PLACE if head.startswith(magic)), None)
    if container and (kind := is_compressed(p)):
        raise InputFormatError(p, f"is a {kind}-compressed {container} file: those are read in place, not as a stream",
                               hint=f"decompress it first ({'gunzip' if kind == 'gzip' else kind + ' -d'} {p.name})")
    amd = sniff_rocprof(p, head)
    if amd is not None:
        return amd
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if head.startswith(b"NVR\x00"):
        return "ncu-rep"
    if head.startswith(b"PAR1"):
        from .nvml import is_nvml_parquet

        if is_nvml_parquet(p):
            return "nvml"
        raise InputFormatError(p, "is a Parquet file but not NVML samples (no t_ns, device and metric columns)",
                               hint="report tables are read as a folder: give the NAME.perfscope folder")
    from .snapshot import looks_like_pickle

    if looks_like_pickle(head):
        return "memory-snapshot"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"[" and text[1:].lstrip()[:1] == b"[":
        return "memory-timeline"
    from .server_metrics import kind_of

    served = kind_of(head)
    if served == "results":
        raise InputFormatError(p, "is a benchmark client's results (aggregate latencies), not a trace",
                               hint="import the folder that holds it beside the server's /metrics time series, "
                                    "or measure with perfscope loadtest --metrics")
    if served:
        return "nvidia-smi" if served == "nvidia-smi" else "server-metrics"
    if text[:1] in (b"{", b"["):
        return "kineto"
    from .ncu.csv_launches import looks_like_csv

    if looks_like_csv(head):
        return "ncu-csv"
    if name.endswith(".ncu-rep"):
        return "ncu-rep"
    raise InputFormatError(p, "format not recognised from its content", hint=f"perfscope reads {SUPPORTED}")


def import_file(path: str | Path, *, device: DeviceSpec | None = None, capture: str | Path | None = None) -> Report:
    """Read any supported profiler output (or a report folder) into a Report.

    Args:
        path: the file to read.
        device: roofs to classify against, overriding what the file says about its device.
        capture: for a Kineto trace, the engine's CUDA-graph capture trace(s) to join its graph
            replays to (a trace or a ``capture_traces/`` folder; default: such a folder beside it).
    """
    p = Path(path)
    fmt = detect_format(p)
    if capture is not None and fmt != "kineto":
        raise UsageError(f"capture traces join the graph replays of a Kineto trace; {p} is {fmt}",
                         hint="give --capture with a PyTorch/Kineto trace")
    if fmt == "report":  # a report folder, its manifest, or a folder that holds exactly one
        return Report.load(p.parent if p.is_file() else single_report(p) or p)
    module = importlib.import_module(READERS[fmt])
    reader: Reader = getattr(module, f"read_{fmt.replace('-', '_')}", None) or module.read
    try:
        with counting():
            if capture is not None:
                return module.read_kineto(p, device=device, capture=capture)  # type: ignore[no-any-return]
            return reader(p, device=device)
    except PerfscopeError:
        raise
    except DAMAGED as exc:  # a decompressor's error a reader did not turn into its own line
        raise damaged(p, exc) from None
    except MemoryError:
        raise InputFormatError(p, "reading it needs more memory than this process could get; nothing was written",
                               hint="set PERFSCOPE_MAX_MEMORY to stop earlier with this line, or import a shorter "
                                    "trace") from None
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, ArithmeticError, RecursionError) as exc:
        # the boundary every reader is under: a value of the wrong type or size that a reader did not
        # turn into its own line is still one line naming the file, never a traceback
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise InputFormatError(p, f"holds a value the {fmt} reader cannot read ({type(exc).__name__}: {first})",
                               hint="re-export the capture; if the file is as the tool wrote it, please report "
                                    "this") from None
