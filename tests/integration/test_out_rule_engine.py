"""The ``--out`` rule (perfscope/outpaths.py, tests/unit/test_out_rule.py) on the commands that run the
engine: ``profile``, ``loadtest`` and ``sweep`` with the tiny model on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.report import Report

pytestmark = pytest.mark.slow


def test_profile_into_a_folder_and_by_name(tmp_path: Path) -> None:
    base = ["profile", "--model", "tiny", "--prompt-len", "8", "--gen-len", "3", "--device", "cpu", "--no-html", "-q",
            "--no-baseline", "--gemm-curve-s", "0"]
    assert main([*base, "--out", f"{tmp_path}/runs/"]) == 0
    (only,) = (tmp_path / "runs").iterdir()
    assert only.name.endswith("-tiny.perfscope") and Report.load(only).params["model"] == "tiny"
    assert main([*base, "--out", str(tmp_path / "named")]) == 0
    assert Report.load(tmp_path / "named.perfscope").params["model"] == "tiny"


def test_loadtest_by_name(tmp_path: Path) -> None:
    assert main(["loadtest", "--model", "tiny", "--rate", "20", "--requests", "3", "--no-html", "--json",
                 "--out", str(tmp_path / "lt")]) == 0
    assert (tmp_path / "lt.perfscope" / "manifest.json").is_file()


def test_sweep_into_a_folder(tmp_path: Path) -> None:
    assert main(["sweep", "--model", "tiny", "--batch", "1", "--prompt-len", "8", "--gen-len", "2", "--device", "cpu",
                 "--no-html", "--json", "--out", f"{tmp_path}/s/"]) == 0
    (only,) = (tmp_path / "s").iterdir()
    assert only.name.endswith("-sweep.perfscope")
