"""The rollout lifecycle as plain async stages over one ``RolloutState``.

Order: ``setup`` -> ``run_segment`` (once per harness segment) -> ``finalize`` ->
``skip_check`` -> ``score`` (shared or isolated) -> ``teardown`` (always). ``close`` runs the
part after the last segment. Orchestrators (the inline path in ``agent.py``, Prefect tasks
later) call these functions; they hold all behaviour.

A stage records failures on the trace and returns. Two switches let an orchestrator see them:
``raise_retryable=True`` raises the errors the stage is retried on (``RETRY_ON``: runtime start
failures for setup, ``ProviderError`` for a segment, infrastructure errors for isolated scoring)
after undoing the stage's partial effects, so the orchestrator can retry it (the last attempt
runs with ``raise_retryable=False``); ``raise_timeout=True`` raises ``StageTimeoutError`` after
recording an expired deadline on the trace, so the orchestrator can show the stage as timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prefect_rollouts.config import AgentConfig, ScoringConfig, effective_scoring
from prefect_rollouts.errors import InfrastructureError, ProviderError, RuntimeUnavailableError, StageTimeoutError
from prefect_rollouts.harnesses import Harness, make_harness
from prefect_rollouts.runtimes import Runtime, make_runtime
from prefect_rollouts.scoring.placement import score_isolated, score_shared
from prefect_rollouts.task import Task, call_injected
from prefect_rollouts.trace import SegmentRecord, SendRecord, Trace, last_assistant_text

if TYPE_CHECKING:
    from prefect_rollouts.model import ModelClient
    from prefect_rollouts.scoring.judges import JudgeClients

#: Errors each stage is retried on (when ``retryable``); everything else is recorded at once.
RETRY_ON: dict[str, tuple[type[InfrastructureError], ...]] = {
    "setup": (RuntimeUnavailableError,),
    "segment": (ProviderError,),
    "scoring": (InfrastructureError,),
}


@dataclass(eq=False)
class RolloutState:
    """Everything one rollout holds between stages. Lives in the orchestrating process."""

    config: AgentConfig
    task: Task
    client: ModelClient
    trace: Trace
    harness: Harness
    scoring: ScoringConfig
    runtime: Runtime | None = None
    turns: int = 0
    """Model responses sampled so far (for ``max_turns``)."""
    agent_elapsed_s: float = 0.0
    """Agent budget consumed by segments so far."""
    steer_inbox: list[SendRecord] = field(default_factory=list)
    """Steer messages waiting for the harness's next safe point."""
    segment_inputs: int = 0
    """User messages delivered at the start of the last segment (they are not part of its output)."""
    artifacts: bytes | None = None
    """Archive collected after finalize for isolated scoring."""
    resume_segment: bool = False
    """The last segment failed with a retryable error; the next ``run_segment`` resumes it."""
    labels: dict[str, str] = field(default_factory=dict)
    judge_clients: JudgeClients | None = None
    """The agent's judge clients; None opens them per scoring call."""

    @property
    def stopped(self) -> bool:
        """True once the run has a stop condition (completed, limited, timed out or failed)."""
        return self.trace.stop_condition is not None

    @property
    def segment_index(self) -> int:
        """Index of the current (or last) segment."""
        return len(self.trace.segments) - 1


class Segment:
    """What one ``turn()`` produced.

    Attributes:
        messages: Messages the harness added in the segment (assistant messages, tool
            results, steer messages injected mid-segment), in order; wire-format dicts.
        terminated: True when the rollout has stopped; no further turn will run.
        last_reply: Content of the segment's last assistant message, stripped ("" if none).
    """

    __slots__ = ("messages", "terminated", "last_reply")

    def __init__(self, messages: list[dict[str, Any]], terminated: bool, last_reply: str = "") -> None:
        self.messages = messages
        self.terminated = terminated
        self.last_reply = last_reply

    def __repr__(self) -> str:
        return f"Segment(messages=<{len(self.messages)}>, terminated={self.terminated}, last_reply={self.last_reply!r})"


def new_state(config: AgentConfig, task: Task, client: ModelClient, *, agent_info: dict[str, Any],
              labels: dict[str, str] | None = None, judge_clients: JudgeClients | None = None) -> RolloutState:
    """Mint the trace and state of one rollout (no I/O).

    The rollout gets its own shallow copy of ``task`` (``rollout_copy``), so ``Task.setup`` may
    keep per-rollout state on ``self`` (e.g. the live tool objects of a stateful benchmark)
    while many rollouts of one task run at once.
    """
    task = rollout_copy(task)
    trace = Trace(task_id=task.id, task_type=type(task).__name__, model=config.model, agent=agent_info)
    if task.data.info:
        trace.info["task"] = dict(task.data.info)
    return RolloutState(config=config, task=task, client=client, trace=trace,
                        harness=make_harness(config.harness), labels={**(labels or {}), "rollout_id": trace.id},
                        scoring=effective_scoring(config.scoring, task.data.scoring), judge_clients=judge_clients)


