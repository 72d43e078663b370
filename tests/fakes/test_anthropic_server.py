"""Self-tests of the scripted Anthropic server: what it answers is what the ``anthropic`` SDK's own types
read (``Message``, the stream events), over real sockets."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.fakes.anthropic_server import ScriptedAnthropicServer, message, thinking, tool_use
from tests.fakes.openai_server import reply, status, tool_call

pytestmark = pytest.mark.unit

EVENTS = TypeAdapter(RawMessageStreamEvent)
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server():
    with ScriptedAnthropicServer() as srv:
        yield srv


def sdk(server: ScriptedAnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=server.base_url.removesuffix("/v1"), max_retries=0)


def test_replies_and_tool_calls_are_messages_the_sdk_reads(server):
    server.play([reply("three word answer"), tool_call("Bash", command="ls"), reply("cut", finish_reason="length")])
    client = sdk(server)
    first = client.messages.create(model="m", max_tokens=64, messages=USER)
    second = client.messages.create(model="m", max_tokens=64, messages=USER)
    third = client.messages.create(model="m", max_tokens=64, messages=USER)
    assert (first.content[0].text, first.stop_reason, first.usage.input_tokens) == ("three word answer", "end_turn", 10)
    use = second.content[0]
    assert (use.type, use.name, use.input, second.stop_reason) == ("tool_use", "Bash", {"command": "ls"}, "tool_use")
    assert use.id.startswith("toolu_") and third.stop_reason == "max_tokens"
    request = server.requests[0]
    assert request.path == "/v1/messages" and request.body["max_tokens"] == 64
    raw = httpx.post(f"{server.base_url}/messages", json={"model": "m", "max_tokens": 8, "messages": USER})
    assert raw.status_code == 500   # script exhausted
    server.play([reply("x")])
    Message.model_validate(httpx.post(f"{server.base_url}/messages", json={"messages": USER}).json())


def test_a_thinking_message_streams_as_the_sdks_events_with_its_signature(server):
    blocks = (thinking("ls first", "c2lnbmF0dXJl"), {"type": "redacted_thinking", "data": "ZW5j"},
              {"type": "text", "text": "Listing."}, tool_use("Bash", "toolu_01A", command="ls"))
    server.play([message(*blocks), message(*blocks)])
    client = sdk(server)
    with client.messages.stream(model="m", max_tokens=64, messages=USER) as stream:
        final = stream.get_final_message()
    assert [block.model_dump(exclude_none=True) for block in final.content] == list(blocks)
    assert final.content[0].signature == "c2lnbmF0dXJl" and final.content[3].input == {"command": "ls"}
    raw = httpx.post(f"{server.base_url}/messages", json={"messages": USER, "stream": True})
    chunks = [block.split("\n", 1) for block in raw.text.strip().split("\n\n")]
    for head, data in chunks:
        if head == "event: ping":   # not among the SDK's event types: it skips pings
            continue
        event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {event.type}"
    assert [head for head, _ in chunks][:2] == ["event: message_start", "event: ping"]


def test_a_status_step_has_anthropics_error_shape_and_the_sdk_reads_it(server):
    server.play([status(529), status(429, headers={"retry-after": "0"})])
    client = sdk(server)
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        client.messages.create(model="m", max_tokens=8, messages=USER)
    assert overloaded.value.status_code == 529 and overloaded.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="m", max_tokens=8, messages=USER)
