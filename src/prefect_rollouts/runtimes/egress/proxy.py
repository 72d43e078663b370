"""The egress proxy: the one way out of a runtime under a ``{ allow, block }`` network policy.

One ``EgressProxy`` per open agent, in the agent's event loop, listening on the host side of each
Docker network its rollouts' containers join (the network's gateway address, a free port). Each
rollout gets a ``Route``: the policy of its current phase and a credential of its own, exported in
the runtime as ``HTTP_PROXY`` / ``HTTPS_PROXY`` (and the lower-case names, which curl reads)
``http://<route id>:<credential>@<gateway>:<port>``, with ``NO_PROXY`` keeping loopback (the
program-harness endpoint's relay) direct. A request without a known credential gets 407.

What is checked (``NetworkPolicy.decide``; no TLS interception):

- ``CONNECT host:port`` (counted as https): the host and port of the request line; then, inside the
  tunnel, the TLS server name (SNI) of the client's ClientHello, when it sends one, against the
  same rules, so a tunnel to an allowed host cannot carry a handshake for a blocked one;
- a plain request ``GET http://host[:port]/path``: the request line's host and the ``Host`` header.
  It is sent upstream in origin form with ``Connection: close``, one request per connection.
- the address the host resolves to (IPv4 only; the proxy's ``resolver``, by default this machine's),
  the one connected to: a loopback, link-local or
  unspecified one, any address of this machine (an interface's, a Docker gateway's) or of a
  container on its bridges, only when the allowing rule names the host exactly, and the proxy's own
  ports never (``egress/address.py``): ``*`` and globs never reach the machine's own services, its
  containers or cloud metadata.

A refused request gets ``403`` with a text body saying what was refused and why; a refused
server name closes the tunnel. Every request becomes a ``NetworkRecord`` on its route (up to
``MAX_RECORDS``; more are counted in ``Route.dropped``). Closing a route closes its open tunnels.
One connection's states (head, checking, hello, body, relay) are ``egress/connection.py``; reading the
request head and the ClientHello is ``egress/wire.py``.

Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import secrets
from dataclasses import dataclass, field

from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import scrub
from prefect_rollouts.runtimes.egress.address import Resolver
from prefect_rollouts.runtimes.egress.connection import Connection
from prefect_rollouts.trace import NetworkRecord, Trace

MAX_RECORDS = 10_000
"""Network records kept per rollout; a runtime opening more connections gets them counted, not kept."""
NO_PROXY = "localhost,127.0.0.1,::1"
"""What goes direct: the loopback, where the program-harness endpoint's relay listens."""


@dataclass(eq=False)
class Route:
    """One rollout's way through the proxy.

    Attributes:
        id: Names the route in the credential's user part (not secret).
        credential: The secret half (``errors.EGRESS_CREDENTIAL`` form, scrubbed everywhere).
        policy: Checked for every request; the runtime replaces it when its phase changes.
        phase: Written on every record (``setup``, ``agent``, ``scoring``).
        records: What the proxy saw, in order.
        dropped: Records past ``MAX_RECORDS``, counted only.
    """

    policy: NetworkPolicy
    phase: str = "setup"
    id: str = field(default_factory=lambda: "r" + secrets.token_hex(8))
    credential: str = field(default_factory=lambda: "rollout-egress-" + secrets.token_hex(16))
    records: list[NetworkRecord] = field(default_factory=list)
    dropped: int = 0
    tunnels: set[Connection] = field(default_factory=set)
    """Its open connections, closed with the route."""

    def record(self, record: NetworkRecord) -> None:
        if len(self.records) < MAX_RECORDS:
            self.records.append(record)
        else:
            self.dropped += 1


class EgressProxy:
    """The agent's egress proxy (module docstring): ``await listen(gateway)`` per Docker network,
    ``open_route`` / ``close_route`` per rollout, ``await stop()`` when the agent closes.

    Args:
        resolver: Resolves each allowed request's host (``egress_address.Resolver``); None (an agent's
            proxy) uses the process's at each request: ``egress_address.use_resolver``'s, else this
            machine's. The address checks run on the address it returns.
    """

    def __init__(self, resolver: Resolver | None = None) -> None:
        self.resolver = resolver
        self._routes: dict[str, Route] = {}
        self._servers: dict[str, tuple[asyncio.Server, int]] = {}
        self.pending = 0
        """Connections not yet authenticated (``connection.MAX_PENDING``)."""
        self._lock = asyncio.Lock()
        self.ports: set[int] = set()
        """The ports it listens on: never a destination (``egress_address.refusal``)."""

    async def listen(self, host: str) -> int:
        """The port the proxy listens on at ``host`` (an IPv4 address of this machine), started once.

        Raises:
            OSError: ``host`` is not an address of this machine (a remote Docker engine).
        """
        async with self._lock:
            if host not in self._servers:
                server = await asyncio.get_running_loop().create_server(lambda: Connection(self), host, 0, backlog=1024)
                self._servers[host] = (server, server.sockets[0].getsockname()[1])
                self.ports.add(self._servers[host][1])
            return self._servers[host][1]

    def open_route(self, policy: NetworkPolicy, phase: str = "setup") -> Route:
        """A new route under ``policy``."""
        route = Route(policy, phase)
        self._routes[route.id] = route
        return route

    def close_route(self, route: Route) -> None:
        """Forget ``route`` and close its open connections (idempotent)."""
        self._routes.pop(route.id, None)
        for tunnel in list(route.tunnels):
            tunnel.close()

    @staticmethod
    def environment(route: Route, host: str, port: int) -> dict[str, str]:
        """The proxy variables a runtime's commands get for ``route`` via ``host:port``."""
        url = f"http://{route.id}:{route.credential}@{host}:{port}"
        return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
                "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY}

    async def stop(self) -> None:
        """Stop listening and close every route's connections; idempotent."""
        servers, self._servers = self._servers, {}
        for route in list(self._routes.values()):
            self.close_route(route)
        for server, _ in servers.values():
            server.close()
        for server, _ in servers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

    def _authorised(self, header: str) -> Route | None:
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        route = self._routes.get(user)
        return route if route is not None and hmac.compare_digest(password, route.credential) else None


def mark_phase(runtime: object, phase: str) -> None:
    """Write ``phase`` on the network records of ``runtime`` from now on (a runtime without a route: nothing)."""
    route: Route | None = getattr(runtime, "egress_route", None)   # docker under rules; others have none
    if route is not None:
        route.phase = phase


def take_network_log(runtime: object, trace: Trace) -> None:
    """Move the network records of ``runtime`` onto ``trace.network`` (and the count of dropped ones
    into ``trace.info["network_log_dropped"]``); a second call adds only what came since."""
    route: Route | None = getattr(runtime, "egress_route", None)
    if route is None:
        return
    records, route.records = route.records, []
    for record in records:   # the runtime chose these texts: its own credential may be among them
        record.host, record.reason = scrub(record.host), scrub(record.reason)
        record.sni = scrub(record.sni) if record.sni is not None else None
        record.error = scrub(record.error) if record.error is not None else None
    trace.network.extend(records)
    if route.dropped:
        trace.info["network_log_dropped"] = trace.info.get("network_log_dropped", 0) + route.dropped
        route.dropped = 0
