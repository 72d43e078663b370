"""Prefect flows: ``rollout_flow`` (one rollout = one flow run), ``eval_flow``, ``janitor_flow``.

Contract: flows compose the tasks of ``prefect_rollouts.tasks`` and hold no business logic.
The core imports this package lazily (only when ``orchestrator = "prefect"``), so importing
``prefect_rollouts`` never loads Prefect.
"""
