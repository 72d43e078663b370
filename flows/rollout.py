"""``rollout_flow``: one rollout as one Prefect flow run whose stages are task runs.

``Agent.run`` calls it directly (a subflow when called inside another flow): the flow body
runs ``Rollout.run()`` with the ``PrefectOrchestrator``, so each stage is a task run.

An ``Agent.interaction`` is driven by its caller, one ``turn()`` at a time, yet must stay one
flow run with a ``segment-<n>`` task run per turn. Task runs belong to the flow run whose
context they are created in, and Prefect's public API opens that context only around a flow
function's body. So the interaction's orchestrator (``FlowChannel``) starts ``rollout_flow``
in the background and hands it each stage call as a closure through a queue; the flow body
runs them in order, as task runs, until the interaction closes. This is the simplest way
that works with public API: entering a flow run's context by hand (``FlowRunContext``, the
flow engine's internals) would avoid the queue but tie us to Prefect internals that change
between minor versions, and a flow run per turn would split the interaction in the UI.

States tell what happened: a rollout that ended in an error (``trace.errors``: a provider,
runtime, setup or scoring error, ...) ends its flow run **Failed**, with ``<error type>:
<message>`` as the state message, and the trace as the state's data (``rollout_outcome``); the
stage that raised is a Failed task run already. Scored 0, truncated, timed out or skipped is
Completed. The trace is the record either way: callers take it from the final state
(``trace_of``; a Failed state holds it in a ``RolloutFailedError``) and write its row.

In the UI a rollout flow run is named ``<task id> #<rollout index> · <model>`` (``RUN_NAME``; a
rollout's attempt past the first adds `` · attempt <n>`` before the model),
and its last log line says how it ended: reward, reward components, stop condition and the first
error, if any (``traces.summary.outcome_line``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prefect import flow, get_run_logger
from prefect.states import Failed, State
from pydantic import BaseModel, PrivateAttr

from prefect_rollouts.errors import RolloutFailedError
from prefect_rollouts.flows.services.ownership import owner_tags, sandbox_labels, untagged_tasks
from prefect_rollouts.rollout import Rollout, StagePolicy
from prefect_rollouts.tasks import PrefectOrchestrator
from prefect_rollouts.trace import Trace
from prefect_rollouts.traces.summary import error_text, outcome_line

T = TypeVar("T")
_Job = tuple[Callable[[], Awaitable[Any]], "asyncio.Future[Any]"]

RUN_NAME = "{rollout.task_id} #{rollout.rollout_index}{rollout.attempt_part} · {rollout.model}"
"""A rollout flow run's name (a template of its ``RolloutRequest``), e.g. ``n3 #1 · gpt-4o``."""


class RolloutRequest(BaseModel):
    """The flow run's parameters: what the UI shows (ids, model; never a secret).

    The live ``Rollout`` (task object, model client, runtime) rides along as a private
    attribute, which Prefect neither serialises nor sends to its server.
    """

    rollout_id: str
    task_id: str
    task_type: str
    model: str
    rollout_index: int = 0
    """Which rollout of its task this is (0 for ``Agent.run``)."""
    run_id: str | None = None
    attempt: int = 1
    """Which attempt of the rollout this is (the row's ``attempt``; ``evals.plan.Planned.attempt``)."""
    _rollout: Rollout | None = PrivateAttr(default=None)
    _jobs: asyncio.Queue[_Job | None] | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, rollout: Rollout, jobs: asyncio.Queue[_Job | None] | None = None) -> RolloutRequest:
        """The request for ``rollout`` (and, for an interaction, the queue of its stage calls)."""
        trace = rollout.trace
        request = cls(rollout_id=trace.id, task_id=trace.task_id, task_type=trace.task_type, model=trace.model,
                      rollout_index=int(rollout.labels.get("rollout_index", 0)), run_id=rollout.labels.get("run_id"),
                      attempt=int(rollout.labels.get("attempt", 1)))
        request._rollout, request._jobs = rollout, jobs
        return request

    @property
    def attempt_part(self) -> str:
        """``" · attempt 2"`` in the flow run's name past the first attempt (``RUN_NAME``); empty for the first."""
        return f" · attempt {self.attempt}" if self.attempt > 1 else ""

    def run_name(self) -> str:
        """The name of this rollout's flow run (``RUN_NAME``)."""
        return RUN_NAME.format(rollout=self)


@flow(name="rollout", flow_run_name=RUN_NAME, validate_parameters=False,
      persist_result=False, log_prints=False)
