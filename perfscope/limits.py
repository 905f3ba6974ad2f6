"""The stated budget of an import: how many trace events, and how much memory, one file may take.

A 23 MB gzip can expand to 5.9 GB of events (31 million kernels); without a budget its import
grows the process past any memory the machine has. Two limits, checked while the events are read
(each block of about a MB), end such an import early with one :class:`InputFormatError` line
(exit 3) instead:

- ``--max-events N`` on ``perfscope import`` (:func:`budget`; the library: ``with budget(max_events=N)``);
- ``PERFSCOPE_MAX_MEMORY`` (bytes, with an optional K/M/G/T suffix: ``2G``): the process's
  resident memory while it reads the events (Linux ``/proc/self/statm``; not checked elsewhere).

Neither is set by default: a file is read whole, as before.

Every reader counts what it reads through :func:`take`: the Kineto reader its trace events (each block),
the SQLite readers the rows of each batch they fetch (:mod:`perfscope.safedb`), the CSV and JSON readers
the rows of each chunk (:mod:`perfscope.inputs`), the memory-snapshot reader its allocator events (each batch
of 1,000 as the unpickler streams them); one import's count runs across all of them
(:func:`counting`, which ``import_file`` opens).

A third limit, a deadline, is optional: ``PERFSCOPE_IMPORT_TIMEOUT`` (seconds) or ``budget(deadline_s=...)``
ends an import that runs longer with the same one line (:func:`check_deadline`, called by :func:`take`
and by the SQLite progress handler between rows).
"""

from __future__ import annotations

import math
import os
import re
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from .errors import InputFormatError, UsageError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

MEMORY_ENV = "PERFSCOPE_MAX_MEMORY"
TIMEOUT_ENV = "PERFSCOPE_IMPORT_TIMEOUT"
_MAX_EVENTS: ContextVar[int | None] = ContextVar("perfscope_max_events", default=None)
_DEADLINE_S: ContextVar[float | None] = ContextVar("perfscope_deadline_s", default=None)
_STARTED: ContextVar[float | None] = ContextVar("perfscope_import_started", default=None)
_TAKEN: ContextVar[list[int] | None] = ContextVar("perfscope_events_taken", default=None)
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@contextmanager
def budget(*, max_events: int | None = None, deadline_s: float | None = None) -> Iterator[None]:
    """Imports inside the block read at most ``max_events`` trace events and run at most ``deadline_s``
    seconds each (None: no limit; the deadline then comes from ``PERFSCOPE_IMPORT_TIMEOUT`` if set)."""
    if max_events is not None and (isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1):
        raise UsageError(f"--max-events must be a whole number of at least 1, got {max_events}")
    if deadline_s is not None and not (isinstance(deadline_s, (int, float)) and math.isfinite(deadline_s)
                                       and deadline_s > 0):
        raise UsageError(f"the import deadline must be a finite number of seconds > 0, got {deadline_s}")
    token = _MAX_EVENTS.set(max_events)
    deadline = _DEADLINE_S.set(deadline_s)
    try:
        yield
    finally:
        _MAX_EVENTS.reset(token)
        _DEADLINE_S.reset(deadline)


def deadline_s() -> float | None:
    """Seconds one import may run (``budget(deadline_s=)``, else ``PERFSCOPE_IMPORT_TIMEOUT``), or None.

    Raises:
        UsageError: ``PERFSCOPE_IMPORT_TIMEOUT`` is not a number of seconds > 0.
    """
    given = _DEADLINE_S.get()
    if given is not None:
        return given
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds > 0", hint="use e.g. 60")
    return value


def check_deadline(path: str | Path) -> None:
    """Raise the import's one-line error when it has run past its deadline (no-op without one, or
    outside :func:`counting`)."""
    started, limit = _STARTED.get(), deadline_s()
    if started is not None and limit is not None and time.monotonic() - started > limit:
        raise InputFormatError(path, f"the import ran past its deadline of {limit:g} s; nothing was written",
                               hint=f"raise {TIMEOUT_ENV}, or import a shorter trace")


def max_events() -> int | None:
    """The event budget of the current import, or None."""
    return _MAX_EVENTS.get()


def max_memory_bytes() -> int | None:
    """``PERFSCOPE_MAX_MEMORY`` in bytes, or None when unset.

    Raises:
        UsageError: a value that is not a size (``2G``, ``512M``, ``1000000000``).
    """
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"{MEMORY_ENV}={text!r} is not a size in bytes", hint="use e.g. 2G, 512M or 1000000000")
    return int(float(m.group(1)) * _SUFFIX[m.group(2).upper()])


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


@contextmanager
def counting() -> Iterator[None]:
    """One import: the events :func:`take` counts inside the block add up against the budget (a block
    inside another adds to the outer one's count)."""
    if _TAKEN.get() is not None:
        yield
        return
    token = _TAKEN.set([0])
    started = _STARTED.set(time.monotonic())
    try:
        yield
    finally:
        _TAKEN.reset(token)
        _STARTED.reset(started)


def check_memory(path: str | Path, total: int = 0) -> None:
    """Raise the import's one-line error when the process's resident memory is past
    ``PERFSCOPE_MAX_MEMORY`` (``total``: the events read so far, said in the message)."""
    memory_cap = max_memory_bytes()
    if memory_cap is not None and (rss := resident_bytes()) is not None and rss > memory_cap:
        raise InputFormatError(path, f"reading it took more than {MEMORY_ENV}={memory_cap:,} bytes "
                               f"({rss:,} resident after {total:,} events); nothing was written",
                               hint=f"raise {MEMORY_ENV}, or import a shorter trace")


def take(path: str | Path, n: int) -> int:
    """Count ``n`` more events (trace events, table rows) read from ``path`` against the budget, and
    return the import's count so far (``n`` alone outside :func:`counting`).

    Raises:
        InputFormatError: past ``--max-events``, or the process's resident memory past
            ``PERFSCOPE_MAX_MEMORY`` (one line naming the file, the limit and how to raise it).
    """
    box = _TAKEN.get()
    if box is not None:
        box[0] += n
    total = box[0] if box is not None else n
    cap = max_events()
    if cap is not None and total > cap:
        raise InputFormatError(path, f"more than {cap:,} events (the --max-events budget); nothing was written",
                               hint="raise --max-events, or import a shorter trace")
    check_memory(path, total)
    check_deadline(path)
    return total


__all__ = ["MEMORY_ENV", "TIMEOUT_ENV", "budget", "check_deadline", "check_memory", "counting", "deadline_s",
           "max_events", "max_memory_bytes", "resident_bytes", "take"]
