"""Regressions found by trying to break the core: escapes, hangs, leaks and malformed input."""

from __future__ import annotations

import threading

import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.redact import redact_agent_config
from prefect_rollouts.model import ModelClient
from prefect_rollouts.runtimes import make_runtime
from tests.fakes.openai_server import delayed, reply, status, tool_call

pytestmark = pytest.mark.unit


@pytest.fixture
async def runtime():
    rt = make_runtime(vf.RuntimeConfig(exec_timeout_s=5, artifact_max_bytes=10_000_000))
    await rt.start()
    yield rt
    await rt.stop()


async def test_a_background_job_neither_hangs_the_command_nor_outlives_it(runtime):
    result = await runtime.exec("sleep 31.25 & echo started")   # a duration no other test's process has (pgrep
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)   # not held to 5 s
    survivors = await runtime.exec("pgrep -f 'slee[p] 31.25' || true")   # sees the whole host, containers too)
    assert survivors.stdout == ""


async def test_special_files_are_not_read_or_written(runtime):
    await runtime.exec("mkfifo pipe")
    with pytest.raises(ValueError, match="not a regular file"):
        await runtime.read_file("pipe")
    with pytest.raises(ValueError, match="not a regular file"):
        await runtime.write_file("pipe", "x")


async def test_artifacts_follow_links_inside_the_workspace_and_drop_links_leaving_it(runtime):
    await runtime.exec("echo 42 > real.txt && ln -s real.txt answer.txt && ln -s /etc/passwd leak.txt "
                       "&& mkdir d && ln -s /etc d/abs && mkfifo d/pipe && echo ok > d/keep.txt")
    archive, missing = await runtime.collect_artifacts(["answer.txt", "leak.txt", "d"])
    other = make_runtime(vf.RuntimeConfig())
    await other.start()
    try:
        await other.restore_artifacts(archive)
        assert await other.read_file("answer.txt") == b"42\n"
        assert await other.read_file("d/keep.txt") == b"ok\n"
        assert (await other.exec("ls -A d")).stdout.split() == ["keep.txt"]
    finally:
        await other.stop()
    assert missing == ["leak.txt"]


async def test_the_artifact_cap_is_checked_before_anything_is_read(runtime):
    await runtime.exec("truncate -s 200G big.bin")   # sparse: reading it would take minutes, past the tier's timeout
    with pytest.raises(vf.TaskError, match="exceed artifact_max_bytes"):
        await runtime.collect_artifacts(["big.bin"])


async def test_a_key_with_a_trailing_newline_is_stripped_and_never_echoed(openai_server, monkeypatch):
    monkeypatch.setenv("NEWLINE_KEY", "sk-newline-secret\n")
    openai_server.play([reply("ok"), status(401, body="bad key: Bearer sk-newline-secret")])
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env="NEWLINE_KEY",
                                         retries=vf.RetryConfig(max_retries=0)))
    try:
        await client.complete({"model": "m", "messages": []})
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete({"model": "m", "messages": []})
    finally:
        await client.aclose()
    assert openai_server.requests[0].headers["authorization"] == "Bearer sk-newline-secret"
    assert "sk-newline-secret" not in str(caught.value) and "Bearer ***" in str(caught.value)


async def test_the_request_timeout_bounds_the_whole_request(openai_server):
    openai_server.default = delayed(2.0, reply("late"))
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, timeout=0.3, api_key_env=None,
                                         retries=vf.RetryConfig(max_retries=0)))
    try:
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete({"model": "m", "messages": []})
    finally:
        await client.aclose()
    assert caught.value.status_code == 504


@pytest.mark.parametrize("body", [
    {"choices": [{"message": None, "finish_reason": "stop"}]},
    {"choices": [{"message": "text", "finish_reason": "stop"}]},
    {"choices": [{"message": {"role": "assistant", "content": "x"}}], "usage": [1]},
])
async def test_malformed_200_bodies_are_provider_errors(openai_server, body):
    openai_server.default = status(200, body=body)
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env=None,
                                         retries=vf.RetryConfig(max_retries=0)))
    try:
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete({"model": "m", "messages": []})
    finally:
        await client.aclose()
    assert caught.value.status_code == 502


