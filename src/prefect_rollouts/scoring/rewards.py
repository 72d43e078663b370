"""Running a task's ``@metric`` and ``@reward`` functions and recording them on the trace."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from prefect_rollouts.errors import InfrastructureError, TaskError
from prefect_rollouts.task import Task, call_injected
from prefect_rollouts.trace import Trace


async def run_scoring_functions(task: Task, trace: Trace, runtime: Any) -> None:
    """Run the task's metrics, then its rewards, each group concurrently, and record them.

    Every name is first recorded as None, so an unscored function stays visible. On success
    ``trace.reward`` is the sum of reward x weight. A function that raises or returns a
    non-number leaves ``trace.reward`` None.

    Raises:
        InfrastructureError: a function hit one (e.g. its runtime was lost); raised as it is.
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
        results = await asyncio.gather(*(call_injected(fn, available) for _, fn in chosen), return_exceptions=True)
        failure = None
        for (name, _), result in zip(chosen, results, strict=True):
            if isinstance(result, InfrastructureError):
                raise result  # the runtime failed, not the task: placement may retry
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
