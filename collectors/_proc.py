"""Run an external profiler (nsys, ncu) or a profiled program, and turn its failures into
perfscope errors.

:func:`run_tool` is the one place that starts subprocesses for the collectors:

- the executable is looked up on ``PATH`` first; a missing one raises
  :class:`~perfscope.errors.ToolNotFoundError` with an install hint;
- the child runs in its own process group, so a timeout or Ctrl-C stops the profiler *and*
  the program it launched (and anything that program started);
- stderr is read line by line, optionally streamed to a callback, and its last lines are kept
  for the error message;
- a non-zero exit raises :class:`~perfscope.errors.CollectorError` with the command, the exit
  code and the stderr tail; a timeout raises it with ``returncode=None``;
- Ctrl-C (``KeyboardInterrupt``) forwards SIGINT to the child's group (profilers finalise their
  report on SIGINT), escalates to SIGKILL after a grace period and re-raises, so the caller can
  keep what was written and mark the run partial.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from perfscope.errors import CollectorError, ToolNotFoundError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

TAIL_LINES = 40
"""stderr lines kept for error messages."""

GRACE_S = 5.0
"""Seconds a stopped child gets to exit after SIGINT before SIGKILL."""

INSTALL_HINTS: dict[str, str] = {
    "nsys": "install NVIDIA Nsight Systems (https://developer.nvidia.com/nsight-systems, or the "
    "CUDA toolkit's nsight-systems package) and put its bin folder on PATH",
    "ncu": "install NVIDIA Nsight Compute (https://developer.nvidia.com/nsight-compute, or the "
    "CUDA toolkit's nsight-compute package) and put its folder on PATH",
}

_VERSION_RE = re.compile(r"\b(\d{4}\.\d+(?:\.\d+)*)")


@dataclass(frozen=True)
class CompletedRun:
    """A finished subprocess.

    Attributes:
        cmd: the command as run (argv[0] resolved to the executable's path).
        returncode: exit status (0 here: failures raise instead).
        stdout: captured stdout, or None when it went to the terminal.
        stderr_tail: the last lines of stderr.
        duration_s: wall time from start to exit.
    """

    cmd: tuple[str, ...]
    returncode: int
    stdout: str | None
    stderr_tail: str
    duration_s: float


def install_hint(tool: str) -> str:
    """How to install ``tool`` (a generic hint for programs perfscope does not know)."""
    return INSTALL_HINTS.get(tool, f"install {tool} or check that it is on PATH")


def find_tool(tool: str, *, env: Mapping[str, str] | None = None) -> str:
    """Absolute path of ``tool`` on ``PATH`` (``env``'s PATH when given).

    Raises:
        ToolNotFoundError: ``tool`` is not installed or not on PATH.
    """
    path = shutil.which(tool, path=(env or os.environ).get("PATH"))
    if path is None:
        raise ToolNotFoundError(Path(tool).name, install_hint(Path(tool).name))
    return path


def parse_version(text: str) -> str | None:
    """The first ``YYYY.N[.N...]`` version number in a tool's ``--version`` output."""
    match = _VERSION_RE.search(text)
    return match.group(1) if match else None


def tool_version(tool: str, *, timeout_s: float = 15.0) -> str | None:
    """Version of an Nsight tool from ``<tool> --version``; None if it cannot be read.

    Raises:
        ToolNotFoundError: ``tool`` is not on PATH.
    """
    try:
        run = run_tool([tool, "--version"], timeout_s=timeout_s, capture_stdout=True)
    except CollectorError:
        return None
    return parse_version(f"{run.stdout or ''}\n{run.stderr_tail}")


def _signal_group(proc: subprocess.Popen[str], sig: int) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, sig)
        else:  # pragma: no cover - Windows has no process groups in this sense
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen[str], *, grace_s: float = GRACE_S) -> None:
    """Stop ``proc`` and its process group: SIGINT, then SIGKILL after ``grace_s``."""
    _signal_group(proc, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # The leader may be gone while others in its group (the profiled program) live on.
    _signal_group(proc, signal.SIGKILL)
    proc.wait()


def _pump(stream: IO[str], sink: Callable[[str], None]) -> None:
    for line in stream:
        sink(line)
    stream.close()


def _reader(stream: IO[str] | None, sink: Callable[[str], None]) -> threading.Thread | None:
    if stream is None:
        return None
    thread = threading.Thread(target=_pump, args=(stream, sink), daemon=True)
    thread.start()
    return thread


def _stderr_sink(
    tail: deque[str], on_stderr: Callable[[str], None] | None
) -> Callable[[str], None]:
    echo = [on_stderr]

    def sink(line: str) -> None:
        tail.append(line.rstrip("\n"))
        if echo[0] is not None:
            try:
                echo[0](line)
            except Exception:  # noqa: BLE001 - a broken echo must not stall the child's pipe
                echo[0] = None

    return sink


def _stdin_is_tty() -> bool:
    try:
        return os.isatty(0)
    except OSError:
        return False


def _spawn(
    argv: list[str], cwd: str | Path | None, env: Mapping[str, str] | None, capture_stdout: bool
) -> subprocess.Popen[str]:
    # The child gets its own process group (so a timeout can stop all it started); a
    # background group that reads the terminal would be stopped by SIGTTIN and hang, so a
    # terminal stdin is replaced by /dev/null (pipes and files are passed through).
    stdin = subprocess.DEVNULL if _stdin_is_tty() else None
    return subprocess.Popen(
        argv,
        stdin=stdin,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdout=subprocess.PIPE if capture_stdout else None,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=hasattr(os, "killpg"),
    )


def run_tool(
    cmd: Sequence[str],
    *,
    timeout_s: float | None = None,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    capture_stdout: bool = False,
    on_stderr: Callable[[str], None] | None = None,
    tail_lines: int = TAIL_LINES,
    grace_s: float = GRACE_S,
) -> CompletedRun:
    """Run ``cmd`` to completion and return its result, or raise a perfscope error.

    Args:
        cmd: the command; ``cmd[0]`` is looked up on PATH.
        timeout_s: wall-clock limit; None for none.
        cwd: working directory of the child (default: ours).
        env: the child's whole environment (default: ours).
        capture_stdout: keep stdout (for ``--version``); otherwise it goes to our stdout.
        on_stderr: called with each stderr line as it arrives (the CLI streams it).
        tail_lines: how many stderr lines to keep.
        grace_s: seconds between SIGINT and SIGKILL when the child must be stopped.

    Raises:
        ToolNotFoundError: ``cmd[0]`` is not on PATH.
        CollectorError: non-zero exit (``returncode`` set) or timeout (``returncode`` None).
        KeyboardInterrupt: re-raised after the child's group was stopped.
    """
    tool = Path(cmd[0]).name
    argv = [find_tool(cmd[0], env=env), *cmd[1:]]
    tail: deque[str] = deque(maxlen=tail_lines)
    out: list[str] = []
    started = time.perf_counter()
    proc = _spawn(argv, cwd, env, capture_stdout)
    readers = [_reader(proc.stderr, _stderr_sink(tail, on_stderr)), _reader(proc.stdout, out.append)]
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group(proc, grace_s=grace_s)
        _join(readers)
        raise CollectorError(
            tool, argv, None, "\n".join(tail),
            hint=f"stopped after {timeout_s:g} s; raise the timeout or bound the run "
            "(nsys --duration, ncu --launch-count)",
        ) from None
    except KeyboardInterrupt:
        stop_group(proc, grace_s=grace_s)
        _join(readers)
        raise
    _join(readers)
    if returncode != 0:
        raise CollectorError(tool, argv, returncode, "\n".join(tail))
    return CompletedRun(
        cmd=tuple(argv),
        returncode=returncode,
        stdout="".join(out) if capture_stdout else None,
        stderr_tail="\n".join(tail),
        duration_s=time.perf_counter() - started,
    )


def _join(readers: Sequence[threading.Thread | None], timeout_s: float = 5.0) -> None:
    # A grandchild that left the group may still hold the pipe open: never wait forever.
    for thread in readers:
        if thread is not None:
            thread.join(timeout_s)


def fresh_file(path: Path, since: float) -> bool:
    """True when ``path`` exists, is not empty and was written at or after ``since``
    (``time.time()``), so a previous run's output is never taken for this run's."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_size > 0 and st.st_mtime >= since - 1.0


@dataclass(frozen=True)
class Outcome:
    """How a profiling run ended when its output file was written.

    Attributes:
        partial: the run failed, timed out or was interrupted, but the output exists.
        interrupted: Ctrl-C stopped it (the caller re-raises after saving).
        warnings: one line per problem, for the manifest.
    """

    partial: bool = False
    interrupted: bool = False
    warnings: tuple[str, ...] = ()


def run_profiler(
    cmd: Sequence[str],
    output: Path,
    *,
    timeout_s: float | None,
    on_stderr: Callable[[str], None] | None = None,
) -> Outcome:
    """Run a profiler whose job is to write ``output``; keep that file whenever it exists.

    A failing or interrupted profiled program still leaves a usable report behind: then
    the run is partial (with a warning naming the command's status), not an error.

    Raises:
        ToolNotFoundError: the profiler is not on PATH.
        CollectorError: it failed and wrote no output.
        KeyboardInterrupt: Ctrl-C and no output was written.
    """
    since = time.time()
    try:
        run_tool(cmd, timeout_s=timeout_s, on_stderr=on_stderr)
    except CollectorError as exc:
        if not fresh_file(output, since):
            raise
        return Outcome(partial=True, warnings=(f"{exc.message}; kept the partial output {output}",))
    except KeyboardInterrupt:
        if not fresh_file(output, since):
            raise
        return Outcome(partial=True, interrupted=True,
                       warnings=(f"interrupted (Ctrl-C); kept the partial output {output}",))
    return Outcome()
