"""One rollout, one stage policy, any orchestrator.

``Rollout`` owns one rollout's state and runs its stages (``stages.py``) in order: ``open()``
(setup), ``turn(messages)`` (one harness segment each), ``close()`` (finalize, skip-check,
scoring, teardown). ``run()`` is the whole script of ``Agent.run``. Each stage goes through an
orchestrator's ``run_stage(name, fn, policy)``: ``InlineOrchestrator`` here, a Prefect task run
per stage in ``prefect_rollouts.tasks``. What a stage retries on, how often and how long it
waits is decided once, in ``stage_policies``, and both orchestrators honour it the same way.
When a stage still fails, ``Rollout`` records the error on the trace: failures are data.

A rollout in another process (a shard on a work pool's worker) is rebuilt from plain data: the
eval config and its key ``(environment, task id, rollout index)`` (``evals.plan.rebuild``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from prefect_rollouts import stages
from prefect_rollouts.config.agent import AgentConfig, ScoringConfig
from prefect_rollouts.errors import InfrastructureError, ProviderError, RuntimeUnavailableError, StageTimeoutError
from prefect_rollouts.rollout_state import RolloutState, Segment, opening_messages, user_messages
from prefect_rollouts.task import Task
from prefect_rollouts.trace import SendRecord, Trace

if TYPE_CHECKING:
    from prefect_rollouts.evals.budget import Budget

T = TypeVar("T")

STAGES = ("setup", "segment", "finalize", "skip-check", "scoring", "teardown")
"""Stage names, as task runs show them (a segment's task run is ``segment-<n>``)."""


@dataclass(frozen=True, slots=True)
class StagePolicy:
    """How one stage is retried. The deadline is not here: stages enforce their own (the agent
    budget spans segments), so every orchestrator gets the same one.

    Attributes:
        retries: Retries after the first attempt.
        backoff_s: Wait before the first retry, seconds; doubled for each further retry.
        max_backoff_s: Cap of one wait before jitter, seconds.
        jitter: Each wait is scaled by a random factor within ``1 ± jitter``.
        retry_on: Exception types retried (an ``InfrastructureError`` only when ``retryable``).
    """

    retries: int = 0
    backoff_s: float = 0.0
    max_backoff_s: float = 30.0
    jitter: float = 0.5
    retry_on: tuple[type[BaseException], ...] = ()

    def should_retry(self, exc: BaseException) -> bool:
        """Whether ``exc`` from an attempt that has retries left is retried."""
        return isinstance(exc, self.retry_on) and bool(getattr(exc, "retryable", True))

    def delays_s(self) -> list[float]:
        """Nominal wait before each retry (before jitter): ``min(backoff_s * 2**n, max_backoff_s)``."""
        return [min(self.backoff_s * 2 ** n, self.max_backoff_s) for n in range(self.retries)]

    def wait_s(self, retry: int) -> float:
        """Jittered wait before retry ``retry`` (0-based), seconds."""
        return self.delays_s()[retry] * random.uniform(1 - self.jitter, 1 + self.jitter)


def stage_policies(config: AgentConfig, scoring: ScoringConfig) -> dict[str, StagePolicy]:
    """The policy of every stage of a rollout with agent ``config`` and effective ``scoring``.

    ``setup`` retries a runtime that failed to start and ``segment`` a ``ProviderError`` (after
    the client's own request retries), per ``[env.agent.retries]``; ``scoring`` retries an
    infrastructure error per ``scoring.retries`` when isolated (a fresh runtime each time;
    shared scoring is never retried, as the seed says). The other stages are not retried.
    """
    agent = config.retries
    isolated = scoring.mode == "isolated"
    return {
        "setup": StagePolicy(agent.setup, agent.backoff_s, retry_on=(RuntimeUnavailableError,)),
        "segment": StagePolicy(agent.segment, agent.backoff_s, retry_on=(ProviderError,)),
        "finalize": StagePolicy(),
        "skip-check": StagePolicy(),
        "scoring": StagePolicy(scoring.retries.max_retries if isolated else 0, scoring.retries.backoff_s,
                               scoring.retries.max_backoff_s, retry_on=(InfrastructureError,)),
        "teardown": StagePolicy(),
    }


class Orchestrator(Protocol):
    """Runs the stages of rollouts.

    ``run_stage`` calls ``fn()`` and returns its result. When it raises an exception that
    ``policy.should_retry`` accepts and retries are left, it waits ``policy.wait_s(n)`` (or
    the same nominal delays with its own jitter) and calls ``fn()`` again; otherwise the
    exception propagates. ``name`` is the stage's display name (``setup``, ``segment-<n>``,
    ``finalize``, ``skip-check``, ``scoring``, ``teardown``). Cancellation propagates at once.
    """

    async def run_stage(self, name: str, fn: Callable[[], Awaitable[T]], policy: StagePolicy) -> T: ...


class InlineOrchestrator:
    """Runs stages as plain awaits in the caller's task, retried as their policy says."""

    async def run_stage(self, name: str, fn: Callable[[], Awaitable[T]], policy: StagePolicy) -> T:
        """See ``Orchestrator.run_stage``."""
        for retry in range(policy.retries + 1):
            try:
                return await fn()
            except Exception as exc:
                if retry == policy.retries or not policy.should_retry(exc):
                    raise
            await asyncio.sleep(policy.wait_s(retry))
        raise AssertionError("unreachable")  # pragma: no cover


class Rollout:
    """One rollout: ``open()``, ``turn(messages)`` as often as the caller likes, ``close()``.

    Args:
        state: The rollout's state (``rollout_state.new_state``); owned by this object from now on.
        orchestrator: Runs each stage; default ``InlineOrchestrator``. It may be replaced
            before ``open()`` (the Prefect flow does, inside its flow run).

    Failures of a stage (after its retries) are recorded on ``trace`` and stop the run; only
    cancellation propagates.
    """

    def __init__(self, state: RolloutState, orchestrator: Orchestrator | None = None) -> None:
        self._state = state
        self.orchestrator: Orchestrator = orchestrator or InlineOrchestrator()
        self.policies = stage_policies(state.config, state.scoring)
        self._torn_down = False

    @property
    def trace(self) -> Trace:
        """The live trace (complete after ``close()``)."""
        return self._state.trace

    @property
    def task(self) -> Task:
        """The rollout's own copy of the task (``Task.setup`` may keep state on it)."""
        return self._state.task

    @property
    def labels(self) -> dict[str, str]:
        """Labels of the rollout's sandboxes (run id, flow run, owner API, ...); add before ``open()``."""
        return self._state.labels

    @property
    def stopped(self) -> bool:
        """True once the run has a stop condition."""
        return self._state.stopped

    @property
    def can_steer(self) -> bool:
        """Whether the harness injects steer messages at its safe points."""
        return self._state.harness.can_steer

    @property
    def harness_id(self) -> str:
        """The harness's name (``chat``, ``tools``)."""
        return self._state.harness.id

    def share_budget(self, budget: Budget | None) -> None:
        """Count this rollout's model calls against an eval run's ``budget`` and stop it as ``budget`` at
        its next model call once the budget is reached (``RolloutState.budget_reached``); before ``open()``."""
        self._state.budget = budget

    async def open(self) -> None:
        """Run ``setup``; a failure is recorded and stops the run."""
        await self._stage("setup", "setup", lambda: stages.setup(self._state))

    async def turn(self, messages: list[dict[str, Any]]) -> Segment:
        """Deliver ``messages`` and run one harness segment (task run ``segment-<n>``).

        Returns:
            The ``Segment``; an empty terminated one when the run had stopped (a turn cap
            reached counts: ``max_turns``), without delivering ``messages``.
        """
        state = self._state
        if self.is_over():
            return Segment([], True)
        index = len(state.trace.segments) - (1 if state.resume_segment else 0)
        segment = await self._stage("segment", f"segment-{index}", lambda: stages.run_segment(state, messages))
        return segment if segment is not None else stages.last_segment(state)

    def is_over(self) -> bool:
        """True when no further turn can run: the run stopped, or the turn cap is reached (which stops it)."""
        self._state.turn_limit_reached()
        return self._state.stopped

    def end_turn(self, segment: Segment) -> Segment:
        """After an interaction's turn: stop at the turn cap when no further response can be
        sampled (the exchange is over), and return ``segment`` marked terminated if so."""
        if not self._state.stopped and self._state.turn_limit_reached():
            return Segment(segment.messages, True, segment.last_reply)
        return segment

    def steer(self, record: SendRecord) -> None:
        """Hand a steer message to the harness's next safe point."""
        self._state.steer_inbox.append(record)

    def take_steers(self) -> list[SendRecord]:
        """Remove and return the steers that arrived after the harness's last safe point."""
        pending = list(self._state.steer_inbox)
        self._state.steer_inbox.clear()
        return pending

    def stop(self, condition: str) -> None:
        """Set the stop condition (``agent_completed``, ``user_closed``) unless one is set."""
        self._state.trace.stop(condition)

    def record_error(self, exc: BaseException, stage: str) -> None:
        """Record a failure from outside the stages (e.g. the caller's block raised)."""
        self._state.trace.record_error(exc, stage)

    async def close(self) -> Trace:
        """Finalize, skip-check and score (each skipped once the run failed), then teardown always."""
        state = self._state
        try:
            if stages.scorable(state):
                await self._stage("finalize", "finalize", lambda: stages.finalize(state))
            if stages.scorable(state):
                skipped = await self._stage("skip-check", "skip-check", _async(stages.skip_check, state))
                if skipped is None and stages.scorable(state):
                    await self._stage("scoring", "scoring", lambda: stages.score(state))
        finally:
            await self.teardown()
        return state.trace

    async def teardown(self) -> None:
        """Stop the runtime (task run ``teardown``, once); completes on every path, cancellation included."""
        if self._torn_down:
            return
        self._torn_down = True
        try:
            await self._stage("teardown", "teardown", lambda: stages.teardown(self._state))
        finally:
            await self.release()   # the orchestrator could not run it

    async def release(self) -> None:
        """Stop the runtime directly, without the orchestrator (the last resort on every exit path)."""
        if self._state.runtime is not None:
            await stages.teardown(self._state)

    async def run(self) -> Trace:
        """The script of ``Agent.run``: open, a segment on the task's opening messages and one per
        ``TaskData.user_turns`` entry, then close. The run stops as ``agent_completed`` unless a
        limit, deadline or error stopped it first (remaining user turns are then not sent)."""
        try:
            await self.open()
            if not self.stopped:
                segment = await self.turn(opening_messages(self.task))
                for message in self.task.data.user_turns:
                    if segment.terminated:
                        break
                    segment = await self.turn(user_messages(message))
                self.stop("agent_completed")
            await self.close()
        finally:
            await self.teardown()
        return self.trace

    async def _stage(self, policy_name: str, name: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """Run one stage through the orchestrator; record what it raises after its retries."""
        try:
            return await self.orchestrator.run_stage(name, fn, self.policies[policy_name])
        except StageTimeoutError:
            return None   # recorded by the stage as <stage>_timeout
        except Exception as exc:
            self._state.trace.record_error(exc, policy_name)
            return None


def _async(fn: Callable[..., T], *args: Any) -> Callable[[], Awaitable[T]]:
    """A plain function as a stage coroutine function."""
    async def call() -> T:
        return fn(*args)
    return call
