"""Ctrl-C in every `perfscope profile` path (engine, script, nsys, ncu, nvml) gives exit 130 and a partial report; the collector
registry drives `--collector`, and NVML samples (`--nvml`, `--collector nvml`) reach the report
and import again.

NVML cannot run on this CPU-only machine: a scripted sample source stands in for the driver
(the same one the sampler's unit tests use); everything after it is the real code.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.collectors import COLLECTORS, NvmlCollector, NvmlSampler, collector_names
from perfscope.report import Report
from tests.integration.test_profile_tools import FAKE_NSYS
from tests.unit.test_nvml_sampler import ScriptedSource

TORCH_WORK = """
import torch
x, w = torch.randn(64, 128), torch.randn(128, 32)
for _ in range(3):
    y = torch.relu(x @ w)
"""


@pytest.fixture(scope="module")
def cpu_roofs():
    from perfscope.collectors.roofs import device_roofs

    return device_roofs("cpu")  # cached per machine, so the runs below do not measure again


def _interrupted(out: Path, exc: pytest.ExceptionInfo[SystemExit]) -> Report:
    assert exc.value.code == 130
    report = Report.load(out)
    assert report.manifest["partial"] is True and report.params["interrupted"] is True
    return report


def _sigint_when(ready: Path) -> threading.Thread:
    """Send SIGINT to this process once ``ready`` exists (Ctrl-C at the terminal)."""
    def run() -> None:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _waiting_script(tmp_path: Path, ready: Path, work: str = "") -> Path:
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(work) + textwrap.dedent(f"""
        import time
        open({str(ready)!r}, "w").write("1")
        for _ in range(1200):
            time.sleep(0.1)
    """))
    return script


def _ctrl_c_profile(tmp_path: Path, collector: str) -> Report:
    """`perfscope profile --collector C -- python serve.py`, Ctrl-C once the program runs."""
    ready = tmp_path / "ready"
    script = _waiting_script(tmp_path, ready)
    out = tmp_path / f"{collector}.perfscope"
    thread = _sigint_when(ready)
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--collector", collector, "--out", str(out), "--no-html", "-q", "--",
              sys.executable, str(script)])
    thread.join()
    return _interrupted(out, exc)


def _on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / name
    exe.write_text(source)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


# ---------------------------------------------------------------------------- torch: engine and script
def test_engine_ctrl_c_during_the_profiled_run(tmp_path, cpu_roofs, monkeypatch):
    gen = importlib.import_module("perfscope.engine.generate")  # the module (the package re-exports the function)
    real, calls = gen.generate, []

    def generate(*args, **kwargs):
        import torch

        profiled = torch.autograd.profiler._is_profiler_enabled  # the warm-up and unprofiled passes run first
        calls.append(profiled)
        out = real(*args, **kwargs)
        if profiled:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(gen, "generate", generate)
    out = tmp_path / "engine.perfscope"
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--model", "tiny", "--prompt-len", "8", "--gen-len", "3", "--device", "cpu",
              "--out", str(out), "--no-html", "-q"])
    report = _interrupted(out, exc)
    assert len(report.kernels) and calls[-1] and not any(calls[:-1]) and len(calls) >= 3


def test_script_ctrl_c_in_process(tmp_path, cpu_roofs):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCH_WORK) + "raise KeyboardInterrupt\n")
    out = tmp_path / "script.perfscope"
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--collector", "torch", "--device", "cpu", "--out", str(out), "--no-html", "-q",
              "--", "python", str(script)])
    report = _interrupted(out, exc)
    mm = report.kernels[report.kernels["name"] == "aten::matmul"]
    assert len(mm) == 3 and (mm["flops"] == 2 * 64 * 128 * 32).all()  # what ran before Ctrl-C is kept


@pytest.mark.slow
def test_script_sigint_to_the_perfscope_process(tmp_path, cpu_roofs):
    ready = tmp_path / "ready"
    script = _waiting_script(tmp_path, ready, TORCH_WORK)
    out = tmp_path / "sig.perfscope"
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", "profile", "--collector", "torch", "--device", "cpu",
                             "--out", str(out), "--no-html", "-q", "--", "python", str(script)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        deadline = time.monotonic() + 240
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    report = Report.load(out)
    assert report.manifest["partial"] is True and report.params["interrupted"] is True
    assert (report.kernels["name"] == "aten::matmul").sum() == 3


# ---------------------------------------------------------------------------- external tools
def test_nsys_ctrl_c_keeps_the_partial_capture(tmp_path, fixtures_dir, monkeypatch):
    """A stand-in nsys that, like the real one, finalises its report when Ctrl-C reaches it."""
    source = FAKE_NSYS.format(python=sys.executable,
                              fixture=str(fixtures_dir / "nsys" / "nvfuser_h100_matmul.sqlite"))
    hook = ('if args[0] == "profile":\n'
            '    import signal\n'
            '    def _stop(*_):\n'
            '        open(opt["--output"] + ".nsys-rep", "wb").write(b"stand-in report")\n'
            '        sys.exit(130)\n'
            '    signal.signal(signal.SIGINT, _stop)\n')
    assert 'if args[0] == "profile":\n' in source
    _on_path(tmp_path, monkeypatch, "nsys", source.replace('if args[0] == "profile":\n', hook))
    report = _ctrl_c_profile(tmp_path, "nsys")
    assert len(report.kernels) and report.manifest["source"]["tool"] == "nsys"


FAKE_NCU = textwrap.dedent("""\
    #!{python}
    import shutil, signal, subprocess, sys
    args = sys.argv[1:]
    if args and args[0] == "--version":
        print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2024.1.0.0 (build 33681293)")
        sys.exit(0)
    base = args[args.index("--export") + 1]
    def _stop(*_):  # like ncu: Ctrl-C ends the run, and the launches profiled so far are saved
        shutil.copyfile({fixture!r}, base + ".ncu-rep")
        sys.exit(130)
    signal.signal(signal.SIGINT, _stop)
    sys.exit(subprocess.call(args[args.index("--log-file") + 2:]))
