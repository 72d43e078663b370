"""A PostgreSQL-backed Prefect server (``pgserver``) for a test module, and free loopback ports."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def pg_api_server() -> Iterator[str]:
    """Start a Prefect server on PostgreSQL, point this process's Prefect settings (and
    ``PREFECT_API_URL``, for child processes) at it, yield its API URL; stop it after."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_rollouts import pgserver

    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-pg-"))
    home.chmod(0o755)   # postgres runs as its own user and must enter it
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
        pgserver.stop(home)
