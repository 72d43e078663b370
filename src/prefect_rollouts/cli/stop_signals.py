"""``run_until_stopped``: run the CLI's eval coroutine so that SIGTERM ends it exactly as Ctrl-C does.

``timeout``, systemd, ``docker stop`` and Kubernetes stop a process with SIGTERM. Prefect's flow
engine turns SIGTERM into an exception raised wherever the main thread happens to be (its
``capture_sigterm``), which can land outside the flow run, print a traceback and kill the process
before anything is flushed. So the coroutine runs on an event loop in a worker thread (where Prefect
installs no signal handler), and this module's handler in the main thread turns SIGINT and SIGTERM
into one thing: the coroutine's task is cancelled, as ``asyncio.run`` does on Ctrl-C. The eval then
ends as on Ctrl-C: rows flushed, the flow run marked by Prefect (Crashed: "Execution was cancelled
by the runtime environment"), runtimes torn down, and ``StopSignal`` raised for the caller to report.
A second signal stops waiting at once. Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal(KeyboardInterrupt):
    """The run was stopped by SIGINT (Ctrl-C) or SIGTERM; ``exit_code`` is the shell's ``128 + signal``
    (130, 143) and ``reason`` the words the CLI prints (``interrupted (Ctrl-C)``, ``terminated (SIGTERM)``)."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number

    @property
    def reason(self) -> str:
        if self.signal_number == signal.SIGINT:
            return "interrupted (Ctrl-C)"
        return f"terminated ({signal.Signals(self.signal_number).name})"


def run_until_stopped(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new event loop in a worker thread (this thread's context variables
    carried over), and return its result or raise its exception.

    Called from the main thread, SIGINT and SIGTERM cancel ``main``'s task while it runs (the handlers
    in place before are restored at the end); from another thread, signals are left as they are.

    Raises:
        StopSignal: a signal arrived and ``main`` ended by it (cancelled, or raising while it
            unwound; that error is chained). When ``main`` finished anyway, its result is returned.
        BaseException: whatever ``main`` raised without a signal.
    """
    received: list[int] = []
    running: dict[str, Any] = {}
    outcome: dict[str, Any] = {}

    async def wrapped() -> T:
        running["task"] = asyncio.current_task()   # before "loop": on_signal reads "task" once it sees "loop"
        running["loop"] = asyncio.get_running_loop()
        if received:   # a signal came before the task existed (see on_signal)
            running["task"].cancel()
        return await main

    def target() -> None:
        try:
            outcome["result"] = context.run(asyncio.run, wrapped())
        except BaseException as exc:   # handed to the main thread
            outcome["error"] = exc

    def on_signal(signal_number: int, frame: Any) -> None:
        if received:   # the second signal: stop waiting for the eval to unwind
            raise StopSignal(received[0])
        received.append(signal_number)
        if (loop := running.get("loop")) is not None:
            loop.call_soon_threadsafe(running["task"].cancel)

    context = contextvars.copy_context()
    worker = threading.Thread(target=target, name="prefect-rollouts-eval", daemon=True)
    in_main = threading.current_thread() is threading.main_thread()   # only the main thread can set handlers
    previous = {number: signal.signal(number, on_signal) for number in STOP_SIGNALS} if in_main else {}
    try:
        worker.start()
        worker.join()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if "result" in outcome:
        return outcome["result"]
    error = outcome.get("error")
    if received:
        raise StopSignal(received[0]) from (None if isinstance(error, asyncio.CancelledError) else error)
    raise error if error is not None else RuntimeError("the eval thread ended without a result")
