"""The trace viewer (issue 39) in a headless Chromium: served by ``prefect-rollouts traces view`` and as the
``--html`` file opened from disk with the network off; a rollout whose texts carry ``<script>`` and
``javascript:`` links runs nothing. One browser and one dataset for the module.

``VIEWER_SCREENSHOTS=docs/images`` saves the pages' pictures there (docs/viewer.md's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.support.workers import REPO
from tests.traces.viewer_runs import HOSTILE, make_two_runs

pytestmark = pytest.mark.system

TITLE = "prefect-rollouts traces"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, _openai_server_session):
    """tests/traces/viewer_runs.py's two runs (tools rollouts, a hostile one, a steered one)."""
    return make_two_runs(tmp_path_factory.mktemp("viewer-browser"), _openai_server_session)


@pytest.fixture(scope="module")
def served(dataset):
    """``prefect-rollouts traces view ROOT --no-open`` in a process of its own; yields the URL it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen([sys.executable, "-m", "prefect_rollouts.cli", "traces", "view", str(dataset),
                                "--no-open"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = process.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", line)
        assert found, line + process.stdout.read() if process.poll() is not None else line
        yield found.group(0)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def html_file(dataset, tmp_path_factory):
    """``prefect-rollouts traces view ROOT --html FILE``: the file."""
    page = tmp_path_factory.mktemp("viewer-html") / "run.html"
    subprocess.run([sys.executable, "-m", "prefect_rollouts.cli", "traces", "view", str(dataset), "--html", str(page)],
                   check=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True)
    return page


def wait_for(browser, css: str, text: str | None = None):
    """The first element matching ``css`` (whose text contains ``text``), waiting up to 30 s."""
    wait = WebDriverWait(browser, 30)
    if text is not None:
        wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
    return wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css)))


def plot_drawn(browser) -> bool:
    """Every plot on the page has loaded as an image with a size."""
    return browser.execute_script(
        "const p = [...document.querySelectorAll('img.plot')];"
        "return p.length > 0 && p.every((i) => i.complete && i.naturalWidth > 100);")


def shoot(browser, name: str) -> None:
    if os.environ.get("VIEWER_SCREENSHOTS"):
        browser.save_screenshot(str(Path(os.environ["VIEWER_SCREENSHOTS"]) / name))


def check_views(browser, start: str) -> None:
    """The run list, a run's rollouts filtered, a rollout with its tool call, a comparison: each with its plots."""
    browser.get(start)
    runs = wait_for(browser, "#runs", "run-b")
    assert [row.text.split()[0] for row in runs.find_elements(By.CSS_SELECTOR, "tbody tr")] == ["run-a", "run-b"]
    runs.find_element(By.LINK_TEXT, "run-b").click()
    count = wait_for(browser, "#rows-count", "6 of 6 rollouts")
    WebDriverWait(browser, 30).until(lambda b: plot_drawn(b))
    shoot(browser, "viewer-run.png")
    header = browser.find_element(By.XPATH, "//table[@id='rollouts']//th[normalize-space()='task_id']")
    header.click()
    header.click()   # twice: descending
    first_column = [row.text.split()[0] for row in browser.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr")]
    assert first_column == ["t4", "t3", "t2", "t1", "steered", "hostile"]
    browser.find_element(By.ID, "f-task").send_keys("s")
    assert count.text == "2 of 6 rollouts"   # hostile and steered (of t1-t4 too)
    Select(browser.find_element(By.ID, "f-stop")).select_by_visible_text("user_closed")
    assert count.text == "1 of 6 rollouts"
    assert [row.text.split()[0] for row in browser.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr")] == ["steered"]
    Select(browser.find_element(By.ID, "f-stop")).select_by_visible_text("any")
    browser.find_element(By.ID, "f-task").clear()
    browser.find_element(By.ID, "f-task").send_keys("t3")
    browser.find_element(By.LINK_TEXT, "t3").click()
    conversation = wait_for(browser, "#conversation", "tool call: add")
    text = conversation.text
    assert "what is 2 + 1?" in text and '"a": 2' in text and "tool result: add" in text
    calls = [row.text.split() for row in browser.find_elements(By.CSS_SELECTOR, "#model-calls tbody tr")]
    assert [(call[0], call[-2], call[-1]) for call in calls] == [("0", "tool_calls", "200"), ("1", "stop", "200")]
    assert "reward: correct 1 1" in browser.find_element(By.ID, "rewards").text
    shoot(browser, "viewer-rollout.png")
    browser.find_element(By.LINK_TEXT, "runs").click()
    wait_for(browser, "#compare-go").click()
    comparison = wait_for(browser, "#comparison", "adding")
    assert "t3, t4" in comparison.text   # flipped to pass
    assert "adding t3 0 1 1" in browser.find_element(By.ID, "per-task").text
    WebDriverWait(browser, 30).until(lambda b: plot_drawn(b))
    assert browser.title == TITLE


def test_the_served_viewer_shows_runs_rollouts_a_filter_a_rollout_and_a_comparison(browser, served):
    check_views(browser, served)
    browser.get(served.split("?")[0])   # without the token: refused
    assert "a token is required" in browser.find_element(By.TAG_NAME, "body").text


def test_the_html_file_from_disk_shows_the_same_with_the_network_off(browser, html_file):
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.emulateNetworkConditions", {
        "offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    try:
        check_views(browser, html_file.as_uri())
        fetched = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name);")
        assert [name for name in fetched if not name.startswith("data:")] == []
    finally:
        browser.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})


@pytest.mark.parametrize("where", ["served", "file"])
def test_a_hostile_rollout_is_shown_as_text_and_runs_nothing(browser, served, html_file, where):
    start = served if where == "served" else html_file.as_uri()
    browser.get(start + "#/run/run-b")
    wait_for(browser, "#rows-count", "6 of 6")
    browser.find_element(By.LINK_TEXT, "hostile").click()
    conversation = wait_for(browser, "#conversation", "click me")
    assert conversation.text.count("<script>document.title='pwned'</script>") == 3   # prompt, tool output, reply
    assert HOSTILE.split("<a")[0] in conversation.text
    assert browser.title == TITLE
    assert browser.find_elements(By.ID, "evil") == [] and browser.find_elements(By.CSS_SELECTOR, "img[src=x]") == []
    assert browser.find_elements(By.CSS_SELECTOR, "a[href^='javascript']") == []
    assert len(browser.find_elements(By.TAG_NAME, "script")) == 2   # the data (JSON) and the viewer's own
