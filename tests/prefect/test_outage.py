"""A Prefect API outage during an eval: rollouts go on, states are put right after; past the limit, a clean stop.

A real PostgreSQL-backed Prefect server (``pgserver``) whose API process is killed and started
again; the eval is the real CLI in a subprocess. ``PREFECT_CLIENT_MAX_RETRIES=1`` makes Prefect's
client give up after about 2 s, so a short outage shows what a long one does with the default 5.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId, FlowRunFilterName

from prefect_rollouts.servers import postgres as pgserver
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.cli import eval_env, finish, start_eval
from tests.support.datasets import durable_rows
from tests.support.ports import free_port
from tests.support.servers import server_home
from tests.support.waiting import wait_for

pytestmark = pytest.mark.system

ROLLOUTS = 24


class Server:
    """The Prefect API of a PostgreSQL-backed local server, to stop (kill -9) and start again."""

    def __init__(self, home: Path) -> None:
        self.home, self.port, self.pg_port = home, free_port(), free_port()
        self.api_url = ""

    def start(self) -> None:
        self.api_url = pgserver.start(self.home, port=self.port, pg_port=self.pg_port)

    def kill_api(self) -> None:
        os.killpg(int((self.home / "prefect-server.pid").read_text()), signal.SIGKILL)

    def stop_postgres(self) -> None:
        """Stop the database under a live API: ``/health`` stays 200, every other call is a 500."""
        pgserver._as_postgres([str(pgserver.postgres_bin() / "pg_ctl"), "-D", str(self.home / "pgdata"),
                               "-m", "immediate", "-w", "stop"])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with server_home("outage-") as home:   # stopped and removed after, also on failure
        server = Server(home)
        server.start()
        yield server


@pytest.fixture
def api(server):
    server.start()   # again, if a test left the API down
    return server


def write_config(tmp_path: Path, base_url: str, granularity: str) -> Path:
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", base_url, taskset={"id": "arithmetic", "count": ROLLOUTS},
                                retries=True, rollout_granularity=granularity, max_concurrent=2, batch_size=4))
    return config


def client_env(api_url: str) -> dict[str, str]:
    """An eval's environment on ``api_url`` whose Prefect client gives up after one retry (about 2 s)."""
    return eval_env(api_url, PREFECT_CLIENT_MAX_RETRIES="1", PREFECT_LOGGING_LEVEL="WARNING")


async def wait_for_rows(process: subprocess.Popen[str], root: Path, rows: int, timeout_s: float = 120) -> None:
    """Wait until ``rows`` rollouts of the running eval are durable (it must not exit meanwhile)."""
    async def written() -> bool:
        assert process.poll() is None, process.stdout.read()[-3000:]
        return durable_rows(root) >= rows
    assert await wait_for(written, timeout_s=timeout_s, interval_s=0.1, what=f"{rows} durable rows")


async def final_states(api_url: str, run_id: str, granularity: str) -> list[str]:
    """State names of the rollouts' flow runs (flow) or task runs (task) of ``run_id`` on the server."""
    async with PrefectClient(api_url) as client:
        if granularity == "flow":
            runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["rollout"])),
                                               limit=200)
            return [r.state_name for r in runs if r.parameters.get("rollout", {}).get("run_id") == run_id]
        [eval_run] = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_id])))
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[eval_run.id])),
                                           limit=200)
        return [r.state_name for r in runs if r.name.startswith("add-")]