""")


def test_ncu_ctrl_c_keeps_the_partial_capture(tmp_path, fixtures_dir, monkeypatch):
    _on_path(tmp_path, monkeypatch, "ncu", FAKE_NCU.format(
        python=sys.executable, fixture=str(fixtures_dir / "ncu" / "esmm_a10g_roofline_set.ncu-rep")))
    report = _ctrl_c_profile(tmp_path, "ncu")
    assert len(report.kernels) and report.manifest["source"]["tool"] == "ncu"


# ---------------------------------------------------------------------------- NVML through the registry
@pytest.fixture
def stand_in_nvml(monkeypatch):
    """NVML collector and sampler reading a scripted source instead of the driver."""
    monkeypatch.setitem(COLLECTORS, "nvml", NvmlCollector(source_factory=lambda: ScriptedSource(labels=("cuda:0",))))
    monkeypatch.setattr("perfscope.sessions.profile.nvml_sampler",
                        lambda rate: NvmlSampler(rate, source=ScriptedSource(labels=("cuda:0",))))


def test_collector_choices_come_from_the_registry(monkeypatch):
    from perfscope.cli.profile import profile

    choices = next(p for p in profile.params if p.name == "collector").type.choices
    assert tuple(choices) == collector_names() == ("torch", *COLLECTORS)
    assert "nvml" in choices


def test_nvml_collector_report_and_its_samples_import_again(tmp_path, stand_in_nvml):
    out = tmp_path / "nvml.perfscope"
    code = main(["profile", "--collector", "nvml", "--nvml-rate", "50", "--out", str(out), "--no-html", "-q", "--",
                 sys.executable, "-c", "import time; time.sleep(0.6)"])
    assert code == 0
    report = Report.load(out)
    assert report.manifest["source"]["kind"] == "nvml" and len(report.counters) >= 2
    assert set(report.counters["device"]) == {"cuda:0"}
    raw = out / "raw" / "nvml.parquet"
    again = tmp_path / "again.perfscope"
    assert main(["import", str(raw), "--out", str(again), "--no-html"]) == 0
    imported = Report.load(again)
    assert imported.counters["t_ns"].tolist() == report.counters["t_ns"].tolist()
    assert imported.params["rate_hz"] == 50 and imported.params["clock"] == "unix_epoch_ns"


def test_nvml_collector_ctrl_c(tmp_path, stand_in_nvml):
    assert len(_ctrl_c_profile(tmp_path, "nvml").counters) >= 1


def test_nvml_flag_with_the_torch_collector(tmp_path, cpu_roofs, stand_in_nvml):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCH_WORK) + "import time\ntime.sleep(0.3)\n")
    out = tmp_path / "torch-nvml.perfscope"
    code = main(["profile", "--collector", "torch", "--nvml", "--nvml-rate", "50", "--device", "cpu",
                 "--out", str(out), "--no-html", "-q", "--", "python", str(script)])
    assert code == 0
    report = Report.load(out)
    assert len(report.counters) >= 2 and (report.kernels["name"] == "aten::matmul").sum() == 3


def test_a_parquet_file_that_is_not_nvml_is_refused(tmp_path, sample_reports_dir):
    proc = main(["import", str(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope" / "kernels.parquet"),
                 "--out", str(tmp_path / "x.perfscope")])
    assert proc == 3


# ---------------------------------------------------------------------------- Ctrl-C from outside, at each point
def _sigint_at_marker(argv: list[str], marker: str, cwd: Path) -> tuple[int, str, str]:
    """Run ``python -m perfscope ARGV`` with its stages printed as lines, Ctrl-C it once ``marker``
    is printed (not after a sleep), and return (status, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "perfscope", *argv], cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PERFSCOPE_PROGRESS": "lines",
                                                         "PYTHONWARNINGS": "ignore"})
    seen: list[str] = []
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(line)
            if marker in line:
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert any(marker in line for line in seen), "".join(seen) + err
    return proc.returncode, out, "".join(seen) + err


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["perfscope: building model", "perfscope: warm-up", "perfscope: unprofiled runs",
                                    "perfscope: profiled run", "perfscope: measuring the GEMM size curve"])
