"""Per-object memo: derived data (indexes, factorized names, masks) computed once per Report or table.

A Report is immutable, so anything derived from it can be kept as long as the object lives.
Entries are keyed by the object's identity and dropped when it is garbage collected; this is
what keeps the Dash callbacks on a 1M-kernel report from redoing the same preparation work.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

_STORE: dict[int, dict[str, Any]] = {}
_LOCK = threading.Lock()


def memo(owner: object, key: str, build: Callable[[], T]) -> T:
    """Return ``build()`` computed once for ``(owner, key)``.

    Args:
        owner: an immutable object (a Report) that supports weak references.
        key: names the derived value.
        build: computes it; called at most once per live owner and key.
    """
    oid = id(owner)
    with _LOCK:
        slot = _STORE.get(oid)
        if slot is None:
            slot = _STORE[oid] = {}
            weakref.finalize(owner, _STORE.pop, oid, None)
        if key in slot:
            return slot[key]  # type: ignore[no-any-return]
    value = build()
    with _LOCK:
        slot.setdefault(key, value)
        return slot[key]  # type: ignore[no-any-return]


def memo_size() -> int:
    """How many owners currently have memoized values (for tests)."""
    return len(_STORE)


def memo_peek(owner: object, key: str) -> Any:
    """The value memoized for ``(owner, key)``, or None when none is (nothing is built)."""
    with _LOCK:
        slot = _STORE.get(id(owner))
        return None if slot is None else slot.get(key)


def memo_seed(owner: object, key: str, value: Any) -> None:
    """Memoize ``value`` for ``(owner, key)`` (a value its maker knows already; kept when one is there)."""
    memo(owner, key, lambda: value)


def memo_prefixed(owner: object, prefix: str) -> dict[str, Any]:
    """Every value memoized for ``owner`` under a key starting with ``prefix``."""
    with _LOCK:
        slot = _STORE.get(id(owner)) or {}
        return {k: v for k, v in slot.items() if k.startswith(prefix)}


TRIM_MIN_ROWS = 2_000_000
"""Tables from this many rows have the C heap trimmed between the import's large steps."""


def release_free_memory(rows: int) -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; nothing elsewhere) after a step
    over ``rows`` rows, when they are :data:`TRIM_MIN_ROWS` or more.

    An import frees many arrays of a few MB (a chunk's working arrays, a reader's batches) that glibc keeps
    in its heap, below its mmap threshold: they count in the process's resident memory until trimmed, while
    the next large arrays (mmapped) come on top. Trimming costs later allocations their page faults again
    (the HTML's rules after a 1.25M-kernel import: ~1.3 CPU-s), so it is done only where memory is what
    runs out (5M kernels: the import's peak 4.83 -> 4.73 GB)."""
    trim = _malloc_trim() if rows >= TRIM_MIN_ROWS else None
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def memo_drop(owner: object, key: str) -> None:
    """Forget the value memoized for ``(owner, key)`` (its memory freed; built again when next asked)."""
    with _LOCK:
        slot = _STORE.get(id(owner))
        if slot is not None:
            slot.pop(key, None)
