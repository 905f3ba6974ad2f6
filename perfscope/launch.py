"""The ``perfscope`` console script and ``python -m perfscope``.

Importing the CLI takes a second or more (pandas, the collectors): a Ctrl-C then, before any
command has started, is one line (``perfscope: interrupted``) and exit status 130, never a
``KeyboardInterrupt`` traceback. This module imports nothing heavy itself.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

INTERRUPTED = 130


def _interrupted() -> int:
    try:
        sys.stderr.write("perfscope: interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError, KeyboardInterrupt):
        pass
    return INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Import the CLI and run it; Ctrl-C anywhere in between is exit status 130 in one line."""
    try:
        from perfscope.cli import main as cli_main
    except KeyboardInterrupt:
        return _interrupted()
    try:
        return cli_main(argv)
    except KeyboardInterrupt:  # between the CLI's own handlers (its last lines, its exit)
        return _interrupted()


def run() -> None:
    """The console script's entry: :func:`main`'s status as the process's."""
    try:
        code = main()
    except KeyboardInterrupt:
        code = _interrupted()
    sys.exit(code)


__all__ = ["main", "run"]
