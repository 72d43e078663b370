"""Dispatch an eval's rollouts to a Prefect work pool as ``shard`` flow runs.

Prefect is the distributed engine: the eval flow makes sure a ``shard`` deployment exists on the
work pool, submits every shard with ``run_deployment`` (a subflow of the eval flow run, with an
idempotency key), keeps at most ``max_shards_in_flight`` submitted, and waits for workers on any
machine to run them. Progress is read from durable rows. Shard flow runs that an earlier eval flow
run of the same run left live (``--resume`` after the eval died) are cancelled, and waited for,
before planning. A shard that ends in any state but Completed with rollouts still without a row
is submitted again with just those rollouts, up to ``shard_attempts`` times in all. A worker that
dies (``kill -9``, a lost machine) stops sending its flow run's heartbeats; the zombie automation
(``zombies.py``, created here if missing) sets such a flow run to Crashed, and it is re-submitted like
any other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from prefect import get_client, get_run_logger
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import arun_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Cancelling, Crashed

from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.eval_tables import DispatchConfig
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.budget import Budget
from prefect_rollouts.evals.plan import LatestAttempt, PlannedKey, next_attempt, retry_predicate
from prefect_rollouts.flows.services.zombies import (
    crash_stuck_pending,
    crash_subflows,
    crash_tag,
    ensure_zombie_automation,
)
from prefect_rollouts.flows.shard import ENTRYPOINT, shard_flow
from prefect_rollouts.traces import DatasetRoot
from prefect_rollouts.traces.read import latest_attempts

FINAL = {StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}
POLL_S = 2.0
"""How often (seconds) the eval reads its shard flow runs' states."""
PROGRESS_S = 10.0
"""How often (seconds) the durable rows are read for progress while no shard ends (each read lists
and opens the run's row files, a cost on an object store); a shard's end reads them at once."""


@dataclass
class Shard:
    """A shard of the plan: its rollouts, and the flow run of its current submission."""

    index: int
    rollouts: list[PlannedKey]
    """Each rollout with the attempt the eval planned for it (``flows/shard.py``)."""
    attempt: int = 0
    flow_run_id: UUID | None = None
    states: list[str] = field(default_factory=list)
    """The final state of each submission, e.g. ``["Crashed", "Completed"]``."""


@dataclass
class DispatchReport:
    """How the shards ended: ``failed`` holds the shards whose rollouts still lack rows after
    their last attempt."""

    shards: list[Shard]
    failed: list[Shard]
    missing: list[PlannedKey]
    """Planned rollouts without a durable row of their planned attempt."""


async def dispatch(config: EvalConfig, root: DatasetRoot, run_id: str, todo: list[PlannedKey], *,
                   on_progress: Callable[[int], Awaitable[None]], budget: Budget | None = None) -> DispatchReport:
    """Run ``todo`` as shard flow runs on ``config.dispatch.work_pool`` and wait for all of them.

    Args:
        root: The dataset root; workers must see it at the same place (a shared path mounted at
            the same absolute path, or an object store). A ``[traces] store`` block is resolved
            again by each shard.
        todo: ``(environment, task id, rollout index, attempt)`` of the rollouts to run, in plan order:
            the attempt the eval planned (1, or one past an attempt that runs again). A shard runs a
            rollout until that attempt is written, and on while the run's retries take it (``_pending``),
            so a re-submitted shard never runs an attempt twice.
        on_progress: Called with how many rollouts of ``todo`` are finished (need no further attempt)
            after every poll.
        budget: The run's shared budget (``flows/services/budget.py``): once reached, no shard is submitted or
            submitted again; the shards in flight stop their rollouts themselves.

    Returns:
        Every shard with its submissions' final states, and the rollouts left without a row.

    Raises:
        ConfigError: the work pool does not exist (a config that holds a secret never gets here:
            ``evals.prepare.prepare_eval`` refuses it).
    """
    settings = config.dispatch
    assert settings.work_pool is not None
    logger = get_run_logger()
    async with get_client() as client:
        deployment_id = await ensure_shard_deployment(client, settings)
        await ensure_zombie_automation(client, settings)
        again = retry_predicate(config)   # in-run retries a shard left; --retry-errors is in the planned attempts
        planned = todo   # progress counts over every rollout the eval planned
        if await _end_leftovers(client, run_id, settings.crash_after_s + 30):   # a resume after the eval died
            todo = _pending(todo, latest_attempts(root, run_id), again)
        first = await next_shard_index(client, run_id)   # a resume numbers on: its names never clash
        shards = [Shard(first + i, todo[start:start + settings.shard_size])
                  for i, start in enumerate(range(0, len(todo), settings.shard_size))]
        queue, in_flight = list(shards), dict[UUID, Shard]()
        failed: list[Shard] = []
        logger.info("run %s: %d rollouts in %d shards for work pool %r", run_id, len(todo), len(shards),
                    settings.work_pool)
        idle = _IdlePool(settings.work_pool)
        progress_read = time.monotonic()
        try:
            while queue or in_flight:
                if queue and budget is not None and await budget.check():
                    logger.warning("run %s: the budget is reached (%s); %d shards not submitted", run_id,
                                   budget.spent.text(), len(queue))
                    failed += queue
                    queue.clear()
                while queue and len(in_flight) < settings.max_shards_in_flight:
                    shard = queue.pop(0)
                    shard.flow_run_id = await _submit(deployment_id, config, root, run_id, shard)
                    in_flight[shard.flow_run_id] = shard
                await asyncio.sleep(POLL_S)
                runs = await _read(client, list(in_flight))
                await crash_stuck_pending(client, runs, settings)
                ended = any(run.state_type in FINAL for run in runs)
                if ended or time.monotonic() - progress_read >= PROGRESS_S:
                    latest = latest_attempts(root, run_id)   # after the states: a Completed shard's rows are all here
                    progress_read = time.monotonic()
                    await on_progress(len(planned) - len(_pending(planned, latest, again)))
                await idle.check(client, runs, logger)
                for run in runs:
                    if run.state_type not in FINAL:
                        continue
                    shard = in_flight.pop(run.id)
                    shard.states.append(ended_text(run))
                    if run.state_type == StateType.CRASHED:
                        await crash_subflows(client, run.id)
                    pending = _pending(shard.rollouts, latest, again)
                    if not pending:
                        continue
                    if run.state_type != StateType.CANCELLED and shard.attempt + 1 < settings.shard_attempts \
                            and not (budget is not None and await budget.check()):
                        logger.warning("shard %d ended %s with %d of %d rollouts without a row: submitting them "
                                       "again (attempt %d of %d)", shard.index, shard.states[-1], len(pending),
                                       len(shard.rollouts), shard.attempt + 2, settings.shard_attempts)
                        shard.rollouts, shard.attempt = pending, shard.attempt + 1
                        queue.insert(0, shard)
                    else:
                        failed.append(shard)
        finally:
            if in_flight:   # the eval is cancelled or failed: its shards stop too
                await asyncio.shield(_cancel(client, list(in_flight)))
    latest = latest_attempts(root, run_id)
    return DispatchReport(shards, failed, _pending(todo, latest, None))


