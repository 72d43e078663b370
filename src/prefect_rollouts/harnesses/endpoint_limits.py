"""The interception endpoint's limits: connections, request heads, requests in flight, body memory.

This module counts and applies them per request (``EndpointLimits``, the ``Limiter`` middleware);
accepting connections and the head deadline are ``endpoint_accept.py``.

A program can connect to its socket directly, past the launcher's relay, so the host side holds on
its own (as the egress proxy does):

- **connections in all**: at most ``max_connections()`` open at once (a quarter of this process's
  descriptor limit, whose soft value ``EndpointLimits`` first raises to the hard one; at most
  ``MAX_CONNECTIONS``); one more is answered 503 and closed, so a flood cannot use up the eval's
  file descriptors. The doors share it fairly: a door holds at most its share (``EndpointLimits.share``,
  the cap split among the open doors), refused 429 at the door past it, and a door within its share
  is served past the cap (up to twice it), so rollouts filling theirs do not starve a new one;
- **a request head** must be complete within ``endpoint_accept.HEAD_TIMEOUT_S`` of the connection
  opening or of its first byte (after a response, uvicorn's keep-alive timeout bounds the wait),
  else 408 and closed;
- **per rollout**: at most ``MAX_CONNECTIONS_PER_ROLLOUT`` connections (429). Each launch is served
  on a socket of its own (its rollout's door, ``InterceptionEndpoint.new_door``), so they are
  counted from ``accept``: a program holding connections without sending a request fills its own
  share, not the others'. (On the endpoint's socket on the host, which no runtime sees, those that
  carried the rollout's key are counted once a head is read.) At most ``MAX_IN_FLIGHT_PER_ROLLOUT``
  requests at once (429), each body complete within ``BODY_TIMEOUT_S`` (408);
- **body memory**: a chat request holds its declared length (``Content-Length``; ``MAX_BODY_BYTES``
  when chunked) from its head until it is answered. All requests together hold at most
  ``MAX_BODIES_BYTES`` (one waits up to ``BODY_WAIT_S`` for room, then 503), one rollout's at most
  half of it (429).

A refusal is a chat-completions error object (``{"error": {"message", "type", "code"}}``) with
``Connection: close``, answered at once (a body-memory one after reading the body on, keeping
nothing). Every other answer of 400 or more (a route's 401, 404, 405, 400, 413) also closes its
connection, after reading the body on (at most ``DRAIN_S``), and every request's body, with a key or
without, has ``BODY_TIMEOUT_S``: a trickle after a refusal held a connection with no deadline. One
a rollout's key names is counted on its trace, ``trace.info["endpoint"]["limited"][reason]``, and
listed with the endpoint's other refusals (``ProgramSession.refused``); all are counted in
``EndpointLimits.refused`` and the first of each kind is logged (a flood does not flood the console).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from prefect_rollouts.harnesses.session import ProgramSession

logger = logging.getLogger("prefect_rollouts.endpoint")

MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest chat-completions request body taken (413 above): 32 MiB holds a long conversation
with a few images; a program sending more is broken or hostile, and the body is held in memory."""
MAX_BODIES_BYTES = 4 * MAX_BODY_BYTES
"""Request bodies held at once in all (128 MiB; parsing adds a few times that): 40 concurrent 31 MB
requests took an eval to 4 GB before."""
BODY_WAIT_S = 30.0
"""How long a request waits for ``MAX_BODIES_BYTES`` to have room before its 503."""
BODY_TIMEOUT_S = 60.0
"""A request body must be complete within this many seconds of its head (32 MiB takes milliseconds
over the socket); a trickled one would hold its share of the body memory."""
DRAIN_S = 5.0
"""How long a body-memory refusal reads the body on before answering (a client sends it in milliseconds)."""
MAX_CONNECTIONS = 1024
"""Connections open at once in all, at most (see ``max_connections``)."""
MAX_CONNECTIONS_PER_ROLLOUT = 32
"""Connections that carried one rollout's key, open at once: a program makes a few (the launcher's
relay opens one per connection of the program)."""
MAX_IN_FLIGHT_PER_ROLLOUT = 8
"""Requests of one rollout being read or answered at once (its exchanges run one at a time anyway)."""
CONNECTION = "prefect_rollouts.connection"
"""The scope extension naming the request's ``_Connection``."""


