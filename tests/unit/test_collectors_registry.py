"""The collector registry, the Collector protocol and RawCapture."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from perfscope.collectors import (
    COLLECTORS,
    CaptureInterrupted,
    Collector,
    NcuOptions,
    NsysOptions,
    NvmlOptions,
    RawCapture,
    get_collector,
)
from perfscope.errors import UsageError

COLLECTORS_DIR = Path(__file__).resolve().parents[2] / "collectors"


def test_registry_names_and_protocol() -> None:
    assert {"nsys", "ncu", "nvml"} <= set(COLLECTORS)
    options = {"nsys": NsysOptions, "ncu": NcuOptions, "nvml": NvmlOptions}
    for name, collector in COLLECTORS.items():
        assert isinstance(collector, Collector)
        assert collector.name == name
        if name in options:
            assert collector.options_type is options[name]
            cmd = collector.command(["python", "run.py"], collector.options_type())
            assert cmd[-2:] == ["python", "run.py"]
        assert isinstance(collector.is_available(), bool)


def test_get_collector_lists_the_choices() -> None:
    assert get_collector("ncu") is COLLECTORS["ncu"]
    with pytest.raises(UsageError, match="unknown collector 'nsight'.*choose one of .*ncu.*nsys"):
        get_collector("nsight")


def test_raw_capture_describes_itself_for_the_manifest(tmp_path: Path) -> None:
    capture = RawCapture(
        collector="ncu", files=(tmp_path / "ncu.ncu-rep", tmp_path / "ncu.log"),
        commands=(("ncu", "--set", "roofline", "python", "x.py"),), tool_version="2025.3.1",
        partial=True, warnings=("ncu exited with 1",), params={"clock_control": "base"},
    )
    assert capture.primary == tmp_path / "ncu.ncu-rep"
    assert capture.source() == {"kind": "ncu", "path": str(tmp_path / "ncu.ncu-rep"),
                                "tool": "ncu", "tool_version": "2025.3.1"}
    doc = json.loads(json.dumps(capture.to_dict()))
    assert doc["commands"] == [["ncu", "--set", "roofline", "python", "x.py"]]
    assert doc["partial"] is True and doc["params"] == {"clock_control": "base"}
    assert RawCapture("nvml", (), ()).primary is None


def test_capture_interrupted_is_a_keyboard_interrupt() -> None:
    capture = RawCapture("nsys", (), (), partial=True)
    with pytest.raises(KeyboardInterrupt) as info:
        raise CaptureInterrupted(capture)
    assert isinstance(info.value, CaptureInterrupted) and info.value.capture is capture


def test_collectors_never_import_analysis_dashboard_or_cli() -> None:
    forbidden = ("perfscope.analysis", "perfscope.dashboard", "perfscope.cli", "perfscope.engine")
    for path in COLLECTORS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"
