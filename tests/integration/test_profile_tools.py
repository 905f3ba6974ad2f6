"""`perfscope profile --collector nsys|ncu -- CMD` wiring, end to end through the CLI.

nsys and ncu cannot run on this CPU-only machine, so these tests put a stand-in ``nsys`` on PATH
that behaves like the real one at its interface (runs the command, writes the report, exports a
real SQLite file: a copy of a real nsys fixture). Everything after it — import, report, HTML —
is the real code. On a GPU machine tests/gpu runs the real tools.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap

import pytest

from perfscope.cli import main
from perfscope.report import Report

FAKE_NSYS = textwrap.dedent("""\
    #!{python}
    import shutil, subprocess, sys
    args = sys.argv[1:]
    if args and args[0] == "--version":
        print("NVIDIA Nsight Systems version 2024.6.2.225-246235244400v0")
        sys.exit(0)
    opt = {{a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--") and "=" in a}}
    if args[0] == "profile":
        target = [a for a in args[1:] if not a.startswith("--")]
        rc = subprocess.call(target)
        open(opt["--output"] + ".nsys-rep", "wb").write(b"stand-in report")
        sys.exit(rc)
    if args[0] == "export":
        shutil.copyfile({fixture!r}, opt["--output"])
        sys.exit(0)
    sys.exit(2)
""")


@pytest.fixture
def nsys_on_path(tmp_path, fixtures_dir, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(FAKE_NSYS.format(python=sys.executable,
                                    fixture=str(fixtures_dir / "nsys" / "nvfuser_h100_matmul.sqlite")))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return exe


def test_nsys_collector_writes_an_imported_report_with_its_commands(tmp_path, nsys_on_path):
    out = tmp_path / "gpu.perfscope"
    marker = tmp_path / "ran.txt"
    code = main(["profile", "--collector", "nsys", "--out", str(out), "-q", "--",
                 sys.executable, "-c", f"open({str(marker)!r}, 'w').write('yes')"])
    assert code == 0
    assert marker.read_text() == "yes"  # the profiled program really ran
    r = Report.load(out)
    assert r.manifest["source"]["tool"] == "nsys"
    assert r.manifest["command"][0][:2] == ["nsys", "profile"]
    assert "--cuda-graph-trace=node" in r.manifest["command"][0]
    assert r.manifest["command"][1][:2] == ["nsys", "export"]
    assert len(r.kernels) == 19 and (r.kernels["bound"] == "unknown").all()
    assert (out / "raw" / "nsys.sqlite").is_file() and (out / "report.html").is_file()


def test_failing_program_under_nsys_reports_its_exit(tmp_path, nsys_on_path):
    code = main(["profile", "--collector", "nsys", "--out", str(tmp_path / "f.perfscope"), "-q", "--",
                 sys.executable, "-c", "import sys; sys.exit(3)"])
    # the program failed but nsys wrote a report: it is kept, marked partial, with the exit in a warning
    assert code == 0
    r = Report.load(tmp_path / "f.perfscope")
    assert r.manifest["partial"] is True
    assert any("exited with 3" in w for w in r.warnings)


def test_missing_tools_give_an_install_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["profile", "--collector", "ncu", "--", "python", "x.py"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ncu is not available" in err
