"""The scripted server's OpenAI Responses route: ``POST /v1/responses`` (``ScriptedOpenAIServer``, same
script, recording and counting as chat completions; importing this module registers the route).

A step is what chat takes (``reply``, ``tool_call``, ``tool_calls``, ``status``, ``delayed``, a callable...),
answered as a ``response`` object, or ``output(*items)`` for a response of the given output items
(``reasoning(...)``, ``message(...)``, ``function_call(...)``). ``finish_reason="length"`` (or
``output(..., incomplete="max_output_tokens")``) is ``status: "incomplete"``. A request with
``"stream": true`` gets the server-sent events OpenAI sends (``response.created``, ``response.in_progress``,
per item ``output_item.added``, its deltas, ``output_item.done``, then ``response.completed`` or
``response.incomplete``). Bodies and events are validated against ``openai.types.responses`` in
tests/fakes/test_responses_server.py.

    with ScriptedOpenAIServer() as server:
        server.play([output(reasoning("plan"), function_call("shell", {"cmd": "ls"})), reply("done")])
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from tests.fakes.openai_server import ROUTES, RecordedRequest, Response, ScriptedOpenAIServer, _json, _Reply

RESPONSES_PATH = "/v1/responses"


@dataclass(frozen=True)
class _Output:
    items: tuple[dict[str, Any], ...]
    incomplete: str | None = None
    usage: dict[str, Any] | None = None


def output(*items: dict[str, Any], incomplete: str | None = None, usage: dict[str, Any] | None = None) -> _Output:
    """A response of ``items`` (``incomplete``: the ``incomplete_details.reason``); ``usage`` as given, else
    10 input tokens per input item, one output token per item."""
    return _Output(items, incomplete, usage)


def reasoning(summary: str = "", encrypted: str | None = "gAAAAB-opaque-0", rid: str = "rs_0") -> dict[str, Any]:
    """A ``reasoning`` output item with its ``encrypted_content`` (what ``include`` asks for)."""
    item: dict[str, Any] = {"type": "reasoning", "id": rid, "summary": [
        {"type": "summary_text", "text": summary}] if summary else []}
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def message(text: str, mid: str = "msg_0") -> dict[str, Any]:
    """An assistant ``message`` output item of one ``output_text`` part."""
    return {"type": "message", "id": mid, "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def function_call(name: str, arguments: dict[str, Any] | str, call_id: str = "call_0",
                  fid: str = "fc_0") -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {"type": "function_call", "id": fid, "call_id": call_id, "name": name, "status": "completed",
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}


def usage_of(input_tokens: int, output_tokens: int, cached: int = 0, reasoning_tokens: int = 0,
             cache_write: int = 0) -> dict[str, Any]:
    """A Responses ``usage`` object."""
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": cache_write},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


def render(server: ScriptedOpenAIServer, step: Any, request: RecordedRequest) -> Response:
    """The answer to one Responses request for ``step`` (a chat reply or an ``output``)."""
    if isinstance(step, _Reply):
        number = server._next_id("resp")
        items: list[dict[str, Any]] = []
        if step.content is not None or not step.calls:
            items.append(message(step.content or "", f"msg_{number}"))
        for name, arguments in step.calls:
            ident = server._next_id("call")
            items.append(function_call(name, arguments, f"call_{ident}", f"fc_{ident}"))
        step = _Output(tuple(items), "max_output_tokens" if step.finish_reason == "length" else None,
                       _usage(step.usage) if step.usage else None)
    if not isinstance(step, _Output):
        raise TypeError(f"not a step: {step!r}")
    asked = request.body
    inputs = asked.get("input")
    count = len(inputs) if isinstance(inputs, list) else 1
    body = {
        "id": f"resp_{server._next_id('resp')}", "object": "response", "created_at": int(time.time()),
        "status": "incomplete" if step.incomplete else "completed", "error": None,
        "incomplete_details": {"reason": step.incomplete} if step.incomplete else None,
        "instructions": asked.get("instructions"), "metadata": {}, "model": asked.get("model") or "scripted",
        "output": list(step.items), "parallel_tool_calls": asked.get("parallel_tool_calls", True),
        "temperature": asked.get("temperature"), "top_p": asked.get("top_p"),
        "tool_choice": asked.get("tool_choice", "auto"), "tools": asked.get("tools") or [],
        "max_output_tokens": asked.get("max_output_tokens"), "store": asked.get("store", True),
        "usage": step.usage or usage_of(count * 10, max(1, len(step.items)))}
    if asked.get("stream") is True:
        return 200, {"Content-Type": "text/event-stream"}, "".join(events(body)).encode()
    return _json(200, body)


def _usage(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat ``usage`` as Responses'."""
    return usage_of(chat.get("prompt_tokens", 0), chat.get("completion_tokens", 0),
                    (chat.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                    (chat.get("completion_tokens_details") or {}).get("reasoning_tokens", 0))


def events(body: dict[str, Any]) -> list[str]:
    """The server-sent events of ``body`` as OpenAI streams a response (the module docstring)."""
    out: list[str] = []

    def event(kind: str, **fields: Any) -> None:
        data = json.dumps({"type": kind, "sequence_number": len(out), **fields})
        out.append(f"event: {kind}\ndata: {data}\n\n")

    opening = {**body, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    event("response.created", response=opening)
    event("response.in_progress", response=opening)
    for index, item in enumerate(body["output"]):
        place = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            event("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                          "content": []})
            for part_index, part in enumerate(item["content"]):
                at = {**place, "content_index": part_index}
                event("response.content_part.added", **at, part={**part, "text": ""})
                text = part["text"]
                for piece in (text[:len(text) // 2], text[len(text) // 2:]) if text else ():
                    event("response.output_text.delta", **at, delta=piece, logprobs=[])
                event("response.output_text.done", **at, text=text, logprobs=[])
                event("response.content_part.done", **at, part=part)
        elif item["type"] == "function_call":
            event("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                          "arguments": ""})
            event("response.function_call_arguments.delta", **place, delta=item["arguments"])
            event("response.function_call_arguments.done", **place, name=item["name"], arguments=item["arguments"])
        else:
            event("response.output_item.added", output_index=index, item={**item, "summary": []}
                  if item["type"] == "reasoning" else item)
        event("response.output_item.done", output_index=index, item=item)
    event("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)
    return out


ROUTES[RESPONSES_PATH] = render
