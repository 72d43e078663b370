"""Keep an eval running through a Prefect API outage, and put Prefect's record right when it returns.

Rollouts need the Prefect API only for bookkeeping, so an eval does not stop when it goes away:

- ``task`` and ``batch`` granularity: task-run states travel as events. Prefect's events client
  keeps every event the server has not confirmed and sends them again once it reconnects
  (``PrefectEventsClient._unconfirmed_events``), so those states reach the server by themselves.
  This holds only for task runs without tags: Prefect asks the API for tag concurrency slots
  before each tagged task run, so the eval keeps its owner tag on flow runs.
- ``flow`` granularity: a flow run cannot be created or finished without the API. While it is
  down a rollout runs inline (the same stages, no flow run), and a rollout flow run that could not
  report its end is remembered; when the API returns, ``ApiWatch`` creates the missing flow runs
  (tagged ``api-outage``) and sets the final states.
- The progress artifact is updated from here, never from a rollout's path, and only while the
  API answers.

The watch asks the API's ``/ready``, which answers 200 only when the server reaches its database
(Prefect 3.9's ``perform_readiness_check``): ``/health`` stays 200 while PostgreSQL is gone and
every other call is a 500, so an API without its database is an outage too, and a 5xx answer to
the bookkeeping is taken as one. A state the eval could not write by its end is named, with the
command that writes it from the dataset (``prefect-rollouts traces reconcile RUN``,
``flows/services/reconcile.py``).

Past ``limit_s`` of continuous outage the eval stops: durable rows stay, ``ApiOutageError``
names the run to resume. Prefect's client gives up on a request after ``PREFECT_CLIENT_MAX_RETRIES``
(Prefect's default 5 is about 62 s of backoff; ``prefect-rollouts eval`` sets 2, about 6 s); those
failures are caught where they can happen.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import certifi
import httpx

HEALTH_INTERVAL_S = 2.0
"""How often the API's ``/ready`` is polled (seconds)."""

READY_PATH = "/ready"
"""The API's readiness probe: 200 when its database answers, 503 when not (unauthenticated, as ``/health``)."""

