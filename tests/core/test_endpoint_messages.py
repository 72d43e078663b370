"""The endpoint's Anthropic Messages dialect driven by the ``anthropic`` SDK's own client over the
endpoint's Unix socket, the scripted OpenAI server upstream (real sockets). Every raw body and event
is checked against the SDK's pydantic types: its clients build them without validating."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

import prefect_rollouts as vf
from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint
from prefect_rollouts.harnesses.session import ProgramSession
from prefect_rollouts.model import ModelClient
from prefect_rollouts.rollout_state import RolloutState
from prefect_rollouts.trace import Receipt, SegmentRecord, SendRecord
from tests.core.test_program_harness import KEY
from tests.fakes.openai_server import reply, tool_call

pytestmark = pytest.mark.unit

EVENTS = TypeAdapter(RawMessageStreamEvent)
USER = [{"role": "user", "content": "list the files"}]


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


class Served:
    """An endpoint with one open session on a real rollout state, and clients on its socket."""

    def __init__(self, endpoint: InterceptionEndpoint, session: ProgramSession) -> None:
        self.endpoint, self.session = endpoint, session
        self.trace = session.ctx.trace
        transport = httpx.AsyncHTTPTransport(uds=str(endpoint.socket_path))
        self.http = httpx.AsyncClient(transport=transport, base_url="http://endpoint", timeout=30)
        sdk_http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(endpoint.socket_path)))
        self.sdk = anthropic.AsyncAnthropic(api_key=session.secret, base_url="http://endpoint", max_retries=2,
                                            http_client=sdk_http)

    async def post(self, body: dict[str, Any], path: str = "/v1/messages?beta=true", **headers: str) -> httpx.Response:
        return await self.http.post(path, json=body, headers={"x-api-key": self.session.secret,
                                                              "anthropic-version": "2023-06-01", **headers})


@pytest.fixture
async def served(agent_config) -> AsyncIterator[Callable[..., Any]]:
    """``await served(carried=[...], **agent_fields)``: a ``Served`` whose session samples through the
    agent's model client from the scripted server."""
    opened: list[tuple[InterceptionEndpoint, ModelClient, Served]] = []

    async def make(carried: list[dict[str, Any]] | None = None, **fields: Any) -> Served:
        config = agent_config(**fields)
        endpoint = InterceptionEndpoint()
        await endpoint.start()
        client = ModelClient(config.client)
        trace = vf.Trace(task_id="t", model=config.model)
        trace.segments.append(SegmentRecord(index=0, start=0, end=0, terminated=False, model_calls=0))
        state = RolloutState(config=config, task=vf.Task(vf.TaskData(prompt="p")), client=client, trace=trace,
                             harness=None, scoring=config.scoring)   # type: ignore[arg-type]
        session = ProgramSession(state, "p", None, carried=list(carried or []))
        endpoint.open_session(session)
        made = Served(endpoint, session)
        opened.append((endpoint, client, made))
        return made

    yield make
    for endpoint, client, made in opened:
        await made.http.aclose()
        await made.sdk.close()
        await client.aclose()
        await endpoint.stop()


def events_of(text: str) -> list[Any]:
    """An SSE body as the SDK's event types (each ``event:`` line matching its data's type); a
    ``ping``, which the SDK skips, left out."""
    events = []
    for block in text.strip().split("\n\n"):
        head, data = block.split("\n", 1)
        if head == "event: ping":
            continue
        event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {event.type}"
        events.append(event)
    return events


