"""rocprofv3 / rocprof-compute collectors: the command lines they build, and the import of the files
those tools write (real outputs, since the tools are not on this machine)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from perfscope.analysis.readers.detect import import_file
from perfscope.collectors import collector_names, get_collector
from perfscope.collectors.rocprof import RESULT, RocprofComputeOptions, RocprofOptions
from perfscope.doctor import TOOL_FIXES, check_tool


def test_registered_for_profile() -> None:
    assert {"rocprofv3", "rocprof-compute"} <= set(collector_names())


def test_rocprofv3_command_line() -> None:
    cmd = get_collector("rocprofv3").command(["python", "x.py"], RocprofOptions())
    assert cmd[:4] == ["rocprofv3", "--kernel-trace", "--hip-runtime-trace", "--memory-copy-trace"]
    assert "--marker-trace" in cmd
    assert cmd[cmd.index("--output-format") + 1] == "rocpd"
    assert cmd[-3:] == ["--", "python", "x.py"]
    pmc = get_collector("rocprofv3").command(["a"], RocprofOptions(output_format="csv", pmc=("SQ_WAVES", "FETCH_SIZE")))
    assert pmc[pmc.index("--pmc") + 1: pmc.index("--pmc") + 3] == ["SQ_WAVES", "FETCH_SIZE"]


def test_rocprof_compute_command_line() -> None:
    cmd = get_collector("rocprof-compute").command(["./app", "-n", "8"], RocprofComputeOptions(name="w"))
    assert cmd[:4] == ["rocprof-compute", "profile", "-n", "w"] and cmd[-4:] == ["--", "./app", "-n", "8"]


def test_the_files_they_write_import(fixtures_dir: Path, tmp_path: Path) -> None:
    # rocprofv3 --output-format rocpd -o run writes run_results.db: the R9700 capture is one such file
    db = tmp_path / RESULT["rocpd"].format(base="run")
    shutil.copy(fixtures_dir / "rocprof/llamacpp_r9700_rocpd/32432_results.db", db)
    assert len(import_file(db).kernels) == 5687
    # rocprof-compute writes a workload folder holding pmc_perf.csv
    assert len(import_file(fixtures_dir / "rocprof/rocprof_compute_vcopy_MI200").kernels) == 3


def test_doctor_says_how_to_install() -> None:
    for tool in ("rocprofv3", "rocprof-compute"):
        check = check_tool(tool)
        if shutil.which(tool) is None:
            assert check.status != "ok" and check.fix == TOOL_FIXES[tool]


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    """A stand-in executable on PATH that writes a real capture where the real tool would."""
    exe = bin_dir / name
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)


def test_profile_with_rocprof_compute_imports_its_workload(fixtures_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from perfscope.sessions.profile import profile_external

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    workload = fixtures_dir / "rocprof" / "rocprof_compute_vcopy_MI200"
    # rocprof-compute profile -n NAME --path DIR -- CMD: the workload lands in DIR/<gpu model>/
    _fake_tool(bin_dir, "rocprof-compute", f'mkdir -p "$5/MI200" && cp {workload}/*.csv "$5/MI200/"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    report, raw = profile_external(["./vcopy", "-n", "1048576"], collector="rocprof-compute", work_dir=tmp_path / "w")
    assert len(report.kernels) == 3 and report.params["collector"] == "rocprof-compute"
    assert report.device is not None and report.device.memory["l2"].provenance == "measured (rocprof-compute)"
    assert {"raw/pmc_perf.csv", "raw/sysinfo.csv", "raw/roofline.csv"} <= set(raw)


def test_profile_with_rocprofv3_imports_its_database(fixtures_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from perfscope.sessions.profile import profile_external

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    db = fixtures_dir / "rocprof" / "llamacpp_r9700_rocpd" / "32432_results.db"
    # rocprofv3 ... -d DIR -o run -- CMD writes DIR/run_results.db
    _fake_tool(bin_dir, "rocprofv3", 'while [ "$1" != "-d" ]; do shift; done; '
                                     f'cp {db} "$2/run_results.db"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    report, raw = profile_external(["llama-bench"], collector="rocprofv3", work_dir=tmp_path / "w")
    assert len(report.kernels) == 5687 and "raw/run_results.db" in raw
