"""The Responses dialect's translation to chat completions, as plain data (``dialects.responses.to_chat``):
how output items group into assistant messages, what is kept, what is lost, and the 400s."""

from __future__ import annotations

import pytest

from prefect_rollouts.harnesses.dialects.responses import DIALECT

pytestmark = pytest.mark.unit

REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}],
             "encrypted_content": "opaque"}


def call(call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def test_an_assistants_reasoning_text_and_calls_in_a_row_are_one_assistant_message():
    chat, lost = DIALECT.to_chat({"input": [
        {"role": "user", "content": "go"}, REASONING,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "looking"}]},
        call("c1"), call("c2"),
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]})
    tool_calls = [{"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in ("c1", "c2")]
    assert chat["messages"] == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [REASONING, {"type": "text", "text": "looking"}], "tool_calls": tool_calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "done"}]
    assert lost == {"reasoning_items": 1}


def test_text_after_a_call_starts_another_assistant_message_and_a_late_developer_message_is_system():
    chat, _ = DIALECT.to_chat({"input": [
        {"role": "user", "content": "go"}, call("c1"),
        {"type": "message", "role": "assistant", "content": "and then"},
        {"type": "message", "role": "developer", "content": "mind the sandbox"}]})
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [
        ("user", "go"), ("assistant", ""), ("assistant", "and then"), ("system", "mind the sandbox")]


def test_images_become_image_url_parts_and_what_chat_cannot_take_is_counted():
    chat, lost = DIALECT.to_chat({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
                                     {"type": "input_file", "file_id": "f1"}]},
        call("c1"),
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "shot:"}, {"type": "input_image", "image_url": "data:image/png;base64,BB"}]},
        {"type": "item_reference", "id": "msg_0"}]})
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}}]
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "shot:"}
    assert lost == {"dropped_parts": {"input_file": 1, "input_image": 1}, "dropped_items": {"item_reference": 1}}


def test_without_a_function_tool_left_no_tool_keys_are_sent():
    chat, lost = DIALECT.to_chat({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": "auto",
                                  "parallel_tool_calls": True})
    assert chat == {"messages": [{"role": "user", "content": "x"}]} and lost == {"dropped_tools": ["web_search"]}


@pytest.mark.parametrize(("body", "message"), [
    ({"model": "m"}, "input: Field required"),
    ({"input": 7}, "input: must be a string or a list of items"),
    ({"input": [{"role": "robot", "content": "x"}]}, 'input.0.role = "robot": must be user, assistant, system or'),
    ({"input": [{"role": "user", "content": {"text": "x"}}]}, "input.0.content: must be a string or a list"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id: must be a string"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens = 0: must be a positive integer"),
    ({"input": "x", "tools": [{"type": "function", "name": 3}]}, "tools.0.name: must be a string"),
    ({"input": [], "instructions": "only this"}, "input: holds no message"),
    ({"input": "x", "conversation": "conv_1"}, 'conversation = "conv_1": this endpoint keeps no responses'),
    ([{"input": "x"}], "the request body must be a JSON object"),
])
def test_a_request_that_cannot_be_translated_names_its_field(body, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        DIALECT.to_chat(body)
