"""How an eval's rollouts run in this process: bounded concurrency, a granularity, rows to Parquet.

``eval_flow`` (in-process evals) and ``shard_flow`` (a shard of an eval on a work-pool worker) both
run their rollouts through ``execute``: ``flow`` granularity (a ``rollout_flow`` subflow per rollout,
a task run per stage), ``task`` (a task run per rollout) or ``batch`` (a task run per batch of
rollouts run by the inline engine). Rows are written as rollouts finish; a rollout counts as done
once its row is durable. While the Prefect API is away, rollouts go on (``flows/outage.py``).

A rollout that errored is a Failed rollout flow run or ``rollout`` task run (``rollout_outcome``);
a ``batch`` task run is Failed when any of its rollouts errored. Their rows are written all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prefect import task
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.states import Failed, State
from prefect.utilities.annotations import quote

from prefect_rollouts.agent import Agent, make_agent
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.eval_config import EvalConfig
from prefect_rollouts.flows.limits import eval_limits
from prefect_rollouts.flows.outage import (
    ApiOutageError,
    ApiWatch,
    QuietWhileDown,
    Unreported,
    close_orphans,
    is_server_error,
)
from prefect_rollouts.flows.ownership import owner_tags, sandbox_labels, tag_flow_run
from prefect_rollouts.flows.rollout import RolloutRequest, failure_message, rollout_flow, rollout_outcome, trace_of
from prefect_rollouts.plan import Planned, RolloutKey
from prefect_rollouts.prepare import prepare_tasks
from prefect_rollouts.rollout import Rollout
from prefect_rollouts.trace import Trace
from prefect_rollouts.traces import DatasetRoot, TraceWriter, error_text

#: Called as ``listener(durable, total)`` whenever more rollouts become durable (the CLI's progress bar).
progress_listener: contextvars.ContextVar[Callable[[int, int], None] | None] = contextvars.ContextVar(
    "prefect_rollouts_progress_listener", default=None)

#: Called with each line of the tasks' preparation (e.g. image builds) before the rollouts (the CLI prints them).
preparation_listener: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "prefect_rollouts_preparation_listener", default=None)

log = logging.getLogger("prefect_rollouts.outage")

FLUSH_INTERVAL_S = 2.0
"""Buffered rows are made durable at least this often."""


@dataclass(eq=False)
class _Run:
    """What every rollout of one eval run shares."""

    agents: dict[str, tuple[Agent, str]]
    """Per environment: its agent and ``config_hash`` (environments with the same agent config share one)."""
    writer: TraceWriter
    run_id: str
    total: int
    gate: asyncio.Semaphore
    watch: ApiWatch
    flush_each: bool = False
    """Make each rollout durable as it finishes (see ``EvalConfig.flush_each_rollout``)."""
    worker: dict[str, Any] = field(default_factory=dict)
    """Where the rollouts run (``host``, ``pid``, ``shard_flow_run_id``): ``trace.info["worker"]``
    and the row's ``worker_host``, ``worker_pid`` and ``shard_flow_run_id`` columns."""
    progress_key: str | None = None
    """Key of the progress artifact to keep current; None: none (a shard: the eval keeps it)."""
    progress_id: Any = None
    reported: int = -1
    failures: list[BaseException] = field(default_factory=list)
    store_error: TraceStoreError | None = None
    """The first write of rows that failed: the eval stops (``stop``) instead of running rollouts it cannot keep."""
    stop: Callable[[], None] | None = None

    def rollout(self, planned: Planned) -> Rollout:
        labels = {"run_id": self.run_id, "rollout_index": str(planned.index), **sandbox_labels()}
        return self.agents[planned.environment.name][0].rollout(planned.task, labels)

    async def record(self, rollout: Rollout, planned: Planned, elapsed_s: float) -> None:
        """Buffer the finished rollout's row; flush when the batch is full, or at once when every
        rollout must be durable as it finishes (``flush_each``, or a task whose rewards have side effects)."""
        rollout.trace.info["worker"] = self.worker
        full = self.writer.add(rollout.trace, rollout_index=planned.index, environment=planned.environment.name,
                               config_hash=self.agents[planned.environment.name][1], elapsed_s=elapsed_s)
        if full or self.flush_each or getattr(rollout.task, "rewards_have_side_effects", False):
            await self.flush()

    async def flush(self) -> None:
        """Make the buffered rows durable. A storage error (a full disk) stops the run at once: the
        rows stay buffered (``TraceWriter``), so no rollout whose result is in memory runs again."""
        try:
            flushed = await self.writer.aflush()
        except TraceStoreError as exc:
            self.store_error = self.store_error or exc
            if self.stop is not None:
                self.stop()
            return
        if flushed:
            self.report()

    def report(self) -> None:
        """Tell the CLI's progress bar; the progress artifact follows in ``_inform_prefect``."""
        if (listener := progress_listener.get()) is not None:
            listener(len(self.writer.durable), self.total)


