"""Where an output goes: the one rule every ``--out`` / ``-o`` follows (``profile``, ``import``,
``loadtest``, ``sweep``, ``whatif``, ``report -o``, ``export -o``).

For a command that writes one output with the extension ``.EXT`` (``.perfscope`` for a report folder,
``.html`` for ``report``, ``.pftrace`` or ``.json`` for ``export``):

- ``PATH.EXT``: exactly that (``--out run.perfscope``, ``-o trace.pftrace``);
- ``PATH`` without that extension: ``PATH.EXT`` (``--out run`` writes ``run.perfscope``; a name with
  another dot keeps it: ``--out run.v2`` writes ``run.v2.perfscope``);
- ``PATH/`` (a trailing slash), or a folder that exists and is not a report: that folder, the output
  inside it under the command's own name (``--out runs/`` writes ``runs/20261204-120000-small.perfscope``;
  ``report R -o out/`` writes ``out/NAME.html``); the folder is made when missing.

A command that writes several outputs (``whatif`` with several questions) takes ``--out`` as a folder:
each output inside it under its own name (``PATH``, ``PATH/`` alike); a name ending in ``.EXT`` is
refused (a folder named like a report would be taken for one). ``analyze``, ``report``, ``whatif`` and
every reader open a folder that holds exactly one report as that report (:func:`single_report`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputFormatError, UsageError
from .report import MANIFEST, REPORT_SUFFIX

__all__ = ["REPORT_SUFFIX", "is_folder_target", "out_folder", "out_path", "single_report"]


def _text(path: str | os.PathLike[str]) -> str:
    return os.fspath(path)


def is_folder_target(path: str | os.PathLike[str]) -> bool:
    """``path`` names a folder to write into: a trailing slash, or an existing folder that is not a report."""
    text = _text(path)
    if text.endswith(("/", os.sep)):
        return True
    p = Path(text)
    try:
        return p.is_dir() and not (p / MANIFEST).is_file()
    except OSError:  # a name too long, a parent that cannot be read: not a folder; the write says why
        return False


def out_path(out: str | os.PathLike[str] | None, *, default: str | os.PathLike[str], suffix: str = REPORT_SUFFIX,
             also: tuple[str, ...] = (), name: str | None = None) -> Path:
    """The path of one output (the module's rule).

    Args:
        out: what the user gave (None: ``default``).
        default: the output's path when ``out`` is None; its name is the name inside a folder ``out``.
        suffix: the output's extension (``.perfscope``, ``.html``, ``.pftrace``).
        also: other extensions that name this output as they are (``.htm`` for HTML).
        name: the output's name inside a folder ``out`` (default: ``default``'s name).
    """
    if out is None:
        return Path(default)
    if is_folder_target(out):
        return Path(_text(out).rstrip("/" + os.sep) or "/") / (name or Path(default).name)
    p = Path(out)
    return p if p.name.endswith((suffix, *also)) else p.with_name(p.name + suffix)


def out_folder(out: str | os.PathLike[str], *, suffix: str = REPORT_SUFFIX, flag: str = "--out") -> Path:
    """The folder several outputs go into (the module's rule).

    Raises:
        UsageError: ``out`` ends in ``suffix`` (a folder of reports named like one report)."""
    text = _text(out).rstrip("/" + os.sep)
    if text.endswith(suffix):
        raise UsageError(f"{flag} {_text(out)}: several outputs go into a folder, and a name ending in {suffix} "
                         "names one", hint=f"give a folder ({flag} {text[: -len(suffix)] or 'out'}/), or ask one question")
    return Path(text or "/")


def single_report(folder: str | os.PathLike[str]) -> Path | None:
    """The one report folder directly inside ``folder`` (a folder that is not itself a report); None when it
    holds none.

    Raises:
        InputFormatError: it holds several (one line naming them)."""
    p = Path(folder)
    try:
        if not p.is_dir() or (p / MANIFEST).is_file():
            return None
    except OSError:
        return None
    found = sorted(c for c in p.iterdir() if c.is_dir() and (c / MANIFEST).is_file())
    if len(found) > 1:
        names = ", ".join(c.name for c in found[:5]) + (", ..." if len(found) > 5 else "")
        raise InputFormatError(p, f"holds {len(found)} reports ({names})", hint="give one of them")
    return found[0] if found else None
