"""What holds for every wire dialect of the interception endpoint, checked for each: limits, imposed
model and sampling, carried history, steer, replay, scrubbing, request checks, the size cap, and what a
translation keeps on the trace (real sockets; a program harness holds the launch open while the test
speaks for the program; the scripted server is the upstream).

A dialect is a ``Wire`` row: add one to ``WIRES`` and every test here runs for it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

import prefect_rollouts as vf
from prefect_rollouts.harnesses import endpoint_limits
from prefect_rollouts.harnesses.dialects import echo
from prefect_rollouts.harnesses.session import ProgramSession
from tests.core.test_program_harness import KEY, Said, program
from tests.fakes.openai_server import delayed, reply, tool_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit

HOLD = """
    import os, time
    release = {release!r}
    while not os.path.exists(release):
        time.sleep(0.01)
    os.unlink(release)
"""
"""The program: it waits until the test releases it (the test makes its model requests meanwhile)."""


@dataclass(frozen=True)
class Wire:
    """How the program speaks one dialect: its path, its auth header, a request body for some
    ``(role, text)`` turns, the reply's text and an error's message, and a bad body with the start of
    the 400 that names its field."""

    name: str
    path: str
    body: Callable[[list[tuple[str, str]], dict[str, Any]], dict[str, Any]]
    text: Callable[[dict[str, Any]], str]
    bad: tuple[dict[str, Any], str]
    error: Callable[[dict[str, Any]], str] = lambda answer: answer["error"]["message"]
    auth: Callable[[str], dict[str, str]] = lambda key: {"Authorization": f"Bearer {key}"}
    max_tokens_key: str = "max_tokens"
    joins_steer: bool = False
    stop_status: int = 400
    """The status of the refusal after a stop condition (``Dialect.stop_status``)."""
    """Its turns alternate strictly: a steer becomes a text part of the user message it follows."""


WIRES = [
    Wire("chat", "/v1/chat/completions",
         body=lambda turns, extra: {"messages": [{"role": r, "content": t} for r, t in turns], **extra},
         text=lambda answer: answer["choices"][0]["message"]["content"],
         bad=({"messages": [{"role": "user", "content": "x"}], "max_tokens": "100"},
              "max_tokens: Input should be a valid integer")),
    Wire("responses", "/v1/responses",
         body=lambda turns, extra: {"input": [{"role": r, "content": t} for r, t in turns], **extra},
         text=lambda answer: answer["output"][0]["content"][0]["text"],
         bad=({"input": [{"role": "user", "content": "x", "type": "message"}, {"type": "function_call"}]},
              "input.1.call_id: must be a string"),
         max_tokens_key="max_output_tokens"),
    Wire("messages", "/v1/messages?beta=true",
         body=lambda turns, extra: {"max_tokens": 64, "messages": [{"role": r, "content": t} for r, t in turns],
                                    **extra},
         text=lambda answer: answer["content"][0]["text"],
         bad=({"messages": [{"role": "user", "content": "x"}]}, "max_tokens: required"),
         auth=lambda key: {"x-api-key": key, "anthropic-version": "2023-06-01"}, joins_steer=True,
         stop_status=403),
]


@dataclass
class Launch:
    """An interaction whose program is held open: its current session, a client on the endpoint's
    socket, the running turn, and the file that releases the program."""

    interaction: vf.Interaction
    endpoint: Any
    session: ProgramSession
    http: httpx.AsyncClient
    wire: Wire
    turn: asyncio.Task[Any]
    release: Path

    async def ask(self, turns: list[tuple[str, str]], headers: dict[str, str] | None = None,
                  **extra: Any) -> httpx.Response:
        """POST a request of ``turns`` in the launch's dialect, with its key."""
        return await self.post(self.wire.body(turns, extra), headers)

    async def post(self, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST ``body`` in the launch's dialect, with its key."""
        return await self.http.post(self.wire.path, json=body,
                                    headers={**self.wire.auth(self.session.secret), **(headers or {})})

    async def next_turn(self, text: str) -> None:
        """Release the program, let its turn end, and start the next turn on ``text`` (a new launch)."""
        self.release.touch()
        await asyncio.wait_for(self.turn, 10)
        self.turn = asyncio.create_task(self.interaction.turn(text))
        self.session = await wait_for(lambda: next(iter(self.endpoint.sessions.values()), None), 10, 0.01)


async def open_session(endpoint: Any) -> ProgramSession:
    return await wait_for(lambda: next(iter(endpoint.sessions.values()), None), 10, 0.01)


@contextlib.asynccontextmanager
async def launched(agent_config, tmp_path, wire: Wire, **fields: Any) -> AsyncIterator[Launch]:
    """An interaction on a holding program, yielded while its first launch is open."""
    release = tmp_path / "release"
    harness = program(tmp_path, HOLD.format(release=str(release)), stop_grace_s=5)
    async with vf.make_agent(agent_config(harness=harness, **fields)) as agent:
        endpoint = agent._services.endpoint
        async with agent.interaction(Said(vf.TaskData(prompt="go"))) as interaction:
            turn = asyncio.create_task(interaction.turn())
            session = await open_session(endpoint)
            transport = httpx.AsyncHTTPTransport(uds=str(endpoint.socket_path))
            async with httpx.AsyncClient(transport=transport, base_url="http://endpoint", timeout=10) as http:
                launch = Launch(interaction, endpoint, session, http, wire, turn, release)
                try:
                    yield launch
                finally:
                    release.touch()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(launch.turn, 10)


def rewrites_of(trace: vf.Trace, call: int) -> dict[str, Any]:
    """``trace.info["program_rewrites"]``'s entry for model call ``call``."""
    return next(entry for entry in trace.info["program_rewrites"] if entry["call"] == call)


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


parametrised = pytest.mark.parametrize("wire", WIRES, ids=[wire.name for wire in WIRES])


@parametrised
async def test_max_turns_answers_up_to_the_cap_and_refuses_the_next_request(openai_server, agent_config,
                                                                            tmp_path, wire):
    openai_server.default = reply("ok")
    async with launched(agent_config, tmp_path, wire, max_turns=2) as launch:
        answers = [await launch.ask([("user", f"q{index}")]) for index in range(3)]
        trace = launch.interaction.trace
    assert [answer.status_code for answer in answers] == [200, 200, wire.stop_status]
    assert [wire.text(answer.json()) for answer in answers[:2]] == ["ok", "ok"]
    assert wire.error(answers[2].json()) == "rollout stopped: max_turns"
    assert len(openai_server.requests) == 2 and trace.stop_condition == "max_turns"


@parametrised
async def test_max_turn_tokens_is_imposed_and_the_request_after_a_length_finish_refused(
        openai_server, agent_config, tmp_path, wire):
    openai_server.play([reply("cut", finish_reason="length")])
    config = {"max_turn_tokens": 8, "sampling": vf.SamplingConfig(temperature=0.2)}
    async with launched(agent_config, tmp_path, wire, **config) as launch:
        first = await launch.ask([("user", "q")], model="their-model", temperature=1.5,
                                 **{wire.max_tokens_key: 500})
        second = await launch.ask([("user", "q"), ("assistant", "cut"), ("user", "more")])
        trace = launch.interaction.trace
    assert first.status_code == 200 and wire.text(first.json()) == "cut"
    assert second.status_code == wire.stop_status and wire.error(second.json()) == "rollout stopped: max_turn_tokens"
    sent = openai_server.requests[0].body
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("scripted", 0.2, 8)
    imposed = rewrites_of(trace, 0)["imposed"]
    assert imposed == {"model": {"program": "their-model", "sent": "scripted"},
                       "temperature": {"program": 1.5, "sent": 0.2}, "max_tokens": {"program": 500, "sent": 8}}
    assert len(openai_server.requests) == 1 and trace.stop_condition == "max_turn_tokens" and trace.is_truncated


@parametrised
async def test_a_later_turn_carries_the_conversation_ahead_of_the_programs_messages(
        openai_server, agent_config, tmp_path, wire):
    openai_server.play([reply("first"), reply("second")])
    async with launched(agent_config, tmp_path, wire) as launch:
        assert (await launch.ask([("user", "go")])).status_code == 200
        await launch.next_turn("two")
        answer = await launch.ask([("user", "two")])
    assert wire.text(answer.json()) == "second"
    assert [(m["role"], m["content"]) for m in openai_server.requests[1].messages] == [
        ("user", "go"), ("assistant", "first"), ("user", "two")]


@parametrised
async def test_a_steer_lands_in_the_next_request_and_stays_in_every_later_one(
        openai_server, agent_config, tmp_path, wire):
    openai_server.default = reply("ok")
    async with launched(agent_config, tmp_path, wire) as launch:
        await launch.ask([("user", "go")])
        receipt = await launch.interaction.send("use the fast path", mode="steer", message_id="s1")
        await launch.ask([("user", "go"), ("assistant", "ok"), ("user", "next")])
        await launch.ask([("user", "go"), ("assistant", "ok"), ("user", "next"), ("assistant", "ok"),
                          ("user", "last")])
        trace = launch.interaction.trace
    second, third = (request.messages for request in openai_server.requests[1:3])
    steer = {"role": "user", "content": "use the fast path"}
    if wire.joins_steer:   # a text block of the user turn it lands in, at its place in every later request
        steer = {"role": "user", "content": [{"type": "text", "text": "next"},
                                             {"type": "text", "text": "use the fast path"}]}
        assert receipt.accepted and second[-1] == steer and third[2] == steer and len(third) == 5
    else:
        assert receipt.accepted and second[-1] == steer and third[3] == steer and third.count(steer) == 1
    assert trace.sends[0].delivered_call == 1 and rewrites_of(trace, 1)["steers_delivered"] == ["s1"]


@parametrised
async def test_a_retried_request_is_answered_from_the_record(openai_server, agent_config, tmp_path, wire):
    openai_server.play([reply("once"), reply("twice")])
    async with launched(agent_config, tmp_path, wire) as launch:
        first = await launch.ask([("user", "go")], headers={"x-stainless-retry-count": "0"})
        retried = await launch.ask([("user", "go")], headers={"x-stainless-retry-count": "1"})
        trace = launch.interaction.trace
    assert first.json() == retried.json() and wire.text(retried.json()) == "once"
    assert len(openai_server.requests) == 1 and len(trace.model_calls) == 1


@parametrised
async def test_the_launch_key_is_scrubbed_from_what_goes_upstream_and_onto_the_trace(
        openai_server, agent_config, tmp_path, wire):
    openai_server.play([reply("ok")])
    async with launched(agent_config, tmp_path, wire) as launch:
        secret = launch.session.secret
        answer = await launch.ask([("user", f"my key is {secret}")])
        trace = launch.interaction.trace
    assert answer.status_code == 200
    assert openai_server.requests[0].messages[-1]["content"] == "my key is ***"
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert secret not in json.dumps(trace.model_dump(mode="json"))


@parametrised
async def test_the_launch_key_is_scrubbed_from_every_string_and_key_of_the_body(
        openai_server, agent_config, tmp_path, wire):
    openai_server.play([reply("ok")])
    async with launched(agent_config, tmp_path, wire) as launch:
        secret = launch.session.secret
        answer = await launch.ask([("user", "go")], model=secret, metadata={secret: f"x{secret}"})
        bad = await launch.ask([("user", "go")], **{wire.max_tokens_key: secret})
        trace = launch.interaction.trace
    assert answer.status_code == 200 and bad.status_code == 400
    assert rewrites_of(trace, 0)["imposed"]["model"] == {"program": "***", "sent": "scripted"}
    assert secret[:20] not in json.dumps(trace.model_dump(mode="json"))
    assert secret[:20] not in json.dumps([request.body for request in openai_server.requests])


def test_an_error_echoes_a_long_value_as_its_type_and_size_never_a_cut():
    assert echo("k" * 43) == "a str of 43 characters" and echo([1] * 30) == "a list of 30 items"
    assert echo("short") == '"short"' and echo(7) == "7"


@parametrised
async def test_a_lone_surrogate_is_a_400_naming_it(openai_server, agent_config, tmp_path, wire):
    async with launched(agent_config, tmp_path, wire) as launch:
        raw = json.dumps(wire.body([("user", "a\ud800b")], {})).encode()   # valid JSON: "a\\ud800b"
        answer = await launch.http.post(wire.path, content=raw, headers=wire.auth(launch.session.secret))
        trace = launch.interaction.trace
    assert answer.status_code == 400, answer.text
    assert wire.error(answer.json()).startswith("the request body holds a lone UTF-16 surrogate (\\ud800)")
    assert openai_server.requests == [] and trace.model_calls == []


@parametrised
async def test_a_content_part_whose_type_is_a_list_or_an_object_is_a_400_naming_it(
        openai_server, agent_config, tmp_path, wire):
    async with launched(agent_config, tmp_path, wire) as launch:
        answers = [await launch.ask([("user", [{"type": kind, "text": "x"}])]) for kind in (["text"], {"t": 1})]
    for answer in answers:   # was a 500: "unhashable type"
        assert answer.status_code == 400, answer.text
        error = wire.error(answer.json())
        assert ".0.content." in error and ".0.type" in error and "string" in error, error
    assert openai_server.requests == []


@parametrised
async def test_the_limiters_refusal_and_an_unserved_method_are_in_the_dialects_error_shape(
        openai_server, agent_config, tmp_path, wire, monkeypatch):
    monkeypatch.setattr(endpoint_limits, "MAX_IN_FLIGHT_PER_ROLLOUT", 2)
    openai_server.default = delayed(0.5, reply("slow"))
    async with launched(agent_config, tmp_path, wire) as launch:
        held = [asyncio.create_task(launch.ask([("user", "go")])) for _ in range(2)]
        await wait_for(lambda: launch.endpoint.limits._in_flight[launch.session.secret] == 2, 5, 0.01)
        refused = await launch.ask([("user", "one more")])
        await asyncio.gather(*held)
        unserved = await launch.http.get(wire.path, headers=wire.auth(launch.session.secret))
    for answer, status in ((refused, 429), (unserved, 405)):
        body = answer.json()
        assert answer.status_code == status and wire.error(body)
        if wire.name == "messages":   # Anthropic's shape: what its SDK parses (was OpenAI's on every path)
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        else:
            assert set(body["error"]) == {"message", "type", "code"}, body
    kind = "rate_limit_error" if wire.name == "messages" else "invalid_request_error"
    assert refused.json()["error"]["type"] == kind


@parametrised
async def test_a_malformed_request_is_a_400_naming_the_field_and_a_huge_one_a_413(
        openai_server, agent_config, tmp_path, wire):
    async with launched(agent_config, tmp_path, wire) as launch:
        bad = await launch.http.post(wire.path, json=wire.bad[0], headers=wire.auth(launch.session.secret))
        huge = await launch.http.post(wire.path, content=b"x" * (32 * 1024 * 1024 + 1),
                                      headers=wire.auth(launch.session.secret))
        dense = await launch.http.post(wire.path, content=b'{"junk": [' + b",".join([b"{}"] * 1_000_001) + b"]}",
                                       headers=wire.auth(launch.session.secret))   # MAX_JSON_VALUES: not parsed
        stranger = await launch.http.post(wire.path, json=wire.bad[0], headers=wire.auth("sk-someone-else"))
        refused = launch.interaction.trace.info["endpoint"]["refused"]
    assert bad.status_code == 400 and wire.error(bad.json()).startswith(wire.bad[1]), bad.text
    assert huge.status_code == 413 and wire.error(huge.json()).startswith("the request body is 33554433 bytes")
    assert dense.status_code == 413 and "more than 1000000 JSON values" in wire.error(dense.json())
    assert stranger.status_code == 401 and "unknown or expired API key" in wire.error(stranger.json())
    path = wire.path.split("?")[0]   # a query string (Claude Code's ?beta=true) is not part of the recorded path
    assert [(r["path"], r["status"]) for r in refused] == [(path, 400), (path, 413), (path, 413)]
    assert openai_server.requests == []


async def test_a_tool_call_round_trip_in_responses_is_one_chat_conversation_upstream(
        openai_server, agent_config, tmp_path):
    openai_server.play([tool_call("shell", command="ls"), reply("done")])
    wire = WIRES[1]
    async with launched(agent_config, tmp_path, wire) as launch:
        tools = [{"type": "function", "name": "shell", "description": "run", "strict": True,
                  "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
        first = (await launch.post({"input": "list", "tools": tools})).json()
        call = first["output"][0]
        resent = {"type": "function_call", "call_id": call["call_id"], "name": call["name"],
                  "arguments": call["arguments"]}   # resent without its id, as Codex does
        second = (await launch.post({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list"}]}, resent,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}], "tools": tools})).json()
        trace = launch.interaction.trace
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "shell", {"command": "ls"})
    assert second["output"][0]["content"][0]["text"] == "done"
    upstream = openai_server.requests[1].body
    assert upstream["tools"] == [{"type": "function", "function": {
        "name": "shell", "description": "run", "parameters": tools[0]["parameters"]}}]
    assert [m["role"] for m in upstream["messages"]] == ["user", "assistant", "tool"]
    assert upstream["messages"][1]["tool_calls"][0]["id"] == call["call_id"]
    assert upstream["messages"][2] == {"role": "tool", "tool_call_id": call["call_id"], "content": "a.txt"}
    assert rewrites_of(trace, 1)["translated"] == {"dialect": "responses", "strict_tools": 1}


async def test_reasoning_items_stay_on_the_trace_and_never_go_upstream(openai_server, agent_config, tmp_path):
    openai_server.play([reply("done")])
    wire = WIRES[1]
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-opaque"}
    body = {"input": [{"type": "message", "role": "user", "content": "go"}, reasoning,
                      {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
            "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
            "reasoning": {"effort": "low"}}
    async with launched(agent_config, tmp_path, wire) as launch:
        answer = await launch.post(body)
        trace = launch.interaction.trace
    assert answer.status_code == 200
    assert trace.messages[1] == {"role": "assistant", "content": [reasoning], "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]}
    assert openai_server.requests[0].messages[1]["content"] == ""
    assert "opaque" not in json.dumps(openai_server.requests[0].body)
    assert rewrites_of(trace, 0)["translated"] == {
        "dialect": "responses", "reasoning_items": 1, "ignored": ["include", "prompt_cache_key", "reasoning", "store"]}


async def test_previous_response_id_is_refused_saying_to_resend_the_history(openai_server, agent_config, tmp_path):
    wire = WIRES[1]
    async with launched(agent_config, tmp_path, wire) as launch:
        answer = await launch.post({"input": "more", "previous_response_id": "resp_1"})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        'previous_response_id = "resp_1": this endpoint keeps no responses (store = false). Send the whole '
        "conversation in input every time, as Codex does with store = false")
    assert openai_server.requests == []


async def test_a_streamed_chat_completion_is_the_chunks_the_sdk_parses(openai_server, agent_config, tmp_path):
    """Chat's stream, sent in one write since the answer is finished, validated chunk by chunk."""
    openai_server.play([tool_call("shell", command="ls")])
    async with launched(agent_config, tmp_path, WIRES[0]) as launch:
        client = openai.AsyncOpenAI(base_url="http://endpoint/v1", api_key=launch.session.secret, max_retries=0,
                                    http_client=httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(
                                        uds=str(launch.endpoint.socket_path))))
        stream = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "go"}], stream=True,
            stream_options={"include_usage": True})
        lines = [line async for line in stream.http_response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(line.removeprefix("data: ")) for line in lines[:-1]]
    assert chunks[1].choices[0].delta.tool_calls[0].function.name == "shell"
    assert chunks[2].choices[0].finish_reason == "tool_calls" and chunks[3].usage.total_tokens == 11


async def test_a_chat_program_cannot_choose_another_apis_native_fields(openai_server, agent_config, tmp_path):
    """``_native`` is set only by a translating dialect (``model.apis``): from a chat program it is
    removed before anything goes upstream, and the removal is recorded."""
    openai_server.play([reply("ok")])
    wire = next(wire for wire in WIRES if wire.name == "chat")
    async with launched(agent_config, tmp_path, wire) as launch:
        answer = await launch.ask([("user", "go")], _native={"api": "chat", "params": {"model": "other"}})
        trace = launch.interaction.trace
    assert answer.status_code == 200
    assert "_native" not in openai_server.requests[0].body
    assert rewrites_of(trace, 0)["translated"] == {"dialect": "chat", "ignored": ["_native"]}
