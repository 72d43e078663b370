"""OpenAI chat completions, the endpoint's own form: the translation is the identity.

``ProgramSession.exchange`` checks the request (``session._Request``) and answers a ``chat.completion``;
this dialect passes both through and streams the answer as ``chat.completion.chunk`` events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from prefect_rollouts.harnesses.dialects import Dialect
from prefect_rollouts.model.apis import messages as messages_api
from prefect_rollouts.model.apis.base import NATIVE_KEY


class ChatDialect(Dialect):
    """``POST /v1/chat/completions`` (and ``/chat/completions``), bearer key, OpenAI errors."""

    name = "chat"
    paths = ("/v1/chat/completions", "/chat/completions")

    def to_chat(self, body: Any, upstream: str = "chat") -> tuple[Any, dict[str, Any]]:
        """The body itself (``exchange`` checks it) and no loss; a body bearing ``NATIVE_KEY`` has it
        removed (only a translating dialect sets it: a program must not choose another API's native
        fields), and the removal is the loss (``{"ignored": ["_native"]}``). To a Messages upstream, the
        keys it has no field for (``seed``, ``response_format``, ...: ``model.apis.messages.unsent``) are
        lost too."""
        ignored = messages_api.unsent(body) if upstream == "messages" and isinstance(body, dict) else []
        if isinstance(body, dict) and NATIVE_KEY in body:
            body = {key: value for key, value in body.items() if key != NATIVE_KEY}
            ignored = sorted([*ignored, NATIVE_KEY])
        return body, {"ignored": ignored} if ignored else {}

    def from_chat(self, completion: dict[str, Any], body: Any) -> dict[str, Any]:
        """The completion itself."""
        return completion

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
