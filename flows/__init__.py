"""The Prefect layer's flows and what only Prefect does for an eval.

Flows: ``eval.py`` (``eval_flow``: prepare -> run -> summarise -> publish, the eval itself being
``prefect_rollouts.evals``), ``rollout.py`` (``rollout_flow``: one rollout = one flow run),
``shard.py`` (a shard of an eval on a work-pool worker), ``launch.py`` (the UI's launch form),
``janitor.py`` (sandboxes and flow runs whose owner died), ``deployments.py``.

Prefect-only pieces, a module each: ``execute.py`` (the runners of the flow, task and batch
granularities handed to the eval engine), ``dispatch.py`` and ``work_pool.py`` (shards on a work
pool), ``outage.py`` (riding out an API outage), ``reconcile.py`` (states an outage left unwritten),
``concurrency.py`` (``[limits]`` as global concurrency limits), ``run_lock.py`` (one eval per run id),
``ownership.py`` (owner tags and sandbox labels), ``baseline.py`` (the series' Variable, the
comparison artifact, the events), ``alerts.py`` (the automation), ``keys.py`` (artifact and
Variable names).

May import Prefect and the core (``evals`` included), never the CLI (``tests/test_layout.py``).
The core imports this package lazily (only when ``orchestrator = "prefect"``), so importing
``prefect_rollouts`` never loads Prefect.
"""