def raise_descriptor_limit() -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard one (as many servers do at startup), so
    the connections in all (a quarter of the soft limit) are not those of a shell's default 1024: 8
    rollouts holding 32 connections each filled a cap of 256. Left as it is where it cannot be raised."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def max_connections() -> int:
    """Connections the endpoint holds at once: a quarter of ``RLIMIT_NOFILE``'s soft limit (the rest is
    the eval's: containers, Parquet files, the model client), between 64 and ``MAX_CONNECTIONS``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(64, min(MAX_CONNECTIONS, soft // 4))


class EndpointLimits:
    """The endpoint's counters and budgets (module docstring). One per endpoint, in its event loop.

    Attributes:
        max_connections: Connections in all (``max_connections()`` when the endpoint started).
        connections: Open connections, with the secret of the rollout that each last named.
        held_bytes: Body bytes held now, in all (``held_peak``: the most ever held).
        refused: Refusals by reason: ``connections`` (in all or per rollout), ``head_timeout``,
            ``in_flight``, ``body_memory``, ``body_timeout``; and ``accept_failed``, the times
            ``accept`` found no descriptor left (the eval's own, not the endpoint's).
    """

    def __init__(self) -> None:
        raise_descriptor_limit()
        self.max_connections = max_connections()
        self.doors = 0
        """Rollouts' doors listening now (``endpoint_accept.Acceptor`` with a session)."""
        self.lingering = 0
        """Refused connections kept open a moment to read what their client still sends (``endpoint_accept``)."""
        self.connections: dict[object, str | None] = {}   # endpoint_accept's connections (it imports this module)
        self.open = 0
        """Connections open now (accepted, not yet lost)."""
        self.held_bytes = self.held_peak = 0
        self.refused: Counter[str] = Counter()
        self._per_rollout: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()
        self._held: Counter[str] = Counter()
        self._room = asyncio.Condition()

    def share(self) -> int:
        """The connections one door may hold: the cap in all split among the open doors, between 1
        and ``MAX_CONNECTIONS_PER_ROLLOUT``."""
        return min(MAX_CONNECTIONS_PER_ROLLOUT, max(1, self.max_connections // max(1, self.doors)))

    def count(self, reason: str, session: ProgramSession | None, detail: str) -> None:
        """Count a refusal (on ``session``'s trace too), logging the first of its kind."""
        self.refused[reason] += 1
        if session is not None:
            limited = session.ctx.trace.info.setdefault("endpoint", {}).setdefault("limited", {})
            limited[reason] = limited.get(reason, 0) + 1
        if self.refused[reason] == 1:
            logger.warning("interception endpoint: %s; refused (further refusals of this kind are only counted)",
                           detail)

    def bind(self, connection: object, secret: str) -> bool:
        """Count ``connection`` as ``secret``'s; False when that rollout has its most open already."""
        if self.connections.get(connection) == secret:
            return True
        if self._per_rollout[secret] >= MAX_CONNECTIONS_PER_ROLLOUT:
            return False
        self.forget(connection)
        self.connections[connection] = secret
        self._per_rollout[secret] += 1
        return True

    def forget(self, connection: object) -> None:
        """Stop counting ``connection`` for its rollout (it closed, or names another)."""
        secret = self.connections.pop(connection, None)
        if secret is not None:
            self._per_rollout[secret] -= 1
            if self._per_rollout[secret] <= 0:
                del self._per_rollout[secret]

    @contextlib.asynccontextmanager
    async def hold(self, secret: str, size: int) -> AsyncIterator[str | None]:
        """Reserve ``size`` body bytes for one request of ``secret`` while the block runs; yields None,
        or why it could not (``"rollout"``: its half of ``MAX_BODIES_BYTES`` is in use; ``"all"``: no
        room came within ``BODY_WAIT_S``), holding nothing then."""
        if self._held[secret] + size > MAX_BODIES_BYTES // 2:
            yield "rollout"
            return
        try:
            async with self._room:
                await asyncio.wait_for(self._room.wait_for(lambda: self.held_bytes + size <= MAX_BODIES_BYTES),
                                       BODY_WAIT_S)
                self.held_bytes += size
                self._held[secret] += size
        except TimeoutError:
            yield "all"
            return
        self.held_peak = max(self.held_peak, self.held_bytes)
        try:
            yield None
        finally:
            self.held_bytes -= size
            self._held[secret] -= size
            if self._held[secret] <= 0:
                del self._held[secret]
            async with self._room:
                self._room.notify_all()

    @contextlib.contextmanager
    def in_flight(self, secret: str) -> Any:
        """Count a request of ``secret`` while the block runs; yields False when it has its most already."""
        if self._in_flight[secret] >= MAX_IN_FLIGHT_PER_ROLLOUT:
            yield False
            return
        self._in_flight[secret] += 1
        try:
            yield True
        finally:
            self._in_flight[secret] -= 1
            if self._in_flight[secret] <= 0:
                del self._in_flight[secret]


class Limiter:
    """ASGI middleware applying the per-rollout limits before the endpoint's routes see a request.

    Args:
        app: The endpoint's routes.
        limits: Its ``EndpointLimits``.
        find: The session a request's headers name (None: the routes answer 401).
        error: The error body of a refusal, ``error(path, status, message, code)``, in the shape of the
            dialect the path belongs to (Anthropic's on ``/v1/messages``); OpenAI's when not given.
    """

    def __init__(self, app: ASGIApp, limits: EndpointLimits, find: Any,
                 error: Callable[[str, int, str, str], dict[str, Any]] | None = None) -> None:
        self.app, self.limits, self.find = app, limits, find
        self.error = error or _openai_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = self.find(scope)
        connection = scope.get("extensions", {}).get(CONNECTION)
        if session is None or connection is None:   # the routes refuse it: still a body deadline, then closed
            await self._deadline(scope, receive, send, None)
            return
        secret, limits = session.secret, self.limits
        door = connection.acceptor.session if connection.acceptor is not None else None
        if door is not None and door is not session:
            await _refuse(None, send, 401, self.error(scope["path"], 401, "this socket serves another launch; use "
                                                      "the one you were given", "invalid_api_key"))
            return
        if not limits.bind(connection, secret):
            await self._refuse(scope, None, send, session, "connections", 429, "too_many_connections",
                               f"this rollout has {MAX_CONNECTIONS_PER_ROLLOUT} connections open to the endpoint, its "
                               "most; reuse or close them")
            return
        if scope["path"].startswith("/prefect-rollouts/"):   # the launcher's own calls: never held back
            await self.app(scope, receive, send)
            return
        with limits.in_flight(secret) as admitted:
            if not admitted:
                await self._refuse(scope, None, send, session, "in_flight", 429, "too_many_requests",
                                   f"this rollout has {MAX_IN_FLIGHT_PER_ROLLOUT} requests in flight, its most; wait "
                                   "for their responses")
                return
            async with limits.hold(secret, _declared(scope) if scope["method"] == "POST" else 0) as short:
                if short is not None:
                    status, whose, most = (429, "this rollout's requests", MAX_BODIES_BYTES // 2) \
                        if short == "rollout" else (503, "all requests", MAX_BODIES_BYTES)
                    await self._refuse(scope, receive, send, session, "body_memory", status, "body_memory",
                                       f"{whose} hold {most} bytes of request bodies, their most; retry when a "
                                       "response came")
                    return
                await self._deadline(scope, receive, send, session)

    async def _refuse(self, scope: Scope, receive: Receive | None, send: Send, session: ProgramSession | None,
                      reason: str, status: int, code: str, message: str) -> None:
        whose = "a rollout's" if session is not None else "an unknown"
        self.limits.count(reason, session, f"{whose} request: {message}")
        if session is not None:
            session.refused(scope["method"], scope["path"], status, message)
        await _refuse(receive, send, status, self.error(scope["path"], status, message, code))

    async def _deadline(self, scope: Scope, receive: Receive, send: Send, session: ProgramSession | None) -> None:
        """Run the routes, ending the request with 408 when its body is not complete in ``BODY_TIMEOUT_S``;
        an answer of 400 or more is sent after reading the body on (``DRAIN_S`` at most, keeping
        nothing: a client still sending would not read it) with ``Connection: close``."""
        deadline = asyncio.get_running_loop().time() + BODY_TIMEOUT_S
        state = {"started": False, "late": False, "body_done": False}

        async def timed_receive() -> Message:
            if state["body_done"]:
                return await receive()
            left = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), max(left, 0.0))
            except TimeoutError:
                state["late"] = True
                if not state["started"]:
                    await self._refuse(scope, None, send, session, "body_timeout", 408, "body_timeout",
                                       f"the request body did not arrive within {BODY_TIMEOUT_S:g} s")
                    state["started"] = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body"):
                state["body_done"] = True
            return message

        async def tracked_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400 and not state["late"]:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DRAIN_S):
                        while not (state["body_done"] or state["late"]):
                            await timed_receive()
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"connection" for name, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            if state["late"]:
                return
            state["started"] = True
            await send(message)

        try:
            await self.app(scope, timed_receive, tracked_send)
        except Exception:
            if not state["late"]:
                raise


def _declared(scope: Scope) -> int:
    """The body bytes a request reserves: its ``Content-Length`` (0 past ``MAX_BODY_BYTES``: the route
    reads such a body on but keeps nothing), else ``MAX_BODY_BYTES``."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                size = int(value)
            except ValueError:
                return MAX_BODY_BYTES
            return size if 0 <= size <= MAX_BODY_BYTES else 0
    return MAX_BODY_BYTES


def _openai_error(path: str, status: int, message: str, code: str) -> dict[str, Any]:
    """OpenAI's error body (``Limiter``'s ``error`` when none is given)."""
    return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "api_error",
                      "code": code}}


async def _refuse(receive: Receive | None, send: Send, status: int, error: dict[str, Any]) -> None:
    """Answer ``status`` with the ``error`` body and close the connection; with ``receive``, first
    read the request's body on (keeping nothing, ``DRAIN_S`` at most: a client still sending would not
    read the answer). A flood's refusals do not wait: they must not hold connections."""
    if receive is not None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_S):
                while (message_in := await receive())["type"] == "http.request" and message_in.get("more_body"):
                    pass
    body = json.dumps(error).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
