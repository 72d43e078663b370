"""Server-sent events (``text/event-stream``) as ``(event name, data)`` pairs, for a streamed model response.

The event-stream interpretation of the WHATWG HTML standard (9.2.6), cut to what a model API sends: lines
(httpx's ``aiter_lines`` splits them on ``\\r\\n``, ``\\n`` or ``\\r``) gather ``event:`` and ``data:`` fields
(several ``data`` lines joined with ``\\n``; one space after the colon dropped); a blank line dispatches
the event; a line starting with ``:`` is a comment (a keep-alive); ``id``, ``retry`` and unknown fields
are ignored; an event without data is not dispatched. No runtime dependency ships a parser (httpx has
none; the OpenAI and Anthropic SDKs' are private and test-only here), so this is ours, tested in
tests/core/test_streaming.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterable

MAX_STREAM_CHARS = 64 * 1024 * 1024
"""Characters of one streamed response read at most (64 Mi: past any real answer); past it the stream is
malformed (``ValueError``), so a server that never ends its stream cannot grow this process's memory."""


async def read_events(lines: AsyncIterable[str], limit: int = MAX_STREAM_CHARS) -> list[tuple[str, str]]:
    """Every event of ``lines`` in order, as ``(event name, data text)`` (name ``""`` where none was
    given). A last event without its closing blank line is dispatched too (the stream ended).

    Raises:
        ValueError: the stream is longer than ``limit`` characters.
    """
    events: list[tuple[str, str]] = []
    name, size = "", 0
    data: list[str] = []
    async for line in lines:
        size += len(line) + 1
        if size > limit:
            raise ValueError(f"the event stream is longer than {limit} characters (MAX_STREAM_CHARS)")
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if data:
        events.append((name, "\n".join(data)))
    return events
