"""The local model server: its chat format (the model must see the tools, the tool results and
unescaped text; checked on the real SmolLM2 server through its prompt token counts), the address
traces record, and its log file (kept only when the server failed)."""

from __future__ import annotations

import tempfile

import httpx
import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.model.llama_server import prepare_messages
from prefect_rollouts.model.local import LocalModelServer

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": 'The weather in a city, e.g. "Paris" or \'Rome\' <in metric units>.',
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLED = [*ASKED, {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]


@pytest.mark.unit
def test_tool_results_become_user_messages_and_tools_get_a_system_message():
    prepared = prepare_messages([*CALLED, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], TOOLS)
    assert prepared[0] == {"role": "system", "content": ""}
    assert prepared[-1] == {"role": "user", "content": "functions.get_weather returned:\nsunny"}
    assert prepare_messages(ASKED, None) == ASKED                       # no tools: nothing added


@pytest.mark.unit
def test_parts_missing_content_and_several_system_messages_are_made_renderable():
    prepared = prepare_messages([
        {"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]},
        {"role": "system", "content": "late"}, {"role": "user"}], TOOLS)
    assert prepared == [{"role": "system", "content": "be brief\n\nlate"}, {"role": "user", "content": "ab"},
                        {"role": "user", "content": ""}]


@pytest.fixture
async def smollm2():
    server = LocalModelServer("local/smollm2")
    url = await server.start()
    yield url
    await server.stop()


async def prompt_tokens(url: str, messages: list, **body) -> int:
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{url}/chat/completions", json={
            "model": "local/smollm2", "messages": messages, "max_tokens": 1, "temperature": 0, **body})
    response.raise_for_status()
    return response.json()["usage"]["prompt_tokens"]


@pytest.mark.system
async def test_the_model_sees_tools_tool_results_and_unescaped_text(smollm2):
    bare = await prompt_tokens(smollm2, ASKED)
    assert await prompt_tokens(smollm2, ASKED, tools=TOOLS) > bare + 100        # the schema is in the prompt
    result = {"role": "tool", "tool_call_id": "c1", "content": "sunny and 21 degrees. " * 10}
    assert (await prompt_tokens(smollm2, [*CALLED, result], tools=TOOLS)
            > await prompt_tokens(smollm2, CALLED, tools=TOOLS) + 50)            # the result is in the prompt
    quoted = await prompt_tokens(smollm2, [{"role": "user", "content": " ".join(['"x"'] * 30)}])
    bracketed = await prompt_tokens(smollm2, [{"role": "user", "content": " ".join(["(x)"] * 30)}])
    assert abs(quoted - bracketed) < 10                                         # not &#34;x&#34;


@pytest.fixture
def tmpdir_for_logs(tmp_path, monkeypatch):
    """The temporary directory the server's log goes to, empty, private to the test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.system
async def test_traces_record_the_local_servers_address_and_a_normal_stop_deletes_its_log(tmpdir_for_logs):
    config = vf.AgentConfig(model="local/smollm2", orchestrator="inline", harness="chat", max_turn_tokens=4)
    async with vf.make_agent(config) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="Say hi.")))
        server = agent._services.server
        assert server.log_path.parent == tmpdir_for_logs and server.log_path.stat().st_size > 0
    assert trace.model_calls and not trace.errors
    assert trace.agent["client"]["base_url"] == server.base_url != vf.ClientConfig().base_url
    assert trace.agent["client"]["api_key_env"] is None
    assert agent.info["client"]["base_url"] == vf.ClientConfig().base_url   # the config (its hash) is unchanged
    assert list(tmpdir_for_logs.iterdir()) == []


@pytest.mark.system
async def test_a_server_that_exited_on_its_own_keeps_its_log_and_names_it(tmpdir_for_logs, caplog):
    server = LocalModelServer("local/smollm2")
    await server.start()
    server.process.kill()
    server.process.wait()
    await server.stop()
    assert server.log_path.is_file() and server.log_path.stat().st_size > 0
    assert f"exited with code -9 before it was stopped; see {server.log_path}" in caplog.text


@pytest.mark.system
async def test_a_server_that_cannot_start_keeps_its_log_and_names_it(tmpdir_for_logs):
    bad = tmpdir_for_logs / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    server = LocalModelServer(f"local/{bad}")
    with pytest.raises(RuntimeUnavailableError, match="exited with code") as caught:
        await server.start()
    assert str(server.log_path) in str(caught.value) and server.log_path.read_text()
    await server.stop()   # nothing to stop; the log stays
    assert server.log_path.is_file()
