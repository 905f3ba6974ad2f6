"""Format detection imports the rocprof reader only when a head could be AMD's (issue #44: a Kineto import pays
for no SQLite, CSV or counter module): the cheap test in detect.py never hides an AMD format, and a Kineto trace's
detection leaves the rocprof reader unimported."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.analysis.readers import detect
from perfscope.analysis.readers.rocprof.reader import sniff

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _inputs() -> list[Path]:
    amd = sorted((FIXTURES / "rocprof").glob("*")) + sorted((FIXTURES / "rocprof").glob("*/*"))
    others = [p for sub in ("kineto", "h200", "torch_profiler", "nsys") for p in sorted((FIXTURES / sub).glob("*"))]
    return [p for p in amd + others if p.is_dir() or p.stat().st_size]


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_cheap_test_agrees_with_the_rocprof_sniff(path: Path) -> None:
    head = b"" if path.is_dir() else detect._head(path)
    assert detect.sniff_rocprof(path, head) == sniff(path, head)


def test_amd_json_and_compute_files_still_reach_the_sniff(tmp_path: Path) -> None:
    v1 = tmp_path / "results.json"
    v1.write_text(json.dumps({"traceEvents": [{"name": "k", "args": {"BeginNs": "1", "EndNs": "2"}}]}))
    assert detect.detect_format(v1) == "rocprof-json"
    v3 = tmp_path / "run_results.json"
    v3.write_text(json.dumps({"rocprofiler-sdk-tool": [{"metadata": {}}]}))
    assert detect.detect_format(v3) == "rocprofv3-json"
    # a JSON head in a rocprof-compute workload's file name is that workload's, as the sniff says
    work = tmp_path / "workload"
    work.mkdir()
    (work / "pmc_perf.csv").write_text("Dispatch_ID,Kernel_Name\n0,k\n")
    odd = work / "timestamps.csv"
    odd.write_text('{"traceEvents": []}')
    assert detect.detect_format(odd) == sniff(odd, detect._head(odd)) == "rocprof-compute"


def test_a_kineto_detection_imports_no_rocprof_reader(tmp_path: Path) -> None:
    trace = tmp_path / "t.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7}]}, f)
    code = ("import sys\nfrom perfscope.analysis.readers.detect import detect_format\n"
            f"print(detect_format({str(trace)!r}), 'perfscope.analysis.readers.rocprof.reader' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["kineto", "False"]
