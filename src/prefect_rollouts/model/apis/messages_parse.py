"""Anthropic Messages responses read back (``messages.MessagesApi``): a ``message`` body, its stream
of events, and the rate-limit headers of a refusal.

- content: ``text`` blocks -> text parts, ``thinking`` and ``redacted_thinking`` (and any other block,
  e.g. a server tool's) verbatim as typed parts, in order; ``tool_use`` -> ``tool_calls`` with the
  block's ``id`` (``arguments``: its ``input`` as JSON). A reply of one plain text block (no citations)
  is a string, as chat completions has it;
- usage (docs.anthropic.com, "Prompt caching": ``input_tokens`` counts neither cache reads nor writes):
  ``prompt_tokens`` = ``input_tokens`` + ``cache_read_input_tokens`` + ``cache_creation_input_tokens``,
  ``cached_tokens`` = the reads, ``cache_write_tokens`` = the writes, ``completion_tokens`` =
  ``output_tokens`` (thinking included; Anthropic reports no separate reasoning count);
- ``stop_reason`` -> ``finish_reason`` (``STOP_REASONS``), so truncation and ``max_turn_tokens`` work.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Mapping
from typing import Any

from prefect_rollouts.model.apis.base import requested_wait
from prefect_rollouts.model.completion import Completion, count
from prefect_rollouts.nesting import loads

STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                "model_context_window_exceeded": "length", "refusal": "content_filter", "pause_turn": "stop"}
"""Messages' ``stop_reason`` -> chat's ``finish_reason``; another reason passes as it is."""

_LIMITS = ("requests", "tokens", "input-tokens", "output-tokens")
"""The ``anthropic-ratelimit-<limit>-remaining`` / ``-reset`` pairs (docs.anthropic.com, "Rate limits")."""


def completion(data: Any, retries: int, status_code: int) -> Completion:
    """The ``Completion`` of a ``message`` body. Raises ``TypeError``/``KeyError``/``ValueError`` on a
    shape error (the client reports a malformed body, 502)."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise TypeError("not a Messages response: no content list")
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(data["content"]):
        if not isinstance(block, dict):
            raise TypeError(f"content.{index} is {type(block).__name__}, not an object")
        if block.get("type") == "tool_use":
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
        else:
            parts.append(block)
    plain = len(parts) == 1 and parts[0].get("type") == "text" and all(   # "citations": null is none
        key in ("type", "text") or value is None for key, value in parts[0].items())
    content: Any = parts[0]["text"] if plain else parts if parts else ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise TypeError(f"usage is {type(usage).__name__}, not an object")
    notes = [] if usage else ["the response reported no usage"]
    fresh, output = (count(usage.get(key), f"usage.{key}", notes) for key in ("input_tokens", "output_tokens"))
    read, written = (count(usage.get(key), f"usage.{key}", notes)
                     for key in ("cache_read_input_tokens", "cache_creation_input_tokens"))
    reason = data.get("stop_reason")
    finish = STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None
    return Completion(message=message, finish_reason=finish,
                      prompt_tokens=(fresh or 0) + (read or 0) + (written or 0), completion_tokens=output or 0,
                      retries=retries, status_code=status_code, cached_tokens=read, cache_write_tokens=written,
                      usage_note="; ".join(notes) or None)


def assemble(events: list[tuple[str, str]]) -> dict[str, Any]:
    """The ``message`` a stream of Messages events describes: ``message_start``'s message, each block
    of ``content_block_start`` completed by its deltas (``text_delta``, ``input_json_delta``: the
    ``input`` parsed at the end, ``thinking_delta``, ``signature_delta``, ``citations_delta``), then
    ``message_delta``'s ``stop_reason`` and usage (its counts replace the start's). ``ping`` is skipped.

    Raises:
        ValueError: an ``error`` event (its type and message), a stream without ``message_start``, or
            an event (or a tool's input) that is not JSON or nests deeper than ``nesting.MAX_JSON_DEPTH``.
    """
    message: dict[str, Any] | None = None
    partial: dict[int, str] = {}
    for name, text in events:
        event = loads(text, "an event") if text.strip() else {}   # depth bounded: MAX_JSON_DEPTH
        kind = event.get("type", name) if isinstance(event, dict) else name
        if kind == "error":
            error = event.get("error") or {}
            raise ValueError(f"the stream ended in an error: {error.get('type')}: {error.get('message')}")
        if kind == "message_start":
            message = dict(event["message"])
            message["content"] = list(message.get("content") or [])
            message["usage"] = dict(message.get("usage") or {})
        elif kind in ("ping", "message_stop", ""):
            continue
        elif message is None:
            raise ValueError(f"a {kind} event before message_start")
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            step = delta.get("type")
            if step == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif step == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            elif step == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif step == "signature_delta":
                block["signature"] = delta["signature"]
            elif step == "citations_delta":
                block.setdefault("citations", []).append(delta["citation"])
        elif kind == "message_delta":
            message.update({key: value for key, value in (event.get("delta") or {}).items()})
            message["usage"].update({key: value for key, value in (event.get("usage") or {}).items()
                                     if value is not None})
    if message is None:
        raise ValueError("the stream held no message_start event")
    for index, text in partial.items():
        message["content"][index]["input"] = loads(text, f"content.{index}.input") if text.strip() else {}
    return message


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait before a retry, as the ``anthropic`` SDK reads them: ``retry-after-ms``, then
    ``retry-after`` (seconds or an HTTP date); else the latest ``anthropic-ratelimit-<limit>-reset``
    (RFC 3339) of a limit whose ``-remaining`` is 0. None when none says anything usable."""
    seconds = requested_wait(headers)
    if seconds is not None:
        return seconds
    waits = []
    for limit in _LIMITS:
        reset = headers.get(f"anthropic-ratelimit-{limit}-reset")
        if reset and headers.get(f"anthropic-ratelimit-{limit}-remaining", "").strip() == "0":
            try:
                at = dt.datetime.fromisoformat(reset.strip().replace("Z", "+00:00"))
            except ValueError:
                continue
            waits.append(max(0.0, at.timestamp() - time.time()))
    return max(waits) if waits else None
