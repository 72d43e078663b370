"""One eval per run id at a time: the single slot of a Prefect global concurrency limit per run.

``hold_run(run_id)`` makes the eval flow run the run's holder for as long as it is entered. The
flow run first tags itself ``prefect-rollouts-eval:<run id>`` (with its owner tag, which names its
host and process), then takes the one slot of the limit ``prefect-rollouts-eval:<run id>`` with a
lease of ``LEASE_DURATION_S``, renewed every 45 s. At its end it deletes the limit, then gives the
lease back, so runs leave no limits behind (a killed eval leaves one until the run is resumed).

A second eval of the run finds the slot taken (HTTP 423) and is refused with ``RunInUseError``,
which names the run's other eval flow runs that are not final. A dead holder is told apart so:

- at once, when every other non-final eval flow run of the run names, by its owner tag, a process
  on this host that is gone (``kill -9`` of an eval, then ``--resume`` on the same machine), or
  when none is left: the limit is deleted (by id, so two such resumes cannot both win) and made
  again;
- otherwise when its lease lapses: a process that stopped renewing it (killed on another machine,
  lost) loses the slot within ``LEASE_DURATION_S`` plus the server's 15 s repossessor loop.

Having taken the slot, an eval sets the run's older eval flow runs that are still not final to
Crashed: they hold nothing, so their process is gone. A live holder cut off from the API for
longer than its lease (``api_outage_limit_s`` allows an in-process eval to ride out 600 s) loses
the slot too; the lock holds while the API does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from uuid import UUID

import httpx
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.filters import (
    FlowFilter,
    FlowFilterName,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import ConcurrencyLeaseHolder, FlowRun, StateType
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Crashed

from prefect_rollouts.errors import InfrastructureError, RunInUseError
from prefect_rollouts.flows.services.concurrency import LEASE_DURATION_S, renew_lease
from prefect_rollouts.flows.services.ownership import tag_flow_run, tag_owner

logger = logging.getLogger("prefect_rollouts.run_lock")

PREFIX = "prefect-rollouts-eval:"
"""Prefix of the limit's name and of the tag every eval flow run of the run carries."""
LIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED, StateType.CANCELLING]
_BANNED = "/%&<>"   # characters Prefect refuses in a limit's name


def lock_name(run_id: str) -> str:
    """The limit (and tag) of ``run_id``: ``prefect-rollouts-eval:<run id>``; characters a Prefect
    name may not hold become ``_``, with 8 hex digits of the id's SHA-1 to keep names apart."""
    safe = "".join("_" if char in _BANNED else char for char in run_id)
    if safe != run_id:
        safe += "-" + hashlib.sha1(run_id.encode()).hexdigest()[:8]
    return PREFIX + safe


@contextlib.asynccontextmanager
async def hold_run(run_id: str) -> AsyncIterator[None]:
    """Be the only eval of ``run_id`` inside (see the module docstring); call it in the eval flow run.

    Raises:
        RunInUseError: another eval flow run of ``run_id`` holds it and is not known to be dead.
        InfrastructureError: the Prefect API could not be asked.
    """
    name = lock_name(run_id)
    me = flow_run.id
    assert me is not None, "hold_run runs inside the eval flow run"
    async with get_client() as client:
        try:
            await tag_flow_run(name)   # before taking the slot: a holder can always be found by its tag
            lease_id, limit_id = await _take(client, name, run_id, UUID(me))
            await _crash_dead_holders(client, name, run_id, UUID(me))
        except (httpx.HTTPError, OSError) as exc:
            raise InfrastructureError(f"run {run_id}: cannot take its lock, the Prefect concurrency limit "
                                      f"{name!r} ({exc})") from exc
        renew = asyncio.ensure_future(renew_lease(client, lease_id, f"lock {name!r}: renewing its lease failed; if it "
                                                 "lapses, another eval may take the run"))
        try:
            yield
        finally:
            renew.cancel()
            await asyncio.shield(_release(client, name, limit_id, lease_id))


