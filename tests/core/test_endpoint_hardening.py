"""The interception endpoint against hostile programs: scripts a program replaces (the local runtime reads
them in place), and the endpoint's connection, request and body-memory limits."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from tests.core.test_program_harness import KEY, Said
from tests.fakes.openai_server import reply, tool_call

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


async def test_a_program_that_replaces_the_scripts_does_not_change_what_the_next_rollout_runs(
        openai_server, agent_config):
    async with vf.make_agent(agent_config(harness="bash")) as agent:
        directory = agent._services.endpoint.directory
        plant = (f"cd {directory}; chmod u+w . *.py; printf 'print(\"planted\")\\n' > bash_agent.py; "
                 "echo 'import sys; sys.exit(3)' > launch.py; ln -sf /etc/hostname mini_swe_agent.py")
        openai_server.play([tool_call("bash", command=plant), reply("first"), reply("done")])
        first = await agent.run(Said(vf.TaskData(prompt="plant")))
        second = await agent.run(Said(vf.TaskData(prompt="say done")))
    assert first.errors == [] and first.last_reply == "first"
    assert (second.errors, second.last_reply, second.reward) == ([], "done", 1.0)
    assert second.info["program"][0]["model_calls"] == 1 and second.info["program"][0]["stdout_tail"] == "done\n"


async def test_a_socket_a_program_replaced_is_refused_before_the_next_launch_connects_to_it(
        openai_server, agent_config):
    async with vf.make_agent(agent_config(harness="bash")) as agent:
        socket_path = agent._services.endpoint.socket_path
        bind = f"cd {socket_path.parent}; rm s; python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"s\")'"
        openai_server.play([tool_call("bash", command=bind), reply("first"), reply("done")])
        first = await agent.run(Said(vf.TaskData(prompt="replace the socket")))
        second = await agent.run(Said(vf.TaskData(prompt="say done")))
    assert first.model_calls[0].finish_reason == "tool_calls"   # its own next request found the impostor
    assert [(error.type, error.stage) for error in second.errors] == [("RuntimeUnavailableError", "segment")]
    assert "was removed or replaced" in second.errors[0].message and second.model_calls == []
