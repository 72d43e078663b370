"""Resource limits of docker containers on a real engine: capped logs (rollout, isolated scoring and
the network guard helper)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from docker.models.containers import ContainerCollection

import prefect_rollouts as vf
from prefect_rollouts.runtimes import docker_limits, make_runtime
from prefect_rollouts.runtimes.docker import LABEL
from tests.fakes.openai_server import reply

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(120)]

CAP = {"Type": "json-file", "Config": {"max-size": docker_limits.LOG_MAX_SIZE, "max-file": docker_limits.LOG_MAX_FILES}}


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test-resource-limits")


def docker_config(**fields) -> vf.RuntimeConfig:
    return vf.RuntimeConfig(type="docker", exec_timeout_s=20, **fields)


class Scored(vf.Task):
    @vf.reward
    def scored(self):
        return 1.0


async def test_rollout_scoring_and_guard_containers_have_capped_logs(openai_server, agent_config, monkeypatch):
    """Every container the rollout creates, as the engine recorded it at creation (the guard helper
    lives about 0.25 s)."""
    run_id, seen, create = uuid.uuid4().hex, {}, ContainerCollection.create

    def recorded(self, *args, **kwargs):
        container = create(self, *args, **kwargs)
        if container.labels.get(f"{LABEL}.run_id") == run_id:
            seen[container.labels.get(f"{LABEL}.role", "rollout")] = container.attrs["HostConfig"]["LogConfig"]
        return container
    monkeypatch.setattr(ContainerCollection, "create", recorded)
    openai_server.play([reply("done")])
    rules = vf.NetworkPolicy(mode="rules", allow=["example.invalid"])
    config = agent_config(harness="chat", runtime=docker_config(network=rules))
    async with vf.make_agent(config) as agent:
        task = Scored(vf.TaskData(prompt="hi", scoring=vf.ScoringConfig(mode="isolated")))
        trace = await agent.rollout(task, {"run_id": run_id}).run()
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert seen == {"rollout": CAP, "scoring": CAP, "network-guard": CAP}


def log_bytes(path: str) -> int:
    """Bytes of a container's json log ``path`` and its rotated files (``path.1``, ...)."""
    log = Path(path)
    return sum(file.stat().st_size for file in log.parent.iterdir() if file.name.startswith(log.name))


async def test_a_flood_to_the_init_s_stdout_leaves_a_log_under_the_cap(docker_engine):
    """50 MB to ``/proc/1/fd/1`` (the container's own output, which the engine keeps on the host's disk)."""
    runtime = make_runtime(docker_config(), labels={"run_id": uuid.uuid4().hex})
    await runtime.start()
    try:
        flood = await runtime.exec("head -c 50000000 /dev/zero | tr '\\0' x | fold -w 1000 > /proc/1/fd/1", timeout=60)
        assert flood.exit_code == 0
        path = docker_engine.api.inspect_container(runtime.id)["LogPath"]
        cap = int(docker_limits.LOG_MAX_SIZE.removesuffix("m")) * 2**20
        assert 0 < log_bytes(path) <= int(docker_limits.LOG_MAX_FILES) * cap + 64 * 1024   # + one message's slack
    finally:
        await runtime.stop()
