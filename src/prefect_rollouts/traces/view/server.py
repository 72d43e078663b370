"""The viewer served over HTTP on loopback: Starlette routes, run by uvicorn in this process.

Each launch makes a token (``secrets.token_urlsafe``) that every request must carry (``?token=``; the
page's script passes it on), so another local user or a web page in the browser cannot read the
dataset through the port; ``TrustedHostMiddleware`` refuses a Host header other than the loopback names
(DNS rebinding). The uvicorn access log is off: it would print the token.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from prefect_rollouts.errors import ConfigError, TraceStoreError
from prefect_rollouts.traces.view.data import Dataset
from prefect_rollouts.traces.view.page import content_security_policy, finite, render_page

LOOPBACK_NAMES = ["127.0.0.1", "localhost", "[::1]", "::1"]
"""Host headers a loopback-bound viewer answers."""


def make_app(dataset: Dataset, token: str, *, run_id: str | None = None,
             allowed_hosts: list[str] | None = None) -> Starlette:
    """The viewer's Starlette app: ``/`` the page, ``/api/runs``, ``/api/rollouts?run=``,
    ``/api/rollout?run=&id=``, ``/api/compare?a=&b=`` (JSON). A request without ``token`` (or with any
    other, non-ASCII too) gets 403; a Host header outside ``allowed_hosts`` (default ``LOOPBACK_NAMES``)
    gets 400, and so does a request lacking a parameter its view needs (naming it); an unknown run 404."""
    answered: dict[tuple[Any, ...], bytes] = {}
    headers = {"Content-Security-Policy": content_security_policy(served=True), "X-Content-Type-Options": "nosniff",
               "Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "X-Frame-Options": "DENY"}

    def guarded(view: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            given = request.query_params.get("token", "").encode("utf-8", "surrogatepass")
            if not secrets.compare_digest(given, token.encode()):   # bytes: a str with non-ASCII text raises
                return PlainTextResponse("a token is required: open the URL `prefect-rollouts traces view` printed",
                                         status_code=403, headers=headers)

            key = (request.url.path, tuple(sorted((k, v) for k, v in request.query_params.items() if k != "token")))
            if key in answered:   # the dataset does not change while it is viewed
                return Response(answered[key], media_type="application/json", headers=headers)
            try:
                result = await run_in_threadpool(view, request)   # Dataset locks what it keeps
            except MissingParameter as exc:
                return PlainTextResponse(f"{request.url.path} needs the parameter {exc.args[0]}: add "
                                         f"{exc.args[0]}=... to the query", status_code=400, headers=headers)
            except (ConfigError, KeyError) as exc:
                return PlainTextResponse(str(exc), status_code=404, headers=headers)
            except TraceStoreError as exc:
                return PlainTextResponse(str(exc), status_code=500, headers=headers)
            if isinstance(result, str):
                return HTMLResponse(result, headers=headers)
            answered[key] = await run_in_threadpool(_json, result)
            return Response(answered[key], media_type="application/json", headers=headers)
        return endpoint

    def one(request: Request) -> Any:
        run, rollout_id = param(request, "run"), param(request, "id")
        found = dataset.rollout(run, rollout_id)
        if found is None:
            raise KeyError(f"no rollout {rollout_id} in run {run}")
        return found

    routes = [
        Route("/", guarded(lambda r: render_page({"mode": "server", "token": token, "run": run_id}, served=True))),
        Route("/api/runs", guarded(lambda r: dataset.runs())),
        Route("/api/rollouts", guarded(lambda r: dataset.rollouts(param(r, "run")))),
        Route("/api/plots", guarded(lambda r: dataset.plots(param(r, "run")))),
        Route("/api/rollout", guarded(one)),
        Route("/api/compare", guarded(lambda r: dataset.compare(param(r, "a"), param(r, "b")))),
    ]
    hosts = allowed_hosts or LOOPBACK_NAMES
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)])


class MissingParameter(LookupError):
    """A request lacks a query parameter its view needs (``args[0]``: its name); answered 400."""


def param(request: Request, name: str) -> str:
    """Query parameter ``name`` of ``request``; ``MissingParameter`` when absent."""
    value = request.query_params.get(name)
    if value is None:
        raise MissingParameter(name)
    return value


def _json(value: Any) -> bytes:
    return json.dumps(finite(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: one the system picks).

    Raises:
        ConfigError: the address cannot be bound (in use, not an address of this machine, a port outside
            0-65535).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:   # OverflowError: a port outside 0-65535
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({exc}). Choose another port, or "
                          "--port 0 for a free one") from exc
    sock.listen(64)
    return sock


def url(sock: socket.socket, token: str, run_id: str | None = None) -> str:
    """The address to open: ``http://HOST:PORT/?token=...`` (and ``#/run/<run>`` for a run)."""
    from urllib.parse import quote

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?token={token}" + (f"#/run/{quote(run_id, safe='')}" if run_id else "")


def warm(dataset: Dataset, run_id: str | None) -> None:
    """Compute what the first page shows; a failure here is left for the request that asks to report."""
    try:
        run = run_id or dataset.run_ids()[-1]
        dataset.table(run)
        dataset.runs()
        dataset.plots(run)
    except Exception:   # the page's own request shows the error
        return


def serve(dataset: Dataset, sock: socket.socket, token: str, *, run_id: str | None = None,
          allowed_hosts: list[str] | None = None) -> None:
    """Serve the viewer on ``sock`` until interrupted (Ctrl-C), computing in the background meanwhile what
    the first page needs (run ``run_id``'s table, else the latest run's; the runs' summaries; the plots)."""
    import uvicorn

    threading.Thread(target=warm, args=(dataset, run_id), daemon=True, name="viewer-warm").start()
    app = make_app(dataset, token, run_id=run_id, allowed_hosts=allowed_hosts)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