async def execute(config: EvalConfig, root: str | DatasetRoot, run_id: str, todo: list[Planned], *,
                  total: int, durable: set[RolloutKey], progress_key: str | None,
                  shard_flow_run_id: str | None = None) -> list[BaseException]:
    """Run ``todo`` (rollouts of the plan: environment, task, rollout index) in this process and make
    every row durable.

    Opens the agent (``config.env.agent``) and a ``TraceWriter`` for ``run_id`` under ``root``,
    tags the current flow run with its owner (the janitor's evidence), runs the rollouts at
    ``config.rollout_granularity`` with at most ``config.max_concurrent`` at once, and keeps going
    while the Prefect API is away for up to ``config.api_outage_limit_s``. Rollout flow runs send no
    heartbeats: the enclosing eval or shard flow run's heartbeats already say whether this process
    lives (Prefect starts a thread and sends an event per heartbeating flow run: ~7% of the client's
    CPU samples in a ``flow`` eval, py-spy, 2026-12-01).

    Args:
        total: Rollouts of the whole run (the progress bar's denominator).
        durable: Keys ``(environment, task id, rollout index)`` already durable (resume); never written again.
        progress_key: Key of the progress artifact to keep current, or None for none.
        shard_flow_run_id: The shard flow run running these rollouts on a worker, if any.

    Returns:
        Errors of rollouts that could not run and have no row (a crashed batch task run).

    Raises:
        ApiOutageError: the API stayed away past the limit; rows made durable so far stay.
        TraceStoreError: rows could not be written (e.g. ``No space left on device``): the rollouts
            stopped at once; the message ends with how many rollouts of the run have no row.
    """
    writer = TraceWriter(root, run_id, batch_size=max(1, min(64, config.max_concurrent)), durable=durable)
    watch = ApiWatch(PREFECT_API_URL.value(), config.api_outage_limit_s)
    quiet = QuietWhileDown(watch)
    quiet.install()
    try:
        await tag_flow_run()   # the janitor's evidence (flows/janitor.py); rollout flow runs get it in _run_one
        async with eval_limits(config), _open_agents(config, todo) as agents:   # [limits] for its rollouts
            run = _Run(agents=agents, writer=writer, run_id=run_id, total=total,
                       gate=asyncio.Semaphore(config.max_concurrent), watch=watch, progress_key=progress_key,
                       worker={"host": socket.gethostname(), "pid": os.getpid(),
                               "shard_flow_run_id": shard_flow_run_id},
                       flush_each=config.flush_each_rollout or config.rollouts_per_task > 1)
            await prepare_tasks(todo, report=_preparation_report())   # e.g. Harbor tasks' images, before any rollout
            with _no_heartbeats() if config.rollout_granularity == "flow" else contextlib.nullcontext():
                await _run_through_outages(run, todo, config)
            if run.store_error is not None:
                raise TraceStoreError(f"{run.store_error}; {total - len(writer.durable)} of {total} rollouts of "
                                      f"run {run_id} have no row") from run.store_error
        await _settle(run, config)
    finally:
        if watch.is_up:   # else the run stops for the outage: keep Prefect's retries of it quiet
            quiet.remove()
    return run.failures


def _preparation_report() -> Callable[[str], None]:
    """Where the preparation's lines go: the flow run's log (the UI), and ``preparation_listener``."""
    try:
        logger: Any = get_run_logger()
    except MissingContextError:
        logger = logging.getLogger("prefect_rollouts.prepare")
    listener = preparation_listener.get()

    def report(line: str) -> None:
        logger.info(line)
        if listener is not None:
            listener(line)
    return report


def _no_heartbeats() -> contextlib.AbstractContextManager[Any]:
    """No heartbeat thread per rollout flow run (the eval's or shard's heartbeats say this process lives).
    Only ``flow`` granularity enters it: building the changed settings costs ~30 ms of CPU (py-spy,
    2026-12-01), a fixed cost of every eval that runs no rollout flow run."""
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


