"""How deep JSON from outside may nest, and making any value writable. Must not import Prefect.

Python's ``json`` parser and encoder recurse once per level (``RecursionError`` near 1,000 levels,
sooner on a deep stack), and pydantic-core serialises at most 255 levels (``Maximum serialization
depth exceeded``, measured with pydantic-core 2.50 here): the ``trace`` column of a row, written by
pydantic, is the shallowest writer, while the row's other JSON columns (``json.dumps``) reach about
1,000. A program's request nested 300 levels deep was answered, then its rollout had no row.
Text from outside (a program's request body in any dialect, a reward file, a model's tool
arguments) is refused past ``MAX_JSON_DEPTH`` levels (``loads``); a value already in a trace is made
writable by ``cut_deep``. A request body is also refused past ``MAX_JSON_VALUES`` values before it
is parsed (``count_values``): parsing makes about 28 times the bytes of a body of empty objects.
TOML (a config file, a ``--set`` value, a task's ``task.toml``) is held
to the same bound (``toml_loads``): ``tomllib`` recurses per level too, and a config 5,000 arrays
deep ended in a ``RecursionError`` traceback.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

MAX_JSON_DEPTH = 128
"""Levels of nesting (objects and arrays) the JSON from outside may have: serde_json's default
recursion limit. A chat request nests its deepest part, a tool's JSON Schema, tens of levels;
a trace holds a request's messages at the depth they had in the request, so whatever passes this
bound is also within pydantic-core's 255."""

MAX_JSON_VALUES = 1_000_000
"""Values (objects, arrays, keys, items) a request body may hold, counted before it is parsed: a
32 MiB body of ``{},`` parses to 11 million dicts, ~900 MB (4 such bodies took an eval to 3.5 GB
while its 128 MiB byte budget held), where a body of text parses to about its size. A chat request
of 50 messages holds about a thousand; a million parses to at most ~100 MB."""

_COUNTED = re.compile(rb'"[^"]*"?|[\[{,:]')
"""A JSON string once its escape pairs are gone (an unterminated one runs to the end: no backtracking),
or a byte counted outside strings."""


class JSONRefused(ValueError):
    """A JSON text refused for what it holds (``loads`` raises it as it is, not as ``is not JSON``);
    ``status`` is the HTTP status a request body refused so gets."""

    status = 400


class TooManyValues(JSONRefused):
    """A JSON text holding more than ``MAX_JSON_VALUES`` values (413: too large to parse)."""

    status = 413


def count_values(text: bytes, limit: int = MAX_JSON_VALUES) -> int:
    """The ``{``, ``[``, ``,`` and ``:`` outside strings in ``text``, each the start of at most one value
    or key the parser makes, or a bound above it when that is within ``limit``; counting stops past
    ``limit`` (any count over ``limit`` means too many).

    A text of at most ``limit`` bytes holds at most ``limit`` of them (nothing is counted); else the
    bytes counted anywhere (``bytes.count``, C speed) bound them; only past ``limit`` is the text
    walked, strings skipped once their escape pairs (``\\\\``, ``\\"``) are removed (both
    passes linear). The walk stops, too, where more strings than separators make the text invalid
    JSON: ``json.loads`` fails there, having made at most what was counted. Measured here
    (``benchmarks/json_values.py``, best of 5 on a loaded 2-core machine): 0.1 µs for a 25 KB chat
    request, 3 ms for 2 MiB of text; 0.1-0.7 s for the walk of 32 MiB bodies (0.4 s for ``{},``).
    """
    if len(text) <= limit:
        return len(text)
    counted = text.count(b"{") + text.count(b"[") + text.count(b",") + text.count(b":")
    if counted <= limit:
        return counted
    counted = strings = 0
    for match in _COUNTED.finditer(text.replace(b"\\\\", b"").replace(b'\\"', b"")):
        if match[0][:1] == b'"':
            strings += 1
            if strings > counted + 1:   # two strings with no separator between: invalid from here
                return counted
        else:
            counted += 1
            if counted > limit:
                return counted
    return counted
MARKER = f"<cut: nested deeper than {MAX_JSON_DEPTH} levels>"
"""What ``cut_deep`` puts in place of a value nested too deep."""

_SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate: ``json.loads`` joins a valid escaped pair into one character, so any left is alone."""

CYCLE = "<cut: a cycle>"
"""What ``cut_deep`` puts in place of a container found inside itself."""


def nests_deeper(value: Any, limit: int = MAX_JSON_DEPTH, *, shared: bool = False) -> bool:
    """Whether ``value`` (as ``json.loads`` makes it: dicts, lists, scalars; a subclass of dict or
    list is not walked) has more than ``limit`` levels of dicts and lists (``{}`` is one level,
    ``[[1]]`` two). Walks level by level, never recursing: about 17 µs for a 25 KB chat request of
    50 messages here (best of 5), against 41 µs to parse it; ``loads`` skips it for a text with
    fewer brackets than the bound. ``shared``: ``value`` may hold one container in several places
    (a cycle, Python objects from task code): each is walked once, at its shallowest place, so a
    cycle is not endless (a container shared at two depths counts at the shallower)."""
    level = [value] if value.__class__ is dict or value.__class__ is list else []
    seen: set[int] = set()
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for container in level:
            for item in (container.values() if container.__class__ is dict else container):
                if item.__class__ is dict or item.__class__ is list:   # what json.loads makes; faster than isinstance
                    if shared:
                        if id(item) in seen:
                            continue
                        seen.add(id(item))
                    below.append(item)
        level = below
    return False


def loads(text: str | bytes, what: str, *, fix: str = "", limit: int = MAX_JSON_DEPTH,
          parse_constant: Callable[[str], Any] | None = None, finite: bool = False, values: int | None = None) -> Any:
    """``json.loads(text)``, refusing nesting past ``limit`` levels without a ``RecursionError``.

    Args:
        text: The JSON text (bytes are decoded as ``json.loads`` does).
        what: What the text is, the subject of the error (e.g. ``"the request body"``).
        fix: How to mend a text nested too deep, ending its error.
        limit: Levels allowed (``MAX_JSON_DEPTH``).
        parse_constant: As ``json.loads`` (called for ``NaN``, ``Infinity``, ``-Infinity``).
        finite: Refuse a number past a float's range (``1e400`` parses to ``inf``), with a ``JSONRefused``:
            ``"a number in <what> is out of range (1e400). ..."``.
        values: With bytes, refuse a text holding more values than this before parsing it (``count_values``).

    Raises:
        ValueError: ``"<what> is not JSON (<the parser's message>)"``, or ``"<what> nests deeper
            than <limit> levels (MAX_JSON_DEPTH). <fix>"``. TooManyValues: ``"<what> holds more than
            <values> JSON values ..."``. JSONRefused: a number out of range.
    """
    if values is not None and isinstance(text, bytes) and count_values(text, values) > values:
        raise TooManyValues(f"{what} holds more than {values} JSON values (objects, arrays, keys and items: "
                            "MAX_JSON_VALUES), which would take several times its size in memory once parsed. "
                            "Send fewer values, e.g. large data as one string")
    try:
        value = json.loads(text, parse_constant=parse_constant, parse_float=_finite(what) if finite else None)
    except RecursionError:
        value = None
    except JSONRefused:
        raise
    except ValueError as exc:   # JSONDecodeError, a bad encoding, an integer past Python's digit limit
        raise ValueError(f"{what} is not JSON ({str(exc)[:200]})") from None
    else:
        brackets = (text.count(b"[") + text.count(b"{") if isinstance(text, bytes)
                    else text.count("[") + text.count("{"))   # counted at C speed: too few, no walk
        if brackets <= limit or not nests_deeper(value, limit):
            return value
    raise ValueError(f"{what} nests deeper than {limit} levels (MAX_JSON_DEPTH)" + (f". {fix}" if fix else ""))


def _finite(what: str) -> Callable[[str], float]:
    """The ``parse_float`` hook of ``loads(finite=True)``."""
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise JSONRefused(f"a number in {what} is out of range ({text[:40]}). Send numbers a 64-bit float holds "
                              "(at most 1.7e308 in size)")
        return value
    return parse


def toml_loads(text: str, what: str, *, fix: str = "", limit: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """``tomllib.loads(text)``, refusing nesting past ``limit`` levels without a ``RecursionError``.

    Tables, dotted keys, arrays and inline tables all count (``a.b = [1]`` is three levels);
    the parsed document is always walked (``nests_deeper``), since dotted keys nest without brackets.

    Raises:
        tomllib.TOMLDecodeError: ``text`` is not TOML, as ``tomllib`` says.
        ValueError: ``"<what> nests deeper than <limit> levels (MAX_JSON_DEPTH). <fix>"``.
    """
    try:
        value = tomllib.loads(text)
    except RecursionError:
        pass
    else:
        if not nests_deeper(value, limit):
            return value
    raise ValueError(f"{what} nests deeper than {limit} levels (MAX_JSON_DEPTH)" + (f". {fix}" if fix else ""))


def cut_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> tuple[Any, int]:
    """A copy of ``value`` that ``json.dumps`` and pydantic can write: what lies deeper than
    ``limit`` levels becomes ``MARKER``, pydantic models become dicts of their fields, tuples and
    sets lists, keys other than str, int, float, bool and None their ``repr``, and any other object
    its ``repr``; a container inside itself (a cycle) becomes ``CYCLE``; a lone UTF-16 surrogate in a
    string or key (valid JSON, but no UTF-8 writer, pydantic's included, takes it) becomes U+FFFD.

    Returns:
        ``(copy, places cut)``.
    """
    cuts = 0
    path: set[int] = set()   # the containers being copied, outermost to here

    def copy(item: Any, depth: int) -> Any:
        nonlocal cuts
        if isinstance(item, str):
            return _SURROGATE.sub("\ufffd", item)
        if item is None or isinstance(item, (int, float, bool)):
            return item
        if depth >= limit or id(item) in path:
            cuts += 1
            return MARKER if depth >= limit else CYCLE
        path.add(id(item))
        try:
            if isinstance(item, BaseModel):
                return copy({name: getattr(item, name) for name in type(item).model_fields}, depth)
            if isinstance(item, dict):
                return {(copy(key, depth) if key is None or isinstance(key, (str, int, float, bool)) else repr(key)):
                        copy(child, depth + 1) for key, child in item.items()}
            if isinstance(item, (list, tuple, set, frozenset)):
                return [copy(child, depth + 1) for child in item]
            return repr(item)
        finally:
            path.discard(id(item))

    return copy(value, 0), cuts
