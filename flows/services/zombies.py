"""Shard flow runs whose process is gone, found and ended so the eval submits their rollouts again.

A worker that dies (``kill -9``, a lost machine) stops sending its flow run's heartbeats: the zombie
automation (Prefect's documented zombie-flow detection, one per ``crash_after_s`` window) sets such a flow
run to Crashed. A run taken by a worker that died before it turned Running is crashed by the eval itself
(``crash_stuck_pending``), and a crashed shard's live rollout subflows with it (``crash_subflows``).
``dispatch.py`` uses these.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.states import Crashed

from prefect_rollouts.config.eval_tables import DispatchConfig

ZOMBIE_AUTOMATION = "prefect-rollouts: crash shard flow runs without heartbeats"


def crash_tag(settings: DispatchConfig) -> str:
    """The tag of shard flow runs that count as crashed after ``crash_after_s`` without a heartbeat."""
    return f"prefect-rollouts-crash-after:{settings.crash_after_s}"


ZOMBIE_AFTER = {"prefect.flow-run.Running", "prefect.flow-run.heartbeat"}
"""Events that arm the zombie automation: a shard's process must then send a heartbeat (or reach a
final state) within ``crash_after_s``. Running arms it too, so a process that dies before its first
heartbeat (killed in the second it turned Running) is crashed like one that stops sending them.
Pending does not: a busy machine took 53 s from Pending to Running here, too close to the window."""
ZOMBIE_EXPECT = {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                 "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"}


def zombie_automation(settings: DispatchConfig) -> AutomationCore:
    """The automation that sets a shard flow run tagged ``crash_tag`` to Crashed once it went
    ``crash_after_s`` after turning Running, or after its last heartbeat, without a heartbeat or a
    final state (Prefect's documented zombie-flow detection, armed by the state
    changes as well). One automation per window, each matching only the shard flow runs of evals
    that asked for it: an eval with a longer window never has its live shards crashed by another
    eval's shorter one."""
    trigger = EventTrigger(
        after=ZOMBIE_AFTER, expect=ZOMBIE_EXPECT,
        match={"prefect.resource.id": ["prefect.flow-run.*"]},
        match_related={"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{crash_tag(settings)}"},
        for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
        within=dt.timedelta(seconds=settings.crash_after_s))
    return AutomationCore(
        name=f"{ZOMBIE_AUTOMATION} ({settings.crash_after_s} s)", trigger=trigger,
        description="A shard flow run whose process died (its worker killed, its machine lost, also before its "
                    "first heartbeat) sends no more heartbeats: mark it Crashed so the eval submits its rollouts "
                    "again.",
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {settings.crash_after_s} s: the process running "
                                            "this shard is gone")])


async def ensure_zombie_automation(client: PrefectClient, settings: DispatchConfig) -> None:
    """Create ``zombie_automation(settings)`` unless it exists; replace the definition of one of
    its name that differs (an older version's, whose ``after`` held only the heartbeat, so a
    shard that died before its first heartbeat stayed Running for ever)."""
    wanted = zombie_automation(settings)
    existing = await client.read_automations_by_name(wanted.name)
    for automation in existing:
        if _definition(automation) != _definition(wanted):
            await client.update_automation(automation.id, wanted)
    if not existing:
        await client.create_automation(wanted)


def _definition(automation: AutomationCore) -> dict[str, Any]:
    """What an automation does (its trigger without the trigger's own id, its actions, enabled)."""
    return {"trigger": automation.trigger.model_dump(mode="json", exclude={"id"}),
            "actions": [action.model_dump(mode="json") for action in automation.actions],
            "enabled": automation.enabled}


PENDING_LIMIT_FACTOR = 3
"""A shard flow run Pending for this many ``crash_after_s`` is set Crashed by the eval
(``crash_stuck_pending``)."""


async def crash_stuck_pending(client: PrefectClient, runs: list[FlowRun], settings: DispatchConfig) -> None:
    """Set Crashed the shard flow runs Pending for ``PENDING_LIMIT_FACTOR * crash_after_s``: their
    worker took them and died before their process turned Running, so no heartbeat or state will
    ever come (the zombie automation is armed by Running, not Pending: a busy machine took 53 s from
    Pending to Running here). The next poll sees them Crashed and submits their rollouts again."""
    limit_s = PENDING_LIMIT_FACTOR * settings.crash_after_s
    now = dt.datetime.now(dt.UTC)
    for run in runs:
        since = run.state.timestamp if run.state_type == StateType.PENDING and run.state else None
        if since is not None and (now - since).total_seconds() > limit_s:
            get_run_logger().warning("shard flow run %s (%s) has been Pending for %.0f s: its worker is gone; "
                                     "setting it Crashed", run.name, run.id, (now - since).total_seconds())
            await client.set_flow_run_state(run.id, Crashed(
                message=f"Pending for more than {limit_s} s: the worker that took it is gone"))


async def crash_subflows(client: PrefectClient, shard_flow_run_id: UUID) -> None:
    """Set the still-live subflow runs (rollouts) of a crashed shard flow run to Crashed: their
    process is gone with the shard's, and nothing else would ever end them."""
    live = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[shard_flow_run_id]),
                         state=FlowRunFilterState(type=FlowRunFilterStateType(
                             any_=[StateType.PENDING, StateType.RUNNING, StateType.SCHEDULED])))
    for orphan in await client.read_flow_runs(flow_run_filter=live):
        await client.set_flow_run_state(orphan.id, Crashed(message=f"its shard flow run {shard_flow_run_id} crashed"),
                                        force=True)
