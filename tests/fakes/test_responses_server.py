"""Self-tests of the scripted server's Responses route: its bodies and stream events are what the OpenAI
SDK's own types (``openai.types.responses``) accept, over real sockets."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.fakes.openai_server import ScriptedOpenAIServer, reply, tool_call
from tests.fakes.responses_server import function_call, message, output, reasoning, usage_of

pytestmark = pytest.mark.unit

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
ASK = {"model": "gpt-test", "input": [{"role": "user", "content": "hi"}], "store": False}


@pytest.fixture
def server():
    with ScriptedOpenAIServer() as srv:
        yield srv


def test_a_reply_and_a_tool_call_are_response_objects_the_sdk_validates(server):
    server.play([reply("hello"), tool_call("shell", cmd="ls"), reply("cut", finish_reason="length")])
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        bodies = [client.post("/responses", json=ASK).json() for _ in range(3)]
    text, call, cut = (Response.model_validate(body) for body in bodies)
    assert text.output_text == "hello" and text.status == "completed"
    assert (call.output[0].type, call.output[0].name, json.loads(call.output[0].arguments)) == (
        "function_call", "shell", {"cmd": "ls"})
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert text.usage.input_tokens == 10 and server.requests[0].path == "/v1/responses"


def test_a_stream_is_events_the_sdk_validates_ending_with_the_whole_response(server):
    items = (reasoning("plan", "gAAAA-x"), message("ok"), function_call("shell", {"cmd": "ls"}))
    server.play([output(*items, usage=usage_of(100, 20, cached=64, reasoning_tokens=12))])
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        answer = client.post("/responses", json={**ASK, "stream": True})
    assert answer.headers["content-type"] == "text/event-stream"
    blocks = [block for block in answer.text.split("\n\n") if block]
    parsed = [EVENTS.validate_json(block.split("data: ", 1)[1]) for block in blocks]
    assert [event.type for event in parsed][:2] == ["response.created", "response.in_progress"]
    assert parsed[-1].type == "response.completed"
    final = parsed[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].encrypted_content == "gAAAA-x" and final.usage.input_tokens_details.cached_tokens == 64
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))


async def test_the_sdks_stream_reader_assembles_the_final_response(server):
    server.play([output(message("done"), incomplete="max_output_tokens")])
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    async with client.responses.stream(model="gpt-test", input="hi") as stream:
        kinds = [event.type async for event in stream]
    assert kinds[-1] == "response.incomplete" and "response.output_text.delta" in kinds
    await client.close()