@contextlib.asynccontextmanager
async def _open_agents(config: EvalConfig, todo: list[Planned]) -> AsyncIterator[dict[str, tuple[Agent, str]]]:
    """An open agent per distinct agent config of the environments in ``todo`` (a suite's entries may
    change ``[env.agent]`` keys), with its ``config_hash``; closed on exit. Each agent of a
    ``local/...`` model starts its own embedded server."""
    needed = {planned.environment.name: planned.environment.agent for planned in todo}
    async with contextlib.AsyncExitStack() as stack:
        opened: dict[str, tuple[Agent, str]] = {}
        by_config: dict[str, tuple[Agent, str]] = {}
        for name, agent_config in needed.items():
            key = agent_config.model_dump_json()
            if key not in by_config:
                agent = await stack.enter_async_context(make_agent(agent_config))
                by_config[key] = (agent, config_hash(agent.info))
            opened[name] = by_config[key]
        if not opened:   # nothing to run: still check that the agent opens (a bad endpoint block says so)
            await stack.enter_async_context(make_agent(config.env.agent))
        yield opened


def config_hash(agent_info: dict[str, Any]) -> str:
    """First 12 hex digits of the SHA-256 of the agent's config (``Agent.info``) as sorted JSON."""
    return hashlib.sha256(json.dumps(agent_info, sort_keys=True).encode()).hexdigest()[:12]


