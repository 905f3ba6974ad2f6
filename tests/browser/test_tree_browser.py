"""The HTML report's "Where the time goes" section renders in headless Chromium on the engine
report, the H200 report and a third-party with_stack trace: icicle drawn, expandable table
filled and expandable, no console error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perfscope.analysis.readers.kineto.reader import read_kineto
from perfscope.analysis.summaries.hierarchy import by_phase
from perfscope.dashboard.html_report import write_html
from perfscope.report import Report
from tests.browser.conftest import SHOTS, WAIT_S, severe_messages
from tests.browser.pages import dashboard_servers

pytestmark = pytest.mark.browser

CHECK_TREE = """
const sec = document.getElementById('tree');
if (!sec) return {missing: true};
const figs = Array.from(sec.querySelectorAll('div.fig'));
const drawn = figs.filter(f => f.querySelector('.main-svg') && (f._fullData || []).length &&
                               f._fullData[0].type === 'icicle');
const closed = sec.querySelector('.ptree details:not([open])');
let opened = false;
if (closed) { closed.open = true; opened = closed.querySelectorAll('.leaf, details').length > 0; }
const rows = Array.from(sec.querySelectorAll('.ptree summary, .ptree .leaf'));
const every = Array.from(sec.querySelectorAll('details.instances'));
every.forEach(d => { d.open = true; });
const instanceRows = rows.filter(r => r.closest('details.instances'));
sec.scrollIntoView();
return {missing: false, figures: figs.length, icicles: drawn.length,
        rows: rows.length - instanceRows.length, instanceTables: every.length, instanceRows: instanceRows.length,
        instanceText: every.map(d => d.innerText).join(' ').slice(0, 4000),
        opened: opened, text: sec.innerText.slice(0, 400)};
"""


def _reports(sample_reports_dir: Path, fixtures_dir: Path) -> dict[str, Report]:
    return {
        "engine": Report.load(sample_reports_dir / "cpu-small-b1-p128-g32.perfscope"),
        "h200": Report.load(fixtures_dir / "h200" / "h200_llama1b_b1_p2048_g64.perfscope"),
        "b200-vllm": read_kineto(fixtures_dir / "kineto" / "tracelens_b200__eager_trace.json.gz"),
    }


@pytest.mark.parametrize("name", ["engine", "h200", "b200-vllm"])
def test_tree_section_renders(driver: Any, tmp_path: Path, sample_reports_dir: Path, fixtures_dir: Path,
                              name: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    report = _reports(sample_reports_dir, fixtures_dir)[name]
    page = write_html(report, tmp_path / f"{name}.html")
    severe_messages(driver)
    driver.get(page.as_uri())
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "body[data-ready='1']"))
    result = driver.execute_script(CHECK_TREE)
    driver.save_screenshot(str(SHOTS / f"tree-{name}.png"))
    assert severe_messages(driver) == []
    assert not result["missing"]
    trees = by_phase(report)
    assert result["figures"] == result["icicles"] == len(trees)
    assert result["rows"] == sum(len(t.nodes) for t in trees.values())
    assert result["opened"]
    # every instance of the repeated layers, one closed table per phase, module levels only
    expanded = by_phase(report, collapse=False)
    assert result["instanceTables"] == len(trees)
    assert result["instanceRows"] == sum(int(t.nodes["level"].isin(("module", "range")).sum())
                                         for t in expanded.values())
    if name == "b200-vllm":
        assert "TransformerBlock_35" in result["instanceText"]
    if name == "engine":
        assert "layer.11" in result["instanceText"]
    if name == "b200-vllm":
        assert "TransformerBlock ×36" in result["text"]
    if name == "engine":
        assert "layer ×12" in result["text"]


@pytest.fixture(scope="module")
def tree_dashboards(tmp_path_factory: pytest.TempPathFactory, sample_reports_dir: Path,
                    fixtures_dir: Path) -> Any:
    reports = _reports(sample_reports_dir, fixtures_dir)
    with dashboard_servers(reports, reports.__getitem__, lambda n: tmp_path_factory.mktemp(f"tree-{n}")) as urls:
        yield urls


SECOND_BOX = """
const boxes = document.querySelectorAll('#tree-graph g.slice');
return boxes.length > 1 ? boxes[1].querySelector('path.surface') : null;
"""


@pytest.mark.parametrize("name", ["engine", "h200", "b200-vllm"])
def test_tree_tab_click_filters_the_roofline_and_table(driver: Any, tree_dashboards: dict[str, str], name: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    severe_messages(driver)
    driver.get(tree_dashboards[name])
    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#headline"))
    driver.find_element(By.ID, "tab-tree").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tree-graph g.slice"))
    wait.until(lambda d: d.find_element(By.ID, "tree-note").text.startswith("the whole tree"))
    whole = driver.find_element(By.ID, "tree-note").text
    from selenium.webdriver.common.action_chains import ActionChains

    box = driver.execute_script(SECOND_BOX)
    assert box is not None
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", box)
    ActionChains(driver).move_to_element(box).click().perform()
    wait.until(lambda d: not d.find_element(By.ID, "tree-note").text.startswith("the whole tree"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tree-kernels .ag-row"))
    note = driver.find_element(By.ID, "tree-note").text
    driver.save_screenshot(str(SHOTS / f"dash-tree-{name}.png"))
    assert note != whole and " kernels" in note
    assert driver.execute_script(
        "const g = document.querySelector('#tree-roofline .js-plotly-plot'); return !!g && (g._fullData || []).length")
    assert severe_messages(driver) == []