log = logging.getLogger("prefect_rollouts.outage")


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One certificate store for every health check: httpx would load it (~20 ms of CPU) per client."""
    return ssl.create_default_context(cafile=certifi.where())


class ApiOutageError(RuntimeError):
    """The Prefect API stayed unreachable past the eval's ``api_outage_limit_s``; the run stopped.

    Attributes:
        run_id: The run to resume. down_s: seconds of outage. durable: rollouts with a durable row.
    """

    def __init__(self, api_url: str, run_id: str, down_s: float, durable: int, total: int) -> None:
        self.api_url, self.run_id, self.down_s, self.durable, self.total = api_url, run_id, down_s, durable, total
        super().__init__(f"the Prefect API at {api_url} was unreachable for {down_s:.0f} s (api_outage_limit_s); "
                         f"stopped with {durable} of {total} rollouts durable")


@dataclass
class Unreported:
    """A rollout whose flow run the server does not know the end of (or does not know at all)."""

    name: str
    parameters: dict[str, Any]
    flow_run_id: str | None
    error: str | None


class ApiWatch:
    """Polls the Prefect API's readiness (its database included) while an eval runs; runs callbacks when it is up.

    Args:
        api_url: ``PREFECT_API_URL`` (ends in ``/api``); None disables the watch (always up).
        limit_s: Continuous outage (seconds) after which ``wait_up`` returns False and ``run`` calls ``on_limit``.
    """

    def __init__(self, api_url: str | None, limit_s: float, interval_s: float = HEALTH_INTERVAL_S) -> None:
        self.api_url, self.limit_s, self.interval_s = api_url, limit_s, interval_s
        self.down_since: float | None = None
        self.had_outage = False
        self.unreported: list[Unreported] = []
        self.refused: list[str] = []
        """Names of rollouts whose state the server refused (a 4xx: e.g. it lost the flow run)."""
        self._up = asyncio.Event()
        self._up.set()

    @property
    def is_up(self) -> bool:
        """False from a failed health check until the next good one."""
        return self._up.is_set()

    @property
    def down_s(self) -> float:
        """Seconds since the outage began (0 when up)."""
        return 0.0 if self.down_since is None else time.monotonic() - self.down_since

    def mark_down(self, cause: str) -> None:
        """Record a failed API call (``cause``: what failed, shown in the warning); the next health
        check may clear it."""
        if self.api_url is None or not self.is_up:
            return
        self._up.clear()
        self.down_since = time.monotonic()
        self.had_outage = True
        log.warning("Prefect API at %s is unreachable (%s); rollouts continue and their Prefect states are sent "
                    "when it returns (the run stops after %.0f s without it)", self.api_url, cause, self.limit_s)

    async def check(self) -> bool:
        """One readiness check (``READY_PATH``, 2 s timeout); updates ``is_up`` and returns it."""
        if self.api_url is None:
            return True
        cause = None
        try:
            async with httpx.AsyncClient(timeout=2.0, verify=_ssl_context()) as client:
                response = await client.get(f"{self.api_url}{READY_PATH}")
            if response.status_code == 503:
                cause = "the API answers, but its database does not (/ready returned 503)"
            elif response.status_code != 200:
                cause = f"readiness check returned {response.status_code}"
        except httpx.HTTPError as exc:
            cause = f"readiness check: {type(exc).__name__}: {exc}"
        if cause is not None:
            self.mark_down(cause)
        elif not self.is_up:
            log.warning("Prefect API at %s is back after %.0f s; reconciling Prefect states", self.api_url, self.down_s)
            self.down_since = None
            self._up.set()
        return self.is_up

    async def run(self, on_up: Callable[[], Awaitable[None]], on_limit: Callable[[], None]) -> None:
        """Check every ``interval_s``: while up, await ``on_up`` (progress, reconciliation); call
        ``on_limit`` once the outage passes ``limit_s``, then return. Cancel to stop."""
        while True:
            if await self.check():
                try:
                    await on_up()
                except (httpx.TransportError, OSError) as exc:  # it went down meanwhile
                    log.debug("Prefect bookkeeping failed (%s); retrying when the API answers", exc)
                    self.mark_down(f"{type(exc).__name__}: {exc}")
                except httpx.HTTPStatusError as exc:
                    if not is_server_error(exc):
                        raise
                    self.mark_down(f"the API answered {exc.response.status_code} ({exc.request.url.path})")
            elif self.down_s > self.limit_s:
                on_limit()
                return
            await asyncio.sleep(self.interval_s)

    async def wait_up(self) -> bool:
        """Wait until the API answers; False once the outage passes ``limit_s``."""
        while not await self.check():
            if self.down_s > self.limit_s:
                return False
            await asyncio.sleep(self.interval_s)
        return True

    async def reconcile(self) -> int:
        """Tell the server how the unreported rollouts ended; return how many were put right.

        A rollout that ran inline during the outage gets a flow run of ``rollout`` created in its
        final state (tag ``api-outage``); a flow run stuck before its end gets its final state (forced).
        A rollout the server refuses (4xx) is dropped into ``refused``; a 5xx or a lost connection
        leaves it, and the rest, in ``unreported`` for the next try.

        Raises:
            httpx.HTTPStatusError: the server answered 5xx (its database is away).
            httpx.TransportError: the API went away.
        """
        if not self.unreported:
            return 0
        from prefect.client.orchestration import get_client
        from prefect.states import Completed, Failed, State

        from prefect_rollouts.flows.rollout import rollout_flow

        done = 0
        async with get_client() as client:
            while self.unreported:
                item = self.unreported[0]
                message = "reported after a Prefect API outage"
                state: State[Any] = Failed(message=item.error) if item.error else Completed(message=message)
                try:
                    if item.flow_run_id is None:
                        await client.create_flow_run(rollout_flow, name=item.name, parameters=item.parameters,
                                                     tags=["api-outage"], state=state)
                    else:
                        await client.set_flow_run_state(item.flow_run_id, state, force=True)
                    done += 1
                except httpx.HTTPStatusError as exc:   # the server answered no (e.g. it lost the flow run)
                    if is_server_error(exc):
                        raise                           # not an answer: try again when it is ready
                    log.warning("could not record rollout %s on the Prefect server: %s", item.name, exc)
                    self.refused.append(item.name)
                self.unreported.pop(0)
        return done


def is_server_error(exc: httpx.HTTPStatusError) -> bool:
    """A 5xx: the server could not do it (e.g. its database is away), which is not a refusal."""
    return exc.response.status_code >= 500


async def close_orphans(run_id: str) -> int:
    """Set to Crashed the ``rollout`` flow runs of eval run ``run_id`` that an outage left Pending
    or Running: their flow run was created, then the API went away before it could start or
    finish, and the rollout ran inline (its ``api-outage`` flow run holds the result). Call it
    only when every rollout of the run has finished, so no such run can still be live.

    Returns:
        How many flow runs were set to Crashed.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    live = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
        any_=[StateType.PENDING, StateType.RUNNING, StateType.SCHEDULED])))
    closed, offset = 0, 0
    async with get_client() as client:
        while True:
            page = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["rollout"])),
                                               flow_run_filter=live, limit=200, offset=offset)
            for flow_run in page:
                if (flow_run.parameters.get("rollout") or {}).get("run_id") == run_id:
                    await client.set_flow_run_state(flow_run.id, Crashed(
                        message="left behind by a Prefect API outage; the rollout ran inline (tag api-outage)"),
                        force=True)
                    closed += 1
            if len(page) < 200:
                return closed
            offset += 200


