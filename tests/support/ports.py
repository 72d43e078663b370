"""Free loopback ports."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port that was free a moment ago; nothing listens on it once this returns
    (also the way to get a port that refuses connections)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
