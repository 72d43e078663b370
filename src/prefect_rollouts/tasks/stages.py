"""One thin Prefect task per lifecycle stage, and the orchestrator that calls them.

Deadlines (``[env.agent.timeouts]``) are enforced inside the core stage, so the inline path
behaves the same; the stage raises ``StageTimeoutError`` (a ``TimeoutError``) after recording
it on the trace, which Prefect shows as a ``TimedOut`` task run. Retries come from
``[env.agent.retries]`` (setup, segment) and ``scoring.retries`` (isolated scoring): every
attempt but the last raises the errors the stage is retried on (``stages.RETRY_ON``), the last
records them on the trace, so a rollout that exhausts its retries ends like an inline one.
"""

from __future__ import annotations

import functools
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.states import State
from prefect.utilities.annotations import quote

from prefect_rollouts import stages
from prefect_rollouts.errors import InfrastructureError
from prefect_rollouts.stages import RolloutState, Segment

_OPTIONS: dict[str, Any] = {"persist_result": False, "cache_policy": NO_CACHE, "log_prints": False}


def is_retryable(task: Task[..., Any], run: Any, state: State[Any]) -> bool:
    """Prefect retry condition: retry only the infrastructure errors a stage chose to raise."""
    return isinstance(state.data, InfrastructureError) and state.data.retryable


def _attempts_left() -> bool:
    """True while this task run has retries left (``run_count`` is 1 on the first attempt)."""
    context = TaskRunContext.get()
    return context is not None and context.task_run.run_count <= context.task.retries


@task(name="setup", task_run_name="setup", retry_condition_fn=is_retryable, **_OPTIONS)
async def setup_task(state: RolloutState) -> None:
    """Prefect wrapper of ``stages.setup``: retried on runtime start failures."""
    await stages.setup(state, raise_retryable=_attempts_left(), raise_timeout=True)


@task(name="segment", task_run_name="segment-{index}", retry_condition_fn=is_retryable, **_OPTIONS)
async def segment_task(state: RolloutState, messages: list[dict[str, Any]], index: int) -> Segment:
    """Prefect wrapper of ``stages.run_segment``: retried on ``ProviderError`` from the segment's start."""
    return await stages.run_segment(state, messages, raise_retryable=_attempts_left(), raise_timeout=True)


@task(name="finalize", task_run_name="finalize", **_OPTIONS)
async def finalize_task(state: RolloutState) -> None:
    """Prefect wrapper of ``stages.finalize``."""
    await stages.finalize(state, raise_timeout=True)


@task(name="skip-check", task_run_name="skip-check", **_OPTIONS)
async def skip_check_task(state: RolloutState) -> str | None:
    """Prefect wrapper of ``stages.skip_check``: returns the skip reason or None."""
    return stages.skip_check(state)


@task(name="scoring", task_run_name="scoring", retry_condition_fn=is_retryable, **_OPTIONS)
async def scoring_task(state: RolloutState) -> None:
    """Prefect wrapper of ``stages.score``: isolated scoring is retried with a fresh runtime."""
    await stages.score(state, raise_retryable=_attempts_left(), raise_timeout=True)


@task(name="teardown", task_run_name="teardown", **_OPTIONS)
async def teardown_task(state: RolloutState) -> None:
    """Prefect wrapper of ``stages.teardown``."""
    await stages.teardown(state)


@functools.lru_cache(maxsize=256)
def _with_retries(base: Task[..., Any], retries: int, delay_s: float) -> Task[..., Any]:
    """``base`` with ``retries`` (built once per distinct setting, not per rollout)."""
    return base.with_options(retries=retries, retry_delay_seconds=delay_s) if retries else base


class TaskOrchestrator:
    """Runs a rollout's stages as Prefect task runs of the current flow run."""

    async def setup(self, state: RolloutState) -> None:
        """``setup`` task run, ``[env.agent.retries] setup`` retries."""
        policy = state.config.retries
        await _run(_with_retries(setup_task, policy.setup, policy.backoff_s), state, "setup", quote(state))

    async def segment(self, state: RolloutState, messages: list[dict[str, Any]]) -> Segment:
        """``segment-<n>`` task run, ``[env.agent.retries] segment`` retries."""
        policy = state.config.retries
        task_ = _with_retries(segment_task, policy.segment, policy.backoff_s)
        result = await _run(task_, state, "segment", quote(state), quote(messages), len(state.trace.segments))
        return result if isinstance(result, Segment) else stages.last_segment(state)

    async def score(self, state: RolloutState) -> None:
        """``finalize``, ``skip-check`` and (unless skipped) ``scoring`` task runs."""
        await _run(finalize_task, state, "finalize", quote(state))
        if await _run(skip_check_task, state, "skip-check", quote(state)) is None and stages.scorable(state):
            policy = state.scoring.retries
            retries = policy.max_retries if state.scoring.mode == "isolated" else 0
            await _run(_with_retries(scoring_task, retries, policy.backoff_s), state, "scoring", quote(state))

    async def teardown(self, state: RolloutState) -> None:
        """``teardown`` task run; falls back to a direct call if the task run cannot start."""
        try:
            await _run(teardown_task, state, "teardown", quote(state))
        finally:
            if state.runtime is not None:
                await stages.teardown(state)


async def _run(task_: Task[..., Any], state: RolloutState, stage: str, *args: Any) -> Any:
    """Call a stage task and return its result; a failed run that the stage did not record
    (a bug, a crash) is recorded on the trace. Timeouts were recorded by the stage itself."""
    final = await task_(*args, return_state=True)
    if final.is_completed():
        return await final.result()
    error = final.data if isinstance(final.data, BaseException) else None
    if error is not None and not isinstance(error, TimeoutError) and not state.trace.errors:
        state.trace.record_error(error, stage)
    return None
