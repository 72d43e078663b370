"""``rollout_flow``: one rollout as one Prefect flow run whose stages are task runs.

``Agent.run`` calls it directly (a subflow when called inside another flow). An
``Agent.interaction`` runs it in the background with a command channel (``FlowOrchestrator``):
the caller's ``turn()`` calls become ``segment-<n>`` task runs of the same flow run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import flow
from pydantic import BaseModel, PrivateAttr

from prefect_rollouts.engine import run_rollout
from prefect_rollouts.flows.ownership import owner_tags, sandbox_labels
from prefect_rollouts.stages import RolloutState, Segment
from prefect_rollouts.tasks import TaskOrchestrator
from prefect_rollouts.trace import Trace


class RolloutRequest(BaseModel):
    """The flow run's parameters: what the UI shows (ids, model; never a secret).

    The rollout's live state (task object, model client, runtime) rides along as a private
    attribute, which Prefect neither serialises nor sends to its server.
    """

    rollout_id: str
    task_id: str
    task_type: str
    model: str
    run_id: str | None = None
    _state: RolloutState | None = PrivateAttr(default=None)
    _channel: asyncio.Queue[Any] | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, state: RolloutState, channel: asyncio.Queue[Any] | None = None) -> RolloutRequest:
        """The request for ``state`` (and, for an interaction, its command ``channel``)."""
        trace = state.trace
        request = cls(rollout_id=trace.id, task_id=trace.task_id, task_type=trace.task_type, model=trace.model,
                      run_id=state.labels.get("run_id"))
        request._state, request._channel = state, channel
        return request


@flow(name="rollout", flow_run_name="{rollout.task_id} · {rollout.model}", validate_parameters=False,
      persist_result=False, log_prints=False)
async def rollout_flow(rollout: RolloutRequest) -> Trace:
    """Run one rollout: setup, harness segments, finalize, skip-check, scoring, teardown, each a task run.

    Args:
        rollout: Ids and model of the rollout (the flow run's parameters); carries the live state.

    Returns:
        The finished ``Trace``. Rollout failures are on the trace, not raised.
    """
    state = rollout._state
    if state is None:
        raise ValueError("rollout_flow needs a RolloutRequest made with RolloutRequest.of(state)")
    state.labels.update(sandbox_labels())   # the janitor's evidence: this flow run, on this API
    state.trace.info["flow_run_id"] = state.labels["flow_run_id"]
    orchestrator = TaskOrchestrator()
    if rollout._channel is None:
        return await run_rollout(orchestrator, state)
    try:
        while True:
            command, args, reply = await rollout._channel.get()
            try:
                reply.set_result(await getattr(orchestrator, command)(state, *args))
            except BaseException as exc:  # surfaces in the caller's await, then ends the flow run
                reply.set_exception(exc)
                raise
            if command == "teardown":
                return state.trace
    finally:
        if state.runtime is not None:
            await orchestrator.teardown(state)


async def run_rollout_flow(state: RolloutState) -> Trace:
    """``Agent.run`` through Prefect: one ``rollout_flow`` run for ``state``, tagged with its owner process."""
    with owner_tags():
        return await rollout_flow(RolloutRequest.of(state))


class FlowOrchestrator:
    """The orchestrator of an ``Interaction`` under Prefect: sends each stage to a background
    ``rollout_flow`` run, so the whole exchange is one flow run."""

    def __init__(self) -> None:
        self._channel: asyncio.Queue[Any] = asyncio.Queue()
        self._flow: asyncio.Task[Trace] | None = None

    async def setup(self, state: RolloutState) -> None:
        """Start the flow run in the background and run its ``setup`` task."""
        with owner_tags():   # the task copies the context, tags included
            self._flow = asyncio.create_task(rollout_flow(RolloutRequest.of(state, self._channel)))
        await self._call("setup")

    async def segment(self, state: RolloutState, messages: list[dict[str, Any]]) -> Segment:
        """One ``segment-<n>`` task run in the flow run."""
        return await self._call("segment", messages)

    async def score(self, state: RolloutState) -> None:
        """The flow run's ``finalize``, ``skip-check`` and ``scoring`` task runs."""
        await self._call("score")

    async def teardown(self, state: RolloutState) -> None:
        """The ``teardown`` task run; then the flow run ends."""
        if self._flow is None or self._flow.done():
            return
        await self._call("teardown")
        await asyncio.shield(self._flow)

    async def _call(self, command: str, *args: Any) -> Any:
        assert self._flow is not None
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._channel.put((command, args, reply))
        await asyncio.wait({reply, self._flow}, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            self._flow.result()  # the flow run ended early: raise why
            raise RuntimeError(f"the rollout flow run ended before answering {command!r}")
        return reply.result()
