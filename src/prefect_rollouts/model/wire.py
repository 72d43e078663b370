"""What the chat-completions client sends of the trace's messages.

The trace keeps typed parts that only another wire dialect can use (``trace.KEPT_PART_TYPES`` and
``KEPT_PART_KEYS``, the ``trace`` module's docstring); a chat-completions request leaves them out.
"""

from __future__ import annotations

from typing import Any

from prefect_rollouts.trace import KEPT_PART_KEYS, KEPT_PART_TYPES


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as a chat-completions request takes them: content parts of a kept type dropped,
    kept keys removed from the others; a content list left with text parts only is joined into a
    string (``""`` when nothing is left), as every chat server takes a string.

    Returns the same list when no message holds a kept part or key (the common case: one pass over
    the messages, no copy); else a new list, the caller's messages never mutated.
    """
    out: list[dict[str, Any]] | None = None
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(
                isinstance(part, dict) and (_kept(part) or not KEPT_PART_KEYS.isdisjoint(part))
                for part in content):
            if out is not None:
                out.append(message)
            continue
        if out is None:
            out = list(messages[:index])
        parts = [{key: value for key, value in part.items() if key not in KEPT_PART_KEYS}
                 if isinstance(part, dict) else part
                 for part in content if not (isinstance(part, dict) and _kept(part))]
        if all(isinstance(part, dict) and part.get("type") == "text" for part in parts):
            out.append({**message, "content": "".join(str(part.get("text", "")) for part in parts)})
        else:
            out.append({**message, "content": parts})
    return messages if out is None else out


def _kept(part: dict[str, Any]) -> bool:
    """Whether ``part`` is of a kept type (a ``type`` that is not a string is none: no ``unhashable type``)."""
    kind = part.get("type")
    return isinstance(kind, str) and kind in KEPT_PART_TYPES
