"""torch.profiler collector: run Python work (a callable or a script) under the PyTorch profiler
with shapes recorded, and write its Kineto trace (``trace.json.gz``) for analysis.

Equivalent code::

    with torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True) as prof:
        work()
    prof.export_chrome_trace("trace.json")

An interrupted run (Ctrl-C, or the profiled script raising) still exports what was recorded and
the capture is marked partial; the caller decides whether to re-raise.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import runpy
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from perfscope.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

T = TypeVar("T")
INTERRUPTED = "interrupted (Ctrl-C)"
"""``TorchCapture.error`` when Ctrl-C stopped the profiled work."""


@dataclass(frozen=True)
class TorchCapture:
    """What a torch.profiler run produced."""

    trace_path: Path
    wall_s: float
    cuda: bool
    partial: bool = False
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    torch_version: str = ""
    memory_snapshot: Path | None = None  # CUDA memory snapshot of the run (profile --memory on CUDA)
    torch_peak_allocated_bytes: float | None = None  # torch.cuda.max_memory_allocated() of the run

    @property
    def interrupted(self) -> bool:
        """Ctrl-C (KeyboardInterrupt) stopped the profiled work."""
        return self.error == INTERRUPTED


MEMORY_HISTORY_ENTRIES = 1_000_000
"""Allocator events a CUDA memory history keeps (a ring: older ones drop out); about 0.3 KB each
without stacks beyond Python's."""


def _activities(cuda: bool) -> list[Any]:
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if cuda:
        acts.append(ProfilerActivity.CUDA)
    return acts


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence native writes to fd 2 (libkineto prints ``USDT: profiler_start`` lines there)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def start_profiler(cuda: bool, *, with_stack: bool = False, memory: bool = False) -> Any:
    """An entered torch.profiler session (shapes recorded; ``memory``: ``profile_memory``, every
    allocation and free as a ``[memory]`` event); stop it with :func:`stop_profiler`."""
    from torch.profiler import profile

    prof = profile(activities=_activities(cuda), record_shapes=True, with_stack=with_stack, profile_memory=memory)
    with quiet_native_stderr():
        prof.__enter__()
    return prof


def stop_profiler(prof: Any) -> None:
    with quiet_native_stderr():
        prof.__exit__(None, None, None)


def _export(prof: Any, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        target = out_dir / "trace.json.gz"
        with open(raw, "rb") as src, gzip.open(target, "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return target


def profile_callable(fn: Callable[[], T], out_dir: Path, *, cuda: bool = False,
                     with_stack: bool = False, memory: bool = False) -> tuple[T | None, TorchCapture]:
    """Run ``fn`` under torch.profiler and export its trace into ``out_dir``.

    Returns:
        (fn's result or None when it was interrupted, the capture). A KeyboardInterrupt or an
        exception from ``fn`` is caught, recorded in ``TorchCapture.error`` and the capture is
        marked partial: the caller re-raises if it must.
    """
    import torch

    result: T | None = None
    error: str | None = None
    t0 = time.perf_counter()
    history = memory and cuda
    if history:  # the allocator's own peak, and its event history for a snapshot
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
    prof = start_profiler(cuda, with_stack=with_stack, memory=memory)
    try:
        result = fn()
    except KeyboardInterrupt:
        error = INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - any failure of the profiled program: keep what was collected
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if cuda:
            torch.cuda.synchronize()
        stop_profiler(prof)
    wall = time.perf_counter() - t0
    snapshot, peak = None, None
    if history:
        peak = float(torch.cuda.max_memory_allocated())
        out_dir.mkdir(parents=True, exist_ok=True)
        snapshot = out_dir / "memory_snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)
    path = _export(prof, out_dir)
    warnings = [f"the profiled work stopped early: {error}; the report holds what ran"] if error else []
    return result, TorchCapture(path, wall, cuda, partial=error is not None, error=error,
                                warnings=warnings, torch_version=torch.__version__, memory_snapshot=snapshot,
                                torch_peak_allocated_bytes=peak)


def script_target(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """Parse ``python [-m mod | script.py] args...`` (or ``script.py args``) into (kind, target, argv).

    Raises:
        UsageError: nothing to run, or a target that is not a Python script or module.
    """
    args = list(argv)
    if args and Path(args[0]).name.startswith("python"):
        args = args[1:]
    if not args:
        raise UsageError("no Python script to profile", hint="perfscope profile --collector torch -- python script.py")
    if args[0] == "-m":
        if len(args) < 2:
            raise UsageError("-m needs a module name", hint="-- python -m package.module args")
        return "module", args[1], args[1:]
    if not args[0].endswith(".py"):
        raise UsageError(f"the torch collector runs Python code, not {args[0]!r}",
                         hint="use --collector nsys or ncu for other programs")
    script = Path(args[0])
    if not script.is_file():
        raise UsageError(f"{script}: no such script", hint="check the path")
    return "script", str(script), args


def run_script(argv: Sequence[str]) -> None:
    """Run a Python script or module in this process as ``__main__`` with ``sys.argv`` set."""
    kind, target, args = script_target(argv)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = args
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"the script exited with status {exc.code}") from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
