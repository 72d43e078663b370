"""``harbor``: agentic tasks in Harbor's task format (a directory per task: instruction, config, tests).

``taskset.py`` loads task directories (``load``, the name ``harbor`` in the registry) and scores them;
``config.py`` reads ``task.toml`` with Harbor's schema; ``files.py`` keeps a task to its own directory;
``scripts.py`` runs ``solve.sh``/``test.sh`` as Harbor does; ``reward.py`` reads the reward file.
Must not import Prefect.
"""
