"""A PostgreSQL-backed Prefect server (``pgserver``) for a test module, the directories such servers
live in (removed after, also when a test fails), and free loopback ports."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SESSION_DIR = Path(tempfile.gettempdir()) / f"prefect-rollouts-tests-{os.getpid()}"
"""Parent of every server home of this test session (a PostgreSQL cluster is 49-95 MB); the
session's end removes it and fails if a home was left in it (``tests/conftest.py``)."""


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
            from prefect_rollouts import pgserver

            pgserver.stop(home)
        finally:
            shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def pg_api_server() -> Iterator[str]:
    """Start a Prefect server on PostgreSQL, point this process's Prefect settings (and
    ``PREFECT_API_URL``, for child processes) at it, yield its API URL; stop and remove it after."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_rollouts import pgserver

    with server_home("pg-") as home:
        api_url = pgserver.start(home, port=free_port(), pg_port=free_port())
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
