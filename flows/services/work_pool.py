"""An eval's rollouts as shard flow runs on a work pool (``[dispatch] work_pool``), with its progress artifact.

The shards' submission, retries and crash detection are ``flows/services/dispatch.py``; this module turns the
durable rows it counts into the eval's progress artifact and ``progress_listener``.
"""

from __future__ import annotations

from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact

from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.evals.budget import Budget
from prefect_rollouts.evals.engine import progress_listener
from prefect_rollouts.evals.plan import PlannedKey
from prefect_rollouts.flows.services.dispatch import dispatch
from prefect_rollouts.flows.services.keys import progress_key
from prefect_rollouts.flows.services.ownership import tag_flow_run
from prefect_rollouts.traces.store import DatasetRoot


async def run_on_work_pool(config: EvalConfig, root: DatasetRoot, run_id: str, todo: list[PlannedKey], *,
                            total: int, budget: Budget | None = None) -> list[BaseException]:
    """``todo`` (each rollout with its planned attempt) as shard flow runs on ``[dispatch] work_pool``
    (``flows/services/dispatch.py``, which stops submitting once ``budget`` is reached); progress from durable rows.
    Returns one error per rollout left without a row."""
    await tag_flow_run()
    progress_id = await acreate_progress_artifact(progress=100.0 * (total - len(todo)) / max(total, 1),
                                                  key=progress_key(run_id),
                                                  description=f"Durable rollouts of run {run_id}")
    reported = total - len(todo)

    async def on_progress(finished: int) -> None:
        nonlocal reported
        durable = total - len(todo) + finished
        if durable != reported:
            reported = durable
            await aupdate_progress_artifact(progress_id, progress=100.0 * durable / max(total, 1))
            if (listener := progress_listener.get()) is not None:
                listener(durable, total)

    report = await dispatch(config, root, run_id, todo, on_progress=on_progress, budget=budget)
    await on_progress(len(todo) - len(report.missing))
    error = RuntimeError(f"shards {[s.index for s in report.failed]} ended "
                         f"{[s.states for s in report.failed]} after {config.dispatch.shard_attempts} attempts")
    return [error] * len(report.missing)
