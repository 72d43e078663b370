"""The interception endpoint: the OpenAI-compatible server that program harnesses call instead of the model.

One per open agent that runs a program harness. Its host directories are under the temporary
directory, named ``rollout-<owner>-<random>.*`` so the janitor removes them when their owner is gone:

- ``directory`` (``.endpoint``): the in-runtime scripts (``programs/``), bind-mounted read-only into
  every container at ``MOUNT``, so no box can replace what another runs or write to the host
  through it. The local runtime reads it in place, as the same user: its scripts are read-only
  files, and ``verify`` (before every launch) puts back a script a program changed;
- ``sockets`` (``.sockets``): the endpoint's own socket ``s`` (for processes on this host) and one
  *door* per rollout (``new_door``), a directory
  bind-mounted read-only at ``DOOR_MOUNT`` into that rollout's runtime alone, where each launch
  gets a socket of its own (``open_session``). Connecting to a socket is not a write: a read-only
  bind still lets a box connect, and a rollout is known by the socket it came through.

Inside the runtime the launcher relays ``127.0.0.1:<port>`` to the door's socket, so the program
reaches the endpoint under every network policy and nothing else is exposed (no host port).

Routes: each wire dialect's (``dialects.served.DIALECTS``: ``POST /v1/chat/completions``,
streamed or not, ...) served by one handler (``_serve``), ``GET /v1/models``, and
``GET /prefect-rollouts/session`` (the launcher fetches the turn's prompt) and ``POST
/prefect-rollouts/session/end`` (the launcher saw the program exit); any other route is a 404 (a
known one with another method a 405) in the OpenAI error shape. A rollout is known by
its per-launch secret (``ProgramSession``), in its dialect's auth header; the provider key stays in this process, in the
agent's model client, through which every request goes upstream (retries, lanes, limits, scrubbing)
and is recorded on the trace like an in-process call (``harnesses.base.sample``). What the endpoint
rewrites and refuses is ``ProgramSession.exchange``'s docstring. Every request it refuses or does
not serve is recorded on its rollout's trace (``ProgramSession.refused``); one without a valid key
belongs to no rollout and is only counted (``InterceptionEndpoint.unknown_refused``). A route of any
dialect reads its body with ``endpoint_body.read_json`` (the nesting bound, ``nesting.MAX_JSON_DEPTH``; a
lone surrogate refused; the launch key scrubbed from every string and key).

Uvicorn serves it inside the agent's event loop, with its signal handling turned off: the eval's
own SIGINT/SIGTERM handling (``stop_signals``) must stay in charge. Connections, request heads,
requests in flight and body memory are bounded (``endpoint_limits``), for every rollout alone and
in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefect_rollouts.harnesses.dialects import Dialect
from prefect_rollouts.harnesses.dialects import chat as chat_dialect
from prefect_rollouts.harnesses.dialects import messages as messages_dialect
from prefect_rollouts.harnesses.dialects.served import DIALECTS, dialect_of
from prefect_rollouts.harnesses.endpoint_accept import Acceptor, connection_class
from prefect_rollouts.harnesses.endpoint_body import read_json
from prefect_rollouts.harnesses.endpoint_files import SOCKET_NAME, prepare, restore_scripts
from prefect_rollouts.harnesses.endpoint_limits import (
    MAX_BODY_BYTES,
    MAX_CONNECTIONS_PER_ROLLOUT,
    EndpointLimits,
    Limiter,
)
from prefect_rollouts.model.apis.base import NATIVE_KEY

if TYPE_CHECKING:
    from prefect_rollouts.harnesses.endpoint_accept import _Connection
    from prefect_rollouts.harnesses.session import ProgramSession

logger = logging.getLogger("prefect_rollouts.endpoint")

MOUNT = "/run/prefect-rollouts"
"""Where a container sees the endpoint's directory, read-only (the launcher and the other scripts)."""

DOOR_MOUNT = "/run/prefect-rollouts-door"
"""Where a container sees its rollout's door, read-only: the socket ``s`` of its current launch."""


