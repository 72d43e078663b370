"""How the interception endpoint accepts connections: the cap in all, a rollout's cap on its own
socket, and the request-head deadline (``endpoint_limits`` has the module's story and the numbers).

``asyncio``'s server accepts a whole backlog before any connection reaches its protocol, so a flood
ran the eval out of descriptors before a cap there could act: the endpoint accepts its connections
itself (``Acceptor``) and hands them to uvicorn's h11 protocol (``connection_class``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from prefect_rollouts.harnesses.endpoint_limits import CONNECTION, EndpointLimits

if TYPE_CHECKING:
    from prefect_rollouts.harnesses.session import ProgramSession

logger = logging.getLogger("prefect_rollouts.endpoint")

HEAD_TIMEOUT_S = 10.0
"""A request head must be complete within this many seconds of the connection or of its first byte."""
ACCEPT_BATCH = 64
"""Connections accepted per wake-up of the listening socket, so the event loop serves the others between."""
ACCEPT_PAUSE_S = 0.5
"""How long accepting pauses after ``accept`` failed (no descriptor left in the process)."""
LINGER_S = 1.0
"""How long a connection refused at accept is kept, reading and dropping what its client sends, before
it is closed. Closing a Unix socket with unread data resets the client's end, and a client writes its
request just after connecting: closed at once, it got ``ConnectionResetError`` and never the answer."""
MAX_LINGERING = 64
"""Refused connections kept so at once, in all (past it they are closed at once: a flood holds no more)."""


def refusal(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response: ``status`` with an OpenAI-shaped error body, closing the connection."""
    kind = "invalid_request_error" if status < 500 else "api_error"
    body = json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()
    reason = {408: b"Request Timeout", 413: b"Payload Too Large", 429: b"Too Many Requests"}.get(status,
                                                                                              b"Service Unavailable")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body)) + body)


class _Connection(H11Protocol):
    """Uvicorn's h11 connection with the head deadline (module docstring); ``Acceptor`` counted it open.
    ``limits`` is set on the subclass ``connection_class`` makes for an endpoint."""

    limits: ClassVar[EndpointLimits]

    def connection_made(self, transport: asyncio.Transport) -> None:   # type: ignore[override]
        super().connection_made(transport)
        self.head_timer: asyncio.TimerHandle | None = self.loop.call_later(HEAD_TIMEOUT_S, self._head_late)

    acceptor: Acceptor | None = None
    """The listener it came through (a rollout's door names its session before any byte is read)."""

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.open -= 1
        if self.acceptor is not None:
            self.acceptor.open -= 1
        if self.head_timer is not None:
            self.head_timer.cancel()
        self.limits.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.head_timer is None and self.conn.their_state is h11.IDLE:   # a new head begins
            self.head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_late)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:   # a head was read: its request is the app's now
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
            if self.scope is not None:
                self.scope.setdefault("extensions", {})[CONNECTION] = self   # type: ignore[assignment]

    def _head_late(self) -> None:
        self.head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.limits.count("head_timeout", None, f"a connection sent no whole request head in {HEAD_TIMEOUT_S:g} s")
            self.transport.write(refusal(408, f"no complete request head within {HEAD_TIMEOUT_S:g} s", "head_timeout"))
            self.transport.close()