class QuietWhileDown(logging.Filter):
    """Drops Prefect's per-event connection errors while the watch knows the API is down (one
    warning from ``ApiWatch`` says it instead), and the traceback of an ``ApiOutageError`` in the
    flow run's log (the CLI prints the reason and the resume command). Install with ``install``,
    remove with ``remove``: after an outage stop, leave it installed until the process exits."""

    _LOGGERS = ("prefect._internal.concurrency", "prefect.events.clients", "prefect.flow_runs")

    def __init__(self, watch: ApiWatch) -> None:
        super().__init__()
        self.watch = watch

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ApiOutageError):
            record.exc_info = None
            return True
        lost = self._api_connection_error(record)
        if lost is not None:   # Prefect saw the API go before the watch did: the watch's one warning says it
            self.watch.mark_down(f"{type(lost).__name__}: {lost}")
            return False
        if self.watch.is_up:
            return True
        message = str(record.msg)
        if message.startswith("Service %r failed to process item"):
            return record.args is None or record.args[0] != "EventsWorker"  # type: ignore[index]
        return not message.startswith("Unable to connect")

    def _api_connection_error(self, record: logging.LogRecord) -> httpx.TransportError | None:
        """The connection error to the Prefect API behind ``record`` (its exception or a cause), if any."""
        error = record.exc_info[1] if record.exc_info else None
        for _ in range(5):
            if error is None:
                return None
            if isinstance(error, httpx.TransportError) and self.watch.api_url:
                try:
                    url = str(error.request.url)
                except RuntimeError:   # raised without a request
                    return None
                return error if url.startswith(self.watch.api_url) else None
            error = error.__cause__ or error.__context__
        return None

    def install(self) -> None:
        for name in self._LOGGERS:
            logging.getLogger(name).addFilter(self)

    def remove(self) -> None:
        for name in self._LOGGERS:
            logging.getLogger(name).removeFilter(self)
