"""Concurrency limits that span processes: model requests in flight per endpoint, containers
alive per Docker host (``[limits]`` of an eval config).

The core only asks for a slot around the thing it limits: the model client around each HTTP
attempt (``model/client.py``), the docker runtime around a container's life
(``runtimes/docker/runtime.py``). Where slots come from is injected, never imported: the Prefect layer
(``flows/services/concurrency.py``) sets an ``ActiveLimits`` for the eval's context with a factory that takes a
slot of a Prefect global concurrency limit, shared by every worker on every machine. With no
``ActiveLimits`` set (``Agent.run``, interactions, the inline engine outside an eval) nothing is
limited and no call is made.

A ``local/...`` model has its own llama.cpp server in every process that runs rollouts, so its
limit is per process: an ``asyncio.Semaphore`` of ``model_requests`` slots, no Prefect call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from prefect_rollouts.config.base import ClientConfig

if TYPE_CHECKING:
    from prefect_rollouts.config.eval_tables import LimitsConfig

#: Characters Prefect refuses in a concurrency limit's name.
BANNED = re.compile(r"[/%&<>]")


@dataclass(frozen=True)
class Limit:
    """One named limit: at most ``size`` slots held at once under ``name``.

    ``shared`` False: the slots are this process's own (a local model's server), held with an
    ``asyncio.Semaphore``; True: the injected factory takes them (a Prefect global concurrency limit).
    """

    name: str
    size: int
    shared: bool = True


SlotFactory = Callable[[Limit], AbstractAsyncContextManager[None]]
"""``factory(limit)`` returns a context manager that holds one slot of ``limit`` while entered.
It raises ``InfrastructureError`` (retryable) when no slot can be asked for (the API is down)."""


@dataclass(eq=False)
class ActiveLimits:
    """The limits in force for an eval: its ``[limits]`` table, the slot factory, and the agent's
    client config (whose endpoint ``model_requests_name`` names)."""

    config: LimitsConfig
    slot: SlotFactory
    agent_client: ClientConfig | None = None
    _local: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    def endpoint(self, client: ClientConfig, *, local: bool = False) -> Limit | None:
        """The limit of requests to ``client``'s endpoint; None when unlimited. ``local``: the
        endpoint is this process's own model server, so the limit is this process's alone."""
        size = self.config.model_requests
        if size is None:
            return None
        if local:
            return Limit(f"model-requests:local:{client.base_url}", size, shared=False)
        is_agents = self.agent_client is not None and _endpoint_key(client) == _endpoint_key(self.agent_client)
        return Limit((is_agents and self.config.model_requests_name) or endpoint_limit_name(client), size)

    def container(self) -> Limit | None:
        """The limit of containers alive on this process's Docker host; None when unlimited."""
        size = self.config.containers
        if size is None:
            return None
        return Limit(self.config.containers_name or container_limit_name(), size)

    def hold(self, limit: Limit) -> AbstractAsyncContextManager[None]:
        """A context manager holding one slot of ``limit`` (see ``Limit.shared``)."""
        if limit.shared:
            return self.slot(limit)
        semaphore = self._local.setdefault(limit.name, asyncio.Semaphore(limit.size))
        return semaphore


_active: contextvars.ContextVar[ActiveLimits | None] = contextvars.ContextVar("prefect_rollouts_limits",
                                                                              default=None)


@contextlib.contextmanager
def applied(limits: ActiveLimits) -> Iterator[ActiveLimits]:
    """Put ``limits`` in force for the code run in this context (tasks and subflows it starts
    inherit it). The Prefect layer calls it; the core only reads it."""
    token = _active.set(limits)
    try:
        yield limits
    finally:
        _active.reset(token)


def active() -> ActiveLimits | None:
    """The limits in force here, or None."""
    return _active.get()


_NO_SLOT: AbstractAsyncContextManager[None] = contextlib.nullcontext()


