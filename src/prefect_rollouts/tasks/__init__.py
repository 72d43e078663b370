"""Prefect task wrappers of the lifecycle stages: retries, deadlines surfaced as TimedOut, retry conditions.

Contract: each task is a thin wrapper of a function in ``prefect_rollouts.stages`` (behaviour
lives there); ``TaskOrchestrator`` runs a rollout's stages as task runs. Results are never
persisted or cached: stage state stays in the flow's process and is passed with ``quote()``.
May import Prefect and the core; must not import ``flows``.
"""

from prefect_rollouts.tasks.stages import TaskOrchestrator

__all__ = ["TaskOrchestrator"]
