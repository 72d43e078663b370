"""An eval's plan: every rollout it runs, as (environment, task, rollout index). Must not import Prefect.

A rollout is identified across processes and machines by its key ``(environment, task id, rollout
index)``: the rows' ``environment``, ``task_id`` and ``rollout_index``. An eval of one taskset has
one environment, named after the taskset id; a suite (``[[env.tasksets]]``) has one per entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from prefect_rollouts.bounds import MAX_ROLLOUTS
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.taskset import EnvironmentSpec
from prefect_rollouts.environments import find_task, load_taskset
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.task import Task
from prefect_rollouts.traces.read import LatestAttempt

RolloutKey = tuple[str, str, int]
"""``(environment, task id, rollout index)``: a rollout of a run, wherever it ran."""


@dataclass(frozen=True, eq=False, slots=True)
class Planned:
    """One rollout of the plan: its environment, task and rollout index, and which attempt of it runs
    (1 unless it has a row already: a retried error, a resume after a budget stop)."""

    environment: EnvironmentSpec
    task: Task
    index: int
    attempt: int = 1

    @property
    def key(self) -> RolloutKey:
        return (self.environment.name, self.task.id, self.index)


def plan_rollouts(config: EvalConfig) -> list[Planned]:
    """Every rollout of ``config``: per environment in config order, its first ``num_tasks`` tasks,
    each ``rollouts_per_task`` times (task-major).

    The plan is a list (the flows count, filter and shard it), bounded: the tasks are counted
    before their rollouts are made, and an eval of more than ``bounds.MAX_ROLLOUTS`` is refused
    (~100 bytes per planned rollout besides its task).

    Raises:
        ConfigError: a taskset fails to load (``load_taskset``); in a suite the message names the
            entry. Or the eval would have more than ``bounds.MAX_ROLLOUTS`` rollouts.
    """
    suite = config.env.tasksets is not None
    loaded = []
    for i, env in enumerate(config.environments()):
        try:
            tasks = load_taskset(env.taskset, env.options, env.num_tasks)
        except ConfigError as exc:
            if not suite:
                raise
            raise ConfigError(f"[[env.tasksets]] entry {i} ({env.name}): "
                              + str(exc).replace("[env.taskset] ", "", 1)) from None
        loaded.append((env, tasks))
    total = sum(len(tasks) for _, tasks in loaded) * config.rollouts_per_task
    if total > MAX_ROLLOUTS:
        counts = " + ".join(f"{len(tasks)}" for _, tasks in loaded)
        raise ConfigError(f"rollouts_per_task = {config.rollouts_per_task}: ({counts} tasks) x "
                          f"{config.rollouts_per_task} = {total:,} rollouts, more than one eval may run "
                          f"({MAX_ROLLOUTS:,}). Lower num_tasks or rollouts_per_task, or split the work into "
                          "several runs")
    return [Planned(env, task, index) for env, tasks in loaded for task in tasks
            for index in range(config.rollouts_per_task)]


def rebuild(config: EvalConfig, keys: list[RolloutKey]) -> list[Planned]:
    """The rollouts of ``keys`` rebuilt from ``config`` in this process (a shard on a worker).

    Raises:
        ConfigError: a key names an environment the config lacks, or a task its taskset does not
            have here (the taskset differs on this machine: no wrong row is written).
    """
    environments = {env.name: env for env in config.environments()}
    planned = []
    for name, task_id, index in keys:
        env = environments.get(name)
        if env is None:
            raise ConfigError(f"environment {name!r}: not in this eval's config ({', '.join(environments)})")
        planned.append(Planned(env, find_task(env.taskset, env.options, task_id), index))
    return planned


def still_to_run(plan: list[Planned], latest: Mapping[RolloutKey, LatestAttempt]) -> list[Planned]:
    """The rollouts of ``plan`` that are not done, each as its next attempt: attempt 1 when it has no row
    (not in ``latest``), one past its latest attempt when that was stopped from outside (a budget stop:
    ``LatestAttempt.done`` is False). Done rollouts are left out.

    Args:
        latest: Each written rollout's latest attempt (``traces.read.latest_attempts``).
    """
    return [replace(planned, attempt=latest[planned.key].attempt + 1) if planned.key in latest else planned
            for planned in plan if planned.key not in latest or not latest[planned.key].done]