def request_slot(client: ClientConfig, *, local: bool = False) -> AbstractAsyncContextManager[None]:
    """A context manager holding a slot of the endpoint's limit for one model request (a no-op
    when no limit is in force). Entering it raises ``InfrastructureError`` (retryable) when the
    slot cannot be asked for."""
    limits = _active.get()
    limit = limits.endpoint(client, local=local) if limits is not None else None
    if limits is None or limit is None:
        return _NO_SLOT
    return limits.hold(limit)


class HeldSlot:
    """A slot held from ``acquire()`` until ``release()``, which may run in another task (a
    container's slot is taken in ``start`` and given back in ``stop``). A background task enters
    the factory's context manager and leaves it, because Prefect's holds a cancel scope that
    must be left by the task that entered it."""

    def __init__(self, limits: ActiveLimits, limit: Limit) -> None:
        self.limit = limit
        self._limits = limits
        self._release = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None
        self._held = False

    async def acquire(self) -> None:
        """Wait for the slot. Cancelling the wait gives up the request (and a slot granted meanwhile).

        Raises:
            InfrastructureError: the slot could not be asked for.
        """
        acquired: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def hold() -> None:
            async with self._limits.hold(self.limit):
                self._held = True
                acquired.set_result(None)
                await self._release.wait()
        self._holder = asyncio.ensure_future(hold())
        self._holder.add_done_callback(functools.partial(_fail, acquired))
        try:
            await asyncio.shield(acquired)
        except BaseException:
            await self.release()
            raise

    async def release(self) -> None:
        """Give the slot back, or stop waiting for it (idempotent); returns once the factory has
        released it."""
        self._release.set()
        holder, self._holder = self._holder, None
        if holder is not None:
            if not self._held:
                holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)


def _fail(future: asyncio.Future[None], task: asyncio.Future[None]) -> None:
    """The holder ended before the slot was granted: pass its error (or cancellation) on."""
    if future.done():
        return
    if task.cancelled():
        future.cancel()
    elif (exc := task.exception()) is not None:
        future.set_exception(exc)
    else:
        future.cancel()


async def hold_container_slot() -> HeldSlot | None:
    """Take a slot of the Docker host's container limit for a container about to start; None
    when no limit is in force. The caller releases it once the container is removed.

    Raises:
        InfrastructureError: the slot could not be asked for.
    """
    limits = _active.get()
    limit = limits.container() if limits is not None else None
    if limits is None or limit is None:
        return None
    slot = HeldSlot(limits, limit)
    await slot.acquire()
    return slot


def endpoint_limit_name(client: ClientConfig) -> str:
    """The default limit name of an endpoint: ``model-requests:block:<block>`` for a
    ``ModelEndpoint`` block, else ``model-requests:<host>:<port>:<path>`` (credentials and query
    dropped, ``/`` written as ``:``), e.g. ``model-requests:api.example.com:443:v1``. A loopback
    host is each machine's own server: its name starts with this machine's host name."""
    return "model-requests:" + _endpoint_key(client)


def container_limit_name(docker_host: str | None = None, hostname: str | None = None) -> str:
    """The default limit name of the Docker host this process starts containers on:
    ``containers:<host>:<port>`` for a ``tcp://`` or ``ssh://`` ``DOCKER_HOST``, else (the local
    socket) ``containers:<this machine's host name>``."""
    docker_host = os.environ.get("DOCKER_HOST", "") if docker_host is None else docker_host
    url = httpx.URL(docker_host) if "://" in docker_host else None
    if url is not None and url.scheme in {"tcp", "ssh", "http", "https"} and url.host:
        return f"containers:{url.host}:{url.port or ''}".rstrip(":")
    return f"containers:{hostname or socket.gethostname()}"


def _endpoint_key(client: ClientConfig) -> str:
    if client.endpoint:
        return f"block:{client.endpoint}"
    url = httpx.URL(client.base_url)
    port = url.port or {"https": 443, "http": 80}.get(url.scheme)
    path = ":".join(part for part in url.path.split("/") if part)
    machine = socket.gethostname() if url.host in _LOOPBACK else ""   # each machine's own server
    return BANNED.sub("-", ":".join(str(part) for part in (machine, url.host, port, path) if part))


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
