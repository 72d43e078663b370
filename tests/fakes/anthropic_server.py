"""Scripted Anthropic Messages server for tests (real sockets, 127.0.0.1): ``ScriptedOpenAIServer``'s
machinery (script, steps, recording, ``delayed``/``gathered``/``status``) on ``POST /v1/messages``.

The OpenAI steps answer in Messages' shape (``reply`` -> a text block, ``tool_call(s)`` -> ``tool_use``
blocks with ``toolu_`` ids; ``stop`` -> ``end_turn``, ``length`` -> ``max_tokens``, ``tool_calls`` ->
``tool_use``); ``message(*blocks)`` answers the blocks given (``thinking`` blocks with signatures, ...).
A request with ``"stream": true`` is answered with the event stream the Anthropic SDKs parse
(``thinking_delta`` and ``signature_delta`` included). A ``status`` step's default body is Anthropic's
error shape. ``POST /v1/messages/count_tokens`` answers an estimate and consumes no step.

    with ScriptedAnthropicServer() as server:
        server.play([message(thinking("ls first", "c2ln"), tool_use("Bash", command="ls")), reply("done")])
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from tests.fakes.openai_server import RecordedRequest, Response, ScriptedOpenAIServer, _json, _Reply

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               529: "overloaded_error"}

_STOPS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


@dataclass(frozen=True)
class _Message:
    blocks: tuple[dict[str, Any], ...]
    stop_reason: str
    usage: dict[str, Any] | None = None


def message(*blocks: dict[str, Any], stop_reason: str | None = None, usage: dict[str, Any] | None = None) -> _Message:
    """A 200 message of ``blocks`` as given (``stop_reason``: ``tool_use`` when one is a tool_use block,
    else ``end_turn``); ``usage`` sent as given (default: 10 input tokens per request message)."""
    stop = stop_reason or ("tool_use" if any(b.get("type") == "tool_use" for b in blocks) else "end_turn")
    return _Message(blocks, stop, usage)


def thinking(text: str, signature: str) -> dict[str, Any]:
    """A ``thinking`` block."""
    return {"type": "thinking", "thinking": text, "signature": signature}


def tool_use(name: str, id: str = "toolu_01scripted", /, **arguments: Any) -> dict[str, Any]:
    """A ``tool_use`` block."""
    return {"type": "tool_use", "id": id, "name": name, "input": arguments}


class ScriptedAnthropicServer(ScriptedOpenAIServer):
    """Anthropic Messages server in a daemon thread, answering from a script of steps."""

    path = "/v1/messages"

    def _handle(self, request: RecordedRequest) -> Response:
        if request.path == "/v1/messages/count_tokens":
            with self._lock:
                self.requests.append(request)
            return _json(200, {"input_tokens": len(json.dumps(request.body)) // 4})
        return super()._handle(request)

    def _error_body(self, code: int) -> dict[str, Any]:
        kind = ERROR_TYPES.get(code, "api_error" if code >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": f"scripted {code}"}}

    def _respond(self, step: Any, request: RecordedRequest) -> Response:
        while callable(step):
            step = step(request)
        if isinstance(step, _Message):
            return self._message(list(step.blocks), step.stop_reason, step.usage, request, "scripted")
        return super()._respond(step, request)

    def _answer(self, step: _Reply, request: RecordedRequest) -> Response:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": step.content}] if step.content else []
        blocks += [{"type": "tool_use", "id": f"toolu_{self._next_id('call'):024d}", "name": name,
                    "input": json.loads(arguments)} for name, arguments in step.calls]
        return self._message(blocks, _STOPS.get(step.finish_reason, step.finish_reason), step.usage, request,
                             step.model)

    def _message(self, blocks: list[dict[str, Any]], stop: str, usage: dict[str, Any] | None,
                 request: RecordedRequest, model: str) -> Response:
        text = " ".join(str(block.get("text", "")) for block in blocks)
        body = {"id": f"msg_{self._next_id('msg'):024d}", "type": "message", "role": "assistant", "model": model,
                "content": blocks, "stop_reason": stop, "stop_sequence": None,
                "usage": usage or {"input_tokens": 10 * len(request.messages),
                                   "output_tokens": max(1, len(text.split())),
                                   "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        if request.body.get("stream") is True:
            return 200, {"Content-Type": "text/event-stream"}, "".join(events(body)).encode()
        return _json(200, body, {"request-id": f"req_{int(time.time())}"})


def events(body: dict[str, Any]) -> list[str]:
    """The server-sent events of a finished ``message`` as Anthropic streams it: ``message_start`` (usage
    so far), ``ping``, per block ``content_block_start`` / deltas / ``content_block_stop``, then
    ``message_delta`` (stop reason, output usage) and ``message_stop``."""
    def sse(kind: str, data: dict[str, Any]) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

    usage = body["usage"]
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}
    out = [sse("message_start", {"message": start}), sse("ping", {})]
    for index, block in enumerate(body["content"]):
        kind = block["type"]
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        elif kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": block["signature"]}]
        elif kind == "tool_use":
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        else:   # redacted_thinking and server blocks arrive whole
            opened = block
        out.append(sse("content_block_start", {"index": index, "content_block": opened}))
        out += [sse("content_block_delta", {"index": index, "delta": delta}) for delta in deltas]
        out.append(sse("content_block_stop", {"index": index}))
    out.append(sse("message_delta", {"delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                                     "usage": {"output_tokens": usage["output_tokens"]}}))
    out.append(sse("message_stop", {}))
    return out
