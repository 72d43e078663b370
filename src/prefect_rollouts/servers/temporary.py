"""A temporary Prefect server whose life is tied to the process that started it.

Without ``PREFECT_API_URL`` Prefect starts an ephemeral server in a subprocess and stops it at
exit, but a ``kill -9`` of the parent leaves that server running (about 250 MB). The CLI starts
the server here instead, under a small supervisor:

    eval process ──pipe──> supervisor (own session and process group) ──> uvicorn (Prefect's server app)

The supervisor blocks reading the pipe. Only the eval process holds its write end (the fd is not
inheritable), so when the eval process ends, however it ends, the read returns EOF and the
supervisor kills its whole process group: the server and anything the server started. It also
exits when the server does. The server is the same app Prefect's ephemeral mode runs
(``prefect.server.api.server:create_app`` under uvicorn, UI off, the same database).
The server's own output (e.g. SQLite's "database is locked" while a fresh ``PREFECT_HOME``'s
database is migrated, which the server retries) goes to ``LOG_NAME`` in ``PREFECT_HOME``, not to
the eval's console; a server that does not start is reported with the end of that log.

This module does not import Prefect in the eval process; the supervisor imports nothing of it either.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError
from prefect_rollouts.servers.postgres import healthy, server_env

PORT_ENV = "PREFECT_ROLLOUTS_TEMP_SERVER_PORT"
"""Environment variable with the temporary server's port; unset: a free port the kernel picks."""

STOP_GRACE_S = 10.0
"""How long the supervisor waits after SIGTERM before it SIGKILLs the server's process group."""

LOG_NAME = "temporary-server.log"
"""The file in ``PREFECT_HOME`` (default ``~/.prefect``) that the temporary servers append their output to."""


class TemporaryServer:
    """A Prefect server on 127.0.0.1 for as long as this object is open (and this process lives).

    Args:
        startup_timeout_s: How long to wait for ``/api/health`` to answer.
        port: The server's port on 127.0.0.1; None: ``PREFECT_ROLLOUTS_TEMP_SERVER_PORT``, else a free port.

    Raises:
        ConfigError: (from ``start``) ``PREFECT_ROLLOUTS_TEMP_SERVER_PORT`` is not a port number.
        RuntimeUnavailableError: (from ``start``) the chosen port is taken, or the server did not
            answer in time or exited.
    """

    def __init__(self, startup_timeout_s: float = 120.0, port: int | None = None) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.port = port
        self.api_url = ""
        self.supervisor: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start the supervisor and its server; return the API URL (``http://127.0.0.1:<port>/api``)."""
        port = self.port or _port_from_env() or _free_port()
        if not _bindable(port):
            raise RuntimeUnavailableError(f"temporary Prefect server: port {port} on 127.0.0.1 is taken. Choose "
                                          f"another {PORT_ENV}, or unset it for a free port", retryable=False)
        self.api_url = f"http://127.0.0.1:{port}/api"
        log_path = server_log_path()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} temporary server on port {port}\n".encode())
            log.flush()
            self.supervisor = subprocess.Popen([sys.executable, "-m", "prefect_rollouts.servers.temporary", str(port)],
                                               stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while not healthy(self.api_url):
            if self.supervisor.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeUnavailableError(f"temporary Prefect server on port {port} did not start within "
                                              f"{self.startup_timeout_s:.0f} s (its log, {log_path}, ends: "
                                              f"{_tail(log_path)!r}). Start one (prefect-rollouts server start) "
                                              "and set PREFECT_API_URL", retryable=False)
            time.sleep(0.2)
        return self.api_url

    def stop(self) -> None:
        """Close the pipe (the supervisor then stops the server) and wait for the supervisor."""
        if self.supervisor is None:
            return
        if self.supervisor.stdin is not None:
            self.supervisor.stdin.close()
        try:
            self.supervisor.wait(timeout=STOP_GRACE_S + 5)
        except subprocess.TimeoutExpired:
            os.killpg(self.supervisor.pid, signal.SIGKILL)
            self.supervisor.wait()
        self.supervisor = None

    def __enter__(self) -> TemporaryServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def supervise(port: int) -> int:
    """The supervisor: run the server, and stop its process group on EOF of stdin or when it exits.

    Returns:
        The server's exit code (0 after a stop on EOF).
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the SIGTERM for the group is not for us
    env = {**server_env(dict(os.environ)), "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1"}
    env.pop("PREFECT_API_URL", None)
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app",
                               "--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"],
                              stdin=subprocess.DEVNULL, env=env)
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.buffer, selectors.EVENT_READ)
    while server.poll() is None:
        if selector.select(timeout=0.5) and not os.read(sys.stdin.fileno(), 4096):
            break   # EOF: the eval process is gone
    code = server.poll()
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if server.poll() is None or _group_has_others():
        os.killpg(0, signal.SIGKILL)   # ends this process too
    return code or 0


def _group_has_others() -> bool:
    """Whether a process other than this one is left in this process group."""
    group, me = os.getpgrp(), os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


def _port_from_env() -> int | None:
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{PORT_ENV} = {raw!r}: not a port number. Set 1 to 65535, or unset it for a free port")
    return int(raw)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_log_path() -> Path:
    """``LOG_NAME`` in ``PREFECT_HOME`` (default ``~/.prefect``), the temporary servers' output."""
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser() / LOG_NAME


def _tail(path: Path, chars: int = 300) -> str:
    """The last ``chars`` characters of the file at ``path``, stripped ("" if unreadable)."""
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":  # pragma: no cover - run as the supervisor by TemporaryServer
    sys.exit(supervise(int(sys.argv[1])))
