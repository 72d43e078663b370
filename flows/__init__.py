"""The Prefect layer's flows and what only Prefect does for an eval.

Flows: ``eval.py`` (``eval_flow``: prepare -> run -> summarise -> publish, the eval itself being
``prefect_rollouts.evals``), ``rollout.py`` (``rollout_flow``: one rollout = one flow run),
``shard.py`` (a shard of an eval on a work-pool worker), ``execute.py`` (the runners of the flow, task
and batch granularities handed to the eval engine), ``launch.py`` (the UI's launch form),
``janitor.py`` (sandboxes and flow runs whose owner died), ``deployments.py`` (the deployments
``prefect-rollouts serve`` serves). These module paths are what Prefect stores
in deployments (``deployments/prefect.yaml``, ``shard.ENTRYPOINT``): they stay where they are.

``services/``: the Prefect-only pieces the flows use (dispatch to a work pool, outage watch, run lock,
concurrency limits, baseline, alerts, ...), none of them a flow.

May import Prefect and the core (``evals`` included), never the CLI (``tests/test_layout.py``).
The core loads ``rollout.py`` by name (``agent.PREFECT_LAYER``, only when ``orchestrator = "prefect"``), so importing
``prefect_rollouts`` never loads Prefect.
"""
