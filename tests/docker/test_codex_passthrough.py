"""Codex CLI (the real one, npm, pinned) runs once straight at the scripted Responses upstream and once as
the ``codex`` harness through the interception endpoint to the same upstream (the agent's client speaking
``api = "responses"``): the request bodies it makes are equal but for the imposed fields (``stream``: the
client does not stream) and what differs from run to run anyway (its session ids, the workspace path, the
timing in a command's output); the reasoning items with their ``encrypted_content``, the item and call ids
and the tools go through intact. The local runtime runs it (what the test needs of it is the real CLI and
the endpoint; the Docker runtime's reach is test_npm_agents.py's). Installs Codex once into the shared
cache (``npm_agents.install``, idempotent: ~5 s and ~400 MB the first time)."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses import npm_agents
from tests.docker.test_npm_agents import KEY, task
from tests.fakes.responses_server import function_call, message, output, reasoning

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

PROMPT = "What is 2 + 3? Write the number to answer.txt."
IMPOSED = ("stream",)
"""What the endpoint changes of Codex's requests here: the model is Codex's own ("scripted", the rollout's
model), no sampling or token cap is configured, and the agent's client does not stream."""

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")   # Codex makes them per run
_OUTPUT = re.compile(r"(Chunk ID: )\w+|(Wall time: )[0-9.]+")


def script() -> list[Any]:
    """The upstream's answers: a reasoning item and the shell call that solves the task, then the reply."""
    thought = reasoning("Compute 2 + 3, then write it.", "gAAAAB-encrypted-by-the-provider", "rs_up_1")
    call = function_call("exec_command", {"cmd": "echo $((2 + 3)) > answer.txt"}, "call_up_1", "fc_up_1")
    return [output(thought, call), output(message("I wrote 5 to answer.txt.", "msg_up_2"))]


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the imposed fields and with what differs between two runs of Codex replaced: its
    session's ids (``prompt_cache_key``, ``client_metadata``, its item ids: UUIDs made per run), the workspace
    and ``CODEX_HOME`` paths (its ``<cwd>``, its skills' root) and a command's chunk id and wall time."""
    text = json.dumps({key: value for key, value in body.items() if key not in IMPOSED and key != "client_metadata"})
    for place, name in ((r"<cwd>(.*?)</cwd>", "<cwd>"), (r"= `([^`]*?)/skills/", "<codex-home>")):
        found = re.search(place, text)
        if found:
            text = text.replace(found.group(1), name)
    text = _OUTPUT.sub(lambda match: (match.group(1) or match.group(2)) + "<n>", _UUID.sub("<uuid>", text))
    return json.loads(text)


def codex_binary() -> Path:
    agent = npm_agents.AGENTS["codex"]
    return npm_agents.install(agent) / agent.binary_for(platform.machine())


def straight(binary: Path, base_url: str, workdir: Path) -> subprocess.CompletedProcess[bytes]:
    """Codex run as the harness configures it (``npm_agent.codex_config``), its provider the scripted server."""
    spec = importlib.util.spec_from_file_location(
        "npm_agent", Path(npm_agents.__file__).parent / "programs" / "npm_agent.py")
    assert spec and spec.loader
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    home, work = workdir / "codex-home", workdir / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(launcher.codex_config(base_url, "scripted"))
    env = {**os.environ, "CODEX_HOME": str(home), "OPENAI_API_KEY": KEY}
    return subprocess.run(launcher.codex_argv(str(binary)), input=PROMPT.encode(), cwd=work, env=env,
                          capture_output=True, timeout=300)


async def test_codex_sends_the_same_requests_straight_and_through_the_endpoint(openai_server, agent_config, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)
    binary = codex_binary()
    openai_server.play(script())
    ran = straight(binary, openai_server.base_url, tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (tmp_path / "work" / "answer.txt").read_text().strip() == "5"
    direct = [request.body for request in openai_server.requests]

    openai_server.reset()
    openai_server.play(script())
    client = vf.ClientConfig(base_url=openai_server.base_url, api="responses", api_key_env="TEST_OPENAI_KEY",
                             timeout=60)
    async with vf.make_agent(agent_config(harness="codex", runtime=vf.RuntimeConfig(), client=client,
                                          max_turns=4)) as agent:
        trace = await agent.run(task())
    through = [request.body for request in openai_server.requests]

    assert (trace.errors, trace.reward) == ([], 1.0)
    assert [request.path for request in openai_server.requests] == ["/v1/responses"] * 2
    assert len(direct) == len(through) == 2
    assert all(body["stream"] is True for body in direct) and not any("stream" in body for body in through)
    for one, other in zip(direct, through, strict=True):
        assert comparable(one) == comparable(other)
    resent = [item for item in through[1]["input"] if item.get("type") in ("reasoning", "function_call")]
    assert resent[0]["encrypted_content"] == "gAAAAB-encrypted-by-the-provider" and resent[0]["id"] == "rs_up_1"
    assert (resent[1]["id"], resent[1]["call_id"]) == ("fc_up_1", "call_up_1")
    assert [rewrites["translated"] for rewrites in trace.info["program_rewrites"]] == [{"dialect": "responses"}] * 2
