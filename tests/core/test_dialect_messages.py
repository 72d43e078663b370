"""The Anthropic Messages translation alone: a request to the chat-completions form and back, the
answer and its events checked against the ``anthropic`` SDK's own types."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from prefect_rollouts.harnesses.dialects.messages import MessagesDialect, count_tokens, tool_id

pytestmark = pytest.mark.unit

DIALECT = MessagesDialect()
EVENTS = TypeAdapter(RawMessageStreamEvent)

CLAUDE_CODE_LIKE = {
    "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True, "temperature": 1, "top_k": 5,
    "metadata": {"user_id": "u"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "Be brief."}],
    "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "stop_sequences": ["\n\nHuman:"],
    "messages": [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "ls will do", "signature": "sig=="},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"_raw": "{broken"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "bad"}, {"type": "image", "source": {
                 "type": "base64", "media_type": "image/png", "data": "iVBO"}}]},
            {"type": "text", "text": "<system-reminder>go on</system-reminder>",
             "cache_control": {"type": "ephemeral"}}]},
    ],
}


def test_a_claude_code_request_becomes_chat_with_its_losses_reported():
    chat, lost = DIALECT.to_chat(CLAUDE_CODE_LIKE)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
    system, _, assistant, first, second, after = chat["messages"]
    assert system["content"][0] == {"type": "text", "text": "You are Claude Code.",
                                    "cache_control": {"type": "ephemeral"}}
    assert assistant["content"][0] == {"type": "thinking", "thinking": "ls will do", "signature": "sig=="}
    assert assistant["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}},
        {"id": "toolu_2", "type": "function", "function": {"name": "Bash", "arguments": "{broken"}}]
    assert (first["tool_call_id"], first["content"], second["content"]) == ("toolu_1", "a.txt", "bad")
    assert after["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "text", "text": "<system-reminder>go on</system-reminder>", "cache_control": {"type": "ephemeral"}}]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "Bash", "parameters": {"type": "object", "properties": {}}, "description": "run"}}]
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["stop"]) == ("auto", False, ["\n\nHuman:"])
    assert (chat["model"], chat["max_tokens"], chat["temperature"]) == ("claude-sonnet-4-5", 32000, 1)
    assert "stream" not in chat and "top_k" not in chat
    assert lost == {"cache_control": 2, "thinking_blocks": 1, "tool_result_images_moved": 1,
                    "tool_result_is_error": 1, "ignored": ["metadata", "thinking", "top_k"]}


@pytest.mark.parametrize(("choice", "chat"), [
    ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}})])
def test_tool_choice_maps_to_chat(choice, chat):
    body = {**CLAUDE_CODE_LIKE, "tool_choice": choice}
    assert DIALECT.to_chat(body)[0]["tool_choice"] == chat


@pytest.mark.parametrize(("change", "named"), [
    ({"max_tokens": None}, "max_tokens: required"),
    ({"max_tokens": 0}, "max_tokens = 0: must be an integer of at least 1"),
    ({"messages": []}, "messages: required"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages.0.content.0.tool_use_id"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]},
     'tools.0 (type "web_search_20250305", name "web_search"): a server tool'),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice = "),
    ({"mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers: this endpoint connects no MCP servers"),
    ({"stop_sequences": "END"}, "stop_sequences: must be a list of strings"),
])
def test_a_request_it_cannot_translate_is_refused_naming_the_field(change, named):
    body = {key: value for key, value in {**CLAUDE_CODE_LIKE, **change}.items() if value is not None}
    with pytest.raises(ValueError) as raised:
        DIALECT.to_chat(body)
    assert str(raised.value).startswith(named), str(raised.value)


def test_empty_mcp_servers_and_unknown_keys_are_accepted_and_recorded():
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "mcp_servers": [],
            "context_management": {"edits": []}, "service_tier": "auto"}
    chat, lost = DIALECT.to_chat(body)
    assert chat == {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert lost == {"ignored": ["context_management", "mcp_servers", "service_tier"]}


def parse(stream):
    """The SSE blocks as the SDK's event types; a ``ping`` (which the SDK skips) left out."""
    events = []
    for block in stream:
        head, data = block.split("\ndata: ", 1)
        assert block.endswith("\n\n") and head.startswith("event: ")
        if head != "event: ping":
            event = EVENTS.validate_python(json.loads(data))
            assert head == f"event: {event.type}"
            events.append(event)
    return events


