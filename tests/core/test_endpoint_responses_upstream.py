"""Programs through the interception endpoint to an OpenAI Responses upstream (the agent's client speaks
``api = "responses"``; the scripted server's Responses route is the upstream; real sockets).

Every program dialect runs a tool round trip; a Codex-shaped Responses conversation arrives upstream equal
to what the program sent but for the imposed fields (reasoning items with ``encrypted_content``, call ids,
item ids, tools, ``include``, ``store``...), and the upstream's reasoning items reach the program verbatim.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

import prefect_rollouts as vf
from tests.core.test_endpoint_dialects import WIRES, Wire, launched, rewrites_of
from tests.core.test_program_harness import KEY
from tests.fakes.openai_server import reply, tool_call
from tests.fakes.responses_server import function_call, message, output, reasoning

pytestmark = pytest.mark.unit

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
PARAMETERS = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
IMPOSED = ("model", "stream")
"""What the endpoint changes of a Responses request to a Responses upstream here (no sampling, no token
cap configured; the client does not stream)."""


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


@pytest.fixture
def responses_config(agent_config, openai_server):
    """``agent_config`` whose client speaks Responses to the scripted server."""
    def make(**fields: Any) -> vf.AgentConfig:
        client = vf.ClientConfig(base_url=openai_server.base_url, api="responses", api_key_env="TEST_OPENAI_KEY",
                                 timeout=10, retries=vf.RetryConfig(max_retries=2, backoff_s=0.01, max_backoff_s=0.05))
        return agent_config(client=client, **fields)
    return make


def _round_trip(wire: Wire) -> tuple[dict[str, Any], Any, Any, Any]:
    """``(first body, the call in the reply -> (id, name, arguments), the second body for a call id,
    the final reply -> text)`` of a tool round trip in ``wire``'s dialect."""
    if wire.name == "chat":
        tools = [{"type": "function", "function": {"name": "shell", "description": "run", "parameters": PARAMETERS}}]
        first = {"model": "m", "messages": [{"role": "user", "content": "list"}], "tools": tools}

        def call(answer: dict[str, Any]) -> tuple[str, str, Any]:
            made = answer["choices"][0]["message"]["tool_calls"][0]
            return made["id"], made["function"]["name"], json.loads(made["function"]["arguments"])

        def second(ident: str) -> dict[str, Any]:
            return {**first, "messages": [*first["messages"], {"role": "assistant", "content": None, "tool_calls": [
                {"id": ident, "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}]},
                {"role": "tool", "tool_call_id": ident, "content": "a.txt"}]}
        return first, call, second, lambda answer: answer["choices"][0]["message"]["content"]
    if wire.name == "responses":
        tools = [{"type": "function", "name": "shell", "description": "run", "parameters": PARAMETERS, "strict": False}]
        first = {"model": "m", "input": [{"role": "user", "content": "list"}], "tools": tools}

        def call(answer: dict[str, Any]) -> tuple[str, str, Any]:
            made = next(item for item in answer["output"] if item["type"] == "function_call")
            return made["call_id"], made["name"], json.loads(made["arguments"])

        def second(ident: str) -> dict[str, Any]:
            return {**first, "input": [*first["input"], {"type": "function_call", "call_id": ident, "name": "shell",
                                                         "arguments": '{"cmd": "ls"}'},
                                       {"type": "function_call_output", "call_id": ident, "output": "a.txt"}]}
        return first, call, second, lambda answer: answer["output"][0]["content"][0]["text"]
    tools = [{"name": "shell", "description": "run", "input_schema": PARAMETERS}]
    first = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "list"}], "tools": tools}

    def call(answer: dict[str, Any]) -> tuple[str, str, Any]:
        made = next(block for block in answer["content"] if block["type"] == "tool_use")
        return made["id"], made["name"], made["input"]

    def second(ident: str) -> dict[str, Any]:
        return {**first, "messages": [
            *first["messages"], {"role": "assistant", "content": [{"type": "tool_use", "id": ident, "name": "shell",
                                                                   "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ident, "content": "a.txt"}]}]}
    return first, call, second, lambda answer: answer["content"][0]["text"]


@pytest.mark.parametrize("wire", WIRES, ids=[wire.name for wire in WIRES])
async def test_every_program_dialect_runs_a_tool_round_trip_on_a_responses_upstream(
        openai_server, responses_config, tmp_path, wire):
    openai_server.play([tool_call("shell", cmd="ls"), reply("a.txt is there")])
    first, call_of, second, text_of = _round_trip(wire)
    async with launched(responses_config, tmp_path, wire) as launch:
        answer = await launch.post(first)
        ident, name, arguments = call_of(answer.json())
        final = await launch.post(second(ident))
        trace = launch.interaction.trace
    assert answer.status_code == 200 and final.status_code == 200, final.text
    assert (name, arguments, text_of(final.json())) == ("shell", {"cmd": "ls"}, "a.txt is there")
    if wire.name == "chat":   # what only a Responses program takes back is not in a chat completion
        assert "responses_item" not in json.dumps([answer.json(), final.json()])
    asked, resent = (request.body for request in openai_server.requests)
    assert [request.path for request in openai_server.requests] == ["/v1/responses"] * 2
    assert asked["tools"] == [{"type": "function", "name": "shell", "description": "run", "parameters": PARAMETERS,
                               "strict": False}]
    assert asked["model"] == "scripted" and asked["store"] is False and "messages" not in asked
    upstream_id = "call_" + ident.rsplit("_", 1)[-1]
    assert ident == upstream_id   # the upstream's call id reaches the program, and goes back, unchanged
    calls = [item for item in resent["input"] if item.get("type") == "function_call"]
    outputs = [item for item in resent["input"] if item.get("type") == "function_call_output"]
    assert [(item["call_id"], item["name"], json.loads(item["arguments"])) for item in calls] == [
        (ident, "shell", {"cmd": "ls"})]
    assert [(item["call_id"], item["output"]) for item in outputs] == [(ident, "a.txt")]
    assert trace.model_calls[1].prompt_tokens == 10 * len(resent["input"])


def _events(text: str) -> list[Any]:
    events = []
    for block in text.strip().split("\n\n"):
        head, data = block.split("\n", 1)
        event = EVENTS.validate_json(data.removeprefix("data: "))
        assert head == f"event: {event.type}"
        events.append(event)
    return events


def _less_imposed(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in IMPOSED}


CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "description": "Runs a command", "strict": False,
     "parameters": PARAMETERS},
    {"type": "namespace", "name": "multi_agent_v1", "tools": [
        {"type": "function", "name": "spawn_agent", "strict": False, "parameters": PARAMETERS}]},
    {"type": "custom", "name": "apply_patch", "description": "Patch files",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}]


def codex_first() -> dict[str, Any]:
    """Codex's first request (the 0.169 shape: ids on items, developer messages, a namespace and a custom
    tool, reasoning and include, store false, streamed), with ``instructions`` as older versions send it."""
    return {
        "model": "gpt-5.1-codex", "instructions": "You are Codex.", "stream": True, "tool_choice": "auto",
        "parallel_tool_calls": True, "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1", "text": {"verbosity": "low"},
        "client_metadata": {"session_id": "s"}, "tools": CODEX_TOOLS, "input": [
            {"type": "message", "id": "msg_a", "role": "developer",
             "content": [{"type": "input_text", "text": "sandbox rules"}]},
            {"type": "message", "id": "msg_b", "role": "developer",
             "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "id": "msg_c", "role": "user",
             "content": [{"type": "input_text", "text": "What is 2 + 3?"},
                         {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=",
                          "detail": "auto"}]}]}


async def test_a_codex_conversation_reaches_a_responses_upstream_as_codex_sent_it(
        openai_server, responses_config, tmp_path):
    thought = reasoning("Compute, then write the file.", "gAAAAB-encrypted-by-openai-1", "rs_up_1")
    openai_server.play([output(thought, function_call("exec_command", {"cmd": "echo 5 > answer.txt"},
                                                      "call_up_1", "fc_up_1")),
                        output(message("5 is in answer.txt", "msg_up_2"))])
    wire = next(wire for wire in WIRES if wire.name == "responses")
    first = codex_first()
    async with launched(responses_config, tmp_path, wire) as launch:
        answer = await launch.post(first)
        events = _events(answer.text)
        done = [event.item.model_dump(exclude_unset=True) for event in events
                if event.type == "response.output_item.done"]
        second = {**first, "input": [*first["input"], *done, {
            "type": "function_call_output", "id": "fco_1", "call_id": done[1]["call_id"], "output": "exit 0"}]}
        final = _events((await launch.post(second)).text)[-1].response
        trace = launch.interaction.trace
    assert done[0] == thought   # the reasoning item reaches the program verbatim, encrypted_content and id
    assert (done[1]["id"], done[1]["call_id"]) == ("fc_up_1", "call_up_1")
    assert final.output_text == "5 is in answer.txt" and final.output[0].id == "msg_up_2"
    for program, upstream in zip((first, second), openai_server.requests, strict=True):
        assert _less_imposed(upstream.body) == _less_imposed(program)
        assert upstream.body["model"] == "scripted" and "stream" not in upstream.body
    assert openai_server.requests[1].body["input"][3] == thought
    assert [rewrites_of(trace, call)["translated"] for call in (0, 1)] == [{"dialect": "responses"}] * 2
    assert trace.messages[0] == {"role": "system", "content": "You are Codex."}
    assert trace.messages[-1]["content"] == "5 is in answer.txt"


async def test_imposed_fields_win_over_the_programs_own_on_a_responses_upstream(
        openai_server, responses_config, tmp_path):
    openai_server.play([reply("ok")])
    wire = next(wire for wire in WIRES if wire.name == "responses")
    config = {"max_turn_tokens": 32, "sampling": vf.SamplingConfig(temperature=0.2)}
    async with launched(responses_config, tmp_path, wire, **config) as launch:
        answer = await launch.post({"model": "theirs", "temperature": 1.5, "max_output_tokens": 5000, "store": True,
                                    "input": "go"})
        trace = launch.interaction.trace
    sent = openai_server.requests[0].body
    assert answer.status_code == 200
    assert (sent["model"], sent["temperature"], sent["max_output_tokens"], sent["store"]) == ("scripted", 0.2, 32, True)
    assert rewrites_of(trace, 0)["imposed"] == {"model": {"program": "theirs", "sent": "scripted"},
                                                "temperature": {"program": 1.5, "sent": 0.2},
                                                "max_tokens": {"program": 5000, "sent": 32}}


async def test_sampling_extra_wins_over_the_programs_native_fields_on_a_responses_upstream(
        openai_server, responses_config, tmp_path):
    openai_server.play([reply("ok"), reply("ok")])
    wire = next(wire for wire in WIRES if wire.name == "responses")
    tools = [{"type": "function", "name": "shell", "parameters": PARAMETERS}]
    asked = {"input": "go", "tools": tools, "tool_choice": "required", "include": ["reasoning.encrypted_content"],
             "reasoning": {"effort": "high", "summary": "auto"}, "text": {"verbosity": "high"}}
    extra = {"reasoning": {"effort": "low"}, "text": {"verbosity": "low"}, "tool_choice": "none"}
    async with launched(responses_config, tmp_path, wire, sampling=vf.SamplingConfig(extra=extra)) as launch:
        assert (await launch.post(asked)).status_code == 200
    sent = openai_server.requests[0].body
    assert (sent["reasoning"], sent["text"], sent["tool_choice"]) == ({"effort": "low"}, {"verbosity": "low"}, "none")
    assert sent["include"] == ["reasoning.encrypted_content"] and sent["tools"] == tools   # not imposed: as sent
    chat_keys = {"reasoning_effort": "low", "verbosity": "low"}   # chat's names: set inside the program's own
    async with launched(responses_config, tmp_path, wire, sampling=vf.SamplingConfig(extra=chat_keys)) as launch:
        assert (await launch.post(asked)).status_code == 200
    sent = openai_server.requests[1].body
    assert (sent["reasoning"], sent["text"]) == ({"effort": "low", "summary": "auto"}, {"verbosity": "low"})


async def test_a_chat_program_to_a_responses_upstream_records_the_keys_it_cannot_take(
        openai_server, responses_config, tmp_path):
    openai_server.play([reply("ok")])
    wire = next(wire for wire in WIRES if wire.name == "chat")
    async with launched(responses_config, tmp_path, wire) as launch:
        answer = await launch.ask([("user", "go")], seed=7, stop=["\n"])
        trace = launch.interaction.trace
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "ok"
    assert "seed" not in openai_server.requests[0].body and "stop" not in openai_server.requests[0].body
    assert rewrites_of(trace, 0)["translated"] == {"dialect": "chat", "ignored": ["seed", "stop"]}


async def test_a_later_turn_drops_the_programs_own_developer_messages_before_the_carried_ones(
        openai_server, responses_config, tmp_path):
    """Codex resends its developer messages on every launch; a later turn's conversation already holds
    them (carried), so they go upstream once, as the leading system message of a chat upstream does."""
    openai_server.play([reply("first"), reply("second")])
    wire = next(wire for wire in WIRES if wire.name == "responses")
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]}

    def ask(text: str) -> dict[str, Any]:
        return {"input": [developer, {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": text}]}]}
    async with launched(responses_config, tmp_path, wire) as launch:
        assert (await launch.post(ask("go"))).status_code == 200
        await launch.next_turn("two")
        answer = await launch.post(ask("two"))
        trace = launch.interaction.trace
    assert answer.status_code == 200
    roles = [(item.get("role"), item["content"][0]["text"]) for item in openai_server.requests[1].body["input"]]
    assert roles == [("developer", "rules"), ("user", "go"), ("assistant", "first"), ("user", "two")]
    assert rewrites_of(trace, 1)["dropped_system_messages"] == 1
