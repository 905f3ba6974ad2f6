"""Every registered reader against its format's hostile corpus (tests/unit/hostile.py), by registration.

The readers are ``detect.READERS``; each format's generator is ``hostile.GENERATORS[format]``. A format
without a generator fails :func:`test_every_registered_reader_has_a_hostile_generator`, so a new reader
is fuzzed because it is registered, not because someone remembered.

Each case runs ``perfscope import CASE --out ...`` (the CLI, in a worker process) under the limits a
user sets (``--max-events 2000000``, ``PERFSCOPE_MAX_MEMORY=1200M``, ``PERFSCOPE_IMPORT_TIMEOUT=60``)
and must end, within 60 s and with the worker's peak resident memory under 1.5 GB, in either:

- exit 0 and a report that loads (no null roof in it), or
- one line on stderr (``perfscope: error: ...``, no traceback) and an exit code docs/limits.md lists
  (2 bad argument, 3 unreadable input, 4 tool missing, 5 output or OS error);

and ``/var/tmp`` must hold what it held before (SQLite temporary storage stays in memory).

Snapshot (pickle) cases run like every other format (the reader was rewritten for issue 40).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hostile

CASES = hostile.all_cases()
EXIT_CODES = {0, 2, 3, 4, 5}
"""The exit codes an import may end with (docs/limits.md)."""
SECONDS = 60
PEAK_BYTES = 1500 << 20


def _reset_peak() -> bool:
    """Start this process's peak resident memory afresh (Linux: ``5`` into ``/proc/self/clear_refs`` resets
    VmHWM), so that each case is judged by its own peak, not by an earlier case's in the same worker."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_bytes(reset: bool) -> int:
    """The peak resident memory since :func:`_reset_peak` (VmHWM), else since the process started."""
    if reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ENV = {"PERFSCOPE_MAX_MEMORY": "1200M", "PERFSCOPE_IMPORT_TIMEOUT": str(SECONDS)}
WORKERS = max(1, min(3, os.cpu_count() or 1))
MARK = "@@hostile@@ "
SNAPSHOT_XFAIL: dict[str, str] = {}
"""Snapshot cases the current reader fails (issue 40 rewrites it; the integrator flips these)."""


def missing_generators(readers: Any, generators: Any) -> list[str]:
    """The registered reader formats without a hostile generator."""
    return sorted(set(readers) - set(generators))


def test_every_registered_reader_has_a_hostile_generator() -> None:
    from perfscope.analysis.readers.detect import READERS

    assert missing_generators(READERS, hostile.GENERATORS) == [], "register a generator in tests/unit/hostile.py"


def test_a_reader_without_a_generator_is_named() -> None:
    from perfscope.analysis.readers.detect import READERS

    assert missing_generators({**READERS, "new-format": "perfscope.analysis.readers.new"},
                              hostile.GENERATORS) == ["new-format"]


BUDGET_XFAIL: dict[str, str] = {}  # a reader that does not count its events yet (none: the snapshot reader counts since issue 40)
NO_BUDGET = {"nsys-rep": "converted by the nsys tool, absent here (exit 4)"}


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=BUDGET_XFAIL[f]))
                                 if f in BUDGET_XFAIL else f for f in sorted(hostile.GENERATORS) if f not in NO_BUDGET])
