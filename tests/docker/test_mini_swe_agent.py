"""The ``mini-swe-agent`` program harness: the real mini-swe-agent (PyPI, pinned) against the scripted
server, in Docker under both network policies and on the local runtime; its exit status and
submission on the trace; a refused request ending it at once; the install shared and mounted read-only.

The first test of a fresh machine installs mini-swe-agent into the host cache (pip, ~35 s)."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses import mini_swe_agent
from tests.fakes.openai_server import reply, tool_call

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt"


class Answered(vf.Task):
    """What is 2 + 3? Scored on the file the agent leaves in the workspace."""

    @vf.reward
    async def answer_file(self, runtime):
        try:
            return float((await runtime.read_file("answer.txt")).strip() == b"5")
        except FileNotFoundError:
            return 0.0


def task() -> Answered:
    return Answered(vf.TaskData(prompt="What is 2 + 3? Write the number to answer.txt, then submit it."))


def docker(network: str = "none") -> vf.RuntimeConfig:
    return vf.RuntimeConfig(type="docker", exec_timeout_s=60, network=network)


@pytest.fixture(scope="module", autouse=True)
def _installed():
    """Install once up front (a test's deadline then measures the rollout, not pip)."""
    import platform
    import sys
    mini_swe_agent.install(f"{sys.version_info.major}.{sys.version_info.minor}", platform.machine())


@pytest.mark.parametrize("runtime", ["local", "docker-none", "docker-open"])
async def test_mini_swe_agent_runs_a_command_then_submits(request, openai_server, agent_config, runtime):
    if runtime.startswith("docker"):
        request.getfixturevalue("docker_engine")
    config = docker(runtime.removeprefix("docker-")) if runtime.startswith("docker") else vf.RuntimeConfig()
    openai_server.play([tool_call("bash", command="echo $((2 + 3)) > answer.txt && ls"),
                        tool_call("bash", command=SUBMIT)])
    async with vf.make_agent(agent_config(harness="mini-swe-agent", runtime=config, max_turn_tokens=256)) as agent:
        trace = await agent.run(task())
    assert (trace.errors, trace.stop_condition, trace.reward) == ([], "agent_completed", 1.0)
    launch = trace.info["program"][0]
    assert (launch["exit_code"], launch["exit_status"], launch["submission"]) == (0, "Submitted", "5\n")
    assert launch["model_calls"] == launch["mini_swe_agent_calls"] == len(trace.model_calls) == 2
    # mini-swe-agent's own system and instance templates (the prompt in it), its tool message with the output
    assert [m["role"] for m in trace.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert "What is 2 + 3?" in trace.messages[1]["content"] and '"returncode": 0' in trace.messages[3]["content"]
    first = openai_server.requests[0].body
    assert first["model"] == "scripted" and first["max_tokens"] == 256
    assert [tool["function"]["name"] for tool in first["tools"]] == ["bash"]


async def test_the_text_format_takes_the_command_from_a_fenced_block(openai_server, agent_config):
    openai_server.play([reply("THOUGHT: compute it.\n\n```mswea_bash_command\necho 5 > answer.txt\n```"),
                        reply(f"THOUGHT: done.\n\n```mswea_bash_command\n{SUBMIT}\n```")])
    harness = vf.HarnessConfig(id="mini-swe-agent", action_format="text")
    async with vf.make_agent(agent_config(harness=harness)) as agent:
        trace = await agent.run(task())
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert (trace.info["program"][0]["exit_status"], trace.info["program"][0]["submission"]) == ("Submitted", "5\n")
    assert "tools" not in openai_server.requests[0].body


async def test_a_model_that_never_submits_is_stopped_at_max_turns_within_seconds(openai_server, agent_config):
    openai_server.default = tool_call("bash", command="echo still working")
    async with vf.make_agent(agent_config(harness="mini-swe-agent", max_turns=3)) as agent:
        trace = await agent.run(task())
    assert (trace.errors, trace.stop_condition, trace.reward) == ([], "max_turns", 0.0)
    assert len(openai_server.requests) == 3 and len(trace.model_calls) == 3
    # the refusal is not retried by mini-swe-agent (its default: 10 attempts, 4 to 60 s apart): it asked
    # 4 times, the 3 answered calls and the refused one
    launch = trace.info["program"][0]
    assert (launch["exit_status"], launch["mini_swe_agent_calls"]) == ("BadRequestError", 4)


async def test_an_agent_that_ends_on_its_format_errors_is_scored_not_failed(openai_server, agent_config):
    openai_server.default = reply("I will not use the tool.")
    async with vf.make_agent(agent_config(harness="mini-swe-agent")) as agent:
        trace = await agent.run(task())
    assert (trace.errors, trace.reward) == ([], 0.0)
    assert trace.info["program"][0]["exit_status"] == "RepeatedFormatError"
    assert len(openai_server.requests) == 3   # mini-swe-agent's max_consecutive_format_errors


async def test_the_host_install_is_mounted_read_only(openai_server, agent_config, docker_engine):
    openai_server.play([tool_call("bash",
                                  command="touch /usr/local/prefect-rollouts/mini-swe-agent/x; echo $? > answer.txt"),
                        tool_call("bash", command=SUBMIT)])
    async with vf.make_agent(agent_config(harness="mini-swe-agent", runtime=docker())) as agent:
        trace = await agent.run(task())
    assert trace.errors == [] and trace.info["program"][0]["submission"] == "1\n"   # touch failed
    assert not (mini_swe_agent.cache_root() / "x").exists()


def test_action_format_belongs_to_mini_swe_agent():
    with pytest.raises(ValueError, match='action_format applies to id = "mini-swe-agent" only'):
        vf.HarnessConfig(id="bash", action_format="text")


async def test_an_image_with_mini_swe_agent_baked_in_is_used_as_it_is(docker_engine, agent_config, openai_server):
    from typer.testing import CliRunner

    from prefect_rollouts.cli import app
    from prefect_rollouts.runtimes.docker.engine import docker_client

    tag = "prefect-rollouts-sandbox:test-mini-swe-agent"
    client = docker_client()
    base = client.images.get(vf.RuntimeConfig().image)
    base.tag(tag)   # the baked layer goes on a copy of the default image (offline: no rebuild of the base)
    try:
        from prefect_rollouts.harnesses import mini_swe_agent as module
        from prefect_rollouts.runtimes.docker import sandbox
        python, machine = sandbox.image_python(tag)
        sandbox.bake_directory(tag, module.install(python, machine), module.IMAGE_SITE,
                               labels={"org.prefect-rollouts.mini-swe-agent": module.VERSION})
        assert client.images.get(tag).labels["org.prefect-rollouts.mini-swe-agent"] == module.VERSION
        openai_server.play([tool_call("bash", command="echo 5 > answer.txt"), tool_call("bash", command=SUBMIT)])
        runtime = vf.RuntimeConfig(type="docker", exec_timeout_s=60, network="none", image=tag)
        async with vf.make_agent(agent_config(harness="mini-swe-agent", runtime=runtime)) as agent:
            trace = await agent.run(task())
        assert (trace.errors, trace.reward) == ([], 1.0)
        assert trace.info["program"][0]["mini_swe_agent_site"] == module.IMAGE_SITE
        result = CliRunner().invoke(app, ["sandbox", "build", "--with", "nothing-such"])
        assert result.exit_code == 2 and "--with nothing-such: not a program" in result.output
    finally:
        client.images.remove(tag, force=True)
