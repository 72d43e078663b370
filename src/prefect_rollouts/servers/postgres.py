"""The PostgreSQL-backed Prefect server (``prefect-rollouts server start|stop``): a PostgreSQL
cluster and a Prefect API server using it, each in its own process. PostgreSQL listens on
loopback only; the Prefect API on loopback unless asked for another address (``host``), which
needs an auth string (``check_host``): workers that poll a server run the code it sends them.

Why: on this project's 2-core machines a subflow per rollout costs about 2 s of waiting on the
default SQLite server (its writes queue behind the event recorder) against 0.3 s on PostgreSQL,
and 200 concurrent subflows on SQLite answered HTTP 503 (see README, "Choosing a granularity").
Uses the PostgreSQL binaries of the machine (``pg_ctl``, ``initdb``); as root, PostgreSQL runs as
the ``postgres`` user, as it refuses to run as root.

The Prefect server is started with ``Popen`` in a session of its own rather than with
``prefect server start --background``: that flag keeps its PID file under ``PREFECT_HOME``
and stops only the process it recorded, while ``stop`` here ends the server's whole process
group, and ``start`` needs the process handle to notice a server that died while starting.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError

AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
"""Prefect's server setting: every API request but the health probes must carry this string
(HTTP Basic). Clients and workers send it from ``PREFECT_API_AUTH_STRING``."""

SERVER_SETTINGS = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}
"""Prefect server settings for many short task runs (an environment variable set by the user wins).

The task-run recorder writes task-run states from events; by default it writes one event per
transaction. Batching 100 per transaction, flushed at least every second (task-run states reach
the UI up to 1 s later; Prefect 3.9 rounds the interval down to whole seconds, and 0 would spin)
raised the rollouts per second of both the flow and task granularities and cut the server's CPU
per rollout by a third to three quarters; batching the event persister the same way changed
nothing measurable (``benchmarks/overhead.py``; benchmarks/README.md, "Task-run recorder batching").
"""


def server_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` with ``SERVER_SETTINGS`` added where ``base`` does not set them."""
    return {**SERVER_SETTINGS, **base}


