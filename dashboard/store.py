"""Which reports the dashboard may serve, and loading them (cached).

Only report folders found under the given root folders are served. A report is named in the
UI by an opaque key ``"<root index>:<path relative to that root>"``; every key coming back from
the browser is checked again: no absolute paths, no ``..``, and the resolved folder (symlinks
followed) must still lie inside its root and be one of the reports discovery found.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from perfscope.errors import UsageError
from perfscope.report import MANIFEST, Report

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

MAX_DEPTH = 4
CACHE_SIZE = 8


@dataclass(frozen=True)
class Entry:
    """One servable report: its key (what the browser sees), label and folder."""

    key: str
    label: str
    path: Path


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _walk(root: Path) -> Iterable[Path]:
    """Report folders under ``root`` (not following symlinked folders, at most MAX_DEPTH deep)."""
    if (root / MANIFEST).is_file():
        yield root
        return
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        if (here / MANIFEST).is_file() and here != root:
            dirnames.clear()
            yield here
        elif depth >= MAX_DEPTH:
            dirnames.clear()
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))


class ReportStore:
    """The reports under some root folders, loaded on demand with an LRU cache."""

    def __init__(self, roots: Sequence[str | os.PathLike[str]], *, rescan_s: float = 5.0) -> None:
        self.roots = tuple(Path(r).resolve() for r in roots)
        self._rescan_s = rescan_s
        self._scanned: tuple[float, list[Entry]] | None = None

    def entries(self) -> list[Entry]:
        """Every report under the roots (rescanned at most every ``rescan_s`` seconds)."""
        now = time.monotonic()
        if self._scanned is None or now - self._scanned[0] > self._rescan_s:
            self._scanned = (now, self._scan())
        return list(self._scanned[1])

    def _scan(self) -> list[Entry]:
        out = []
        for i, root in enumerate(self.roots):
            if not root.is_dir():
                continue
            for folder in _walk(root):
                real = folder.resolve()
                if not _inside(real, root):
                    continue  # a symlink pointing out of the root
                rel = folder.relative_to(root).as_posix() if folder != root else "."
                label = f"{root.name}/{rel}" if rel != "." else root.name
                out.append(Entry(f"{i}:{rel}", label, real))
        return out

    def resolve(self, key: str) -> Path:
        """The folder of report ``key``; raises UsageError for anything not servable."""
        index, sep, rel = str(key).partition(":")
        if not sep or not index.isdigit() or int(index) >= len(self.roots):
            raise UsageError(f"unknown report {str(key)[:200]!r}")
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or "\\" in rel or rel.startswith("~"):
            raise UsageError(f"report path {rel!r} is outside the served folders")
        root = self.roots[int(index)]
        try:
            target = (root / pure).resolve()
            servable = _inside(target, root) and (target / MANIFEST).is_file()
        except (OSError, ValueError):  # a name too long, a NUL byte: no such report
            servable = False
        if not servable:
            raise UsageError(f"report path {rel[:200]!r} is outside the served folders")
        if target not in {e.path for e in self.entries() if e.key.startswith(f"{index}:")}:
            raise UsageError(f"report path {rel!r} is not a served report")
        return target

    def load(self, key: str) -> Report:
        """The Report behind ``key`` (cached; reloaded when its manifest changes)."""
        path = self.resolve(key)
        return _load(str(path), (path / MANIFEST).stat().st_mtime_ns)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _load(path: str, mtime_ns: int) -> Report:
    return Report.load(path)
