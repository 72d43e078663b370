"""What only Prefect does for an eval, beside the flows that use it: none of these is a flow.

``dispatch.py``, ``work_pool.py`` and ``zombies.py`` (shards on a work pool, and those whose process died),
``outage.py`` (riding out an API outage),
``reconcile.py`` (states an outage left unwritten), ``concurrency.py`` (``[limits]`` as global
concurrency limits), ``budget.py`` (the spend budget's shared counter), ``run_lock.py`` (one eval per
run id), ``ownership.py`` (owner tags and sandbox labels), ``baseline.py`` (the series' Variable, the
comparison artifact, the events), ``alerts.py`` (the automation), ``keys.py`` (artifact and Variable
names). May import Prefect, the core and the flow a service acts on (``dispatch`` deploys ``shard_flow``;
``outage`` and ``reconcile`` write ``rollout_flow``'s runs); never the CLI (``tests/test_layout.py``).
"""