def _pending(rollouts: list[PlannedKey], latest: dict[tuple[str, str, int], LatestAttempt],
             again: Callable[[LatestAttempt], bool] | None) -> list[PlannedKey]:
    """The rollouts that still need an attempt (``plan.next_attempt``); with ``again`` None, those whose
    planned attempt has no row."""
    return [planned for planned in rollouts
            if next_attempt(planned[3], latest.get(planned[:3]), again) is not None]


async def ensure_shard_deployment(client: PrefectClient, settings: DispatchConfig) -> UUID:
    """Create or update the ``shard/<work pool>`` deployment (entrypoint in the installed package,
    no code storage, flow run heartbeats every ``heartbeat_s``) and return its id.

    Raises:
        ConfigError: the work pool does not exist on this Prefect API.
    """
    pool = settings.work_pool
    assert pool is not None
    try:
        await client.read_work_pool(pool)
    except ObjectNotFound:
        raise ConfigError(f"[dispatch] work_pool = {pool!r}: no such work pool on this Prefect server. Create it "
                          f"(.venv/bin/prefect work-pool create {pool} --type process) and start workers on it "
                          f"(.venv/bin/prefect worker start --pool {pool})") from None
    flow_id = await client.create_flow_from_name(shard_flow.name)
    return await client.create_deployment(
        flow_id=flow_id, name=pool, work_pool_name=pool, entrypoint=ENTRYPOINT,
        parameter_openapi_schema=shard_flow.parameters.model_dump_for_openapi(), enforce_parameter_schema=False,
        job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(settings.heartbeat_s)}},
        tags=["prefect-rollouts", "shard"],
        description="A shard of a prefect-rollouts eval, submitted by the eval flow (flows/services/dispatch.py).")


async def _submit(deployment_id: UUID, config: EvalConfig, root: DatasetRoot, run_id: str, shard: Shard) -> UUID:
    key = f"{run_id}:{flow_run.id}:shard-{shard.index}:attempt-{shard.attempt}"
    where = root.path if root.is_local else root.uri   # an absolute path, or a URI without credentials
    parameters: dict[str, Any] = {"run_id": run_id, "config": config.model_dump(mode="json"), "root": where,
                                  "rollouts": [list(key_) for key_ in shard.rollouts], "shard_index": shard.index,
                                  "attempt": shard.attempt + 1}
    submitted = await arun_deployment(deployment_id, parameters=parameters, timeout=0, idempotency_key=key,
                                      tags=[run_tag(run_id), crash_tag(config.dispatch)],
                                      job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY":
                                                             str(config.dispatch.heartbeat_s)}},
                                      flow_run_name=f"{run_id} · shard {shard.index}"
                                                    + (f" · attempt {shard.attempt + 1}" if shard.attempt else ""))
    return submitted.id


