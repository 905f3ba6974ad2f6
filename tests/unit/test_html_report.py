"""The standalone HTML report: offline, escaped, with its sections and tables, written atomically."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from perfscope.dashboard.html_report import (
    render_compare_html,
    render_html,
    script_safe,
    write_html,
)
from perfscope.errors import OutputExistsError
from perfscope.report import Report
from tests.unit.dashboard_reports import QWEN, XSS, engine, hostile, imported


class _Scripts(HTMLParser):
    """Collects script elements (attributes and text) and every text node outside scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text: list[str] = []
        self._in: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self._in = dict(attrs)
            self.scripts.append((self._in, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        else:
            self.text.append(data)


@pytest.fixture(scope="module")
def qwen_html(fixtures_dir: object) -> str:
    return render_html(imported(QWEN))


@pytest.fixture(scope="module")
def hostile_page(fixtures_dir: object) -> _Scripts:
    parser = _Scripts()
    parser.feed(render_html(hostile()))
    return parser


def test_offline_by_default_and_cdn_on_request(qwen_html: str) -> None:
    assert get_plotlyjs()[:2000] in qwen_html
    assert not re.search(r"<script[^>]+src=", qwen_html)  # nothing loaded from the network
    small = render_html(imported(QWEN), cdn=True)
    assert f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js" in small
    assert get_plotlyjs()[:2000] not in small
    assert len(qwen_html) - len(small) > 0.99 * len(get_plotlyjs())  # plotly.js is 3.6 MB (5.18) to 4.6 MB (7.x)


def test_sections_figures_and_tables_present(qwen_html: str) -> None:
    for anchor in ("metrics", "roofline", "timeline", "kernels"):
        assert f'id="{anchor}"' in qwen_html
    assert qwen_html.count('class="fig" data-figure=') >= 3
    assert 'class="sortable"' in qwen_html and "sortBy" in qwen_html
    parser = _Scripts()
    parser.feed(qwen_html)
    tables = [json.loads(text) for attrs, text in parser.scripts
              if attrs.get("type") == "application/json" and str(attrs.get("id")).startswith("table")]
    by_name, rows = tables
    k = imported(QWEN).kernels
    assert len(by_name["rows"]) == k["name"].nunique()
    name_col = [c["key"] for c in by_name["columns"]].index("name")
    time_col = [c["key"] for c in by_name["columns"]].index("duration_ns")
    totals = {r[name_col]: r[time_col] for r in by_name["rows"]}
    assert totals == k.groupby("name")["duration_ns"].sum().to_dict()
    assert len(rows["rows"]) == min(len(k), 500)


def test_header_lists_roofs_with_provenance_and_ridges(qwen_html: str) -> None:
    device = imported(QWEN).device
    assert "datasheet" in qwen_html and device.name in qwen_html
    assert f"{device.ridge('bf16'):.3g} FLOP/B" in qwen_html


def test_every_report_string_is_escaped(hostile_page: _Scripts) -> None:
    executable = [text for attrs, text in hostile_page.scripts if attrs.get("type") != "application/json"]
    assert not any("alert(1)" in text for text in executable)
    for attrs, text in hostile_page.scripts:
        if attrs.get("type") == "application/json":
            assert "</" not in text and "<script" not in text
            json.loads(text)  # still valid JSON after escaping
    visible = "".join(hostile_page.text)
    assert f"evil {XSS}" in visible and f"warning {XSS}" in visible
    data = "".join(text for attrs, text in hostile_page.scripts if attrs.get("type") == "application/json")
    assert "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in data  # escaped inside JSON strings


def test_hostile_kernel_name_survives_into_table_data(hostile_page: _Scripts) -> None:
    tables = [json.loads(text) for attrs, text in hostile_page.scripts if str(attrs.get("id")).startswith("table")]
    names = {row[0] for row in tables[0]["rows"]}
    assert XSS in names  # the raw name reaches the page's data, which inserts it with textContent


def test_script_safe_neutralises_closing_tags() -> None:
    text = script_safe(json.dumps({"a": "</script><!-- & ]]>"}))
    assert "</" not in text and "<!--" not in text and json.loads(text) == {"a": "</script><!-- & ]]>"}


def test_engine_report_has_phase_and_request_sections() -> None:
    html = render_html(engine())
    # the source names the engine's model (an engine run has no input file to name)
    assert "<th>source</th><td>engine: perfscope&#x27;s engine, model tiny</td>" in html
    assert 'id="phases"' in html and "<h3>Requests</h3>" in html and "<h3>Phases</h3>" in html
    # the tiny engine's TTFT is a few hundred µs on a quiet machine, a few ms on a loaded one
    assert re.search(r"TTFT p50</th><td>[0-9.]+ (ns|µs|ms|s)<", html)
    # the phase table's headers are labels with units, not column names
    assert "<th>achieved FLOP/s</th>" in html and "<th>wall time</th>" in html and "<th>wall_s</th>" not in html


def test_write_html_is_atomic_and_refuses_when_asked(tmp_path: Path, fixtures_dir: object) -> None:
    report = engine()
    target = tmp_path / "out" / "report.html"
    write_html(report, target)
    first = target.read_text(encoding="utf-8")
    assert first.startswith("<!DOCTYPE html>") and first.rstrip().endswith("</html>")
    with pytest.raises(OutputExistsError):
        write_html(report, target, overwrite=False)
    assert [p.name for p in target.parent.iterdir()] == ["report.html"]


def test_compare_page(fixtures_dir: object) -> None:
    a: Report = imported(QWEN)
    html = render_compare_html(a, engine())
    assert "perfscope compare" in html and html.count('class="fig" data-figure=') == 3


def test_findings_show_their_items_and_the_unexplained_share(fixtures_dir: object) -> None:
    """The H200 engine run: each finding with items shows them as a table (share of the stake,
    cause, the item's words) with the share they explain; prefill-mfu states its unexplained time;
    an item's label is escaped like every report string."""
    import dataclasses
    import html

    from perfscope.analysis.findings import Item, run_rules
    from perfscope.dashboard.html_report import _finding
    from perfscope.format import duration

    report = Report.load(Path(str(fixtures_dir)) / "h200" / "h200_llama1b_b1_p2048_g64.perfscope")
    page = render_html(report)
    found = run_rules(report)
    prefill = next(f for f in found if f.id == "prefill-mfu")
    assert '<table class="items">' in page and "Evidence: explains 100% of its time at stake." in page
    assert html.escape(f"{duration(prefill.unexplained_ns)} (") in page and "unexplained." in page
    assert html.escape(prefill.items[0].label) in page
    evil = dataclasses.replace(prefill, items=(Item("kernel", XSS, 1.0, False),))
    block = _finding(evil)
    assert XSS not in block and html.escape(XSS) in block and "<td>unknown</td>" in block


def test_a_named_device_without_roofs_says_so_in_the_header(fixtures_dir: object) -> None:
    """An RTX 4080 Laptop trace (no datasheet row): the device section says no roofs are known and every
    bound is unknown, never a bare "none" under the device's name."""
    page = render_html(imported("kineto/nanovllm_cpu_kv_attention__forward_10.json.gz"))
    header = page.split("<header>", 1)[1].split("</header>", 1)[0]
    assert "Device: NVIDIA GeForce RTX 4080 Laptop GPU" in header
    assert "No roofs known for this device: every bound is unknown." in header
    assert '<p class="muted">none</p>' not in header
