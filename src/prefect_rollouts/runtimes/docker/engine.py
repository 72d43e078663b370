"""The Docker engine as the docker runtime reaches it: one client per process, a thread pool for its
blocking calls, the label every container of this project carries, and forced removal.

The SDK is blocking, so every call runs in a thread of the runtime's own pool (``in_thread``): an
``exec`` holds its thread for the whole command, and asyncio's default pool (``min(32, cores + 4)``
threads, 6 here) would queue concurrent commands behind each other. Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import docker
import docker.errors

from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes.docker import limits as resources

LABEL = "org.prefect-rollouts"
"""Every container this project starts carries ``LABEL=1`` and ``LABEL.<key>`` labels."""

_T = TypeVar("_T")

MAX_THREADS = 512
"""Threads of the docker runtime's pool: the most blocking Docker calls (mostly running
``exec``s) in flight at once in one process. A ``ThreadPoolExecutor`` starts a thread only when
no idle one is free, so the pool grows to the concurrency that uses it, not to this cap."""


@functools.cache
def executor() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="docker-runtime")


async def in_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in the docker runtime's thread pool (not asyncio's default one, see the module docstring)."""
    return await asyncio.get_running_loop().run_in_executor(executor(), functools.partial(fn, *args))


@functools.cache
def docker_client() -> docker.DockerClient:
    """One Docker client per process (``docker.from_env()``: the local socket or ``DOCKER_HOST``).

    Raises:
        RuntimeUnavailableError: no engine answers.
    """
    try:
        client = docker.from_env(timeout=120, max_pool_size=64)   # connections kept for concurrent calls
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        raise RuntimeUnavailableError(f'runtime "docker": no Docker engine answers at DOCKER_HOST or '
                                      f"/var/run/docker.sock ({exc}). Start dockerd, or set "
                                      '[env.agent.runtime] type = "local"') from exc


@functools.cache
def engine_info(client: docker.DockerClient) -> dict[str, Any]:
    return dict(client.info())


REMOVE_TRIES = 3
"""Tries to remove a container, 1 s apart: a busy engine can fail a forced removal once ("could not
kill", "removal already in progress") and take it the next time."""


def remove(container: Any) -> None:
    for attempt in range(1, REMOVE_TRIES + 1):
        try:
            container.remove(force=True, v=True)   # v: the anonymous tmpfs volumes of the image's VOLUMEs too
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            if attempt == REMOVE_TRIES:
                raise
            time.sleep(1.0)


def kill_all(container_id: str, users: set[str]) -> None:
    """``limits.kill_all`` in the container as the image's user and ``users``; a lost container or a
    busy engine is left alone."""
    with contextlib.suppress(Exception):
        resources.kill_all(docker_client().api, container_id, list(users))
