"""The interception endpoint on a real Docker engine: its directory reaches the box read-only (a program
can neither replace what the next rollout runs nor write to the host through it) and the socket still
connects; a program flooding its socket takes neither the eval's descriptors nor another rollout's share."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses.endpoint import SCRIPTS
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client
from tests.docker.test_program_harness_docker import KEY, Said
from tests.fakes.openai_server import reply, tool_call
from tests.support.docker import docker_config

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine"), pytest.mark.timeout(120)]

PLANT = ("cd /run/prefect-rollouts; printf 'print(1)' > bash_agent.py; echo rc=$?; rm -f launch.py; echo rc=$?; "
         "dd if=/dev/zero of=big bs=1M count=50 2>&1 | tail -1; rm -f /run/prefect-rollouts-door/s; echo rc=$?")


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
    assert first.last_reply == "first" and left == sorted(SCRIPTS)
    assert (second.errors, second.last_reply, second.reward) == ([], "done", 1.0)
    assert second.info["program"][0]["model_calls"] == 1


FLOOD = '''
import json, os, resource, socket, time, urllib.error, urllib.request

def post(content):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     json.dumps({"messages": [{"role": "user", "content": content}]}).encode(),
                                     {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    refused, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            return json.load(urllib.request.urlopen(request, timeout=20))["choices"][0]["message"]["content"], refused
        except (urllib.error.URLError, OSError) as exc:   # HTTPError (503) is a URLError
            refused.append(getattr(exc, "code", type(exc).__name__))
            time.sleep(0.5)
    raise SystemExit(f"gave up after {refused}")

prompt = open(os.environ["PROMPT_FILE"]).read()
if prompt == "flood":   # straight to the socket, past the launcher's relay, holding every connection
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
    held = []
    for _ in range(3000):
        connection = socket.socket(socket.AF_UNIX)
        connection.settimeout(0.5)
        try:
            connection.connect("/run/prefect-rollouts-door/s")
        except OSError:
            break
        held.append(connection)
    time.sleep(5)
    def answer(connection):
        connection.setblocking(False)
        try:
            return connection.recv(64)[:12]
        except OSError:
            return b""
    print("held", len(held), "refused", sum(answer(c) == b"HTTP/1.1 429" for c in held))
    for connection in held:
        connection.close()
else:
    time.sleep(2)   # the flood is on
print(*post(prompt))
'''

EVAL = '''
import asyncio, json, resource, sys
from pathlib import Path

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import prefect_rollouts as vf
from prefect_rollouts.runtimes.owner import current_owner

async def main():
    client = vf.ClientConfig(base_url=sys.argv[1], api_key_env="TEST_OPENAI_KEY", timeout=20)
    harness = vf.HarnessConfig(id="program", command=["python3", ".agent/agent.py"],
                               files={".agent": Path(sys.argv[2])})
    config = vf.AgentConfig(model="scripted", client=client, harness=harness, orchestrator="inline",
                            runtime=vf.RuntimeConfig(type="docker", network="none", exec_timeout_s=120))
    print(json.dumps({"owner": str(current_owner())}), flush=True)
    async with vf.make_agent(config) as agent:
        traces = await asyncio.gather(*(agent.run(vf.Task(vf.TaskData(prompt=p))) for p in ("flood", "done")))
        refused = dict(agent._services.endpoint.limits.refused)
    print(json.dumps({"traces": [{"errors": [e.message for e in t.errors], "last_reply": t.last_reply,
                                  "stdout": [p.get("stdout_tail") for p in t.info.get("program", [])]}
                                 for t in traces], "refused": refused}), flush=True)

asyncio.run(main())
'''


async def test_an_eval_short_of_descriptors_outlives_a_socket_flood_and_removes_its_containers(
        openai_server, tmp_path):
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "agent.py").write_text(FLOOD)
    (tmp_path / "eval.py").write_text(EVAL)
    openai_server.play([lambda request: reply(request.messages[-1]["content"])] * 2)
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(tmp_path / "eval.py"), openai_server.base_url, str(tmp_path / "agent"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 100)
    lines = out.decode().splitlines()
    owner = json.loads(lines[0])["owner"]
    left = docker_client().containers.list(all=True, sparse=True, filters={"label": f"{LABEL}.owner={owner}"})
    for container in left:   # the base commit left the flooding rollout's container running
        container.remove(force=True)
    assert process.returncode == 0 and len(err) < 2000, err[-2000:]
    assert left == []
    result = json.loads(lines[-1])
    flood, other = result["traces"]
    held, refused = (int(word) for word in flood["stdout"][0].split()[1:4:2])
    assert held > 32 and refused > 0, flood
    assert flood["errors"] == [] and flood["last_reply"] == "flood"
    assert other["errors"] == [] and other["last_reply"] == "done" and other["stdout"] == ["done []\n"]   # not refused
    assert result["refused"]["connections"] > 0