def test_every_reader_counts_its_events_while_reading(fmt: str, fixtures_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-events`` stops every registered reader on its seed (a real file, or its writer's layout)."""
    from perfscope.cli import main

    make = dict(hostile.GENERATORS[fmt]())["seed"]
    path = make(fixtures_dir, tmp_path)
    assert main(["import", str(path), "--out", str(tmp_path / "r.perfscope"), "--max-events", "1", "--no-html"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than 1 events (the --max-events budget)" in err, err
    assert not (tmp_path / "r.perfscope").exists()


# ---------------------------------------------------------------------------- one case
def run_case(case: str, fixtures: Path, work: Path) -> dict[str, Any]:
    """Make and import one case; what happened (``ok`` and, when not, ``why``)."""
    from perfscope.cli import main
    from perfscope.report import Report

    folder = work / case.replace("/", "__")
    folder.mkdir(parents=True)
    reset = _reset_peak()
    started = time.monotonic()
    try:
        path = CASES[case](fixtures, folder)
        out = folder / "out.perfscope"
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            signal.alarm(SECONDS + 30)
            try:
                rc = main(["import", str(path), "--out", str(out), "--no-html", "--max-events", "2000000"])
            finally:
                signal.alarm(0)
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        seconds = time.monotonic() - started
        peak = _peak_bytes(reset)
        why = []
        if rc not in EXIT_CODES:
            why.append(f"exit {rc}")
        if "Traceback" in err.getvalue():
            why.append("a traceback")
        if rc != 0 and (len(lines) != 1 or not lines[0].startswith("perfscope: error: ")):
            why.append(f"not one error line: {lines[:3]}")
        if rc == 0:
            manifest = json.loads((out / "manifest.json").read_text())
            roofs = [r for group in ("compute", "memory") for r in ((manifest.get("device") or {}).get(group) or {}).values()]
            if any(r.get("value") is None for r in roofs):
                why.append("a null roof written")
            Report.load(out)
        if seconds > SECONDS:
            why.append(f"{seconds:.0f} s")
        if peak > PEAK_BYTES:
            why.append(f"peak RSS {peak >> 20} MB")
        return {"ok": not why, "why": "; ".join(why), "rc": rc, "line": lines[0] if lines else "", "s": round(seconds, 2),
                "peak_mb": peak >> 20}
    except BaseException as exc:  # noqa: BLE001 - the failure is the outcome
        return {"ok": False, "why": "".join(traceback.format_exception(exc))[-3000:]}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _timeout(signum: int, frame: Any) -> None:
    raise TimeoutError(f"the case ran past {SECONDS + 30} s (a hang)")


def _worker(fixtures: Path, work: Path) -> None:
    os.environ.update(ENV)
    signal.signal(signal.SIGALRM, _timeout)
    for line in sys.stdin:
        case = line.strip()
        print(MARK + json.dumps({"case": case, **run_case(case, fixtures, work)}), flush=True)


def run_cases(cases: list[str], fixtures: Path, work: Path) -> dict[str, dict[str, Any]]:
    """Each case's outcome, run in fresh worker processes (a worker that dies fails its remaining cases)."""
    n = min(WORKERS, len(cases))
    shares = [cases[i::n] for i in range(n)]
    procs = [subprocess.Popen([sys.executable, __file__, str(fixtures), str(work / f"w{i}")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in range(n)]
    for proc, share in zip(procs, shares):
        assert proc.stdin is not None
        proc.stdin.write("".join(f"{c}\n" for c in share))
        proc.stdin.close()
    results: dict[str, dict[str, Any]] = {}
    for proc, share in zip(procs, shares):
        got: dict[str, dict[str, Any]] = {}
        assert proc.stdout is not None
        while len(got) < len(share):
            ready, _, _ = select.select([proc.stdout], [], [], SECONDS + 90)
            line = proc.stdout.readline() if ready else ""
            if not line:
                proc.kill()
                why = "stopped answering" if not ready else f"died (exit {proc.wait()})"
                got.update({c: {"ok": False, "why": f"worker {why} on {share[len(got)]}"} for c in share[len(got):]})
                break
            if line.startswith(MARK):
                outcome = json.loads(line[len(MARK):])
                got[outcome.pop("case")] = outcome
        proc.wait()
        results.update(got)
    return results


def _var_tmp() -> set[str]:
    """SQLite's temporary files in /var/tmp (``etilqs_*``; other programs' files there are not ours to count)."""
    return {n for n in os.listdir("/var/tmp") if n.startswith("etilqs")} if os.path.isdir("/var/tmp") else set()


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, fixtures_dir: Path) -> dict[str, Any]:
    selected = [item.callspec.params["case"] for item in request.session.items
                if getattr(item, "callspec", None) and "case" in item.callspec.params and item.module is request.module]
    before = _var_tmp()
    with tempfile.TemporaryDirectory(prefix="perfscope-hostile-") as tmp:
        results = run_cases(selected, fixtures_dir, Path(tmp))
    return {"cases": results, "var_tmp_before": before, "var_tmp_after": _var_tmp()}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=SNAPSHOT_XFAIL[c]))
                                  if c in SNAPSHOT_XFAIL else c for c in CASES])
def test_hostile_input_ends_in_one_line_or_imports(case: str, outcomes: dict[str, Any]) -> None:
    got = outcomes["cases"][case]
    assert got["ok"], f"{case}: {got['why']}"


def test_var_tmp_is_unchanged(outcomes: dict[str, Any]) -> None:
    assert outcomes["var_tmp_after"] - outcomes["var_tmp_before"] == set()


if __name__ == "__main__":  # a worker of run_cases: case ids on stdin, outcomes on stdout
    _worker(Path(sys.argv[1]), Path(sys.argv[2]))
