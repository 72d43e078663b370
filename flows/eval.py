"""``eval_flow``: a whole evaluation as one Prefect flow run that streams traces into Parquet.

The eval plans its rollouts (tasks x rollouts per task), runs them in this process through
``flows/execute.py`` (bounded concurrency, at the chosen granularity), and summarises the run from
the dataset. Re-running with ``resume=<run id>`` runs only the rollouts of that run that have no
durable row; with ``retry_errors=True`` also the errored ones, each as a new attempt (docs/retries.md).

The eval flow run ends Completed when every rollout has a row and at most ``max_error_fraction``
of them errored, else Failed with the reason (``traces.run_failure``), holding an
``EvalFailedError`` with the summary. A rollout that errored is a Failed rollout flow run,
``rollout`` task run (``task`` granularity) or ``batch`` task run holding it (``batch``); its row
is written all the same (``flows/execute.py``).

When its token or cost budget stopped it (``flows/services/budget.py``), the eval flow run ends Failed named
``BudgetReached``, holding a ``BudgetReachedError`` with the spend and the summary.

The summary (``EvalSummary``) is logged in the eval flow run and published as a table artifact
whose key is the same for every run of a series (``flows.baseline.series_name``), so the
UI's Artifacts page keeps its history, night after night.
"""

from __future__ import annotations

import asyncio
import time

from prefect import flow, get_client, get_run_logger
from prefect.artifacts import acreate_table_artifact
from prefect.context import SyncClientContext
from prefect.runtime import flow_run
from prefect.states import Failed, State

from prefect_rollouts.blocks import resolve_trace_root
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.errors import EvalFailedError, TraceStoreError
from prefect_rollouts.evals.engine import preparation_listener
from prefect_rollouts.evals.identity import check_run_id
from prefect_rollouts.evals.prepare import new_run_id, prepare_eval
from prefect_rollouts.flows.execute import execute
from prefect_rollouts.flows.services.baseline import finish_with_baseline, resolve_baseline, series_name, series_tag
from prefect_rollouts.flows.services.budget import budget_state, budget_stop, seed_shared_budget
from prefect_rollouts.flows.services.keys import progress_key, spend_key, summary_key
from prefect_rollouts.flows.services.ownership import tag_flow_run
from prefect_rollouts.flows.services.run_lock import hold_run
from prefect_rollouts.flows.services.work_pool import run_on_work_pool
from prefect_rollouts.traces import DatasetRoot, EvalSummary, compact_run, run_failure, summarize_run
from prefect_rollouts.traces.view import view_command

__all__ = ["eval_flow", "run_eval"]

COMPACT_MIN_FILES = 16
COMPACT_ROWS_PER_FILE = 16
"""At its end an eval rewrites a table's files of a day into one only when there are at least
``COMPACT_MIN_FILES`` of them and fewer than ``COMPACT_ROWS_PER_FILE`` rollouts per file on average
(a slow model flushes a few rows every 2 s): the file count grows with the run's size, and an eval
whose flushes were full (up to 64 rows) pays nothing at its end."""


def _flow_run_name() -> str:
    parameters = flow_run.parameters
    config = parameters.get("config")
    name = config.run_prefix if isinstance(config, EvalConfig) else None
    return parameters.get("resume") or parameters.get("run_id") or name or "eval"


