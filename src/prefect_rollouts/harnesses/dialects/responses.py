"""OpenAI Responses (``POST /v1/responses``, what Codex CLI speaks), translated to chat completions.

Request: ``instructions`` and the leading ``system``/``developer`` messages become one system message;
``input`` (a string, or a list of items) becomes chat messages: ``message`` items (``input_text``,
``output_text``, ``input_image`` parts), an assistant's ``function_call`` items as the ``tool_calls`` of
one assistant message, ``function_call_output`` items as ``tool`` messages, and a resent ``reasoning``
item kept verbatim as a typed part of the assistant message it precedes (``trace.KEPT_PART_TYPES``:
on the trace, never sent upstream). Function ``tools`` (flat) become chat's nested form, ``tool_choice``
likewise; ``max_output_tokens`` is ``max_tokens``; ``text.format`` (``json_schema``, ``json_object``) is
``response_format``; ``parallel_tool_calls``, ``temperature``, ``top_p`` and ``model`` pass (the endpoint
imposes the rollout's). What cannot be used (``include``, ``prompt_cache_key``, ``reasoning``, ``store``,
``strict``, ``metadata``, tools of other types, ...) is accepted and listed in the loss report.
``previous_response_id`` (and ``conversation``) are refused: the endpoint keeps no responses, as with
``store = false``; the program resends its history.

To a ``responses`` upstream (the agent's ``ClientConfig.api``) nothing is lost but the imposed fields:
``instructions`` is the first system message and ``model.apis.NATIVE_KEY`` says so; system and developer
items stay messages of their role, where they stand; content lists stay lists (text parts keep their
other keys), parts and items of other types (``input_file``, ``custom_tool_call``...) are kept verbatim;
an item's ids and statuses go under ``trace.RESPONSES_ITEM``; every top-level field but those
``NATIVE_TAKEN`` goes under ``NATIVE_KEY`` (``include``, ``reasoning``, ``store``, the tools as sent,
``text``...). ``model.apis.responses`` sends all of it as it came.

Response: a ``response`` object whose ``output`` is the kept items of the reply (``reasoning`` from a
Responses upstream, verbatim, in place), a ``message`` (``output_text``) and one ``function_call`` per
tool call; a ``length`` finish is ``status: "incomplete"`` with ``incomplete_details.reason =
"max_output_tokens"``. Streamed, the events the OpenAI SDK and Codex parse,
each with ``event:`` and a ``sequence_number``, ending with ``response.completed`` carrying the whole
response and its usage, also for an incomplete one (OpenAI sends ``response.incomplete`` then; the SDK's
``get_final_response`` and Codex 0.169's stream reader take only ``response.completed``, and Codex
retries a stream that ends without it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from prefect_rollouts.harnesses.dialects import Dialect, echo
from prefect_rollouts.harnesses.dialects.responses_request import (
    messages_of,
    response_format_of,
    tool_choice_of,
    tools_of,
)
from prefect_rollouts.model.apis.base import NATIVE_KEY
from prefect_rollouts.model.apis.responses import INSTRUCTIONS
from prefect_rollouts.trace import RESPONSES_ITEM

HANDLED = frozenset({"input", "instructions", "model", "tools", "tool_choice", "parallel_tool_calls",
                     "max_output_tokens", "temperature", "top_p", "stream", "text", "previous_response_id",
                     "conversation"})
"""Request keys the translation reads; any other is accepted, unused, and listed in the loss report."""

NATIVE_TAKEN = frozenset({"input", "instructions", "model", "temperature", "top_p", "max_output_tokens", "stream",
                          "previous_response_id", "conversation"})
"""Request keys a request to a ``responses`` upstream does not carry under ``NATIVE_KEY``: the conversation
(the messages carry it) and what the endpoint imposes."""

class ResponsesDialect(Dialect):
    """``POST /v1/responses`` (and ``/responses``), bearer key, OpenAI errors."""

    name = "responses"
    paths = ("/v1/responses", "/responses")

    def to_chat(self, body: Any, upstream: str = "chat") -> tuple[dict[str, Any], dict[str, Any]]:
        """The chat-completions request for ``body`` and the loss report: ``ignored`` (the unused
        keys), ``reasoning_items`` (kept on the trace, not sent), ``strict_tools``, ``dropped_tools``,
        ``dropped_items`` and ``dropped_parts`` (by type), each only when there is one.

        Raises:
            ValueError: a field of the wrong shape, named (``input.2.call_id: must be a string``), or
                ``previous_response_id`` set.
        """
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        for key in ("previous_response_id", "conversation"):
            if body.get(key) is not None:
                raise ValueError(f"{key} = {echo(body[key], 80)}: this endpoint keeps no responses "
                                 "(store = false). Send the whole conversation in input every time, as Codex "
                                 "does with store = false")
        lost: dict[str, Any] = {}
        native = upstream == self.name
        messages = messages_of(body, lost, native)
        chat: dict[str, Any] = {"messages": messages}
        for key in ("model", "temperature", "top_p", "parallel_tool_calls"):
            if body.get(key) is not None:
                chat[key] = body[key]
        if (limit := body.get("max_output_tokens")) is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"max_output_tokens = {echo(limit)}: must be a positive integer")
            chat["max_tokens"] = limit
        if native:   # tools, tool_choice, text... go upstream as they came; the chat form needs only the tools
            if isinstance(body.get("tools"), list) and body["tools"]:   # ProgramSession.side looks at them
                chat["tools"] = body["tools"]
            chat[NATIVE_KEY] = {"api": self.name, "params": {key: value for key, value in body.items()
                                                              if key not in NATIVE_TAKEN and key != NATIVE_KEY},
                                INSTRUCTIONS: body.get("instructions") is not None}
            if NATIVE_KEY in body:   # the program's own is not sent on (only the endpoint sets one): the loss
                lost["ignored"] = [NATIVE_KEY]
            return chat, lost
        tools = tools_of(body["tools"], lost) if body.get("tools") is not None else []
        if tools:
            chat["tools"] = tools
            if body.get("tool_choice") is not None:
                choice = tool_choice_of(body["tool_choice"], lost)
                if choice is not None:
                    chat["tool_choice"] = choice
        else:   # chat servers refuse tool_choice and parallel_tool_calls without tools
            chat.pop("parallel_tool_calls", None)
        if body.get("text") is not None:
            form = response_format_of(body["text"], lost)
            if form is not None:
                chat["response_format"] = form
        ignored = sorted(key for key in body if key not in HANDLED)
        if ignored:
            lost["ignored"] = ignored
        return chat, lost

    def from_chat(self, completion: dict[str, Any], body: Any) -> dict[str, Any]:
        """The ``response`` object for a recorded ``chat.completion`` (deterministic: a replay answers
        the same ids)."""
        choice = completion["choices"][0]
        message, finish = choice["message"], choice.get("finish_reason")
        base = str(completion["id"]).removeprefix("chatcmpl-")
        incomplete = finish == "length"
        status = "incomplete" if incomplete else "completed"
        calls = message.get("tool_calls") or []
        output = _output(message.get("content"), (message.get(RESPONSES_ITEM) or {}).get("id") or f"msg_{base}",
                         status, bool(calls))
        for index, call in enumerate(calls):
            function = call.get("function") or {}
            output.append({"type": "function_call", "id": (call.get(RESPONSES_ITEM) or {}).get("id") or
                           f"fc_{base}_{index}", "call_id": call.get("id") or
                           f"call_{base}_{index}", "name": function.get("name", ""),
                           "arguments": function.get("arguments") or "", "status": "completed"})
        usage = completion.get("usage") or {}
        asked = body if isinstance(body, dict) else {}
        return {
            "id": f"resp_{base}", "object": "response", "created_at": completion["created"],
            "status": status, "completed_at": None if incomplete else completion["created"],
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": asked.get("instructions") if isinstance(asked.get("instructions"), str) else None,
            "model": completion["model"], "output": output,
            "parallel_tool_calls": asked.get("parallel_tool_calls", True) is not False,
            "tool_choice": asked.get("tool_choice") or "auto", "tools": [   # those offered to the model
                tool for tool in asked.get("tools") or [] if isinstance(tool, dict) and tool.get("type") == "function"],
            "temperature": asked.get("temperature"), "top_p": asked.get("top_p"),
            "max_output_tokens": asked.get("max_output_tokens"), "store": False,
            "usage": {
                "input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
                "total_tokens": usage.get("total_tokens", 0),
                "input_tokens_details": {"cached_tokens": (usage.get("prompt_tokens_details") or {})
                                         .get("cached_tokens") or 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": (usage.get("completion_tokens_details") or {})
                                          .get("reasoning_tokens") or 0}},
        }

    def events(self, response: dict[str, Any], body: Any) -> Iterator[str]:
        """The SSE stream of a finished ``response``: ``response.created``, ``response.in_progress``,
        per output item ``output_item.added``, its text (``content_part.added``, one
        ``output_text.delta``, ``output_text.done``, ``content_part.done``) or its arguments (one
        ``function_call_arguments.delta``, ``.done``), ``output_item.done``; then ``response.completed``."""
        sequence = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal sequence
            data = json.dumps({"type": kind, "sequence_number": sequence, **fields})
            sequence += 1
            return f"event: {kind}\ndata: {data}\n\n"

        opening = {**response, "status": "in_progress", "output": [], "usage": None, "completed_at": None,
                   "incomplete_details": None}
        yield event("response.created", response=opening)
        yield event("response.in_progress", response=opening)
        for index, item in enumerate(response["output"]):
            place = {"output_index": index, "item_id": item["id"]}
            if item["type"] == "message":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "content": []})
                for part_index, part in enumerate(item["content"]):
                    at = {**place, "content_index": part_index}
                    yield event("response.content_part.added", **at, part={**part, "text": ""})
                    if part["text"]:
                        yield event("response.output_text.delta", **at, delta=part["text"], logprobs=[])
                    yield event("response.output_text.done", **at, text=part["text"], logprobs=[])
                    yield event("response.content_part.done", **at, part=part)
            elif item["type"] != "function_call":   # a kept item (reasoning) comes whole
                yield event("response.output_item.added", output_index=index, item=item)
            else:
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "arguments": ""})
                if item["arguments"]:
                    yield event("response.function_call_arguments.delta", **place, delta=item["arguments"])
                yield event("response.function_call_arguments.done", **place, name=item["name"],
                            arguments=item["arguments"])
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed", response=response)


def _output(content: Any, ident: str, status: str, called: bool) -> list[dict[str, Any]]:
    """The output items of a reply's ``content``: kept parts (``reasoning`` items) verbatim where they
    stand, its text as one ``message`` item (also an empty one when there is nothing else)."""
    parts = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
    output: list[dict[str, Any]] = []
    text = "".join(str(part.get("text", "")) for part in parts if isinstance(part, dict) and part.get("type") == "text")
    for part in parts:
        if isinstance(part, dict) and part.get("type") not in ("text", "thinking", "redacted_thinking"):
            output.append(part)
    if text or not (called or output):
        output.append({"type": "message", "id": ident, "status": status, "role": "assistant",
                       "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
    return output


DIALECT = ResponsesDialect()
