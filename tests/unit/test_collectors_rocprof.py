"""rocprofv3 / rocprof-compute collectors: the command lines they build, and the import of the files
those tools write (real outputs, since the tools are not on this machine)."""

from __future__ import annotations

import shutil
from pathlib import Path

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
