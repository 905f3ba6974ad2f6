"""One ``--out`` rule for every command that writes (perfscope/outpaths.py): ``X.EXT`` is exactly that,
``X`` gets ``.EXT``, ``DIR/`` (or a folder that exists and is not a report) holds the output under its
default name; several outputs (``whatif`` with several questions) take a folder; and a folder that
holds one report opens as that report. Checked on the helper and, end to end, on ``import``,
``whatif``, ``report -o`` and ``export -o`` (``profile``, ``loadtest`` and ``sweep``, which run the
engine, are in tests/integration/test_out_rule_engine.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfscope.cli import main
from perfscope.errors import InputFormatError, UsageError
from perfscope.outpaths import out_folder, out_path, single_report
from perfscope.report import Report

TRACE = "kineto/hta_triton_example__triton_example.json.gz"
BERT = "kineto/tracelens_h100__gaunernst_bert-small-uncased__1016001.json.gz"


def test_the_rule(tmp_path: Path) -> None:
    d = "runs/20261204-small.perfscope"
    assert out_path(None, default=d) == Path(d)
    assert out_path(tmp_path / "x.perfscope", default=d) == tmp_path / "x.perfscope"
    assert out_path(tmp_path / "x", default=d) == tmp_path / "x.perfscope"
    assert out_path(tmp_path / "x.v2", default=d) == tmp_path / "x.v2.perfscope"
    assert out_path(f"{tmp_path}/new/", default=d) == tmp_path / "new" / "20261204-small.perfscope"
    (tmp_path / "existing").mkdir()
    assert out_path(tmp_path / "existing", default=d) == tmp_path / "existing" / "20261204-small.perfscope"
    report = tmp_path / "r.perfscope"
    report.mkdir()
    (report / "manifest.json").write_text("{}")
    assert out_path(report, default=d) == report  # a report folder is the output itself (replaced with --force)
    assert out_path(tmp_path / "a", default="x.html", suffix=".html") == tmp_path / "a.html"
    assert out_path(tmp_path / "a.htm", default="x.html", suffix=".html", also=(".htm",)) == tmp_path / "a.htm"
    assert out_path(f"{tmp_path}/o/", default="r/report.html", suffix=".html", name="r.html") == tmp_path / "o" / "r.html"
    assert out_folder(f"{tmp_path}/many/") == tmp_path / "many" and out_folder(tmp_path / "many") == tmp_path / "many"
    with pytest.raises(UsageError, match="several outputs go into a folder"):
        out_folder(tmp_path / "many.perfscope")


def test_a_folder_with_one_report_opens_as_it(tmp_path: Path, fixtures_dir: Path) -> None:
    assert main(["import", str(fixtures_dir / TRACE), "--out", f"{tmp_path}/one/", "--no-html"]) == 0
    inside = list((tmp_path / "one").iterdir())
    assert [p.name for p in inside] == ["hta_triton_example__triton_example.perfscope"]
    assert single_report(tmp_path / "one") == inside[0]
    assert main(["analyze", str(tmp_path / "one"), "--json"]) == 0
    assert main(["import", str(fixtures_dir / TRACE), "--out", f"{tmp_path}/one/second", "--no-html"]) == 0
    with pytest.raises(InputFormatError, match="holds 2 reports"):
        single_report(tmp_path / "one")
    assert main(["analyze", str(tmp_path / "one")]) == 3


def test_a_reports_manifest_opens_its_folder(tmp_path: Path, fixtures_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(fixtures_dir / TRACE), "--out", str(tmp_path / "r"), "--no-html"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "r.perfscope" / "manifest.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["report"] == "hta_triton_example__triton_example"
    (tmp_path / "manifest.json").write_text('{"name": "not a report"}')  # another tool's manifest is not one
    assert main(["analyze", str(tmp_path / "manifest.json")]) == 3
    assert "not a trace" in capsys.readouterr().err


@pytest.mark.parametrize("given, written", [
    ("x", "x.perfscope"), ("x.perfscope", "x.perfscope"), ("d/", "d/hta_triton_example__triton_example.perfscope"),
])
def test_import(given: str, written: str, tmp_path: Path, fixtures_dir: Path) -> None:
    assert main(["import", str(fixtures_dir / TRACE), "--out", f"{tmp_path}/{given}", "--no-html"]) == 0
    assert Report.load(tmp_path / written).kernels is not None


def test_whatif_one_question_writes_that_report_several_a_folder(tmp_path: Path, fixtures_dir: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src = str(fixtures_dir / BERT)
    assert main(["whatif", src, "--gpu", "B200", "--out", str(tmp_path / "X.perfscope")]) == 0
    rep = Report.load(tmp_path / "X.perfscope")
    assert rep.manifest["source"]["kind"] == "projection" and (tmp_path / "X.perfscope" / "report.html").is_file()
    assert main(["whatif", src, "--gpu", "B200", "--out", str(tmp_path / "Y")]) == 0
    assert (tmp_path / "Y.perfscope" / "manifest.json").is_file()
    assert main(["whatif", src, "--gpu", "B200", "--out", f"{tmp_path}/Z/"]) == 0
    assert [p.name for p in (tmp_path / "Z").iterdir()] == [
        "tracelens_h100__gaunernst_bert-small-uncased__1016001__gpuB200.perfscope"]
    assert main(["analyze", str(tmp_path / "Z"), "--json"]) == 0  # the folder of one report opens it
    assert main(["whatif", src, "--gpu", "B200,MI300X", "--out", str(tmp_path / "many")]) == 0
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == [
        "tracelens_h100__gaunernst_bert-small-uncased__1016001__gpuB200.perfscope",
        "tracelens_h100__gaunernst_bert-small-uncased__1016001__gpuMI300X.perfscope"]
    capsys.readouterr()
    assert main(["whatif", src, "--gpu", "B200,MI300X", "--out", str(tmp_path / "many.perfscope")]) == 2
    assert "several outputs go into a folder" in capsys.readouterr().err
    assert not (tmp_path / "many.perfscope").exists()
    # an existing report is refused before anything is projected or written
    assert main(["whatif", src, "--gpu", "B200,MI300X", "--out", str(tmp_path / "many")]) == 7


@pytest.mark.parametrize("given, written", [("o", "o.html"), ("o.html", "o.html"), ("d/", "d/r.html")])
def test_report_o(given: str, written: str, tmp_path: Path, fixtures_dir: Path) -> None:
    assert main(["import", str(fixtures_dir / TRACE), "--out", str(tmp_path / "r"), "--no-html"]) == 0
    assert main(["report", str(tmp_path / "r.perfscope"), "-o", f"{tmp_path}/{given}"]) == 0
    assert (tmp_path / written).read_text().startswith("<!DOCTYPE html")


@pytest.mark.parametrize("given, fmt, written", [
    ("t", "perfetto", "t.pftrace"), ("t.pftrace", "perfetto", "t.pftrace"), ("t", "chrome", "t.json"),
    ("t.json", "chrome", "t.json"), ("d/", "perfetto", "d/r.pftrace"), ("d/", "chrome", "d/r.json"),
])
def test_export_o(given: str, fmt: str, written: str, tmp_path: Path, fixtures_dir: Path) -> None:
    assert main(["import", str(fixtures_dir / TRACE), "--out", str(tmp_path / "r"), "--no-html"]) == 0
    assert main(["export", str(tmp_path / "r.perfscope"), "-o", f"{tmp_path}/{given}", "--format", fmt]) == 0
    data = (tmp_path / written).read_bytes()
    assert data and (json.loads(data) if fmt == "chrome" else True)
