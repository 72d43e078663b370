"""``prefect-rollouts server start --host``: beyond loopback only with an auth string, which the
real Prefect server then demands of every client and worker; PostgreSQL stays on loopback."""

from __future__ import annotations

import base64
import os
import socket

import httpx
import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.servers import postgres as pgserver
from tests.support.ports import free_port
from tests.support.servers import server_home
from tests.support.waiting import poll_until
from tests.support.workers import Worker, run_prefect, worker_names

SECRET = "s3cret-auth-string-for-the-test-7f2c"


def outside_address() -> str:
    """An address of this machine other than loopback (where another machine would reach it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.1", 9))   # picks the outgoing interface; sends nothing
        address = sock.getsockname()[0]
    assert not pgserver.is_loopback(address)
    return address


@pytest.fixture
def home():
    with server_home("auth-") as path:   # stopped and removed after, also on failure
        yield path


@pytest.mark.unit
def test_a_server_beyond_loopback_without_an_auth_string_does_not_start(home, monkeypatch):
    monkeypatch.delenv(pgserver.AUTH_ENV, raising=False)
    result = CliRunner().invoke(app, ["server", "start", "--home", str(home), "--host", "0.0.0.0",
                                      "--port", str(free_port()), "--pg-port", str(free_port())])
    output = " ".join(result.output.split())   # the console wraps long lines
    assert result.exit_code == 2
    assert output.startswith("config error: --host 0.0.0.0: a Prefect server reachable from other machines")
    assert "Export PREFECT_SERVER_API_AUTH_STRING" in output and "Traceback" not in output
    assert not (home / "pgdata").exists() and not (home / "prefect-server.pid").exists()


@pytest.mark.unit
def test_loopback_needs_no_auth_string():
    pgserver.check_host("127.0.0.1", {})
    pgserver.check_host("::1", {})
    with pytest.raises(Exception, match="needs an auth string"):
        pgserver.check_host("10.1.2.3", {pgserver.AUTH_ENV: "  "})


@pytest.mark.system
def test_only_requests_with_the_auth_string_are_served_and_postgres_stays_on_loopback(home, monkeypatch, tmp_path):
    monkeypatch.setenv(pgserver.AUTH_ENV, SECRET)
    port, pg_port, address = free_port(), free_port(), outside_address()
    started = CliRunner().invoke(app, ["server", "start", "--home", str(home), "--host", "0.0.0.0",
                                       "--port", str(port), "--pg-port", str(pg_port)])
    assert started.exit_code == 0, started.output
    assert 'export PREFECT_API_AUTH_STRING="$PREFECT_SERVER_API_AUTH_STRING"' in started.output
    api = f"http://{address}:{port}/api"
    good = {"Authorization": "Basic " + base64.b64encode(SECRET.encode()).decode()}
    bad = {"Authorization": "Basic " + base64.b64encode(b"guess").decode()}
    with httpx.Client(timeout=30) as http:
        assert http.get(f"{api}/health").status_code == 200                     # probes stay open
        assert http.get(f"{api}/ready").status_code == 200   # the outage watch's (flows/services/outage.py)
        assert http.post(f"{api}/flows/filter", json={}).status_code == 401
        assert http.post(f"{api}/flows/filter", json={}, headers=bad).status_code == 401
        assert http.post(f"{api}/flows/filter", json={}, headers=good).status_code == 200

    env = {**os.environ, "PREFECT_API_URL": api, "DO_NOT_TRACK": "1", "PREFECT_HOME": str(tmp_path / "client"),
           "PREFECT_CLIENT_MAX_RETRIES": "0"}
    env.pop(pgserver.AUTH_ENV)
    refused = run_prefect("work-pool", "create", "rollouts", "--type", "process", env=env)
    assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr
    env["PREFECT_API_AUTH_STRING"] = SECRET
    assert run_prefect("work-pool", "create", "rollouts", "--type", "process", env=env).returncode == 0

    worker = Worker(api, "rollouts", "auth-test-worker", None, tmp_path / "worker.log", env=env)
    try:
        workers = poll_until(lambda: worker_names(api, "rollouts", status=None, headers=good), timeout_s=90)
    finally:
        worker.stop()
    output = worker.output()
    assert workers == ["auth-test-worker"], output                                 # the worker polled, and was served

    with pytest.raises(OSError):                                                   # PostgreSQL: loopback only
        socket.create_connection((address, pg_port), timeout=5).close()
    socket.create_connection(("127.0.0.1", pg_port), timeout=5).close()
    log = (home / "prefect-server.log").read_text(errors="replace")
    assert SECRET not in started.output + log + output