def test_engine_sigint_at_each_stage_writes_a_partial_report(tmp_path, cpu_roofs, marker):
    """`perfscope profile --model tiny`, Ctrl-C once a stage has begun: exit 130 and a partial
    report in every case (no kernels before the profiled run ends; the passes that completed)."""
    out = tmp_path / "tiny.perfscope"
    code, _, err = _sigint_at_marker(["profile", "--model", "tiny", "--device", "cpu", "--gen-len", "8",
                                      "--out", str(out)], marker, tmp_path)
    assert code == 130, err
    assert "Traceback" not in err and "interrupted" in err.strip().splitlines()[-1]
    report = Report.load(out)
    assert report.manifest["partial"] is True and report.params["interrupted"] is True
    assert (out / "report.html").is_file()
    if len(report.kernels) == 0:  # stopped before the profiled run ended: said, with the stage
        stage = report.params["interrupted_stage"]
        assert any(f"during the stage '{stage}'" in w for w in report.warnings)
        if "unprofiled_wall_s_passes" in report.params:
            assert len(report.table("steps_unprofiled")) > 0


_SIGINT_ON_IMPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
class _CtrlC:  # Ctrl-C at the moment this module starts importing
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, _CtrlC())
from perfscope.launch import run
run()
"""


@pytest.mark.parametrize("module", ["click", "pandas", "perfscope.cli.profile", "perfscope.cli.serve"])
def test_ctrl_c_while_the_cli_imports_is_one_line(tmp_path, module):
    """Ctrl-C in the first second of any command (the CLI still importing): one line, exit 130,
    no KeyboardInterrupt traceback. The signal is sent as the named module starts importing."""
    proc = subprocess.run([sys.executable, "-c", _SIGINT_ON_IMPORT.format(module=module), "analyze", "x"],
                          check=False, cwd=tmp_path, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "perfscope: interrupted\n"
