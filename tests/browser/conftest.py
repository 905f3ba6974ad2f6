"""Headless Chromium for the browser tests (selenium, Debian chromium + chromedriver), with the
browser console captured so a test can fail on any SEVERE message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SHOTS = Path(__file__).resolve().parent / "screenshots"
WAIT_S = 60


@pytest.fixture(scope="session")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path_factory.mktemp('chrome-profile')}"):
        opts.add_argument(arg)
    opts.binary_location = "/usr/bin/chromium"
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    drv.set_page_load_timeout(WAIT_S)
    drv.set_script_timeout(WAIT_S)
    SHOTS.mkdir(exist_ok=True)
    yield drv
    drv.quit()


def severe_messages(drv: Any) -> list[str]:
    """The SEVERE console messages since the last call (reading the log empties it)."""
    return [str(e.get("message", "")) for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
