"""The Prefect runners of an eval's rollouts: a flow run or a task run per rollout, or per batch.

``eval_flow`` (in-process evals) and ``shard_flow`` (a shard of an eval on a work-pool worker) both
run their rollouts through ``execute``, which hands the eval engine (``evals/engine.py``: bounded
concurrency, rows to Parquet) the runner of ``rollout_granularity``: ``flow`` (a ``rollout_flow``
subflow per rollout, a task run per stage), ``task`` (a ``rollout`` task run per rollout) or
``batch`` (a ``batch`` task run per batch of rollouts, whose stages run inline). Beside the work,
``flows/services/outage.py`` watches the Prefect API: while it is away, rollouts go on.

A rollout that errored is a Failed rollout flow run or ``rollout`` task run (``rollout_outcome``);
a ``batch`` task run is Failed when any of its rollouts errored. Their rows are written all the same.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
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

from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.evals.budget import Budget
from prefect_rollouts.evals.engine import (
    EvalRun,
    Runner,
    gather_all,
    preparation_listener,
    run_each,
    run_one,
    run_rollouts,
    run_stages,
)
from prefect_rollouts.evals.plan import Planned, RolloutKey
from prefect_rollouts.flows.rollout import RolloutRequest, failure_message, rollout_flow, rollout_outcome, trace_of
from prefect_rollouts.flows.services.concurrency import eval_limits
from prefect_rollouts.flows.services.outage import (
    ApiOutageError,
    ApiWatch,
    QuietWhileDown,
    Unreported,
    close_orphans,
    is_server_error,
)
from prefect_rollouts.flows.services.ownership import owner_tags, sandbox_labels, tag_flow_run
from prefect_rollouts.rollout import Rollout
from prefect_rollouts.trace import Trace
from prefect_rollouts.traces import DatasetRoot, error_text

log = logging.getLogger("prefect_rollouts.outage")


@dataclass(eq=False)
class _Bookkeeping:
    """What the Prefect side of one ``execute`` keeps: the API's watch and the progress artifact."""

    watch: ApiWatch
    progress_key: str | None
    """Key of the progress artifact to keep current; None: none (a shard: the eval keeps it)."""
    progress_id: Any = None
    reported: int = -1


async def execute(config: EvalConfig, root: str | DatasetRoot, run_id: str, todo: list[Planned], *,
                  total: int, durable: set[RolloutKey], progress_key: str | None,
                  shard_flow_run_id: str | None = None, budget: Budget | None = None) -> list[BaseException]:
    """Run ``todo`` (rollouts of the plan) in this process at ``config.rollout_granularity``, with
    at most ``config.max_concurrent`` at once, and make every row durable (``evals.engine.run_rollouts``).

    Tags the current flow run with its owner (the janitor's evidence), holds the eval's shared
    concurrency limits (``[limits]``), and keeps going while the Prefect API is away for up to
    ``config.api_outage_limit_s``; at the end writes what an outage left unwritten. Rollout flow
    runs send no heartbeats: the enclosing eval or shard flow run's heartbeats already say whether
    this process lives (Prefect starts a thread and sends an event per heartbeating flow run; see
    ``_no_heartbeats``).

    Args:
        total: Rollouts of the whole run (the progress bar's denominator).
        durable: Keys ``(environment, task id, rollout index)`` already durable (resume); never written again.
        progress_key: Key of the progress artifact to keep current, or None for none.
        shard_flow_run_id: The shard flow run running these rollouts on a worker, if any.
        budget: The run's budget shared across shards (``flows/services/budget.py``); None: the engine's own, in
            this process, when the config sets one (``evals.engine.run_rollouts``).

    Returns:
        Errors of rollouts that could not run and have no row (a crashed batch task run).

    Raises:
        ApiOutageError: the API stayed away past the limit; rows made durable so far stay.
        TraceStoreError: rows could not be written (e.g. ``No space left on device``): the rollouts
            stopped at once; the message ends with how many rollouts of the run have no row.
    """
    books = _Bookkeeping(ApiWatch(PREFECT_API_URL.value(), config.api_outage_limit_s), progress_key)
    quiet = QuietWhileDown(books.watch)
    quiet.install()
    try:
        await tag_flow_run()   # the janitor's evidence (flows/janitor.py); rollout flow runs get it from owner_tags
        async with eval_limits(config):   # [limits] for its rollouts
            with _no_heartbeats() if config.rollout_granularity == "flow" else contextlib.nullcontext():
                run, complete = await run_rollouts(
                    config, root, run_id, todo, _runner(config, books.watch), total=total, durable=durable,
                    beside=lambda run, stop: books.watch.run(lambda: _inform_prefect(books, run), stop),
                    labels=sandbox_labels(), report=_preparation_report(),
                    worker={"host": socket.gethostname(), "pid": os.getpid(), "shard_flow_run_id": shard_flow_run_id},
                    budget=budget)
        if not complete:
            watch = books.watch
            raise ApiOutageError(str(watch.api_url), run_id, watch.down_s, len(run.writer.durable), total)
        await _settle(run, books, config)
    finally:
        if books.watch.is_up:   # else the run stops for the outage: keep Prefect's retries of it quiet
            quiet.remove()
    return run.failures


