"""Isolated scoring in Prefect: its own task run, whose retries (fresh containers) are visible."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from tests.docker.test_docker_runtime import KilledOnce, play_solution
from tests.prefect.test_rollout_flow import task_runs_of
from tests.support.docker import docker_config

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine", "prefect_harness")]


async def test_a_killed_scoring_container_shows_as_a_retried_scoring_task_run(openai_server, agent_config):
    KilledOnce.kills = 1
    play_solution(openai_server)
    config = agent_config(orchestrator="prefect", runtime=docker_config(), scoring=vf.ScoringConfig(
        mode="isolated", retries=vf.RetryConfig(max_retries=2, backoff_s=0.01)))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(KilledOnce(vf.TaskData(prompt="solve", artifacts=["solution.txt"])))
    assert (trace.reward, trace.errors, trace.info["scoring_attempts"]) == (1.0, [], 2)
    runs = {r.name: r for r in await task_runs_of(trace.info["flow_run_id"], 4)}
    assert (runs["scoring"].run_count, runs["scoring"].state.name) == (2, "Completed")
