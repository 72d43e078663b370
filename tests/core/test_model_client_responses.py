"""The model client over OpenAI Responses (``api = "responses"``) against the scripted server's Responses
route (real sockets): the request built from the chat form, the parse (reasoning items kept as typed parts,
usage, finish reasons), streaming, auth, OpenAI's rate-limit headers."""

from __future__ import annotations

import json

import pytest

import prefect_rollouts as vf
from prefect_rollouts.model import ModelClient
from prefect_rollouts.model.apis import NATIVE_KEY
from prefect_rollouts.model.apis.responses import API, duration_s, openai_retry_after
from tests.fakes.openai_server import reply, status, tool_call
from tests.fakes.responses_server import function_call, message, output, reasoning, usage_of

pytestmark = pytest.mark.unit

KEY = "sk-test-responses-key"
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look first"}],
             "encrypted_content": "gAAAAB-opaque-1"}
TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run a command", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}]
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "list"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
    {"role": "assistant", "content": [REASONING], "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
]


@pytest.fixture
async def client(openai_server, monkeypatch):
    monkeypatch.setenv("TEST_RESPONSES_KEY", KEY)
    clients = []

    def make(**fields):
        fields.setdefault("api", "responses")
        config = vf.ClientConfig(base_url=openai_server.base_url, api_key_env="TEST_RESPONSES_KEY", timeout=5,
                                 retries=vf.RetryConfig(max_retries=2, backoff_s=0.01, max_backoff_s=0.05), **fields)
        clients.append(ModelClient(config))
        return clients[-1]
    yield make
    for made in clients:
        await made.aclose()


async def test_the_chat_form_goes_as_responses_items_with_bearer_auth(openai_server, client):
    openai_server.play([reply("a.txt is there")])
    body = {"model": "gpt-test", "messages": CONVERSATION, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 64,
            "temperature": 0.2}
    completion = await client().complete(body)
    sent = openai_server.requests[0]
    assert sent.path == "/v1/responses" and sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body == {
        "store": False, "model": "gpt-test", "temperature": 0.2, "max_output_tokens": 64, "tool_choice": "auto",
        "input": [
            {"type": "message", "role": "system", "content": "be brief"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "list"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
            REASONING,
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}],
        "tools": [{"type": "function", "name": "shell", "description": "run a command",
                   "parameters": TOOLS[0]["function"]["parameters"], "strict": False}]}
    item_id = completion.message.get("responses_item", {}).get("id", "")   # the session's server numbers its items
    assert item_id.startswith("msg_") and completion.message == {
        "role": "assistant", "content": "a.txt is there", "responses_item": {"id": item_id, "status": "completed"}}
    assert body["messages"] is CONVERSATION and CONVERSATION[2]["content"] == [REASONING]   # not mutated


async def test_reasoning_items_are_kept_as_typed_parts_with_usage_from_responses_fields(openai_server, client):
    items = (reasoning("plan", "gAAAA-kept", "rs_9"), message("checking"), function_call("shell", {"cmd": "ls"}))
    openai_server.play([output(*items, usage=usage_of(1200, 80, cached=1024, reasoning_tokens=48, cache_write=100))])
    completion = await client().complete({"model": "m", "messages": [{"role": "user", "content": "go"}]})
    assert completion.message == {
        "role": "assistant", "content": [items[0], {"type": "text", "text": "checking"}],
        "responses_item": {"id": "msg_0", "status": "completed"},
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'},
                        "responses_item": {"id": "fc_0", "status": "completed"}}]}
    assert (completion.finish_reason, completion.prompt_tokens, completion.completion_tokens) == (
        "tool_calls", 1200, 80)
    assert (completion.cached_tokens, completion.reasoning_tokens, completion.cache_write_tokens) == (1024, 48, 100)


def test_an_items_id_and_status_go_back_as_they_came():
    reply_message = {"role": "assistant", "content": "ok", "responses_item": {"id": "msg_7", "status": "completed"},
                     "tool_calls": [{"id": "call_7", "type": "function", "function": {"name": "f", "arguments": "{}"},
                                     "responses_item": {"id": "fc_7", "status": "completed"}}]}
    sent = API.request({"model": "m", "messages": [{"role": "user", "content": "go"}, reply_message]})
    assert sent["input"][1:] == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}], "id": "msg_7",
         "status": "completed"},
        {"type": "function_call", "call_id": "call_7", "name": "f", "arguments": "{}", "id": "fc_7",
         "status": "completed"}]


