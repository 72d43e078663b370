"""The Prefect stage runner: each stage of a rollout is one task run of the current flow run.

``PrefectOrchestrator.run_stage(name, fn, policy)`` runs ``fn`` as a task run named ``name``
(``segment-<n>``, ``finalize``, ``skip-check``, ``scoring``; setup and teardown run in the flow
run's body, see ``IN_FLOW_BODY``) with
Prefect's own ``retries``, ``retry_delay_seconds`` (the policy's exponential delays, capped by
its ``max_backoff_s``), ``retry_jitter_factor`` and a retry condition from the same policy the
inline runner honours. The stage is a closure over the rollout's live state, passed with
``quote()``; its result is neither persisted nor cached. A stage that raises leaves a Failed
(or, for its deadline, TimedOut) task run, and the exception reaches the ``Rollout``, which
records it on the trace.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.states import State
from prefect.utilities.annotations import quote

from prefect_rollouts.rollout import InlineOrchestrator, StagePolicy

T = TypeVar("T")


@task(name="stage", persist_result=False, cache_policy=NO_CACHE, log_prints=False)
async def _stage_task(fn: Callable[[], Awaitable[Any]]) -> Any:
    """One stage of a rollout (its name is the task run's name)."""
    return await fn()


@functools.lru_cache(maxsize=512)
def _stage_for(name: str, policy: StagePolicy) -> Task[..., Any]:
    """The stage task with ``name`` and ``policy``'s retries (built once per distinct pair)."""
    stage_name = name.split("-")[0] if name.startswith("segment-") else name

    def retry_condition(task_: Task[..., Any], run: Any, state: State[Any]) -> bool:
        exc = state.data if isinstance(state.data, BaseException) else None
        return exc is not None and policy.should_retry(exc)

    return _stage_task.with_options(
        name=stage_name, task_run_name=name, retries=policy.retries,
        retry_delay_seconds=policy.delays_s() or 0, retry_jitter_factor=policy.jitter,
        retry_condition_fn=retry_condition if policy.retries else None)


IN_FLOW_BODY = frozenset({"setup", "teardown"})
"""Stages that run in the flow run's body (with the same policy, retried inline) instead of as task
runs of their own. The design names segments, finalize, skip-check and scoring as task runs;
setup and teardown may move. Each task run costs the Prefect server CPU (its events, recorder
and persister work): four task runs per rollout instead of six gave about a quarter more
rollouts per second for a quarter less server CPU (``benchmarks/overhead.py``; benchmarks/README.md,
"Setup and teardown in the flow body")."""


class PrefectOrchestrator:
    """Runs each stage as a task run of the current flow run, except ``IN_FLOW_BODY`` (see above)."""

    async def run_stage(self, name: str, fn: Callable[[], Awaitable[T]], policy: StagePolicy) -> T:
        """See ``rollout.Orchestrator.run_stage``."""
        if name in IN_FLOW_BODY:
            return await InlineOrchestrator().run_stage(name, fn, policy)
        return await _stage_for(name, policy)(quote(fn))