@flow(name="eval", flow_run_name=_flow_run_name, persist_result=False, log_prints=False)
async def eval_flow(config: EvalConfig, resume: str | None = None, run_id: str | None = None,
                    force_config: bool = False, retry_errors: bool = False,
                    retry_error_types: list[str] | None = None) -> EvalSummary | State[EvalSummary]:
    """Evaluate an agent on a taskset and write every rollout to the Parquet trace dataset.

    Args:
        config: The eval: taskset (``env.taskset``), agent (``env.agent``), ``num_tasks``,
            ``rollouts_per_task``, ``max_concurrent``, ``rollout_granularity`` and ``traces``.
        resume: Run id of an earlier run to continue: only its rollouts without a durable
            row run, and the summary covers the whole run. ``config`` may differ from the config
            stored when the run started only in keys that change how it runs
            (``evals.identity.HOW_KEYS``); any other difference fails the run with a config error.
        run_id: Id for a new run; default ``<run_name, else environment-harness-model>-<UTC time>-<4 hex>``.
        force_config: Resume with ``config`` even where it differs from the stored one.
        retry_errors: With ``resume``: also run again, each as a new attempt (a row of its own; the earlier
            ones stay), the rollouts whose latest attempt is an error, or only those of
            ``retry_error_types`` when given. The summary says how many were retried and recovered.
        retry_error_types: Error types (the rows' ``error_type``, e.g. ``["ProviderError"]``) that
            ``retry_errors`` runs again; they replace ``config.retry_error_types`` (which errors retry
            within this run, up to ``max_rollout_attempts``). None: every error type; ``[]`` is refused.

    Returns:
        ``EvalSummary``: per environment the mean reward with standard error, pass@k for
        every k up to ``rollouts_per_task``, counts of truncated, timed-out, skipped and
        errored rollouts, total tokens, the model and each reward component's mean; the most
        frequent errors; and the wall time. Also logged in this flow run and published as a
        table artifact ``eval-summary-<series>``. When more than ``config.max_error_fraction`` of the
        rollouts errored (or some have no row), a Failed state whose message says so, e.g.
        ``6 of 6 rollouts errored (ProviderError: ...)``, holding an ``EvalFailedError`` with
        the summary: awaiting the flow without ``return_state=True`` raises it. When ``token_budget`` or
        ``cost_budget_usd`` stopped the run with rollouts not done, a Failed state named ``BudgetReached``
        whose message gives the spend and the budget, holding a ``BudgetReachedError`` (``flows/services/budget.py``);
        a ``resume`` with a larger budget finishes the run. Another live eval of
        the run fails this one with a ``RunInUseError`` naming it (``flows/services/run_lock.py``).
    """
    named = resume or run_id
    run_id = named or new_run_id(config)
    check_run_id(run_id)   # before the lock, which is named after it
    async with hold_run(run_id):   # one eval per run id at a time
        return await _evaluate(config, resume, run_id, named, force_config, retry_errors, retry_error_types)


async def _evaluate(config: EvalConfig, resume: str | None, run_id: str, named: str | None, force_config: bool,
                    retry_errors: bool, retry_error_types: list[str] | None) -> EvalSummary | State[EvalSummary]:
    """prepare -> run -> summarise -> publish."""
    started = time.perf_counter()
    root = await resolve_trace_root(config.traces.store) if config.traces.store else config.traces.dataset_root()
    prepared = prepare_eval(config, run_id=run_id, resume=resume is not None, force=force_config, root=root,
                            retry_errors=retry_errors, retry_error_types=retry_error_types)
    config, plan, todo = prepared.config, prepared.plan, prepared.todo
    series = await series_name(config)
    await tag_flow_run(series_tag(series), name=None if named else run_id)   # one call: tags, the generated id
    baseline = await resolve_baseline(config, root, series, run_id)
    get_run_logger().info("%s", prepared.describe())
    if (retry_line := prepared.retry_line()) is not None:   # what --retry-errors matched (the CLI prints it)
        get_run_logger().info("%s", retry_line)
        if (listener := preparation_listener.get()) is not None:
            listener(retry_line)
    if config.dispatch.work_pool:
        budget = await seed_shared_budget(config, root, run_id)
        failures = await run_on_work_pool(config, root, run_id, [planned.planned_key for planned in todo],
                                          total=len(plan), budget=budget)
    else:   # the spend in memory, mirrored to the run's counters so a killed eval's survives (flows/services/budget.py)
        async with get_client() as client:
            budget = await seed_shared_budget(config, root, run_id, client, local=True)
            failures = await execute(config, root, run_id, todo, total=len(plan), durable=prepared.durable,
                                     progress_key=progress_key(run_id), budget=budget)
    await asyncio.to_thread(compact, root, run_id, len(plan))
    summary = summarize_run(root, run_id, rollouts_per_task=config.rollouts_per_task,
                            pass_threshold=config.pass_threshold, wall_time_s=round(time.perf_counter() - started, 3))
    summary.flow_run_id = str(flow_run.id)
    stopped = await budget_stop(config, root, run_id, [planned.key for planned in plan], budget,
                                {planned.key: planned.attempt for planned in todo})
    if stopped is not None:   # the rollouts without a row are the ones the budget did not start
        summary.budget_stop, summary.budget_not_done, failures = stopped.message, stopped.not_done, []
    failure = run_failure(summary, len(plan), config.max_error_fraction)
    completed = failure is None and not failures and stopped is None
    compared = await finish_with_baseline(summary, baseline, config, root, series, completed=completed, ran=bool(todo))
    await publish_summary(summary, series, root, compared)
    if stopped is not None:
        return budget_state(stopped.message, summary, stopped.spent)  # type: ignore[return-value]  # holds its error
    if failures:
        raise RuntimeError(f"{len(plan) - summary.rollouts} of {len(plan)} rollouts have no row ({failures[0]}); "
                           f"resume with --resume {run_id}{_cut_off(summary.errored, config.max_rollout_attempts)}"
                           ) from failures[0]
    return summary if failure is None else Failed(message=failure, data=EvalFailedError(failure, summary))


