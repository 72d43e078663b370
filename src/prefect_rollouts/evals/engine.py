"""The eval engine: an eval's rollouts run in this process, a bounded number at once, rows to Parquet.

``EvalRun`` is what the rollouts of one run share (open agents, the ``TraceWriter``, the gate of
``max_concurrent``); ``run_all`` runs a plan's rollouts through a *runner* and keeps the rows
durable (a flush at least every ``FLUSH_INTERVAL_S``, and after the last rollout). The runner is the
granularity: ``run_inline`` runs each rollout's stages here; the Prefect layer's runners
(``flows/execute.py``) make each rollout a flow run or a task run, or each batch a task run, and
watch the Prefect API beside the work. A rollout counts as done once its row is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prefect_rollouts.agent import Agent, make_agent
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.evals.budget import Budget, MemoryLedger, rows_spend
from prefect_rollouts.evals.plan import Planned, RolloutKey
from prefect_rollouts.evals.prepare_tasks import prepare_tasks
from prefect_rollouts.retry_rule import InRunRetry
from prefect_rollouts.rollout import Rollout
from prefect_rollouts.trace import Trace
from prefect_rollouts.traces.store import DatasetRoot
from prefect_rollouts.traces.writer import TraceWriter

#: Called as ``listener(durable, total)`` whenever more rollouts become durable (the CLI's progress bar).
progress_listener: contextvars.ContextVar[Callable[[int, int], None] | None] = contextvars.ContextVar(
    "prefect_rollouts_progress_listener", default=None)

#: Called with each line of the tasks' preparation (e.g. image builds) before the rollouts (the CLI prints them).
preparation_listener: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "prefect_rollouts_preparation_listener", default=None)

FLUSH_INTERVAL_S = 2.0
"""Buffered rows are made durable at least this often."""


@dataclass(eq=False)
class EvalRun:
    """What every rollout of one eval run shares."""

    agents: dict[str, tuple[Agent, str]]
    """Per environment: its agent and ``config_hash`` (environments with the same agent config share one)."""
    writer: TraceWriter
    run_id: str
    total: int
    """Rollouts of the whole run (the progress bar's denominator)."""
    gate: asyncio.Semaphore
    """At most ``max_concurrent`` rollouts at once."""
    flush_each: bool = False
    """Make each rollout durable as it finishes (see ``EvalConfig.flush_each_rollout``)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels of every rollout's sandbox besides its run id and rollout index (the janitor's evidence)."""
    worker: dict[str, Any] = field(default_factory=dict)
    """Where the rollouts run (``host``, ``pid``, ``shard_flow_run_id``): ``trace.info["worker"]``
    and the row's ``worker_host``, ``worker_pid`` and ``shard_flow_run_id`` columns."""
    failures: list[BaseException] = field(default_factory=list)
    """Errors of rollouts that could not run and have no row (a crashed batch task run)."""
    store_error: TraceStoreError | None = None
    """The first write of rows that failed: the run stops (``stop``) instead of running rollouts it cannot keep."""
    stop: Callable[[], None] | None = None
    budget: Budget | None = None
    """The run's token or cost budget (``evals/budget.py``), shared by its rollouts; None without one."""
    retry: InRunRetry = field(default_factory=InRunRetry)
    """Which errored attempts run again within the run, and after which wait (``max_rollout_attempts``)."""
    due: dict[RolloutKey, int] = field(default_factory=dict)
    """Rollouts whose errored attempt is durable and whose next attempt (the value) has no row yet: it waits
    for its backoff or runs. A ``batch`` task run retried after a crash runs these again (``flows/execute.py``)."""

    def rollout(self, planned: Planned) -> Rollout:
        labels = {"run_id": self.run_id, "rollout_index": str(planned.index), **self.labels,
                  **({"attempt": str(planned.attempt)} if planned.attempt > 1 else {})}
        rollout = self.agents[planned.environment.name][0].rollout(planned.task, labels)
        rollout.share_budget(self.budget)
        return rollout

    async def record(self, rollout: Rollout, planned: Planned, elapsed_s: float) -> None:
        """Buffer the finished rollout's row; flush when the batch is full, or at once when every
        rollout must be durable as it finishes (``flush_each``, or a task whose rewards have side effects)."""
        rollout.trace.info["worker"] = self.worker
        full = self.writer.add(rollout.trace, rollout_index=planned.index, environment=planned.environment.name,
                               config_hash=self.agents[planned.environment.name][1], elapsed_s=elapsed_s,
                               attempt=planned.attempt)
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
        """Tell ``progress_listener`` (the CLI's progress bar) how many rollouts are durable and done (a
        budget stop's row is durable but not done: ``RolloutWriter.done``)."""
        if (listener := progress_listener.get()) is not None:
            listener(self.writer.done, self.total)


async def run_rollouts(config: EvalConfig, root: str | DatasetRoot, run_id: str, todo: list[Planned],
                       runner: Runner, *, total: int, durable: set[RolloutKey],
                       beside: Callable[[EvalRun, Callable[[], None]], Coroutine[Any, Any, None]] | None = None,
                       labels: dict[str, str] | None = None, worker: dict[str, Any] | None = None,
                       report: Callable[[str], None] | None = None,
                       budget: Budget | None = None) -> tuple[EvalRun, bool]:
    """Run ``todo`` (rollouts of run ``run_id``'s plan) through ``runner`` and make every row durable.

    Opens the agents (``open_agents``) and a ``TraceWriter`` under ``root`` (a batch of up to 64 rows,
    at most ``max_concurrent``), prepares the tasks (``Task.prepare``, e.g. a Harbor image build,
    before any rollout; its lines go to ``report``), then ``run_all``.

    Args:
        runner: The granularity (``inline_runner``, or the Prefect layer's).
        total: Rollouts of the whole run (the progress bar's denominator).
        durable: Keys ``(environment, task id, rollout index)`` already durable (resume); never written again.
        beside, labels, worker: As ``run_all``, ``EvalRun.labels`` and ``EvalRun.worker``.
        budget: The run's budget over a ledger every process of the run shares (a shard on a work pool);
            None: with ``token_budget`` or ``cost_budget_usd`` set, one over a ``MemoryLedger`` that starts
            from the spend of the run's rows (``evals.budget.rows_spend``).

    Returns:
        ``(run, complete)``: the run (its ``failures``, ``writer.durable``) and whether every
        rollout ran (False: ``beside`` stopped them).

    Raises:
        TraceStoreError: rows could not be written (e.g. ``No space left on device``): the rollouts
            stopped at once; the message ends with how many rollouts of the run have no row.
        ConfigError: a task cannot run under its agent config (``prepare_tasks``).
    """
    writer = TraceWriter(root, run_id, batch_size=max(1, min(64, config.max_concurrent)), durable=durable)
    if budget is None and (config.token_budget is not None or config.cost_budget_usd is not None):
        budget = Budget(config.token_budget, config.cost_budget_usd, MemoryLedger(rows_spend(root, run_id)))
    async with open_agents(config, todo) as agents:
        run = EvalRun(agents=agents, writer=writer, run_id=run_id, total=total,
                      gate=asyncio.Semaphore(config.max_concurrent), labels=labels or {}, worker=worker or {},
                      flush_each=config.flush_each_rollout or config.rollouts_per_task > 1, budget=budget,
                      retry=InRunRetry.of(config))
        await prepare_tasks(todo, report=report)
        complete = await run_all(run, todo, runner, beside=beside)
        if run.store_error is not None:
            raise TraceStoreError(f"{run.store_error}; {total - len(writer.durable)} of {total} rollouts of "
                                  f"run {run_id} have no row") from run.store_error
    return run, complete


class Runner(Protocol):
    """The granularity: runs every rollout of ``todo`` through ``run_one`` (or a batch of them)."""

    def __call__(self, run: EvalRun, todo: list[Planned]) -> Coroutine[Any, Any, None]: ...


RunRollout = Callable[[Rollout, Planned], Awaitable[None]]
"""How one rollout runs: ``rollout.run()`` here, or as a flow run or task run of it."""


async def run_all(run: EvalRun, todo: list[Planned], runner: Runner, *,
                  beside: Callable[[EvalRun, Callable[[], None]], Coroutine[Any, Any, None]] | None = None) -> bool:
    """Run ``todo`` through ``runner`` while the rows are flushed every ``FLUSH_INTERVAL_S``.

    Args:
        beside: Run alongside as ``beside(run, stop)`` (the Prefect API's watch); calling ``stop`` cancels
            the rollouts, which end their teardown.

    Returns:
        True when every rollout ran; False when the work was stopped: by ``beside``, or by a write
        that failed (``run.store_error``). The buffered rows are flushed either way.

    Raises:
        Exception: what the runner raised.
    """
    work: asyncio.Task[None] = asyncio.create_task(runner(run, todo))
    flusher = asyncio.create_task(_flush_periodically(run))

    def stop() -> None:
        work.cancel()
    run.stop = stop
    watcher = asyncio.create_task(beside(run, stop)) if beside is not None else None
    try:
        await asyncio.wait({work} if watcher is None else {work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():   # the watcher ended first, having stopped the work
            await asyncio.gather(work, return_exceptions=True)
        if run.store_error is not None or work.cancelled():
            return False
        work.result()
        return True
    finally:
        for background in (work, flusher, watcher):
            if background is not None:
                background.cancel()
        await asyncio.gather(*(t for t in (work, flusher, watcher) if t is not None), return_exceptions=True)
        await run.flush()
        run.report()


async def _flush_periodically(run: EvalRun) -> None:
    while True:
        await asyncio.sleep(FLUSH_INTERVAL_S)
        await run.flush()


async def run_one(run: EvalRun, planned: Planned, how: RunRollout) -> Trace | None:
    """One rollout, run by ``how`` once the gate lets it in; its row is recorded whatever happened to it.

    An attempt that ended in an error the run retries (``run.retry``: ``max_rollout_attempts``) runs again
    after the backoff as the next attempt, with a row of its own (``retry_after_backoff``).

    Returns:
        The trace of the rollout's last attempt (its row is buffered or durable); None when the run's budget
        was reached before it started (``EvalRun.budget``): it did not start and has no row (a resume runs it).
    """
    trace = await run_attempt(run, planned, how)
    if trace is not None and run.retry.again(trace, planned.attempt):
        return await retry_after_backoff(run, planned, how)
    return trace


async def run_attempt(run: EvalRun, planned: Planned, how: RunRollout) -> Trace | None:
    """Attempt ``planned.attempt`` of a rollout, run by ``how`` once the gate lets it in; its row is
    recorded whatever happened to it. Every granularity's rollouts run through here.

    Returns:
        Its trace (its row is buffered or durable); None when the run's budget was reached before it
        started: it did not start and has no row.
    """
    async with run.gate:
        if run.budget is not None and await run.budget.check():
            return None
        rollout, started = run.rollout(planned), time.perf_counter()
        await how(rollout, planned)
        await run.record(rollout, planned, time.perf_counter() - started)
        if run.due.get(planned.key) == planned.attempt:
            del run.due[planned.key]
        return rollout.trace


async def retry_after_backoff(run: EvalRun, planned: Planned, how: RunRollout) -> Trace | None:
    """After errored attempt ``planned.attempt``: make its row durable (a kill during the wait or the next
    attempt keeps it), wait ``run.retry.wait_s`` without holding a gate slot, then ``run_one`` the next attempt."""
    await run.flush()
    run.due[planned.key] = planned.attempt + 1
    await asyncio.sleep(run.retry.wait_s(planned.attempt))
    return await run_one(run, replace(planned, attempt=planned.attempt + 1), how)


async def run_each(run: EvalRun, todo: list[Planned], how: RunRollout, concurrency: int) -> None:
    """Every rollout of ``todo`` on its own through ``run_attempt``, ``concurrency`` at once.

    ``concurrency`` workers take the rollouts in turn, so the coroutines alive at once are bounded
    by the concurrency, not by the plan (an asyncio task per planned rollout held 1.5 KB or more each),
    plus one per rollout waiting for its retry (``retry_after_backoff``): a worker does not wait with it."""
    pending = iter(todo)
    retrying: list[asyncio.Future[Trace | None]] = []

    async def worker() -> None:
        for planned in pending:
            trace = await run_attempt(run, planned, how)
            if trace is not None and run.retry.again(trace, planned.attempt):
                retrying.append(asyncio.ensure_future(retry_after_backoff(run, planned, how)))
    try:
        await gather_all([worker() for _ in range(min(concurrency, len(todo)))])
    except BaseException:   # cancelled, or a worker raised: the waiting retries end with the work
        for waiting in retrying:
            waiting.cancel()
        await asyncio.gather(*retrying, return_exceptions=True)
        raise
    await gather_all(list(retrying))


async def run_stages(rollout: Rollout, planned: Planned) -> None:
    """``RunRollout`` of a rollout whose stages run here, in this coroutine."""
    await rollout.run()


def inline_runner(concurrency: int) -> Runner:
    """The runner without orchestration: each rollout's stages run here, ``concurrency`` at once."""
    def run(run: EvalRun, todo: list[Planned]) -> Coroutine[Any, Any, None]:
        return run_each(run, todo, run_stages, concurrency)
    return run


async def gather_all(coroutines: list[Any], return_exceptions: bool = False) -> list[Any]:
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


@contextlib.asynccontextmanager
async def open_agents(config: EvalConfig, todo: list[Planned]) -> AsyncIterator[dict[str, tuple[Agent, str]]]:
    """An open agent per distinct agent config of the environments in ``todo`` (a suite's entries may
    change ``[env.agent]`` keys), with its ``config_hash``; closed on exit. Each agent of a
    ``local/...`` model starts its own embedded server. With nothing to run, the eval's agent still
    opens once (a bad endpoint block says so)."""
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
        if not opened:
            await stack.enter_async_context(make_agent(config.env.agent))
        yield opened


def config_hash(agent_info: dict[str, Any]) -> str:
    """First 12 hex digits of the SHA-256 of the agent's config (``Agent.info``) as sorted JSON."""
    return hashlib.sha256(json.dumps(agent_info, sort_keys=True).encode()).hexdigest()[:12]
