"""A resumed run's shards are numbered on from its earlier ones, and a crashed shard is reported
as a dead process (issue 19, item 12). The whole dispatch on workers is in tests/scaleout."""

from __future__ import annotations

from uuid import uuid4

import pytest
from prefect import flow, get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.states import Completed, Crashed

from prefect_rollouts.flows.services.dispatch import ended_text, next_shard_index, run_tag


@flow(name="shard-numbering-stand-in")
def stand_in(shard_index: int = 0) -> None:
    """Only its flow runs are made, never run."""


@pytest.mark.prefect
async def test_a_resumed_runs_shards_are_numbered_on_from_its_earlier_shards():
    run_id = f"resumed-{uuid4().hex[:6]}"
    async with get_client() as client:
        assert await next_shard_index(client, run_id) == 0       # a new run starts at 0
        for index in (0, 1, 2):
            await client.create_flow_run(stand_in, parameters={"shard_index": index}, tags=[run_tag(run_id)],
                                         name=f"{run_id} · shard {index}")
        await client.create_flow_run(stand_in, parameters={"shard_index": 7}, tags=[run_tag("another-run")])
        assert await next_shard_index(client, run_id) == 3
        assert await next_shard_index(client, run_id, page=2) == 3     # read page by page


@pytest.mark.unit
def test_a_crashed_shard_is_reported_as_a_dead_process():
    crashed = FlowRun(flow_id=uuid4(), state=Crashed(message="no heartbeat for 30 s"), state_type=StateType.CRASHED,
                      state_name="Crashed")
    assert ended_text(crashed) == ("Crashed: the process running the shard died (its worker was killed, ran out "
                                   "of memory or lost its machine); no heartbeat for 30 s")
    done = FlowRun(flow_id=uuid4(), state=Completed(message="x" * 400), state_type=StateType.COMPLETED,
                   state_name="Completed")
    assert ended_text(done) == "Completed: " + "x" * 300