def rollout_copy(task: Task) -> Task:
    """A rollout's own shallow copy of ``task``: its ``__copy__`` when the class defines one, else
    the same attributes on a new instance (not ``copy.copy``, which would go through pickling
    hooks such as a ``__getstate__`` that drops a client). Attributes are shared, not copied:
    ``setup`` should assign new objects to ``self``, not mutate ones made in ``__init__``."""
    cls = type(task)
    if getattr(cls, "__copy__", None) is not None:
        return copy.copy(task)
    clone = object.__new__(cls)
    if hasattr(task, "__dict__"):
        clone.__dict__.update(vars(task))
    for klass in cls.__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(task, name):
                setattr(clone, name, getattr(task, name))
    return clone


def user_messages(message: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn as wire messages: a string is one user message, a list is copied."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    return [dict(m) for m in message]


def opening_messages(task: Task) -> list[dict[str, Any]]:
    """The system prompt (if any) and the task's prompt as wire messages."""
    messages: list[dict[str, Any]] = []
    if task.data.system_prompt:
        messages.append({"role": "system", "content": task.data.system_prompt})
    prompt = task.data.prompt
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt is not None:
        messages.extend(dict(m) for m in prompt)
    return messages


async def setup(state: RolloutState, *, raise_retryable: bool = False, raise_timeout: bool = False) -> None:
    """Start the runtime, write ``TaskData.files``, run ``Task.setup`` and open the harness.

    Deadline ``timeouts.setup``: on expiry the run stops as ``setup_timeout``. A failure
    stops it as ``<kind>_error``; with ``raise_retryable`` a retryable infrastructure error
    is raised instead, after the runtime it started is stopped.
    """
    async with _stage(state, "setup", state.config.timeouts.setup, raise_retryable, raise_timeout):
        try:
            state.runtime = make_runtime(state.config.runtime, labels=state.labels)
            await state.runtime.start()
            for path, content in state.task.data.files.items():
                await state.runtime.write_file(path, content)
            await call_injected(state.task.setup, {"runtime": state.runtime, "trace": state.trace, "task": state.task})
            await state.harness.open(state)
        except RETRY_ON["setup"] as exc:
            if raise_retryable and exc.retryable:
                await _stop_runtime(state)
            raise


async def run_segment(state: RolloutState, messages: list[dict[str, Any]], *,
                      raise_retryable: bool = False, raise_timeout: bool = False) -> Segment:
    """Deliver ``messages`` (user input) and run one harness segment.

    The agent deadline (``timeouts.agent``) is a budget over all segments; on expiry the run
    stops as ``agent_timeout``. A ``ProviderError`` or harness failure stops it as an error.
    With ``raise_retryable`` a retryable error is raised instead, and the next call (the
    retry, with the same ``messages``) resumes the segment where the failed model call left
    it: the messages, tool results and steers already delivered stay, because their side
    effects (files written, a benchmark's live tool state) happened and cannot be undone.

    Returns:
        ``Segment``; ``terminated`` is True when the run has stopped.
    """
    trace = state.trace
    if state.stopped:
        return Segment([], True)
    if state.resume_segment:
        state.resume_segment = False
        record = trace.segments[-1]
        first_call = len(trace.model_calls) - record.model_calls
    else:
        record = SegmentRecord(index=len(trace.segments), start=len(trace.messages), end=len(trace.messages),
                               terminated=False, model_calls=0)
        first_call = len(trace.model_calls)
        trace.messages.extend(messages)
        trace.segments.append(record)
        state.segment_inputs = len(messages)
    budget = state.config.timeouts.agent
    remaining = None if budget is None else max(budget - state.agent_elapsed_s, 0.0)
    started = time.perf_counter()
    try:
        async with _stage(state, "agent", remaining, raise_retryable, raise_timeout, label="segment"):
            await state.harness.run_segment(state)
    except RETRY_ON["segment"]:
        state.resume_segment = True   # the failed call is on the trace; the retry samples again from here
        raise
    finally:
        state.agent_elapsed_s += time.perf_counter() - started
        trace.timings["agent"] = round(state.agent_elapsed_s, 6)
        record.end = len(trace.messages)
        record.model_calls = len(trace.model_calls) - first_call
        record.terminated = state.stopped
    return last_segment(state)


def last_segment(state: RolloutState) -> Segment:
    """The ``Segment`` of the trace's last segment record (what ``turn()`` returns)."""
    trace = state.trace
    if not trace.segments:
        return Segment([], state.stopped)
    record = trace.segments[-1]
    produced = trace.messages[record.start + state.segment_inputs:record.end]
    return Segment(produced, state.stopped, last_assistant_text(produced))


async def finalize(state: RolloutState, *, raise_timeout: bool = False) -> None:
    """Run ``Task.finalize`` (deadline ``timeouts.finalize``, expiry -> ``finalize_timeout``,
    scoring still runs); for isolated scoring, then collect ``TaskData.artifacts``.

    Skipped when the run failed or its setup did not finish (it will not be scored).
    """
    if not scorable(state):
        return
    async with _stage(state, "finalize", state.config.timeouts.finalize, False, raise_timeout):
        available = {"trace": state.trace, "runtime": state.runtime, "task": state.task}
        await call_injected(state.task.finalize, available)
        if state.scoring.mode == "isolated" and state.runtime is not None:
            state.artifacts, missing = await state.runtime.collect_artifacts(list(state.task.data.artifacts))
            if missing:
                state.trace.info["artifacts_missing"] = missing


def scorable(state: RolloutState) -> bool:
    """False when the run failed or setup did not finish (``setup_timeout``): reward stays None."""
    return not state.trace.errors and state.trace.stop_condition != "setup_timeout"


def skip_check(state: RolloutState) -> str | None:
    """Apply ``skip_on_truncated`` / ``skip_on_timeout``.

    Returns:
        ``"truncated"`` or ``"timeout"`` when scoring is skipped (then ``trace.reward`` is 0,
        no task rewards or metrics are kept, ``trace.info["scoring_skipped"]`` holds the
        reason); None when scoring should run.
    """
    trace, scoring = state.trace, state.scoring
    if not scorable(state):
        return None
    reason = None
    if scoring.skip_on_truncated and trace.is_truncated:
        reason = "truncated"
    elif scoring.skip_on_timeout and trace.is_timeout:
        reason = "timeout"
    if reason is not None:
        trace.info["scoring_skipped"] = reason
        trace.rewards.clear()
        trace.metrics.clear()
        trace.reward = 0.0
    return reason


async def score(state: RolloutState, *, raise_retryable: bool = False, raise_timeout: bool = False) -> None:
    """Score the rollout once in its placement (``scoring.mode``) under ``timeouts.scoring``.

    Not run for a failed rollout. Shared scoring runs in the agent's runtime and is never
    retried. Isolated scoring starts a fresh runtime per call; an orchestrator retries it
    per ``scoring.retries`` with ``raise_retryable`` (``RETRY_ON["scoring"]``), reusing the
    collected artifacts. Any failure leaves ``trace.reward`` None and is recorded as an
    error, stopping the run as ``scoring_error`` (it replaces ``agent_completed`` and
    ``user_closed``; a limit or deadline stop stays); expiry stops it as ``scoring_timeout``.
    """
    if not scorable(state):
        return
    isolated = state.scoring.mode == "isolated"
    try:
        async with _stage(state, "scoring", state.config.timeouts.scoring, raise_retryable and isolated, raise_timeout):
            if isolated:
                await _stop_runtime(state)
                await score_isolated(state.task, state.trace, state.artifacts or b"", state.scoring,
                                     state.config.runtime, state.labels, state.judge_clients)
            else:
                await score_shared(state.task, state.trace, state.runtime, state.scoring, state.judge_clients)
    except RETRY_ON["scoring"]:
        state.trace.rewards.clear(), state.trace.metrics.clear(), state.trace.reward_weights.clear()
        raise


async def teardown(state: RolloutState) -> None:
    """Stop the runtime. Runs on every path; completes even if the caller is cancelled."""
    started = time.perf_counter()
    job = asyncio.ensure_future(_stop_runtime(state))
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        await job
        raise
    finally:
        state.trace.timings["teardown"] = round(time.perf_counter() - started, 6)


async def _stop_runtime(state: RolloutState) -> None:
    runtime, state.runtime = state.runtime, None
    if runtime is not None:
        with contextlib.suppress(Exception):
            await runtime.stop()


@contextlib.asynccontextmanager
async def _stage(state: RolloutState, stage: str, deadline: float | None, raise_retryable: bool,
                 raise_timeout: bool, label: str | None = None) -> AsyncIterator[None]:
    """Time a stage, enforce its deadline and record its failure on the trace."""
    trace = state.trace
    started = time.perf_counter()
    deadline_cm = asyncio.timeout(deadline)
    try:
        async with deadline_cm:
            yield
    except TimeoutError as exc:
        if deadline_cm.expired():
            error = StageTimeoutError(stage, deadline or 0.0)
            trace.record_timeout(stage)
            trace.info.setdefault("timeouts", []).append(str(error))
            if raise_timeout:
                raise error from None
        else:  # a TimeoutError raised by user code, not our deadline
            trace.record_error(exc, label or stage)
    except InfrastructureError as exc:
        if raise_retryable and exc.retryable and isinstance(exc, RETRY_ON.get(label or stage, ())):
            raise
        trace.record_error(exc, label or stage)
    except Exception as exc:
        trace.record_error(exc, label or stage)
    finally:
        if stage != "agent":
            trace.timings[stage] = round(time.perf_counter() - started, 6)
