"""Every input file a reader opens, opened one way: the file-side half of the limits layer.

- :func:`regular_file`: an input is a regular file. A FIFO, a device (``/dev/zero``), a socket or a
  symbolic-link loop is one error line naming it, before anything is opened (opening a FIFO blocks
  until a writer comes; ``/dev/zero`` never ends).
- :func:`open_input`: the bytes of a file, decompressed by their content, never by the file's name:
  gzip, bzip2 and xz always; zstd where the ``zstandard`` package is installed (else one line saying
  how to decompress it). Every MiB of decompressed bytes read is checked against the memory budget
  and the deadline (:func:`perfscope.limits.check_memory`, :func:`~perfscope.limits.check_deadline`),
  so a small compressed file that expands without end stops with one line.
- :func:`read_csv` reads a CSV in chunks of :data:`CSV_CHUNK_ROWS` rows, counting each chunk against the
  event budget (:func:`perfscope.limits.take`) as it is read; :func:`load_json` reads JSON (integers of
  any size kept, nesting depth refused past Python's recursion limit) and counts its bytes as read.

Damaged compressed data, a damaged CSV and undecodable JSON are each one :class:`InputFormatError`
line naming the file and the fix.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import json
import lzma
import stat
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .errors import InputFormatError
from .limits import check_deadline, check_memory, take

if TYPE_CHECKING:
    import pandas as pd

BLOCK = 1 << 20
"""Bytes read between two checks of the memory budget and the deadline."""
CSV_CHUNK_ROWS = 100_000
"""Rows of a CSV read (and counted against ``--max-events``) at a time."""
MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
"""Leading bytes of the compressed formats read (by content, whatever the file is called)."""
DAMAGED = (gzip.BadGzipFile, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError)
"""What a decompressor raises on damaged or truncated data (bz2 raises OSError and ValueError)."""
KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def regular_file(path: str | Path) -> Path:
    """``path`` when it is a regular file (after following symbolic links).

    Raises:
        InputFormatError: missing, a symbolic-link loop, unreadable, or not a regular file.
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputFormatError(p, "is a loop of symbolic links", hint="give the file the links should lead to") \
                from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise InputFormatError(p, "no such file or folder", hint="check the path") from None
        raise InputFormatError(p, f"cannot be read ({exc.strerror or exc})", hint="check its permissions") from None
    if stat.S_ISREG(mode):
        return p
    kind = next((name for test, name in KINDS if test(mode)), "not a regular file")
    raise InputFormatError(p, f"is {kind}, not a regular file", hint="give the profiler's output file")


def compression_of(head: bytes) -> str | None:
    """``gzip``, ``zstd``, ``bzip2`` or ``xz`` when ``head`` (a file's first bytes) opens such a stream."""
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


def damaged(path: str | Path, exc: BaseException) -> InputFormatError:
    """The one error line of a damaged or truncated compressed file."""
    first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
    return InputFormatError(path, f"truncated or damaged compressed data ({first or type(exc).__name__})",
                            hint="re-export or re-download the file")


class _Blocks(io.RawIOBase):
    """A readable raw stream whose :meth:`readall` reads :data:`BLOCK` bytes at a time."""

    def readable(self) -> bool:
        return True

    def readall(self) -> bytes:
        parts = []
        while chunk := self.read(BLOCK):
            parts.append(chunk)
        return b"".join(parts)


