"""Reading a program's request body at the interception endpoint, for the route of every dialect
(``read_json``): the JSON bounds of ``nesting.loads``, then one walk over its strings and keys that
refuses a lone UTF-16 surrogate and replaces the launch key. Must not import Prefect.

A lone surrogate (``"a\\ud800b"``) is valid JSON that no UTF-8 writer takes: the model client failed to
encode it (a 500 with a traceback) and the trace holding it could not be written. The launch key is
scrubbed from every string and key of the parsed body (tool call ids, tool names, signatures, a loss
report's keys...), not only the message text, so it never reaches upstream or the trace.
"""

from __future__ import annotations

import re
from typing import Any

from prefect_rollouts.errors import scrub
from prefect_rollouts.nesting import MAX_JSON_DEPTH, MAX_JSON_VALUES, JSONRefused, loads

_SURROGATE = re.compile("[\ud800-\udfff]")
"""A surrogate code point in a parsed string: ``json.loads`` joins a valid pair into one character,
so any left is alone."""


def read_json(raw: bytes, secret: str | None = None) -> Any:
    """The JSON of a request body, for the route of every dialect: ``NaN`` and ``Infinity`` refused
    (not JSON, and they cannot be sent upstream), and so is a number that overflows a float
    (``1e400`` was ``inf``, which httpx failed to send: a 500); nesting past ``nesting.MAX_JSON_DEPTH``
    refused without a ``RecursionError`` (a 100,000-level body was a 500 with a traceback); more than
    ``nesting.MAX_JSON_VALUES`` values refused before parsing (32 MiB of ``{},`` parsed to ~900 MB);
    a lone UTF-16 surrogate refused (no UTF-8 writer takes it). ``secret`` (the launch key) is replaced
    by ``***`` in every string and key (``errors.scrub``). The walk runs only when the bytes could hold
    either (a ``\\u`` escape, a UTF-8 lead byte ``0xED``, a non-UTF-8 encoding, or the key's bytes):
    measured on a 52 KB chat request of 50 messages (``benchmarks/endpoint_body.py``, best of 5 on a
    loaded 2-core machine), 131 µs to read without the walk (``nesting.loads`` alone: 71 µs), 323 µs
    with it.

    Raises:
        ValueError: the text of the 400 that refuses it (``the request body is not JSON (...)``,
            ``the request body nests deeper than 128 levels ...``, ``a number in the request body is
            out of range (1e400)``, ``the request body holds a lone UTF-16 surrogate (\\ud800) ...``);
            a ``nesting.TooManyValues`` (``status`` 413) past the values.
    """
    body = loads(raw, "the request body", parse_constant=_no_constant, finite=True, values=MAX_JSON_VALUES,
                 fix=f"Send a body nested at most {MAX_JSON_DEPTH} levels deep")
    if (b"\\u" in raw or b"\xed" in raw or b"\x00" in raw[:4]
            or (secret is not None and secret.encode() in raw)):
        body = clean(body, secret)
    return body


def clean(body: Any, secret: str | None) -> Any:
    """``body`` (as ``json.loads`` makes it) with ``secret`` scrubbed from every string and dict key,
    in place where it can (the top value is returned, replaced when it is a string); one walk, no
    recursion.

    Raises:
        JSONRefused: a string or key holds a lone surrogate (the 400's text names it).
    """
    def text(value: str) -> str:
        if (match := _SURROGATE.search(value)) is not None:
            raise JSONRefused(f"the request body holds a lone UTF-16 surrogate (\\u{ord(match[0]):04x}), "
                              "which is not text and cannot be sent upstream or recorded. Send valid "
                              "Unicode (a surrogate escape only as a high-low pair)")
        return scrub(value, (secret,)) if secret and secret in value else value

    if isinstance(body, str):
        return text(body)
    stack = [body] if isinstance(body, (dict, list)) else []
    while stack:
        container = stack.pop()
        if isinstance(container, list):
            for index, item in enumerate(container):
                if isinstance(item, str):
                    container[index] = text(item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
            continue
        items = list(container.items())
        if any(text(key) is not key for key, _ in items):   # a key changed: rebuild in order
            container.clear()
            container.update((text(key), value) for key, value in items)
        for key, item in container.items():
            if isinstance(item, str):
                container[key] = text(item)
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return body


def _no_constant(name: str) -> Any:
    """``json.loads`` takes NaN and Infinity, which are not JSON and cannot be sent upstream."""
    raise ValueError(f"{name} is not a JSON number")
