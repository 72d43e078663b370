"""A trace's messages as a reader wants them: one entry per message with its text, its thinking or
reasoning parts, its tool calls (arguments, and each call's result joined to it by ``tool_call_id``), and
the provenance of a user message that came from ``Interaction.send`` (steer or queue, with its id)."""

from __future__ import annotations

import json
from typing import Any

from prefect_rollouts.trace import Trace


def conversation(trace: Trace) -> list[dict[str, Any]]:
    """The messages of ``trace`` in order, each ``{"index", "role", "segment", "text", "parts", "tool_calls",
    "tool_call_id", "tool_name", "is_error", "provenance", "message_id"}``.

    ``parts``: the message's other typed parts (``{"type", "text"}``: a thinking block's text, a reasoning
    item's summary, else the part as JSON). ``tool_calls``: ``{"id", "name", "arguments", "result",
    "is_error", "latency_ms"}``, ``result`` the text of the tool message answering it (None when none did).
    ``provenance``: ``"steer"`` or ``"queue"`` for a user message delivered by a send (matched by text within
    the segment it was delivered in), else None.
    """
    records = {call.id: call for call in trace.tool_calls}
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in trace.messages if m.get("role") == "tool"}
    names = {}
    entries = []
    for index, message in enumerate(trace.messages):
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            record = records.get(call.get("id"))
            names[call.get("id")] = function.get("name")
            calls.append({"id": call.get("id"), "name": function.get("name"),
                          "arguments": _pretty(function.get("arguments")), "result": results.get(call.get("id")),
                          "is_error": record.is_error if record else None,
                          "latency_ms": record.latency_ms if record else None})
        content = message.get("content")
        entries.append({"index": index, "role": str(message.get("role")), "segment": _segment(trace, index),
                        "text": _text(content), "parts": _parts(content) + _reasoning(message),
                        "tool_calls": calls, "tool_call_id": message.get("tool_call_id"),
                        "tool_name": names.get(message.get("tool_call_id")) or message.get("name"),
                        "is_error": (records[message["tool_call_id"]].is_error
                                     if message.get("tool_call_id") in records else None),
                        "provenance": None, "message_id": None})
    _mark_sends(trace, entries)
    return entries


def _mark_sends(trace: Trace, entries: list[dict[str, Any]]) -> None:
    """Mark each delivered send's user message (the first unmarked one with its text, in the segment it
    was delivered in, else anywhere after the opening message)."""
    for send in trace.sends:
        if send.status != "delivered":
            continue
        span = range(len(entries))
        if send.delivered_segment is not None and send.delivered_segment < len(trace.segments):
            segment = trace.segments[send.delivered_segment]
            span = range(segment.start, min(segment.end, len(entries)))
        for candidates in (span, range(len(entries))):
            found = next((e for i in candidates if (e := entries[i])["role"] == "user" and e["provenance"] is None
                          and e["text"].strip() == send.text.strip()), None)
            if found is not None:
                found["provenance"], found["message_id"] = send.mode, send.message_id
                break


def _segment(trace: Trace, index: int) -> int | None:
    return next((s.index for s in trace.segments if s.start <= index < s.end), None)


def _text(content: Any) -> str:
    """The text of a message's ``content``: the string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return json.dumps(content, ensure_ascii=False, default=repr)


def _parts(content: Any) -> list[dict[str, str]]:
    """The parts of ``content`` that are not text: thinking, reasoning, images, ... as ``{"type", "text"}``."""
    if not isinstance(content, list):
        return []
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") == "text":
            continue
        kind = str(part.get("type"))
        if kind == "thinking":
            text = str(part.get("thinking", ""))
        elif kind == "reasoning":
            text = "\n".join(str(s.get("text", "")) for s in part.get("summary") or [] if isinstance(s, dict))
            text = text or "(encrypted reasoning)"
        elif kind == "redacted_thinking":
            text = "(redacted thinking)"
        else:
            text = json.dumps(part, ensure_ascii=False, default=repr)[:4000]
        parts.append({"type": kind, "text": text})
    return parts


def _reasoning(message: dict[str, Any]) -> list[dict[str, str]]:
    """A ``reasoning_content`` (or ``reasoning``) string some servers put beside ``content``."""
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str) and message[key]:
            return [{"type": "reasoning", "text": message[key]}]
    return []


def _pretty(arguments: Any) -> str:
    """Tool-call arguments as indented JSON when they parse, else as the model sent them."""
    if not isinstance(arguments, str):
        return json.dumps(arguments, indent=2, ensure_ascii=False, default=repr)
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments
