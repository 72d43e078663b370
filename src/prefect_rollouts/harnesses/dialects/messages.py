"""The Anthropic Messages dialect (Claude Code): ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

A request is translated to the endpoint's chat-completions form (``to_chat``), the recorded chat
completion back to a ``message`` (``from_chat``) or to the server-sent events the Anthropic SDKs parse
(``events``). What the translation does, per field of a request, is ``messages_request``'s docstring.

The answer: ``content`` is the message's blocks in order (a ``thinking`` block with its signature, a
``redacted_thinking`` block, a text block, any other block a Messages upstream answered: verbatim, so the
program resends them unchanged, as Anthropic requires of thinking; a Responses ``reasoning`` item and
an empty text are left out) or its text as one text block, then a ``tool_use`` block per tool
call, whose ``id`` is the upstream's call id when it is a valid Anthropic id (``[A-Za-z0-9_-]+``: the
program resends it, and the trace keeps one id per call), else ``toolu_`` and a digest of it; its
``input`` is the parsed arguments, or ``{"_raw": "<arguments>"}`` when they are not a JSON object
(turned back into the same arguments when resent, so the trace keeps what the model wrote).
``stop_reason``: ``length`` -> ``max_tokens``, tool calls -> ``tool_use``, ``content_filter`` ->
``refusal``, else ``end_turn`` (a chat completion does not say whether a stop sequence matched, so
``stop_sequence`` is never reported). ``usage.input_tokens`` excludes the cached tokens, which are
``cache_read_input_tokens``, and those written to the cache, ``cache_creation_input_tokens``
(``prompt_tokens_details.cache_write_tokens`` of the recorded completion), as in Anthropic's API.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from prefect_rollouts.harnesses.dialects import Dialect, bearer
from prefect_rollouts.harnesses.dialects.messages_request import translate
from prefect_rollouts.nesting import loads

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}
"""Anthropic's error ``type`` per HTTP status (docs.anthropic.com, "Errors")."""

IMAGE_TOKENS = 1600
"""``count_tokens``'s estimate for one image: Anthropic's figure for an image of about 1.15
megapixels (width x height / 750), the largest it takes without resizing."""

_TOOL_ID = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


