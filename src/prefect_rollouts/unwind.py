"""``run_to_end``: cleanup that finishes although the task running it is cancelled again and again.

A stopped eval cancels its rollouts from several places at once: SIGTERM or Ctrl-C cancels the eval's
task, ``asyncio.gather`` passes that cancellation to each rollout, and the code that unwinds after it
(Prefect's flow and task engines, a gather cancelled while it waits for its other tasks) may cancel
the same task again while it is already removing its container. ``await asyncio.shield(job)``
protects ``job`` from the first cancellation only: the ``await job`` in its ``except
CancelledError`` meets the second one, and the cleanup is abandoned. When the eval then ends,
``asyncio.run`` cancels the abandoned job too and the process exits with the container still
running (seen in CI: a container left after SIGTERM). ``run_to_end`` waits for the job however many
cancellations arrive, then re-raises the first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def run_to_end(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` as its own task and wait for it to end, whatever cancels the caller meanwhile.

    Returns:
        What ``awaitable`` returned, when the caller was not cancelled while waiting.

    Raises:
        asyncio.CancelledError: the caller was cancelled while waiting (the first such cancellation,
            raised once the job has ended; the job's own error, if any, is then dropped).
        BaseException: whatever ``awaitable`` raised, when the caller was not cancelled.
    """
    job = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not job.done():
        try:
            await asyncio.wait([job])   # a cancelled wait leaves the job running
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not job.cancelled():
            job.exception()   # retrieved: no "exception was never retrieved" at exit
        raise cancelled
    return job.result()
