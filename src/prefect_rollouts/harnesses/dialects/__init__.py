"""The wire dialects the interception endpoint speaks: one module per dialect.

Each translates its requests to the endpoint's one chat-completions form for
``ProgramSession.exchange`` (reporting what the translation lost), and the recorded chat completion
back to its own response, stream and error shapes. ``endpoint.py`` serves every dialect with one route
handler. Plain data in and out: must not import Prefect, Starlette or the endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from prefect_rollouts.errors import scrub


def echo(value: Any, limit: int = 40) -> str:
    """``value`` as a 400's text shows it: its JSON (registered secrets scrubbed) when at most ``limit``
    characters, else its type and size (``a str of 43 characters``), never a cut of it: a cut of a
    secret is a prefix that no scrub recognises (a 43-character launch key was echoed as its first 39)."""
    text = scrub(json.dumps(value))
    if len(text) <= limit:
        return text
    size = f"of {len(value)} {'characters' if isinstance(value, str) else 'items'}" \
        if isinstance(value, (str, list, dict)) else f"of {len(text)} characters as JSON"
    return f"a {type(value).__name__} {size}"


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class Dialect:
    """One wire dialect of the endpoint (subclass it; ``chat.ChatDialect`` is the identity).

    Attributes:
        name: Its name on the trace (``trace.info["program_rewrites"][i]["translated"]["dialect"]``).
        paths: The routes it serves (``POST``), with and without the ``/v1`` prefix.
        alternates: Its turns alternate strictly (Anthropic Messages): a steer that lands after a user
            message joins it as a text part (``ProgramSession.exchange``).
        recorded_headers: Request headers whose values the endpoint records with the translation's
            loss (``anthropic-beta``: what the program asked for that a chat upstream does not do).
        stop_status: The HTTP status of the refusal after a stop condition (``rollout stopped: ...``):
            the one this dialect's agents end on at once, without a retry.
    """

    name: str = ""
    paths: tuple[str, ...] = ()
    alternates: bool = False
    recorded_headers: tuple[str, ...] = ()
    stop_status: int = 400

    def key(self, headers: Mapping[str, str]) -> str | None:
        """The per-launch key the request bears in this dialect's auth header (OpenAI: ``Authorization:
        Bearer``), or None."""
        return bearer(headers)

    def recorded(self, headers: Mapping[str, str], secret: str) -> dict[str, str]:
        """The values of ``recorded_headers`` the request bears (``anthropic-beta``: comma-separated
        names), scrubbed, at most 500 characters each, cut between items (a Messages upstream is sent the
        value: a name cut in two is a 400 there): an item that is a piece of ``secret`` (8 characters or
        more) is ``***`` too, so not even a prefix of the launch key reaches the trace."""
        out = {}
        for name in self.recorded_headers:
            if name in headers:
                items = [item.strip() for item in scrub(headers[name], (secret,)).split(",")]
                kept: list[str] = []
                for item in ("***" if len(item) >= 8 and item in secret else item for item in items):
                    if len(",".join([*kept, item])) > 500:
                        break
                    kept.append(item)
                out[name] = ",".join(kept)
        return out

    def to_chat(self, body: Any, upstream: str = "chat") -> tuple[Any, dict[str, Any]]:
        """``(the chat-completions request for ProgramSession.exchange, what the translation lost)``.

        ``upstream`` is the wire API the agent's client speaks (``ClientConfig.api``): a request in that
        same API carries its native fields under ``model.apis.NATIVE_KEY`` and loses nothing but the
        imposed fields; what is lost is what ``upstream`` cannot take.

        The loss report is a small dict of counts and field names (``{"ignored": ["include", ...],
        "reasoning_items": 2}``), empty when nothing was lost; it lands in
        ``trace.info["program_rewrites"]``. Parts the chat upstream cannot take are kept on the messages
        as typed parts (``trace.KEPT_PART_TYPES``) and reported here.

        Raises:
            ValueError: the body cannot be translated; its text names the field (a 400).
        """
        raise NotImplementedError

    def from_chat(self, completion: dict[str, Any], body: Any) -> dict[str, Any]:
        """This dialect's non-streamed response for the recorded ``chat.completion`` (``body``: the
        program's request as it came)."""
        raise NotImplementedError

    def events(self, response: dict[str, Any], body: Any) -> Iterator[str]:
        """This dialect's server-sent events (each a whole ``event``/``data`` block) for ``response``,
        the finished ``from_chat`` answer."""
        raise NotImplementedError

    def error(self, status: int, message: str, code: str | None = None) -> dict[str, Any]:
        """This dialect's error body (OpenAI's ``{"error": {"message", "type", "code"}}`` here)."""
        kind = "invalid_request_error" if status < 500 else "api_error"
        return {"error": {"message": message, "type": kind, "code": code}}

    def streams(self, body: Any) -> bool:
        """Whether the program asked for a stream (``"stream": true``)."""
        return isinstance(body, dict) and body.get("stream") is True
