"""The words each run deserves (issue 45), in headless Chromium: the CPU engine sample and the H200
engine report, as a reader sees them.

- a CPU report speaks of cores and operators: no "GPU", "CUDA", "SM", "warp", "tensor core" or "HBM"
  anywhere in its visible text, and its idle section is "Why the cores wait";
- no number is cut: no numeric cell or tree column ends in an ellipsis because it did not fit
  (the tree's share column showed "0.0008…");
- no empty row: every row of every table holds a value, and every row of the "time per phase" and
  the idle-cause charts has a bar wide enough to see (the `none` row of a few operators outside any
  phase, and causes with no idle time such as a CPU's "launch", were empty rows).

Screenshots of each section are saved under tests/browser/screenshots/ (words-<page>-<section>.png).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perfscope.dashboard.html_report import write_html
from tests.browser.conftest import SHOTS, WAIT_S, severe_messages
from tests.browser.pages import page_report

pytestmark = pytest.mark.browser

CPU, H200 = "sample-cpu-small-b1-p128-g32", "h200-engine"
GPU_WORDS = r"\b(GPUs?|CUDA|SMs?|warps?|[Tt]ensor [Cc]ores?|HBM\d?e?|NVLink)\b"
MIN_ROW_PX = 16
"""A chart row thinner than this reads as no row at all (two idle causes in a 176 px chart had 10)."""
MIN_BAR_SHARE = 0.002
"""A bar of the phase chart narrower than this share of the widest is an empty row to the eye."""

READ_PAGE = """
const gpuWords = new RegExp(arguments[0], 'g');
const text = document.body.innerText;
const cut = [];
for (const el of document.querySelectorAll('body *')) {
  if (el.children.length || !el.textContent.trim()) continue;
  const style = getComputedStyle(el);
  const clips = style.textOverflow === 'ellipsis' || style.overflow === 'hidden' || style.overflowX === 'hidden';
  const t = el.textContent.trim();
  const numeric = /^[<>~+\\-]?[\\d.,]+\\s?(%|[a-zµ]*s|[kMGTP]?(FLOP|B)?(\\/s)?|x)?$/.test(t) || /^[\\d.,]+ \\(/.test(t);
  if (clips && numeric && el.scrollWidth > el.clientWidth + 1) cut.push(t + ' (' + el.scrollWidth + ' > ' + el.clientWidth + ' px)');
  if (numeric && /…$/.test(t)) cut.push(t);
}
const emptyRows = [];
for (const tr of document.querySelectorAll('tbody tr, table.facts tr')) {
  const cells = Array.from(tr.querySelectorAll('td')).map(td => td.textContent.trim());
  if (cells.length && cells.every(c => c === '' || c === 'n/a')) {
    const table = tr.closest('.tableholder, section');
    emptyRows.push((table ? (table.id || table.previousElementSibling?.textContent || '') : '') + ': ' + tr.outerHTML.slice(0, 120));
  }
}
const bars = {}, rowPx = {};
for (const fig of document.querySelectorAll('div.fig')) {
  const label = fig.getAttribute('aria-label');
  if (label !== 'phase_breakdown' && label !== 'idle causes') continue;
  const rows = bars[label] = {};
  for (const tr of (fig._fullData || [])) {
    (tr.y || []).forEach((y, i) => { rows[y] = (rows[y] || 0) + Math.abs(tr.x[i] || 0); });
  }
  for (const y of ((fig._fullLayout.yaxis || {}).categoryarray || [])) rows[y] = rows[y] || 0;  // listed, not drawn
  rowPx[label] = (fig._fullLayout.yaxis || {})._length / Math.max(Object.keys(rows).length, 1);
}
return {gpu: text.match(gpuWords) || [], cut: cut, emptyRows: emptyRows, bars: bars, rowPx: rowPx,
        sections: Array.from(document.querySelectorAll('section')).map(s => [s.id, s.querySelector('h2').innerText]),
        ready: document.body.getAttribute('data-ready')};
"""


def _shoot_sections(drv: Any, name: str) -> list[Path]:
    """Each header and section of the page as a PNG: an element screenshot, the section scrolled into the
    window (its part in the 1400 x 1000 window for a taller one). A capture beyond the viewport of every
    section (``Page.captureScreenshot`` with ``captureBeyondViewport``) made Chromium lay out the whole page
    at each shot and, on a loaded machine, took past the driver's 120 s and hung the session for the
    tests after it."""
    from selenium.webdriver.common.by import By

    out = []
    for el in drv.find_elements(By.CSS_SELECTOR, "header, section"):
        if not (el.is_displayed() and el.size.get("height", 0) > 0):
            continue
        path = SHOTS / f"words-{name}-{el.get_attribute('id') or el.tag_name.lower()}.png"
        path.write_bytes(el.screenshot_as_png)
        out.append(path)
    return out


def _read(driver: Any, tmp_path: Path, name: str) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = write_html(page_report(name), tmp_path / f"{name}.html")
    severe_messages(driver)
    driver.get(page.as_uri())
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "body[data-ready='1']"))
    for details in driver.find_elements(By.CSS_SELECTOR, ".ptree details"):  # the whole tree, as a reader opens it
        driver.execute_script("arguments[0].open = true", details)
    result = driver.execute_script(READ_PAGE, GPU_WORDS)
    shots = _shoot_sections(driver, name)
    assert shots and all(p.stat().st_size > 0 for p in shots)
    assert not severe_messages(driver)
    return result


@pytest.mark.parametrize("name", [CPU, H200])
def test_no_cut_numbers_and_no_empty_rows(driver: Any, tmp_path: Path, fixtures_dir: object, name: str) -> None:
    result = _read(driver, tmp_path, name)
    assert result["cut"] == [], f"numbers cut to fit their column: {result['cut'][:10]}"
    assert result["emptyRows"] == [], f"rows with no value: {result['emptyRows'][:10]}"
    charts = result["bars"]
    assert set(charts) == {"phase_breakdown", "idle causes"}, "a time-per-phase or an idle chart is missing"
    for chart, bars in charts.items():
        widest = max(bars.values())
        # a phase row too thin to see is left out (its time in the title); a cause's row holds its time as text
        least = MIN_BAR_SHARE * widest if chart == "phase_breakdown" else 0.0
        assert {y: v for y, v in bars.items() if not v > least} == {}, f"{chart}: empty rows {bars}"
    assert {"prefill", "decode"} <= set(charts["phase_breakdown"])
    squashed = {chart: px for chart, px in result["rowPx"].items() if not px >= MIN_ROW_PX}
    assert squashed == {}, f"charts whose rows are too thin to read (px per row): {squashed}"


def test_a_cpu_report_speaks_of_cores_not_the_gpu(driver: Any, tmp_path: Path, fixtures_dir: object) -> None:
    cpu = _read(driver, tmp_path, CPU)
    assert cpu["gpu"] == [], f"GPU words on a CPU report: {sorted(set(cpu['gpu']))}"
    titles = dict(cpu["sections"])
    assert titles.get("idle") == "Why the cores wait"
    assert titles.get("kernels") == "Operators"
    gpu = _read(driver, tmp_path, H200)
    assert dict(gpu["sections"]).get("idle") == "Why the GPU waits"  # the GPU report keeps its words
    assert "GPU" in gpu["gpu"]
