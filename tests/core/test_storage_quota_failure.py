"""A box the agent filled past its disk quota (issue 34 item 1) ends the rollout as the agent's failure
wherever the runtime says so: a tool call of the tools harness ends the segment (its result says why),
and a finalize hook's command in that box is not an error either. Without Docker: the runtime's
``AgentFailure`` is raised by task code here."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import AgentFailure
from tests.fakes.openai_server import reply, tool_call

pytestmark = pytest.mark.unit

FULL = "[env.agent.runtime] storage_mb = 64: the rollout wrote 80 MiB to the container's disk"


class Filled(vf.Task):
    """Its ``fill`` tool, or its finalize hook when ``in_finalize``, meets a box past its quota."""

    in_finalize = False

    def tools(self):
        def fill() -> str:
            """Write a lot."""
            raise AgentFailure(FULL, "storage_quota", scored=False)
        return [fill]

    async def finalize(self, trace):
        if self.in_finalize:
            raise AgentFailure(FULL, "storage_quota", scored=False)

    @vf.reward
    def tests(self, trace):
        return 1.0


async def test_a_tool_call_that_filled_the_box_ends_the_segment_and_scores_0(openai_server, agent_config):
    openai_server.play([tool_call("fill"), reply("never asked")])
    config = agent_config(harness=vf.HarnessConfig(id="tools", runtime_tools=[]))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Filled(vf.TaskData(prompt="go")))
    assert (trace.stop_condition, trace.reward, trace.errors) == ("storage_quota", 0.0, [])
    assert [(t.name, t.output, t.is_error) for t in trace.tool_calls] == [("fill", f"Error: {FULL}", True)]
    assert trace.messages[-1]["role"] == "tool" and len(openai_server.requests) == 1   # the model was not asked again


async def test_a_finalize_hook_in_a_box_past_its_quota_is_the_agent_s_failure_not_an_error(openai_server,
                                                                                          agent_config):
    openai_server.play([reply("done")])
    task = Filled(vf.TaskData(prompt="go"))
    task.in_finalize = True
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(id="tools", runtime_tools=[]))) as agent:
        trace = await agent.run(task)
    assert (trace.stop_condition, trace.reward, trace.errors) == ("storage_quota", 0.0, [])
    assert trace.info["agent_failure"]["message"] == FULL