async def rollout_flow(rollout: RolloutRequest) -> Trace | State[Trace]:
    """Run one rollout: setup, then a task run per harness segment, finalize, skip-check and scoring, then teardown.

    Args:
        rollout: Ids and model of the rollout (the flow run's parameters); carries the live rollout.

    Its last log line is the rollout's outcome (``outcome_line``): one more log record per rollout,
    sent in the batches Prefect sends logs in.

    Returns:
        The finished ``Trace``; in a Failed state (``rollout_outcome``) when the rollout errored.
        Call with ``return_state=True`` and take the trace with ``trace_of``: rollout failures
        are on the trace, never raised.
    """
    live = rollout._rollout
    if live is None:
        raise ValueError("rollout_flow needs a RolloutRequest made with RolloutRequest.of(rollout)")
    live.labels.update(sandbox_labels())   # the janitor's evidence: this flow run, on this API
    live.trace.info["flow_run_id"] = live.labels["flow_run_id"]
    with untagged_tasks():
        if rollout._jobs is None:
            live.orchestrator = PrefectOrchestrator()
            trace = await live.run()
        else:
            trace = await _serve_stages(live, rollout._jobs)
    get_run_logger().info(outcome_line(trace))
    return rollout_outcome(trace)


def rollout_outcome(trace: Trace) -> Trace | State[Trace]:
    """What a rollout's flow or task run returns: ``trace`` itself (Completed), or, when the rollout
    errored, a ``Failed`` state whose message is its first error, ``<type>: <message>`` (the row's
    ``error_type`` and ``error_message``), holding a ``RolloutFailedError`` with the trace. No
    extra API call: it is the run's final state."""
    message = failure_message(trace)
    return trace if message is None else Failed(message=message, data=RolloutFailedError(message, trace))


def failure_message(trace: Trace) -> str | None:
    """The state message of a rollout that errored, ``<type>: <message>`` of its first error; None if it did not."""
    if not trace.errors:
        return None
    return error_text(trace.errors[0].type, trace.errors[0].message)


async def trace_of(final: State[Any]) -> Trace | None:
    """The trace a rollout flow or task run returned (``rollout_outcome``), Completed or Failed;
    None when the run ended without one (it crashed, or never ran the rollout)."""
    result = await final.aresult(raise_on_failure=False)
    if isinstance(result, RolloutFailedError):
        return result.trace
    return result if isinstance(result, Trace) else None


async def _run_flow(request: RolloutRequest) -> Trace:
    """``rollout_flow`` for a caller that wants the trace: errored or not, it is returned.

    Raises:
        Exception: why the flow run crashed (a failure outside the rollout's stages).
    """
    final = await rollout_flow(request, return_state=True)
    trace = await trace_of(final)
    if trace is None:
        await final.aresult()   # raises what ended the run
        raise RuntimeError(f"rollout flow run ended {final.name} without a trace: {final.message}")
    return trace


async def _serve_stages(live: Rollout, jobs: asyncio.Queue[_Job | None]) -> Trace:
    """Run the stage calls an interaction sends, in order, until it closes; then release the runtime."""
    try:
        while (job := await jobs.get()) is not None:
            call, reply = job
            try:
                reply.set_result(await call())
            except Exception as exc:   # a stage's failure: the caller's Rollout records it
                reply.set_exception(exc)
            except BaseException as exc:
                reply.set_exception(exc)
                raise
    finally:
        await live.release()   # nothing may outlive the flow run, whatever the caller did
    return live.trace


async def run_rollout_flow(rollout: Rollout) -> Trace:
    """``Agent.run`` through Prefect: one ``rollout_flow`` run, tagged with its owner process."""
    with owner_tags():
        return await _run_flow(RolloutRequest.of(rollout))


class FlowChannel:
    """The orchestrator of an ``Interaction`` under Prefect: each stage runs as a task run of one
    background ``rollout_flow`` run, started at the first stage (see the module docstring)."""

    def __init__(self, rollout: Rollout) -> None:
        self._rollout = rollout
        self._jobs: asyncio.Queue[_Job | None] = asyncio.Queue()
        self._flow: asyncio.Task[Trace] | None = None
        self._stages = PrefectOrchestrator()

    async def run_stage(self, name: str, fn: Callable[[], Awaitable[T]], policy: StagePolicy) -> T:
        """Run the stage in the flow run as a task run (``Orchestrator.run_stage``)."""
        if self._flow is None:
            with owner_tags():   # the task copies the context, tags included
                self._flow = asyncio.create_task(_run_flow(RolloutRequest.of(self._rollout, self._jobs)))
        reply: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._jobs.put((lambda: self._stages.run_stage(name, fn, policy), reply))
        pending: list[asyncio.Future[Any]] = [reply, self._flow]
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            self._flow.result()  # the flow run ended early: raise why
            raise RuntimeError(f"the rollout flow run ended before running stage {name!r}")
        return reply.result()

    async def aclose(self) -> None:
        """End the flow run (after the rollout's last stage) and wait for it."""
        if self._flow is not None and not self._flow.done():
            await self._jobs.put(None)
            await asyncio.shield(self._flow)
