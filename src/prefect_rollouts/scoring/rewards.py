"""Running a task's ``@metric`` and ``@reward`` functions and recording them on the trace.

Async functions run on the event loop; sync ones in a worker thread (``threads.py``), one after
another, so a blocking reward holds up neither the loop nor the other rollouts, and the scoring
deadline cancels the wait (the thread is abandoned and named on the trace).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from typing import Any

from prefect_rollouts.errors import AgentFailure, InfrastructureError, TaskError
from prefect_rollouts.task import Task, call_injected, injected_kwargs, qualname
from prefect_rollouts.threads import note_in, run_sync
from prefect_rollouts.trace import Trace


async def run_scoring_functions(task: Task, trace: Trace, runtime: Any) -> None:
    """Run the task's metrics, then its rewards, each group concurrently, and record them.

    In a group, the async functions run concurrently on the loop beside one worker thread that
    calls the sync ones in name order (a task's sync functions never run at the same time). A
    sync function still running when the caller is cancelled (the scoring deadline) is abandoned
    and named in ``trace.info["abandoned_threads"]``.

    Every name is first recorded as None, so an unscored function stays visible. On success
    ``trace.reward`` is the sum of reward x weight. A function that raises or returns a
    non-number leaves ``trace.reward`` None.

    Raises:
        InfrastructureError: a function hit one (e.g. its runtime was lost); raised as it is.
        AgentFailure: a function found the box broken by the agent (``agent_exits.box_broken``); raised as it is.
        TaskError: a function raised or returned something that is not a finite number; the
            message names it. Values recorded before it stay on the trace.
    """
    functions = task.scoring_functions()
    for name, kind, weight, _ in functions:
        if kind == "reward":
            trace.rewards[name] = None
            trace.reward_weights[name] = weight
        else:
            trace.metrics[name] = None
    available = {"trace": trace, "runtime": runtime, "task": task}
    for group in ("metric", "reward"):
        chosen = [(name, fn) for name, kind, _, fn in functions if kind == group]
        results = await _call_group(group, chosen, available, note_in(trace.info))
        failure = None
        for (name, _), result in zip(chosen, results, strict=True):
            if isinstance(result, (InfrastructureError, AgentFailure)):
                raise result  # the runtime failed (placement may retry), or the agent broke its box
            if isinstance(result, BaseException):
                failure = failure or TaskError(f"{group} {name!r} raised {type(result).__name__}: {result}")
                continue
            value = as_score(result)
            if value is None:
                failure = failure or TaskError(f"{group} {name!r} returned {result!r}; return a finite number")
                continue
            (trace.rewards if group == "reward" else trace.metrics)[name] = value
        if failure is not None:
            raise failure
    record_total(trace)


async def _call_group(group: str, chosen: list[tuple[str, Callable[..., Any]]], available: dict[str, Any],
                      on_abandon: Callable[[str], None]) -> list[Any]:
    """The result (or the exception) of each of ``chosen``, in order: async functions concurrently
    on the loop, the sync ones one after another in one worker thread."""
    is_async = [inspect.iscoroutinefunction(fn) for _, fn in chosen]
    sync = [(name, fn) for (name, fn), coroutine in zip(chosen, is_async, strict=True) if not coroutine]
    names = [f"{group} {name!r} ({qualname(fn)})" for name, fn in sync]
    running = names[:1]   # which one a warning names if the thread is abandoned

    def call_sync() -> list[Any]:
        outcomes: list[Any] = []
        for (_, fn), described in zip(sync, names, strict=True):
            running[0] = described
            try:
                outcomes.append(fn(**injected_kwargs(fn, available)))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    jobs = [call_injected(fn, available, f"{group} {name!r}", on_abandon)
            for (name, fn), coroutine in zip(chosen, is_async, strict=True) if coroutine]
    if sync:
        jobs.append(run_sync(call_sync, lambda: running[0], on_abandon))
    gathered = await asyncio.gather(*jobs, return_exceptions=True)
    batch = gathered.pop() if sync else []
    sync_outcomes = iter([batch] * len(sync) if isinstance(batch, BaseException) else batch)
    async_outcomes = iter(gathered)
    results = []
    for coroutine in is_async:
        result = next(async_outcomes) if coroutine else next(sync_outcomes)
        if inspect.isawaitable(result):   # a sync callable that returned a coroutine
            try:
                result = await result
            except Exception as exc:
                result = exc
        results.append(result)
    return results


def record_total(trace: Trace) -> None:
    """Set ``trace.reward`` to the sum of reward x weight over ``trace.rewards`` (all recorded).

    Raises:
        TaskError: the sum is not finite.
    """
    total = float(sum((trace.rewards[name] or 0.0) * trace.reward_weights[name] for name in trace.rewards))
    if not math.isfinite(total):
        raise TaskError(f"the weighted sum of rewards {trace.rewards} is not finite; return smaller values")
    trace.reward = total


def as_score(value: Any) -> float | None:
    """``value`` as a finite float (a bool counts as 0/1), or None when it is not a finite number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) else None
    return None
