"""Server-sent events (``text/event-stream``) as ``(event name, data)`` pairs, for a streamed model response.

The event-stream interpretation of the WHATWG HTML standard (9.2.6), cut to what a model API sends: lines
(``text_lines`` splits them on ``\\r\\n``, ``\\n`` or ``\\r``, as httpx's ``aiter_lines`` does) gather
``event:`` and ``data:`` fields (several ``data`` lines joined with ``\\n``; one space after the colon
dropped); a blank line dispatches the event; a line starting with ``:`` is a comment (a keep-alive); ``id``,
``retry`` and unknown fields are ignored; an event without data is not dispatched. No runtime dependency ships
a parser (httpx has none; the OpenAI and Anthropic SDKs' are private and test-only here), so this is ours,
tested in tests/core/test_streaming.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator

MAX_STREAM_CHARS = 64 * 1024 * 1024
"""Characters of one streamed response read at most (64 Mi: past any real answer); past it the stream is
malformed (``ValueError``), so a server that never ends its stream cannot grow this process's memory."""


_BREAK = re.compile(r"\r\n|\r|\n")


async def text_lines(chunks: AsyncIterable[str], limit: int = MAX_STREAM_CHARS) -> AsyncIterator[str]:
    """The lines of the text ``chunks`` (a response's ``aiter_text()``), ended by ``\\r\\n``, ``\\n`` or ``\\r``.

    Counts the characters as they arrive, so a line that never ends is refused at ``limit`` with at most
    one chunk more in memory (httpx's ``aiter_lines`` kept a 200 MB line without a newline whole before
    ``read_events`` could count it: 430 MB resident).

    Raises:
        ValueError: the chunks hold more than ``limit`` characters.
    """
    pieces: list[str] = []   # the line being read (a list: += on a long line would copy it every chunk)
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise ValueError(f"the event stream is longer than {limit} characters (MAX_STREAM_CHARS)")
        if not _BREAK.search(chunk):
            pieces.append(chunk)
            continue
        text = "".join(pieces) + chunk
        held = text.endswith("\r")   # its \n may open the next chunk
        parts = _BREAK.split(text[:-1] if held else text)
        rest = parts.pop()
        for line in parts:
            yield line
        pieces = [rest + "\r"] if held else [rest]
    parts = _BREAK.split("".join(pieces))
    rest = parts.pop()
    for line in parts:
        yield line
    if rest:
        yield rest


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
