"""An eval's plan: every rollout it runs, as (environment, task, rollout index). Must not import Prefect.

A rollout is identified across processes and machines by its key ``(environment, task id, rollout
index)``: the rows' ``environment``, ``task_id`` and ``rollout_index``. An eval of one taskset has
one environment, named after the taskset id; a suite (``[[env.tasksets]]``) has one per entry.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from prefect_rollouts.bounds import MAX_ROLLOUTS
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.taskset import EnvironmentSpec
from prefect_rollouts.environments import find_task, load_taskset
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.retry_rule import AGENT_FAILURE_STOPS, retries
from prefect_rollouts.task import Task
from prefect_rollouts.traces.read import LatestAttempt

RolloutKey = tuple[str, str, int]
"""``(environment, task id, rollout index)``: a rollout of a run, wherever it ran."""
PlannedKey = tuple[str, str, int, int]
"""``(environment, task id, rollout index, attempt)``: a rollout and the attempt its plan runs (a shard's keys)."""


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

    @property
    def planned_key(self) -> PlannedKey:
        return (self.environment.name, self.task.id, self.index, self.attempt)


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


def still_to_run(plan: list[Planned], latest: Mapping[RolloutKey, LatestAttempt],
                 again: Callable[[LatestAttempt], bool] | None = None) -> list[Planned]:
    """The rollouts of ``plan`` that are not done, each as its next attempt (``next_attempt``). Done
    rollouts are left out.

    Args:
        latest: Each written rollout's latest attempt (``traces.read.latest_attempts``).
        again: Which done latest attempts run again all the same (an error ``--retry-errors`` or
            ``max_rollout_attempts`` retries: ``retry_predicate``); None: none.
    """
    todo = []
    for planned in plan:
        attempt = next_attempt(planned.attempt, latest.get(planned.key), again)
        if attempt is not None:
            todo.append(planned if attempt == planned.attempt else replace(planned, attempt=attempt))
    return todo


def next_attempt(planned: int, written: LatestAttempt | None,
                 again: Callable[[LatestAttempt], bool] | None = None) -> int | None:
    """The attempt of a rollout to run next, or None when it is done.

    ``planned`` is the attempt its plan gave it (1 in a new plan; a shard is handed the attempt the eval
    planned, so a re-submitted shard never runs an attempt twice): it runs when it is not written yet
    (no row, or the latest is older). A written one runs again, as one past the latest, when the latest
    was stopped from outside (``LatestAttempt.done`` is False: a budget stop) or ``again`` takes it.
    """
    if written is None or written.attempt < planned:
        return planned
    if not written.done or (again is not None and again(written)):
        return written.attempt + 1
    return None


def retry_predicate(config: EvalConfig, retry_errors: bool = False,
                    error_types: Collection[str] | None = None) -> Callable[[LatestAttempt], bool]:
    """Which written latest attempts of a run run again: the in-run retries a stopped eval left
    (``retry_rule.retries`` with ``config.retry_error_types``, while the attempt is below
    ``config.max_rollout_attempts``) and, with ``retry_errors`` (``--retry-errors``), every errored one,
    or only those of ``error_types`` when given. An attempt the agent itself failed never runs again."""
    in_run = None if config.retry_error_types is None else frozenset(config.retry_error_types)
    chosen = None if error_types is None else frozenset(error_types)

    def again(written: LatestAttempt) -> bool:
        if written.error_type is None or written.stop_condition in AGENT_FAILURE_STOPS:
            return False
        if retry_errors and (chosen is None or written.error_type in chosen):
            return True
        return written.attempt < config.max_rollout_attempts and retries(written.error_type,
                                                                         written.stop_condition, in_run)
    return again