def _runner(config: EvalConfig, watch: ApiWatch) -> Runner:
    """The runner of ``config.rollout_granularity``."""
    concurrency = config.max_concurrent
    if config.rollout_granularity == "batch":
        return _BatchTaskRuns(config.batch_size, concurrency)

    async def how(rollout: Rollout, planned: Planned) -> None:
        if config.rollout_granularity == "flow":
            with owner_tags():
                await _flow_run_or_inline(watch, rollout)
        else:
            await _task_run(rollout, planned)

    def run(run: EvalRun, todo: list[Planned]) -> Coroutine[Any, Any, None]:
        return run_each(run, todo, how, concurrency)
    return run


def _preparation_report() -> Callable[[str], None]:
    """Where the preparation's lines go: the flow run's log (the UI), and ``preparation_listener``."""
    try:
        logger: Any = get_run_logger()
    except MissingContextError:
        logger = logging.getLogger("prefect_rollouts.evals.prepare_tasks")
    listener = preparation_listener.get()

    def report(line: str) -> None:
        logger.info(line)
        if listener is not None:
            listener(line)
    return report


def _no_heartbeats() -> contextlib.AbstractContextManager[Any]:
    """No heartbeat thread per rollout flow run (the eval's or shard's heartbeats say this process lives).
    Only ``flow`` granularity enters it: building the changed settings costs tens of ms of CPU, a
    fixed cost of every eval that runs no rollout flow run (benchmarks/README.md, "No heartbeats")."""
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


SETTLE_TRIES = 3
"""Tries to write the states an outage left unwritten once the API answers again at the end."""


async def _settle(run: EvalRun, books: _Bookkeeping, config: EvalConfig) -> None:
    """After the last rollout: wait for the API and its database (the summary artifact and this
    flow run's end need them), then write what an outage left unwritten (``_inform_prefect``) and
    close the rollout flow runs it left live (``close_orphans``).

    Raises:
        ApiOutageError: the API stayed away past the limit, or answered 5xx to ``SETTLE_TRIES``
            tries; the states still unwritten are logged by name.
        RuntimeError: the server refused some rollouts' states (named; ``traces reconcile`` mends them).
    """
    watch = books.watch
    for _ in range(SETTLE_TRIES):
        if not await watch.wait_up():
            break
        try:
            await _inform_prefect(books, run)
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


async def _inform_prefect(books: _Bookkeeping, run: EvalRun) -> None:
    """While the API answers: the progress artifact, then flow runs that an outage left unreported."""
    done = len(run.writer.durable)
    if books.progress_key is not None and books.progress_id is None:
        books.progress_id = await acreate_progress_artifact(
            progress=100.0 * done / max(run.total, 1), key=books.progress_key,
            description=f"Durable rollouts of run {run.run_id}")
        books.reported = done
    if books.progress_id is not None and done != books.reported:
        await aupdate_progress_artifact(books.progress_id, progress=100.0 * done / max(run.total, 1))
        books.reported = done
    await books.watch.reconcile()


async def _flow_run_or_inline(watch: ApiWatch, rollout: Rollout) -> None:
    """A ``rollout_flow`` run while the Prefect API answers; inline stages while it does not.

    A flow run whose creation fails while the API's health check passes is tried once more (a
    passing error, not an outage). A flow run that could not be created runs inline; one that ran
    but could not report its end keeps its trace. Both are remembered, and ``ApiWatch.reconcile``
    tells the server later.
    """
    request = RolloutRequest.of(rollout)
    if not watch.is_up:
        await rollout.run()
        watch.unreported.append(_unreported(request, None, failure_message(rollout.trace)))
        return
    final, error = None, None
    for attempt in (1, 2):
        try:
            final = await rollout_flow(request, return_state=True)
        except (httpx.HTTPError, OSError) as exc:   # the API went away while creating or ending the flow run
            error = exc
            if attempt == 1 and "flow_run_id" not in rollout.trace.info and await watch.check():
                log.warning("creating the flow run of %s failed (%s: %s) while the API answers; trying once more",
                            request.run_name(), type(exc).__name__, exc)
                continue                          # a passing error before the rollout started: not an outage
            watch.mark_down(f"rollout flow run: {type(exc).__name__}: {exc}")
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
    watch.unreported.append(_unreported(request, flow_run_id, cut_short or failure_message(trace)))


