"""A judge on its own ModelEndpoint block, scored inside a rollout flow's scoring task run."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.blocks import ModelEndpoint
from tests.fakes.openai_server import reply
from tests.prefect.test_rollout_flow import task_runs_of

pytestmark = pytest.mark.prefect

JUDGE_KEY = "sk-judge-secret-4242"


class Capital(vf.Task):
    pass


async def test_a_judge_on_its_own_endpoint_block_runs_in_the_scoring_task_run(openai_server, agent_config):
    await ModelEndpoint(base_url=openai_server.base_url, api_key=JUDGE_KEY).save("judge-endpoint", overwrite=True)
    openai_server.play([reply("Paris"), reply("yes")])
    judge = vf.ReferenceJudgeConfig(model="judge", client=vf.ClientConfig(endpoint="judge-endpoint"))
    config = agent_config(orchestrator="prefect", scoring=vf.ScoringConfig(judges=[judge]))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Capital(vf.TaskData(prompt="Capital of France?", answer="Paris")))
    assert trace.reward == 1.0 and trace.judge_calls[0].verdict == "yes"
    agent_request, judge_request = openai_server.requests
    assert judge_request.headers["authorization"] == f"Bearer {JUDGE_KEY}"
    assert "authorization" not in agent_request.headers                 # the agent's key variable is unset
    assert JUDGE_KEY not in trace.model_dump_json()
    runs = await task_runs_of(trace.info["flow_run_id"], 4)
    assert {r.name for r in runs} >= {"scoring"} and all(r.state.is_completed() for r in runs)
