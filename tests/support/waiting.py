"""Waits on what a test can observe (a row written, a run recorded, a process gone) instead of a
fixed sleep: each returns as soon as the condition holds, and gives up at its bound.

A wait that gives up raises ``WaitTimeout`` (an ``AssertionError``, so pytest shows it as a failed
expectation) saying what it waited for, for how long, and what the last check returned:

    wait_until(lambda: durable_rows(root) >= 2, timeout_s=120, what="two durable rows")
    -> WaitTimeout: waited 120 s for two durable rows; the last check returned False

``what`` defaults to a lambda's source line, else the predicate's name. ``assert wait_until(...)``
reads as the expectation (the value returned is the predicate's, always truthy). A wait whose
time-out is an outcome the test goes on to judge uses ``poll_until``, which returns the last value.
"""

from __future__ import annotations

import asyncio
import inspect
import select
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import IO, TypeVar

T = TypeVar("T")
What = str | Callable[[], str] | None


class WaitTimeout(AssertionError):
    """A bounded wait gave up; the message names what it waited for, the bound, and the last value."""


def poll_until(predicate: Callable[[], T], timeout_s: float = 20.0, interval_s: float = 0.2) -> T:
    """Call ``predicate`` until it returns a truthy value or ``timeout_s`` passed; return its last value
    (falsy on a time-out, with no error: for a wait whose outcome the test judges itself)."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(interval_s)
    return value


def wait_until(predicate: Callable[[], T], timeout_s: float = 20.0, interval_s: float = 0.2, *,
               what: What = None) -> T:
    """Call ``predicate`` every ``interval_s`` seconds until it returns a truthy value, and return that.

    Raises:
        WaitTimeout: ``timeout_s`` passed with the value still falsy; the message says ``what`` (by
            default the predicate's source; a callable is called then, to say what the test saw) and
            the last value.
    """
    value = poll_until(predicate, timeout_s, interval_s)
    if not value:
        raise WaitTimeout(_gave_up(predicate, what, timeout_s, value))
    return value


async def wait_for(predicate: Callable[[], T | Awaitable[T]], timeout_s: float = 20.0, interval_s: float = 0.2,
                   *, what: What = None) -> T:
    """``wait_until`` in an async test: the event loop runs on while it waits. ``predicate`` may be async
    (the server records runs from events, a moment after the client finishes them).

    Raises:
        WaitTimeout: as ``wait_until``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value   # type: ignore[return-value]
        if loop.time() > deadline:
            raise WaitTimeout(_gave_up(predicate, what, timeout_s, value))
        await asyncio.sleep(interval_s)


async def within(awaitable: Awaitable[T], timeout_s: float, what: str) -> T:
    """Await ``awaitable`` (an event's ``wait()``, a process's ``communicate()``) for at most ``timeout_s``.

    Raises:
        WaitTimeout: it had not finished by then (it is cancelled); the message says ``what``.
    """
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:
        raise WaitTimeout(f"waited {timeout_s:g} s for {what}") from None


def next_line(process: subprocess.Popen, timeout_s: float, what: str) -> str | bytes:
    """The next line ``process`` writes to its stdout pipe: "" or b"" when it closed the pipe. For a line
    written at once (``print(..., flush=True)``) on a pipe not read from before (``select`` does not see
    what the stream has buffered already).

    Raises:
        WaitTimeout: nothing came within ``timeout_s``; the message says ``what``.
    """
    stream: IO = process.stdout   # type: ignore[assignment]
    if not select.select([stream], [], [], timeout_s)[0]:
        raise WaitTimeout(f"waited {timeout_s:g} s for {what}: {process.args!r} wrote no line")
    return stream.readline()


def stays_false(predicate: Callable[[], object], for_s: float, interval_s: float = 0.1) -> bool:
    """A negative check kept honest and bounded: True when ``predicate`` stayed falsy for ``for_s``
    seconds; False at once when it turned truthy (what must not happen did)."""
    return not poll_until(predicate, timeout_s=for_s, interval_s=interval_s)


def _gave_up(predicate: Callable[[], object], what: What, timeout_s: float, value: object) -> str:
    said = what() if callable(what) else what
    return f"waited {timeout_s:g} s for {said or _source(predicate)}; the last check returned {_short(value)}"


def _source(predicate: Callable[[], object]) -> str:
    """The predicate as written: a lambda's source line, else its name."""
    name = getattr(predicate, "__qualname__", repr(predicate))
    if name.endswith("<lambda>"):
        try:
            name = " ".join(inspect.getsource(predicate).split())
        except (OSError, TypeError):
            pass
    return f"`{name[:300]}`"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."
