"""ModelClient speaking Anthropic Messages (``api = "messages"``) to the scripted Anthropic server over
real sockets: the request built from the trace's messages, auth, the parsed reply (thinking kept, usage
normalised, stop reasons mapped), errors and rate-limit headers, and a recorded event stream."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from pydantic import TypeAdapter

import prefect_rollouts as vf
from prefect_rollouts.model import ModelClient
from prefect_rollouts.model.apis import NATIVE_KEY, wire_api
from prefect_rollouts.model.apis.messages import DEFAULT_MAX_TOKENS
from tests.fakes.anthropic_server import events, message, thinking, tool_use
from tests.fakes.openai_server import reply, status, tool_call

pytestmark = pytest.mark.unit

KEY = "sk-ant-test-Qz8vKx3Lw7Rj2Tn5"
THINKING = thinking("the user wants files; ls", "RXVzaWduYXR1cmU=")
REDACTED = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}
CACHED = {"type": "ephemeral"}

#: A trace's conversation after one tool round trip with thinking, as the tools harness keeps it.
CONVERSATION = [
    {"role": "system", "content": [{"type": "text", "text": "You are terse.", "cache_control": CACHED}]},
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": [THINKING, REDACTED, {"type": "text", "text": "Listing."}],
     "tool_calls": [{"id": "toolu_01A", "type": "function", "function": {"name": "bash", "arguments": '{"c": "ls"}'}},
                    {"id": "toolu_01B", "type": "function", "function": {"name": "bash", "arguments": ""}}]},
    {"role": "tool", "tool_call_id": "toolu_01A", "content": "a.txt"},
    {"role": "tool", "tool_call_id": "toolu_01B", "content": "b.txt"},
    {"role": "user", "content": "and now?"},
]
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {
    "type": "object", "properties": {"c": {"type": "string"}}}}}]


@pytest.fixture
async def client(anthropic_server, monkeypatch):
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", KEY)
    made = ModelClient(vf.ClientConfig(base_url=anthropic_server.base_url, api="messages", timeout=5,
                                       api_key_env="TEST_ANTHROPIC_KEY",
                                       retries=vf.RetryConfig(max_retries=2, backoff_s=0.01, max_backoff_s=2)))
    yield made
    await made.aclose()


async def test_the_request_is_a_messages_body_with_thinking_tool_ids_and_cache_marks_in_place(client, anthropic_server):
    anthropic_server.play([reply("ok")])
    await client.complete({"model": "claude-x", "messages": CONVERSATION, "tools": TOOLS, "tool_choice": "required",
                           "parallel_tool_calls": False, "temperature": 0.5, "stop": "END", "seed": 7})
    sent = anthropic_server.requests[0]
    assert sent.path == "/v1/messages"
    assert (sent.headers["x-api-key"], sent.headers["anthropic-version"]) == (KEY, "2023-06-01")
    assert "authorization" not in sent.headers
    assert sent.body == {
        "model": "claude-x", "max_tokens": DEFAULT_MAX_TOKENS, "temperature": 0.5, "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "You are terse.", "cache_control": CACHED}],
        "messages": [
            {"role": "user", "content": "list the files"},
            {"role": "assistant", "content": [
                THINKING, REDACTED, {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_01A", "name": "bash", "input": {"c": "ls"}},
                {"type": "tool_use", "id": "toolu_01B", "name": "bash", "input": {}}]},
            {"role": "user", "content": [   # the results first, then the text: one turn, strict alternation
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "a.txt"},
                {"type": "tool_result", "tool_use_id": "toolu_01B", "content": "b.txt"},
                {"type": "text", "text": "and now?"}]}],
        "tools": [{"name": "bash", "description": "run", "input_schema": TOOLS[0]["function"]["parameters"]}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}   # seed: Messages has none
    TypeAdapter(MessageCreateParamsNonStreaming).validate_python(sent.body)   # the SDK's own request type
    assert CONVERSATION[2]["content"][0] == THINKING   # the trace's messages are not touched


async def test_a_thinking_reply_keeps_its_blocks_and_tool_ids_and_usage_counts_the_cache(client, anthropic_server):
    usage = {"input_tokens": 100, "output_tokens": 40, "cache_read_input_tokens": 800,
             "cache_creation_input_tokens": 50}
    anthropic_server.play([message(THINKING, {"type": "text", "text": "Listing."},
                                   tool_use("bash", "toolu_01Z", c="ls"), usage=usage)])
    completion = await client.complete({"model": "m", "messages": CONVERSATION[1:2]})
    assert completion.message == {"role": "assistant", "content": [THINKING, {"type": "text", "text": "Listing."}],
                                  "tool_calls": [{"id": "toolu_01Z", "type": "function",
                                                  "function": {"name": "bash", "arguments": '{"c": "ls"}'}}]}
    assert completion.finish_reason == "tool_calls"
    assert (completion.prompt_tokens, completion.cached_tokens, completion.cache_write_tokens,
            completion.completion_tokens, completion.reasoning_tokens) == (950, 800, 50, 40, None)


@pytest.mark.parametrize(("stop", "finish"), [("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
                                              ("refusal", "content_filter"), ("tool_use", "tool_calls")])
async def test_stop_reasons_map_to_chat_finish_reasons(client, anthropic_server, stop, finish):
    anthropic_server.play([message({"type": "text", "text": "x", "citations": None}, stop_reason=stop)])
    completion = await client.complete({"model": "m", "messages": CONVERSATION[1:2], "max_tokens": 8})
    assert completion.finish_reason == finish and completion.message["content"] == "x"
    assert anthropic_server.requests[0].body["max_tokens"] == 8


async def test_native_params_pass_but_never_over_the_imposed_fields(client, anthropic_server):
    anthropic_server.play([reply("ok")])
    native = {"api": "messages", "headers": {"anthropic-beta": "interleaved-thinking-2025-05-14"},
              "params": {"thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"},
                         "model": "theirs", "max_tokens": 99_999, "temperature": 2}}
    await client.complete({"model": "ours", "max_tokens": 64, "temperature": 1, "messages": CONVERSATION[1:2],
                           NATIVE_KEY: native})
    sent = anthropic_server.requests[0]
    assert sent.body == {"model": "ours", "max_tokens": 64, "temperature": 1, "messages": [CONVERSATION[1]],
                         "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"}}
    assert sent.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


async def test_another_apis_native_fields_are_left_out(client, anthropic_server):
    anthropic_server.play([reply("ok")])
    await client.complete({"model": "m", "messages": CONVERSATION[1:2],
                           NATIVE_KEY: {"api": "responses", "params": {"include": ["reasoning.encrypted_content"]}}})
    assert set(anthropic_server.requests[0].body) == {"model", "messages", "max_tokens"}


async def test_overloaded_529_is_retried_and_its_error_body_kept_scrubbed(client, anthropic_server):
    body = {"type": "error", "error": {"type": "overloaded_error", "message": f"busy; your key {KEY}"}}
    anthropic_server.play([status(529, body), reply("ok")])
    completion = await client.complete({"model": "m", "messages": CONVERSATION[1:2]})
    assert completion.retries == 1 and completion.attempts[0]["status_code"] == 529
    assert "overloaded_error" in completion.attempts[0]["error"] and KEY not in completion.attempts[0]["error"]


async def test_a_usage_field_echoing_the_key_is_noted_scrubbed_never_a_prefix(client, anthropic_server):
    from prefect_rollouts.errors import register_secret
    from prefect_rollouts.model.completion import count
    from tests.fakes.openai_server import secret_fragments

    anthropic_server.play([message({"type": "text", "text": "hi"}, usage={"input_tokens": KEY, "output_tokens": -5})])
    completion = await client.complete({"model": "m", "messages": CONVERSATION[1:2]})
    assert (completion.prompt_tokens, completion.completion_tokens) == (0, 0)
    assert completion.usage_note.startswith("usage.input_tokens = ***: not a whole number")
    assert "usage.output_tokens = -5" in completion.usage_note
    longer = "sk-ant-api03-" + "Vq7Lm2Xr9Kt4Wn8Bz3Hs6Jd1Fp5Gc0Ye" * 3   # past the 40 characters a note keeps
    register_secret(longer)
    notes: list[str] = []
    assert count(longer, "usage.input_tokens", notes) is None
    assert notes == ["usage.input_tokens = ***: not a whole number from 0 to 1,000,000,000, counted as 0"]
    assert secret_fragments(notes[0], longer, 6) == []


async def test_an_authentication_error_is_not_retried(client, anthropic_server):
    anthropic_server.play([status(401), reply("never")])
    with pytest.raises(vf.ProviderError) as failed:
        await client.complete({"model": "m", "messages": CONVERSATION[1:2]})
    assert failed.value.status_code == 401 and "authentication_error" in str(failed.value)
    assert len(anthropic_server.requests) == 1


async def test_a_rate_limit_waits_for_the_reset_of_the_exhausted_limit(client, anthropic_server):
    reset = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.6)).isoformat().replace("+00:00", "Z")
    headers = {"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": reset,
               "anthropic-ratelimit-requests-remaining": "40",
               "anthropic-ratelimit-requests-reset": "2099-01-01T00:00:00Z"}
    anthropic_server.play([status(429, headers=headers), reply("ok")])
    started = time.monotonic()
    completion = await client.complete({"model": "m", "messages": CONVERSATION[1:2]})
    assert completion.retries == 1 and time.monotonic() - started >= 0.3


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5), ({"retry-after": "3"}, 3.0),
    ({"anthropic-ratelimit-requests-remaining": "5", "anthropic-ratelimit-requests-reset": "2099-01-01T00:00:00Z"},
     None), ({}, None)])
def test_retry_after_reads_what_the_anthropic_sdk_honours(headers, seconds):
    assert wire_api("messages").retry_after(headers) == seconds


def test_a_stream_nested_past_the_depth_bound_is_a_malformed_body_not_a_recursion_error():
    """An event, or a tool's streamed input, nested deeper than ``MAX_JSON_DEPTH``: a ``ValueError`` the
    client reports as a 502 (json.loads raised RecursionError past ~1,000 levels, which the client let out,
    and took 400 levels that pydantic cannot write into the trace's row)."""
    start = json.dumps({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                             "content": [], "usage": {"input_tokens": 1}}})
    block = json.dumps({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}})
    deep = '{"a":' * 400 + "1" + "}" * 400
    delta = json.dumps({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": deep}})
    api = wire_api("messages")
    with pytest.raises(ValueError, match="an event nests deeper than 128 levels"):
        api.parse_events([("message_start", "[" * 100_000)], 0, 200)
    with pytest.raises(ValueError, match=r"content\.0\.input nests deeper than 128 levels"):
        api.parse_events([("message_start", start), ("content_block_start", block), ("content_block_delta", delta)],
                         0, 200)


def test_a_recorded_stream_parses_as_the_same_message():
    """``parse_events`` on the events the scripted server streams for a thinking reply with a tool call:
    the thinking (its ``thinking_delta`` and ``signature_delta`` joined), the tool call and the usage of
    ``message_delta``."""
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
            "stop_sequence": None, "content": [THINKING, REDACTED, {"type": "text", "text": "Listing."},
                                               tool_use("bash", "toolu_01Z", c="ls")],
            "usage": {"input_tokens": 12, "output_tokens": 30, "cache_read_input_tokens": 4,
                      "cache_creation_input_tokens": 0}}
    recorded = [tuple(block.split("\n", 1)) for block in "".join(events(body)).strip().split("\n\n")]
    pairs = [(head.removeprefix("event: "), data.removeprefix("data: ")) for head, data in recorded]
    api = wire_api("messages")
    streamed, whole = api.parse_events(pairs, 0, 200), api.parse(json.loads(json.dumps(body)), 0, 200)
    assert streamed.message == whole.message and streamed.message["content"][0] == THINKING
    assert (streamed.finish_reason, streamed.prompt_tokens, streamed.completion_tokens) == ("tool_calls", 16, 30)
    with pytest.raises(ValueError, match="overloaded_error"):
        api.parse_events([*pairs[:3], ("error", json.dumps({"type": "error", "error": {
            "type": "overloaded_error", "message": "Overloaded"}}))], 0, 200)


async def test_a_tool_call_reply_from_the_openai_steps_reads_as_a_chat_tool_call(client, anthropic_server):
    anthropic_server.play([tool_call("bash", c="ls")])
    completion = await client.complete({"model": "m", "messages": CONVERSATION[1:2]})
    call, = completion.message["tool_calls"]
    assert call["id"].startswith("toolu_") and call["function"] == {"name": "bash", "arguments": '{"c": "ls"}'}
    assert completion.message["content"] == ""
