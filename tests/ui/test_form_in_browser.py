"""The nightly deployment's launch form in the real Prefect UI, in a headless Chromium: its layout,
and a run launched from it that a real worker runs with the values typed in."""

from __future__ import annotations

import json
import os
import re

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from prefect_rollouts.environments.bfcl.taskset import CATEGORIES
from prefect_rollouts.traces import read_rollouts
from tests.fakes.openai_server import reply
from tests.support.workers import REPO, prefect

pytestmark = pytest.mark.system

PROPERTY = "ancestor::div[contains(concat(' ', normalize-space(@class), ' '), ' schema-form-property ')][1]"


@pytest.fixture(scope="module")
def deployed(pg_server):
    """deployments/prefect.yaml deployed as the README says; returns (env for prefect commands, nightly-eval)."""
    env = {**os.environ, "PREFECT_API_URL": pg_server, "PREFECT_ROLLOUTS_HOME": str(REPO)}
    prefect("work-pool", "create", "local", "--type", "process", env=env)
    prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all", env=env)
    deployment = httpx.get(f"{pg_server}/deployments/name/launch/nightly-eval", timeout=30).json()
    return env, deployment


class RunForm:
    """The deployment's "Custom run" page, driven as a person would: by the labels on screen."""

    def __init__(self, browser, ui_url: str, deployment_id: str) -> None:
        self.browser, self.wait = browser, WebDriverWait(browser, 60)
        browser.get(f"{ui_url}/deployments/deployment/{deployment_id}/run")
        self.wait.until(expected_conditions.presence_of_element_located((By.XPATH, self._label("Model"))))

    @staticmethod
    def _label(title: str) -> str:
        return f"//span[@class='schema-form-property__label' and normalize-space()='{title} (Optional)']"

    def labels(self) -> list[str]:
        """Every field label on the page, top to bottom, without Prefect's " (Optional)"."""
        spans = self.browser.find_elements(By.CSS_SELECTOR, "span.schema-form-property__label")
        return [span.text.removesuffix(" (Optional)") for span in spans]

    def control(self, title: str) -> WebElement:
        """The input, text area or select of the field labelled ``title``."""
        path = (f"{self._label(title)}/{PROPERTY}/div[@class='p-label__body']"
                "//*[self::input or self::textarea or self::select]")
        return self.wait.until(expected_conditions.element_to_be_clickable((By.XPATH, path)))

    def fill(self, title: str, value: object) -> None:
        control = self.control(title)
        control.send_keys(Keys.CONTROL, "a")
        control.send_keys(Keys.DELETE)
        control.send_keys(str(value))

    def choose(self, option: str) -> None:
        """Press the button ``option`` (the taskset switch)."""
        self.browser.find_element(By.XPATH, f"//button[normalize-space()='{option}']").click()

    def submit(self) -> str:
        """Press Submit; return the id of the flow run it created (from the toast's "View run")."""
        button = self.browser.find_element(By.XPATH, "//button[normalize-space()='Submit']")
        self.browser.execute_script("arguments[0].scrollIntoView()", button)
        button.click()

        def on_the_flow_run(browser) -> re.Match | None:
            """The flow run's page, once reached; until then press the toast's "View run" again (a press while
            the toast slides in can be lost: a CI run at load 8 stayed on the form for 60 s after one)."""
            if (page := re.search(r"/runs/flow-run/([0-9a-f-]{36})", browser.current_url)) is not None:
                return page
            for view_run in browser.find_elements(By.XPATH, "//button[normalize-space()='View run']"):
                browser.execute_script("arguments[0].click()", view_run)
            return None
        return self.wait.until(on_the_flow_run).group(1)


def test_the_launch_form_shows_the_taskset_with_its_options_first_and_the_rest_under_advanced(
        browser, pg_server, deployed):
    _, deployment = deployed
    form = RunForm(browser, pg_server.removesuffix("/api"), deployment["id"])
    labels = form.labels()
    assert labels[:labels.index("More tasksets (a suite)") + 1] == [
        "eval", "Taskset", "Name", "Questions", "Seed", "Largest operand", "Model", "Endpoint", "Number of tasks",
        "Rollouts per task", "Concurrency", "More tasksets (a suite)"]
    suite = labels[labels.index("More tasksets (a suite)") + 1:labels.index("Limits")]   # nightly's bfcl
    assert labels[labels.index("Limits"):labels.index("Advanced")] == [
        "Limits", "Attempts per rollout", "Token budget", "Cost budget (USD)"]
    assert suite[:2] == ["Taskset", "Name"] and "Environment name" in suite and "Agent keys" in suite
    assert labels.count("Run id prefix") == 1 and labels.index("Run id prefix") > labels.index("Advanced")
    assert len(labels) - len(suite) <= 34      # the EvalConfig form had 86 fields
    form.choose("bfcl")           # another taskset brings its own options
    assert form.labels()[2:6] == ["Name", "Category", "Items", "Force tool choice"]
    assert [option.text for option in Select(form.control("Category")).options] == list(CATEGORIES)


def test_a_run_launched_from_the_form_runs_on_a_worker_with_the_values_typed_in(
        browser, pg_server, deployed, openai_server, tmp_path):
    env, deployment = deployed
    openai_server.default = reply("7")
    form = RunForm(browser, pg_server.removesuffix("/api"), deployment["id"])
    form.fill("Questions", 5)
    form.fill("Seed", 7)
    form.fill("Largest operand", 9)
    form.fill("Model", "scripted-model")
    form.fill("Endpoint", openai_server.base_url)
    form.fill("Number of tasks", 3)
    form.fill("Traces directory", tmp_path / "traces")
    launch_id = form.submit()
    prefect("worker", "start", "--pool", "local", "--run-once", env=env, timeout=600)

    api = httpx.Client(base_url=pg_server, timeout=30)
    launch = api.get(f"/flow_runs/{launch_id}").json()
    assert launch["state"]["type"] == "COMPLETED", json.dumps(launch["state"])
    [evaluation] = api.post("/flow_runs/filter", json={"flow_runs": {"parent_flow_run_id": {"any_": [launch_id]}}}
                            ).json()
    assert evaluation["state"]["type"] == "COMPLETED"
    config = evaluation["parameters"]["config"]      # the eval flow run shows the whole config that ran
    arithmetic, bfcl = config["env"]["tasksets"]      # the nightly is a suite: the form's taskset comes first
    assert {key: arithmetic[key] for key in ("id", "count", "seed", "max_value")} == {
        "id": "arithmetic", "count": 5, "seed": 7, "max_value": 9}
    assert (bfcl["id"], bfcl["category"], bfcl["count"]) == ("bfcl", "simple_python", 5)
    assert (config["env"]["agent"]["model"], config["num_tasks"]) == ("scripted-model", 3)

    rows = read_rollouts(tmp_path / "traces", run_id=evaluation["name"])
    assert sorted(rows.loc[rows["environment"] == "arithmetic", "task_id"]) == ["add-7-0", "add-7-1", "add-7-2"]
    assert (rows["environment"] == "bfcl").sum() == 3, "Number of tasks applies to each taskset of the suite"
    assert set(rows["model"]) == {"scripted-model"} and not rows["is_error"].any()
    assert all(request.body["model"] == "scripted-model" for request in openai_server.requests)
    prompts = [request.messages[-1]["content"] for request in openai_server.requests
               if request.messages[-1]["content"].startswith("What is")]
    assert len(prompts) == 3
    operands = [int(n) for prompt in prompts for n in re.findall(r"\d+", prompt.split("?")[0])]
    assert len(operands) == 6 and max(operands) <= 9      # Largest operand reached the taskset
