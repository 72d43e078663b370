"""The rollout lifecycle as plain async stages over one rollout's private ``RolloutState``.

Order: ``setup`` -> ``run_segment`` (once per harness segment) -> ``finalize`` ->
``skip_check`` -> ``score`` (shared or isolated) -> ``teardown`` (always). ``Rollout``
(``rollout.py``) is the only caller: it runs each stage through an orchestrator's
``run_stage`` with the stage's policy, and records what a stage raises on the trace.

A stage raises what went wrong. Before raising, it undoes what a retry must not see twice
(setup stops the runtime it started, isolated scoring drops partial rewards); a segment keeps
what it did, and the next call resumes it (see ``run_segment``). A stage deadline that expires
is recorded on the trace and raised as ``StageTimeoutError``, so an orchestrator can show the
stage as timed out; a ``TimeoutError`` from user code is an ordinary error. Sync task code (hooks,
rewards, metrics, judges' parsers) runs in a worker thread, so a deadline holds for it too; a
call still running at the deadline is abandoned and named in ``trace.info["abandoned_threads"]``
(``threads.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from prefect_rollouts.config.agent import with_task_network
from prefect_rollouts.errors import AgentFailure, BudgetStop, InfrastructureError, StageTimeoutError
from prefect_rollouts.rollout_state import RolloutState, Segment
from prefect_rollouts.runtimes import make_runtime
from prefect_rollouts.runtimes.egress.proxy import mark_phase, take_network_log
from prefect_rollouts.scoring.judge_base import JUDGE_BUDGET
from prefect_rollouts.scoring.placement import score_isolated, score_shared
from prefect_rollouts.task import call_injected
from prefect_rollouts.threads import note_in
from prefect_rollouts.trace import UNFINISHED_STOPS, SegmentRecord, last_assistant_text
from prefect_rollouts.unwind import run_to_end

if TYPE_CHECKING:
    pass


async def setup(state: RolloutState) -> None:
    """``Task.prepare`` (the agent config the task's rollout runs with, e.g. its own image and
    deadlines, becomes ``state.config``; its ``runtime.network`` composed with ``TaskData.network``),
    then start the runtime, write ``TaskData.files``, run ``Task.setup`` and open the harness. The
    network records from then on are the ``agent`` phase's.

    Deadline ``timeouts.setup`` (expiry: ``setup_timeout``). On any failure the runtime it
    started is stopped before the error propagates, so a retry starts a fresh one.

    Raises:
        RuntimeUnavailableError: the runtime did not start (retried per the policy when retryable).
        StageTimeoutError: the deadline expired (recorded on the trace).
        Exception: whatever ``Task.prepare``, ``Task.setup`` or the harness raised.
    """
    try:
        async with _timed(state, "setup", state.config.timeouts.setup):
            state.config = config = with_task_network(await state.task.prepare(state.config), state.task.data.network,
                                                         state.task.id)
            state.runtime = make_runtime(config.runtime, labels=state.labels, binds=state.harness.binds,
                                         egress=state.egress)
            await state.runtime.start()
            for path, content in state.task.data.files.items():
                await state.runtime.write_file(path, content)
            await call_injected(state.task.setup, {"runtime": state.runtime, "trace": state.trace, "task": state.task},
                                "setup hook", note_in(state.trace.info))
            await state.harness.open(state)
            mark_phase(state.runtime, "agent")
    except BaseException:
        await stop_runtime(state)
        raise


async def run_segment(state: RolloutState, messages: list[dict[str, Any]]) -> Segment:
    """Deliver ``messages`` (user input) and run one harness segment.

    The agent deadline (``timeouts.agent``) is a budget over all segments (expiry:
    ``agent_timeout``). When a segment raises, the next call (the retry, with the same
    ``messages``) resumes it where the failed model call left it: the messages, tool results
    and steers already delivered stay, because their side effects (files written, a
    benchmark's live tool state) happened and cannot be undone.

    Returns:
        ``Segment``; ``terminated`` is True when the run has stopped (an empty one if it
        had stopped before).

    An ``AgentFailure`` the harness raises (its program failed on its own) ends the segment and the
    run as ``Trace.record_agent_failure`` says; it is not raised.

    Raises:
        ProviderError: a model call failed after the client's retries.
        StageTimeoutError: the agent budget ran out (recorded on the trace).
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
        async with _timed(state, "agent", remaining, timing=False):
            await state.harness.run_segment(state)
    except AgentFailure as failure:   # the agent's own failure is its result: recorded, then scored
        trace.record_agent_failure(failure)
    except Exception:
        state.resume_segment = not state.stopped   # the failed call is on the trace; a retry samples again
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


async def finalize(state: RolloutState) -> None:
    """Run ``Task.finalize`` (deadline ``timeouts.finalize``, expiry -> ``finalize_timeout``,
    scoring still runs), check the runtime's disk quota; for isolated scoring, then collect
    ``TaskData.artifacts``.

    Raises:
        StageTimeoutError: the deadline expired (recorded on the trace).
        Exception: whatever ``Task.finalize`` or the artifact collection raised. An ``AgentFailure``
            (``Runtime.check_storage``: the rollout filled its disk quota; or the hook's command in
            such a box) is recorded (``Trace.record_agent_failure``), not raised.
    """
    async with _timed(state, "finalize", state.config.timeouts.finalize):
        available = {"trace": state.trace, "runtime": state.runtime, "task": state.task}
        try:   # a box the agent filled past its disk quota fails the hook's commands too: scored 0 (skip_check)
            await call_injected(state.task.finalize, available, "finalize hook", note_in(state.trace.info))
            if state.runtime is not None:
                await state.runtime.check_storage()
        except AgentFailure as failure:
            state.trace.record_agent_failure(failure)
        if state.scoring.mode == "isolated" and state.runtime is not None:
            state.artifacts, missing = await state.runtime.collect_artifacts(list(state.task.data.artifacts))
            if missing:
                state.trace.info["artifacts_missing"] = missing


def scorable(state: RolloutState) -> bool:
    """False when the run failed, setup did not finish (``setup_timeout``) or the eval's budget stopped
    it (``UNFINISHED_STOPS``: it runs again on resume): reward stays None."""
    return not state.trace.errors and state.trace.stop_condition not in ("setup_timeout", *UNFINISHED_STOPS)


def skip_check(state: RolloutState) -> str | None:
    """Apply ``skip_on_truncated`` / ``skip_on_timeout``.

    An agent failure recorded with ``scored = False`` (``Trace.record_agent_failure``: the agent
    filled its disk quota or broke its box) skips scoring the same way, its stop condition the reason.

    Returns:
        ``"truncated"``, ``"timeout"`` or that stop condition when scoring is skipped (then ``trace.reward`` is 0,
        no task rewards or metrics are kept, ``trace.info["scoring_skipped"]`` holds the
        reason); None when scoring should run.
    """
    trace, scoring = state.trace, state.scoring
    reason = None
    failure = trace.info.get("agent_failure")
    if failure is not None and failure.get("scored") is False:   # the agent broke its box: nothing to score
        reason = failure["stop_condition"]
    elif scoring.skip_on_truncated and trace.is_truncated:
        reason = "truncated"
    elif scoring.skip_on_timeout and trace.is_timeout:
        reason = "timeout"
    if reason is not None:
        trace.info["scoring_skipped"] = reason
        trace.rewards.clear()
        trace.metrics.clear()
        trace.reward = 0.0
    return reason


async def score(state: RolloutState) -> None:
    """Score the rollout once in its placement (``scoring.mode``) under ``timeouts.scoring``.

    Shared scoring runs in the agent's runtime. Isolated scoring stops the agent's runtime and
    starts a fresh one per call, reusing the collected artifacts; the rewards of a call that
    failed on infrastructure are dropped, so a retry starts clean (other failures keep the
    grades already given, e.g. a judge's None beside the other judges). An ``AgentFailure`` a scoring
    function raises (``agent_exits.box_broken``) gives reward 0 as one with ``scored = False`` does.

    Judge calls check the eval's budget before they start and charge it after (``judge_base.JUDGE_BUDGET``);
    once it is reached no judge call starts and the rollout stops as ``budget`` (reward None, not done).

    Raises:
        InfrastructureError: the scoring runtime failed (isolated scoring retries it).
        TaskError: a scoring function or judge failed.
        StageTimeoutError: the deadline expired (recorded on the trace: ``scoring_timeout``).
    """
    isolated = state.scoring.mode == "isolated"
    gate = JUDGE_BUDGET.set(state.budget)   # each judge call checks and charges the eval's budget
    try:
        async with _timed(state, "scoring", state.config.timeouts.scoring):
            if isolated:
                await stop_runtime(state)
                await score_isolated(state.task, state.trace, state.artifacts or b"", state.scoring,
                                     state.config.runtime, state.labels, state.judge_clients, state.egress)
            else:
                mark_phase(state.runtime, "scoring")
                await score_shared(state.task, state.trace, state.runtime, state.scoring, state.judge_clients)
    except AgentFailure as failure:   # the agent broke its box, the tests cannot run: reward 0 (skip_check)
        state.trace.record_agent_failure(AgentFailure(str(failure), failure.stop_condition, scored=False))
        skip_check(state)
    except InfrastructureError:   # may be retried: the next attempt starts clean
        state.trace.rewards.clear()
        state.trace.metrics.clear()
        state.trace.reward_weights.clear()
        raise
    except BudgetStop:   # reached before a judge call: not scored, not done (a resume runs it again)
        state.trace.stop("budget", override=True)
        state.trace.rewards.clear()
        state.trace.reward_weights.clear()
        state.trace.reward = None
    finally:
        JUDGE_BUDGET.reset(gate)


async def teardown(state: RolloutState) -> None:
    """Stop the runtime, then close the harness. Runs on every path; completes even if cancelled."""
    started = time.perf_counter()
    try:
        await run_to_end(stop_runtime(state, close_harness=True))
    finally:
        state.trace.timings["teardown"] = round(time.perf_counter() - started, 6)


async def stop_runtime(state: RolloutState, *, close_harness: bool = False) -> None:
    """Stop and forget the rollout's runtime (errors while stopping are swallowed); its network
    records go onto the trace. ``close_harness``: then close the harness too (teardown)."""
    runtime, state.runtime = state.runtime, None
    try:
        if runtime is not None:
            try:
                with contextlib.suppress(Exception):
                    await runtime.stop()
            finally:
                take_network_log(runtime, state.trace)
    finally:
        if close_harness and (close := getattr(state.harness, "close", None)) is not None:
            close()


@contextlib.asynccontextmanager
async def _timed(state: RolloutState, stage: str, deadline: float | None, timing: bool = True) -> AsyncIterator[None]:
    """Time a stage into ``trace.timings`` and enforce its deadline: on expiry record the timeout
    on the trace and raise ``StageTimeoutError``."""
    trace = state.trace
    started = time.perf_counter()
    deadline_cm = asyncio.timeout(deadline)
    try:
        async with deadline_cm:
            yield
    except TimeoutError:
        if not deadline_cm.expired():
            raise   # a TimeoutError of user code, not our deadline
        error = StageTimeoutError(stage, deadline or 0.0)
        trace.record_timeout(stage)
        trace.info.setdefault("timeouts", []).append(str(error))
        raise error from None
    finally:
        if timing:
            trace.timings[stage] = round(time.perf_counter() - started, 6)
