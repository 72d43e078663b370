"""A headless Chromium driven by selenium, for the UI tests on a real Prefect server (``pg_server``,
on PostgreSQL, with its UI at the API's address without ``/api``; tests/support/servers.py).

Chromium and its driver come from Debian (``apt-get install chromium chromium-driver``; ``.ci/run``
installs them). Without them the browser tests skip locally and fail in CI.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.extras import unavailable

os.environ.setdefault("SE_AVOID_STATS", "true")   # selenium: no usage statistics


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (Debian's, with its chromedriver: selenium downloads nothing)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        driver = None
    if not (chromium and driver):
        unavailable("the UI tests need chromium and chromium-driver (apt) and selenium (the test extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1200"):
        options.add_argument(argument)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()
