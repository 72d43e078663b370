"""The Prefect servers the CLI and the tests start: ``postgres.py`` (PostgreSQL-backed, ``prefect-rollouts
server start|stop``, for scale-out) and ``temporary.py`` (a server whose life is the starting process's).

Core-side process management only: these modules run ``prefect server start`` as a subprocess and never
import Prefect; ``cli/`` and the tests use them.
"""
