"""A real Prefect server (with its UI, on PostgreSQL) and a headless Chromium driven by selenium.

Chromium and its driver come from Debian (``apt-get install chromium chromium-driver``; ``.ci/run``
installs them). Without them the browser tests skip locally and fail in CI.
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest

from prefect_rollouts import pgserver
from tests.pg_api import server_home

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("SE_AVOID_STATS", "true")   # selenium: no usage statistics


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def prefect_server():
    """The API URL of a Prefect server started for this module; its UI is at the same address without ``/api``."""
    with server_home("ui-") as home:   # stopped and removed after, also on failure
        yield pgserver.start(home, port=_free_port(), pg_port=_free_port())


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
        reason = "the UI tests need chromium and chromium-driver (apt) and selenium (the test extra)"
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must provide them (.ci/run, scripts/test)")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1200"):
        options.add_argument(argument)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()
