"""Rollout scripts over an orchestrator, and the inline orchestrator.

An orchestrator (``Orchestrator``) runs the lifecycle stages of ``stages.py`` for one rollout:
``setup``, ``segment``, ``score`` (finalize, skip-check, scoring) and ``teardown``. The inline
orchestrator calls them as plain asyncio functions with the stage retries of
``[env.agent.retries]`` and ``scoring.retries``; the Prefect layer provides one whose stages are
task runs (``prefect_rollouts.tasks``). ``run_rollout`` is the script of ``Agent.run`` on either.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from prefect_rollouts import stages
from prefect_rollouts.errors import InfrastructureError
from prefect_rollouts.stages import RolloutState, Segment
from prefect_rollouts.trace import Trace

T = TypeVar("T")


class Orchestrator(Protocol):
    """Runs the stages of one rollout. Failures end up on ``state.trace``; nothing is raised
    except cancellation."""

    async def setup(self, state: RolloutState) -> None: ...
    async def segment(self, state: RolloutState, messages: list[dict[str, Any]]) -> Segment: ...
    async def score(self, state: RolloutState) -> None: ...
    async def teardown(self, state: RolloutState) -> None: ...


async def run_rollout(orchestrator: Orchestrator, state: RolloutState) -> Trace:
    """Setup, one segment on the task's opening messages and one per ``TaskData.user_turns``
    entry, finalize and score; teardown always.

    The run stops as ``agent_completed`` unless a limit, deadline or error stopped it first
    (remaining user turns are then not sent).
    """
    try:
        await orchestrator.setup(state)
        if not state.stopped:
            await orchestrator.segment(state, stages.opening_messages(state.task))
            for message in state.task.data.user_turns:
                if state.config.max_turns is not None and state.turns >= state.config.max_turns:
                    state.trace.stop("max_turns")   # as an interaction would: the message is not sent
                    state.trace.segments[-1].terminated = True
                if state.stopped:
                    break
                await orchestrator.segment(state, stages.user_messages(message))
            state.trace.stop("agent_completed")
        await orchestrator.score(state)
    finally:
        await orchestrator.teardown(state)
    return state.trace


def backoff_s(attempt: int, initial_s: float, max_s: float = 30.0) -> float:
    """Wait before retry ``attempt`` (0-based): ``min(initial_s * 2**attempt, max_s)`` x U(0.5, 1.5)."""
    return min(initial_s * 2 ** attempt, max_s) * random.uniform(0.5, 1.5)


async def retry_stage(call: Callable[[bool], Awaitable[T]], retries: int, initial_backoff_s: float,
                      max_backoff_s: float = 30.0) -> T:
    """Call ``call(raise_retryable)`` up to ``retries + 1`` times.

    Every attempt but the last passes ``raise_retryable=True`` so the stage raises the
    errors it is retried on; the last passes False, so the stage records them instead.
    """
    for attempt in range(retries):
        try:
            return await call(True)
        except InfrastructureError:
            await asyncio.sleep(backoff_s(attempt, initial_backoff_s, max_backoff_s))
    return await call(False)


class InlineOrchestrator:
    """Runs the stages as plain async calls in the caller's task, with stage retries."""

    async def setup(self, state: RolloutState) -> None:
        """``stages.setup`` with ``[env.agent.retries] setup`` retries."""
        policy = state.config.retries
        await retry_stage(lambda r: stages.setup(state, raise_retryable=r), policy.setup, policy.backoff_s)

    async def segment(self, state: RolloutState, messages: list[dict[str, Any]]) -> Segment:
        """``stages.run_segment`` with ``[env.agent.retries] segment`` retries."""
        policy = state.config.retries
        return await retry_stage(lambda r: stages.run_segment(state, messages, raise_retryable=r),
                                 policy.segment, policy.backoff_s)

    async def score(self, state: RolloutState) -> None:
        """Finalize, skip-check, then score (isolated: with ``scoring.retries`` retries)."""
        await stages.finalize(state)
        if stages.skip_check(state) is None:
            policy = state.scoring.retries
            retries = policy.max_retries if state.scoring.mode == "isolated" else 0
            await retry_stage(lambda r: stages.score(state, raise_retryable=r), retries, policy.backoff_s,
                              policy.max_backoff_s)

    async def teardown(self, state: RolloutState) -> None:
        """``stages.teardown`` (completes even when the caller is cancelled)."""
        await stages.teardown(state)
