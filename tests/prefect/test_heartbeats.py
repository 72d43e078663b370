"""Rollout flow runs send no heartbeats (their eval or shard flow run's heartbeats cover the process)."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply
from tests.support.waiting import wait_for

pytestmark = pytest.mark.prefect


async def test_only_the_eval_flow_run_sends_heartbeats(tmp_path, openai_server):
    openai_server.default = reply("0")
    config = load_eval_config(eval_toml(tmp_path, openai_server.base_url, rollout_granularity="flow",
                                        taskset={"id": "tests.prefect.tasksets:numbered", "count": 3}))
    summary = await eval_flow(config, run_id="heartbeats")
    rollout_runs = set(read_rollouts(tmp_path, run_id="heartbeats")["flow_run_id"])
    assert len(rollout_runs) == 3

    async def beating() -> set[str]:
        async with get_client() as client:
            page = await client.read_events(EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"])),
                                            limit=50)
        return {event.resource.id.removeprefix("prefect.flow-run.") for event in page.events}
    beats = await wait_for(lambda: _has(beating, summary.flow_run_id), timeout_s=30,
                           what="a heartbeat of the eval flow run")
    assert summary.flow_run_id in beats, "the eval flow run sends Prefect's heartbeats"
    assert not beats & rollout_runs, "rollout flow runs send none"


async def _has(read, flow_run_id):
    found = await read()
    return found if flow_run_id in found else None
