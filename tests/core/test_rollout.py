"""Rollout, its stage policy table and RolloutSpec (plain data that rebuilds a rollout anywhere)."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr, ValidationError

import prefect_rollouts as vf
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.rollout import RolloutSpec, StagePolicy, stage_policies
from tests.fakes.openai_server import reply

pytestmark = pytest.mark.unit

TASKSET = "tests.prefect.tasksets:numbered"


def comparable(trace: vf.Trace) -> dict:
    data = json.loads(trace.model_dump_json())
    for key in ("id", "started_at", "timings"):
        data.pop(key)
    for call in data["model_calls"]:
        call.pop("started_at"), call.pop("latency_ms")
    return data


def test_the_policy_table_comes_from_the_agent_config_once():
    config = vf.AgentConfig(model="m", retries=vf.StageRetryConfig(setup=2, segment=3, backoff_s=0.5))
    isolated = vf.ScoringConfig(mode="isolated", retries=vf.RetryConfig(max_retries=4, backoff_s=1, max_backoff_s=3))
    policies = stage_policies(config, isolated)
    assert (policies["setup"].retries, policies["segment"].retries, policies["scoring"].retries) == (2, 3, 4)
    assert policies["segment"].delays_s() == [0.5, 1.0, 2.0]
    assert policies["scoring"].delays_s() == [1, 2, 3, 3]                       # capped by max_backoff_s
    assert stage_policies(config, vf.ScoringConfig(mode="shared"))["scoring"].retries == 0   # never retried
    assert {policies[name].retries for name in ("finalize", "skip-check", "teardown")} == {0}


def test_a_policy_retries_only_retryable_errors_of_its_types():
    policy = StagePolicy(retries=1, retry_on=(vf.ProviderError,))
    assert policy.should_retry(vf.ProviderError("5xx", status_code=503))
    assert not policy.should_retry(vf.ProviderError("401", status_code=401, retryable=False))
    assert not policy.should_retry(ValueError("a bug"))


async def test_a_spec_round_trips_through_json_and_rebuilds_the_same_rollout(openai_server, agent_config):
    config = agent_config(harness="chat")
    spec = RolloutSpec(agent=config, taskset=TASKSET, taskset_options={"count": 4}, task_id="n2",
                       rollout_index=1, run_id="run-1", labels={"shard": "0"})
    wire = spec.model_dump_json()
    again = RolloutSpec.model_validate_json(wire)
    assert again == spec and "TEST_OPENAI_KEY" in wire
    openai_server.default = reply("2")
    async with vf.make_agent(again.agent) as agent:
        rebuilt = agent.rollout_from_spec(again)
        assert rebuilt.labels["run_id"] == "run-1" and rebuilt.labels["rollout_index"] == "1"
        from_spec = await rebuilt.run()
        task = next(t for t in load_taskset(TASKSET, {"count": 4}) if t.id == "n2")
        in_process = await agent.rollout(task).run()
    assert from_spec.reward == 1.0 and comparable(from_spec) == comparable(in_process)


async def test_a_spec_naming_a_task_this_taskset_lacks_is_a_config_error_naming_it(agent_config):
    spec = RolloutSpec(agent=agent_config(harness="chat"), taskset=TASKSET, taskset_options={"count": 2},
                       task_id="n7")
    async with vf.make_agent(spec.agent) as agent:
        with pytest.raises(vf.ConfigError, match="no task with id 'n7'"):
            agent.rollout_from_spec(spec)


def test_a_spec_refuses_header_secrets():
    config = vf.AgentConfig(model="m", client=vf.ClientConfig(headers={"X-Api-Key": SecretStr("sk-secret")}))
    with pytest.raises(ValidationError, match="agent.client.headers: header values are secrets"):
        RolloutSpec(agent=config, taskset=TASKSET, task_id="n0")