class Stream(_Blocks):
    """A file's decompressed bytes; every :data:`BLOCK` read checks the memory budget and the deadline,
    and a decompression error is the file's one error line."""

    def __init__(self, path: Path, raw: IO[bytes], file: IO[bytes] | None = None, *, strict: bool = True) -> None:
        super().__init__()
        self.path, self.raw, self.file, self.strict = path, raw, file, strict
        self.count = 0
        self.next_check = BLOCK
        # a plain file reads straight into the caller's buffer: no fresh bytes per block to fault in,
        # copy and free (a 200 MB trace: 200 blocks of 1 MB)
        self.native_into = raw.readinto if isinstance(raw, io.BufferedReader) else None

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        try:
            data: bytes = self.raw.read(size)
        except DAMAGED as exc:
            if not self.strict:  # the caller keeps what was read before the damage
                raise
            raise damaged(self.path, exc) from None
        self._counted(len(data))
        return data

    def _counted(self, n: int) -> None:
        """Count ``n`` bytes read; each :data:`BLOCK` checks the memory budget and the deadline."""
        self.count += n
        if self.count >= self.next_check:
            self.next_check = self.count + BLOCK
            check_memory(self.path)
            check_deadline(self.path)

    def readinto(self, buffer: Any) -> int:
        if self.native_into is None:
            data = self.read(len(buffer))
            buffer[:len(data)] = data
            return len(data)
        try:
            n: int = self.native_into(buffer) or 0
        except DAMAGED as exc:
            if not self.strict:
                raise
            raise damaged(self.path, exc) from None
        self._counted(n)
        return n

    def close(self) -> None:
        try:
            self.raw.close()
            if self.file is not None:  # a decompressor does not close the file it was given
                self.file.close()
        finally:
            super().close()


class _Gzip(_Blocks):
    """A gzip stream inflated by Arrow's codec (pyarrow, already loaded with pandas: about a quarter less
    CPU than :class:`gzip.GzipFile`, measured on a 13 MB trace: 0.16 against 0.22 CPU-s), with the
    standard library's reader as the authority on damage: at Arrow's first error (truncated, damaged,
    trailing bytes, a CRC that does not match) the stream is reopened with :class:`gzip.GzipFile`, which
    skips the bytes already handed out and goes on from there. So every read gives what ``GzipFile``
    gives, and a damaged file ends exactly where, and with the error that, ``GzipFile`` ends it.

    (Inflating ahead on a thread was tried: on the shared 2-core machine it took nothing off the wall
    time, there being no idle core, and it took no less CPU.)"""

    def __init__(self, path: Path) -> None:
        super().__init__()
        import pyarrow as pa  # already loaded with pandas; a perfscope dependency

        self.path = path
        self.file: IO[bytes] | None = None  # the fallback's own handle
        self.pos = 0  # bytes handed out
        self.fast: Any = pa.CompressedInputStream(pa.OSFile(str(path)), "gzip")
        self.slow: gzip.GzipFile | None = None

    def _fallback(self) -> gzip.GzipFile:
        self.fast.close()  # Arrow closed it at the error: a no-op then
        self.fast = None
        self.file = open(self.path, "rb")  # noqa: SIM115 - closed with the stream
        slow = self.slow = gzip.GzipFile(fileobj=self.file, mode="rb")
        left = self.pos
        while left:  # the bytes Arrow handed out
            skipped = len(slow.read(min(left, BLOCK)))
            if not skipped:
                break
            left -= skipped
        return slow

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        if self.fast is not None:
            try:
                data: bytes = self.fast.read(size)
            except (OSError, ValueError):  # Arrow's IOError / ArrowInvalid: GzipFile decides
                data = self._fallback().read(size)
        else:
            data = self.slow.read(size)  # type: ignore[union-attr]
        self.pos += len(data)
        return data

    def close(self) -> None:
        try:
            if self.fast is not None:
                self.fast.close()
            if self.slow is not None:
                self.slow.close()
            if self.file is not None:
                self.file.close()
        finally:
            super().close()


def _zstd(path: Path, fh: IO[bytes]) -> IO[bytes]:
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        fh.close()
        raise InputFormatError(path, "is zstd-compressed, and the zstandard package is not installed",
                               hint=f"decompress it first (`zstd -d {path.name}`), or `pip install zstandard`") \
            from None
    return zstandard.ZstdDecompressor().stream_reader(fh, closefd=True)  # type: ignore[no-any-return]


