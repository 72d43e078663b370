"""Which Prefect server a CLI command runs against: ``PREFECT_API_URL``'s, or a temporary one for the command."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from rich.console import Console


@contextlib.contextmanager
def on_server(temporary: Any, console: Console) -> Iterator[None]:
    """Run the block against ``temporary`` (a ``TemporaryServer``, started here and stopped after the
    queued logs and events are sent), or against ``PREFECT_API_URL`` when it is None."""
    with contextlib.ExitStack() as stack:
        if temporary is not None:
            console.print("PREFECT_API_URL is not set: starting a temporary Prefect server for this eval")
            stack.enter_context(api_url(stack.enter_context(temporary).api_url))
            stack.callback(drain_prefect_services)   # runs before the server stops
        yield


def temporary_server() -> Any:
    """A ``TemporaryServer`` (not started) when ``PREFECT_API_URL`` is unset, else None; sets the
    startup timeout and client retries evals use (see ``eval_command``)."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # Prefect's client retries a failed API call 5 times by default (2+4+8+16+32 s): a rollout flow
    # run in flight when the API goes away would hold its slot for a minute. Two retries (~6 s)
    # ride out a blip; past them the eval's own outage handling takes over (flows/services/outage.py).
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "2")
    from prefect.settings import PREFECT_API_URL

    from prefect_rollouts.servers.temporary import TemporaryServer

    return None if PREFECT_API_URL.value() else TemporaryServer(
        float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]))


@contextlib.contextmanager
def api_url(url: str) -> Iterator[None]:
    """Point Prefect (this process's settings, in every thread, and child processes) at ``url``."""
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_API_URL"] = url
    refresh_global_settings_context()
    try:
        yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        refresh_global_settings_context()


def drain_prefect_services(timeout_s: float = 10.0) -> bool:
    """Send the logs and events still queued (as Prefect's test harness does before its server
    stops); False when some were still pending after ``timeout_s`` (each of the two queues)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    pending: list[Any] = [APILogWorker.drain_all(timeout=timeout_s), EventsWorker.drain_all(timeout=timeout_s)]
    return not any(result and result[1] for result in pending)
