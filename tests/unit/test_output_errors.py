"""Output folders that cannot be written: one error line naming the path and the fix, exit 5, and
nothing left behind (no temporary folder, no parent made for it, an existing report kept whole).

The failures are real where the file system gives them to any user (a parent that is a file; a
folder without write permission when not root); a full disk and a failing rename are raised by
the OS call itself, patched, since no test can fill a disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.errors import OutputWriteError

TRACE = "kineto/hta_triton_example__triton_example.json.gz"


def _import(fixtures_dir: Path, out: Path, *extra: str) -> int:
    return main(["import", str(fixtures_dir / TRACE), "--out", str(out), *extra])


def _one_error_line(err: str, path: Path, fix: str) -> None:
    lines = [line for line in err.splitlines() if line.strip() and "warning:" not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("perfscope: error: cannot write ") and str(path) in lines[0] and fix in lines[0], err
    assert "Traceback" not in err


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_parent_is_a_file(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "deeper" / "r.perfscope"
    assert _import(fixtures_dir, out) == 5
    _one_error_line(capsys.readouterr().err, out, "a parent of it is a file")
    assert _listing(tmp_path) == {"afile"} and (tmp_path / "afile").read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; the patched test covers it")
def test_folder_not_writable(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        out = ro / "r.perfscope"
        assert _import(fixtures_dir, out) == 5
        _one_error_line(capsys.readouterr().err, out, "make the folder writable")
        assert _listing(ro) == set()
    finally:
        ro.chmod(0o755)


def _fail(monkeypatch: pytest.MonkeyPatch, target: str, code: int, *, when: str = "") -> None:
    """Make ``target`` (module.attr) raise OSError ``code`` when its first argument contains ``when``."""
    import importlib

    module, attr = target.rsplit(".", 1)
    mod = importlib.import_module(module)
    real = getattr(mod, attr)

    def failing(*args, **kwargs):
        if when in str(args[0]):
            raise OSError(code, os.strerror(code), str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, attr, failing)


@pytest.mark.parametrize(("code", "fix"), [(errno.EACCES, "make the folder writable"), (errno.ENOSPC, "the disk is full"),
                                           (errno.EROFS, "read-only")])
def test_write_failing_midway(fixtures_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str], code: int, fix: str) -> None:
    """The tables are written, then the manifest's write fails (as a full disk fails the next write)."""
    _fail(monkeypatch, "perfscope.report.write_manifest", code)
    out = tmp_path / "new" / "r.perfscope"
    assert _import(fixtures_dir, out) == 5
    _one_error_line(capsys.readouterr().err, out, fix)
    assert _listing(tmp_path) == set()  # the temporary folder and the parent made for it are gone


def test_rename_failing_under_force_keeps_the_old_report(fixtures_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.perfscope"
    assert _import(fixtures_dir, out, "--no-html") == 0
    before = {p: (out / p).read_bytes() for p in _listing(out) if (out / p).is_file()}
    capsys.readouterr()
    # the old report is moved aside, then the rename of the new one into place fails
    _fail(monkeypatch, "os.replace", errno.EXDEV, when=".r.perfscope.tmp-")
    assert _import(fixtures_dir, out, "--force") == 5
    _one_error_line(capsys.readouterr().err, out, "choose another output path")
    assert _listing(tmp_path) == {"r.perfscope", *(f"r.perfscope/{p}" for p in _listing(out))}
    assert {p: (out / p).read_bytes() for p in _listing(out) if (out / p).is_file()} == before


def test_html_and_trace_exports_map_the_same_errors(fixtures_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.perfscope"
    assert _import(fixtures_dir, report, "--no-html") == 0
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    for argv, path in ((["report", str(report), "-o", str(tmp_path / "afile" / "r.html")], "afile/r.html"),
                       (["export", str(report), "-o", str(tmp_path / "afile" / "t.json"), "--format", "chrome"],
                        "afile/t.json")):
        assert main(argv) == 5, argv
        _one_error_line(capsys.readouterr().err, tmp_path / path, "a parent of it is a file")
    assert _listing(tmp_path) - {"afile"} == {"r.perfscope", *(f"r.perfscope/{p}" for p in _listing(report))}


def test_the_error_names_the_path_and_carries_the_os_reason(tmp_path: Path) -> None:
    exc = OutputWriteError(tmp_path / "x", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert exc.exit_code == 5 and str(tmp_path / "x") in str(exc) and os.strerror(errno.ENOSPC) in str(exc)


def test_an_unmapped_os_error_is_one_line(fixtures_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's last net: an OSError no library code mapped is one line naming its file."""
    from perfscope.analysis.readers import detect

    def broken(path, *a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(detect, "import_file", broken)
    assert _import(fixtures_dir, tmp_path / "r.perfscope") == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and TRACE in err and "Permission denied" in err and "Traceback" not in err


def test_a_name_too_long(fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by the fuzzer: Path.exists() raises ENAMETOOLONG before anything is written."""
    out = tmp_path / ("x" * 300 + ".perfscope")
    assert _import(fixtures_dir, out) == 5
    _one_error_line(capsys.readouterr().err, out, "too long")
    assert _listing(tmp_path) == set()


def test_report_without_o_keeps_the_force_rule_for_the_folders_own_html(fixtures_dir: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45: `perfscope report FOLDER` overwrote the folder's own report.html without --force; it
    now refuses like every other writer (exit 7, nothing touched), and --force replaces it."""
    out = tmp_path / "r.perfscope"
    assert _import(fixtures_dir, out, "--no-html") == 0
    own = out / "report.html"
    own.write_text("keep me")
    assert main(["report", str(out)]) == 7
    assert "already exists" in capsys.readouterr().err and own.read_text() == "keep me"
    assert main(["report", str(out), "--force"]) == 0
    assert own.read_text().startswith("<!DOCTYPE html") or "<html" in own.read_text()[:500]
