"""``eval_flow``: a whole evaluation as one Prefect flow run that streams traces into Parquet.

The eval plans its rollouts (tasks x rollouts per task), runs them in this process through
``flows/execute.py`` (bounded concurrency, at the chosen granularity), and summarises the run from
the dataset. Re-running with ``resume=<run id>`` runs only the rollouts of that run that have no
durable row.

The eval flow run ends Completed when every rollout has a row and at most ``max_error_fraction``
of them errored, else Failed with the reason (``traces.run_failure``), holding an
``EvalFailedError`` with the summary. A rollout that errored is a Failed rollout flow run,
``rollout`` task run (``task`` granularity) or ``batch`` task run holding it (``batch``); its row
is written all the same (``flows/execute.py``).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_table_artifact
from prefect.runtime import flow_run
from prefect.states import Failed, State

from prefect_rollouts.blocks import resolve_trace_path
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.errors import EvalFailedError
from prefect_rollouts.eval_config import EvalConfig
from prefect_rollouts.flows.execute import artifact_key, execute, progress_listener
from prefect_rollouts.traces import EvalSummary, durable_keys, run_failure, summarize_run

__all__ = ["eval_flow", "new_run_id", "progress_listener", "run_eval"]


def _flow_run_name() -> str:
    parameters = flow_run.parameters
    config = parameters.get("config")
    run_name = getattr(config, "run_name", None) or (config.get("run_name") if isinstance(config, dict) else None)
    taskset = getattr(getattr(getattr(config, "env", None), "taskset", None), "id", None)
    return parameters.get("resume") or parameters.get("run_id") or run_name or taskset or "eval"


@flow(name="eval", flow_run_name=_flow_run_name, persist_result=False, log_prints=False)
async def eval_flow(config: EvalConfig, resume: str | None = None,
                    run_id: str | None = None) -> EvalSummary | State[EvalSummary]:
    """Evaluate an agent on a taskset and write every rollout to the Parquet trace dataset.

    Args:
        config: The eval: taskset (``env.taskset``), agent (``env.agent``), ``num_tasks``,
            ``rollouts_per_task``, ``max_concurrent``, ``rollout_granularity`` and ``traces``.
        resume: Run id of an earlier run to continue: only its rollouts without a durable
            row run, and the summary covers the whole run.
        run_id: Id for a new run; default ``<run_name or taskset id>-<UTC time>-<4 hex>``.

    Returns:
        ``EvalSummary``: per environment the mean reward with standard error, pass@k for
        every k up to ``rollouts_per_task``, counts of truncated, timed-out, skipped and
        errored rollouts, total tokens; the most frequent errors; and the wall time. Also
        published as a table artifact. When more than ``config.max_error_fraction`` of the
        rollouts errored (or some have no row), a Failed state whose message says so, e.g.
        ``6 of 6 rollouts errored (ProviderError: ...)``, holding an ``EvalFailedError`` with
        the summary: awaiting the flow without ``return_state=True`` raises it.
    """
    logger = get_run_logger()
    started = time.perf_counter()
    root = await resolve_trace_path(config.traces.store) if config.traces.store else (config.traces.path or "./traces")
    run_id = resume or run_id or new_run_id(config)
    tasks = load_taskset(config.env.taskset.id, config.env.taskset.options, config.num_tasks)
    plan = [(task_, index) for task_ in tasks for index in range(config.rollouts_per_task)]
    durable = durable_keys(root, run_id) if resume else set()
    todo = [(task_, index) for task_, index in plan if (task_.id, index) not in durable]
    logger.info("run %s: %d rollouts (%d tasks x %d), %d to run, traces in %s", run_id, len(plan), len(tasks),
                config.rollouts_per_task, len(todo), root)
    failures = await execute(config, root, run_id, todo, total=len(plan), durable=durable,
                             progress_key=artifact_key(run_id, "progress"))
    summary = summarize_run(root, run_id, rollouts_per_task=config.rollouts_per_task,
                            pass_threshold=config.pass_threshold, wall_time_s=round(time.perf_counter() - started, 3))
    await acreate_table_artifact(table=summary.table(), key=artifact_key(run_id, "summary"),
                                 description=f"Summary of run {run_id} ({summary.rollouts} rollouts, traces in {root})")
    if failures:
        raise RuntimeError(f"{len(failures)} rollouts failed to run and have no row; "
                           f"resume with --resume {run_id}") from failures[0]
    failure = run_failure(summary, len(plan), config.max_error_fraction)
    return summary if failure is None else Failed(message=failure, data=EvalFailedError(failure, summary))


async def run_eval(config: EvalConfig, resume: str | None = None,
                   run_id: str | None = None) -> tuple[EvalSummary, str | None]:
    """Run ``eval_flow`` and return its summary with the reason the run failed (None when it succeeded).

    Returns:
        ``(summary, failure)``: ``failure`` is the Failed eval flow run's message, e.g. ``"6 of 6
        rollouts errored (ProviderError: ...)"`` (see ``traces.run_failure``).

    Raises:
        Exception: what stopped the eval flow run before it could summarise (an API outage past
            its limit, an unwritable dataset, rollouts without a row).
    """
    final = await eval_flow(config, resume=resume, run_id=run_id, return_state=True)
    result = await final.aresult(raise_on_failure=False)
    if isinstance(result, EvalFailedError):
        return result.summary, str(result)
    if isinstance(result, BaseException):
        raise result
    if not isinstance(result, EvalSummary):
        raise RuntimeError(f"the eval flow run ended {final.name} without a summary: {final.message}")
    return result, None


def new_run_id(config: EvalConfig) -> str:
    """``<run_name or taskset id>-<UTC time>-<4 hex>``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{config.run_name or config.env.taskset.id}-{stamp}-{uuid.uuid4().hex[:4]}"

