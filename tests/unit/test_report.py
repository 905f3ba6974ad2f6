"""The Report folder: round trip, atomic replacement, and clear errors on damaged input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from perfscope.device import DeviceSpec, Roof
from perfscope.errors import OutputExistsError, ReportFormatError, UsageError
from perfscope.report import Report
from perfscope.schema import SCHEMA_VERSION, column_names


def small_report(name: str = "r") -> Report:
    kernels = pd.DataFrame({
        "name": ["gemm", "copy", "mystery"], "device": ["cuda:0"] * 3, "start_ns": [0, 10, 30],
        "end_ns": [10, 30, 35], "duration_ns": [10, 20, 5], "flops": [1e6, 0.0, np.nan],
        "dram_bytes": [1e3, 2e3, np.nan], "stream": [7, 7, 8],
    })
    dev = DeviceSpec("gpu", "cuda", {"fp32": Roof(1e12, "datasheet")}, {"dram": Roof(1e11, "datasheet")})
    return Report.build({"kernels": kernels}, {"name": name, "device": dev.to_dict()})


def test_round_trip_keeps_tables_manifest_and_missing_values(tmp_path):
    rep = small_report()
    path = rep.save(tmp_path / "a.perfscope")
    back = Report.load(path)
    assert list(back.kernels.columns[: len(column_names("kernels"))]) == column_names("kernels")
    assert back.kernels["flops"].isna().tolist() == [False, False, True]
    assert back.kernels["stream"].tolist() == [7, 7, 8]
    assert back.manifest["schema_version"] == SCHEMA_VERSION
    assert back.manifest["tables"]["kernels"] == 3
    assert back.device.compute["fp32"].provenance == "datasheet"
    assert back.name == "r" and back.path == path
    assert len(back.transfers) == 0 and "kind" in back.transfers.columns


def test_existing_report_needs_force_and_is_replaced_whole(tmp_path):
    target = small_report("first").save(tmp_path / "x.perfscope")
    with pytest.raises(OutputExistsError):
        small_report("second").save(target)
    assert Report.load(target).name == "first"
    small_report("second").save(target, force=True)
    assert Report.load(target).name == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.perfscope"]  # no temp leftovers


def test_failed_write_leaves_the_existing_report_untouched(tmp_path):
    target = small_report("keep").save(tmp_path / "x.perfscope", extra_files={"report.html": "<p>old</p>"})
    with pytest.raises(FileNotFoundError):
        small_report("new").save(target, force=True, extra_files={"raw/t.json": tmp_path / "missing.json"})
    assert Report.load(target).name == "keep"
    assert (target / "report.html").read_text() == "<p>old</p>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.perfscope"]


def test_force_never_replaces_a_folder_that_is_not_a_report(tmp_path):
    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "thesis.tex").write_text("do not delete")
    with pytest.raises(UsageError, match="not a perfscope report"):
        small_report().save(folder, force=True)
    assert (folder / "thesis.tex").read_text() == "do not delete"


@pytest.mark.parametrize("damage,match", [
    (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
    (lambda p: (p / "manifest.json").write_text("{not json"), "unreadable manifest"),
    (lambda p: (p / "manifest.json").write_text(json.dumps({"schema_version": "9.0"})), "schema_version 9.0"),
    (lambda p: (p / "kernels.parquet").unlink(), "kernels.parquet is missing"),
    (lambda p: (p / "kernels.parquet").write_bytes(b"PAR1garbage"), "damaged table"),
])
def test_damaged_reports_raise_one_clear_error(tmp_path, damage, match):
    path = small_report().save(tmp_path / "d.perfscope")
    damage(path)
    with pytest.raises(ReportFormatError, match=match) as info:
        Report.load(path)
    assert str(tmp_path) in str(info.value)


def test_missing_required_column_is_named_with_the_file(tmp_path):
    path = small_report().save(tmp_path / "c.perfscope")
    df = pd.read_parquet(path / "kernels.parquet").drop(columns=["start_ns"])
    df.to_parquet(path / "kernels.parquet")
    with pytest.raises(ReportFormatError, match=r"kernels.parquet.*start_ns"):
        Report.load(path)


def test_not_a_report(tmp_path):
    with pytest.raises(ReportFormatError, match="no such report"):
        Report.load(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ReportFormatError, match="is a file"):
        Report.load(tmp_path / "file.txt")


def test_rank_tables_are_stored_as_a_partitioned_dataset(tmp_path):
    k = small_report().kernels.assign(rank=[0, 1, 1])
    rep = Report.build({"kernels": k})
    path = rep.save(tmp_path / "ranks.perfscope")
    assert (path / "kernels").is_dir()
    back = Report.load(path)
    assert sorted(back.kernels["rank"].tolist()) == [0, 1, 1]