SCRIPTS = ("launch.py", "bash_agent.py", "mini_swe_agent.py", "npm_agent.py")
"""The in-runtime scripts copied from ``harnesses/programs`` into the endpoint's directory."""


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to its host process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class InterceptionEndpoint:
    """The agent's interception endpoint: ``await start()``, ``open_session``/``close_session`` per
    program launch, ``await stop()``.

    Attributes:
        directory: The host directory holding the scripts (None before ``start``).
        sockets: The host directory holding the endpoint's socket and the rollouts' doors.
    """

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.sockets: Path | None = None
        self.sessions: dict[str, ProgramSession] = {}
        self.unknown_refused = 0
        """Requests refused without a valid key (401, or an unserved route): no rollout to record them on."""
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._acceptor: Acceptor | None = None
        self._doors: dict[str, tuple[Acceptor, Path]] = {}
        self._factory: Callable[[], _Connection] | None = None
        self._scripts: dict[str, bytes] = {}
        """The in-runtime scripts as started: ``verify`` compares the directory's copies with these."""
        self.limits = EndpointLimits()
        """Its connection, request and body-memory limits and what they refused (``endpoint_limits``)."""

    @property
    def socket_path(self) -> Path:
        """The Unix socket on the host."""
        if self.sockets is None:
            raise RuntimeError("the interception endpoint is not started")
        return self.sockets / SOCKET_NAME

    async def start(self) -> None:
        """Create the directory, copy the scripts into it and listen on its socket.

        Raises:
            OSError: the directory or the socket cannot be created.
        """
        directory, self.sockets, sock, self._scripts = await asyncio.to_thread(prepare, SCRIPTS)
        self.directory = directory
        app = Starlette(routes=[
            *(Route(path, functools.partial(self._serve, dialect=dialect), methods=["POST"])
              for dialect in DIALECTS for path in dialect.paths),
            Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/prefect-rollouts/session", self._session, methods=["GET"]),
            Route("/prefect-rollouts/session/end", self._end, methods=["POST"]),
        ], exception_handlers={404: self._unserved, 405: self._unserved})
        limited = Limiter(app, self.limits, lambda scope: self._find(Request(scope)),
                          lambda path, *error: dialect_of(path).error(*error))
        config = uvicorn.Config(limited, log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=30, timeout_graceful_shutdown=1,
                                http=(protocol := connection_class(self.limits)))
        self._server = server = _Server(config)
        self._serving = asyncio.create_task(server.serve(sockets=[]), name="interception-endpoint")
        while not server.started:
            if self._serving.done():
                sock.close()
                await self._serving   # raises what stopped it
                raise RuntimeError("the interception endpoint stopped while starting")
            await asyncio.sleep(0.005)
        self._factory = factory = functools.partial(protocol, config=config, server_state=server.server_state,
                                                    app_state={})
        self._acceptor = acceptor = Acceptor(sock, factory, self.limits)   # the server listens on none of its own
        acceptor.start()
        self._serving.add_done_callback(lambda _: acceptor.close())   # no server: no listener

    async def stop(self) -> None:
        """Stop serving and remove the directory; idempotent, completes under cancellation."""
        server, serving, self._server, self._serving = self._server, self._serving, None, None
        acceptor, self._acceptor = self._acceptor, None
        for listener in [acceptor, *(door for door, _ in self._doors.values())]:
            if listener is not None:
                listener.close()
        self._doors.clear()
        if server is not None and serving is not None:
            server.should_exit = True
            with contextlib.suppress(BaseException):
                await asyncio.shield(serving)
        for directory in (self.directory, self.sockets):
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
        self.directory = self.sockets = None
        if self.limits.refused:
            logger.warning("interception endpoint: refused %s", ", ".join(
                f"{count} ({reason})" for reason, count in sorted(self.limits.refused.items())))
        self.sessions.clear()

    def verify(self) -> list[str]:
        """Make the directory hold what this endpoint put there before a launch (blocking: file I/O).

        A program on the local runtime runs as this user and could replace a script (a container
        sees the directory read-only). A script whose bytes differ from the package's,
        or that is no longer a plain file, is written back (atomically, never through a link).

        Returns:
            The names of the scripts written back (a warning is logged for each).

        Raises:
            RuntimeError: the endpoint is not started.
        """
        if self.directory is None:
            raise RuntimeError("the interception endpoint is not started")
        return restore_scripts(self.directory, self._scripts)

    def new_door(self) -> Path:
        """A new, empty door: the host directory of one rollout's sockets, to bind read-only into its
        runtime (at ``DOOR_MOUNT``) and name in ``open_session``. Removed with the endpoint.

        Raises:
            RuntimeError: the endpoint is not started. OSError: the directory cannot be made.
        """
        if self.sockets is None:
            raise RuntimeError("the interception endpoint is not started")
        door = Path(tempfile.mkdtemp(prefix="door-", dir=self.sockets))
        door.chmod(0o755)   # a container's non-root user must reach the socket
        return door

    def close_door(self, door: Path) -> None:
        """Remove ``door`` (from ``new_door``) once its rollout is over, so an eval of many rollouts
        does not leave a directory per rollout until the agent stops."""
        shutil.rmtree(door, ignore_errors=True)

    def open_session(self, session: ProgramSession, door: Path | None = None) -> None:
        """Accept requests bearing ``session.secret`` from now on; with ``door`` (from ``new_door``),
        serve them on a socket of their own there, ``door/s`` (replacing whatever is there), counted as
        the rollout's from ``accept`` (``endpoint_limits.Acceptor``).

        Raises:
            OSError: the door's socket cannot be made.
        """
        if door is not None:
            assert self._factory is not None, "start() runs first"
            path = door / SOCKET_NAME
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(str(path))
                os.chmod(path, 0o777)   # connecting needs write permission on the socket
                sock.listen(MAX_CONNECTIONS_PER_ROLLOUT)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            acceptor = Acceptor(sock, self._factory, self.limits, session)
            acceptor.start()
            self._doors[session.secret] = (acceptor, path)
        self.sessions[session.secret] = session

    def close_session(self, session: ProgramSession) -> None:
        """Refuse ``session.secret`` from now on (401) and close its door's socket (its connections
        end on their own: a request gets 401, an idle one its keep-alive timeout)."""
        self.sessions.pop(session.secret, None)
        door = self._doors.pop(session.secret, None)
        if door is not None:
            door[0].close()
            with contextlib.suppress(OSError):
                door[1].unlink()

    def _find(self, request: Request) -> ProgramSession | None:
        """The session whose key the request bears, in any dialect's auth header (for the limits and
        the routes of no dialect)."""
        for dialect in DIALECTS:
            key = dialect.key(request.headers)
            if key is not None and (session := self.sessions.get(key)) is not None:
                return session
        return None

    def _refuse(self, request: Request, session: ProgramSession | None, status: int, message: str,
                code: str | None = None, dialect: Dialect = chat_dialect.DIALECT) -> JSONResponse:
        """The error response in ``dialect``'s shape, recorded on ``session``'s trace (counted when
        there is none)."""
        if session is None:
            self.unknown_refused += 1
        else:
            session.refused(request.method, request.url.path, status, message)
        return JSONResponse(dialect.error(status, message, code), status_code=status)

    async def _unserved(self, request: Request, exc: Exception) -> Response:
        """Starlette's 404 (no route) and 405 (a route, another method), in the error shape of the path's
        dialect (``dialect_of``)."""
        status = getattr(exc, "status_code", 404)
        asked = f"{request.method} {request.url.path}"
        what = "a route of this endpoint, but not with this method" if status == 405 else "not served here"
        served = ", ".join(f"{'/'.join(sorted(set(route.methods or ()) - {'HEAD'}))} {route.path}"
                           for route in request.app.routes if getattr(route, "path", "").startswith("/v1/"))
        return self._refuse(request, self._find(request), status, f"{asked[:200]} is {what}: this endpoint "
                            f"serves {served}", "not_found" if status == 404 else None, dialect_of(request.url.path))

    async def _serve(self, request: Request, dialect: Dialect) -> Response:
        """One model request in ``dialect``: its key (401), its body (413 past ``MAX_BODY_BYTES``; 400
        not JSON or not translatable), the exchange, the answer (JSON or a stream); every refusal in
        the dialect's error shape, recorded on the trace (``_refuse``)."""
        session = self.sessions.get(dialect.key(request.headers) or "")
        if session is None:
            return self._refuse(request, None, 401, "unknown or expired API key: this endpoint serves the "
                                "rollouts of one agent, each with the key it was launched with (OPENAI_API_KEY, "
                                "ANTHROPIC_API_KEY)",
                                "invalid_api_key", dialect)
        raw, size = await _read_capped(request)
        if raw is None:
            return self._refuse(request, session, 413, f"the request body is {size} bytes; this endpoint takes "
                                f"at most {MAX_BODY_BYTES} (MAX_BODY_BYTES)", "request_too_large", dialect)
        try:
            body = read_json(raw, session.secret)   # the launch key scrubbed from every string and key
            chat, lost = dialect.to_chat(body, session.upstream_api)
        except ValueError as exc:   # a JSONRefused names its status: 413 for too many values
            status = getattr(exc, "status", 400)
            return self._refuse(request, session, status, str(exc),
                                "request_too_large" if status == 413 else "invalid_request", dialect)
        headers = dialect.recorded(request.headers, session.secret)
        if isinstance(chat, dict) and isinstance(chat.get(NATIVE_KEY), dict):   # the client's own API: sent on
            chat[NATIVE_KEY]["headers"], headers = headers, {}
        translated = None if dialect is chat_dialect.DIALECT and not lost else {"dialect": dialect.name, **lost,
                                                                               **headers}
        status, payload = await session.exchange(chat, raw, request.headers, translated, dialect.alternates)
        if status != 200:
            error = payload["error"]
            stopped = None
            if error["code"] == "rollout_stopped":   # it must end the program: the SDKs obey x-should-retry
                status, stopped = dialect.stop_status, {"x-should-retry": "false"}
            if error["code"] != "upstream_error":   # a failed upstream call is a recorded model call
                session.refused(request.method, request.url.path, status, error["message"])
            return JSONResponse(dialect.error(status, error["message"], error["code"]), status_code=status,
                                headers=stopped)
        answer = dialect.from_chat(payload, body)
        if dialect.streams(body):
            # the answer is finished: its events go in one write (an event per write cost 1-2 ms CPU a call)
            return Response("".join(dialect.events(answer, body)), media_type="text/event-stream")
        return JSONResponse(answer)

    async def _count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, an estimate
        (``dialects.messages.count_tokens``); not a model call (no upstream request, not counted against
        ``max_turns``), counted on the trace as ``info["endpoint"]["count_tokens"]``."""
        dialect = messages_dialect.DIALECT
        session = self.sessions.get(dialect.key(request.headers) or "")
        if session is None:
            return self._refuse(request, None, 401, "unknown or expired API key", "invalid_api_key", dialect)
        raw, size = await _read_capped(request)
        if raw is None:
            return self._refuse(request, session, 413, f"the request body is {size} bytes; this endpoint takes "
                                f"at most {MAX_BODY_BYTES} (MAX_BODY_BYTES)", "request_too_large", dialect)
        try:
            tokens = messages_dialect.count_tokens(read_json(raw, session.secret))
        except ValueError as exc:
            status = getattr(exc, "status", 400)
            return self._refuse(request, session, status, str(exc),
                                "request_too_large" if status == 413 else "invalid_request", dialect)
        record = session.ctx.trace.info.setdefault("endpoint", {})
        record["count_tokens"] = record.get("count_tokens", 0) + 1
        return JSONResponse({"input_tokens": tokens})

    async def _models(self, request: Request) -> Response:
        session = self._find(request)
        if session is None:
            return self._refuse(request, None, 401, "unknown or expired API key", "invalid_api_key")
        model = session.ctx.config.model
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                                         "owned_by": "prefect-rollouts"}]})

    async def _end(self, request: Request) -> Response:
        """The launcher saw the program exit: refuse its key from now on (a left-behind process)."""
        session = self._find(request)
        if session is not None:
            self.close_session(session)
        return Response(status_code=204)

    async def _session(self, request: Request) -> Response:
        session = self._find(request)
        if session is None:
            return self._refuse(request, None, 401, "unknown or expired API key", "invalid_api_key")
        return JSONResponse({"prompt": session.prompt, "system_prompt": session.system_prompt,
                             "model": session.ctx.config.model})


async def _read_capped(request: Request) -> tuple[bytes | None, int]:
    """``(the request's body, its size)``, the body None past ``MAX_BODY_BYTES``: past the cap it reads
    on but keeps nothing
    (a client still sending would not read the 413, and the relay would stall)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= MAX_BODY_BYTES:
            chunks.append(chunk)
    return (None if size > MAX_BODY_BYTES else b"".join(chunks)), size


