"""Nsight Systems command construction (pure) and its failure paths on a machine without nsys."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.collectors import COLLECTORS, NsysCollector, NsysOptions
from perfscope.collectors.nsys import export_command, profile_command, report_path
from perfscope.errors import ToolNotFoundError, UsageError

TARGET = ["python", "serve.py", "--batch", "8"]


def test_default_profile_command_has_the_flags_people_forget() -> None:
    cmd = profile_command(TARGET, NsysOptions(output_base="/tmp/out/nsys"))
    assert cmd == [
        "nsys", "profile", "--trace=cuda,nvtx,osrt", "--cuda-graph-trace=node",
        "--sample=none", "--output=/tmp/out/nsys", "--force-overwrite=true",
        "python", "serve.py", "--batch", "8",
    ]


def test_duration_delay_and_extra_args_come_before_the_program() -> None:
    opts = NsysOptions(trace=("cuda", "nvtx"), cuda_graph_trace="graph", delay_s=5,
                       duration_s=20, extra_args=("--cpuctxsw=none",))
    cmd = profile_command(TARGET, opts)
    program = cmd.index("python")
    assert cmd[program:] == TARGET
    assert {"--trace=cuda,nvtx", "--cuda-graph-trace=graph", "--delay=5", "--duration=20",
            "--cpuctxsw=none"} <= set(cmd[:program])
    assert cmd.index("--delay=5") < cmd.index("--duration=20") < cmd.index("--cpuctxsw=none")


def test_collector_command_is_the_profile_command() -> None:
    opts = NsysOptions()
    assert NsysCollector().command(TARGET, opts) == profile_command(TARGET, opts)


def test_export_command_writes_sqlite_next_to_the_report() -> None:
    assert export_command(Path("out/nsys.nsys-rep"), Path("out/nsys.sqlite")) == [
        "nsys", "export", "--type=sqlite", "--force-overwrite=true",
        "--output=out/nsys.sqlite", "out/nsys.nsys-rep",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cuda_graph_trace": "nodes"}, "node or graph"),
        ({"trace": ()}, "--trace"),
        ({"trace": ("cuda nvtx",)}, "--trace"),
        ({"duration_s": 0}, "duration_s"),
        ({"delay_s": -1}, "delay_s"),
    ],
)
def test_bad_options_are_usage_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        NsysOptions(**kwargs)  # type: ignore[arg-type]


def test_empty_target_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no command to profile"):
        profile_command([], NsysOptions())


def test_report_path_prefers_nsys_rep_and_falls_back_to_qdrep(tmp_path: Path) -> None:
    base = tmp_path / "nsys"
    assert report_path(base) == tmp_path / "nsys.nsys-rep"
    (tmp_path / "nsys.qdrep").write_bytes(b"old nsys")
    assert report_path(base) == tmp_path / "nsys.qdrep"
    (tmp_path / "nsys.nsys-rep").write_bytes(b"new nsys")
    assert report_path(base) == tmp_path / "nsys.nsys-rep"


def test_collect_without_nsys_raises_tool_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    collector = COLLECTORS["nsys"]
    assert not collector.is_available()
    with pytest.raises(ToolNotFoundError) as info:
        collector.collect(TARGET, tmp_path / "out", NsysOptions())
    assert "Nsight Systems" in str(info.value) and "\n" not in str(info.value)
    assert not list((tmp_path / "out").glob("*.nsys-rep"))
