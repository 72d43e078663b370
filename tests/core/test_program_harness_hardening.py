"""Program harnesses against hostile or careless programs: an outage the program swallows, a process it
leaves behind, NaN in a request, an agent that died under a running program."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap

import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint
from tests.core.test_program_harness import KEY, Said, program
from tests.fakes.openai_server import reply, status
from tests.support.processes import descendants
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit

POST = """
    import json, os, urllib.request, urllib.error
    def post(content, timeout=10):
        request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                         json.dumps({"messages": [{"role": "user", "content": content}]}).encode(),
                                         {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
        return json.load(urllib.request.urlopen(request, timeout=timeout))["choices"][0]["message"]["content"]
"""


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


async def test_a_program_that_swallows_an_upstream_failure_and_exits_0_is_an_error_not_a_zero(
        openai_server, agent_config, tmp_path):
    swallow = POST + """
    try:
        post("x")
    except urllib.error.HTTPError as exc:
        print("ignored", exc.code)
    """
    openai_server.default = status(500)
    async with vf.make_agent(agent_config(harness=program(tmp_path, swallow))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert trace.reward is None and trace.stop_condition == "provider_error"
    assert (trace.errors[0].type, trace.errors[0].status_code) == ("ProviderError", 500)
    assert trace.info["program"][0]["stdout_tail"] == "ignored 500\n"


async def test_a_program_that_recovers_from_an_upstream_failure_is_scored(openai_server, agent_config, tmp_path):
    recover = POST + """
    try:
        post("x")
    except urllib.error.HTTPError:
        print(post("again"))
    """
    openai_server.play([status(500), status(500), status(500), reply("done")])
    async with vf.make_agent(agent_config(harness=program(tmp_path, recover))) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert (trace.errors, trace.reward) == ([], 1.0)


async def test_a_process_the_program_leaves_behind_cannot_add_model_calls(openai_server, agent_config, tmp_path):
    late = POST + """
    import sys, time
    time.sleep(0.2)   # the program has exited; its pipes, which this process holds, keep the launch waiting
    try:
        post("late", timeout=5)
        result = "answered"
    except urllib.error.HTTPError as exc:
        result = str(exc.code)
    except OSError:
        result = "unreachable"
    open(sys.argv[1], "w").write(result)
    """
    leave = POST + """
    import subprocess, sys
    subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "late.py"), os.path.abspath("late.txt")],
                     start_new_session=True)   # inherits stdout and stderr
    print(post("x"))
    """
    harness = program(tmp_path, leave)
    (tmp_path / "my-agent" / "late.py").write_text(textwrap.dedent(late))

    class Late(vf.Task):
        @vf.reward
        async def refused(self, runtime):
            for _ in range(100):   # the left-behind process writes its result within ~1 s
                try:
                    return {"answered": 0.0, "unreachable": 1.0, "401": 1.0}[
                        (await runtime.read_file("late.txt")).decode()]
                except FileNotFoundError:
                    await asyncio.sleep(0.05)
            return -1.0

    openai_server.default = reply("done")
    async with vf.make_agent(agent_config(harness=harness)) as agent:
        trace = await agent.run(Late(vf.TaskData(prompt="go")))
    assert trace.errors == [] and trace.reward == 1.0
    assert len(openai_server.requests) == 1 and len(trace.model_calls) == 1


async def test_the_launcher_kills_the_program_when_its_endpoint_dies():
    """``kill -9`` of the agent leaves the endpoint's socket file without a listener: the program
    must not run on (in Docker nothing else would end it until the janitor)."""
    endpoint = InterceptionEndpoint()
    await endpoint.start()
    from prefect_rollouts.harnesses.session import ProgramSession

    class Ctx:   # the launcher only fetches the session (prompt, model)
        config = vf.AgentConfig(model="m")

    session = ProgramSession(Ctx(), "p", None, carried=[])   # type: ignore[arg-type]
    endpoint.open_session(session)
    assert endpoint.directory is not None
    directory = endpoint.directory
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(directory / "launch.py"), str(endpoint.socket_path), "100", "--",
        sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)",
        env={**os.environ, "OPENAI_API_KEY": session.secret}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    assert await wait_for(lambda: descendants(proc.pid), timeout_s=5, what="the launcher to start its program")
    server = endpoint._server
    assert server is not None
    server.should_exit = True   # stop listening but leave the directory, as a killed process does
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout=15)
    finally:
        if proc.returncode is None:
            proc.kill()
        await endpoint.stop()
    assert proc.returncode == -9
    assert b"the interception endpoint is gone" in err
