"""Rank reports are read and written by the same code as single reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from perfscope.analysis.ranks.partial_read import rank_summary_at
from perfscope.errors import ReportFormatError


def test_rank_summary_checks_the_schema_version(tmp_path: Path, sample_reports_dir: Path) -> None:
    folder = tmp_path / "r.perfscope"
    shutil.copytree(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "schema_version": "99.0"}))
    with pytest.raises(ReportFormatError, match="schema_version 99.0 is not readable"):
        rank_summary_at(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(ReportFormatError, match="no manifest.json"):
        rank_summary_at(folder)