async def test_an_incomplete_response_is_a_length_finish(openai_server, client):
    openai_server.play([reply("cut", finish_reason="length")])
    completion = await client().complete({"model": "m", "messages": [{"role": "user", "content": "go"}]})
    assert (completion.finish_reason, completion.message["content"]) == ("length", "cut")


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_streamed_response_parses_as_the_plain_one(openai_server, client, api):
    openai_server.play([tool_call("shell", cmd="ls"), tool_call("shell", cmd="ls"),
                        reply("two words"), reply("two words")])
    plain, streamed = client(api=api), client(api=api, stream=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    answers = [await made.complete(body) for made in (plain, streamed, plain, streamed)]
    assert [request.body.get("stream") for request in openai_server.requests] == [None, True, None, True]
    if api == "chat":
        assert openai_server.requests[1].body["stream_options"] == {"include_usage": True}
    for one, other in (answers[:2], answers[2:]):
        for said in (one.message, other.message):   # each request gets new ids
            said.pop("responses_item", None)
            said["tool_calls"] = [{"id": "x", "function": call["function"]} for call in said.get("tool_calls", [])] \
                or None
        assert (one.message, one.finish_reason, one.prompt_tokens, one.completion_tokens) == (
            other.message, other.finish_reason, other.prompt_tokens, other.completion_tokens)
    assert answers[1].message["tool_calls"][0]["function"] == {"name": "shell", "arguments": '{"cmd": "ls"}'}
    assert answers[3].message["content"] == "two words" and answers[3].prompt_tokens == 10


async def test_a_failed_stream_is_a_502_retried(openai_server, client):
    failed = {"type": "response.failed", "sequence_number": 0, "response": {
        "status": "failed", "output": [], "error": {"code": "server_error", "message": "boom"}}}
    openai_server.play([lambda request: status(200, f"event: response.failed\ndata: {json.dumps(failed)}\n\n",
                                               {"Content-Type": "text/event-stream"}), reply("ok")])
    completion = await client(stream=True).complete({"model": "m", "messages": [{"role": "user", "content": "go"}]})
    assert completion.message["content"] == "ok" and completion.retries == 1
    assert completion.attempts[0]["status_code"] == 502 and "server_error: boom" in completion.attempts[0]["error"]


async def test_a_429_with_retry_after_ms_is_retried_and_a_400_is_not(openai_server, client):
    error = {"error": {"message": "Rate limit reached", "type": "requests", "param": None,
                       "code": "rate_limit_exceeded"}}
    openai_server.play([status(429, error, {"retry-after-ms": "10"}), reply("ok"), status(400)])
    made = client()
    assert (await made.complete({"model": "m", "messages": [{"role": "user", "content": "go"}]})).retries == 1
    with pytest.raises(vf.ProviderError) as caught:
        await made.complete({"model": "m", "messages": [{"role": "user", "content": "go"}]})
    assert caught.value.status_code == 400 and len(openai_server.requests) == 3
    assert "Rate limit reached" in str((await _first_attempt(openai_server, made))["error"])


async def _first_attempt(openai_server, made):
    openai_server.play([status(429, {"error": {"message": "Rate limit reached"}}, {"retry-after-ms": "1"}),
                        reply("ok")])
    return (await made.complete({"model": "m", "messages": [{"role": "user", "content": "go"}]})).attempts[0]


def test_openais_rate_limit_headers_give_the_wait():
    assert openai_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert openai_retry_after({"retry-after": "2"}) == 2.0
    assert openai_retry_after({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s",
                               "x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "1s"}) == 360.0
    assert openai_retry_after({"x-ratelimit-remaining-tokens": "12", "x-ratelimit-reset-tokens": "1s"}) is None
    assert [duration_s(value) for value in ("1.5s", "20ms", "1h2m", "6m0s", "soon", "", None)] == [
        1.5, 0.02, 3720.0, 360.0, None, None, None]


def test_native_params_go_as_they_came_under_the_imposed_fields():
    native = {"api": "responses", "instructions": True, "params": {
        "store": True, "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "high"},
        "model": "theirs", "temperature": 1.5, "max_output_tokens": 99999,
        "tools": [{"type": "custom", "name": "apply_patch"}]}}
    body = {"model": "ours", "temperature": 0.1, "max_tokens": 16, "tools": TOOLS, NATIVE_KEY: native,
            "messages": [{"role": "system", "content": "rules"}, {"role": "user", "content": "go"}]}
    sent = API.request(body)
    assert sent == {"store": True, "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "high"},
                    "tools": [{"type": "custom", "name": "apply_patch"}], "model": "ours", "temperature": 0.1,
                    "max_output_tokens": 16, "instructions": "rules",
                    "input": [{"type": "message", "role": "user", "content": "go"}]}


def test_a_reasoning_item_without_encrypted_content_is_not_resent_unless_stored():
    bare = {"type": "reasoning", "id": "rs_2", "summary": []}
    body = {"model": "m", "messages": [{"role": "user", "content": "go"},
                                       {"role": "assistant", "content": [bare, {"type": "text", "text": "ok"}]}]}
    assert API.request(body)["input"][1:] == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}]
    stored = API.request({**body, NATIVE_KEY: {"api": "responses", "params": {"store": True}}})
    assert stored["input"][1] == bare


def test_chat_only_keys_are_not_sent_and_named():
    body = {"model": "m", "seed": 1, "stop": ["x"], "messages": [{"role": "user", "content": "go"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}},
            "reasoning_effort": "low", "verbosity": "high"}
    sent = API.request(body)
    assert "seed" not in sent and "stop" not in sent and API.unsent_keys(body) == ["seed", "stop"]
    assert sent["text"] == {"format": {"type": "json_schema", "name": "n", "schema": {}}, "verbosity": "high"}
    assert sent["reasoning"] == {"effort": "low"} and "verbosity" not in sent and "reasoning_effort" not in sent


async def test_a_stream_request_answered_with_an_error_or_plain_json_is_handled_as_a_plain_one(openai_server, client):
    plain = {"id": "resp_p", "object": "response", "created_at": 1, "status": "completed", "model": "m",
             "output": [message("plain")], "usage": usage_of(7, 1)}
    openai_server.play([status(503, {"error": {"message": "overloaded"}}), status(200, plain)])
    completion = await client(stream=True).complete({"model": "m", "messages": [{"role": "user", "content": "go"}]})
    assert (completion.message["content"], completion.prompt_tokens, completion.retries) == ("plain", 7, 1)
    assert completion.attempts[0]["status_code"] == 503 and "overloaded" in completion.attempts[0]["error"]
