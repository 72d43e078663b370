"""pgserver after PostgreSQL was killed (a stale postmaster.pid), and a port that another server holds."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx
import psutil
import pytest

from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.servers import postgres as pgserver
from tests.support.ports import free_port
from tests.support.processes import alive, descendants
from tests.support.servers import server_home
from tests.support.waiting import wait_until


def kill_postgres(home: Path) -> None:
    """``kill -9`` the postmaster (its postmaster.pid stays) and wait until it and its children, which
    leave on their own, are gone: a PostgreSQL started meanwhile finds the old shared memory in use."""
    postmaster = int((home / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
    processes = [psutil.Process(postmaster), *descendants(postmaster)]
    os.kill(postmaster, signal.SIGKILL)
    assert wait_until(lambda: not alive(processes), timeout_s=30, what="PostgreSQL's processes to exit after kill -9")


@pytest.mark.system
@pytest.mark.timeout(300)
def test_a_killed_postgres_is_stopped_and_started_again_and_a_taken_port_is_refused():
    with server_home("recovery-") as home, server_home("other-") as other:
        port, pg_port = free_port(), free_port()
        api = pgserver.start(home, port=port, pg_port=pg_port)
        kill_postgres(home)
        assert pgserver.start(home) == api   # the API answered; PostgreSQL is back, on the ports the home recorded
        assert httpx.post(f"{api}/flow_runs/count", json={}, timeout=30).status_code == 200
        kill_postgres(home)
        pgserver.stop(home)                                               # no "could not send stop signal"
        assert pgserver.start(home) == api                                # the recorded ports, still free
        assert httpx.post(f"{api}/flow_runs/count", json={}, timeout=30).status_code == 200

        with pytest.raises(RuntimeUnavailableError, match=f"port {port}: a Prefect API already answers there"):
            pgserver.start(other, port=port, pg_port=free_port())


@pytest.mark.unit
def test_without_ports_a_server_takes_the_recorded_one_else_the_default_else_a_free_one(tmp_path):
    record = tmp_path / "prefect-server.port"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        free = free_port()
        assert pgserver._choose_port(record, free, "127.0.0.1", ours=False) == free        # nothing recorded
        chosen = pgserver._choose_port(record, busy, "127.0.0.1", ours=False)              # 4200 taken by another
        assert chosen not in (busy, 0)
        record.write_text(str(busy))
        assert pgserver._choose_port(record, free, "127.0.0.1", ours=True) == busy         # its own running server
        assert pgserver._choose_port(record, free, "127.0.0.1", ours=False) == free        # another's now
