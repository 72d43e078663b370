"""What every test may use, registered as pytest plugins by ``tests/conftest.py``.

``tiers`` gives each test its tier (unit, prefect, system) and that tier's timeout; ``harness`` the
Prefect test harness for the prefect tier; ``servers`` PostgreSQL-backed Prefect servers; ``workers``
``prefect worker`` processes; ``waiting`` waits on what a test can observe; ``extras`` a missing
service or extra (a skip locally, a failure in CI); ``ports`` free loopback ports. Helpers a test
imports: ``cli`` a ``prefect-rollouts eval`` process, ``datasets`` the rows an eval made durable,
``docker`` the Docker runtime config, ``processes`` processes via psutil.
Nothing here imports Prefect at import time: the unit tier stays Prefect-free where it can.
"""
