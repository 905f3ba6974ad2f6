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
