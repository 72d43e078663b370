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

Response: a ``response`` object whose ``output`` is a ``message`` (``output_text``) and one
``function_call`` per tool call; a ``length`` finish is ``status: "incomplete"`` with
``incomplete_details.reason = "max_output_tokens"``. Streamed, the events the OpenAI SDK and Codex parse,
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

HANDLED = frozenset({"input", "instructions", "model", "tools", "tool_choice", "parallel_tool_calls",
                     "max_output_tokens", "temperature", "top_p", "stream", "text", "previous_response_id",
                     "conversation"})
"""Request keys the translation reads; any other is accepted, unused, and listed in the loss report."""

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text"})


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
        messages = _messages(body, lost)
        chat: dict[str, Any] = {"messages": messages}
        for key in ("model", "temperature", "top_p", "parallel_tool_calls"):
            if body.get(key) is not None:
                chat[key] = body[key]
        if (limit := body.get("max_output_tokens")) is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"max_output_tokens = {echo(limit)}: must be a positive integer")
            chat["max_tokens"] = limit
        tools = _tools(body["tools"], lost) if body.get("tools") is not None else []
        if tools:
            chat["tools"] = tools
            if body.get("tool_choice") is not None:
                choice = _tool_choice(body["tool_choice"], lost)
                if choice is not None:
                    chat["tool_choice"] = choice
        else:   # chat servers refuse tool_choice and parallel_tool_calls without tools
            chat.pop("parallel_tool_calls", None)
        if body.get("text") is not None:
            form = _response_format(body["text"], lost)
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
        output: list[dict[str, Any]] = []
        calls = message.get("tool_calls") or []
        text = message.get("content") or ""
        if text or not calls:
            output.append({"type": "message", "id": f"msg_{base}", "status": status, "role": "assistant",
                           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
        for index, call in enumerate(calls):
            function = call.get("function") or {}
            output.append({"type": "function_call", "id": f"fc_{base}_{index}", "call_id": call.get("id") or
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
            else:
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "arguments": ""})
                if item["arguments"]:
                    yield event("response.function_call_arguments.delta", **place, delta=item["arguments"])
                yield event("response.function_call_arguments.done", **place, name=item["name"],
                            arguments=item["arguments"])
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed", response=response)


def _count(lost: dict[str, Any], group: str, kind: Any) -> None:
    counts = lost.setdefault(group, {})
    counts[str(kind)] = counts.get(str(kind), 0) + 1


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: must be a string")
    return value


def _content(content: Any, where: str, lost: dict[str, Any]) -> str | list[dict[str, Any]]:
    """A message's ``content`` in chat form: a string, or parts when an image is among them."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}: must be a string or a list of content parts")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        if not isinstance(part, dict):
            raise ValueError(f"{where}.{index}: must be an object")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise ValueError(f"{where}.{index}.type = {echo(kind)}: must be a string (input_text, input_image, ...)")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": _text(part.get("text"), f"{where}.{index}.text")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _text(part.get("refusal"), f"{where}.{index}.refusal")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image = {"url": part["image_url"], **({"detail": part["detail"]} if part.get("detail") else {})}
            parts.append({"type": "image_url", "image_url": image})
        else:
            _count(lost, "dropped_parts", kind)
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _messages(body: dict[str, Any], lost: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages for ``instructions`` and ``input`` (the module docstring has the rules)."""
    system: list[str] = []
    if body.get("instructions") is not None:
        system.append(_text(body["instructions"], "instructions"))
    items = body.get("input")
    if items is None:
        raise ValueError("input: Field required. Send the conversation as a string or a list of items")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise ValueError("input: must be a string or a list of items")
    messages: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None   # the assistant message being assembled from output items
    for index, item in enumerate(items):
        where = f"input.{index}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ValueError(f"{where}.role = {echo(role)}: must be user, assistant, system or "
                                 "developer")
            content = _content(item.get("content"), f"{where}.content", lost)
            if role in ("system", "developer") and not messages and isinstance(content, str):
                system.append(content)   # leading instructions: one system message
                continue
            if role == "assistant":
                if turn is None or _has_text(turn) or turn.get("tool_calls"):
                    turn = {"role": "assistant", "content": ""}
                    messages.append(turn)
                _add_text(turn, content)
                continue
            turn = None
            messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "reasoning":
            if turn is None or _has_text(turn) or turn.get("tool_calls"):
                turn = {"role": "assistant", "content": ""}
                messages.append(turn)
            parts = turn["content"] if isinstance(turn["content"], list) else []
            turn["content"] = [*parts, dict(item)]
            lost["reasoning_items"] = lost.get("reasoning_items", 0) + 1
        elif kind == "function_call":
            call = {"id": _text(item.get("call_id"), f"{where}.call_id"), "type": "function",
                    "function": {"name": _text(item.get("name"), f"{where}.name"),
                                 "arguments": _text(item.get("arguments"), f"{where}.arguments")}}
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                messages.append(turn)
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            turn = None
            output = _content(item.get("output"), f"{where}.output", lost)
            if isinstance(output, list):   # a tool message holds text: its images are lost
                for part in output:
                    if part["type"] != "text":
                        _count(lost, "dropped_parts", "input_image")
                output = "".join(part.get("text", "") for part in output)
            messages.append({"role": "tool", "tool_call_id": _text(item.get("call_id"), f"{where}.call_id"),
                             "content": output})
        else:
            _count(lost, "dropped_items", kind)
    if not messages:
        raise ValueError("input: holds no message (system and developer ones aside). Send at least one user message")
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return messages


def _has_text(message: dict[str, Any]) -> bool:
    content = message["content"]
    return bool(content) if isinstance(content, str) else any(part.get("type") == "text" for part in content)


def _add_text(message: dict[str, Any], content: str | list[dict[str, Any]]) -> None:
    """Append an assistant ``message`` item's text to the assistant message being assembled."""
    text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
    if isinstance(message["content"], list):
        message["content"] = [*message["content"], {"type": "text", "text": text}]
    else:
        message["content"] += text


def _tools(tools: Any, lost: dict[str, Any]) -> list[dict[str, Any]]:
    """Function tools in chat's nested form; other types dropped (listed), ``strict`` counted."""
    if not isinstance(tools, list):
        raise ValueError("tools: must be a list")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tools.{index}: must be an object")
        if tool.get("type") != "function":
            lost.setdefault("dropped_tools", []).append(str(tool.get("name") or tool.get("type")))
            continue
        function = {"name": _text(tool.get("name"), f"tools.{index}.name")}
        if tool.get("description") is not None:
            function["description"] = _text(tool["description"], f"tools.{index}.description")
        if tool.get("parameters") is not None:
            function["parameters"] = tool["parameters"]
        if tool.get("strict"):
            lost["strict_tools"] = lost.get("strict_tools", 0) + 1
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, lost: dict[str, Any]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    lost["dropped_tool_choice"] = choice if isinstance(choice, str) else choice.get("type") \
        if isinstance(choice, dict) else echo(choice)
    return None


def _response_format(text: Any, lost: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (``text``: none needed); ``verbosity`` is lost."""
    if not isinstance(text, dict):
        raise ValueError("text: must be an object")
    if text.get("verbosity") is not None:
        lost["text_verbosity"] = text["verbosity"]
    form = text.get("format")
    if not isinstance(form, dict) or form.get("type") in (None, "text"):
        return None
    if form["type"] == "json_object":
        return {"type": "json_object"}
    if form["type"] == "json_schema":
        schema = {key: form[key] for key in ("name", "schema", "strict", "description") if key in form}
        return {"type": "json_schema", "json_schema": schema}
    lost["dropped_text_format"] = str(form["type"])
    return None


DIALECT = ResponsesDialect()
