"""Detect a profiler output's format from its content and turn it into a Report.

Each format has a reader module exposing ``read(path, *, device=None) -> Report`` that returns
a fully analysed report (costs attributed, roofline classified). Detection looks at the
bytes, not only at the extension, so a renamed file still imports and a wrong file gets a
clear message instead of a parser traceback.
"""

from __future__ import annotations

import gzip
import importlib
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from perfscope.errors import InputFormatError, UsageError
from perfscope.limits import counting
from perfscope.outpaths import single_report
from perfscope.report import MANIFEST, Report

from .rocprof.reader import sniff as sniff_rocprof

if TYPE_CHECKING:
    from perfscope.device import DeviceSpec

SNIFF_BYTES = 1 << 16

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
}
"""Format name -> module with ``read(path, *, device=None) -> Report`` (``read_nsys_rep`` etc.
are chosen inside the module by the format name when one module serves several)."""

SUPPORTED = (
    "PyTorch/Kineto trace (.json, .json.gz), Nsight Systems SQLite export (.sqlite) or "
    ".nsys-rep, Nsight Compute report (.ncu-rep) or CSV (ncu --csv), NVML samples (nvml.parquet), rocprofv3 output (CSV run, *_results.json, "
    "rocpd *_results.db), rocprof v1/v2 results.csv/.db/.json, a rocprof-compute workload folder, CUDA memory snapshot (.pickle), "
    "torch.profiler export_memory_timeline (.json)"
)


class Reader(Protocol):
    def __call__(self, path: Path, *, device: DeviceSpec | None = None) -> Report: ...


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if head[:2] == b"\x1f\x8b":
        try:
            data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, SNIFF_BYTES)
        except zlib.error:
            data = b""
        if not data:
            raise InputFormatError(path, "damaged or truncated gzip data",
                                   hint="re-export or re-download the file")
        return data
    return head


def detect_format(path: str | Path) -> str:
    """Name of the format of ``path`` (a key of :data:`READERS`, or ``report``).

    Raises:
        InputFormatError: missing, empty, or not a format perfscope reads.
    """
    p = Path(path)
    if not p.exists():
        raise InputFormatError(p, "no such file or folder", hint="check the path")
    if p.is_dir():
        if (p / MANIFEST).is_file() or single_report(p) is not None:
            return "report"
        amd = sniff_rocprof(p, b"")
        if amd is not None:
            return amd
        raise InputFormatError(p, "is a folder, not a profiler output or a perfscope report",
                               hint=f"give one file: {SUPPORTED}")
    if p.stat().st_size == 0:
        raise InputFormatError(p, "is empty", hint="the profiler wrote nothing; re-run the capture")
    name = p.name.lower()
    if name.endswith((".nsys-rep", ".qdrep")):
        return "nsys-rep"
    head = _head(p)
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
    if text[:1] in (b"{", b"["):
        return "kineto"
    if b'"ID","Process ID"' in head or b"==PROF==" in head or b'"Kernel Name"' in head:
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
    if fmt == "report":  # a report folder, or a folder that holds exactly one
        return Report.load(single_report(p) or p)
    module = importlib.import_module(READERS[fmt])
    reader: Reader = getattr(module, f"read_{fmt.replace('-', '_')}", None) or module.read
    try:
        with counting():
            if capture is not None:
                return module.read_kineto(p, device=device, capture=capture)  # type: ignore[no-any-return]
            return reader(p, device=device)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise InputFormatError(p, f"truncated or damaged compressed data ({exc})",
                               hint="re-export or re-download the file") from None
