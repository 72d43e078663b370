"""Streamed responses: the server-sent-events reader (``model.sse``) and chat's ``parse_events`` (chunks
assembled: content, tool-call deltas by index, finish reason, the usage chunk), plain data in and out."""

from __future__ import annotations

import contextlib
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


async def test_text_lines_split_as_httpx_does_at_any_chunking():
    import httpx

    from prefect_rollouts.model.sse import text_lines

    text = "event: a\r\ndata: 1\r\n\r\ndata: 2\rdata: 3\n\n\r\r\nlast"
    for size in (1, 2, 3, 5, 64):
        async def chunks(size=size):
            for at in range(0, len(text), size):
                yield text[at:at + size]
        assert [line async for line in text_lines(chunks())] == list(httpx.Response(200, text=text).iter_lines())


async def test_a_stream_whose_line_never_ends_is_refused_at_the_limit_not_held_whole():
    """A server streaming one line without end (no newline, never closing): the client stops reading at
    ``MAX_STREAM_CHARS`` with a 502, before its timeout (httpx's ``aiter_lines`` held the line whole
    until the timeout, growing without bound: 430 MB resident for 200 MB)."""
    import socket
    import threading

    import prefect_rollouts as vf
    from prefect_rollouts.errors import ProviderError
    from prefect_rollouts.model import ModelClient

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: ")
            with contextlib.suppress(OSError):
                while not stop.is_set():
                    conn.sendall(b"x" * 1_048_576)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ModelClient(vf.ClientConfig(base_url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1", api="messages",
                                         stream=True, timeout=8, retries=vf.RetryConfig(max_retries=0)))
    try:
        with pytest.raises(ProviderError) as raised:
            await client.complete({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    finally:
        stop.set()
        await client.aclose()
        listener.close()
        thread.join(5)
    assert raised.value.status_code == 502 and "longer than 67108864 characters (MAX_STREAM_CHARS)" in str(raised.value)
