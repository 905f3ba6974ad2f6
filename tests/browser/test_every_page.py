"""Every page renders completely: the standalone HTML of every report in ``pages.PAGES`` and
every dashboard view of a representative set, in headless Chromium.

A page fails on any SEVERE console message (a plotly.js exception stops every figure and table
after it), on a figure that did not draw, on an empty section, and on a table without rows
where the report has rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfscope.dashboard import views
from perfscope.dashboard.html_report import MAX_TABLE_ROWS, TOP_ROWS, write_html
from tests.browser.conftest import SHOTS, WAIT_S, severe_messages
from tests.browser.pages import PAGES, dashboard_servers, page_report

pytestmark = pytest.mark.browser

# Every figure drew (plotly's SVG plus traces or, for a message figure, its text), every table
# holds the rows of its data block, every section shows something.
CHECK_PAGE = """
const problems = [], tables = {};
for (const fig of document.querySelectorAll('div.fig')) {
  const label = fig.getAttribute('aria-label');
  const traces = (fig._fullData || []).length, notes = fig.querySelectorAll('.annotation-text').length;
  if (!fig.querySelector('.main-svg')) problems.push('figure not drawn: ' + label);
  else if (!traces && !notes) problems.push('figure has no trace and no message: ' + label);
}
for (const holder of document.querySelectorAll('div.tableholder')) {
  const title = holder.previousElementSibling ? holder.previousElementSibling.textContent : '?';
  const spec = JSON.parse(document.getElementById(holder.getAttribute('data-table')).textContent);
  const rows = holder.querySelectorAll('tbody tr').length;
  tables[title] = rows;
  if (rows !== spec.rows.length) problems.push('table ' + title + ': ' + rows + ' of ' + spec.rows.length + ' rows');
}
for (const sec of document.querySelectorAll('section')) {
  const h = sec.querySelector('h2');
  const body = sec.innerText.length - (h ? h.innerText.length : 0);
  if (body < 1 && !sec.querySelector('.main-svg')) problems.push('empty section: ' + sec.id);
}
// the phase and kernel tables show every column without a horizontal scroll at 1400 px
for (const t of document.querySelectorAll('#metrics table')) {
  if (t.scrollWidth > t.parentElement.clientWidth + 1) problems.push('phase/metrics table wider than the page');
}
for (const holder of document.querySelectorAll('#kernels div.tableholder .tablewrap')) {
  if (holder.scrollWidth > holder.clientWidth + 1) problems.push('kernel table scrolls sideways: ' + holder.scrollWidth);
}
// no internal missing-value spelling reaches the reader (the one marker is n/a)
const words = (document.body.innerText.match(/\b(None|nan|NaN|undefined)\b/g) || []);
if (words.length) problems.push('page text holds ' + words.join(', '));
const wide = document.documentElement.scrollWidth - document.documentElement.clientWidth;
if (wide > 1) problems.push('page ' + wide + ' px wider than the window (text that does not wrap?)');
return {problems: problems, tables: tables, ready: document.body.getAttribute('data-ready'),
        sections: Array.from(document.querySelectorAll('section')).map(s => s.id)};
"""


def _wait_ready(drv: Any, css: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(drv, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))


@pytest.mark.parametrize("name", list(PAGES))
def test_standalone_html_renders_every_section(driver: Any, tmp_path: Path, fixtures_dir: object,
                                               name: str) -> None:
    report = page_report(name)
    page = write_html(report, tmp_path / f"{name}.html")
    severe_messages(driver)  # drop what earlier pages left
    driver.get(page.as_uri())
    try:
        _wait_ready(driver, "body[data-ready='1']")
    finally:
        driver.save_screenshot(str(SHOTS / f"page-{name}.png"))
    result = driver.execute_script(CHECK_PAGE)
    messages = severe_messages(driver)
    assert not messages, messages
    assert result["problems"] == []
    expected = ("metrics", "roofline", "timeline", "kernels") if len(report.kernels) else \
        ("metrics", "timeline", "phases") if views.has_device_work(report) else ("metrics",)  # steps without kernels
    for section in expected:
        assert section in result["sections"]
    if not views.has_device_work(report):  # no section it cannot fill
        assert not {"roofline", "timeline", "kernels"} & set(result["sections"])
        if len(report.requests):  # an endpoint load test: its requests
            assert "loadtest" in result["sections"]
        if len(report.gauges):  # a serving run's saved /metrics: its gauges and what held its queue
            assert {"memory", "findings"} <= set(result["sections"])
    if len(report.kernels):
        by_name = result["tables"][f"Per {views.device_words(report)['kernel']} name (one row per name and phase)"]
        assert by_name == min(len(views.kernels_by_name(report)), MAX_TABLE_ROWS) > 0
        assert result["tables"]["Longest executions"] == min(len(report.kernels), TOP_ROWS) > 0
    if len(report.steps):
        assert "phases" in result["sections"]
    if name.endswith(("loadtest", "tails")):  # a load test's serving tails
        assert "tails" in result["sections"] and result["tables"]["p50 and p99 with their parts"] == 8


# ------------------------------------------------------------------------------ dashboard
DASHBOARD_PAGES = ("sample-cpu-small-b1-p128-g32", "h200-engine", "import-ncu-csv", "import-nsys-copies",
                   "import-server-metrics")
"""A representative set: binned CPU timeline with phases and requests, a real GPU engine run
(steps, phases, NVTX ranges), an ncu CSV (no timeline of its own), an nsys export of copies and a serving
run's saved /metrics (gauges only: no kernels, steps or requests)."""

