"""deployments/prefect.yaml deployed to a real local Prefect server (on PostgreSQL) and run once by a worker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import httpx
import pytest

from prefect_rollouts import pgserver
from prefect_rollouts.traces import read_rollouts
from tests.fakes.openai_server import reply

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def real_server():
    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-server-"))   # PostgreSQL's user must reach it
    home.chmod(0o755)
    api_url = pgserver.start(home, port=_free_port(), pg_port=_free_port())
    yield api_url
    pgserver.stop(home)
    shutil.rmtree(home, ignore_errors=True)


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prefect(*args, env, timeout=300) -> str:
    result = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_nightly_deployment_deploys_from_prefect_yaml_and_runs_once(tmp_path, real_server, openai_server):
    openai_server.default = reply("0")
    env = {**os.environ, "PREFECT_API_URL": real_server, "PREFECT_ROLLOUTS_HOME": str(REPO), "DO_NOT_TRACK": "1"}
    env.pop("PREFECT_HOME", None)
    prefect("work-pool", "create", "local", "--type", "process", env=env)
    prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all", env=env)

    api = httpx.Client(base_url=real_server, timeout=30)
    deployment = api.get("/deployments/name/eval/nightly-eval").json()
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in deployment["schedules"]] == [("0 2 * * *", "UTC")]
    schema = deployment["parameter_openapi_schema"]
    assert schema["properties"]["config"]["$ref"].endswith("/EvalConfig")      # the UI renders a form for it
    assert {"env", "num_tasks", "rollouts_per_task", "traces"} <= set(schema["definitions"]["EvalConfig"]["properties"])

    config = deployment["parameters"]["config"]
    config["num_tasks"] = 3
    config["traces"]["path"] = str(tmp_path / "traces")
    config["env"]["agent"]["client"]["base_url"] = openai_server.base_url
    flow_run = api.post(f"/deployments/{deployment['id']}/create_flow_run",
                        json={"parameters": {"config": config, "run_id": "from-deployment"}}).json()
    prefect("worker", "start", "--pool", "local", "--run-once", env=env, timeout=600)

    state = api.get(f"/flow_runs/{flow_run['id']}").json()["state"]
    assert state["type"] == "COMPLETED", json.dumps(state)
    assert len(read_rollouts(tmp_path / "traces", run_id="from-deployment")) == 3
    artifacts = api.post("/artifacts/filter", json={"artifacts": {"key": {"any_": ["eval-summary-nightly-eval"]}}})
    assert [a["description"].split(" (")[0] for a in artifacts.json()] == ["Summary of run from-deployment"]


def test_serve_builds_the_nightly_eval_on_its_cron_and_time_zone_and_the_janitor():
    from prefect_rollouts.flows.deployments import build_deployments

    nightly, janitor = build_deployments(REPO / "examples" / "arithmetic.toml", cron="30 3 * * 1",
                                         timezone="Europe/Berlin")
    assert [(s.schedule.cron, s.schedule.timezone) for s in nightly.schedules] == [("30 3 * * 1", "Europe/Berlin")]
    assert nightly.parameters["config"]["env"]["taskset"]["id"] == "arithmetic"
    assert [s.schedule.interval.total_seconds() for s in janitor.schedules] == [3600]
