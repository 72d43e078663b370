"""The launcher's relay (``harnesses/programs/launch.py``) when a thread cannot start (issue 32): under a
fork bomb at ``pids_limit`` (threads count as processes) a connection whose pump thread cannot start is
closed, its slot freed, and the relay goes on serving; it died with a traceback, and every later model
request of the program went unanswered."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import threading
import time
from importlib import resources
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.unit

SCRIPT = resources.files("prefect_rollouts.harnesses") / "programs" / "launch.py"


@pytest.fixture
def launch():
    spec = importlib.util.spec_from_file_location("launch_under_test", str(SCRIPT))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def echo_server(path: str) -> socket.socket:
    """A Unix socket at ``path`` that echoes each connection's bytes back (the endpoint's stand-in)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)

    def echo(connection):
        with connection, contextlib.suppress(OSError):   # the relay closed it: a refused connection
            while data := connection.recv(65536):
                connection.sendall(data)

    def serve():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(connection,), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    return server


def exchange(port: int, text: bytes) -> bytes | None:
    """What comes back on a fresh connection to the relay after sending ``text``: b"" when it is closed,
    None when nothing answers within 2 s (no relay accepts it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
        try:
            connection.sendall(text)
            received = b""
            while len(received) < len(text) and (chunk := connection.recv(65536)):   # no half-close: the
                received += chunk                                       # relay ends both ways at one's end
            return received
        except TimeoutError:
            return None
        except OSError:   # reset
            return b""


def until_relayed(port: int, text: bytes) -> bool:
    """Whether a connection relays ``text`` within 5 s (the one slot may still be held a moment)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if exchange(port, text) == text:
            return True
        time.sleep(0.01)
    return False


def test_a_connection_whose_thread_cannot_start_is_closed_and_the_relay_goes_on(launch, tmp_path, monkeypatch):
    # the 1st connection's first pump cannot start, the 2nd connection's second; the 3rd gets both
    fails = [True, False, True]

    class NoThreadLeft(threading.Thread):
        def start(self):
            if fails and fails.pop(0):
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(launch, "threading", SimpleNamespace(Thread=NoThreadLeft,
                                                             BoundedSemaphore=threading.BoundedSemaphore))
    monkeypatch.setattr(launch, "MAX_RELAYED", 1)   # a refused connection's slot must come back
    unhandled: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))
    path = str(tmp_path / "door.sock")
    server = echo_server(path)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    relay = threading.Thread(target=launch.relay, args=(listener, path), daemon=True)
    relay.start()
    port = listener.getsockname()[1]
    try:
        assert exchange(port, b"first") == b""
        assert exchange(port, b"second") == b""
        # the 2nd connection's slot comes back when its started pump ends, a moment after it was closed
        assert until_relayed(port, b"third") and until_relayed(port, b"fourth")
        assert relay.is_alive() and unhandled == [] and fails == []
    finally:
        listener.shutdown(socket.SHUT_RDWR)   # wakes the relay's accept: it returns
        listener.close()
        server.close()
        relay.join(timeout=5)
    assert not relay.is_alive()
