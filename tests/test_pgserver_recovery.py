"""pgserver after PostgreSQL was killed (a stale postmaster.pid), and a port that another server holds."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from prefect_rollouts import pgserver
from prefect_rollouts.errors import RuntimeUnavailableError

pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_killed_postgres_is_stopped_and_started_again_and_a_taken_port_is_refused():
    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-recovery-"))
    home.chmod(0o755)
    port, pg_port = free_port(), free_port()
    api = pgserver.start(home, port=port, pg_port=pg_port)
    try:
        postmaster = int((home / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
        os.kill(postmaster, signal.SIGKILL)   # kill -9: its postmaster.pid stays
        time.sleep(1)
        assert pgserver.start(home, port=port, pg_port=pg_port) == api   # the API answered; PostgreSQL is back
        assert httpx.post(f"{api}/flow_runs/count", json={}, timeout=30).status_code == 200
        os.kill(int((home / "pgdata" / "postmaster.pid").read_text().splitlines()[0]), signal.SIGKILL)
        time.sleep(1)
        pgserver.stop(home)                                               # no "could not send stop signal"
        assert pgserver.start(home, port=port, pg_port=pg_port) == api
        assert httpx.post(f"{api}/flow_runs/count", json={}, timeout=30).status_code == 200

        other = Path(tempfile.mkdtemp(prefix="prefect-rollouts-other-"))
        with pytest.raises(RuntimeUnavailableError, match=f"port {port}: a Prefect API already answers there"):
            pgserver.start(other, port=port, pg_port=free_port())
    finally:
        pgserver.stop(home)
