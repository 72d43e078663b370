"""The OpenAI Responses dialect driven by the ``openai`` SDK's own client, streamed and not, its stream
helper included, with every raw body and server-sent event validated against the SDK's pydantic types
(the client does not validate what it parses; these tests do). Real sockets; the scripted server is
the upstream (``test_endpoint_dialects`` holds the launch open)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.core.test_endpoint_dialects import WIRES, Launch, launched, rewrites_of
from tests.core.test_program_harness import KEY
from tests.fakes.openai_server import reply, tool_call

pytestmark = pytest.mark.unit

RESPONSES = next(wire for wire in WIRES if wire.name == "responses")
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
SHELL = {"type": "function", "name": "shell", "description": "Run a command", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                        "required": ["command"]}}


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


def sdk(launch: Launch) -> openai.AsyncOpenAI:
    """The SDK's client on the launch's socket, with the launch's key, no retries."""
    transport = httpx.AsyncHTTPTransport(uds=str(launch.endpoint.socket_path))
    return openai.AsyncOpenAI(base_url="http://endpoint/v1", api_key=launch.session.secret, max_retries=0,
                              http_client=httpx.AsyncClient(transport=transport, timeout=10))


async def sse(launch: Launch, body: dict[str, Any]) -> list[Any]:
    """The raw stream of ``body`` (streamed), each event parsed by the SDK's types; its ``event:``
    line must name the event's type."""
    answer = await launch.post({**body, "stream": True})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in answer.text.strip().split("\n\n"):
        head, data = block.split("\n", 1)
        event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {event.type}"
        events.append(event)
    return events


async def test_a_non_streamed_response_is_a_valid_response_object(openai_server, agent_config, tmp_path):
    usage = {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35,
             "prompt_tokens_details": {"cached_tokens": 12}, "completion_tokens_details": {"reasoning_tokens": 2}}
    openai_server.play([reply("4", usage=usage)])
    async with launched(agent_config, tmp_path, RESPONSES) as launch:
        raw = await sdk(launch).responses.with_raw_response.create(
            model="any", input="What is 2+2?", instructions="Be brief.", max_output_tokens=50)
        trace = launch.interaction.trace
    response = Response.model_validate(raw.http_response.json())
    assert response.output_text == "4" and response.status == "completed"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (30, 5, 35)
    assert response.usage.input_tokens_details.cached_tokens == 12
    assert response.usage.output_tokens_details.reasoning_tokens == 2
    assert openai_server.requests[0].messages == [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "What is 2+2?"}]
    assert openai_server.requests[0].body["max_tokens"] == 50
    assert trace.model_calls[0].cached_tokens == 12 and trace.messages[-1]["content"] == "4"


async def test_a_streamed_response_is_the_event_sequence_the_sdk_parses(openai_server, agent_config, tmp_path):
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    openai_server.play([reply("Hello there", usage=usage), reply("Hello there", usage=usage)])
    async with launched(agent_config, tmp_path, RESPONSES) as launch:
        events = await sse(launch, {"input": "hi"})
        streamed = [event async for event in await sdk(launch).responses.create(input="hi!", stream=True,
                                                                               model="m")]
    assert [event.type for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[4].delta == "Hello there" and events[-1].response.output_text == "Hello there"
    assert events[-1].response.usage is not None and events[-1].response.usage.output_tokens == 3
    assert [event.type for event in streamed] == [event.type for event in events]


async def test_the_stream_helper_assembles_a_tool_round_trip(openai_server, agent_config, tmp_path):
    openai_server.play([tool_call("shell", command="ls"), reply("a.txt is there"), tool_call("shell", command="ls")])
    async with launched(agent_config, tmp_path, RESPONSES) as launch:
        client = sdk(launch)
        async with client.responses.stream(model="m", input="list the files", tools=[SHELL]) as stream:
            first = await stream.get_final_response()
        call = first.output[0]
        assert call.type == "function_call" and json.loads(call.arguments) == {"command": "ls"}
        history: list[Any] = [{"role": "user", "content": "list the files"},
                              {"type": "function_call", "call_id": call.call_id, "name": call.name,
                               "arguments": call.arguments},
                              {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}]
        raw = await client.responses.with_raw_response.create(model="m", input=history, tools=[SHELL])
        events = await sse(launch, {"input": "list the files", "tools": [SHELL]})   # the raw stream of a call
        trace = launch.interaction.trace
    second = Response.model_validate(raw.http_response.json())
    assert second.output_text == "a.txt is there"
    assert [event.type for event in events if "function_call" in event.type] == [
        "response.function_call_arguments.delta", "response.function_call_arguments.done"]
    assert events[-1].response.output[0].name == "shell"
    upstream = openai_server.requests[1].messages
    assert [m["role"] for m in upstream] == ["user", "assistant", "tool"] and len(trace.model_calls) == 3
    assert upstream[1]["tool_calls"][0]["id"] == call.call_id and upstream[2]["content"] == "a.txt"


async def test_a_length_finish_is_an_incomplete_response_ending_with_response_completed(
        openai_server, agent_config, tmp_path):
    openai_server.play([reply("cut", finish_reason="length")])
    async with launched(agent_config, tmp_path, RESPONSES) as launch:
        events = await sse(launch, {"input": "hi", "max_output_tokens": 3})
    final = events[-1]
    assert final.type == "response.completed" and final.response.status == "incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"


async def test_the_refusal_after_a_stop_is_a_400_the_sdk_raises_without_retrying(
        openai_server, agent_config, tmp_path):
    openai_server.default = reply("ok")
    async with launched(agent_config, tmp_path, RESPONSES, max_turns=1) as launch:
        client = sdk(launch).with_options(max_retries=2)
        await client.responses.create(model="m", input="one")
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="m", input="two", stream=True)
        trace = launch.interaction.trace
    assert refused.value.status_code == 400 and refused.value.body["message"] == "rollout stopped: max_turns"
    assert refused.value.code == "rollout_stopped"
    assert [r["status"] for r in trace.info["endpoint"]["refused"]] == [400]   # asked once: a 400 is not retried