def test_redaction_covers_headers_and_literal_env_values_and_a_url_password_is_refused():
    with pytest.raises(ValueError, match="holds a user name or password") as refused:
        vf.ClientConfig(base_url="http://user:pw-secret@127.0.0.1:9/v1")
    assert "pw-secret" not in str(refused.value).split("input_value")[0]
    config = vf.AgentConfig(
        model="m", client=vf.ClientConfig(base_url="http://127.0.0.1:9/v1", headers={"X-Key": "h"}),
        runtime=vf.RuntimeConfig(env={"TOKEN": "rt-secret", "HOME2": "${HOME}"}),
        scoring=vf.ScoringConfig(env={"A": "sc-secret"}, runtime=vf.RuntimeConfig(env={"B": "sr-secret"})))
    text = str(redact_agent_config(config))
    for secret in ("pw-secret", "rt-secret", "sc-secret", "sr-secret", "'h'"):
        assert secret not in text
    assert "${HOME}" in text


def test_infinite_numbers_and_non_finite_weights_are_rejected():
    with pytest.raises(vf.ConfigError, match="finite"):
        vf.load_config('[env.agent]\nmodel = "m"\n[env.agent.timeouts]\nagent = inf')
    with pytest.raises(ValueError, match="finite"):
        vf.reward(weight=float("nan"))


def test_load_config_tells_paths_from_text(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    (tmp_path / "eval.cfg").write_text('[env.agent]\nmodel = "from-file"\n')
    assert vf.load_config(str(tmp_path / "eval.cfg")).model == "from-file"
    with pytest.raises(vf.ConfigError, match="is a directory"):
        vf.load_config(tmp_path / "dir.toml")
    (tmp_path / "latin.toml").write_bytes(b'[env.agent]\nmodel = "caf\xe9"\n')
    with pytest.raises(vf.ConfigError, match="not UTF-8"):
        vf.load_config(tmp_path / "latin.toml")


async def test_binary_task_files_are_written_and_hash_stably(openai_server, agent_config):
    class Png(vf.Task):
        @vf.reward
        async def intact(self, runtime):
            return float(await runtime.read_file("a.png") == b"\x89PNG\xff")

    data = vf.TaskData(prompt="x", files={"a.png": b"\x89PNG\xff"})
    assert data.id == vf.TaskData(prompt="x", files={"a.png": b"\x89PNG\xff"}).id
    openai_server.play([reply("ok")])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(Png(data))
    assert trace.reward == 1.0


async def test_tool_calls_without_ids_get_matching_ids(openai_server, agent_config):
    openai_server.play([status(200, body={"choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": '{"command": "true"}'}}]}}]}),
        reply("done")])
    async with vf.make_agent(agent_config()) as agent:
        await agent.run(vf.Task(vf.TaskData(prompt="x")))
    sent = openai_server.requests[1].messages
    assert sent[1]["tool_calls"][0]["id"] == sent[2]["tool_call_id"] != ""


async def test_a_slow_tool_times_out_with_an_error_for_the_model_and_does_not_block_the_loop(openai_server,
                                                                                           agent_config):
    class Slow(vf.Task):
        def tools(self):
            def nap() -> str:
                """Sleep (a blocking call)."""
                release.wait(10)
                rested.set()
                return "rested"
            return [nap]

    release, rested = threading.Event(), threading.Event()

    openai_server.play([tool_call("nap"), reply("done")])
    config = agent_config(harness=vf.HarnessConfig(runtime_tools=[], tool_timeout_s=0.2))
    try:
        async with vf.make_agent(config) as agent:
            trace = await agent.run(Slow(vf.TaskData(prompt="x")))
        assert not rested.is_set(), "the rollout waited for the blocking tool"
    finally:
        release.set()
    assert trace.tool_calls[0].is_error and "did not finish within 0.2 s" in trace.tool_calls[0].output


async def test_an_interaction_cannot_be_entered_twice(openai_server, agent_config):
    async with vf.make_agent(agent_config()) as agent:
        interaction = agent.interaction(vf.Task(vf.TaskData(prompt="p")))
        async with interaction:
            with pytest.raises(RuntimeError, match="one rollout"):
                await interaction.__aenter__()


async def test_content_given_as_parts_is_read_the_same_by_the_trace_and_the_segment(openai_server, agent_config):
    openai_server.play([status(200, body={"choices": [{"finish_reason": "stop", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2 "}]}}]})])
    async with vf.make_agent(agent_config(harness="chat")) as agent:
        async with agent.interaction(vf.Task(vf.TaskData(prompt=None))) as interaction:
            segment = await interaction.turn("answer?")
    assert segment.last_reply == interaction.trace.last_reply == "42"
