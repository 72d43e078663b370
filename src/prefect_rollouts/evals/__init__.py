"""The eval, without Prefect: everything between an eval config and its rows in the trace dataset.

- ``prepare.py``: ``load_eval`` (TOML + ``--set``, or a run's stored config) and ``prepare_eval``
  (every check, the run's identity, the plan) — the CLI's dry run and the eval flow's start.
- ``identity.py``: what a run is, its stored config and what ``--resume`` may change.
- ``plan.py``: the rollouts of an eval as ``(environment, task, rollout index)``; rebuilt from keys
  in another process (a shard).
- ``prepare_tasks.py``: ``Task.prepare`` for each task before its rollouts (e.g. Harbor images).
- ``engine.py``: the rollouts of a run, a bounded number at once, rows flushed to Parquet; the
  granularity is an injected runner (``inline_runner`` here; flow, task and batch runs in ``flows/``).
- ``baseline.py``: verdicts against a baseline run, event payloads, whether the baseline moves.
- ``launch_form.py``, ``launch_tasksets.py``: ``LaunchForm``, an eval as a person fills it in from the Prefect UI (the
  ``launch`` flow's parameter), and its ``EvalConfig``.

Summaries and comparisons of runs are ``traces/``. May import the core (agent, config, tasksets,
traces); never Prefect, the Prefect layer (``flows``, ``tasks``, ``blocks``) or the CLI
(``tests/test_layout.py`` checks it).
"""
