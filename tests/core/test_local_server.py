"""The local model server: its chat format (the model must see the tools, the tool results and
unescaped text; checked on the real SmolLM2 server through its prompt token counts), every
generation of a request bounded by its ``max_tokens`` (issue 32, item 11), the address traces
record, and its log file (kept only when the server failed)."""

from __future__ import annotations

import tempfile

import httpx
import pytest

import prefect_rollouts as vf
from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.model.llama_server import DEFAULT_MAX_TOKENS, Steps, prepare_messages
from prefect_rollouts.model.local import LocalModelServer
from tests.support.extras import require_module

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


BASH = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


class Rambling:
    """A ``Llama`` whose every generation runs as long as it may (one token a character): the
    tool's arguments are a JSON string that never closes, as SmolLM2's did for 384 s."""

    verbose = False

    def __init__(self) -> None:
        self.caps: list[int | None] = []

    def create_completion(self, prompt: str, max_tokens: int | None = None, stop: list[str] | None = None,
                          **kwargs) -> dict:
        self.caps.append(max_tokens)
        whole = ("functions.bash:" if stop == [":"] else '{"command": "' + "y" * 20_000
                 if prompt.endswith("functions.bash:\n") else "")   # the choice, the arguments, no next call
        text = whole if max_tokens is None or max_tokens <= 0 else whole[:max_tokens]
        finish = "length" if len(text) < len(whole) else "stop"
        return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
                "choices": [{"text": text.removesuffix(":"), "index": 0, "logprobs": None, "finish_reason": finish}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(text),
                          "total_tokens": len(prompt) + len(text)}}


@pytest.mark.unit
@pytest.mark.parametrize("max_tokens", [40, 3, None])
def test_every_generation_of_an_auto_tool_call_draws_on_one_budget(max_tokens):
    chat_format = require_module("llama_cpp.llama_chat_format", "the local extra")
    llama = Rambling()
    budget = Steps(llama, max_tokens)
    response = budget.account(chat_format.chatml_function_calling(
        llama=budget, messages=prepare_messages([{"role": "user", "content": "hi"}], BASH), tools=BASH,
        tool_choice="auto", max_tokens=max_tokens))
    cap = max_tokens or DEFAULT_MAX_TOKENS
    assert llama.caps and all(step is not None and 0 < step <= cap for step in llama.caps)
    assert response["usage"]["completion_tokens"] == cap and response["choices"][0]["finish_reason"] == "length"
    calls = response["choices"][0]["message"]["tool_calls"]
    assert [call["function"]["arguments"][:13] for call in calls] == ([] if cap < len("functions.bash:") else
                                                                       ['{"command": "'])


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
@pytest.mark.smollm2
async def test_the_model_sees_tools_tool_results_and_unescaped_text(smollm2):
    bare = await prompt_tokens(smollm2, ASKED)
    assert await prompt_tokens(smollm2, ASKED, tools=TOOLS) > bare + 100        # the schema is in the prompt
    result = {"role": "tool", "tool_call_id": "c1", "content": "sunny and 21 degrees. " * 10}
    assert (await prompt_tokens(smollm2, [*CALLED, result], tools=TOOLS)
            > await prompt_tokens(smollm2, CALLED, tools=TOOLS) + 50)            # the result is in the prompt
    quoted = await prompt_tokens(smollm2, [{"role": "user", "content": " ".join(['"x"'] * 30)}])
    bracketed = await prompt_tokens(smollm2, [{"role": "user", "content": " ".join(["(x)"] * 30)}])
    assert abs(quoted - bracketed) < 10                                         # not &#34;x&#34;


@pytest.mark.system
@pytest.mark.smollm2
async def test_a_tool_call_without_tool_choice_stops_at_max_tokens_on_the_real_model(smollm2):
    """Before: max_tokens = 10 gave 33 completion tokens here, and the arguments could run to the end
    of the context (7,600 tokens, 384 s)."""
    ask = [{"role": "user", "content": "Write a python script that prints the first 100 primes, using the bash "
                                       "tool, with a heredoc."}]
    async with httpx.AsyncClient(timeout=120) as client:
        async def answer(messages: list, tools: list, cap: int) -> tuple[int, dict]:
            response = await client.post(f"{smollm2}/chat/completions", json={
                "model": "local/smollm2", "messages": messages, "tools": tools, "max_tokens": cap, "temperature": 0})
            return response.json()["usage"]["completion_tokens"], response.json()["choices"][0]
        cut, whole = await answer(ask, BASH, 10), await answer(ASKED, TOOLS, 64)
    assert cut[0] <= 10 and cut[1]["finish_reason"] == "length"
    assert whole[0] <= 64 and whole[1]["finish_reason"] == "tool_calls"
    assert [call["function"]["name"] for call in whole[1]["message"]["tool_calls"]] == ["get_weather"]


@pytest.mark.system
@pytest.mark.smollm2
async def test_the_model_can_answer_in_words_beside_tools_without_tool_choice(smollm2):
    """Before: the message was generated under the tool-name grammar and came back empty."""
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{smollm2}/chat/completions", json={
            "model": "local/smollm2", "messages": [{"role": "user", "content": "Hello! Who are you? Answer in one "
                                                   "sentence."}], "tools": TOOLS, "max_tokens": 100, "temperature": 0})
    choice = response.json()["choices"][0]
    assert not choice["message"].get("tool_calls") and len(choice["message"]["content"].split()) >= 3


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
    server.process.wait(timeout=10)
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