@pytest.mark.parametrize("granularity", ["task", "flow", "batch"])
async def test_rollouts_go_on_through_an_api_outage_and_prefect_states_are_reconciled(
        tmp_path, openai_server, api, granularity):
    openai_server.default = delayed(0.4, reply("0"))
    run_id = f"outage-{granularity}"
    process = start_eval(write_config(tmp_path, openai_server.base_url, granularity), "--run-id", run_id,
                         env=client_env(api.api_url))
    try:
        await wait_for_rows(process, tmp_path / "traces", 4)
        api.kill_api()
        at_outage = durable_rows(tmp_path / "traces")
        await wait_for_rows(process, tmp_path / "traces", ROLLOUTS)   # all of them, well past the client's ~2 s
        during = durable_rows(tmp_path / "traces") - at_outage
        assert process.poll() is None, process.stdout.read()[-3000:]   # it waits for the API to reconcile
        api.start()
        output = finish(process, 180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output
    assert during >= 4, f"only {during} rollouts became durable during the outage"
    assert durable_rows(tmp_path / "traces") == ROLLOUTS
    if granularity == "batch":
        return   # a shard task run per 4 rollouts; the rows are the point
    states: list[str] = []

    async def reconciled() -> bool:
        # each rollout Completed once; with flow granularity a flow run the outage cut off before it
        # could start may also exist, and must end Crashed (closed by the eval), never left running
        states[:] = await final_states(api.api_url, run_id, granularity)
        others = [state for state in states if state != "Completed"]
        allowed = {"Crashed"} if granularity == "flow" else set()
        return states.count("Completed") == ROLLOUTS and set(others) <= allowed
    # the server records runs from events; the events client reconnects with backoff
    assert await wait_for(reconciled, timeout_s=150, interval_s=1, what=lambda: (
        f"each rollout's run reconciled ({len(states)} runs on the server: {sorted(set(states))})"))


async def test_an_outage_past_the_limit_stops_the_eval_with_the_resume_command(tmp_path, openai_server, api):
    openai_server.default = delayed(1.0, reply("0"))
    config = write_config(tmp_path, openai_server.base_url, "task")
    process = start_eval(config, "--run-id", "too-long", "--set", "api_outage_limit_s=4", env=client_env(api.api_url))
    try:
        await wait_for_rows(process, tmp_path / "traces", 2)
        api.kill_api()
        output = finish(process, 120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    durable = durable_rows(tmp_path / "traces")
    assert process.returncode == 1 and "Traceback" not in output, output[-3000:]
    assert "unreachable for" in output and "api_outage_limit_s" in output
    assert (f"{durable} of {ROLLOUTS} rollouts durable; resume with: "
            f"prefect-rollouts eval {config} --set=api_outage_limit_s=4 --resume too-long") in output
    assert 0 < durable < ROLLOUTS   # it stopped at the limit, not after the rollouts (12 s of replies, 2 at once)
    api.start()
    resumed = start_eval(config, "--resume", "too-long", env=client_env(api.api_url))
    output = finish(resumed, 180)
    assert resumed.returncode == 0, output[-3000:]
    assert durable_rows(tmp_path / "traces") == ROLLOUTS   # each rollout once


# The limit must outlast the rollouts left when the outage starts (3 of 24 were not done after 4 s of a
# database outage at flow granularity on a machine at load 11: each rollout's flow run calls fail slowly
# then), and the end waits it out before giving up on the API: so it is longer only where it must be.
@pytest.mark.parametrize(("lost", "granularity", "limit_s"), [("api", "batch", 4), ("database", "flow", 15)])
async def test_an_outage_at_the_end_prints_the_summary_exits_1_and_names_the_command_that_writes_the_states(
        tmp_path, openai_server, api, lost, granularity, limit_s):
    openai_server.default = delayed(0.2, reply("0"))
    run_id = f"done-offline-{lost}"
    config = write_config(tmp_path, openai_server.base_url, granularity)
    process = start_eval(config, "--run-id", run_id, "--set", f"api_outage_limit_s={limit_s}",
                         env=client_env(api.api_url))
    try:
        await wait_for_rows(process, tmp_path / "traces", 1)
        api.kill_api() if lost == "api" else api.stop_postgres()   # the rollouts go on; the end needs the API
        output = finish(process, 300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        api.start()
    assert durable_rows(tmp_path / "traces") == ROLLOUTS
    assert process.returncode == 1 and "Traceback" not in output, output[-3000:]
    assert f"run {run_id}" in output and "every rollout is durable, but Prefect could not be told" in output
    command = f"prefect-rollouts traces reconcile {tmp_path / 'traces'} {run_id}"
    assert command in " ".join(output.split()), output[-3000:]
    assert await eval_state(api.api_url, run_id) == ["Running"]      # what the outage left
    mended = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "prefect_rollouts.cli", *command.split()[1:]], capture_output=True,
        text=True, timeout=120, env={**os.environ, "PREFECT_API_URL": api.api_url})
    assert mended.returncode == 0, mended.stdout + mended.stderr
    assert f"eval flow runs set: 1: {run_id} (Completed)" in mended.stdout
    assert await eval_state(api.api_url, run_id) == ["Completed"]
    if granularity == "flow":   # every rollout has a final flow run: set, created from its row, or closed
        states = await final_states(api.api_url, run_id, "flow")
        others = [state for state in states if state != "Completed"]
        assert states.count("Completed") == ROLLOUTS and set(others) <= {"Crashed"}, sorted(states)
    again = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "prefect_rollouts.cli", *command.split()[1:]], capture_output=True,
        text=True, timeout=120, env={**os.environ, "PREFECT_API_URL": api.api_url})
    assert "eval flow runs set: 0" in again.stdout and "rollout flow runs created: 0" in again.stdout

async def eval_state(api_url: str, run_id: str) -> list[str]:
    async with PrefectClient(api_url) as client:
        runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["eval"])),
                                           flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_id])))
        return [r.state_name for r in runs]


async def test_losing_postgresql_under_a_live_api_is_an_outage_and_every_state_is_put_right(
        tmp_path, openai_server, api):
    openai_server.default = delayed(0.4, reply("0"))
    run_id = "database-lost"
    process = start_eval(write_config(tmp_path, openai_server.base_url, "flow"), "--run-id", run_id,
                         env=client_env(api.api_url))
    try:
        await wait_for_rows(process, tmp_path / "traces", 4)
        api.stop_postgres()
        async with httpx.AsyncClient(timeout=5) as client:   # the API itself lives
            assert (await client.get(f"{api.api_url}/health")).status_code == 200
        at_outage = durable_rows(tmp_path / "traces")
        await wait_for_rows(process, tmp_path / "traces", ROLLOUTS)   # all of them, well past the client's ~2 s
        during = durable_rows(tmp_path / "traces") - at_outage
        assert process.poll() is None, process.stdout.read()[-3000:]
        api.start()   # brings PostgreSQL back under the running API
        output = finish(process, 180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 0, output[-3000:]
    assert "database" in output and "Traceback" not in output, output[-3000:]
    assert during >= 4, f"only {during} rollouts became durable while the database was away"
    assert durable_rows(tmp_path / "traces") == ROLLOUTS
    states = await final_states(api.api_url, run_id, "flow")
    others = [state for state in states if state != "Completed"]
    assert states.count("Completed") == ROLLOUTS and set(others) <= {"Crashed"}, sorted(states)
    assert await eval_state(api.api_url, run_id) == ["Completed"]
