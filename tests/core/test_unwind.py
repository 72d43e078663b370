"""Cleanup that finishes although its task is cancelled again and again (unwind.run_to_end), as a
rollout's teardown does when a stopped eval cancels it, and a container removal a busy engine refuses once.

CI saw one container of four left after SIGTERM: the teardown of a rollout was cancelled a second time
while it waited for the container's removal, and the eval ended before the removal did."""

from __future__ import annotations

import asyncio
from typing import Any

import docker.errors
import pytest

import prefect_rollouts as vf
from prefect_rollouts.rollout_state import RolloutState
from prefect_rollouts.runtimes.docker import engine as docker_engine
from prefect_rollouts.stages import teardown
from prefect_rollouts.unwind import run_to_end

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


async def cancel_repeatedly(task: asyncio.Task[Any], times: int) -> None:
    for _ in range(times):
        await asyncio.sleep(0.02)
        task.cancel()


async def test_run_to_end_waits_through_every_cancellation_then_raises_the_first():
    ended: list[str] = []

    async def cleanup() -> str:
        await asyncio.sleep(0.3)
        ended.append("cleanup")
        return "done"

    waiting = asyncio.ensure_future(run_to_end(cleanup()))
    await cancel_repeatedly(waiting, 3)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert ended == ["cleanup"]


async def test_run_to_end_returns_the_result_or_raises_the_error_when_not_cancelled():
    async def fails() -> None:
        raise ValueError("boom")

    assert await run_to_end(asyncio.sleep(0, result=7)) == 7
    with pytest.raises(ValueError, match="boom"):
        await run_to_end(fails())


class SlowStop:
    """A runtime whose ``stop`` takes a while (a container's removal under load)."""

    def __init__(self) -> None:
        self.stopped = False

    async def stop(self) -> None:
        await asyncio.sleep(0.3)
        self.stopped = True


async def test_a_rollouts_teardown_stops_its_runtime_although_cancelled_twice():
    runtime = SlowStop()
    config = vf.AgentConfig(model="m")
    state = RolloutState(config=config, task=vf.Task(vf.TaskData(prompt="p")), client=None,  # type: ignore[arg-type]
                         trace=vf.Trace(task_id="t", model="m"), harness=None,  # type: ignore[arg-type]
                         scoring=config.scoring, runtime=runtime)  # type: ignore[arg-type]
    tearing_down = asyncio.ensure_future(teardown(state))
    await cancel_repeatedly(tearing_down, 2)
    with pytest.raises(asyncio.CancelledError):
        await tearing_down
    assert runtime.stopped and state.runtime is None
    assert "teardown" in state.trace.timings


class FlakyContainer:
    """A container whose forced removal fails ``failures`` times first (a busy engine)."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def remove(self, **options: Any) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise docker.errors.APIError("could not kill: tried to kill container, but did not receive an exit event")


def test_a_container_removal_the_engine_refuses_once_is_tried_again(monkeypatch):
    monkeypatch.setattr(docker_engine.time, "sleep", lambda seconds: None)
    container = FlakyContainer(failures=1)
    docker_engine.remove(container)
    assert container.calls == 2
    refusing = FlakyContainer(failures=docker_engine.REMOVE_TRIES)
    with pytest.raises(docker.errors.APIError):
        docker_engine.remove(refusing)
    assert refusing.calls == docker_engine.REMOVE_TRIES