VIEW_READY = {
    "overview": "#headline",
    "timeline": "#timeline-graph .main-svg",
    "roofline": "#roofline-graph .main-svg",
    "kernels": "#kernel-grid .ag-row",
    "tree": "#tree-graph .main-svg",
    "phases": "#phase-breakdown .main-svg",
    "counters": "#counters-graph .main-svg",
    "compare": "#compare-graph .main-svg",
}
NO_DEVICE_READY = "#overview-body table.facts"
"""The overview of a report without device work (no headline): its source table."""


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory, fixtures_dir: object) -> Iterator[dict[str, str]]:
    """One Dash app per report (each the app's only report, so it is the one shown)."""
    with dashboard_servers(DASHBOARD_PAGES, page_report, lambda n: tmp_path_factory.mktemp(f"dash-{n}")) as urls:
        yield urls


def _graph_drawn(drv: Any, graph_id: str) -> bool:
    return bool(drv.execute_script(
        "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "return !!g && ((g._fullData || []).length > 0 || g.querySelectorAll('.annotation-text').length > 0);",
        graph_id))


@pytest.mark.parametrize("name", DASHBOARD_PAGES)
def test_every_dashboard_view_renders(driver: Any, dashboard: dict[str, str], name: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    severe_messages(driver)
    report = page_report(name)
    ready = VIEW_READY if views.has_device_work(report) else {**VIEW_READY, "overview": NO_DEVICE_READY}
    driver.get(dashboard[name])
    _wait_ready(driver, ready["overview"])
    too_wide = {}
    for view, css in ready.items():
        driver.find_element(By.ID, f"tab-{view}").click()
        if view == "kernels" and not len(report.kernels):
            continue
        try:
            _wait_ready(driver, css)
            graph = css.split()[0].lstrip("#")
            if view not in ("overview", "kernels"):
                WebDriverWait(driver, WAIT_S).until(lambda d, g=graph: _graph_drawn(d, g))
            wide = driver.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth;")
            if wide > 1:
                too_wide[view] = wide
        finally:
            driver.save_screenshot(str(SHOTS / f"dash-{name}-{view}.png"))
    messages = severe_messages(driver)
    assert not messages, messages
    assert too_wide == {}, f"views wider than the window (px): {too_wide}"


def test_a_click_on_a_finding_selects_its_items(driver: Any, dashboard: dict[str, str]) -> None:
    """The H200 engine run's overview lists each finding's items; "show on the timeline" opens the
    timeline shaded at the finding's gaps and zoomed to the largest, "show its kernels" the kernel
    table filtered to its kernels; no console error on the way."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    severe_messages(driver)
    driver.get(dashboard["h200-engine"])
    _wait_ready(driver, "#overview-findings table.items tbody tr")
    rows = driver.find_elements(By.CSS_SELECTOR, "#overview-findings table.items tbody tr")
    assert rows and all(r.text.strip() for r in rows)
    assert "Evidence: explains" in driver.find_element(By.ID, "overview-findings").text
    first = driver.find_elements(By.CSS_SELECTOR, "#overview-findings button.pick")
    timeline = next(b for b in first if b.text == "show on the timeline")
    timeline.click()
    meta = ("const g = document.querySelector('#timeline-graph .js-plotly-plot');"
            "return g && g.layout && g.layout.meta;")
    got = WebDriverWait(driver, WAIT_S).until(lambda d: (m := d.execute_script(meta)) and m.get("selected") and m)
    assert got["selected"] >= 1
    assert "selected:" in driver.find_element(By.ID, "finding-note").text
    driver.save_screenshot(str(SHOTS / "dash-finding-timeline.png"))
    driver.find_element(By.ID, "tab-overview").click()
    _wait_ready(driver, "#overview-findings button.pick")
    kernels = next(b for b in driver.find_elements(By.CSS_SELECTOR, "#overview-findings button.pick")
                   if b.text == "show its kernels")
    kernels.click()
    _wait_ready(driver, "#kernel-grid .ag-row")
    WebDriverWait(driver, WAIT_S).until(lambda d: "the kernels of finding" in d.find_element(By.ID, "kernel-note").text)
    driver.save_screenshot(str(SHOTS / "dash-finding-kernels.png"))
    driver.find_element(By.ID, "finding-clear").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: "the kernels of finding" not in d.find_element(By.ID, "kernel-note").text)
    messages = severe_messages(driver)
    assert not messages, messages
