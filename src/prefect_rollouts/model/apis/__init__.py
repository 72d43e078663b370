"""The wire APIs the model client speaks to a provider: one module per API.

``ClientConfig.api`` names one: ``"chat"`` (OpenAI chat completions, and every server compatible with
it), ``"responses"`` (OpenAI Responses) or ``"messages"`` (Anthropic Messages). Each turns the client's
one request form (a chat-completions body whose messages are the trace's, typed parts included) into
its own request, says where it goes and how it authenticates, and parses its own response back into a
``Completion`` in the trace's message format. Plain data in and out: no HTTP here (``model.client``
posts), no Prefect.

A request the interception endpoint received in the client's own API carries that request's native
fields under ``NATIVE_KEY`` (``{"api": name, "params": {...}}``: the top-level fields chat completions
has no place for, e.g. Anthropic's ``thinking``); an API uses them only when the names match, and every
API leaves the key out of what it sends.
"""

from __future__ import annotations

from prefect_rollouts.model.apis import chat, messages, responses
from prefect_rollouts.model.apis.base import API_NAMES, NATIVE_KEY, ApiName, WireApi, retry_after_header

__all__ = ["API_NAMES", "NATIVE_KEY", "ApiName", "WireApi", "retry_after_header", "wire_api"]


def wire_api(name: str) -> WireApi:
    """The ``WireApi`` called ``name`` (one of ``API_NAMES``; ``ClientConfig`` validates it)."""
    apis: dict[str, WireApi] = {"chat": chat.API, "responses": responses.API, "messages": messages.API}
    try:
        return apis[name]
    except KeyError:
        raise ValueError(f"api = {name!r}: not a wire API this client speaks ({', '.join(API_NAMES)})") from None
