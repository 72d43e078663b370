"""PostgreSQL-backed Prefect servers (``servers/postgres.py``) for the system tier: the directories such servers
live in (removed after, also when a test fails), a server on free ports, one that this process's
Prefect settings point at, and the module-scoped fixtures ``pg_server`` and ``pg_api``."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port

SESSION_DIR = Path(tempfile.gettempdir()) / f"prefect-rollouts-tests-{os.getpid()}"
"""Parent of every server home of this test session (a PostgreSQL cluster is 49-95 MB); the
session's end removes it and fails if a home was left in it (``_no_server_home_left`` below)."""


@contextlib.contextmanager
def server_home(prefix: str) -> Iterator[Path]:
    """A fresh directory for ``pgserver.start`` under ``SESSION_DIR``, which PostgreSQL's user can
    enter; afterwards, also when the test failed, its servers are stopped and it is removed."""
    SESSION_DIR.mkdir(mode=0o755, exist_ok=True)
    SESSION_DIR.chmod(0o755)
    home = Path(tempfile.mkdtemp(prefix=prefix, dir=SESSION_DIR))
    home.chmod(0o755)   # postgres runs as its own user and must enter it
    try:
        yield home
    finally:
        try:
            from prefect_rollouts.servers import postgres as pgserver

            pgserver.stop(home)
        finally:
            shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def pg_server_running(prefix: str = "pg-") -> Iterator[str]:
    """Start a Prefect server on PostgreSQL (both on free ports) in a fresh server home and yield its
    API URL (its UI is at the same address without ``/api``); stop and remove it after."""
    from prefect_rollouts.servers import postgres as pgserver

    with server_home(prefix) as home:
        yield pgserver.start(home, port=free_port(), pg_port=free_port())


@contextlib.contextmanager
def pg_api_server() -> Iterator[str]:
    """``pg_server_running``, with this process's Prefect settings (and ``PREFECT_API_URL``, for child
    processes) pointed at it while it runs."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with pg_server_running("pg-") as api_url:
        previous = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = api_url
        refresh_global_settings_context()
        try:
            with temporary_settings(updates={PREFECT_API_URL: api_url}):
                yield api_url
        finally:
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=10)   # send what is queued while the server still answers
            EventsWorker.drain_all(timeout=10)
            if previous is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = previous
            refresh_global_settings_context()


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """The API URL of a PostgreSQL-backed Prefect server for this module; this process's settings are
    left as they are (the tests pass the URL to the processes they start)."""
    with pg_server_running("server-") as api_url:
        yield api_url


@pytest.fixture(scope="module")
def pg_api() -> Iterator[str]:
    """The API URL of a PostgreSQL-backed Prefect server for this module, which this process's Prefect
    settings point at meanwhile."""
    with pg_api_server() as api_url:
        yield api_url


@pytest.fixture(scope="session", autouse=True)
def _no_server_home_left() -> Iterator[None]:
    """At the session's end no PostgreSQL cluster of a test is left in /tmp (each was 49-95 MB):
    every server home is made by ``server_home``, under a directory of this session."""
    yield
    left = sorted(path.name for path in SESSION_DIR.iterdir()) if SESSION_DIR.exists() else []
    shutil.rmtree(SESSION_DIR, ignore_errors=True)
    assert not left, f"server homes left in {SESSION_DIR}: {left}"
