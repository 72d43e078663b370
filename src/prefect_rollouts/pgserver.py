"""The old path of ``servers/postgres.py``, kept for ``tests/support/servers.py`` (not edited on the branch
that moved it): ``from prefect_rollouts import pgserver`` gets that module itself. Delete once nothing
imports this path."""

import sys

from prefect_rollouts.servers import postgres

sys.modules[__name__] = postgres
