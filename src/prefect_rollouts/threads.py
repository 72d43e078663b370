"""Sync task code off the event loop: rewards, metrics, ``setup``/``finalize`` hooks, judges'
score and parse functions, and tools that are not ``async`` run in worker threads.

One event loop runs many rollouts (an inline eval, a batch, a flow run's rollout subflows), so
sync task code that blocks (``time.sleep``, ``subprocess.run``, ``requests.get`` without a
timeout) would stall them all, and no stage deadline could fire. ``run_sync`` runs it in a
worker thread while the loop goes on. Threads, not processes: task code receives live objects
(the trace it records on, the runtime, the task's own state) that cannot cross a process.
Async task code stays on the loop, where a deadline cancels it.

Python cannot stop a thread. When the awaiting coroutine is cancelled (a stage deadline, the
rollout cancelled) while the call still runs, ``run_sync`` stops waiting at once, logs a warning
(logger ``prefect_rollouts.task_code``), hands the same text to ``on_abandon`` (stages put it
on the trace) and abandons the thread: it ends when its call returns; the result is dropped.
The workers are daemon threads of this module, not of ``concurrent.futures`` or asyncio's
default executor, both of which join their threads at exit: an abandoned call holds up neither
the end of an eval nor the interpreter's exit. Idle workers are reused (one thread hop per
call, not a new thread) and exit after ``IDLE_S``; an abandoned one never returns to the pool, so a
stuck call never starves the others.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

IDLE_S = 30.0
"""An idle worker thread exits after this many seconds."""

log = logging.getLogger("prefect_rollouts.task_code")

_lock = threading.Lock()
_idle: list[_Worker] = []


async def run_sync(call: Callable[[], T], what: str | Callable[[], str],
                   on_abandon: Callable[[str], None] | None = None) -> T:
    """Run ``call()`` in a worker thread (with the caller's context variables) and return its result.

    Args:
        call: Sync task code, its arguments bound.
        what: What runs, for the warning when it is abandoned (e.g. ``"reward 'exact' (Add.exact)"``);
            a callable is asked only then (a batch of functions names the one still running).
        on_abandon: Called with the warning's text when the call is abandoned.

    Returns:
        What ``call()`` returned.

    Raises:
        Exception: whatever ``call()`` raised (a ``BaseException`` that is not an ``Exception``, e.g.
            ``SystemExit``, arrives as ``RuntimeError``: task code cannot end the eval).
        asyncio.CancelledError: the caller was cancelled; a call still running is abandoned (see above).
    """
    loop = asyncio.get_running_loop()
    job = _Job(call, loop, contextvars.copy_context())
    _submit(job)
    try:
        return await job.future
    except asyncio.CancelledError:
        with _lock:
            job.abandoned = not job.finished
        if job.abandoned:
            message = (f"{what() if callable(what) else what} was still running in its thread when the rollout "
                       "stopped waiting for it (a stage deadline expired, or the rollout was cancelled). A thread "
                       "cannot be stopped: it was abandoned and ends when the call returns. Make the function "
                       "async, or give its blocking call a timeout")
            log.warning(message)
            if on_abandon is not None:
                on_abandon(message)
        raise


def note_in(info: dict[str, Any]) -> Callable[[str], None]:
    """An ``on_abandon`` that appends the warning to ``info["abandoned_threads"]`` (a trace's ``info``)."""
    return lambda message: info.setdefault("abandoned_threads", []).append(message)


class _Job:
    """One call handed to a worker, and how its outcome gets back to the loop."""

    __slots__ = ("abandoned", "call", "context", "finished", "future", "loop")

    def __init__(self, call: Callable[[], Any], loop: asyncio.AbstractEventLoop, context: contextvars.Context) -> None:
        self.call, self.loop, self.context = call, loop, context
        self.future: asyncio.Future[Any] = loop.create_future()
        self.finished = False    # set by the worker, under _lock
        self.abandoned = False   # set by the loop, under _lock

    def run(self) -> None:
        outcome: tuple[Any, BaseException | None]
        try:
            outcome = (self.context.run(self.call), None)
        except Exception as exc:
            outcome = (None, exc if not isinstance(exc, StopIteration) else RuntimeError(f"StopIteration: {exc}"))
        except BaseException as exc:
            outcome = (None, RuntimeError(f"{type(exc).__name__}: {exc}"))
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, *outcome)
        except RuntimeError:   # the loop is closed: an abandoned call outlived its eval
            pass


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():   # the waiter was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Worker(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="prefect-rollouts-task-code", daemon=True)
        self.inbox: queue.SimpleQueue[_Job] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            try:
                job = self.inbox.get(timeout=IDLE_S)
            except queue.Empty:
                with _lock:
                    if self in _idle:   # nobody took this worker meanwhile: retire
                        _idle.remove(self)
                        return
                continue                # taken just now: its job is on the way
            job.run()
            with _lock:
                job.finished = True
                if job.abandoned:       # the call outlived its waiter: do not rejoin the pool
                    return
                _idle.append(self)


def _forget_workers() -> None:
    """In a forked child: the parent's workers do not exist there."""
    global _lock
    _lock = threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_forget_workers)


def _submit(job: _Job) -> None:
    with _lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker()
        worker.start()
    worker.inbox.put(job)