def _unreported(request: RolloutRequest, flow_run_id: str | None, error: str | None) -> Unreported:
    return Unreported(name=request.run_name(), parameters={"rollout": request.model_dump()},
                      flow_run_id=flow_run_id, error=error)


async def _task_run(rollout: Rollout, planned: Planned) -> None:
    """``task`` granularity: the rollout as one ``rollout`` task run; a crash is kept as an errored row."""
    final = await rollout_task(quote(rollout), planned.task.id, planned.index, return_state=True)  # type: ignore[misc]
    if await trace_of(final) is None:                 # crashed, not just errored
        _record_crash(rollout, final)


@task(name="rollout", task_run_name="{task_id}#{index}", persist_result=False, cache_policy=NO_CACHE)
async def rollout_task(rollout: Rollout, task_id: str, index: int) -> Trace | State[Trace]:
    """A whole rollout as one task run: its stages run inline (with their stage retries).
    Failed, holding the trace, when the rollout errored (``rollout_outcome``)."""
    return rollout_outcome(await rollout.run())


def _crashed(task_: Any, task_run: Any, state: State[Any]) -> bool:
    """Retry a batch that raised, not one that returned Failed because rollouts errored (they have rows),
    nor one whose rows could not be written (the eval stops: running its rollouts again costs twice)."""
    return isinstance(state.data, BaseException) and not isinstance(state.data, TraceStoreError)


@task(name="batch", task_run_name="batch-{batch_index}", retries=1, retry_condition_fn=_crashed,
      persist_result=False, cache_policy=NO_CACHE)
async def batch_task(run: EvalRun, batch: list[Planned], batch_index: int) -> int | State[int]:
    """A batch of rollouts whose stages run inline. A retry runs only the rollouts with no durable row, and
    the next attempt of those whose errored attempt is durable and whose retry the crash cut off (``EvalRun.due``).

    A batch is a task run of many rollouts, so it cannot be a rollout's state: it is Failed when
    any of its rollouts errored (``N of M rollouts errored (<first error>)``), as a ``rollout``
    task run would be, so the UI points at the batches to look into; it is not retried for that,
    since each of those rollouts has its row. Only a batch that raised is retried.

    Returns:
        How many rollouts this attempt ran; in a Failed state when some of them errored.
    """
    await run.flush()  # rows of a failed attempt become durable first, so they are not run twice
    pending = [planned if planned.key not in run.writer.durable else replace(planned, attempt=run.due[planned.key])
               for planned in batch if planned.key not in run.writer.durable or planned.key in run.due]

    results = await gather_all([run_one(run, planned, run_stages) for planned in pending], return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    errored = [trace for trace in results if isinstance(trace, Trace) and trace.errors]
    if not errored:
        return len(pending)
    first = error_text(errored[0].errors[0].type, errored[0].errors[0].message)
    return Failed(message=f"{len(errored)} of {len(pending)} rollouts errored ({first})", data=len(pending))


@dataclass(frozen=True)
class _BatchTaskRuns:
    """``batch`` granularity: batches of ``batch_size`` rollouts, a ``batch`` task run each, as many at
    once as keep ``max_concurrent`` rollouts busy. A batch that crashed adds its error to ``run.failures``."""

    batch_size: int
    max_concurrent: int

    async def __call__(self, run: EvalRun, todo: list[Planned]) -> None:
        size = self.batch_size
        batches = enumerate(todo[i:i + size] for i in range(0, len(todo), size))

        async def worker() -> None:   # as many as keep max_concurrent busy, not a coroutine per batch
            for index, batch in batches:
                final = await batch_task(quote(run), quote(batch), index, return_state=True)  # type: ignore[misc]
                ran = await final.aresult(raise_on_failure=False)   # an int, also when rollouts errored
                if not isinstance(ran, int):
                    run.failures.append(ran if isinstance(ran, BaseException) else RuntimeError(str(final)))
        workers = min(math.ceil(self.max_concurrent / size) + 1, math.ceil(len(todo) / size))
        await gather_all([worker() for _ in range(workers)])


def _record_crash(rollout: Rollout, final: Any) -> None:
    """A rollout's flow or task run crashed outside the stages: keep it as an errored row."""
    error = final.data if isinstance(final.data, BaseException) else RuntimeError(final.message or final.name)
    if not rollout.trace.errors:
        rollout.record_error(error, "orchestration")
