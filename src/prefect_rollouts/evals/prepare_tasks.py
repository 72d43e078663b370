"""Before an eval's rollouts: ``Task.prepare`` for each of its tasks that has one, a few at a time.

A Harbor task builds its image here, so rollouts start on a ready image and a task whose image does
not build is known before the first rollout. Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable

from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.plan import Planned
from prefect_rollouts.task import Task

CONCURRENCY = 2
"""Tasks prepared at once: image builds are CPU- and disk-bound (this machine has 2 cores)."""


async def prepare_tasks(planned: Iterable[Planned], *, concurrency: int = CONCURRENCY,
                        report: Callable[[str], None] | None = None) -> dict[tuple[str, str], float | BaseException]:
    """Run ``Task.prepare`` once per distinct task of ``planned`` whose class defines one, ``concurrency``
    at a time, with the environment's agent config. Distinct: by environment and task id, except that
    environments of the same taskset, options and runtime config share one ``prepare`` per task.

    A task whose ``prepare`` fails with anything but a ``ConfigError`` is reported and left: its
    rollouts call ``prepare`` again in setup and fail with the error on their traces (a failed image
    build is remembered, so they fail at once), and the other tasks run.

    Args:
        planned: The rollouts about to run.
        report: Receives one line as preparing starts and one per task as it ends (the progress line).

    Returns:
        ``(environment, task id) -> seconds`` it took, or the exception it raised.

    Raises:
        ConfigError: a task cannot run under its agent config (the first such task's error).
    """
    todo: dict[tuple[str, str], Planned] = {}
    seen: set[str] = set()
    for item in planned:
        if type(item.task).prepare is Task.prepare:
            continue
        env = item.environment   # environments of one taskset and runtime (oracle and nop) prepare once
        same = json.dumps([env.taskset, env.options, item.task.id, env.agent.runtime.model_dump(mode="json")],
                          sort_keys=True, default=str)
        if same not in seen:
            seen.add(same)
            todo.setdefault((env.name, item.task.id), item)
    if not todo:
        return {}
    say = report or (lambda line: None)
    say(f"preparing {len(todo)} tasks ({min(concurrency, len(todo))} at a time)")
    gate = asyncio.Semaphore(concurrency)
    outcomes: dict[tuple[str, str], float | BaseException] = {}

    async def one(key: tuple[str, str], item: Planned) -> None:
        async with gate:
            started = time.monotonic()
            try:
                await item.task.prepare(item.environment.agent)
            except ConfigError:
                raise
            except Exception as exc:
                outcomes[key] = exc
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                say(f"task {len(outcomes)}/{len(todo)} {key[1]}: FAILED ({type(exc).__name__}: {first[:300]}); "
                    "its rollouts will fail with this error")
                return
            outcomes[key] = elapsed = round(time.monotonic() - started, 3)
            say(f"task {len(outcomes)}/{len(todo)} {key[1]}: ready in {elapsed:.2f} s")

    jobs = [asyncio.ensure_future(one(key, item)) for key, item in todo.items()]
    try:
        await asyncio.gather(*jobs)
    finally:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
    return outcomes
