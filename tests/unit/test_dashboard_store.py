"""Which reports the dashboard serves: only those under its folders (traversal and symlinks
rejected), cached loads, loopback detection, and the CLI's checks and warning."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfscope.dashboard.store import ReportStore
from perfscope.errors import UsageError
from perfscope.hosts import is_loopback
from tests.unit.dashboard_reports import engine


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tree")
    root, outside = base / "served", base / "secret"
    report = engine()
    report.save(root / "runs" / "a.perfscope")
    report.save(root / "deep" / "x" / "b.perfscope")
    report.save(outside / "c.perfscope")
    (root / "runs" / "escape.perfscope").symlink_to(outside / "c.perfscope", target_is_directory=True)
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    (root / "notes").mkdir()
    return {"root": root, "outside": outside}


def test_discovery_lists_reports_inside_the_root_only(tree: dict[str, Path]) -> None:
    store = ReportStore([tree["root"]])
    assert sorted(e.key for e in store.entries()) == ["0:deep/x/b.perfscope", "0:runs/a.perfscope"]
    assert all(str(e.path).startswith(str(tree["root"].resolve())) for e in store.entries())


@pytest.mark.parametrize("key", [
    "0:../secret/c.perfscope", "0:runs/../../secret/c.perfscope", "0:..", "0:/etc", "0:/",
    "0:runs/escape.perfscope", "0:linkdir/c.perfscope", "1:runs/a.perfscope", "runs/a.perfscope",
    "x:runs/a.perfscope", "0:notes", "0:~/x", "0:runs\\..\\..\\secret", "-1:runs/a.perfscope",
])
def test_traversal_and_symlink_escapes_are_rejected(tree: dict[str, Path], key: str) -> None:
    store = ReportStore([tree["root"]])
    with pytest.raises(UsageError):
        store.load(key)


def test_a_root_that_is_itself_a_report(tree: dict[str, Path]) -> None:
    store = ReportStore([tree["root"] / "runs" / "a.perfscope"])
    (entry,) = store.entries()
    assert entry.key == "0:." and len(store.load("0:.").kernels) == len(engine().kernels)


def test_loads_are_cached_until_the_report_changes(tree: dict[str, Path]) -> None:
    store = ReportStore([tree["root"]])
    first = store.load("0:runs/a.perfscope")
    assert store.load("0:runs/a.perfscope") is first
    engine().save(tree["root"] / "runs" / "a.perfscope", force=True)
    store = ReportStore([tree["root"]], rescan_s=0)
    assert store.load("0:runs/a.perfscope") is not first


@pytest.mark.parametrize("host,expected", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True),
                                           ("localhost", True), ("0.0.0.0", False), ("192.168.1.5", False),
                                           ("::", False), ("example.org", False)])
def test_loopback_detection(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_rejects_missing_folders() -> None:
    from perfscope.cli import main

    assert main(["dashboard", "/nonexistent/perfscope-reports"]) == 2


def test_cli_warns_when_exposed_and_serves_only_its_folder(tree: dict[str, Path]) -> None:
    port = _free_port()
    exe = Path(sys.executable).with_name("perfscope")
    proc = subprocess.Popen([str(exe), "dashboard", str(tree["root"]), "--host", "0.0.0.0", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        warning = proc.stderr.readline() if proc.stderr else ""
        assert "warning: serving on 0.0.0.0" in warning and "no authentication" in warning
        import urllib.request

        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_dash-layout", timeout=5) as resp:
                    body = resp.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        listed = json.loads(body)["props"]["children"][0]["props"]["children"][1]["props"]["options"]
        assert [o["value"] for o in listed] == ["0:deep/x/b.perfscope", "0:runs/a.perfscope"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