def postgres_bin() -> Path:
    """The directory holding ``pg_ctl`` and ``initdb``.

    Raises:
        RuntimeUnavailableError: PostgreSQL is not installed.
    """
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if candidates:
        return Path(candidates[-1]).parent
    raise RuntimeUnavailableError("PostgreSQL server binaries not found (pg_ctl). Install them "
                                  "(Debian: apt-get install postgresql) or run Prefect on SQLite", retryable=False)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse to serve beyond loopback without an auth string.

    Raises:
        ConfigError: ``host`` is not a loopback address and ``PREFECT_SERVER_API_AUTH_STRING``
            is unset or blank in ``environ`` (default: this process's environment).
    """
    environ = os.environ if environ is None else environ
    if not is_loopback(host) and not environ.get(AUTH_ENV, "").strip():
        raise ConfigError(f"--host {host}: a Prefect server reachable from other machines runs code on every "
                          f"worker that polls it, so it needs an auth string. Export {AUTH_ENV} (a long random "
                          "string; clients and workers set PREFECT_API_AUTH_STRING to the same value), or keep "
                          "--host 127.0.0.1")


DEFAULT_PORT = 4200
"""Prefect's own default API port: ``start`` takes it when it is free and nothing else was asked."""
DEFAULT_PG_PORT = 5433
"""PostgreSQL port ``start`` takes when it is free (5432 is left to a system PostgreSQL)."""


def start(home: Path, *, port: int | None = None, pg_port: int | None = None, host: str = "127.0.0.1") -> str:
    """Start PostgreSQL and a Prefect server using it (idempotent); return the API URL on this machine.

    Args:
        home: Directory for the database cluster, the Prefect home and the logs.
        port: Prefect API port. None: the port this home's server used last (``home/prefect-server.port``)
            while it runs or is free, else ``DEFAULT_PORT`` when free, else a free port: on a shared
            machine a second user's server does not collide with the first.
        pg_port: PostgreSQL port on 127.0.0.1 (never another address); None: chosen the same way
            (``home/postgres.port``, ``DEFAULT_PG_PORT``).
        host: Address the Prefect API listens on: loopback (default), ``0.0.0.0`` for every
            interface, or one address. Beyond loopback, ``PREFECT_SERVER_API_AUTH_STRING`` must
            be set; the server reads it from its environment (never a command line or a log).

    Raises:
        ConfigError: ``host`` is beyond loopback without an auth string, or the server of
            ``home`` already runs on another address.
        RuntimeUnavailableError: a server did not come up; the message names its log.
    """
    check_host(host)
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    asked = port is not None
    port = port or _choose_port(home / "prefect-server.port", DEFAULT_PORT, host,
                                ours=_alive(home / "prefect-server.pid"))
    pg_port = pg_port or _choose_port(home / "postgres.port", DEFAULT_PG_PORT, "127.0.0.1",
                                      ours=_postgres_running(home / "pgdata"))
    local = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    api_url = f"http://{f'[{local}]' if ':' in local else local}:{port}/api"
    host_file = home / "prefect-server.host"
    running = host_file.read_text().strip() if host_file.exists() else "127.0.0.1"
    if (home / "prefect-server.pid").exists() and running != host:
        raise ConfigError(f"--host {host}: the server of {home} already runs on {running}. Stop it first "
                          f"(prefect-rollouts server stop --home {home})")
    if healthy(api_url):
        if not _alive(home / "prefect-server.pid"):
            hint = "Choose another --port" if asked else "Stop it"
            raise RuntimeUnavailableError(f"port {port}: a Prefect API already answers there, and it is not the "
                                          f"server of {home}. {hint}, or use that server "
                                          f"(export PREFECT_API_URL={api_url})", retryable=False)
        _start_postgres(home, pg_port)   # the API answers /health without its database: bring PostgreSQL back
        return api_url
    _start_postgres(home, pg_port)
    (home / "postgres.port").write_text(str(pg_port))
    (home / "prefect-server.port").write_text(str(port))
    env = {**server_env(dict(os.environ)), "PREFECT_HOME": str(home / "prefect"),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://postgres@127.0.0.1:{pg_port}/prefect",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           # the UI's API URL is derived from these settings, not from --host/--port (PREFECT_UI_API_URL
           # wins when set): without them the UI of a server on another port called port 4200
           "PREFECT_SERVER_API_HOST": host, "PREFECT_SERVER_API_PORT": str(port)}
    # links in automations' notifications (Jinja's ui_url) need the UI's address; a value the user set wins
    env.setdefault("PREFECT_UI_URL", f"http://{socket.getfqdn() if host in ('0.0.0.0', '::') else host}:{port}")
    env.pop("PREFECT_API_URL", None)
    log = open(home / "prefect-server.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", host,
                                "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    (home / "prefect-server.pid").write_text(str(process.pid))
    host_file.write_text(host)
    deadline = time.monotonic() + 120
    while not healthy(api_url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeUnavailableError(f"Prefect server did not start; see {home / 'prefect-server.log'}",
                                          retryable=False)
        time.sleep(0.5)
    return api_url


def _choose_port(record: Path, default: int, host: str, *, ours: bool) -> int:
    """The port recorded in ``record`` when its server (``ours``) runs or the port is free, else
    ``default`` when free, else one the kernel picks."""
    recorded = int(record.read_text()) if record.exists() and record.read_text().strip().isdigit() else None
    if recorded is not None and (ours or _port_free(host, recorded)):
        return recorded
    if _port_free(host, default):
        return default
    with _probe(host) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    """Whether a server can listen on ``host:port`` (with ``SO_REUSEADDR``, as uvicorn and PostgreSQL do)."""
    with _probe(host) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _probe(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def client_hints(api_url: str, host: str, port: int) -> list[str]:
    """What clients on this machine, and workers elsewhere, export to reach the server started
    on ``host``. Names the auth string's variables, never its value."""
    hints = [f"export PREFECT_API_URL={api_url}"]
    if not is_loopback(host):
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        hints += [f'export PREFECT_API_AUTH_STRING="${AUTH_ENV}"   # every client and worker sends it',
                  f"workers on other machines: PREFECT_API_URL=http://{shown}:{port}/api and the same "
                  "PREFECT_API_AUTH_STRING"]
    return hints


def stop(home: Path) -> None:
    """Stop the Prefect server and PostgreSQL started with ``start(home)``."""
    home = home.resolve()
    pid_file = home / "prefect-server.pid"
    if pid_file.exists():
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError, PermissionError):
            pass
        deadline = time.monotonic() + 30   # gone before PostgreSQL stops, and before a start on its port
        while _alive(pid_file) and time.monotonic() < deadline:
            time.sleep(0.2)
        pid_file.unlink()
    (home / "prefect-server.host").unlink(missing_ok=True)
    if (home / "pgdata" / "postmaster.pid").exists() and _postgres_running(home / "pgdata"):
        _as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(home / "pgdata"), "-m", "fast", "-w", "stop"])


def _alive(pid_file: Path) -> bool:
    """Whether the process group named in ``pid_file`` (a server this module started) still runs.

    When this process started the server, its exited leader stays a zombie, still a member of the
    group, until it is reaped: reap it first, or every stop waited its whole 30 s."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)   # not our child (another process started it): ChildProcessError
    try:
        os.killpg(pid, 0)
        return True
    except OSError:
        return False


def _postgres_running(data: Path) -> bool:
    """Whether the postmaster named in ``data/postmaster.pid`` runs. A killed PostgreSQL (``kill
    -9``, OOM, power loss) leaves the file naming a dead process, or a zombie that nobody reaped
    (which ``pg_ctl status`` counts as running, and ``pg_ctl stop`` then waits for in vain)."""
    try:
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return False
    return state != "Z"


def _start_postgres(home: Path, pg_port: int) -> None:
    bin_dir, data = postgres_bin(), home / "pgdata"
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
        if _as_postgres(["test", "-w", str(home)], check=False).returncode != 0:
            raise RuntimeUnavailableError(f"server home {home}: the postgres user cannot enter it (a parent "
                                          "directory is private). Choose a home under a directory others can "
                                          "traverse, e.g. /tmp/prefect-rollouts", retryable=False)
    if not (data / "PG_VERSION").exists():
        _as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"])
    if not _postgres_running(data):
        for stale in (data / "postmaster.pid", home / f".s.PGSQL.{pg_port}.lock", home / f".s.PGSQL.{pg_port}"):
            stale.unlink(missing_ok=True)   # PostgreSQL refuses lock files that name a zombie postmaster
        log = home / "postgres.log"
        started = _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-o",
                                f"-p {pg_port} -k {home} -c listen_addresses=127.0.0.1 -c max_connections=200",
                                "start"], check=False)
        if started.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            raise RuntimeUnavailableError(f"PostgreSQL did not start on 127.0.0.1:{pg_port}: "
                                          f"{' / '.join(tail) or started.stderr.decode().strip()}. "
                                          "If the port is taken, pass another --pg-port", retryable=False)
    created = _as_postgres([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(pg_port), "-U", "postgres",
                            "prefect"], check=False)
    if created.returncode != 0 and b"already exists" not in created.stderr:
        raise RuntimeUnavailableError(f"createdb failed: {created.stderr.decode().strip()}; "
                                      f"see {home / 'postgres.log'}", retryable=False)


def _as_postgres(command: list[str], check: bool = True) -> subprocess.CompletedProcess[bytes]:
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    result = subprocess.run(command, capture_output=True)
    if check and result.returncode != 0:
        raise RuntimeUnavailableError(f"{' '.join(command)} failed: {result.stderr.decode().strip()}", retryable=False)
    return result


def healthy(api_url: str) -> bool:
    """Whether the Prefect API at ``api_url`` answers ``/health`` with 200 within 2 s."""
    try:
        return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
