"""One stage policy, honoured the same way by every orchestrator: the waits between stage retries."""

from __future__ import annotations

import itertools
import time

import pytest

import prefect_rollouts as vf
from tests.fakes.openai_server import reply, status

BACKOFF_S = 0.2
NOMINAL = [0.2, 0.4, 0.8]          # doubled each retry (StageRetryConfig.backoff_s), as the policy says


def timed(step, arrivals):
    def record(request):
        arrivals.append(time.monotonic())
        return step
    return record


@pytest.mark.parametrize("path", [pytest.param("inline", marks=pytest.mark.unit),
                                  pytest.param("prefect flow", marks=pytest.mark.prefect),
                                  pytest.param("prefect interaction", marks=pytest.mark.prefect)])
async def test_segment_retries_wait_the_same_doubling_delays_on_every_path(openai_server, agent_config, path):
    arrivals: list[float] = []
    openai_server.play([timed(status(500), arrivals)] * 3 + [timed(reply("ok"), arrivals)])
    client = vf.ClientConfig(base_url=openai_server.base_url, api_key_env="",
                             retries=vf.RetryConfig(max_retries=0))   # only the stage retries
    config = agent_config(client=client, harness="chat", orchestrator="inline" if path == "inline" else "prefect",
                          retries=vf.StageRetryConfig(segment=3, backoff_s=BACKOFF_S))
    task = vf.Task(vf.TaskData(prompt="hi"))
    async with vf.make_agent(config) as agent:
        if path == "prefect interaction":
            async with agent.interaction(task) as interaction:
                await interaction.turn()
            trace = interaction.trace
        else:
            trace = await agent.run(task)
    assert trace.errors == [] and trace.last_reply == "ok" and len(arrivals) == 4
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # jitter: inline U(0.5, 1.5) x delay; Prefect's clamped Poisson within (0.63, 1.5) x delay; plus overhead
    assert all(0.5 * d - 0.02 <= g <= 1.5 * d + 0.35 for g, d in zip(gaps, NOMINAL, strict=True)), (path, gaps)
