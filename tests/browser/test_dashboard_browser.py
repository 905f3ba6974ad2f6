"""The dashboard and the standalone HTML report in headless Chromium (selenium, Debian chromedriver).

Run with: ``PERFSCOPE_REQUIRE_BROWSER=1 pytest tests/browser -m browser``. Screenshots land in
``tests/browser/screenshots/`` (not committed).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfscope.dashboard.app import create_app
from perfscope.dashboard.html_report import write_html
from tests.browser.conftest import SHOTS, WAIT_S
from tests.unit.dashboard_reports import XSS, engine, hostile

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, fixtures_dir: object) -> Iterator[str]:
    from werkzeug.serving import make_server

    root = tmp_path_factory.mktemp("browser")
    hostile().save(root / "a-hostile.perfscope")
    engine().save(root / "b-engine.perfscope")
    server = make_server("127.0.0.1", _free_port(), create_app([root]).server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join(timeout=10)


def _wait(drv: Any, css: str, *, text: str | None = None, count: int = 1) -> list[Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def ready(d: Any) -> list[Any] | bool:
        found = d.find_elements(By.CSS_SELECTOR, css)
        if text is not None:
            found = [e for e in found if text in e.text]
        return found if len(found) >= count else False

    return WebDriverWait(drv, WAIT_S).until(ready)  # type: ignore[no-any-return]


def _no_alert(drv: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        drv.switch_to.alert.text  # noqa: B018


def _tab(drv: Any, name: str) -> None:
    from selenium.webdriver.common.by import By

    drv.find_element(By.ID, f"tab-{name}").click()


def _pick_report(drv: Any, label_part: str) -> None:
    from selenium.webdriver.common.by import By

    drv.find_element(By.CSS_SELECTOR, "#report-picker").click()
    # dash 3+ renders options as [role=option] / .dash-dropdown-option; dash 2 (react-virtualized-select)
    # as .VirtualizedSelectOption
    option = _wait(drv, "#report-picker [role=option], .dash-dropdown-option, .Select-option, "
                        ".VirtualizedSelectOption", text=label_part)[0]
    option.click()


def test_overview_renders_report_strings_literally(driver: Any, served: str) -> None:
    driver.get(served)
    item = _wait(driver, "ul.warnings li", text="warning")[0]
    assert item.text == f"warning {XSS}"
    _no_alert(driver)
    assert "NVIDIA H100" in _wait(driver, "#headline")[0].text
    driver.save_screenshot(str(SHOTS / "overview.png"))


def test_every_view_loads(driver: Any, served: str) -> None:
    driver.get(served)
    _wait(driver, "#headline")
    _tab(driver, "timeline")
    _wait(driver, "#timeline-graph .main-svg")
    _wait(driver, "#timeline-graph .barlayer .point, #timeline-graph .heatmaplayer image")
    driver.save_screenshot(str(SHOTS / "timeline.png"))
    _tab(driver, "roofline")
    _wait(driver, "#roofline-graph .scatterlayer .points path", count=10)
    driver.save_screenshot(str(SHOTS / "roofline.png"))
    _tab(driver, "kernels")
    _wait(driver, "#kernel-grid .ag-row", count=5)
    assert _wait(driver, "#kernel-grid .ag-cell", text=XSS)
    driver.save_screenshot(str(SHOTS / "kernels.png"))
    _tab(driver, "counters")
    _wait(driver, "#counters-graph .annotation-text", text="no counter samples")
    _tab(driver, "compare")
    _wait(driver, "#compare-graph .barlayer .point", count=2)
    driver.save_screenshot(str(SHOTS / "compare.png"))
    _pick_report(driver, "b-engine")
    _tab(driver, "overview")
    _wait(driver, "#headline", text="test CPU")
    _tab(driver, "phases")
    _wait(driver, "#step-times .scatterlayer .points path", count=4)
    _wait(driver, "#phase-breakdown .barlayer .point")
    driver.save_screenshot(str(SHOTS / "phases.png"))
    _no_alert(driver)


def test_timeline_zoom_redraws_the_window(driver: Any, served: str) -> None:
    """A zoom (a relayout of the x range) reaches the figure callback through the zoom store and
    comes back as the timeline of that window; Reset zoom brings the whole run back."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(served)
    _wait(driver, "#headline")
    _tab(driver, "timeline")
    _wait(driver, "#timeline-graph .barlayer .point, #timeline-graph .heatmaplayer image")
    meta = "return document.querySelector('#timeline-graph .js-plotly-plot').layout.meta;"
    full = driver.execute_script(meta)
    lo, hi = full["t0_ns"] / 1e6, full["t1_ns"] / 1e6
    a, b = lo + (hi - lo) / 4, lo + (hi - lo) / 2
    driver.execute_script("Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'),"
                          " {'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});", a, b)
    zoomed = WebDriverWait(driver, WAIT_S).until(lambda d: (m := d.execute_script(meta))["t0_ns"] != full["t0_ns"] and m)
    assert (zoomed["t0_ns"], zoomed["t1_ns"]) == (int(a * 1e6), int(b * 1e6))
    driver.find_element(By.ID, "timeline-reset").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(meta)["t0_ns"] == full["t0_ns"])
    assert driver.execute_script(meta)["t1_ns"] == full["t1_ns"]
    driver.save_screenshot(str(SHOTS / "timeline-zoom.png"))