async def _run_through_outages(run: _Run, todo: list[Planned], config: EvalConfig) -> None:
    """Run the rollouts at the configured granularity while ``run.watch`` keeps Prefect informed;
    stop them once the API has been away for ``api_outage_limit_s``.

    Raises:
        ApiOutageError: the outage passed the limit; rows made durable so far stay.
    """
    granularity = _run_batches if config.rollout_granularity == "batch" else _run_each
    runner = asyncio.create_task(granularity(run, todo, config))
    flusher = asyncio.create_task(_flush_periodically(run))

    def stop_runner() -> None:
        runner.cancel()
    run.stop = stop_runner
    watcher = asyncio.create_task(run.watch.run(lambda: _inform_prefect(run), stop_runner))
    try:
        await asyncio.wait({runner, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done() and not runner.done():   # the limit passed: on_limit cancelled the runner
            await asyncio.gather(runner, return_exceptions=True)
        if run.store_error is not None:   # a write failed and stopped the runner: execute says so
            return
        if runner.cancelled():
            watch = run.watch
            raise ApiOutageError(str(watch.api_url), run.run_id, watch.down_s, len(run.writer.durable), run.total)
        runner.result()
    finally:
        for background in (runner, flusher, watcher):
            background.cancel()
        await asyncio.gather(runner, flusher, watcher, return_exceptions=True)   # rollouts end their teardown
        await run.flush()
        run.report()


SETTLE_TRIES = 3
"""Tries to write the states an outage left unwritten once the API answers again at the end."""


async def _settle(run: _Run, config: EvalConfig) -> None:
    """After the last rollout: wait for the API and its database (the summary artifact and this
    flow run's end need them), then write what an outage left unwritten (``_inform_prefect``) and
    close the rollout flow runs it left live (``close_orphans``).

    Raises:
        ApiOutageError: the API stayed away past the limit, or answered 5xx to ``SETTLE_TRIES``
            tries; the states still unwritten are logged by name.
        RuntimeError: the server refused some rollouts' states (named; ``traces reconcile`` mends them).
    """
    watch = run.watch
    for _ in range(SETTLE_TRIES):
        if not await watch.wait_up():
            break
        try:
            await _inform_prefect(run)
            if watch.had_outage and config.rollout_granularity == "flow" and not run.failures:
                await close_orphans(run.run_id)   # every rollout has finished: a live rollout flow run is an orphan
        except (httpx.TransportError, OSError) as exc:
            watch.mark_down(f"{type(exc).__name__}: {exc}")
        except httpx.HTTPStatusError as exc:
            if not is_server_error(exc):
                raise
            watch.mark_down(f"the API answered {exc.response.status_code} ({exc.request.url.path})")
        else:
            if watch.refused:
                raise RuntimeError(f"the Prefect server refused the states of {len(watch.refused)} rollouts "
                                   f"({', '.join(watch.refused[:10])}); write them with: "
                                   f"prefect-rollouts traces reconcile {run.writer.root.uri} {run.run_id}")
            return
    if watch.unreported:
        log.warning("the states of %d rollouts were not written to Prefect: %s", len(watch.unreported),
                    ", ".join(item.name for item in watch.unreported[:20]))
    raise ApiOutageError(str(watch.api_url), run.run_id, max(watch.down_s, watch.limit_s), len(run.writer.durable),
                         run.total)


async def _inform_prefect(run: _Run) -> None:
    """While the API answers: the progress artifact, then flow runs that an outage left unreported."""
    done = len(run.writer.durable)
    if run.progress_key is not None and run.progress_id is None:
        run.progress_id = await acreate_progress_artifact(
            progress=100.0 * done / max(run.total, 1), key=run.progress_key,
            description=f"Durable rollouts of run {run.run_id}")
        run.reported = done
    if run.progress_id is not None and done != run.reported:
        await aupdate_progress_artifact(run.progress_id, progress=100.0 * done / max(run.total, 1))
        run.reported = done
    await run.watch.reconcile()


async def _flush_periodically(run: _Run) -> None:
    while True:
        await asyncio.sleep(FLUSH_INTERVAL_S)
        await run.flush()


async def _run_each(run: _Run, todo: list[Planned], config: EvalConfig) -> None:
    """Every rollout of ``todo`` on its own (``flow`` and ``task`` granularity), ``max_concurrent`` at once.

    ``max_concurrent`` workers take the rollouts in turn, so the coroutines alive at once are bounded
    by the concurrency, not by the plan (an asyncio task per planned rollout, as before, held 1.5 KB or more each)."""
    pending = iter(todo)

    async def worker() -> None:
        for planned in pending:
            await _run_one(run, planned, config.rollout_granularity)
    await _gather_all([worker() for _ in range(min(config.max_concurrent, len(todo)))])


async def _gather_all(coroutines: list[Any], return_exceptions: bool = False) -> list[Any]:
    """``asyncio.gather`` of ``coroutines`` that, when it is cancelled (SIGTERM, Ctrl-C, a full disk, an
    outage past its limit) or one of them raises, cancels the others and waits for them to end: a rollout's
    teardown (its container's removal, its flow run's final state) then finishes while the eval's Prefect
    client is still open, instead of failing later against a closed one."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return await asyncio.gather(*tasks, return_exceptions=return_exceptions)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _run_one(run: _Run, planned: Planned, granularity: str) -> Trace:
    """One rollout at the eval's ``granularity``; its row is recorded whatever happened to it.

    ``flow``: a ``rollout_flow`` subflow (a task run per stage), inline while the API is away.
    ``task``: one ``rollout`` task run whose stages run inline. ``batch``: inline, inside the
    caller's shard task run.

    Returns:
        The rollout's trace (its row is buffered or durable).
    """
    async with run.gate:
        rollout, started = run.rollout(planned), time.perf_counter()
        if granularity == "flow":
            with owner_tags():
                await _run_flow_or_inline(run, rollout)
        elif granularity == "task":
            final = await rollout_task(quote(rollout), planned.task.id, planned.index, return_state=True)  # type: ignore[misc]
            if await trace_of(final) is None:                 # crashed, not just errored
                _record_crash(rollout, final)
        else:
            await rollout.run()
        await run.record(rollout, planned, time.perf_counter() - started)
        return rollout.trace


async def _run_flow_or_inline(run: _Run, rollout: Rollout) -> None:
    """A ``rollout_flow`` run while the Prefect API answers; inline stages while it does not.

    A flow run whose creation fails while the API's health check passes is tried once more (a
    passing error, not an outage). A flow run that could not be created runs inline; one that ran
    but could not report its end keeps its trace. Both are remembered, and ``ApiWatch.reconcile``
    tells the server later.
    """
    request = RolloutRequest.of(rollout)
    if not run.watch.is_up:
        await rollout.run()
        run.watch.unreported.append(_unreported(request, None, failure_message(rollout.trace)))
        return
    final, error = None, None
    for attempt in (1, 2):
        try:
            final = await rollout_flow(request, return_state=True)
        except (httpx.HTTPError, OSError) as exc:   # the API went away while creating or ending the flow run
            error = exc
            if attempt == 1 and "flow_run_id" not in rollout.trace.info and await run.watch.check():
                log.warning("creating the flow run of %s failed (%s: %s) while the API answers; trying once more",
                            request.run_name(), type(exc).__name__, exc)
                continue                          # a passing error before the rollout started: not an outage
            run.watch.mark_down(f"rollout flow run: {type(exc).__name__}: {exc}")
        else:
            error = None
        break
    trace = rollout.trace
    flow_run_id = trace.info.get("flow_run_id")   # set once the flow run's body starts
    finished = "teardown" in trace.timings
    returned = None if final is None else await trace_of(final)   # Completed, or Failed as the rollout errored
    if final is not None and (returned is not None or not finished):
        if returned is None:                             # the rollout itself crashed
            _record_crash(rollout, final)
        return
    cut_short = None                                     # from here on, the API failed the bookkeeping
    if flow_run_id is None:                              # the flow run never started: run the rollout here
        await rollout.run()
    elif not finished and error is not None:             # cut short by the failure itself
        rollout.record_error(error, "orchestration")
        await rollout.release()
        cut_short = f"{type(error).__name__}: {error}"
    run.watch.unreported.append(_unreported(request, flow_run_id, cut_short or failure_message(trace)))


def _unreported(request: RolloutRequest, flow_run_id: str | None, error: str | None) -> Unreported:
    return Unreported(name=request.run_name(), parameters={"rollout": request.model_dump()},
                      flow_run_id=flow_run_id, error=error)


@task(name="rollout", task_run_name="{task_id}#{index}", persist_result=False, cache_policy=NO_CACHE)
async def rollout_task(rollout: Rollout, task_id: str, index: int) -> Trace | State[Trace]:
    """A whole rollout as one task run: its stages run inline (with their stage retries).
    Failed, holding the trace, when the rollout errored (``rollout_outcome``)."""
    return rollout_outcome(await rollout.run())


def _crashed(task_: Any, task_run: Any, state: State[Any]) -> bool:
    """Retry a batch that raised, not one that returned Failed because rollouts errored (they have rows),
    nor one whose rows could not be written (the eval stops: running its rollouts again costs twice)."""
    return isinstance(state.data, BaseException) and not isinstance(state.data, TraceStoreError)


@task(name="batch", task_run_name="batch-{shard_index}", retries=1, retry_condition_fn=_crashed,
      persist_result=False, cache_policy=NO_CACHE)
async def shard_task(run: _Run, shard: list[Planned], shard_index: int) -> int | State[int]:
    """A batch of rollouts run by the inline engine. A retry runs only the rollouts with no durable row.

    A batch is a task run of many rollouts, so it cannot be a rollout's state: it is Failed when
    any of its rollouts errored (``N of M rollouts errored (<first error>)``), as a ``rollout``
    task run would be, so the UI points at the batches to look into; it is not retried for that,
    since each of those rollouts has its row. Only a batch that raised is retried.

    Returns:
        How many rollouts this attempt ran; in a Failed state when some of them errored.
    """
    await run.flush()  # rows of a failed attempt become durable first, so they are not run twice
    pending = [planned for planned in shard if planned.key not in run.writer.durable]

    results = await _gather_all([_run_one(run, planned, "batch") for planned in pending], return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    errored = [trace for trace in results if isinstance(trace, Trace) and trace.errors]
    if not errored:
        return len(pending)
    first = error_text(errored[0].errors[0].type, errored[0].errors[0].message)
    return Failed(message=f"{len(errored)} of {len(pending)} rollouts errored ({first})", data=len(pending))


async def _run_batches(run: _Run, todo: list[Planned], config: EvalConfig) -> None:
    """Shards of ``batch_size`` rollouts, one task run each, as many at once as keep ``max_concurrent`` busy."""
    shards = enumerate(todo[i:i + config.batch_size] for i in range(0, len(todo), config.batch_size))

    async def worker() -> None:   # as many as keep max_concurrent busy, not a coroutine per shard
        for shard_index, shard in shards:
            final = await shard_task(quote(run), quote(shard), shard_index, return_state=True)  # type: ignore[misc]
            ran = await final.aresult(raise_on_failure=False)   # an int, also when rollouts errored
            if not isinstance(ran, int):
                run.failures.append(ran if isinstance(ran, BaseException) else RuntimeError(str(final)))
    workers = min(math.ceil(config.max_concurrent / config.batch_size) + 1, math.ceil(len(todo) / config.batch_size))
    await _gather_all([worker() for _ in range(workers)])


def _record_crash(rollout: Rollout, final: Any) -> None:
    """A rollout's flow or task run crashed outside the stages: keep it as an errored row."""
    error = final.data if isinstance(final.data, BaseException) else RuntimeError(final.message or final.name)
    if not rollout.trace.errors:
        rollout.record_error(error, "orchestration")


def artifact_key(name: str, kind: str) -> str:
    """``eval-<kind>-<name>``, cut to 100 characters, any character of ``name`` other than an ASCII
    letter or digit replaced by a dash (artifact keys allow lowercase letters, digits and dashes only)."""
    safe = "".join(c if c.isascii() and c.isalnum() else "-" for c in name.lower())
    return f"eval-{kind}-{safe}"[:100]