def ended_text(run: FlowRun) -> str:
    """How a shard flow run ended, as the eval's warnings and failure say it: ``<state>: <message>``
    (the message cut to 300 characters). A Crashed shard says first that the process running it
    died, which is what Crashed means here (its worker killed, out of memory, its machine lost)."""
    message = run.state.message[:300] if run.state and run.state.message else ""
    if run.state_type == StateType.CRASHED:
        return ("Crashed: the process running the shard died (its worker was killed, ran out of memory or lost "
                "its machine)" + (f"; {message}" if message else ""))
    return f"{run.state_name}: {message}" if message else str(run.state_name)


async def _read(client: PrefectClient, ids: list[UUID]) -> list[FlowRun]:
    if not ids:
        return []
    return await client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))


class _IdlePool:
    """Warns when the submitted shards wait with no worker taking them (none polls the pool, or
    every worker is busy): first after ``WAIT_WARNING_S``, then every ``WAIT_WARNING_S`` again."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.since: float | None = None
        self.warned = 0.0

    async def check(self, client: PrefectClient, runs: list[FlowRun], logger: Any) -> None:
        now = asyncio.get_running_loop().time()
        if any(run.state_type != StateType.SCHEDULED for run in runs) or not runs:
            self.since = None
            return
        if self.since is None:
            self.since = now
        if now - self.since < WAIT_WARNING_S or now - self.warned < WAIT_WARNING_S:
            return
        self.warned = now
        status = (await client.read_work_pool(self.pool)).status
        who = ("no worker is polling it: start one with .venv/bin/prefect worker start --pool "
               f"{self.pool} --limit 2" if str(status).endswith("NOT_READY") else "its workers are busy")
        logger.warning("%d shard flow runs have waited %.0f s for work pool %r: %s", len(runs), now - self.since,
                       self.pool, who)


WAIT_WARNING_S = 30.0


def run_tag(run_id: str) -> str:
    """The tag of every shard flow run of eval run ``run_id``."""
    return f"prefect-rollouts-run:{run_id}"


async def next_shard_index(client: PrefectClient, run_id: str, page: int = 200) -> int:
    """One past the highest ``shard_index`` of the shard flow runs of ``run_id`` on this API (0 for
    a new run): a resumed run's shards are numbered on from its earlier ones."""
    highest, offset = -1, 0
    while runs := await client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(
            all_=[run_tag(run_id)])), limit=page, offset=offset):
        highest = max([highest, *(int(run.parameters.get("shard_index", -1)) for run in runs)])
        offset += len(runs)
    return highest + 1


async def _end_leftovers(client: PrefectClient, run_id: str, timeout_s: float) -> int:
    """Cancel the shard flow runs of ``run_id`` that an earlier eval flow run left live (it died, or
    was killed, and is being resumed) and wait until they are final, so no rollout runs twice.

    Returns:
        How many there were. A run whose process is gone is set Crashed by the zombie automation
        within ``crash_after_s``; one still live after ``timeout_s`` (its process neither answered
        the cancellation nor was crashed: e.g. it died before this version's automation armed on
        its Running state) is set Crashed here, with a warning, so no dead shard is waited on.
    """
    live = FlowRunFilter(tags=FlowRunFilterTags(all_=[run_tag(run_id)]), state=FlowRunFilterState(
        type=FlowRunFilterStateType(any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING,
                                          StateType.PAUSED, StateType.CANCELLING])))
    leftovers = await client.read_flow_runs(flow_run_filter=live)
    if not leftovers:
        return 0
    get_run_logger().warning("run %s: %d shard flow runs of an earlier eval flow run are still live; cancelling "
                             "them before planning, so no rollout runs twice", run_id, len(leftovers))
    await _cancel(client, [run.id for run in leftovers if run.state_type != StateType.CANCELLING])
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await client.read_flow_runs(flow_run_filter=live):
        if asyncio.get_running_loop().time() > deadline:
            stuck = await client.read_flow_runs(flow_run_filter=live)
            get_run_logger().warning("run %s: %d shard flow runs did not end %.0f s after their cancellation; "
                                     "setting them Crashed and going on: %s", run_id, len(stuck), timeout_s,
                                     ", ".join(f"{run.name} ({run.id})" for run in stuck))
            for run in stuck:
                await client.set_flow_run_state(run.id, Crashed(
                    message=f"did not end {timeout_s:.0f} s after its eval was resumed and cancelled it: "
                            "its process is gone"), force=True)
            break
        await asyncio.sleep(POLL_S)
    return len(leftovers)


async def _cancel(client: PrefectClient, ids: list[UUID]) -> None:
    for flow_run_id in ids:
        try:
            await client.set_flow_run_state(flow_run_id, Cancelling(message="the eval flow run stopped"), force=True)
        except Exception:
            pass
