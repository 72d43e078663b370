"""Rollouts for the viewer and ATIF tests, made by the real agent against the scripted server (a tools
run, a bash program run, an interaction with a steer, a rollout whose texts are hostile), and written to a
dataset as an eval writes them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import prefect_rollouts as vf
from prefect_rollouts.traces import TraceWriter
from tests.fakes.openai_server import ScriptedOpenAIServer, reply, tool_call

HOSTILE = ("<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
           "<a id=\"evil\" href=\"javascript:document.title='pwned'\">click me</a> [md](javascript:alert(1))")
"""What a hostile rollout's reply and tool output say: each would change the page's title if it ran."""


class Adding(vf.Task):
    """A task with one tool (``add``) whose reward is 1 when the last reply is the expected answer."""

    def tools(self):
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: First addend.
                b: Second addend.
            """
            return a + b
        return [add]

    @vf.reward
    def correct(self, trace):
        return float(trace.last_reply == str(self.data.answer))


class Hostile(Adding):
    """``Adding`` with a tool whose output is ``HOSTILE``."""

    def tools(self):
        def fetch(url: str) -> str:
            """Fetch a page.

            Args:
                url: Its address.
            """
            return HOSTILE
        return [fetch]


def config(server: ScriptedOpenAIServer, **fields: Any) -> vf.AgentConfig:
    """An inline agent config aimed at ``server`` (the ``agent_config`` fixture's, for module-scoped builders;
    the key is read from ``TEST_OPENAI_KEY``, which the caller sets)."""
    client = vf.ClientConfig(base_url=server.base_url, api_key_env="TEST_OPENAI_KEY", timeout=10,
                             retries=vf.RetryConfig(max_retries=0, backoff_s=0.01))
    return vf.AgentConfig(model="scripted", client=client, orchestrator="inline",
                          retries=vf.StageRetryConfig(backoff_s=0.01), **fields)


async def tools_rollout(server: ScriptedOpenAIServer, task_id: str, answer: int, said: int) -> vf.Trace:
    """A tools rollout: one ``add`` call, then the reply ``said`` (reward 1 when it is ``answer``)."""
    server.play([tool_call("add", a=answer - 1, b=1), reply(str(said))])
    async with vf.make_agent(config(server, harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        return await agent.run(Adding(vf.TaskData(prompt=f"what is {answer - 1} + 1?", answer=answer, id=task_id)))


async def hostile_rollout(server: ScriptedOpenAIServer) -> vf.Trace:
    """A rollout whose tool output and reply are ``HOSTILE``."""
    server.play([tool_call("fetch", url="javascript:alert(1)"), reply(HOSTILE)])
    async with vf.make_agent(config(server, harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        return await agent.run(Hostile(vf.TaskData(prompt=HOSTILE, answer=0, id="hostile")))


async def steered_rollout(server: ScriptedOpenAIServer) -> vf.Trace:
    """An interaction whose tool call waits while the test steers ("use the fast path", id ``s1``)."""
    started, steered = asyncio.Event(), asyncio.Event()

    class Slow(vf.Task):
        def tools(self):
            async def wait() -> str:
                """Wait until the test has steered."""
                started.set()
                await asyncio.wait_for(steered.wait(), timeout=5)
                return "waited"
            return [wait]

    server.play([tool_call("wait"), reply("adjusted")])
    async with vf.make_agent(config(server, harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        async with agent.interaction(Slow(vf.TaskData(prompt="do it", id="steered"))) as interaction:
            opening = asyncio.create_task(interaction.turn())
            await asyncio.wait_for(started.wait(), 5)
            await interaction.send("use the fast path", mode="steer", message_id="s1")
            steered.set()
            await opening
    return interaction.trace


async def bash_rollout(server: ScriptedOpenAIServer) -> vf.Trace:
    """A ``bash`` program rollout in a local runtime: one command through the endpoint, then "done"."""
    server.play([tool_call("bash", command="echo hello > out.txt && cat out.txt"), reply("done")])
    async with vf.make_agent(config(server, harness="bash")) as agent:
        return await agent.run(Adding(vf.TaskData(prompt="write out.txt", answer="done", id="program")))


def write_run(root: Path, run_id: str, traces: list[vf.Trace], environment: str = "adding") -> None:
    """Write ``traces`` as run ``run_id`` (rollout index 0 each, one second apiece)."""
    writer = TraceWriter(root, run_id)
    for trace in traces:
        writer.add(trace, rollout_index=0, environment=environment, config_hash="h", elapsed_s=1.0)
    writer.flush()


async def two_runs(root: Path, server: ScriptedOpenAIServer) -> None:
    """Runs ``run-a`` (tasks t1-t4: t1 and t2 right) and ``run-b`` (t1-t4 all right, plus the hostile and
    the steered rollout) in the dataset at ``root``."""
    a = [await tools_rollout(server, f"t{i}", i, i if i <= 2 else 0) for i in range(1, 5)]
    write_run(root, "run-a", a)
    b = [await tools_rollout(server, f"t{i}", i, i) for i in range(1, 5)]
    write_run(root, "run-b", [*b, await hostile_rollout(server), await steered_rollout(server)])


def make_two_runs(root: Path, server: ScriptedOpenAIServer) -> Path:
    """``two_runs`` from synchronous code (a module fixture), with the key variable set only meanwhile;
    returns ``root``."""
    os.environ["TEST_OPENAI_KEY"] = "sk-test-viewer"
    try:
        server.reset()
        asyncio.run(two_runs(root, server))
    finally:
        del os.environ["TEST_OPENAI_KEY"]
    return root