async def test_a_message_is_answered_and_recorded_as_a_chat_call(served, openai_server):
    openai_server.play([reply("here: a.txt"), reply("raw")])
    s = await served()
    message = await s.sdk.messages.create(model="claude-sonnet-4-5", max_tokens=512, messages=USER,
                                          system=[{"type": "text", "text": "be brief",
                                                   "cache_control": {"type": "ephemeral"}}],
                                          metadata={"user_id": "u"})
    assert message.content[0].text == "here: a.txt" and message.stop_reason == "end_turn"  # type: ignore[union-attr]
    assert message.id.startswith("msg_") and message.usage.output_tokens == s.trace.model_calls[0].completion_tokens
    sent = openai_server.requests[0].body
    assert sent["model"] == "scripted" and sent["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "list the files"}]
    assert s.trace.messages[0]["content"] == [{"type": "text", "text": "be brief",
                                               "cache_control": {"type": "ephemeral"}}]
    assert s.trace.messages[-1] == {"role": "assistant", "content": "here: a.txt"}
    rewrites = s.trace.info["program_rewrites"][0]
    assert rewrites["translated"] == {"dialect": "messages", "cache_control": 1, "ignored": ["metadata"]}
    assert rewrites["imposed"]["model"] == {"program": "claude-sonnet-4-5", "sent": "scripted"}
    raw = await s.post({"model": "m", "max_tokens": 5, "messages": USER})
    Message.model_validate(raw.json())


async def test_a_streamed_tool_round_trip_through_the_sdk(served, openai_server):
    openai_server.play([tool_call("Bash", command="ls"), reply("a.txt is there")])
    s = await served()
    tools = [{"name": "Bash", "description": "run a command",
              "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    async with s.sdk.messages.stream(model="m", max_tokens=256, messages=USER, tools=tools) as stream:
        first = await stream.get_final_message()
    use = first.content[-1]
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"command": "ls"}
    turns = [*USER, {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]}]
    response = await s.post({"model": "m", "max_tokens": 256, "messages": turns, "tools": tools, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text)
    assert [event.type for event in events] == ["message_start", "content_block_start", "content_block_delta",
                                                "content_block_stop", "message_delta", "message_stop"]
    assert events[2].delta.text == "a.txt is there" and events[4].delta.stop_reason == "end_turn"
    upstream = openai_server.requests[1].body["messages"]
    assert [m["role"] for m in upstream] == ["user", "assistant", "tool"]
    assert upstream[1]["tool_calls"][0]["id"] == upstream[2]["tool_call_id"] == use.id
    assert upstream[2]["content"] == "a.txt" and len(s.trace.model_calls) == 2


async def test_create_with_stream_true_yields_the_sdk_events(served, openai_server):
    openai_server.play([reply("streamed")])
    s = await served()
    stream = await s.sdk.messages.create(model="m", max_tokens=64, messages=USER, stream=True)
    kinds = [event.type async for event in stream]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]


async def test_count_tokens_is_an_estimate_and_not_a_model_call(served, openai_server):
    s = await served(max_turns=1)
    counted = await s.sdk.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x" * 400}])
    assert 100 <= counted.input_tokens <= 120
    assert openai_server.requests == [] and s.trace.model_calls == []
    assert s.trace.info["endpoint"]["count_tokens"] == 1 and s.session.calls == 0


async def test_the_stop_refusal_is_an_anthropic_403_that_the_sdk_does_not_retry(served, openai_server):
    """403, not the other dialects' 400: on a 400 Claude Code resends the request 6 times (measured)."""
    openai_server.default = reply("again")
    s = await served(max_turns=1)
    await s.sdk.messages.create(model="m", max_tokens=64, messages=USER)
    with pytest.raises(anthropic.PermissionDeniedError) as raised:
        await s.sdk.messages.create(model="m", max_tokens=64, messages=USER)
    assert raised.value.status_code == 403 and raised.value.body == {
        "type": "error", "error": {"type": "permission_error", "message": "rollout stopped: max_turns"}}
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert len(openai_server.requests) == 1
    assert [(r["status"], r["reason"]) for r in s.trace.info["endpoint"]["refused"]] == [
        (403, "rollout stopped: max_turns")]   # the SDK (max_retries=2) sent it once


async def test_max_turn_tokens_caps_the_request_and_stops_after_a_length_finish(served, openai_server):
    openai_server.play([reply("cut", finish_reason="length")])
    s = await served(max_turn_tokens=16)
    first = await s.sdk.messages.create(model="m", max_tokens=4096, messages=USER,
                                             extra_body={"temperature": 1.0})
    assert first.stop_reason == "max_tokens" and openai_server.requests[0].body["max_tokens"] == 16
    with pytest.raises(anthropic.PermissionDeniedError, match="rollout stopped: max_turn_tokens"):
        await s.sdk.messages.create(model="m", max_tokens=4096, messages=USER)
    assert s.trace.stop_condition == "max_turn_tokens"


async def test_model_and_sampling_are_imposed(served, openai_server):
    openai_server.play([reply("ok")])
    s = await served(sampling=vf.SamplingConfig(temperature=0.2))
    await s.sdk.messages.create(model="claude-opus", max_tokens=64, messages=USER,
                                extra_body={"temperature": 1.0, "top_k": 40})
    sent = openai_server.requests[0].body
    assert (sent["model"], sent["temperature"], sent.get("top_k")) == ("scripted", 0.2, None)
    rewrites = s.trace.info["program_rewrites"][0]
    assert rewrites["imposed"]["temperature"] == {"program": 1.0, "sent": 0.2}
    assert rewrites["translated"]["ignored"] == ["top_k"]


async def test_a_steer_joins_the_next_user_turn_as_a_text_block(served, openai_server):
    openai_server.play([reply("first"), reply("second")])
    s = await served()
    s.session.ctx.steer_inbox.append(SendRecord(message_id="s-1", text="also check b", mode="steer",
                                                receipt=Receipt(accepted=True, message_id="s-1", mode="steer")))
    await s.sdk.messages.create(model="m", max_tokens=64, messages=USER)
    joined = [{"role": "user", "content": [{"type": "text", "text": "list the files"},
                                           {"type": "text", "text": "also check b"}]}]
    assert openai_server.requests[0].body["messages"] == joined
    later = [*USER, {"role": "assistant", "content": "first"}, {"role": "user", "content": "and?"}]
    await s.sdk.messages.create(model="m", max_tokens=64, messages=later)
    assert openai_server.requests[1].body["messages"][0] == joined[0]   # again, at its place
    assert [m["role"] for m in openai_server.requests[1].body["messages"]] == ["user", "assistant", "user"]


async def test_a_later_turn_carries_the_history_ahead_of_the_programs_own(served, openai_server):
    openai_server.play([reply("two")])
    carried = [{"role": "system", "content": "task system"}, {"role": "user", "content": "one"},
               {"role": "assistant", "content": "did one"}]
    s = await served(carried=carried)
    await s.sdk.messages.create(model="m", max_tokens=64, system="claude's own", messages=USER)
    assert openai_server.requests[0].body["messages"] == [*carried, *USER]
    assert s.trace.info["program_rewrites"][0]["dropped_system_messages"] == 1


async def test_a_retried_request_is_answered_from_the_record(served, openai_server):
    openai_server.play([reply("once")])
    s = await served()
    body = {"model": "m", "max_tokens": 64, "messages": USER}
    first = await s.post(body)
    again = await s.post(body, **{"x-stainless-retry-count": "1"})
    assert first.json() == again.json() and len(openai_server.requests) == 1


async def test_the_launch_key_is_taken_in_either_header_and_scrubbed(served, openai_server):
    openai_server.default = reply("ok")
    s = await served()
    leaking = [{"role": "user", "content": f"my key is {s.session.secret}"}]
    bearer = await s.http.post("/v1/messages", json={"max_tokens": 8, "messages": leaking},
                               headers={"Authorization": f"Bearer {s.session.secret}"})
    assert bearer.status_code == 200
    assert s.session.secret not in json.dumps(openai_server.requests[0].body)
    assert s.session.secret not in json.dumps(s.trace.model_dump(mode="json")) and KEY not in json.dumps(
        s.trace.model_dump(mode="json"))
    wrong = await s.http.post("/v1/messages", json={"max_tokens": 8, "messages": USER},
                              headers={"x-api-key": "sk-someone-else"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(("body", "named"), [
    ({"messages": USER}, "max_tokens: required"),
    ({"max_tokens": 8, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     'tools.0 (type "web_search_20250305"'),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages.0.content.0.tool_use_id"),
])
async def test_a_request_that_cannot_be_translated_is_a_400_naming_the_field(served, openai_server, body, named):
    s = await served()
    response = await s.post(body)
    assert response.status_code == 400
    assert response.json()["type"] == "error" and response.json()["error"]["message"].startswith(named)
    assert openai_server.requests == [] and s.trace.info["endpoint"]["refused"][0]["path"] == "/v1/messages"


async def test_thinking_blocks_stay_on_the_trace_and_are_not_sent_upstream(served, openai_server):
    openai_server.play([reply("done")])
    s = await served()
    thinking = {"type": "thinking", "thinking": "ls first", "signature": "c2ln"}
    turns = [*USER, {"role": "assistant", "content": [thinking, {"type": "text", "text": "I will list."}]},
             {"role": "user", "content": "go on"}]
    await s.sdk.messages.create(model="m", max_tokens=64, messages=turns,
                                thinking={"type": "enabled", "budget_tokens": 1024})
    assert openai_server.requests[0].body["messages"][1] == {"role": "assistant", "content": "I will list."}
    assert s.trace.messages[1]["content"][0] == thinking
    assert s.trace.info["program_rewrites"][0]["translated"] == {
        "dialect": "messages", "thinking_blocks": 1, "ignored": ["thinking"]}


async def test_side_requests_are_counted_but_leave_the_conversation_alone(served, openai_server):
    """A probe (max_tokens 1, here cut by it: no max_turn_tokens stop), another model, no tools where
    the main loop offers some: each sampled and counted, none on the trace's conversation."""
    openai_server.play([reply("main answer"), reply("Q", finish_reason="length"), reply("A title"),
                        reply("A summary")])
    s = await served(max_turns=4, max_turn_tokens=64)
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    await s.sdk.messages.create(model="claude-sonnet", max_tokens=64, messages=USER, tools=tools)
    await s.sdk.messages.create(model="claude-sonnet", max_tokens=1, messages=[{"role": "user", "content": "quota"}])
    await s.sdk.messages.create(model="claude-haiku", max_tokens=32, system="Write a title",
                                messages=[{"role": "user", "content": "list the files"}])
    await s.sdk.messages.create(model="claude-sonnet", max_tokens=32, messages=[{"role": "user", "content": "sum"}])
    assert [m["content"] for m in s.trace.messages] == ["list the files", "main answer"]
    assert [(r["kind"], r["model"], r["reply"]) for r in s.trace.info["endpoint"]["side_requests"]] == [
        ("probe", "claude-sonnet", "Q"), ("other_model", "claude-haiku", "A title"),
        ("no_tools", "claude-sonnet", "A summary")]
    assert [r.get("side") for r in s.trace.info["program_rewrites"]] == [None, "probe", "other_model", "no_tools"]
    assert len(s.trace.model_calls) == 4 and s.session.ctx.turns == 4 and s.trace.stop_condition is None
    with pytest.raises(anthropic.PermissionDeniedError, match="rollout stopped: max_turns"):
        await s.sdk.messages.create(model="claude-sonnet", max_tokens=64, messages=USER, tools=tools)


BETA = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"


def claude_code_body(*turns: dict[str, Any]) -> dict[str, Any]:
    """A request shaped as Claude Code 2.1.328's, as captured for issue 33 (a system turn among the
    messages, three system blocks, adaptive thinking, context management, a deferred tool)."""
    return {
        "model": "scripted", "max_tokens": 32000, "stream": True, "metadata": {"user_id": "{}"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "<env>"},
                                                  {"type": "text", "text": "What is 2 + 3?"}]},
                     {"role": "system", "content": [{"type": "text", "text": "<context>",
                                                     "cache_control": {"type": "ephemeral"}}]}, *turns],
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
                   {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
                  {"name": "DeferredToolPlaceholder", "description": "d", "defer_loading": True,
                   "input_schema": {"type": "object"}}],
        "thinking": {"type": "adaptive", "display": "updates"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}


async def test_claude_codes_own_requests_are_served_and_their_extras_recorded(served, openai_server):
    openai_server.play([tool_call("Bash", command="echo 5 > answer.txt"), reply("done")])
    s = await served()
    headers = {"Authorization": f"Bearer {s.session.secret}", "anthropic-beta": BETA, "x-stainless-retry-count": "0"}
    first = await s.post(claude_code_body(), **headers)
    use = next(event.content_block for event in events_of(first.text) if event.type == "content_block_start")
    assert (use.type, use.name) == ("tool_use", "Bash")
    turns = [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": "Bash",
                                                "input": {"command": "echo 5 > answer.txt"}}]},
             {"role": "user", "content": [{"tool_use_id": use.id, "type": "tool_result", "content": "(no output)",
                                           "is_error": False, "cache_control": {"type": "ephemeral"}}]}]
    second = await s.post(claude_code_body(*turns), **headers)
    assert events_of(second.text)[2].delta.text == "done"
    upstream = openai_server.requests[1].body
    assert [m["role"] for m in upstream["messages"]] == ["system", "user", "system", "assistant", "tool"]
    assert upstream["messages"][0]["content"] == ("x-anthropic-billing-header: cc_version=2.1.328;"
                                                  "You are a Claude agent.")
    assert upstream["messages"][4] == {"role": "tool", "tool_call_id": use.id, "content": "(no output)"}
    assert [tool["function"]["name"] for tool in upstream["tools"]] == ["Bash", "DeferredToolPlaceholder"]
    translated = s.trace.info["program_rewrites"][1]["translated"]
    assert translated == {"dialect": "messages", "cache_control": 3, "anthropic-beta": BETA,
                          "ignored": ["context_management", "metadata", "output_config", "thinking",
                                      "tools[].defer_loading"]}
    assert s.trace.messages[-2]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert s.trace.last_reply == "done" and len(s.trace.model_calls) == 2


