"""OpenAI chat completions (``api = "chat"``): ``POST {base_url}/chat/completions``, ``Authorization:
Bearer``; what every OpenAI-compatible server (vLLM, llama.cpp, gateways) speaks.

The trace's messages are in this API's form already; typed parts only another API takes are left out
(``model.wire.chat_messages``), as are native fields of another API (``NATIVE_KEY``).
"""

from __future__ import annotations

from typing import Any

from prefect_rollouts.model.apis.base import NATIVE_KEY, WireApi
from prefect_rollouts.model.completion import Completion, count, detail
from prefect_rollouts.model.wire import chat_messages


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


API = ChatApi()