class MessagesDialect(Dialect):
    """Anthropic Messages: the key in ``x-api-key`` or ``Authorization: Bearer``, errors as
    ``{"type": "error", "error": {"type", "message"}}``."""

    name = "messages"
    paths = ("/v1/messages",)
    alternates = True
    recorded_headers = ("anthropic-beta",)
    stop_status = 403
    """``permission_error``: the launch's key may no longer be used. Measured with Claude Code 2.1.328
    (``CLAUDE_CODE_MAX_RETRIES=0``) at ``max_turns = 1``: on a 403 (or a 413) it ends after that one
    request; on a 400 (or a 422) it resends the request 3 times as it was and 3 times without its tool
    search before ending (6 refusals); on a 404 it resends it once unstreamed."""

    def key(self, headers: Mapping[str, str]) -> str | None:
        """``x-api-key`` (what ``ANTHROPIC_API_KEY`` sends), else ``Authorization: Bearer``
        (``ANTHROPIC_AUTH_TOKEN``)."""
        return headers.get("x-api-key", "").strip() or bearer(headers)

    def to_chat(self, body: Any, upstream: str = "chat") -> tuple[dict[str, Any], dict[str, Any]]:
        """See the module docstring; to a Messages ``upstream`` nothing is lost (``messages_request``).
        Raises ValueError naming the field (a 400)."""
        return translate(body, counting=False, native=upstream == "messages")

    def from_chat(self, completion: dict[str, Any], body: Any) -> dict[str, Any]:
        """The ``message`` for a recorded ``chat.completion`` (the module docstring)."""
        choice = completion["choices"][0]
        message = choice["message"]
        text = message.get("content")
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if isinstance(text, str) and text else []
        if isinstance(text, list):
            content = [dict(part) for part in text if isinstance(part, dict) and part.get("type") != "reasoning"
                       and not (part.get("type") == "text" and not part.get("text"))]
        calls = message.get("tool_calls") or []
        for call in calls:
            function = call.get("function") or {}
            content.append({"type": "tool_use", "id": tool_id(call.get("id")), "name": function.get("name", ""),
                            "input": tool_input(function.get("arguments"))})
        finish = choice.get("finish_reason")
        stop = "tool_use" if calls else {"length": "max_tokens", "content_filter": "refusal"}.get(finish, "end_turn")
        usage = completion.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
        answer_usage: dict[str, Any] = {
            "input_tokens": max(usage.get("prompt_tokens", 0) - cached - written, 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": written}
        identifier = str(completion.get("id", ""))
        return {"id": "msg_" + identifier.removeprefix("chatcmpl-"), "type": "message", "role": "assistant",
                "model": completion.get("model", ""), "content": content, "stop_reason": stop,
                "stop_sequence": None, "usage": answer_usage}

    def events(self, response: dict[str, Any], body: Any) -> Iterator[str]:
        """The SSE sequence of the Anthropic API for ``response``: ``message_start`` (its usage so
        far: the input), ``ping``, per block ``content_block_start``, its ``content_block_delta``
        (``text_delta``, ``input_json_delta``, or ``thinking_delta`` then ``signature_delta``; a
        ``redacted_thinking`` or other block starts whole), ``content_block_stop``, then ``message_delta``
        (``stop_reason``, the whole usage) and ``message_stop``."""
        usage = response["usage"]
        start = {**response, "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {**usage, "output_tokens": 0}}
        yield sse("message_start", {"type": "message_start", "message": start})
        yield sse("ping", {"type": "ping"})
        for index, block in enumerate(response["content"]):
            opened, deltas = _opened(block)
            yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": opened})
            for delta in deltas:
                yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
        yield sse("message_delta", {"type": "message_delta", "usage": usage, "delta": {
            "stop_reason": response["stop_reason"], "stop_sequence": response["stop_sequence"]}})
        yield sse("message_stop", {"type": "message_stop"})

    def error(self, status: int, message: str, code: str | None = None) -> dict[str, Any]:
        """Anthropic's error body, its ``type`` from ``ERROR_TYPES`` (``api_error`` for another 5xx,
        ``invalid_request_error`` for another 4xx)."""
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}


def _opened(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A block's ``content_block_start`` and its deltas (``events``)."""
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
    if kind == "tool_use":
        return ({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
                [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}])
    if kind == "thinking":
        return ({"type": "thinking", "thinking": "", "signature": ""},
                [{"type": "thinking_delta", "thinking": block.get("thinking", "")},
                 {"type": "signature_delta", "signature": block.get("signature", "")}])
    return block, []


def sse(event: str, data: dict[str, Any]) -> str:
    """One server-sent event with its ``event:`` line, as Anthropic's API writes them."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def tool_id(upstream: Any) -> str:
    """The ``tool_use`` id for an upstream tool call id: itself when Anthropic takes it, else
    ``toolu_`` and 24 hex digits of its SHA-256."""
    text = upstream if isinstance(upstream, str) else ""
    if _TOOL_ID.match(text):
        return text
    return "toolu_" + hashlib.sha256(text.encode()).hexdigest()[:24]


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` as a ``tool_use`` block's ``input``: the JSON object, ``{}`` for none
    (``""`` or blanks, as models send for a tool without parameters: it was ``{"_raw": ""}``), or
    ``{"_raw": arguments}`` when they are not one, or not one the answer can carry as JSON (``NaN``,
    ``1e999``, a lone surrogate, nesting past ``MAX_JSON_DEPTH``: a model's arguments of those made the
    answer a 500); ``tool_arguments`` turns it back."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            parsed = loads(arguments, "the tool call's arguments", parse_constant=_not_json, finite=True)
            json.dumps(parsed, ensure_ascii=False, allow_nan=False).encode("utf-8")   # what the answer will write
        except ValueError:   # UnicodeEncodeError is one
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"_raw": arguments if isinstance(arguments, str) else json.dumps(arguments)}


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def count_tokens(body: Any) -> int:
    """An estimate of the input tokens of a Messages request (``POST /v1/messages/count_tokens``):
    the characters of its translated messages and tools, as JSON, over 4 (rounded up), images apart
    at ``IMAGE_TOKENS`` each. Only an estimate: the model's own tokenizer is not at hand.

    Raises:
        ValueError: the body cannot be translated (``max_tokens`` is not needed here).
    """
    chat, _ = translate(body, counting=True)
    images = 0
    texts: list[Any] = []
    for message in chat["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            images += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image_url")
            content = [part for part in content if not (isinstance(part, dict) and part.get("type") == "image_url")]
        texts.append({**message, "content": content})
    size = len(json.dumps([texts, chat.get("tools")], ensure_ascii=False))
    return math.ceil(size / 4) + images * IMAGE_TOKENS


DIALECT = MessagesDialect()
"""The one instance the endpoint serves (``dialects.served.DIALECTS``)."""