def test_roofline_filter_and_click_shows_details(driver: Any, served: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.get(served)
    _wait(driver, "#headline")
    _tab(driver, "roofline")
    before = len(_wait(driver, "#roofline-graph .scatterlayer .points path", count=10))
    box = driver.find_element(By.ID, "roofline-name-filter")
    box.send_keys("<script>", Keys.ENTER)

    def one_point(d: Any) -> list[Any] | bool:
        # point traces come after the roof and ridge traces: the last trace holds the filtered kernel
        pts = d.find_elements(By.CSS_SELECTOR, "#roofline-graph .scatterlayer .trace:last-child .points path")
        ridge = d.find_elements(By.CSS_SELECTOR, "#roofline-graph .scatterlayer .trace .points path")
        return pts if len(pts) == 1 and len(ridge) == 2 else False

    from selenium.webdriver.support.ui import WebDriverWait

    try:
        point = WebDriverWait(driver, WAIT_S).until(one_point)[0]
    finally:
        driver.save_screenshot(str(SHOTS / "roofline-filtered.png"))
    assert before > 1
    ActionChains(driver).move_to_element(point).pause(0.3).click().perform()
    table = _wait(driver, "#details-table", text="launch config")[0]
    rows = {r.find_element(By.TAG_NAME, "th").text: r.find_element(By.TAG_NAME, "td").text
            for r in table.find_elements(By.TAG_NAME, "tr")}
    assert rows["name"] == XSS
    assert rows["share of total kernel time"].endswith("%") and rows["bound"] in ("memory", "compute")
    assert rows["launch config"].startswith("grid (")
    driver.save_screenshot(str(SHOTS / "roofline-details.png"))
    _no_alert(driver)


def test_standalone_html_renders_offline(driver: Any, tmp_path: Path, fixtures_dir: object) -> None:
    page = write_html(hostile(), tmp_path / "report.html")
    driver.get(page.as_uri())
    _wait(driver, "body[data-ready='1']")
    _wait(driver, "#roofline .fig .main-svg")
    assert len(_wait(driver, "#roofline .scatterlayer .points path", count=10)) >= 10
    _wait(driver, "#roofline .legendtext", text="bf16")
    cell = _wait(driver, "#kernels td.name", text="script")[0]
    assert cell.text == XSS
    _no_alert(driver)
    from selenium.webdriver.common.by import By

    search = driver.find_element(By.CSS_SELECTOR, "#kernels input[type=search]")
    search.send_keys("gemm")
    from selenium.webdriver.support.ui import WebDriverWait

    def narrowed(d: Any) -> bool:
        shown, _, total = d.find_element(By.CSS_SELECTOR, "#kernels .count").text.split()[:3]
        return 0 < int(shown) < int(total)

    WebDriverWait(driver, WAIT_S).until(narrowed)
    names = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#kernels table.sortable")[0]
             .find_elements(By.CSS_SELECTOR, "td.name")]
    assert names and all("gemm" in n.lower() for n in names)
    driver.save_screenshot(str(SHOTS / "standalone.png"))


def test_a_click_on_a_request_shows_its_timeline(driver: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A load test's Phases tab: its serving tails, and a click on a request draws that request's timeline
    (its pieces by part, its tokens, the steps it ran in or waited through) (docs/tails.md)."""
    from selenium.webdriver.common.action_chains import ActionChains

    from tests.browser.pages import dashboard_servers, planted_loadtest

    with dashboard_servers(["tails"], lambda _: planted_loadtest(), lambda n: tmp_path_factory.mktemp(n)) as urls:
        driver.get(urls["tails"])
        _wait(driver, "#headline")
        _tab(driver, "phases")
        _wait(driver, "#tails-figure .main-svg")
        assert _wait(driver, "#tails-table", text="Serving tails")
        points = _wait(driver, "#tail-requests .scatterlayer .points path", count=10)
        ActionChains(driver).move_to_element(points[-1]).pause(0.3).click().perform()
        try:
            title = _wait(driver, "#request-timeline .gtitle", text="Request")[0]
        finally:
            driver.save_screenshot(str(SHOTS / "request-timeline.png"))
        assert "TTFT" in title.text and "joined by scheduler" in title.text
        assert _wait(driver, "#request-timeline .legendtext", text="tokens")
        _no_alert(driver)
