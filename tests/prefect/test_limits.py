"""``[limits]``: Prefect global concurrency limits hold across an eval's rollouts (real Prefect server,
the scripted model server counting requests in flight, the Docker engine counting containers)."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.limits import endpoint_limit_name
from prefect_rollouts.runtimes.docker.engine import LABEL
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, gathered, reply


def limited_toml(tmp_path, base_url: str, limits: str, **top) -> str:
    return eval_toml(tmp_path, base_url, max_concurrent=8, **top) + f"[limits]\n{limits}\n"


async def read_limit(name: str):
    async with get_client() as client:
        return await client.read_global_concurrency_limit_by_name(name)


@pytest.mark.prefect
async def test_an_endpoint_limit_of_2_holds_requests_in_flight_to_2_at_concurrency_8(tmp_path, openai_server):
    openai_server.default = gathered(2, delayed(0.05, reply("ok")))
    name = f"model-requests-test-{uuid.uuid4().hex[:8]}"
    config = load_eval_config(limited_toml(tmp_path, openai_server.base_url,
                                           f'model_requests = 2\nmodel_requests_name = "{name}"', num_tasks=10))
    await eval_flow(config, run_id="limited")
    rows = read_rollouts(tmp_path, run_id="limited")
    assert len(rows) == 10 and not rows["is_error"].any()
    assert len(openai_server.requests) == 10
    assert openai_server.max_in_flight == 2              # the limit, not 8, and not serialised to 1
    limit = await read_limit(name)                       # created by the eval, every slot given back
    assert (limit.limit, limit.active_slots, limit.active) == (2, 0, True)


@pytest.mark.prefect
async def test_without_limits_the_same_eval_has_more_requests_in_flight(tmp_path, openai_server):
    openai_server.default = gathered(3, delayed(0.05, reply("ok")))
    await eval_flow(load_eval_config(eval_toml(tmp_path, openai_server.base_url, max_concurrent=8, num_tasks=10)),
                    run_id="unlimited")
    assert openai_server.max_in_flight > 2


@pytest.mark.prefect
async def test_the_default_limit_name_comes_from_the_endpoint_and_an_existing_size_is_kept(
        tmp_path, openai_server, caplog):
    openai_server.default = delayed(0.05, reply("ok"))
    config = load_eval_config(limited_toml(tmp_path, openai_server.base_url, "model_requests = 2", num_tasks=6))
    name = endpoint_limit_name(config.env.agent.client)
    assert name.startswith("model-requests:") and name.endswith(f":127.0.0.1:{openai_server.base_url.split(':')[-1]}"
                                                                  .replace("/", ":"))
    async with get_client() as client:
        await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=3))
    with caplog.at_level(logging.WARNING, logger="prefect_rollouts.limits"):
        await eval_flow(config, run_id="kept")
    assert (await read_limit(name)).limit == 3           # another eval's size is not overwritten ...
    assert openai_server.max_in_flight <= 3
    assert f"prefect gcl update {name!r} --limit 2" in caplog.text   # ... but the difference is said


@pytest.mark.unit
def test_a_limit_name_prefect_refuses_is_a_config_error(tmp_path, openai_server):
    with pytest.raises(ConfigError, match=r"\[limits\] containers_name = 'a/b': .*cannot hold /"):
        load_eval_config(limited_toml(tmp_path, openai_server.base_url, 'containers = 2\ncontainers_name = "a/b"'))


@pytest.mark.system
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.usefixtures("docker_engine")
async def test_a_container_limit_of_2_holds_containers_alive_to_2(tmp_path, openai_server, docker_engine):
    openai_server.default = delayed(0.2, reply("ok"))
    name = f"containers-test-{uuid.uuid4().hex[:8]}"
    text = limited_toml(tmp_path, openai_server.base_url, f'containers = 2\ncontainers_name = "{name}"', num_tasks=6)
    config = load_eval_config(text + '[env.agent.runtime]\ntype = "docker"\nexec_timeout_s = 20\n')
    since = int(time.time()) - 1
    await eval_flow(config, run_id="containers")
    until = int(time.time()) + 1
    assert len(read_rollouts(tmp_path, run_id="containers")) == 6
    events = docker_engine.api.events(since=since, until=until, decode=True, filters={
        "type": "container", "event": ["start", "destroy"], "label": f"{LABEL}.run_id=containers"})
    alive, most, started = 0, 0, 0
    for event in sorted(events, key=lambda e: e["timeNano"]):
        alive += 1 if event["Action"] == "start" else -1
        started += event["Action"] == "start"
        most = max(most, alive)
    assert (started, alive, most) == (6, 0, 2)
    assert (await read_limit(name)).active_slots == 0
