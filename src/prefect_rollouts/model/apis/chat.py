"""OpenAI chat completions (``api = "chat"``): ``POST {base_url}/chat/completions``, ``Authorization:
Bearer``; what every OpenAI-compatible server (vLLM, llama.cpp, gateways) speaks.

The trace's messages are in this API's form already; typed parts only another API takes are left out
(``model.wire.chat_messages``), as are native fields of another API (``NATIVE_KEY``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_rollouts.model.apis.base import NATIVE_KEY, WireApi
from prefect_rollouts.model.apis.responses import openai_retry_after
from prefect_rollouts.model.completion import Completion, count, detail
from prefect_rollouts.model.wire import chat_messages
from prefect_rollouts.nesting import loads


class ChatApi(WireApi):
    """OpenAI chat completions."""

    name = "chat"
    path = "/chat/completions"

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` less ``NATIVE_KEY``, its messages as chat completions takes them (``chat_messages``:
        the same list when nothing is to leave out, else a copy)."""
        messages = body.get("messages")
        sent = chat_messages(messages) if isinstance(messages, list) else messages
        if sent is messages and NATIVE_KEY not in body:
            return body
        out = {key: value for key, value in body.items() if key != NATIVE_KEY}
        out["messages"] = sent
        return out

    def parse(self, data: Any, retries: int, status_code: int) -> Completion:
        """The first choice of a ``chat.completion`` body; usage from ``usage.prompt_tokens``,
        ``completion_tokens`` and their ``*_details`` (``cached_tokens``, ``reasoning_tokens``)."""
        choice = data["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError(f"choices[0].message is {type(message).__name__}, not an object")
        usage = data.get("usage") or {}
        if not isinstance(usage, dict):
            raise TypeError(f"usage is {type(usage).__name__}, not an object")
        notes = [] if usage else ["the response reported no usage"]
        prompt, completion = (count(usage.get(key), f"usage.{key}", notes)
                              for key in ("prompt_tokens", "completion_tokens"))
        return Completion(message=message, finish_reason=choice.get("finish_reason"),
                          prompt_tokens=prompt or 0, completion_tokens=completion or 0,
                          retries=retries, status_code=status_code,
                          cached_tokens=detail(usage, "prompt_tokens_details", "cached_tokens"),
                          reasoning_tokens=detail(usage, "completion_tokens_details", "reasoning_tokens"),
                          usage_note="; ".join(notes) or None)

    def streamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with ``"stream": true`` and ``stream_options.include_usage`` (without it a chat stream
        reports no usage)."""
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        return {**body, "stream": True, "stream_options": {**options, "include_usage": True}}

    def parse_events(self, events: list[tuple[str, str]], retries: int, status_code: int) -> Completion:
        """The ``Completion`` of a ``chat.completion.chunk`` stream: the first choice's ``delta`` content
        (and ``refusal``) joined, tool calls assembled by ``index`` (``id`` as given, ``name`` and
        ``arguments`` joined), the last ``finish_reason``, the ``usage`` chunk's usage; ``[DONE]`` ends it.
        A chunk holding ``error`` raises ``ValueError`` with its message."""
        text: list[str] = []
        refusal: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish, usage = None, None
        for _, data_text in events:
            if data_text.strip() == "[DONE]":
                break
            chunk = loads(data_text, "a chunk")
            if chunk.get("error") is not None:
                error = chunk["error"]
                raise ValueError(f"the stream failed: {error.get('message') if isinstance(error, dict) else error}")
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    text.append(delta["content"])
                if isinstance(delta.get("refusal"), str):
                    refusal.append(delta["refusal"])
                for part in delta.get("tool_calls") or []:
                    call = calls.setdefault(int(part.get("index", len(calls))), {
                        "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    call["id"] = part.get("id") or call["id"]
                    function = part.get("function") or {}
                    call["function"]["name"] += function.get("name") or ""
                    call["function"]["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or (None if calls else "")}
        if calls:
            message["tool_calls"] = [calls[index] for index in sorted(calls)]
        if refusal:
            message["refusal"] = "".join(refusal)
        return self.parse({"choices": [{"message": message, "finish_reason": finish}], "usage": usage},
                          retries, status_code)

    def retry_after(self, headers: Mapping[str, str]) -> float | None:
        """``responses.openai_retry_after`` (``retry-after-ms``, ``Retry-After``, ``x-ratelimit-reset-*``):
        OpenAI's headers; a server that sends none of them gets the plain ``Retry-After`` rule."""
        return openai_retry_after(headers)


API = ChatApi()
