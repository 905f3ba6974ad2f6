"""A bounded import (issue 30: a 23 MB gzip expanding to 31 million kernels grew past 6 GB): past
``--max-events`` or ``PERFSCOPE_MAX_MEMORY`` the import stops with one error line, exit 3, and
writes nothing. The bomb here is the same shape, kept small for CI: 5000 kernels in a gzip."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.limits import budget, max_memory_bytes

KERNELS = 5000


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    events = [{"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": i * 2, "dur": 1,
               "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(KERNELS)]
    path = tmp_path_factory.mktemp("bomb") / "bomb.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode(), 9))
    return path


def _one_error(err: str, *words: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("perfscope: error: ") and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), err


def test_max_events_stops_the_import(bomb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.perfscope"
    assert main(["import", str(bomb), "--out", str(out), "--max-events", "1000"]) == 3
    _one_error(capsys.readouterr().err, str(bomb), "more than 1,000 events", "--max-events")
    assert list(tmp_path.iterdir()) == []
    assert main(["import", str(bomb), "--out", str(out), "--max-events", str(KERNELS), "--no-html"]) == 0
    assert "5000 kernels" in capsys.readouterr().out


def test_max_memory_stops_the_import(bomb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from perfscope.limits import resident_bytes

    if resident_bytes() is None:
        pytest.skip("resident memory is read from /proc/self/statm (Linux)")
    monkeypatch.setenv("PERFSCOPE_MAX_MEMORY", "1M")  # below any Python process: the first block trips it
    out = tmp_path / "r.perfscope"
    assert main(["import", str(bomb), "--out", str(out)]) == 3
    _one_error(capsys.readouterr().err, str(bomb), "PERFSCOPE_MAX_MEMORY=1,048,576 bytes")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("PERFSCOPE_MAX_MEMORY", "1T")
    assert main(["import", str(bomb), "--out", str(out), "--no-html"]) == 0


def test_memory_sizes_and_bad_values(monkeypatch: pytest.MonkeyPatch, bomb: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    for text, n in (("2G", 2 << 30), ("512m", 512 << 20), ("1000000", 10**6), ("1.5K", 1536), ("4GiB", 4 << 30)):
        monkeypatch.setenv("PERFSCOPE_MAX_MEMORY", text)
        assert max_memory_bytes() == n
    monkeypatch.setenv("PERFSCOPE_MAX_MEMORY", "lots")
    assert main(["import", str(bomb)]) == 2
    _one_error(capsys.readouterr().err, "PERFSCOPE_MAX_MEMORY='lots' is not a size")
    with pytest.raises(Exception, match="at least 1"), budget(max_events=0):
        pass


@pytest.mark.parametrize("rel", ["nsys/nvfuser_h100_matmul.sqlite",
                                 "rocprof/llamacpp_r9700_rocpd/32432_results.db",
                                 "rocprof/llamacpp_r9700_rocprof_v1/results.csv",
                                 "rocprof/rocprof_compute_vcopy_MI200",
                                 "ncu/esmm_a10g_roofline_metrics.csv"])
def test_every_reader_keeps_the_budget(fixtures_dir: Path, rel: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`--max-events` counts what each reader reads (nsys and rocpd table rows, rocprof CSV rows, ncu
    launches), across the files of one import; the same file imports under a budget it fits in."""
    path = fixtures_dir / rel
    out = tmp_path / "r.perfscope"
    assert main(["import", str(path), "--out", str(out), "--max-events", "5"]) == 3
    _one_error(capsys.readouterr().err, str(path.name), "more than 5 events", "--max-events")
    assert not out.exists()
    assert main(["import", str(path), "--out", str(out), "--max-events", "10000000", "--no-html"]) == 0