async def test_a_probe_before_the_first_main_request_leaves_the_segments_input_to_it(served, openai_server):
    """Claude Code's quota probe may come first: the main request's messages are still the segment's input."""
    openai_server.play([reply("Q"), reply("main answer")])
    s = await served()
    await s.sdk.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "quota"}])
    await s.sdk.messages.create(model="m", max_tokens=64, messages=[*USER, {"role": "user", "content": "now"}])
    assert s.session.ctx.segment_inputs == 2 and s.session.main_model == "m"


async def test_the_launch_key_in_a_resent_thinking_block_is_scrubbed_from_the_trace(served, openai_server):
    openai_server.play([reply("done")])
    s = await served()
    thinking = {"type": "thinking", "thinking": f"the key is {s.session.secret}", "signature": "c2ln"}
    turns = [*USER, {"role": "assistant", "content": [thinking, {"type": "text", "text": "ok"}]},
             {"role": "user", "content": "go on"}]
    await s.sdk.messages.create(model="m", max_tokens=64, messages=turns)
    assert s.trace.messages[1]["content"][0] == {**thinking, "thinking": "the key is ***"}
    assert s.session.secret not in json.dumps(s.trace.model_dump(mode="json"))


async def test_a_piece_of_the_launch_key_in_a_recorded_header_never_reaches_the_trace(served, openai_server):
    openai_server.play([reply("done")])
    s = await served()
    secret = s.session.secret
    headers = {"Authorization": f"Bearer {secret}", "anthropic-beta": f"claude-code-20250219,{secret[:30]}"}
    answer = await s.post(claude_code_body(), **headers)
    assert answer.status_code == 200
    [rewrite] = s.trace.info["program_rewrites"]
    assert rewrite["translated"]["anthropic-beta"] == "claude-code-20250219,***"
    assert secret[:16] not in json.dumps(s.trace.model_dump(mode="json"))
