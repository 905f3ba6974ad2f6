"""The one exception root of perfscope and the exit codes the CLI maps it to.

Every message says what failed, where (the file or the command), and what to do next.
Library code raises these; only ``perfscope.cli`` turns them into one line on stderr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


class PerfscopeError(Exception):
    """Root of every error perfscope raises on purpose.

    Attributes:
        exit_code: the process exit status the CLI uses for this error.
    """

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(PerfscopeError):
    """A bad argument or option value given by the user."""

    exit_code = 2


class InputFormatError(PerfscopeError):
    """An input file (trace, export, checkpoint, report) that cannot be read.

    The message names the file and the reason; ``hint`` says how to fix it.
    """

    exit_code = 3

    def __init__(self, path: str | Path, reason: str, *, hint: str | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}", hint=hint)


class ReportFormatError(InputFormatError):
    """A ``.perfscope`` report folder that is missing, incomplete or of an unknown version."""


class CheckpointError(InputFormatError):
    """A model checkpoint folder that cannot be loaded into the reference engine."""


class ToolNotFoundError(PerfscopeError):
    """An external tool (nsys, ncu, a Python package) is not installed."""

    exit_code = 4

    def __init__(self, tool: str, hint: str) -> None:
        self.tool = tool
        super().__init__(f"{tool} is not available", hint=hint)


class CollectorError(PerfscopeError):
    """An external tool ran and failed; carries its command, exit code and stderr tail."""

    exit_code = 5

    def __init__(
        self,
        tool: str,
        cmd: Sequence[str],
        returncode: int | None,
        stderr_tail: str = "",
        *,
        hint: str | None = None,
    ) -> None:
        self.tool = tool
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        status = "timed out" if returncode is None else f"exited with {returncode}"
        tail = " | ".join(line for line in stderr_tail.strip().splitlines()[-3:] if line.strip())
        msg = f"{tool} {status}: {' '.join(self.cmd)}"
        if tail:
            msg += f" -- stderr: {tail}"
        super().__init__(msg, hint=hint)


class UnsupportedDeviceError(PerfscopeError):
    """The requested device is not present on this machine (for example ``--device cuda``)."""

    exit_code = 6


class OutputWriteError(PerfscopeError):
    """An output (report folder, HTML page, trace export) could not be written: the folder is
    not writable, a parent is a file, the disk is full, or the final rename failed. Whatever was
    partly written has been removed, and an existing report replaced with ``--force`` is kept."""

    exit_code = 5

    def __init__(self, path: str | Path, exc: OSError) -> None:
        import errno

        self.path = str(path)
        self.errno = exc.errno
        reason = exc.strerror or type(exc).__name__
        hints = {errno.EACCES: "write elsewhere, or make the folder writable",
                 errno.EPERM: "write elsewhere, or make the folder writable",
                 errno.EROFS: "the disk is read-only: write on another one",
                 errno.ENOSPC: "the disk is full: free space, or write on another disk",
                 errno.EDQUOT: "the disk quota is exceeded: free space, or write on another disk",
                 errno.ENOTDIR: "a parent of it is a file, not a folder: choose another output path",
                 errno.EEXIST: "a parent of it is a file, not a folder: choose another output path",
                 errno.ENAMETOOLONG: "the name is too long: choose a shorter one",
                 errno.EISDIR: "it is a folder: give a file name"}
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != self.path else ""
        super().__init__(f"cannot write {self.path}: {reason}{where}; nothing was written",
                         hint=hints.get(exc.errno or 0, "choose another output path"))


class OutputExistsError(PerfscopeError):
    """An output path exists and ``--force`` was not given; nothing was overwritten."""

    exit_code = 7

    def __init__(self, path: str | Path, flag: str = "--out") -> None:
        """``flag``: the option that names the output in the command that writes it (``-o`` for
        ``perfscope report`` and ``perfscope export``), so the hint names an option the user has."""
        self.path = str(path)
        super().__init__(
            f"{self.path} already exists; nothing was overwritten",
            hint=f"pass --force to replace it, or choose another {flag}",
        )
