"""Streamed responses: the server-sent-events reader (``model.sse``) and chat's ``parse_events`` (chunks
assembled: content, tool-call deltas by index, finish reason, the usage chunk), plain data in and out."""

from __future__ import annotations

import json

import pytest

from prefect_rollouts.model.apis.chat import API as CHAT
from prefect_rollouts.model.sse import read_events

pytestmark = pytest.mark.unit


async def _lines(text: str):
    for line in text.splitlines():
        yield line


async def test_events_gather_fields_until_a_blank_line_skipping_comments():
    text = ": keep-alive\n\nevent: one\ndata: {\"a\":\ndata: 1}\nid: 7\nretry: 10\n\ndata:no space\n\n\n" \
           "event: last\ndata: x"   # the stream ended without its blank line
    assert await read_events(_lines(text)) == [("one", '{"a":\n1}'), ("", "no space"), ("last", "x")]


async def test_a_stream_past_the_limit_is_refused():
    with pytest.raises(ValueError, match="longer than 20 characters"):
        await read_events(_lines("data: " + "x" * 30 + "\n\n"), limit=20)


def _chunk(delta=None, finish=None, usage=None, choices=True):
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []}
    if usage is not None:
        body["usage"] = usage
    return ("", json.dumps(body))


def test_chat_chunks_assemble_text_tool_calls_by_index_finish_and_usage():
    events = [
        _chunk({"role": "assistant", "content": ""}), _chunk({"content": "Let me "}), _chunk({"content": "look."}),
        _chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                "function": {"name": "read", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                "function": {"name": "list", "arguments": "{}"}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"a"}'}}]}),
        _chunk(finish="tool_calls"),
        _chunk(usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39,
                      "prompt_tokens_details": {"cached_tokens": 16}}, choices=False),
        ("", "[DONE]")]
    completion = CHAT.parse_events(events, 0, 200)
    assert completion.message == {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "list", "arguments": "{}"}}]}
    assert (completion.finish_reason, completion.prompt_tokens, completion.completion_tokens,
            completion.cached_tokens) == ("tool_calls", 30, 9, 16)


def test_a_chat_stream_without_usage_notes_it_and_an_error_chunk_raises():
    completion = CHAT.parse_events([_chunk({"content": "hi"}, "stop"), ("", "[DONE]")], 0, 200)
    assert completion.message["content"] == "hi" and completion.usage_note == "the response reported no usage"
    with pytest.raises(ValueError, match="overloaded"):
        CHAT.parse_events([("", json.dumps({"error": {"message": "overloaded"}}))], 0, 200)