async def _take(client: PrefectClient, name: str, run_id: str, me: UUID) -> tuple[UUID, UUID]:
    """``(lease id, limit id)`` of the limit's one slot; refuses when a live eval holds it."""
    for _ in range(5):   # each round makes the limit, or removes a dead holder's
        await _ensure(client, name)
        try:
            granted = (await client.increment_concurrency_slots_with_lease(
                names=[name], slots=1, mode="concurrency", lease_duration=LEASE_DURATION_S,
                holder=ConcurrencyLeaseHolder(type="flow_run", id=me))).json()
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 423:
                raise
            held = await client.read_global_concurrency_limit_by_name(name)
            others = await _other_evals(client, name, me)
            live = [run for run in others if (owner := tag_owner(run.tags)) is None or owner.is_alive() is not False]
            if live:
                raise RunInUseError(_refusal(run_id, live)) from None
            logger.warning("run %s: its lock is held by %s, whose process is gone; taking it over", run_id,
                           ", ".join(f"eval flow run {run.name!r} ({run.id})" for run in others) or "no eval flow run")
            await _delete(client, held.id)
            continue
        if granted.get("limits"):
            return UUID(granted["lease_id"]), UUID(granted["limits"][0]["id"])
        # the limit was deleted between _ensure and the increment (its holder ended): make it again
    raise InfrastructureError(f"run {run_id}: the Prefect concurrency limit {name!r} kept changing while this eval "
                              "took it. Try again")


def _refusal(run_id: str, live: list[FlowRun]) -> str:
    holders = "; ".join(
        f"eval flow run {run.name!r} ({run.id}, {run.state_name}"
        + (f" since {run.start_time:%Y-%m-%d %H:%M:%S} UTC" if run.start_time else "")
        + (f", process {owner}" if (owner := tag_owner(run.tags)) else "") + ")" for run in live)
    first = live[0].id
    return (f"run id {run_id!r}: another eval is running this run: {holders}. Two evals of one run would run its "
            f"rollouts twice. Wait for it to end, or cancel it (.venv/bin/prefect flow-run cancel {first}) and resume "
            f"again; if its process is gone, its hold lapses within {LEASE_DURATION_S + 15:.0f} s")


async def _ensure(client: PrefectClient, name: str) -> None:
    try:
        await client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        try:
            await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:   # another eval of the run made it meanwhile
            pass


async def _other_evals(client: PrefectClient, name: str, me: UUID) -> list[FlowRun]:
    """The eval flow runs of the run (tagged ``name``) that are not final, this one excepted."""
    return await client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=["eval"])),
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(not_any_=[me]), tags=FlowRunFilterTags(all_=[name]),
                                      state=FlowRunFilterState(type=FlowRunFilterStateType(any_=LIVE))))


async def _crash_dead_holders(client: PrefectClient, name: str, run_id: str, me: UUID) -> None:
    """Set the run's eval flow runs that started before this one and are still not final to
    Crashed: this one holds the run, so they hold nothing and their process is gone."""
    mine = await client.read_flow_run(me)
    for run in await _other_evals(client, name, me):
        if run.created is not None and mine.created is not None and run.created < mine.created:
            await client.set_flow_run_state(run.id, Crashed(
                message=f"its process is gone: it no longer held run {run_id}, which eval flow run {me} now runs"),
                force=True)


async def _delete(client: PrefectClient, limit_id: UUID) -> None:
    """Delete the limit by id (a limit of the same name made since stays)."""
    try:
        await client.request("DELETE", "/v2/concurrency_limits/{id_or_name}", path_params={"id_or_name": str(limit_id)})
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 404:
            raise


async def _release(client: PrefectClient, name: str, limit_id: UUID, lease_id: UUID) -> None:
    """Delete the limit, then give the lease back: deleting first means no other eval can take
    the slot of a limit that is about to go (it makes a new one instead)."""
    try:
        await _delete(client, limit_id)
        await client.release_concurrency_slots_with_lease(lease_id)
    except (httpx.HTTPError, OSError) as exc:
        logger.warning("lock %r: releasing it failed (%s); it lapses within %.0f s", name, exc,
                       LEASE_DURATION_S + 15)

