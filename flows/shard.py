"""``shard_flow``: a shard of an eval's rollouts, run by a Prefect worker on any machine.

The eval flow (``flows/services/dispatch.py``) submits each shard as a flow run of the ``shard`` deployment
on a work pool. Its parameters are plain data: the run id, the eval config (no secrets: keys come
from environment variables or blocks where the shard runs), the dataset root and the shard's
``(environment, task id, rollout index)`` keys. The worker's process rebuilds the agent and the tasks from
them (``plan.rebuild`` refuses a task id the taskset lacks on this machine), runs the rollouts that
have no durable row at the eval's granularity (with ``flow``, each rollout is a ``rollout``
subflow of the shard's flow run) and writes its own files into the run's dataset. An eval's budget
is shared by every shard through the run's counters (``flows/services/budget.py``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from prefect_rollouts.blocks import resolve_trace_root
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.evals.plan import next_attempt, rebuild, retry_predicate, still_to_run
from prefect_rollouts.flows.execute import execute
from prefect_rollouts.flows.services.budget import open_shared_budget
from prefect_rollouts.traces import dataset_root
from prefect_rollouts.traces.read import latest_attempts

ENTRYPOINT = "prefect_rollouts.flows.shard:shard_flow"
"""The deployment's entrypoint: a module path, so a worker needs the package installed and no code storage."""


def _shard_run_name() -> str:
    parameters = flow_run.parameters
    attempt = parameters.get("attempt", 1)
    return (f"{parameters.get('run_id', 'eval')} · shard {parameters.get('shard_index', 0)}"
            + (f" · attempt {attempt}" if attempt > 1 else ""))


@flow(name="shard", flow_run_name=_shard_run_name, persist_result=False, log_prints=False)
async def shard_flow(run_id: str, config: EvalConfig, root: str,
                     rollouts: list[tuple[str, str, int, int] | tuple[str, str, int]],
                     shard_index: int = 0, attempt: int = 1) -> int:
    """Run one shard of eval ``run_id``: the rollouts of ``rollouts`` that still need an attempt
    (``plan.next_attempt``): the attempt the eval planned when it is not written yet, else the next one
    when the latest was stopped from outside (a budget stop) or is an error the run's retries take
    (``max_rollout_attempts``). A re-submitted shard so never runs an attempt twice.

    Args:
        run_id: The eval run (a partition of the dataset).
        config: The eval's config; its agent and tasksets rebuild the rollouts here.
        root: The dataset root every shard writes to: a path all workers share, or an object
            store URI (credentials from the worker's environment). With ``[traces] store`` the
            shard resolves that ``TraceStore`` block itself (its credentials stay in the block).
        rollouts: ``[environment, task id, rollout index, attempt]`` of each rollout of this shard: the
            attempt the eval planned for it (1, or one past an errored attempt ``--retry-errors`` runs
            again); without it, 1.
        shard_index: Position of the shard in the eval's plan (names the flow run).
        attempt: Which submission of this shard's rollouts this is, from 1 (names the flow run); not a
            rollout's attempt.

    Returns:
        How many rollouts this flow run ran (0 when every row was durable already).

    Raises:
        ConfigError: the taskset has no task with one of the ids on this machine (it differs
            from where the eval was planned); no rollout runs, so no row is wrong.
        RuntimeError: rollouts that could not run and have no row (the eval re-submits them).
    """
    dataset = await resolve_trace_root(config.traces.store) if config.traces.store else dataset_root(root)
    latest = latest_attempts(dataset, run_id)
    again = retry_predicate(config)
    planned = {(str(r[0]), str(r[1]), int(r[2])): int(r[3]) if len(r) > 3 else 1 for r in rollouts}
    keys = [key for key, first in planned.items() if next_attempt(first, latest.get(key), again) is not None]
    todo = still_to_run([replace(p, attempt=planned[p.key]) for p in rebuild(config, keys)], latest, again)
    durable = {key for key, written in latest.items() if written.done} - set(keys)
    get_run_logger().info("shard %d of run %s on %s (pid %d): %d rollouts, %d to run", shard_index, run_id,
                          socket.gethostname(), os.getpid(), len(rollouts), len(todo))
    async with open_shared_budget(config, run_id) as budget:
        failures = await execute(config, dataset, run_id, todo, total=len(rollouts), durable=durable,
                                 progress_key=None, shard_flow_run_id=str(flow_run.id), budget=budget)
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(todo)} rollouts of shard {shard_index} could not run and have "
                           "no row") from failures[0]
    return len(todo)
