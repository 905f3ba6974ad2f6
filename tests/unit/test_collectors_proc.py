"""run_tool / run_profiler on real subprocesses: missing tools, failing programs, timeouts that
kill the whole process group, Ctrl-C forwarded to the child, partial outputs kept."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from perfscope.collectors._proc import (
    CompletedRun,
    fresh_file,
    parse_version,
    run_profiler,
    run_tool,
)
from perfscope.errors import CollectorError, ToolNotFoundError


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie nobody reaped yet)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _wait_for(path: Path, wait_s: float = 20.0) -> None:
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_missing_tool_is_one_line_with_install_hint(tmp_path: Path) -> None:
    with pytest.raises(ToolNotFoundError) as info:
        run_tool(["nsys", "--version"], env={"PATH": str(tmp_path)})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("nsys is not available")
    assert "Nsight Systems" in message and "PATH" in message
    assert info.value.exit_code == 4


def test_unknown_tool_gets_a_generic_hint(tmp_path: Path) -> None:
    with pytest.raises(ToolNotFoundError, match="install no-such-profiler or check that it is on PATH"):
        run_tool(["no-such-profiler"], env={"PATH": str(tmp_path)})


def test_failing_program_reports_command_code_and_stderr_tail(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "fail.py", """
        import sys
        for i in range(60):
            print(f"progress {i}", file=sys.stderr)
        print("fatal: out of memory", file=sys.stderr)
        sys.exit(3)
    """)
    with pytest.raises(CollectorError) as info:
        run_tool(cmd, tail_lines=10)
    err = info.value
    assert err.returncode == 3
    assert err.cmd[1:] == cmd[1:]
    tail = err.stderr_tail.splitlines()
    assert len(tail) == 10
    assert tail[-1] == "fatal: out of memory" and tail[0] == "progress 51"
    message = str(err)
    assert "\n" not in message and "exited with 3" in message and "out of memory" in message
    assert err.exit_code == 5


def test_success_captures_stdout_and_streams_stderr(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "ok.py", """
        import sys
        print("NVIDIA Nsight Systems version 2024.6.2.225-246235244400v0")
        print("line one", file=sys.stderr)
        print("line two", file=sys.stderr)
    """)
    streamed: list[str] = []
    run = run_tool(cmd, capture_stdout=True, on_stderr=streamed.append)
    assert isinstance(run, CompletedRun) and run.returncode == 0
    assert streamed == ["line one\n", "line two\n"]
    assert run.stderr_tail == "line one\nline two"
    assert parse_version(run.stdout or "") == "2024.6.2.225"


def test_parse_version_reads_nsight_version_lines() -> None:
    ncu = ("NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2024 NVIDIA "
           "Corporation\nVersion 2024.3.2.0 (build 34861637) (public-release)")
    assert parse_version(ncu) == "2024.3.2.0"
    assert parse_version("Python 3.11.7") is None


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    cmd = _script(tmp_path, "hang.py", f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(120)
    """)
    with pytest.raises(CollectorError) as info:
        run_tool(cmd, timeout_s=5.0, grace_s=2.0)
    assert info.value.returncode is None
    assert "timed out" in str(info.value) and "raise the timeout" in str(info.value)
    parent, grandchild = (int(p) for p in pids.read_text().split())
    assert _gone(parent) and _gone(grandchild)


def test_timeout_escalates_to_sigkill_when_sigint_is_ignored(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    cmd = _script(tmp_path, "stubborn.py", f"""
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        open({str(ready)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    with pytest.raises(CollectorError) as info:
        run_tool(cmd, timeout_s=5.0, grace_s=0.5)
    assert info.value.returncode is None
    assert _gone(int(ready.read_text()))


def _interrupt_when(path: Path) -> threading.Thread:
    def fire() -> None:
        _wait_for(path)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_forwards_sigint_to_the_child_and_reraises(tmp_path: Path) -> None:
    ready, marker = tmp_path / "ready", tmp_path / "got"
    cmd = _script(tmp_path, "trap.py", f"""
        import os, signal, sys, time
        def stop(signum, frame):
            open({str(marker)!r}, "w").write(signal.Signals(signum).name)
            sys.exit(130)
        signal.signal(signal.SIGINT, stop)
        open({str(ready)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    thread = _interrupt_when(ready)
    with pytest.raises(KeyboardInterrupt):
        run_tool(cmd, grace_s=10.0)
    thread.join()
    assert marker.read_text() == "SIGINT"
    assert _gone(int(ready.read_text()))


def test_run_profiler_keeps_output_of_a_crashed_program(tmp_path: Path) -> None:
    out = tmp_path / "report.bin"
    cmd = _script(tmp_path, "crash.py", f"""
        import sys
        open({str(out)!r}, "wb").write(b"captured")
        print("Segmentation fault", file=sys.stderr)
        sys.exit(139)
    """)
    outcome = run_profiler(cmd, out, timeout_s=60)
    assert outcome.partial and not outcome.interrupted
    assert "exited with 139" in outcome.warnings[0] and str(out) in outcome.warnings[0]


def test_run_profiler_raises_when_nothing_was_written(tmp_path: Path) -> None:
    out = tmp_path / "report.bin"
    out.write_bytes(b"previous run")
    old = time.time() - 3600
    os.utime(out, (old, old))
    cmd = _script(tmp_path, "fail.py", "import sys; sys.exit(2)\n")
    with pytest.raises(CollectorError) as info:
        run_profiler(cmd, out, timeout_s=60)
    assert info.value.returncode == 2


def test_run_profiler_marks_an_interrupted_run_partial(tmp_path: Path) -> None:
    out, ready = tmp_path / "report.bin", tmp_path / "ready"
    cmd = _script(tmp_path, "slow.py", f"""
        import signal, sys, time
        open({str(out)!r}, "wb").write(b"first samples")
        signal.signal(signal.SIGINT, lambda *a: sys.exit(130))
        open({str(ready)!r}, "w").write("1")
        time.sleep(120)
    """)
    thread = _interrupt_when(ready)
    outcome = run_profiler(cmd, out, timeout_s=None)
    thread.join()
    assert outcome.partial and outcome.interrupted
    assert "interrupted" in outcome.warnings[0]


def test_fresh_file_ignores_empty_and_old_files(tmp_path: Path) -> None:
    path = tmp_path / "x"
    since = time.time()
    assert not fresh_file(path, since)
    path.write_bytes(b"")
    assert not fresh_file(path, since)
    path.write_bytes(b"data")
    assert fresh_file(path, since)
    os.utime(path, (since - 3600, since - 3600))
    assert not fresh_file(path, since)


def test_a_broken_stderr_echo_does_not_stall_the_child(tmp_path: Path) -> None:
    cmd = _script(tmp_path, "chatty.py", """
        import sys
        for i in range(20000):
            print(f"log line {i} " + "x" * 60, file=sys.stderr)
        sys.exit(4)
    """)

    def broken(line: str) -> None:
        raise BrokenPipeError("terminal went away")

    with pytest.raises(CollectorError) as info:
        run_tool(cmd, on_stderr=broken, timeout_s=120)
    assert info.value.returncode == 4
    assert info.value.stderr_tail.splitlines()[-1].startswith("log line 19999")
