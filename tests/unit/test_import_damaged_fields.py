"""Damaged fields of otherwise good profiler outputs: each is ignored or skipped with one warning
that names it, never a traceback (issue 30's table: deviceProperties that are not numbers,
negative kernel durations)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.cli import main
from perfscope.datasheets import device_properties, gpu_spec, unusable_properties

TRACE = "kineto/hta_triton_example__triton_example.json.gz"  # one A100 (PG509-200, 108 SMs)


def _trace(fixtures_dir: Path) -> dict[str, Any]:
    with gzip.open(fixtures_dir / TRACE, "rt") as f:
        return json.load(f)


def _write(tmp_path: Path, trace: dict[str, Any], text: str | None = None) -> Path:
    path = tmp_path / "damaged.json"
    path.write_text(text if text is not None else json.dumps(trace), encoding="utf-8")
    return path


BAD_VALUES = {"numSms": "lots", "totalGlobalMem": [1], "computeMajor": {"x": 1}, "computeMinor": -1}


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-80GB", ""])
def test_device_properties_that_are_not_numbers_are_ignored_with_one_warning(
        fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    trace = _trace(fixtures_dir)
    trace["deviceProperties"][0].update(BAD_VALUES, name=name)
    out = tmp_path / "r.perfscope"
    assert main(["import", str(_write(tmp_path, trace)), "--out", str(out), "--no-html"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "deviceProperties" in line]
    assert len(lines) == 1 and all(f"GPU 0 {k}=" in lines[0] for k in BAD_VALUES) and "'lots'" in lines[0]
    props = json.loads((out / "manifest.json").read_text())["device"]["properties"]
    assert not {"sm_count", "memory_bytes", "compute_capability"} & set(props)  # ignored, not guessed
    r = import_file(_write(tmp_path, trace))
    assert bool(r.device.compute) == bool(name)  # the name still finds the datasheet row


def test_nan_and_infinity_in_device_properties(fixtures_dir: Path, tmp_path: Path) -> None:
    """JSON's non-standard NaN / Infinity literals, as Python's json module writes them."""
    trace = _trace(fixtures_dir)
    trace["deviceProperties"][0].update(numSms=float("nan"), totalGlobalMem=float("inf"), name="")
    r = import_file(_write(tmp_path, trace, json.dumps(trace)))  # allow_nan: the literals NaN, Infinity
    warned = [w for w in r.warnings if w.startswith("deviceProperties")]
    assert len(warned) == 1 and "numSms=nan" in warned[0] and "totalGlobalMem=inf" in warned[0]
    assert "sm_count" not in r.device.properties and "memory_bytes" not in r.device.properties


def test_the_datasheet_lookup_never_raises_on_odd_values() -> None:
    for value in ("lots", [1], None, float("nan"), -5, True, {"a": 1}, "108", 1e400):
        raw = {"numSms": value, "totalGlobalMem": value, "computeMajor": value, "computeMinor": value}
        spec = gpu_spec("", properties=raw)  # no name: the properties would be used to match
        assert spec.compute == {} and "sm_count" not in spec.properties, value
    good = {"numSms": 108, "totalGlobalMem": 42_949_672_960, "computeMajor": 8.0, "computeMinor": 0}
    assert unusable_properties(good) == {}
    assert device_properties(good)["compute_capability"] == "8.0"


def test_negative_kernel_durations_are_skipped_and_counted_with_the_other_bad_ones(
        fixtures_dir: Path, tmp_path: Path) -> None:
    name = "kineto/tracelens_torch_compile_triton__trace.json.gz"  # 12 kernels
    with gzip.open(fixtures_dir / name, "rt") as f:
        trace = json.load(f)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    assert len(kernels) >= 4
    for e, dur in zip(kernels, (-5, -0.5, None, float("inf"))):
        e["dur"] = dur
    whole = import_file(fixtures_dir / name)
    r = import_file(_write(tmp_path, trace))
    assert len(r.kernels) == len(whole.kernels) - 4
    assert (r.kernels["duration_ns"] >= 0).all()
    skipped = [w for w in r.warnings if "ts/dur were skipped" in w]
    assert len(skipped) == 1 and skipped[0].startswith("4 events with a missing, non-numeric, negative")
    assert "(2 of them with a negative dur)" in skipped[0]


NCU_CSV = "ncu/esmm_a10g_roofline_metrics.csv"  # ncu --csv, long shape: 9 launches, 5 metric rows each


def _cut_csv(fixtures_dir: Path, tmp_path: Path, *, nbytes: int | None = None, lines: int | None = None) -> Path:
    data = (fixtures_dir / NCU_CSV).read_bytes()
    cut = data[:nbytes] if nbytes is not None else b"".join(data.splitlines(keepends=True)[:lines])
    path = tmp_path / "cut.csv"
    path.write_bytes(cut)
    return path


def test_a_truncated_ncu_csv_is_named_and_marked_partial(fixtures_dir: Path, tmp_path: Path) -> None:
    whole = import_file(fixtures_dir / NCU_CSV)
    assert not whole.manifest["partial"] and not any("truncated" in w for w in whole.warnings)
    size = (fixtures_dir / NCU_CSV).stat().st_size
    for nbytes in (size * 3 // 10, size // 2, size * 9 // 10, size - 1):
        r = import_file(_cut_csv(fixtures_dir, tmp_path, nbytes=nbytes))
        cut = [w for w in r.warnings if w.startswith("the CSV file is truncated")]
        assert r.manifest["partial"] is True and len(cut) == 1, (nbytes, r.warnings)
        assert "ends in the middle of line" in cut[0]
        assert len(r.kernels) < len(whole.kernels) or nbytes == size - 1
    # cut at a line end inside the fourth launch: the last launch lost some of its rows
    r = import_file(_cut_csv(fixtures_dir, tmp_path, lines=20))
    cut = [w for w in r.warnings if w.startswith("the CSV file is truncated")]
    assert r.manifest["partial"] is True and len(cut) == 1 and "ID 3, has 4 of 5 metric rows" in cut[0]


def test_a_truncated_ncu_csv_through_the_cli(fixtures_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _cut_csv(fixtures_dir, tmp_path, nbytes=(fixtures_dir / NCU_CSV).stat().st_size * 3 // 10)
    out = tmp_path / "r.perfscope"
    assert main(["import", str(path), "--out", str(out), "--no-html"]) == 0
    assert "warning: the CSV file is truncated" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["partial"] is True
