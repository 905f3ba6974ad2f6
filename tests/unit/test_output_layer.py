"""The one output layer: number formats, the JSON encoder, and compare views that agree everywhere."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from perfscope import format as fmt
from perfscope.analysis.summaries.compare import compare, name_view, phase_view
from perfscope.cli import cli as perfscope_cli
from perfscope.dashboard import callbacks as cb
from perfscope.dashboard import figures
from perfscope.dashboard.html_report import render_compare_html
from perfscope.dashboard.store import ReportStore
from perfscope.dashboard.text import esc
from perfscope.report import Report
from perfscope.text_report import table

A_NAME, B_NAME = "h100-qwen1.5-0.5b-kineto.perfscope", "cpu-small-b1-p128-g32.perfscope"


# ---------------------------------------------------------------------------- text formats
@pytest.mark.parametrize(("value", "unit", "want"), [
    (1.23e12, "FLOP/s", "1.23 TFLOP/s"), (4.8e12, "B/s", "4.8 TB/s"), (999.0, "B", "999 B"),
    (1500.0, "", "1.5 k"), (0.0, "FLOP/s", "0 FLOP/s"), (-2.5e6, "B", "-2.5 MB"),
])
def test_si_prefixes(value: float, unit: str, want: str) -> None:
    assert fmt.si(value, unit) == want


@pytest.mark.parametrize(("ns", "want"), [
    (850, "850 ns"), (12_300, "12.3 µs"), (4_560_000, "4.56 ms"), (1.23e9, "1.23 s"), (-2e6, "-2 ms"),
])
def test_durations(ns: float, want: str) -> None:
    assert fmt.duration(ns) == want
    assert fmt.seconds(ns / 1e9) == want


@pytest.mark.parametrize("missing", [None, math.nan, float("inf"), np.nan, pd.NA, pd.NaT, "x"])
def test_one_missing_marker(missing: object) -> None:
    for text in (fmt.si(missing, "B"), fmt.duration(missing), fmt.pct(missing), fmt.number(missing),
                 fmt.nbytes(missing), fmt.seconds(missing)):
        assert text == fmt.MISSING == "n/a"


def test_numbers_percent_bytes_and_columns() -> None:
    assert fmt.pct(12.345) == "12.3%" and fmt.number(1234567.0, 1e3, 1) == "1,234.6"
    assert fmt.nbytes(537e6) == "537 MB" and fmt.signed("1 ms", 1e-3) == "+1 ms" and fmt.signed("-1 ms", -1) == "-1 ms"
    assert fmt.clip("abcdef", 4) == "abc…" and fmt.clip(None, 4) == "n/a"
    assert fmt.by_column("gap_ns", 2_000_000) == "2 ms" and fmt.by_column("busy_pct", 50.0) == "50.0%"
    # measured but tiny (decode MFU on an H200: 126 GFLOP/s of 788 TFLOP/s) is not shown as zero
    assert fmt.pct(0.016) == "0.016%" and fmt.pct(0.0) == "0.0%" and fmt.pct(0.05) == "0.1%"
    assert fmt.by_column("dram_bytes", 16_400) == "16.4 kB" and fmt.by_column("kind", "HtoD") == "HtoD"
    assert fmt.evidence_rows({"idle_ns": 1500.0, "share_pct": math.nan}) == [("idle", "1.5 µs"), ("share", "n/a")]
    # an evidence key's unit suffix is not shown against a value in another unit (prefill_time_ns 2.36 s)
    assert fmt.evidence_rows({"prefill_time_ns": 2.36e9}) == [("prefill time", "2.36 s")]
    assert fmt.evidence_label("dram_roof_bytes_per_s") == "DRAM roof" and fmt.evidence_label("mbu_pct") == "MBU"
    assert fmt.evidence_label("tokens_per_s") == "tokens/s" and fmt.evidence_label("model_bytes") == "model bytes"
    assert fmt.evidence_label("kernels_per_step") == "kernels per step"


# ---------------------------------------------------------------------------- JSON
def test_jsonable_turns_every_known_type_into_plain_json() -> None:
    value = {
        "nan": math.nan, "inf": -math.inf, "np_f": np.float32(1.5), "np_i": np.int64(7), "np_b": np.bool_(True),
        "arr": np.array([1.0, np.nan]), "path": Path("/a/b"), "when": dt.datetime(2026, 1, 2, 3, 4, 5),
        "day": dt.date(2026, 1, 2), "ts": pd.Timestamp("2026-01-02T03:04:05"), "na": pd.NA, "nat": pd.NaT,
        "series": pd.Series([1, 2]), "frame": pd.DataFrame({"x": [1.0, math.nan]}), 3: (1, {2}),
    }
    out = fmt.jsonable(value)
    assert out == {
        "nan": None, "inf": None, "np_f": 1.5, "np_i": 7, "np_b": True, "arr": [1.0, None], "path": "/a/b",
        "when": "2026-01-02T03:04:05", "day": "2026-01-02", "ts": "2026-01-02T03:04:05", "na": None, "nat": None,
        "series": [1, 2], "frame": [{"x": 1.0}, {"x": None}], "3": [1, [2]],
    }
    assert type(out["np_i"]) is int and type(out["np_f"]) is float
    assert json.loads(fmt.dumps(value)) == out


def test_unknown_types_are_an_error_not_a_repr() -> None:
    with pytest.raises(TypeError, match="not JSON serialisable: .*object"):
        fmt.dumps({"x": object()})


def test_manifest_is_strict_json(tmp_path: Path, sample_reports_dir: Path) -> None:
    report = Report.load(sample_reports_dir / B_NAME)
    manifest = {**report.manifest, "params": {**report.params, "odd": math.nan, "when": dt.date(2026, 1, 1)}}
    out = Report.build({"kernels": report.kernels}, manifest).save(tmp_path / "x.perfscope")
    text = (out / "manifest.json").read_text(encoding="utf-8")
    params = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in manifest"))["params"]
    assert params["odd"] is None and params["when"] == "2026-01-01"


def test_extra_files_cannot_leave_the_report(tmp_path: Path, sample_reports_dir: Path) -> None:
    report = Report.load(sample_reports_dir / B_NAME)
    with pytest.raises(ValueError, match="outside the report"):
        report.save(tmp_path / "y.perfscope", extra_files={"../escape.txt": "x"})
    assert not (tmp_path / "escape.txt").exists()


# ---------------------------------------------------------------------------- compare: one join everywhere
def _component_rows(component: object, table_id: str) -> list[list[str]]:
    """The text cells of the body rows of the Dash table ``table_id``."""
    def find(c: object) -> object | None:
        if getattr(c, "id", None) == table_id:
            return c
        children = getattr(c, "children", None)
        for child in children if isinstance(children, (list, tuple)) else [children] if children is not None else []:
            hit = find(child)
            if hit is not None:
                return hit
        return None

    tbl = find(component)
    assert tbl is not None, table_id
    body = tbl.children[1]  # type: ignore[attr-defined]
    return [[td.children for td in tr.children] for tr in body.children]


def _html_tables(page: str) -> list[dict[str, object]]:
    blocks = re.findall(r'<script type="application/json" id="table-\d+">(.*?)</script>', page, flags=re.DOTALL)
    return [json.loads(b.replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&")) for b in blocks]


@pytest.fixture(scope="module")
def two_reports(sample_reports_dir: Path) -> tuple[Path, Path]:
    return sample_reports_dir / A_NAME, sample_reports_dir / B_NAME


def test_cli_dashboard_and_html_compare_show_the_same_tables(two_reports: tuple[Path, Path]) -> None:
    a_path, b_path = two_reports
    a, b = Report.load(a_path), Report.load(b_path)
    c = compare(a, b)
    top = figures.COMPARE_TOP
    assert len(c.by_name) > top  # the cut is exercised
    # `perfscope compare A B --top N`: every table line is the one built from the shared views
    cli = CliRunner().invoke(perfscope_cli, ["compare", str(a_path), str(b_path), "--top", str(top)])
    assert cli.exit_code == 0, cli.output
    phases, names = phase_view(c), name_view(c, top)
    for view in (phases, names):
        for line in table(list(view.columns), view.to_numpy().tolist()).splitlines():
            assert line in cli.output.splitlines()
    # the dashboard's compare tab
    store = ReportStore([a_path.parent])
    keys = {e.label.split("/")[-1]: e.key for e in store.entries()}
    fig, tables = cb.on_compare(store, keys[A_NAME], keys[B_NAME], "compare")
    assert _component_rows(tables, "compare-rows") == names.to_numpy().tolist()
    assert _component_rows(tables, "compare-phases") == phases.to_numpy().tolist()
    # the chart draws the same names, largest change first (plotly lists the bottom bar first)
    assert [y for y in fig.data[0].y][::-1] == [esc(n, 70) for n in c.by_name["name"].head(top)]
    assert fig.layout.title.text.startswith("Kernel time per short_name, largest change first")
    # the standalone HTML compare page
    page = render_compare_html(a, b)
    specs = _html_tables(page)
    assert [s["rows"] for s in specs] == [phases.to_numpy().tolist(), names.to_numpy().tolist()]
    for v in c.verdict:
        assert v.split(" ")[0] in page


def test_compare_rows_are_joined_by_short_name_and_sorted_by_change(two_reports: tuple[Path, Path]) -> None:
    a, b = (Report.load(p) for p in two_reports)
    by_name = compare(a, b).by_name
    assert by_name["name"].is_unique and set(by_name["status"]) <= {"both", "new", "vanished"}
    change = by_name["delta_s"].abs().to_numpy()
    assert (np.diff(change) <= 1e-15).all()


def test_html_report_chart_titles_are_distinct(sample_reports_dir: Path) -> None:
    report = Report.load(sample_reports_dir / A_NAME)
    titles = [figures.roofline(report).layout.title.text, figures.roofline(report, per="name").layout.title.text]
    assert len(set(titles)) == 2 and "each kernel execution" in titles[0] and "kernel names" in titles[1]


def test_dashboard_overview_shows_evidence_as_a_table(sample_reports_dir: Path) -> None:
    from perfscope.analysis.findings import run_rules
    from perfscope.dashboard.layout import overview_children

    report = Report.load(sample_reports_dir / A_NAME)
    found = [f for f in run_rules(report) if f.evidence]
    assert found
    children = overview_children(report)
    text = repr(children)

    def shown(node: object) -> list[str]:
        """Every piece of text the page shows (a component's ids, such as a finding button's
        pattern-matching dict id, are not shown)."""
        if isinstance(node, (list, tuple)):
            return [t for n in node for t in shown(n)]
        if isinstance(node, str):
            return [node]
        return shown(getattr(node, "children", None) or [])

    assert not [t for t in shown(children) if "{'" in t]  # no Python dict printed
    key, value = fmt.evidence_rows(found[0].evidence)[0]
    assert f"Th('{key}')" in text or f"Th(children='{key}')" in text
    assert value in text