def _cut_off(errored: int, max_attempts: int) -> str:
    """With in-run retries (``max_rollout_attempts`` past 1) the crash may have cut off the retry of errored
    rollouts (their next attempt has no row, and a plain resume runs only the rollouts without one): how to
    run them again. Without in-run retries a plain resume finishes what the crash left."""
    if not errored or max_attempts <= 1:
        return ""
    return (f" --retry-errors ({errored} rollouts errored, and the crash may have cut off their next attempt: "
            "--retry-errors runs them again as new attempts)")


def compact(root: DatasetRoot, run_id: str, rollouts: int) -> None:
    """One file per table and day instead of one per flush, when the run has many small files
    (``COMPACT_MIN_FILES``, ``COMPACT_ROWS_PER_FILE``); the rows are durable either way, so a failure is a warning."""
    logger = get_run_logger()
    try:
        compacted = compact_run(root, run_id, min_files=max(COMPACT_MIN_FILES, rollouts // COMPACT_ROWS_PER_FILE))
    except TraceStoreError as exc:
        logger.warning("run %s: could not compact its files (%s); its rows stay as they were", run_id, exc)
        return
    if compacted.files_after != compacted.files_before:
        logger.info("run %s: files per table %s, compacted to %s", run_id, compacted.files_before,
                    compacted.files_after)


async def publish_summary(summary: EvalSummary, series: str, root: DatasetRoot, comparison: str | None) -> None:
    """Log the summary in the eval flow run and publish it as the series' table artifact (``eval-summary-<series>``)."""
    artifacts = [summary_key(series), *([comparison] if comparison else [])]
    models = ", ".join(sorted({env.model for env in summary.environments if env.model}))
    get_run_logger().info("%s\nsummary artifact: %s", summary.text(), "; comparison artifact: ".join(artifacts))
    spend = summary.spend
    spent = "" if spend is None else f"; {spend.text().splitlines()[0]}"
    stop = f"; budget reached: {summary.budget_stop}" if summary.budget_stop else ""
    retried = f", {summary.retried} retried, {summary.recovered} recovered" if summary.retried else ""
    await acreate_table_artifact(table=summary.table(), key=artifacts[0], description=(
        f"Summary of run {summary.run_id} ({summary.rollouts} rollouts of {models or 'no model'}{retried}, "
        f"traces in {root})" + spent + stop + f". Read its rollouts: `{view_command(str(root), summary.run_id)}`"))
    if spend is not None and spend.tasks:   # the costliest tasks and rollouts, every attempt counted
        await acreate_table_artifact(table=spend.table(), key=spend_key(series), description=(
            f"Spend of run {summary.run_id}: {spend.text().splitlines()[0].removeprefix('spend: ')}; its costliest "
            f"tasks (rollout_index empty) and rollouts"))


async def run_eval(config: EvalConfig, resume: str | None = None, run_id: str | None = None,
                   force_config: bool = False, retry_errors: bool = False,
                   retry_error_types: list[str] | None = None) -> tuple[EvalSummary, str | None]:
    """Run ``eval_flow`` and return its summary with the reason the run failed (None when it succeeded).

    Returns:
        ``(summary, failure)``: ``failure`` is the Failed eval flow run's message, e.g. ``"6 of 6
        rollouts errored (ProviderError: ...)"`` (see ``traces.run_failure``).

    Raises:
        Exception: what stopped the eval flow run before it could summarise (an API outage past
            its limit, an unwritable dataset, rollouts without a row).
    """
    with SyncClientContext.get_or_create():   # one sync API client for the engine's calls, not one per call
        final = await eval_flow(config, resume=resume, run_id=run_id, force_config=force_config,
                                retry_errors=retry_errors, retry_error_types=retry_error_types, return_state=True)
    result = await final.aresult(raise_on_failure=False)
    if isinstance(result, EvalFailedError):
        return result.summary, str(result)
    if isinstance(result, BaseException):
        raise result
    if not isinstance(result, EvalSummary):
        raise RuntimeError(f"the eval flow run ended {final.name} without a summary: {final.message}")
    return result, None
