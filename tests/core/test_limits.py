"""The core's limit hooks (``prefect_rollouts.limits``) with an injected slot factory, no Prefect."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import prefect_rollouts as vf
from prefect_rollouts import limits
from prefect_rollouts.config.eval_tables import LimitsConfig
from prefect_rollouts.errors import InfrastructureError, ProviderError
from prefect_rollouts.model.client import ModelClient
from tests.fakes.openai_server import delayed, reply

pytestmark = pytest.mark.unit

BODY = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}


def refusing_factory(calls: list[str]):
    @contextlib.asynccontextmanager
    async def slot(limit: limits.Limit):
        calls.append(limit.name)
        raise InfrastructureError("the Prefect API is unreachable")
        yield
    return slot


async def test_a_local_model_is_limited_per_process_without_asking_the_factory(openai_server):
    openai_server.default = delayed(0.05, reply("ok"))
    calls: list[str] = []
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env=""), local=True)
    with limits.applied(limits.ActiveLimits(LimitsConfig(model_requests=2), refusing_factory(calls))):
        await asyncio.gather(*(client.complete(BODY) for _ in range(8)))
    await client.aclose()
    assert (len(openai_server.requests), openai_server.max_in_flight, calls) == (8, 2, [])


async def test_no_slot_is_a_retryable_provider_error_naming_the_limit(openai_server):
    openai_server.default = reply("ok")
    calls: list[str] = []
    config = vf.ClientConfig(base_url=openai_server.base_url, api_key_env="",
                             retries=vf.RetryConfig(max_retries=1, backoff_s=0.01))
    client = ModelClient(config)
    active = limits.ActiveLimits(LimitsConfig(model_requests=4, model_requests_name="llm"), refusing_factory(calls),
                                 agent_client=config)
    with limits.applied(active), pytest.raises(ProviderError) as caught:
        await client.complete(BODY)
    await client.aclose()
    assert (caught.value.status_code, caught.value.retryable, calls) == (503, True, ["llm", "llm"])
    assert "could not take a slot of its concurrency limit: the Prefect API is unreachable" in str(caught.value)
    assert openai_server.requests == []


async def test_without_limits_in_force_nothing_is_asked(openai_server):
    openai_server.default = reply("ok")
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env=""))
    assert limits.active() is None
    await client.complete(BODY)
    await client.aclose()
    assert len(openai_server.requests) == 1


def test_default_names_follow_the_endpoint_and_the_docker_host(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "worker-3")
    name = limits.endpoint_limit_name
    assert name(vf.ClientConfig(base_url="https://api.example.com/openai/v1?x=1")) == \
        "model-requests:api.example.com:443:openai:v1"                        # no query
    assert name(vf.ClientConfig(base_url="http://10.0.0.5:8000/v1")) == "model-requests:10.0.0.5:8000:v1"
    assert name(vf.ClientConfig(base_url="http://127.0.0.1:8000/v1")) == "model-requests:worker-3:127.0.0.1:8000:v1"
    assert name(vf.ClientConfig(endpoint="prod-llm")) == "model-requests:block:prod-llm"
    assert limits.container_limit_name("tcp://10.0.0.7:2376") == "containers:10.0.0.7:2376"
    assert limits.container_limit_name("unix:///var/run/docker.sock") == "containers:worker-3"
    assert limits.container_limit_name("") == "containers:worker-3"


def test_the_agents_endpoint_takes_the_configured_name_and_a_judges_its_own():
    agent = vf.ClientConfig(base_url="http://10.0.0.5:8000/v1")
    active = limits.ActiveLimits(LimitsConfig(model_requests=3, model_requests_name="vllm-a", containers=5),
                                 refusing_factory([]), agent_client=agent)
    assert active.endpoint(agent.model_copy(update={"timeout": 5})) == limits.Limit("vllm-a", 3)
    assert active.endpoint(vf.ClientConfig(base_url="http://10.0.0.6/v1")) == \
        limits.Limit("model-requests:10.0.0.6:80:v1", 3)
    assert active.container() is not None and active.container().size == 5  # type: ignore[union-attr]


async def test_a_held_slot_waited_for_and_cancelled_takes_nothing():
    entered: list[str] = []
    gate = asyncio.Semaphore(1)

    @contextlib.asynccontextmanager
    async def slot(limit: limits.Limit):
        async with gate:
            entered.append(limit.name)
            yield
    active = limits.ActiveLimits(LimitsConfig(containers=1, containers_name="pool"), slot)
    with limits.applied(active):
        first = await limits.hold_container_slot()
        waiting = asyncio.ensure_future(limits.hold_container_slot())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert first is not None
        await first.release()
        await first.release()                                 # idempotent
        second = await asyncio.wait_for(limits.hold_container_slot(), 5)
        assert second is not None
        await second.release()
    assert entered == ["pool", "pool"] and not gate.locked()
