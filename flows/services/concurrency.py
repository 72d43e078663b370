"""An eval's ``[limits]`` as Prefect global concurrency limits (the Prefect side of ``prefect_rollouts.limits``).

``eval_limits(config)`` creates the limits the eval can name up front (the agent's endpoint, a
named container pool or this machine's Docker host) and puts them in force for the rollouts run
in its context; a limit first met later (a judge's endpoint, a worker's own Docker host) is
created on first use, once per process.

A slot is a lease from Prefect's concurrency API, the one ``prefect.concurrency.asyncio.concurrency``
uses (``increment-with-lease``, waiting out HTTP 423 by its ``Retry-After``; ``decrement-with-lease``
to give it back), without the rest of that context manager, which costs more than the model
request it guards: it starts a thread per slot that opens a new API client (~19 ms CPU) to renew
the lease at once, and emits two events: per request it cost several times this lease slot's CPU
and most of the throughput (``benchmarks/limits.py``; benchmarks/README.md, "Concurrency-limit
slots"). Here a lease is renewed only when a slot is held past 45 s.

How Prefect 3.9 gives slots back (read in ``prefect/concurrency`` and ``prefect/server``): a lease
lasts ``LEASE_DURATION_S`` unless renewed; a process killed while holding slots stops renewing,
and the server's repossessor service (every 15 s) frees the slots of expired leases, so they come
back within ``LEASE_DURATION_S`` + 15 s. The server keeps leases in memory by default
(``PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE``): a server restart forgets them, and slots held
across it stay counted until reset (``prefect gcl update NAME --active-slots 0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import PREFECT_API_URL

from prefect_rollouts import limits
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.errors import InfrastructureError
from prefect_rollouts.limits import ActiveLimits, Limit

logger = logging.getLogger("prefect_rollouts.limits")

LEASE_DURATION_S = 60.0
"""Lease of a slot, in seconds: the shortest the Prefect server accepts. A killed holder's slot
returns within this plus the repossessor's 15 s loop; a live holder renews it every 45 s."""

_ensured: set[tuple[str | None, str]] = set()
"""(API URL, limit name) pairs this process has made sure exist (one API read per name and process)."""

_releases: set[asyncio.Future[Any]] = set()
"""Releases of slots granted to a cancelled caller, kept referenced until they finish."""


@contextlib.asynccontextmanager
async def eval_limits(config: EvalConfig) -> AsyncIterator[ActiveLimits | None]:
    """Put ``config.limits`` in force for the rollouts run inside; a no-op without limits.

    Creates the limits named up front on the Prefect server (see the module docstring), so an
    unreachable API fails the eval before any rollout starts.

    Raises:
        InfrastructureError: a limit could not be read or created.
    """
    if config.limits.model_requests is None and config.limits.containers is None:
        yield None
        return
    agent = config.env.agent
    active = ActiveLimits(config.limits, prefect_slot, agent_client=agent.client)
    upfront = [active.endpoint(agent.client, local=agent.model.startswith("local/"))]
    if agent.runtime.type == "docker":
        upfront.append(active.container())
    for limit in upfront:
        if limit is not None and limit.shared:
            await ensure_limit(limit)
    with limits.applied(active):
        yield active


@contextlib.asynccontextmanager
async def prefect_slot(limit: Limit) -> AsyncIterator[None]:
    """Hold one slot of the Prefect global concurrency limit ``limit.name`` (created with
    ``limit.size`` slots if missing), waiting as long as the limit is full. Cancelling the wait
    gives back a slot granted meanwhile; a failed release is logged (the lease then expires).

    Raises:
        InfrastructureError: the limit could not be read, created or asked for a slot (retryable).
    """
    await ensure_limit(limit)
    async with get_client() as client:   # inside a flow or task run: the run's own client
        lease_id = await _acquire(client, limit)
        renew = asyncio.ensure_future(renew_lease(
            client, lease_id, f"Prefect concurrency limit {limit.name!r}: renewing a slot's lease failed; "
                              "if it expires, the limit may be exceeded"))
        try:
            yield
        finally:
            renew.cancel()
            release = asyncio.ensure_future(client.release_concurrency_slots_with_lease(lease_id))
            try:
                await asyncio.shield(release)
            except (httpx.HTTPError, OSError) as exc:
                logger.warning("Prefect concurrency limit %r: releasing a slot failed (%s); the server frees it "
                               "when its lease expires, within %.0f s", limit.name, exc, LEASE_DURATION_S + 15)


