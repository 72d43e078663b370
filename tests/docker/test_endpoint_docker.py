"""The interception endpoint on a real Docker engine: its directory reaches the box read-only (a program
can neither replace what the next rollout runs nor write to the host through it), and the socket still
connects."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses.endpoint import SCRIPTS, SOCKET_NAME
from tests.docker.test_program_harness_docker import KEY, Said, docker_config
from tests.fakes.openai_server import reply, tool_call

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(120)]

PLANT = ("cd /run/prefect-rollouts; printf 'print(1)' > bash_agent.py; echo rc=$?; rm -f launch.py; echo rc=$?; "
         "dd if=/dev/zero of=big bs=1M count=50 2>&1 | tail -1; rm -f s; echo rc=$?")


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


async def test_a_program_cannot_change_the_mounted_scripts_or_write_to_the_host_through_them(
        openai_server, agent_config):
    openai_server.play([tool_call("bash", command=PLANT), reply("first"), reply("done")])
    async with vf.make_agent(agent_config(harness="bash", runtime=docker_config(network="none"))) as agent:
        directory = agent._services.endpoint.directory
        first = await agent.run(Said(vf.TaskData(prompt="plant a program")))
        second = await agent.run(Said(vf.TaskData(prompt="say done")))
        left = sorted(path.name for path in directory.iterdir())
    output = first.messages[2]["content"]
    assert output.count("Read-only file system") == 4 and "rc=0" not in output, output
    assert first.last_reply == "first" and left == sorted([*SCRIPTS, SOCKET_NAME])
    assert (second.errors, second.last_reply, second.reward) == ([], "done", 1.0)
    assert second.info["program"][0]["model_calls"] == 1
