"""The Prefect stage runner: ``PrefectOrchestrator.run_stage`` runs a rollout's stage as a task run.

Contract: behaviour and policy live in the core (``rollout.py``, ``stages.py``); this package
only translates a ``StagePolicy`` into Prefect's task options. Results are never persisted or
cached: stage state stays in the flow's process and is passed with ``quote()``.
May import Prefect and the core; must not import ``flows``.
"""

from prefect_rollouts.tasks.stage_runner import PrefectOrchestrator

__all__ = ["PrefectOrchestrator"]