async def test_codex_0_169s_second_request_is_accepted_and_what_is_lost_recorded(
        openai_server, agent_config, tmp_path):
    """The shape Codex CLI 0.169.0 sends (notes-33-wire.md, captured by the agents helper): ids on every
    item, two leading developer messages, a namespace tool, a tool round trip resent with the call's id
    and status, ``client_metadata``; no ``instructions``, no ``max_output_tokens``."""
    openai_server.play([reply("done")])
    namespace = {"type": "namespace", "name": "multi_agent_v1", "tools": [{**SHELL, "name": "spawn_agent"}]}
    body = {"model": "scripted", "stream": True, "tool_choice": "auto", "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"}, "store": False, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "thread-1", "client_metadata": {"session_id": "s"},
            "tools": [{**SHELL, "name": "exec_command"}, namespace], "input": [
                {"type": "message", "id": "msg_1", "role": "developer",
                 "content": [{"type": "input_text", "text": "sandbox rules"}]},
                {"type": "message", "id": "msg_2", "role": "developer",
                 "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"type": "message", "id": "msg_3", "role": "user", "content": [{"type": "input_text", "text": "env"}]},
                {"type": "message", "id": "msg_4", "role": "user",
                 "content": [{"type": "input_text", "text": "What is 2 + 3?"}]},
                {"type": "function_call", "status": "completed", "id": "fc_resp_1", "name": "exec_command",
                 "arguments": "{\"cmd\": \"echo 5 > answer.txt\"}", "call_id": "call_resp_1"},
                {"type": "function_call_output", "id": "fco_1", "call_id": "call_resp_1", "output": "exit 0"}]}
    async with launched(agent_config, tmp_path, RESPONSES) as launch:
        events = await sse(launch, body)
        trace = launch.interaction.trace
    assert events[-1].response.output_text == "done"
    sent = openai_server.requests[0].body
    assert [(m["role"], m["content"]) for m in sent["messages"]] == [
        ("system", "sandbox rules\n\nab"), ("user", "env"), ("user", "What is 2 + 3?"), ("assistant", ""),
        ("tool", "exit 0")]
    assert sent["messages"][3]["tool_calls"] == [{"id": "call_resp_1", "type": "function", "function": {
        "name": "exec_command", "arguments": '{"cmd": "echo 5 > answer.txt"}'}}]
    assert (sent["parallel_tool_calls"], sent["tool_choice"]) == (True, "auto")
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["exec_command"]
    assert rewrites_of(trace, 0)["translated"] == {
        "dialect": "responses", "dropped_tools": ["multi_agent_v1"],
        "ignored": ["client_metadata", "include", "prompt_cache_key", "reasoning", "store"]}


async def test_instructions_text_format_and_strict_tools_are_translated_or_recorded(
        openai_server, agent_config, tmp_path):
    openai_server.play([reply('{"n": 5}')])
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    body = {"instructions": "Answer in JSON.", "input": "2+3?", "tools": [{**SHELL, "strict": True}],
            "tool_choice": {"type": "function", "name": "shell"}, "max_output_tokens": 20,
            "text": {"format": {"type": "json_schema", "name": "sum", "schema": schema, "strict": True},
                     "verbosity": "low"}}
    async with launched(agent_config, tmp_path, RESPONSES) as launch:
        response = Response.model_validate((await launch.post(body)).json())
        trace = launch.interaction.trace
    sent = openai_server.requests[0].body
    assert response.output_text == '{"n": 5}'
    assert sent["messages"][0] == {"role": "system", "content": "Answer in JSON."}
    assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "sum", "schema": schema,
                                                                              "strict": True}}
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "shell"}} and sent["max_tokens"] == 20
    assert rewrites_of(trace, 0)["translated"] == {"dialect": "responses", "strict_tools": 1, "text_verbosity": "low"}
