"""Retake the README's pictures: the H200 engine report's roofline and its phase table, as the
standalone HTML report draws them, in headless Chromium.

    python docs/screenshots.py            # writes docs/report-roofline.png and docs/report-phases.png

The report is tests/fixtures/h200/h200_llama1b_b1_p2048_g64.perfscope (perfscope's engine,
llama-3.2-1b, batch 1, prompt 2048, 64 new tokens, profiled on one NVIDIA H200). Needs
/usr/bin/chromium and /usr/bin/chromedriver (Debian: chromium chromium-driver) and selenium.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "tests" / "fixtures" / "h200" / "h200_llama1b_b1_p2048_g64.perfscope"
WIDTH, HEIGHT = 1800, 1000
SHOTS = {
    "report-roofline.png": "(//section[@id='roofline']//div[contains(@class, 'js-plotly-plot')])[1]",
    "report-phases.png": "//section[@id='metrics']//h3[text()='Phases']/following-sibling::*[1]",
}
"""PNG under docs/ -> the element of the page it shows (XPath)."""


def write_html(report: Path, html: Path) -> None:
    """The page exactly as a user gets it: `perfscope report REPORT -o HTML` (plotly.js inlined)."""
    subprocess.run([sys.executable, "-m", "perfscope", "report", str(report), "-o", str(html)], check=True)


def shoot(html: Path, out_dir: Path) -> list[Path]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    with tempfile.TemporaryDirectory() as profile:
        opts = webdriver.ChromeOptions()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--hide-scrollbars", "--force-device-scale-factor=1",
                    f"--window-size={WIDTH},{HEIGHT}", f"--user-data-dir={profile}"):
            opts.add_argument(arg)
        opts.binary_location = "/usr/bin/chromium"
        drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        try:
            drv.set_page_load_timeout(120)
            drv.get(html.as_uri())
            deadline = time.monotonic() + 120
            while not drv.execute_script("return document.querySelectorAll('#roofline .plot-container').length"):
                if time.monotonic() > deadline:
                    raise SystemExit("screenshots: the roofline figure did not render within 120 s")
                time.sleep(0.5)
            time.sleep(1.0)  # plotly's first layout pass
            # the phase table is wider than the page's column: let it take the width it needs
            drv.execute_script("""for (const t of document.querySelectorAll('#metrics table')) {
                for (let e = t; e && e !== document.body; e = e.parentElement) {
                    e.style.maxWidth = 'none'; e.style.overflow = 'visible'; }
                t.style.width = 'max-content'; }""")
            written = []
            for name, xpath in SHOTS.items():
                element = drv.find_element(By.XPATH, xpath)
                drv.execute_script("arguments[0].scrollIntoView({block: 'start'});", element)
                time.sleep(0.3)
                path = out_dir / name
                path.write_bytes(element.screenshot_as_png)
                written.append(path)
            return written
        finally:
            drv.quit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, default=REPORT, help="report folder (default: the H200 engine report)")
    ap.add_argument("--out", type=Path, default=REPO / "docs", help="folder for the PNGs (default: docs/)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        write_html(args.report, html)
        for path in shoot(html, args.out):
            print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
