"""The ``WireApi`` interface every wire API implements (``model.apis``), and ``NATIVE_KEY``."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any, Literal

from prefect_rollouts.model.completion import Completion

ApiName = Literal["chat", "responses", "messages"]

#: The wire APIs, in the order the docs list them.
API_NAMES: tuple[ApiName, ...] = ("chat", "responses", "messages")

NATIVE_KEY = "_native"
"""Key of a request body holding the program's native request fields (``model.apis``' docstring); never sent."""

IMPOSED_KEYS = "imposed"
"""Key of ``NATIVE_KEY`` listing the chat-form keys the rollout imposed (``harnesses.base.request_template``:
model, sampling, ``sampling.extra``): a wire API lets no native field of the program over them, nor over the
native field each maps to (``reasoning_effort`` -> Responses ``reasoning.effort``, ``tool_choice``...)."""


def imposed_keys(native: Mapping[str, Any]) -> frozenset[str]:
    """``IMPOSED_KEYS`` of ``native`` (a ``NATIVE_KEY`` dict) as a set; empty when absent or malformed."""
    keys = native.get(IMPOSED_KEYS)
    return frozenset(key for key in keys if isinstance(key, str)) if isinstance(keys, list) else frozenset()


class WireApi:
    """One wire API (subclass it; ``chat.ChatApi`` is the reference).

    Attributes:
        name: Its ``ClientConfig.api`` value.
        path: Appended to ``ClientConfig.base_url`` for every request (``/chat/completions``).
    """

    name: ApiName
    path: str

    def auth_headers(self, key: str | None) -> dict[str, str]:
        """The headers that carry ``key`` (none without a key): ``Authorization: Bearer <key>`` here."""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request_headers(self, body: Mapping[str, Any]) -> dict[str, str]:
        """Headers this request adds to ``auth_headers`` (the client's request form ``body``, before
        ``request``): none here; Messages sends the program's ``anthropic-beta`` from ``NATIVE_KEY``."""
        return {}

    def request(self, body: dict[str, Any]) -> dict[str, Any]:
        """This API's request body for ``body`` (a chat-completions request whose messages are the
        trace's). Must not mutate ``body`` or its messages. Raises ``ValueError`` (its text names the
        field) for what this API cannot express."""
        raise NotImplementedError

    def streamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` (this API's request) asking for a stream (``ClientConfig.stream``): ``"stream": true``
        here; a copy, ``body`` unchanged."""
        return {**body, "stream": True}

    def unsent_keys(self, body: dict[str, Any]) -> list[str]:
        """The top-level keys of ``body`` (a chat-completions request) this API has no place for and does
        not send, sorted: the endpoint records them as lost for a program whose request is translated to it
        (none here)."""
        return []

    def parse(self, data: Any, retries: int, status_code: int) -> Completion:
        """The ``Completion`` of a 2xx response body ``data`` (decoded JSON). Raises ``ValueError``,
        ``KeyError``, ``IndexError``, ``TypeError`` or ``AttributeError`` on any shape error (the client
        reports a malformed body, 502)."""
        raise NotImplementedError

    def parse_events(self, events: list[tuple[str, str]], retries: int, status_code: int) -> Completion:
        """The ``Completion`` of a streamed 2xx response (``ClientConfig.stream``): its server-sent
        events as ``(event name, data text)`` pairs, in order (the name ``""`` where none was given).
        Raises as ``parse`` does on any shape error."""
        raise NotImplementedError

    def retry_after(self, headers: Mapping[str, str]) -> float | None:
        """Seconds the provider asks to wait before a retry (``Retry-After``: delta-seconds or an HTTP
        date); None when it says nothing usable."""
        return retry_after_header(headers.get("retry-after"))


def retry_after_header(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header value (delta-seconds or an HTTP date, RFC 9110 10.2.3);
    None if absent or unreadable; never negative."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def requested_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds a provider's response asks to wait, as both SDKs read it first: ``retry-after-ms``
    (milliseconds), else ``Retry-After`` (``retry_after_header``); None when neither says anything usable."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    return retry_after_header(headers.get("retry-after"))
