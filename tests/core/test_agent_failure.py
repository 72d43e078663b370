"""The agent's own failure is its result, as in Harbor (issue 34 item 3): the run stops with the
failure's stop condition, no error is recorded, and the task's scoring decides the reward; a box
the agent broke is scored 0 without scoring; a failure the agent's deadline caused is a timeout."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import AgentFailure

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Failing(vf.Task):
    """The oracle's solution fails as ``self.failure`` says; its test gives 0.25 whatever happened."""

    failure: AgentFailure | None = None
    scored_with: list[str] = []

    async def solve(self, runtime, trace) -> None:
        if self.failure is not None:
            raise self.failure

    @vf.reward(weight=1.0)
    def tests(self, trace: vf.Trace) -> float:
        Failing.scored_with.append(trace.stop_condition or "")
        return 0.25


def failing(failure: AgentFailure | None) -> Failing:
    task = Failing(vf.TaskData(prompt="solve it"))
    task.failure = failure
    return task


@pytest.fixture(autouse=True)
def _clear_scores():
    Failing.scored_with = []


async def run(task: vf.Task, **fields) -> vf.Trace:
    config = vf.AgentConfig(model="none", harness=vf.HarnessConfig(id="oracle"), orchestrator="inline", **fields)
    async with vf.make_agent(config) as agent:
        return await agent.run(task)


async def test_a_program_that_failed_on_its_own_is_scored_by_the_tests_not_an_error():
    trace = await run(failing(AgentFailure("the program exited with code 2", "program_failed")))
    assert (trace.stop_condition, trace.errors, trace.ok, trace.is_timeout) == ("program_failed", [], True, False)
    assert (trace.reward, Failing.scored_with) == (0.25, ["program_failed"])
    assert trace.info["agent_failure"] == {"stop_condition": "program_failed", "scored": True,
                                           "message": "the program exited with code 2"}


async def test_an_agent_that_broke_its_box_scores_0_without_scoring():
    trace = await run(failing(AgentFailure("filled its disk quota", "storage_quota", scored=False)))
    assert (trace.stop_condition, trace.errors, trace.reward, Failing.scored_with) == ("storage_quota", [], 0.0, [])
    assert trace.info["scoring_skipped"] == "storage_quota"


async def test_a_failure_the_agent_deadline_caused_is_a_timeout_and_skip_on_timeout_applies():
    timed_out = AgentFailure("the program ran past its deadline", "program_timeout", timeout=True)
    trace = await run(failing(timed_out))
    assert (trace.stop_condition, trace.is_timeout, trace.reward) == ("program_timeout", True, 0.25)
    skipped = await run(failing(timed_out), scoring=vf.ScoringConfig(skip_on_timeout=True))
    assert (skipped.reward, skipped.info["scoring_skipped"], skipped.errors) == (0.0, "timeout", [])


async def test_a_clean_run_has_no_agent_failure():
    trace = await run(failing(None))
    assert (trace.stop_condition, trace.reward, "agent_failure" in trace.info) == ("agent_completed", 0.25, False)
