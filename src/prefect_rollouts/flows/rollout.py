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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prefect import flow
from pydantic import BaseModel, PrivateAttr

from prefect_rollouts.flows.ownership import owner_tags, sandbox_labels, untagged_tasks
from prefect_rollouts.rollout import Rollout, StagePolicy
from prefect_rollouts.tasks import PrefectOrchestrator
from prefect_rollouts.trace import Trace

T = TypeVar("T")
_Job = tuple[Callable[[], Awaitable[Any]], "asyncio.Future[Any]"]


class RolloutRequest(BaseModel):
    """The flow run's parameters: what the UI shows (ids, model; never a secret).

    The live ``Rollout`` (task object, model client, runtime) rides along as a private
    attribute, which Prefect neither serialises nor sends to its server.
    """

    rollout_id: str
    task_id: str
    task_type: str
    model: str
    run_id: str | None = None
    _rollout: Rollout | None = PrivateAttr(default=None)
    _jobs: asyncio.Queue[_Job | None] | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, rollout: Rollout, jobs: asyncio.Queue[_Job | None] | None = None) -> RolloutRequest:
        """The request for ``rollout`` (and, for an interaction, the queue of its stage calls)."""
        trace = rollout.trace
        request = cls(rollout_id=trace.id, task_id=trace.task_id, task_type=trace.task_type, model=trace.model,
                      run_id=rollout.labels.get("run_id"))
        request._rollout, request._jobs = rollout, jobs
        return request


@flow(name="rollout", flow_run_name="{rollout.task_id} · {rollout.model}", validate_parameters=False,
      persist_result=False, log_prints=False)
async def rollout_flow(rollout: RolloutRequest) -> Trace:
    """Run one rollout: setup, then a task run per harness segment, finalize, skip-check and scoring, then teardown.

    Args:
        rollout: Ids and model of the rollout (the flow run's parameters); carries the live rollout.

    Returns:
        The finished ``Trace``. Rollout failures are on the trace, not raised.
    """
    live = rollout._rollout
    if live is None:
        raise ValueError("rollout_flow needs a RolloutRequest made with RolloutRequest.of(rollout)")
    live.labels.update(sandbox_labels())   # the janitor's evidence: this flow run, on this API
    live.trace.info["flow_run_id"] = live.labels["flow_run_id"]
    with untagged_tasks():
        if rollout._jobs is None:
            live.orchestrator = PrefectOrchestrator()
            return await live.run()
        return await _serve_stages(live, rollout._jobs)


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
        return await rollout_flow(RolloutRequest.of(rollout))


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
                self._flow = asyncio.create_task(rollout_flow(RolloutRequest.of(self._rollout, self._jobs)))
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