async def _acquire(client: Any, limit: Limit) -> UUID:
    """A lease of one slot of ``limit``; waits out HTTP 423 (full) by the server's ``Retry-After``."""
    while True:
        acquire = asyncio.ensure_future(client.increment_concurrency_slots_with_lease(
            names=[limit.name], slots=1, mode="concurrency", lease_duration=LEASE_DURATION_S))
        try:
            granted = (await asyncio.shield(acquire)).json()
        except asyncio.CancelledError:
            acquire.add_done_callback(functools.partial(_release_if_granted, client))
            raise
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 423:
                raise InfrastructureError(f"Prefect concurrency limit {limit.name!r}: {exc}") from exc
            await asyncio.sleep(float(exc.response.headers.get("Retry-After") or 1))
            continue
        except (httpx.HTTPError, OSError) as exc:
            raise InfrastructureError(f"Prefect concurrency limit {limit.name!r}: {exc}") from exc
        if not granted.get("limits"):   # deleted since ensure_limit: Prefect would not limit anything
            raise InfrastructureError(f"Prefect concurrency limit {limit.name!r} does not exist (deleted while the "
                                      "eval ran?). Create it, or remove the key from [limits]")
        return UUID(granted["lease_id"])


def _release_if_granted(client: Any, acquire: asyncio.Future[Any]) -> None:
    """Give back a slot granted to a caller that was cancelled while waiting for it."""
    if not acquire.cancelled() and acquire.exception() is None:
        lease_id = UUID(acquire.result().json()["lease_id"])
        release = asyncio.ensure_future(client.release_concurrency_slots_with_lease(lease_id))
        _releases.add(release)
        release.add_done_callback(_releases.discard)


async def renew_lease(client: Any, lease_id: UUID, on_failure: str) -> None:
    """Renew the lease ``lease_id`` every 75% of ``LEASE_DURATION_S`` until cancelled (a slot held for a
    container's life, or a run lock held for an eval's); a failed renewal logs ``on_failure`` with the error
    and tries again at the next turn."""
    while True:
        await asyncio.sleep(LEASE_DURATION_S * 0.75)
        try:
            await client.renew_concurrency_lease(lease_id, LEASE_DURATION_S)
        except (httpx.HTTPError, OSError) as exc:
            logger.warning("%s (%s)", on_failure, exc)


async def ensure_limit(limit: Limit) -> None:
    """Make sure the global concurrency limit ``limit.name`` exists; create it with
    ``limit.size`` slots if it does not. An existing limit keeps its size (other evals may share
    it); a different size, or an inactive limit (Prefect then limits nothing), logs a warning.
    Once per name, API and process; a failed attempt is tried again on the next call.

    Raises:
        InfrastructureError: the Prefect API could not be asked (retryable).
    """
    key = (PREFECT_API_URL.value(), limit.name)
    if key in _ensured:
        return
    try:
        await _ensure(limit)
    except (httpx.HTTPError, OSError) as exc:
        raise InfrastructureError(f"Prefect concurrency limit {limit.name!r}: cannot read or create it ({exc})") \
            from exc
    _ensured.add(key)


async def _ensure(limit: Limit) -> None:
    async with get_client() as client:
        try:
            existing = await client.read_global_concurrency_limit_by_name(limit.name)
        except ObjectNotFound:
            try:
                await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit.name,
                                                                                            limit=limit.size))
                logger.info("created Prefect concurrency limit %r with %d slots", limit.name, limit.size)
                return
            except ObjectAlreadyExists:   # another process created it meanwhile
                existing = await client.read_global_concurrency_limit_by_name(limit.name)
    if existing.limit != limit.size:
        logger.warning("Prefect concurrency limit %r has %d slots on the server; [limits] asks for %d. Keeping %d "
                       "(other evals may share it). To change it: prefect gcl update %r --limit %d",
                       limit.name, existing.limit, limit.size, existing.limit, limit.name, limit.size)
    if not existing.active:
        logger.warning("Prefect concurrency limit %r is inactive, so Prefect does not limit it. Activate it: "
                       "prefect gcl enable %r", limit.name, limit.name)
