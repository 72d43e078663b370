"""OpenAI chat completions, the endpoint's own form: the translation is the identity.

``ProgramSession.exchange`` checks the request (``session._Request``) and answers a ``chat.completion``;
this dialect passes both through and streams the answer as ``chat.completion.chunk`` events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from prefect_rollouts.harnesses.dialects import Dialect
from prefect_rollouts.model.apis import wire_api
from prefect_rollouts.model.apis.base import NATIVE_KEY
from prefect_rollouts.trace import KEPT_MESSAGE_KEYS


class ChatDialect(Dialect):
    """``POST /v1/chat/completions`` (and ``/chat/completions``), bearer key, OpenAI errors."""

    name = "chat"
    paths = ("/v1/chat/completions", "/chat/completions")

    def to_chat(self, body: Any, upstream: str = "chat") -> tuple[Any, dict[str, Any]]:
        """The body itself (``exchange`` checks it) and no loss; a body bearing ``NATIVE_KEY`` has it
        removed (only a translating dialect sets it: a program must not choose another API's native
        fields), and the removal is the loss (``{"ignored": ["_native"]}``). To another ``upstream`` API,
        the keys it has no place for (``WireApi.unsent_keys``: ``seed``, ``stop``... for Responses) are
        the loss too."""
        if not isinstance(body, dict):
            return body, {}
        ignored = [NATIVE_KEY] if NATIVE_KEY in body else []
        if upstream != self.name:
            ignored += wire_api(upstream).unsent_keys(body)
        if NATIVE_KEY in body:
            body = {key: value for key, value in body.items() if key != NATIVE_KEY}
        return body, ({"ignored": sorted(ignored)} if ignored else {})

    def from_chat(self, completion: dict[str, Any], body: Any) -> dict[str, Any]:
        """The completion itself; from another upstream API, what is kept for it alone left out: a
        content list (reasoning items, thinking blocks beside the text) is its text parts' text, and
        ``trace.KEPT_MESSAGE_KEYS`` are removed from the message and its tool calls."""
        message = completion["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if not isinstance(message.get("content"), list) and KEPT_MESSAGE_KEYS.isdisjoint(message) and all(
                KEPT_MESSAGE_KEYS.isdisjoint(call) for call in calls):
            return completion
        clean = {key: value for key, value in message.items() if key not in KEPT_MESSAGE_KEYS}
        if isinstance(message.get("content"), list):
            clean["content"] = "".join(str(part.get("text", "")) for part in message["content"]
                                       if isinstance(part, dict) and part.get("type") == "text")
        if calls:
            clean["tool_calls"] = [{key: value for key, value in call.items() if key not in KEPT_MESSAGE_KEYS}
                                   for call in calls]
        return {**completion, "choices": [{**completion["choices"][0], "message": clean}]}

    def events(self, response: dict[str, Any], body: Any) -> Iterator[str]:
        """``sse_events``, with the usage chunk when the body asked (``stream_options.include_usage``)."""
        options = body.get("stream_options") if isinstance(body, dict) else None
        return sse_events(response, bool(isinstance(options, dict) and options.get("include_usage")))


def sse_events(completion: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A recorded ``chat.completion`` as the ``chat.completion.chunk`` server-sent events a streaming
    client expects: the role and content, one chunk per tool call, the finish reason, the usage
    (when asked with ``stream_options.include_usage``) and ``[DONE]``."""
    choice = completion["choices"][0]
    message, base = choice["message"], {key: completion[key] for key in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        event = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(event)}\n\n"

    yield chunk({"role": "assistant", "content": message.get("content") or ""})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, choice.get("finish_reason"))
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': completion.get('usage')})}\n\n"
    yield "data: [DONE]\n\n"


DIALECT = ChatDialect()