class Acceptor:
    """Accepts the endpoint's connections itself. ``asyncio``'s server accepts a whole backlog before
    any of them reaches its protocol, so a flood ran the eval out of descriptors before a cap there
    could act. Here a connection past ``limits.max_connections`` is answered 503 and closed on the
    spot (its client reads the answer: ``LINGER_S``); when ``accept`` fails (the process is out of
    descriptors elsewhere) accepting pauses for ``ACCEPT_PAUSE_S``, counted once per pause, not logged per attempt.

    On a rollout's own socket (``session`` given: its door) the rollout is known before a byte is
    read, so its connections past its share (``EndpointLimits.share``: at most
    ``endpoint_limits.MAX_CONNECTIONS_PER_ROLLOUT``) are refused (429) there, and a program holding
    connections open without a request takes no other rollout's. A door within its share is served
    past the cap in all (up to twice it): rollouts that fill their shares leave a new door its own.
    Refusals at a door are counted on its rollout's trace (``EndpointLimits.count``).

    Args:
        sock: The listening socket (non-blocking); closed by ``close``.
        factory: Makes the protocol of an accepted connection (uvicorn's, from ``connection_class``).
        limits: The endpoint's ``EndpointLimits``.
        session: The launch whose socket this is, or None (the endpoint's own socket on the host).
    """

    def __init__(self, sock: socket.socket, factory: Callable[[], _Connection], limits: EndpointLimits,
                 session: ProgramSession | None = None) -> None:
        self.sock, self.factory, self.limits, self.session = sock, factory, limits, session
        self.open = 0
        """Its connections open now."""
        self.loop = asyncio.get_running_loop()
        self.handing: set[asyncio.Task[Any]] = set()
        self.closed = False

    def start(self) -> None:
        if self.session is not None:
            self.limits.doors += 1
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting and close the listening socket (idempotent); open connections stay."""
        if not self.closed:
            self.closed = True
            if self.session is not None:
                self.limits.doors -= 1
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def _accept(self) -> None:
        limits = self.limits
        for _ in range(ACCEPT_BATCH):
            try:
                connection, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:   # EMFILE, ENFILE, ENOBUFS: wait for descriptors to free
                limits.count("accept_failed", None, f"accepting a connection failed ({exc})")
                self.loop.remove_reader(self.sock.fileno())
                self.loop.call_later(ACCEPT_PAUSE_S, self._resume)
                return
            most = limits.share() if self.session is not None else 0
            if self.session is not None and self.open >= most:
                limits.count("connections", self.session, f"a rollout opened over {most} connections")
                self._refuse_now(connection, refusal(429, f"this rollout has {most} connections open to the endpoint, "
                                                          "its most; reuse or close them", "too_many_connections"))
                continue
            if limits.open >= limits.max_connections * (2 if self.session is not None else 1):
                limits.count("connections", self.session, f"more than {limits.max_connections} connections open")
                self._refuse_now(connection, refusal(503, f"the interception endpoint has {limits.max_connections} "
                                                          "connections open, its most; retry later",
                                                     "too_many_connections"))
                continue
            limits.open += 1   # until its protocol's connection_lost
            self.open += 1
            connection.setblocking(False)
            task = self.loop.create_task(self._hand(connection))
            self.handing.add(task)
            task.add_done_callback(self.handing.discard)

    async def _hand(self, connection: socket.socket) -> None:
        made: list[_Connection] = []

        def protocol() -> _Connection:
            made.append(self.factory())
            made[0].acceptor = self
            return made[0]
        try:
            await self.loop.connect_accepted_socket(protocol, connection)
        except Exception as exc:   # the connection went away while it was handed over
            logger.debug("interception endpoint: a connection could not start: %s", exc)
            connection.close()
            if not made:   # else its connection_lost counts it closed
                self.limits.open -= 1
                self.open -= 1

    def _resume(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)


    def _refuse_now(self, connection: socket.socket, response: bytes) -> None:
        """Write ``response`` on a just-accepted ``connection``, end its sending side, and close it once
        its client closed or after ``LINGER_S``, reading and dropping what the client sends meanwhile
        (``LINGER_S``); past ``MAX_LINGERING`` such connections, at once."""
        with contextlib.suppress(OSError):   # BlockingIOError: nothing to read now, or no room to write
            connection.setblocking(False)
            _drop_input(connection)
            connection.send(response)
            connection.shutdown(socket.SHUT_WR)
        limits, loop = self.limits, self.loop
        if limits.lingering >= MAX_LINGERING:
            connection.close()
            return
        limits.lingering += 1
        descriptor = connection.fileno()

        def done() -> None:
            if connection.fileno() != -1:
                loop.remove_reader(descriptor)
                timer.cancel()
                connection.close()
                limits.lingering -= 1

        def readable() -> None:
            if not _drop_input(connection):
                done()
        loop.add_reader(descriptor, readable)
        timer = loop.call_later(LINGER_S, done)


def _drop_input(connection: socket.socket) -> bool:
    """Read and drop what ``connection`` (non-blocking) holds now; False once its client closed."""
    try:
        for _ in range(16):
            if not connection.recv(65536):
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    return True


def connection_class(limits: EndpointLimits) -> type[_Connection]:
    """The uvicorn protocol class (``uvicorn.Config(http=...)``) of an endpoint counted in ``limits``."""
    return type("EndpointConnection", (_Connection,), {"limits": limits})


