"""Waits on what a test can observe (a row written, a run recorded, a process gone) instead of a
fixed sleep: each returns as soon as the condition holds, and gives up at its bound."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float = 20.0, interval_s: float = 0.2) -> T:
    """Call ``predicate`` until it returns a truthy value or ``timeout_s`` passed; return its last value
    (falsy on a time-out, so ``assert wait_until(...)`` reads as the expectation)."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(interval_s)
    return value


async def wait_for(predicate: Callable[[], T | Awaitable[T]], timeout_s: float = 20.0, interval_s: float = 0.2) -> T:
    """``wait_until`` in an async test: the event loop runs on while it waits. ``predicate`` may be async
    (the server records runs from events, a moment after the client finishes them)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value or loop.time() > deadline:
            return value   # type: ignore[return-value]
        await asyncio.sleep(interval_s)


def stays_false(predicate: Callable[[], object], for_s: float, interval_s: float = 0.1) -> bool:
    """A negative check kept honest and bounded: True when ``predicate`` stayed falsy for ``for_s``
    seconds; False at once when it turned truthy (what must not happen did)."""
    return not wait_until(predicate, timeout_s=for_s, interval_s=interval_s)
