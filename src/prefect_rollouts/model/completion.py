"""One parsed model response (``Completion``), whatever wire API it came over, and the rules for its
token counts (``count``, ``USAGE_MAX``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from prefect_rollouts.errors import scrub


@dataclass(slots=True)
class Completion:
    """One parsed response, whatever wire API it came over (``model.apis``): the assistant ``message``
    in the trace's message format (chat-completions form; what only its own API can take kept as typed
    parts, ``trace.KEPT_PART_TYPES``) and its bookkeeping.

    Token counts are normalised to chat completions' meaning: ``prompt_tokens`` is every input token
    (cache reads and writes included, as OpenAI counts them; Anthropic's ``input_tokens`` leaves them
    out, so its API adds them), ``completion_tokens`` every output token (reasoning included).
    ``cached_tokens`` (input read from a prompt cache), ``cache_write_tokens`` (input written to one:
    Anthropic's ``cache_creation_input_tokens``) and ``reasoning_tokens`` are None when the server does
    not report them. ``attempts`` lists the failed attempts before this response, in order:
    ``{"status_code": int, "error": str}``.
    """

    message: dict[str, Any]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    retries: int
    status_code: int
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_write_tokens: int | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    usage_note: str | None = None
    """What was wrong with the response's ``usage`` (none reported, a negative, huge or non-integer
    count: ``USAGE_MAX``); such a count is unknown and counted as 0. None: the usage was whole."""


USAGE_MAX = 10**9
"""The largest token count one call's ``usage`` field may report (a billion: a thousand times the largest
context windows); a larger one, a negative or a non-integer one is unknown (``Completion.usage_note``)."""


def count(value: Any, where: str, notes: list[str]) -> int | None:
    """``value`` as a token count: a whole number from 0 to ``USAGE_MAX``; None (and a note naming
    ``where``, e.g. ``usage.prompt_tokens``, and the value scrubbed of secrets then cut to 40 characters)
    otherwise; None without a note when ``value`` is None."""
    if value is None:
        return None
    if (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            and value == int(value) and 0 <= value <= USAGE_MAX):
        return int(value)
    shown = scrub(str(value))[:40]   # the provider's text: a key echoed there is scrubbed before the cut
    notes.append(f"{where} = {shown}: not a whole number from 0 to {USAGE_MAX:,}, counted as 0")
    return None


def detail(usage: dict[str, Any], group: str, key: str) -> int | None:
    """``usage[group][key]`` as an int; None when absent or not a valid count (the details are optional)."""
    details = usage.get(group)
    value = details.get(key) if isinstance(details, dict) else None
    return count(value, f"usage.{group}.{key}", [])