def completion(message, finish="stop", cached=None):
    usage = {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "chatcmpl-abc-1", "object": "chat.completion", "created": 1, "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}


@pytest.mark.parametrize("arguments", ["", "  ", None])
def test_a_tool_call_without_arguments_is_an_empty_input(arguments):
    done = completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "Bash", "arguments": arguments}}]}, "tool_calls")
    assert DIALECT.from_chat(done, CLAUDE_CODE_LIKE)["content"][0]["input"] == {}   # was {"_raw": ""}


@pytest.mark.parametrize("arguments", ['{"a": NaN}', '{"a": Infinity}', '{"a": 1e999}', '{"a": "\\ud800"}',
                                       '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_tool_arguments_the_answer_cannot_carry_as_json_are_kept_raw(arguments):
    done = completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "Bash", "arguments": arguments}}]}, "tool_calls")
    answer = DIALECT.from_chat(done, CLAUDE_CODE_LIKE)
    assert answer["content"][0]["input"] == {"_raw": arguments}
    json.dumps(answer, ensure_ascii=False, allow_nan=False).encode("utf-8")   # writable: was a 500
    assert "".join(DIALECT.events(answer, {**CLAUDE_CODE_LIKE, "stream": True}))


def test_a_tool_call_answer_is_a_message_the_sdk_reads_and_streams_the_same():
    done = completion({"role": "assistant", "content": "Running.", "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}},
        {"id": "call 8!", "type": "function", "function": {"name": "Bash", "arguments": "not json"}}]},
        "tool_calls", cached=100)
    answer = DIALECT.from_chat(done, CLAUDE_CODE_LIKE)
    message = Message.model_validate(answer)
    assert message.id == "msg_abc-1" and message.stop_reason == "tool_use" and message.model == "scripted"
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    assert answer["content"][1] == {"type": "tool_use", "id": "call_7", "name": "Bash", "input": {"command": "ls"}}
    assert answer["content"][2]["id"] == tool_id("call 8!") and answer["content"][2]["id"].startswith("toolu_")
    assert answer["content"][2]["input"] == {"_raw": "not json"}
    assert answer["usage"] == {"input_tokens": 20, "output_tokens": 7, "cache_read_input_tokens": 100,
                               "cache_creation_input_tokens": 0}
    events = parse(DIALECT.events(answer, CLAUDE_CODE_LIKE))
    assert [event.type for event in events] == [
        "message_start", *["content_block_start", "content_block_delta", "content_block_stop"] * 3,
        "message_delta", "message_stop"]
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens == 7
    resent = DIALECT.to_chat({"max_tokens": 9, "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": answer["content"]}]})[0]
    assert resent["messages"][1]["tool_calls"][1]["function"]["arguments"] == "not json"


@pytest.mark.parametrize(("finish", "reason"), [("stop", "end_turn"), ("length", "max_tokens"),
                                                 ("content_filter", "refusal")])
def test_finish_reasons_map_to_stop_reasons(finish, reason):
    answer = DIALECT.from_chat(completion({"role": "assistant", "content": "x"}, finish), {})
    assert Message.model_validate(answer).stop_reason == reason


def test_the_key_comes_from_x_api_key_or_a_bearer_token():
    assert DIALECT.key({"x-api-key": "sk-1"}) == "sk-1"
    assert DIALECT.key({"authorization": "Bearer sk-2"}) == "sk-2"
    assert DIALECT.key({"authorization": "Basic sk-2"}) is None


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"),
                                               (404, "not_found_error"), (413, "request_too_large"),
                                               (429, "rate_limit_error"), (502, "api_error"),
                                               (529, "overloaded_error")])
def test_errors_take_anthropics_shape_and_type(status, kind):
    assert DIALECT.error(status, "no") == {"type": "error", "error": {"type": kind, "message": "no"}}


def test_count_tokens_estimates_characters_over_four_and_images_apart():
    text = {"messages": [{"role": "user", "content": "x" * 400}]}
    with_image = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x" * 400},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 100_000}}]}]}
    assert 100 < count_tokens(text) < 120
    assert count_tokens(with_image) - count_tokens(text) < 1600 + 20


def test_a_long_beta_header_is_kept_to_500_characters_between_its_names():
    """``anthropic-beta`` goes upstream as recorded: cut at 500 characters, a name cut in two would be a
    400 there, so the cut falls between names."""
    names = [f"feature-number-{index:03d}-2025-01-01" for index in range(30)]   # 29 characters each
    kept = DIALECT.recorded({"anthropic-beta": ",".join(names)}, "sk-launch-key-0123456789")["anthropic-beta"]
    assert kept == ",".join(names[:16]) and len(kept) == 16 * 30 - 1
    secret = "sk-launch-key-0123456789"
    assert DIALECT.recorded({"anthropic-beta": f"a-beta,{secret[:12]}"}, secret) == {"anthropic-beta": "a-beta,***"}
