"""``perfscope doctor`` on this CPU-only machine: it reports, gives fixes, and exits 0."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from perfscope import doctor
from perfscope.doctor import (
    ERROR,
    MISSING,
    OK,
    Check,
    check_counters,
    check_tool,
    healthy,
    probe_version,
    profiling_gate,
    render_text,
    run_checks,
    to_json,
)


@pytest.fixture(scope="module")
def checks() -> list[Check]:
    return run_checks(timeout_s=5.0)


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_every_check_has_a_status_and_a_fix_when_not_ok(checks: list[Check]) -> None:
    names = [c.name for c in checks]
    assert names[:4] == ["python", "core packages", "torch", "cuda (torch)"]
    assert {"nvml", "nsys", "ncu", "gpu performance counters", "nvtx", "ncu-report", "dash"} <= set(names)
    for check in checks:
        assert check.status in (OK, MISSING, ERROR)
        assert check.detail
        if check.status != OK:
            assert check.fix, check.name


def test_required_checks_pass_here(checks: list[Check]) -> None:
    required = [c for c in checks if c.required]
    assert [c.name for c in required] == ["python", "core packages"]
    assert healthy(checks)
    by = _by_name(checks)
    assert sys.executable in by["python"].detail


def test_torch_check_reports_the_cuda_build(checks: list[Check]) -> None:
    by = _by_name(checks)
    assert torch.__version__ in by["torch"].detail
    if torch.version.cuda is None:
        assert "CPU only" in by["torch"].detail
        assert by["cuda (torch)"].status == MISSING
    elif not torch.cuda.is_available():
        assert by["cuda (torch)"].status == MISSING


@pytest.mark.parametrize("tool", ["nsys", "ncu"])
def test_missing_profilers_say_how_to_install(tool: str, checks: list[Check]) -> None:
    check = _by_name(checks)[tool]
    if shutil.which(tool):
        assert check.status in (OK, ERROR)
    else:
        assert check.status == MISSING and "not on PATH" in check.detail
        assert "developer.nvidia.com" in (check.fix or "")


def test_probe_version_reports_a_program_without_a_version_as_error() -> None:
    status, detail = probe_version(sys.executable)
    assert status == ERROR and "--version" in detail
    assert probe_version("perfscope-no-such-tool") == (MISSING, "not on PATH")


def test_check_tool_uses_the_install_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    check = check_tool("ncu")
    assert check.status == MISSING and "Nsight Compute" in (check.fix or "")


@pytest.mark.parametrize(
    ("text", "gate"),
    [
        ("RmProfilingAdminOnly: 1\nEnableMSI: 1\n", True),
        ("EnableMSI: 1\nRmProfilingAdminOnly: 0\n", False),
        ("NVreg_RestrictProfilingToAdminUsers: 1\n", True),
        ("NVreg_RestrictProfilingToAdminUsers=0\nRmProfilingAdminOnly: 1\n", True),
        ("EnableMSI: 1\n", None),
    ],
)
def test_profiling_gate_reads_both_spellings(text: str, gate: bool | None) -> None:
    assert profiling_gate(text) is gate


def test_counter_permission_from_a_params_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 0\n")
    assert check_counters(params).status == OK
    params.write_text("RmProfilingAdminOnly: 1\n")
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)
    gated = check_counters(params)
    assert gated.status == MISSING and "NVreg_RestrictProfilingToAdminUsers=0" in (gated.fix or "")
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    assert check_counters(params).status == OK
    absent = check_counters(tmp_path / "nope")
    assert absent.status == MISSING and "driver" in absent.detail


def test_unhealthy_only_when_a_required_check_fails() -> None:
    optional_missing = [Check("python", OK, "3.11", required=True), Check("ncu", MISSING, "x", "y")]
    assert healthy(optional_missing)
    broken = [Check("core packages", ERROR, "pandas: ImportError", "pip install -e .", required=True)]
    assert not healthy(broken)
    assert to_json(broken)["ok"] is False


def test_text_and_json_renderings(checks: list[Check]) -> None:
    text = render_text(checks)
    rows = text.partition("\nchecks:\n")[2]
    assert len([line for line in rows.splitlines() if not line.lstrip().startswith("fix:")]) == len(checks)
    assert text.count("fix: ") == sum(1 for c in checks if c.status != OK)
    doc = json.loads(json.dumps(to_json(checks)))
    assert doc["ok"] is True and [c["name"] for c in doc["checks"]] == [c.name for c in checks]
    assert [w["what"] for w in doc["works"]] == [what for what, _ in doctor.CAPABILITIES]


def test_doctor_says_what_works_as_well_as_what_is_missing(checks: list[Check]) -> None:
    """Issue 45: on a CPU-only machine the doctor listed nine missing items and never said that CPU
    profiling works. It says it first, and what each missing piece would enable."""
    text = render_text(checks)
    works = {w["what"]: w for w in doctor.capabilities(checks)}
    cpu = works["profile on the CPU: the engine, your script (perfscope profile --device cpu)"]
    assert cpu["works"] and cpu["needs"] == []
    assert text.startswith("what works here:\n  yes  profile on the CPU")
    if not torch.cuda.is_available():
        gpu = works["profile NVIDIA GPUs with torch.profiler (perfscope profile --device cuda)"]
        assert not gpu["works"] and "cuda (torch)" in gpu["needs"]
        assert "no   profile NVIDIA GPUs with torch.profiler (perfscope profile --device cuda) (needs: cuda (torch))" in text


def test_cli_doctor_exits_zero_without_gpu_tools(capsys: pytest.CaptureFixture[str]) -> None:
    cli = pytest.importorskip("perfscope.cli")
    from perfscope.cli.doctor import doctor as doctor_command

    assert cli.main(["doctor", "--json", "--timeout", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["checks"][0]["name"] == "python"
    result = CliRunner().invoke(doctor_command, [])
    assert result.exit_code == 0 and "fix: " in result.output