def open_input(path: str | Path, *, strict: bool = True) -> Stream:
    """``path``'s bytes, decompressed by content (see the module doc); the caller closes the stream.
    ``strict``: damaged compressed data is the file's one error line (else the decompressor's own
    exception, for a reader that keeps what came before the damage).

    Raises:
        InputFormatError: not a regular file (:func:`regular_file`), or zstd without ``zstandard``.
    """
    p = regular_file(path)
    fh = open(p, "rb")  # noqa: SIM115 - handed to the stream, which closes it
    try:
        kind = compression_of(fh.read(8))
        fh.seek(0)
    except OSError as exc:
        fh.close()
        raise InputFormatError(p, f"cannot be read ({exc.strerror or exc})", hint="check the file") from None
    raw: Any
    if kind == "gzip":
        raw = _Gzip(p)
    elif kind == "bzip2":
        raw = bz2.BZ2File(fh, "rb")
    elif kind == "xz":
        raw = lzma.LZMAFile(fh, "rb")  # noqa: SIM115 - closed with the stream
    elif kind == "zstd":
        raw = _zstd(p, fh)
    else:
        raw = fh
    return Stream(p, raw, None if raw is fh else fh, strict=strict)


def read_bytes(path: str | Path) -> bytes:
    """All of ``path``'s decompressed bytes (memory budget and deadline checked each MiB)."""
    with open_input(path) as stream:
        return stream.readall()


def head_bytes(path: str | Path, size: int) -> bytes:
    """The first ``size`` decompressed bytes of ``path`` (fewer when it is shorter, or when the
    compressed data is damaged after them: a reader says so when it gets there)."""
    out = bytearray()
    with open_input(path, strict=False) as stream:
        try:
            while len(out) < size:
                chunk = stream.read(size - len(out))
                if not chunk:
                    break
                out += chunk
        except DAMAGED:
            pass
    return bytes(out)


def is_compressed(path: str | Path) -> str | None:
    """The compression of ``path``'s bytes (:func:`compression_of` of its first bytes), or None."""
    with open(regular_file(path), "rb") as fh:
        return compression_of(fh.read(8))


def read_text(path: str | Path) -> str:
    """``path`` decompressed and decoded as UTF-8 (undecodable bytes replaced)."""
    return read_bytes(path).decode("utf-8", "replace")


def read_csv(path: str | Path, hint: str, **kwargs: Any) -> pd.DataFrame:
    """A CSV file as a table, read in chunks of :data:`CSV_CHUNK_ROWS` rows, each counted against the
    event budget as it is read; a damaged one is one error line naming the file, with ``hint``."""
    import pandas as pd

    p = Path(path)
    parts = []
    try:
        with open_input(p) as stream:
            text = io.TextIOWrapper(io.BufferedReader(stream, BLOCK), encoding="utf-8", errors="replace", newline="")
            for chunk in pd.read_csv(text, chunksize=CSV_CHUNK_ROWS, **kwargs):
                take(p, len(chunk))
                parts.append(chunk)
    except pd.errors.EmptyDataError:
        raise InputFormatError(p, "is an empty CSV (no header)", hint=hint) from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OverflowError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise InputFormatError(p, f"damaged or truncated CSV ({first})", hint=hint) from None
    if not parts:
        return pd.DataFrame()
    return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def load_json(path: str | Path, hint: str) -> Any:
    """``path``'s JSON (decompressed by content); integers over 64 bits read exactly (Python's json
    after orjson refuses them); too deep a nesting, or damage, is one error line."""
    import orjson

    p = Path(path)
    data = read_bytes(p)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as fast:
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputFormatError(p, f"damaged or truncated JSON ({str(exc)[:160]})", hint=hint) from None
        except RecursionError:
            raise InputFormatError(p, "JSON nested too deeply (past Python's recursion limit)", hint=hint) from None
        except Exception:  # noqa: BLE001 - report the fast parser's reason when both fail oddly
            raise InputFormatError(p, f"damaged or truncated JSON ({str(fast)[:160]})", hint=hint) from None


__all__ = ["BLOCK", "CSV_CHUNK_ROWS", "DAMAGED", "MAGIC", "Stream", "compression_of", "damaged", "head_bytes",
           "is_compressed", "load_json",
           "open_input", "read_bytes", "read_csv", "read_text", "regular_file"]
