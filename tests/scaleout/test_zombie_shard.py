"""Issue 19, item 3: a shard flow run whose process dies in the second it turned Running, before
its first heartbeat, is crashed by the zombie automation and run again: the eval does not hang."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.config.eval_tables import DispatchConfig
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.flows.services import zombies
from prefect_rollouts.flows.services.zombies import (
    PENDING_LIMIT_FACTOR,
    ZOMBIE_AFTER,
    crash_tag,
    ensure_zombie_automation,
    zombie_automation,
)
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply
from tests.scaleout.conftest import raw_keys
from tests.scaleout.test_work_pool import flow_runs
from tests.support.waiting import wait_until
from tests.support.workers import PREFECT, Worker, prefect_env

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

CRASH_AFTER_S = 60

STOP = '''\
"""Test fault: a flow run process stops itself (SIGSTOP) and names its flow run in $STOP_DIR; the
test then kills it with its worker (a machine lost in that second). STOP_AT=running: once its flow
run is Running, before the engine sends its first heartbeat; STOP_AT=start: as the interpreter
starts, while the flow run is Pending."""
import os
import pathlib
import signal

if os.environ.get("PREFECT__FLOW_RUN_ID") and os.environ.get("STOP_DIR"):
    def _stop():
        pathlib.Path(os.environ["STOP_DIR"], os.environ["PREFECT__FLOW_RUN_ID"]).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)

    if os.environ.get("STOP_AT") == "start":
        _stop()
    else:
        import prefect.flow_engine as _engine

        _send_heartbeats = _engine._send_heartbeats

        def _stop_before_the_first_heartbeat(*args, **kwargs):
            _stop()
            return _send_heartbeats(*args, **kwargs)

        _engine._send_heartbeats = _stop_before_the_first_heartbeat
'''


@pytest.fixture(scope="module")
def zombie_pool(pg_api: str) -> str:
    subprocess.run([PREFECT, "work-pool", "create", "zombie", "--type", "process"], env=prefect_env(pg_api),
                   check=True, capture_output=True, timeout=120)
    return "zombie"


def run_with_a_dying_shard(api_url: str, pool: str, base_url: str, tmp_path: Path, stop_at: str,
                           run_id: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """An eval of 6 rollouts in one shard, taken by a worker whose flow run processes stop at
    ``stop_at``; once it stopped, that worker is killed with it and a healthy one started. Returns
    the eval's result (``summary`` or ``error``), the dead shard flow run's id, and the run's shard
    flow runs by id."""
    fault, stopped = tmp_path / "fault", tmp_path / "stopped"
    fault.mkdir()
    stopped.mkdir()
    (fault / "sitecustomize.py").write_text(STOP)
    env = {**prefect_env(api_url), "PYTHONPATH": f"{fault}:{prefect_env(api_url)['PYTHONPATH']}",
           "STOP_DIR": str(stopped), "STOP_AT": stop_at}
    doomed = Worker(api_url, pool, f"doomed-{run_id}", 1, tmp_path / "doomed.log", env=env)
    text = eval_toml(tmp_path / "traces", base_url, rollout_granularity="flow",
                     taskset={"id": "tests.prefect.tasksets:numbered", "count": 6})
    text += f'[dispatch]\nwork_pool = "{pool}"\nshard_size = 6\nheartbeat_s = 30\ncrash_after_s = {CRASH_AFTER_S}\n'
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = asyncio.run(eval_flow(load_eval_config(text), run_id=run_id))
        except BaseException as exc:   # reported by the assertion below
            result["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    healthy = None
    try:
        thread.start()
        marker = wait_until(lambda: next(stopped.iterdir(), None), timeout_s=240,
                            what="the doomed worker to start the shard")
        shard = next(run for run in asyncio.run(flow_runs("shard")) if str(run.id) == marker.name)
        assert shard.state_type.value == ("RUNNING" if stop_at == "running" else "PENDING")
        doomed.kill()   # the process never sent a heartbeat
        killed = time.monotonic()
        healthy = Worker(api_url, pool, f"healthy-{run_id}", 1, tmp_path / "healthy.log")
        thread.join(timeout=PENDING_LIMIT_FACTOR * CRASH_AFTER_S + 180)
        assert not thread.is_alive(), f"the eval still waits on the dead shard {time.monotonic() - killed:.0f} s " \
                                      "after it was killed"
    finally:
        doomed.stop()
        if healthy is not None:
            healthy.stop()
    runs = {str(run.id): run for run in asyncio.run(flow_runs("shard")) if run.name.startswith(run_id)}
    return result, marker.name, runs


def test_a_shard_killed_before_its_first_heartbeat_is_crashed_and_run_again(pg_api, zombie_pool, openai_server,
                                                                           tmp_path):
    openai_server.default = lambda request: reply("42")
    result, dead, runs = run_with_a_dying_shard(pg_api, zombie_pool, openai_server.base_url, tmp_path, "running",
                                                "no-heartbeat")
    assert "error" not in result, result.get("error")
    assert result["summary"].rollouts == 6
    written = raw_keys(tmp_path / "traces", "no-heartbeat")
    assert len(written) == len(set(written)) == 6, "every row once"
    crashed = runs[dead]
    assert crashed.state_type.value == "CRASHED"
    assert f"no heartbeat for {CRASH_AFTER_S} s" in crashed.state.message
    waited = (crashed.state.timestamp - crashed.start_time).total_seconds()
    assert CRASH_AFTER_S <= waited < CRASH_AFTER_S + 45, f"crashed {waited:.0f} s after it turned Running"
    rows = read_rollouts(tmp_path / "traces", run_id="no-heartbeat")
    assert set(rows["shard_flow_run_id"]) == set(runs) - {dead}


def test_a_shard_whose_worker_died_while_it_was_pending_is_crashed_and_run_again(pg_api, zombie_pool,
                                                                                 openai_server, tmp_path,
                                                                                 monkeypatch):
    """The worker took the shard (Pending) and died with its process before it turned Running:
    the eval crashes it after ``PENDING_LIMIT_FACTOR * crash_after_s`` (2 x 60 s here)."""
    monkeypatch.setattr(zombies, "PENDING_LIMIT_FACTOR", 2)
    openai_server.default = lambda request: reply("42")
    result, dead, runs = run_with_a_dying_shard(pg_api, zombie_pool, openai_server.base_url, tmp_path, "start",
                                                "stuck-pending")
    assert "error" not in result, result.get("error")
    assert result["summary"].rollouts == 6
    assert runs[dead].state_type.value == "CRASHED" and "Pending for more than 120 s" in runs[dead].state.message
    assert len(read_rollouts(tmp_path / "traces", run_id="stuck-pending")) == 6


def test_an_older_zombie_automation_of_the_same_name_is_replaced(pg_api):
    """An automation made by an older version (armed by heartbeats only) is updated in place; a
    second call changes nothing and adds no automation."""
    settings = DispatchConfig(work_pool="zombie", crash_after_s=75)
    wanted = zombie_automation(settings)
    old = AutomationCore(name=wanted.name, trigger=EventTrigger(
        after={"prefect.flow-run.heartbeat"}, expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"},
        match={"prefect.resource.id": ["prefect.flow-run.*"]},
        match_related={"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{crash_tag(settings)}"},
        for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
        within=dt.timedelta(seconds=75)), actions=wanted.actions)

    async def scenario() -> list[Any]:
        async with get_client() as client:
            old_id = await client.create_automation(old)
            await ensure_zombie_automation(client, settings)
            await ensure_zombie_automation(client, settings)
            found = await client.read_automations_by_name(wanted.name)
            assert [automation.id for automation in found] == [old_id]
            return found
    [automation] = asyncio.run(scenario())
    assert automation.trigger.after == ZOMBIE_AFTER
    assert automation.trigger.expect >= {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"}
    assert automation.trigger.within == dt.timedelta(seconds=75)
