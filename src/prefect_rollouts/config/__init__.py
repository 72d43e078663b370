"""Config: every key a user writes, in TOML, ``--set``, a stored run or the UI's launch form.

- ``agent.py``: ``AgentConfig`` (``[env.agent]``: model, client, harness, runtime, scoring, retries,
  timeouts) and ``load_config``.
- ``base.py``: the strict base model, clients, sampling, env tables, the wording of errors.
- ``judge.py``: judges (``[[env.agent.scoring.judges]]``).
- ``taskset.py``: tasksets and a suite's entries; names that become dataset directories.
- ``eval.py``: ``EvalConfig`` (the whole eval) and ``load_eval_config``; ``eval_tables.py`` its
  ``[traces]``, ``[dispatch]`` and ``[limits]`` tables.
- ``sources.py``: where keys come from and which wins (``Source``, ``merge``): TOML, a stored
  run's config, ``--set``, the launch form, in that order.
- ``redact.py``: what of a config is a secret, and the config without it.
- ``env.py``: ``${VAR}`` and ``${VAR:-default}`` in env tables, resolved from the host environment
  (the one resolver: config checks, the runtimes and scoring call it).

Modules import each other directly (``config.agent``, ``config.eval``...); this package file
imports nothing, so a module that needs one config model loads only that. Config is the bottom of the
core: it imports only ``errors``, ``bounds``, ``keys``, ``nesting``, ``retry_rule`` and the dataset store,
never ``scoring``, ``runtimes`` or ``model``. Must not import Prefect.
"""
