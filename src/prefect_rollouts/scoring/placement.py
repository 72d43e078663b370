"""Scoring placement: in the agent's runtime (shared) or in a fresh one (isolated).

Isolated scoring follows the seed: the task's collected artifacts are restored into a fresh
runtime (``scoring.runtime``, else the agent's runtime config) and the task's metrics and
rewards run there. Artifacts ``["."]`` (the whole workspace, as a Harbor task's ``separate``
verifier declares) replace the fresh workspace: files the agent deleted or renamed are gone there
too. Judges run after them in the orchestrating process in both modes. The
rollout's ``scoring`` stage policy retries a retryable infrastructure error with another call
(another fresh runtime), reusing the same submission; nothing is sent to the model again.
"""

from __future__ import annotations

from typing import Any

from prefect_rollouts.config.agent import RuntimeConfig, ScoringConfig
from prefect_rollouts.config.env import resolve_env
from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes import make_runtime
from prefect_rollouts.runtimes.egress.proxy import EgressProxy, take_network_log
from prefect_rollouts.scoring.judges import JudgeClients, run_judges
from prefect_rollouts.scoring.rewards import run_scoring_functions
from prefect_rollouts.task import Task
from prefect_rollouts.trace import Trace
from prefect_rollouts.unwind import run_to_end


async def score_shared(task: Task, trace: Trace, runtime: Any, scoring: ScoringConfig,
                       judges: JudgeClients | None = None) -> None:
    """Run the task's scoring functions in the agent's runtime with ``scoring.env`` and
    ``scoring.network``, then ``scoring.judges`` (clients from ``judges``).

    Raises:
        ScoringEnvError: a ``${VAR}`` in ``scoring.env`` is unset without default.
        TaskError: a scoring function failed (``JudgeError``: a judge failed).
    """
    env = resolve_env(scoring.env)
    view = await runtime.scoped(env=env, network=scoring.network) if runtime is not None else None
    await run_scoring_functions(task, trace, view)
    await run_judges(scoring.judges, task, trace, judges)


async def score_isolated(task: Task, trace: Trace, artifacts: bytes, scoring: ScoringConfig,
                         agent_runtime: RuntimeConfig, labels: dict[str, str] | None = None,
                         judges: JudgeClients | None = None, egress: EgressProxy | None = None) -> None:
    """Restore ``artifacts`` into a fresh runtime and run the task's scoring functions there (one
    attempt); then ``scoring.judges``, which need no runtime.

    The caller retries per ``scoring.retries`` on a retryable ``InfrastructureError``; each
    call starts its own runtime and stops it on every path. ``trace.info["scoring_attempts"]``
    counts the calls.

    Args:
        task: The task whose ``@metric``/``@reward`` functions run.
        trace: The finished trace; rewards and metrics are recorded on it.
        artifacts: Tar archive from ``Runtime.collect_artifacts`` (the finished submission).
        scoring: Effective scoring config: ``runtime`` (None = ``agent_runtime``), ``env``
            (templated), ``network``.
        agent_runtime: The agent's runtime config.
        labels: Labels for the scoring runtime.
        judges: Judge clients shared across rollouts (None: opened for this call).
        egress: The agent's egress proxy (a ``{ allow, block }`` scoring network); the runtime's
            network records go onto ``trace.network``.

    Raises:
        ScoringEnvError: a ``${VAR}`` is unset without default (not retryable).
        InfrastructureError: the scoring runtime failed to start or was lost.
        TaskError: a scoring function or judge failed (not retryable: the same code would fail again).
    """
    env = resolve_env(scoring.env)
    trace.info["scoring_attempts"] = trace.info.get("scoring_attempts", 0) + 1
    source = "[env.agent.scoring.runtime]" if scoring.runtime is not None else "[env.agent.runtime]"
    runtime = make_runtime(scoring.runtime or agent_runtime, network=scoring.network,
                           labels={**(labels or {}), "role": "scoring"}, source=source, egress=egress)
    try:
        await runtime.start()
        if "." in task.data.artifacts:   # the whole workspace: the agent's replaces the image's (deletions too)
            cleared = await runtime.exec("find . -mindepth 1 -delete", timeout=120)
            if cleared.exit_code != 0:
                raise RuntimeUnavailableError(f"cannot empty the scoring runtime's workspace before restoring the "
                                              f"agent's: {cleared.stderr.strip()[-300:]}")
        await runtime.restore_artifacts(artifacts)
        await run_scoring_functions(task, trace, await runtime.scoped(env=env))
    finally:
        await run_to_end(runtime.stop())
        take_network_log(runtime, trace)
    await run_judges(scoring.judges, task, trace, judges)
