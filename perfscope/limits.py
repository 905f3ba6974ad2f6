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
the nsys and rocpd readers the rows of each table they query, the rocprof CSV readers the rows of each
file; one import's count runs across all of them (:func:`counting`, which ``import_file`` opens).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from .errors import InputFormatError, UsageError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

MEMORY_ENV = "PERFSCOPE_MAX_MEMORY"
_MAX_EVENTS: ContextVar[int | None] = ContextVar("perfscope_max_events", default=None)
_TAKEN: ContextVar[list[int] | None] = ContextVar("perfscope_events_taken", default=None)
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@contextmanager
def budget(*, max_events: int | None = None) -> Iterator[None]:
    """Imports inside the block read at most ``max_events`` trace events (None: no limit)."""
    if max_events is not None and max_events < 1:
        raise UsageError(f"--max-events must be at least 1, got {max_events}")
    token = _MAX_EVENTS.set(max_events)
    try:
        yield
    finally:
        _MAX_EVENTS.reset(token)


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
    try:
        yield
    finally:
        _TAKEN.reset(token)


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
    cap, memory_cap = max_events(), max_memory_bytes()
    if cap is not None and total > cap:
        raise InputFormatError(path, f"more than {cap:,} events (the --max-events budget); nothing was written",
                               hint="raise --max-events, or import a shorter trace")
    if memory_cap is not None and (rss := resident_bytes()) is not None and rss > memory_cap:
        raise InputFormatError(path, f"reading it took more than {MEMORY_ENV}={memory_cap:,} bytes "
                               f"({rss:,} resident after {total:,} events); nothing was written",
                               hint=f"raise {MEMORY_ENV}, or import a shorter trace")
    return total


__all__ = ["MEMORY_ENV", "budget", "counting", "max_events", "max_memory_bytes", "resident_bytes", "take"]
