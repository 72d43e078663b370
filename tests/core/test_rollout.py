"""Rollout, its stage policy table, and its rebuild from plain data in another process (evals.plan.rebuild)."""

from __future__ import annotations

import json
import re

import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.eval import EvalConfig, load_eval_config
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.evals.identity import check_portable
from prefect_rollouts.evals.plan import rebuild
from prefect_rollouts.rollout import StagePolicy, stage_policies
from tests.eval_toml import eval_toml
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


async def test_an_eval_config_round_trips_through_json_and_rebuilds_the_same_rollout(tmp_path, openai_server):
    """A shard's plain data (the eval config as JSON and a rollout's key) rebuilds it in another process."""
    config = load_eval_config(eval_toml(tmp_path, openai_server.base_url, taskset={"id": TASKSET, "count": 4}))
    again = EvalConfig.model_validate_json(config.model_dump_json())
    assert again == config
    [planned] = rebuild(again, [(TASKSET, "n2", 1)])
    assert (planned.environment.name, planned.task.id, planned.index) == (TASKSET, "n2", 1)
    openai_server.default = reply("2")
    async with vf.make_agent(again.env.agent) as agent:
        rebuilt = await agent.rollout(planned.task).run()
        task = next(t for t in load_taskset(TASKSET, {"count": 4}) if t.id == "n2")
        in_process = await agent.rollout(task).run()
    assert rebuilt.reward == 1.0 and comparable(rebuilt) == comparable(in_process)


def test_a_key_naming_a_task_or_environment_this_config_lacks_is_a_config_error_naming_it(tmp_path):
    config = load_eval_config(eval_toml(tmp_path, "http://127.0.0.1:9/v1", taskset={"id": TASKSET, "count": 2}))
    with pytest.raises(vf.ConfigError, match="no task with id 'n7'"):
        rebuild(config, [(TASKSET, "n7", 0)])
    with pytest.raises(vf.ConfigError, match="environment 'other': not in this eval's config"):
        rebuild(config, [("other", "n0", 0)])


def test_a_config_with_header_secrets_cannot_travel_as_parameters(tmp_path):
    text = eval_toml(tmp_path, "http://127.0.0.1:9/v1") + '[env.agent.client.headers]\nX-Api-Key = "sk-secret"\n'
    with pytest.raises(vf.ConfigError, match=re.escape("env.agent.client.headers.X-Api-Key: a work pool cannot carry")):
        check_portable(load_eval_config(text), "a work pool")
