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
- the address the host resolves to (IPv4 only): a loopback, link-local or unspecified one only when
  the allowing rule names the host exactly (``*`` and globs never reach the machine's own services
  or cloud metadata).

A refused request gets ``403`` with a text body saying what was refused and why; a refused
server name closes the tunnel. Every request becomes a ``NetworkRecord`` on its route (up to
``MAX_RECORDS``; more are counted in ``Route.dropped``). Closing a route closes its open tunnels.

Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import logging
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prefect_rollouts.config.network import NetworkPolicy, is_special_address
from prefect_rollouts.trace import NetworkRecord, Trace

logger = logging.getLogger("prefect_rollouts.egress")

MAX_HEAD_BYTES = 64 * 1024
"""The longest request head taken (431 above): a proxy request is a line and a few headers."""
HEAD_TIMEOUT_S = 30.0
"""A client that sends no complete request head within this many seconds is dropped."""
CONNECT_TIMEOUT_S = 30.0
"""Resolving and connecting to the upstream host, in seconds (then 502)."""
MAX_RECORDS = 10_000
"""Network records kept per rollout; a runtime opening more connections gets them counted, not kept."""
CHUNK_BYTES = 64 * 1024
NO_PROXY = "localhost,127.0.0.1,::1"
"""What goes direct: the loopback, where the program-harness endpoint's relay listens."""
_HOP_HEADERS = {"proxy-authorization", "proxy-connection", "connection", "keep-alive"}


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
    tunnels: set[asyncio.Task[None]] = field(default_factory=set)

    def record(self, record: NetworkRecord) -> None:
        if len(self.records) < MAX_RECORDS:
            self.records.append(record)
        else:
            self.dropped += 1


class EgressProxy:
    """The agent's egress proxy (module docstring): ``await listen(gateway)`` per Docker network,
    ``open_route`` / ``close_route`` per rollout, ``await stop()`` when the agent closes."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self._servers: dict[str, tuple[asyncio.Server, int]] = {}
        self._lock = asyncio.Lock()

    async def listen(self, host: str) -> int:
        """The port the proxy listens on at ``host`` (an IPv4 address of this machine), started once.

        Raises:
            OSError: ``host`` is not an address of this machine (a remote Docker engine).
        """
        async with self._lock:
            if host not in self._servers:
                server = await asyncio.start_server(self._serve, host, 0, limit=MAX_HEAD_BYTES, backlog=1024)
                self._servers[host] = (server, server.sockets[0].getsockname()[1])
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
            tunnel.cancel()

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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            except asyncio.LimitOverrunError:
                await _refuse(writer, 431, "Request Header Fields Too Large",
                              f"request head over {MAX_HEAD_BYTES} bytes")
                return
            request = _parse_head(head)
            if request is None:
                await _refuse(writer, 400, "Bad Request", "not an HTTP proxy request (an absolute http:// URL, or "
                              "CONNECT host:port for https)")
                return
            route = self._authorised(request.headers.get("proxy-authorization", ""))
            if route is None:
                await _refuse(writer, 407, "Proxy Authentication Required",
                              "this is a prefect-rollouts egress proxy; it serves its own rollouts only",
                              extra='Proxy-Authenticate: Basic realm="prefect-rollouts"\r\n')
                return
            task = asyncio.current_task()
            assert task is not None
            route.tunnels.add(task)
            try:
                await self._relay(route, request, reader, writer)
            finally:
                route.tunnels.discard(task)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
            pass   # the client went away or stalled: nothing to tell it
        finally:
            writer.close()

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

    async def _relay(self, route: Route, request: _Request, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        started = time.time()
        record = NetworkRecord(phase=route.phase, method=request.method, host=request.host[:255],
                               port=request.port, allowed=False, reason="", started_at=started)
        route.record(record)
        policy = route.policy
        scheme = "https" if request.method == "CONNECT" else "http"
        allowed, reason, rule = policy.decide(scheme, request.host, request.port)
        host_header = request.host_header
        if allowed and host_header is not None and host_header != request.host:
            allowed, why, _ = policy.decide(scheme, host_header, request.port)
            reason = reason if allowed else f"Host header {host_header[:255]!r}: {why}"
        record.reason = reason
        if not allowed:
            await _refuse(writer, 403, "Forbidden", f"{request.method} {request.host}:{request.port} denied: "
                          f"{reason} (this rollout's network policy, {route.phase} phase)")
            record.duration_s = time.time() - started
            return
        try:
            address = await _resolve(request.host, request.port)
            if is_special_address(address) and (rule is None or not rule.exact):
                record.allowed, record.reason = False, (f"{request.host} resolves to {address}, a loopback or "
                                                        "link-local address, which only a rule naming the host "
                                                        "exactly reaches")
                await _refuse(writer, 403, "Forbidden", f"{request.host}:{request.port} denied: {record.reason}")
                return
            record.allowed, record.address = True, address
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(address, request.port, limit=CHUNK_BYTES), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            record.allowed = True
            record.error = f"cannot reach {request.host}:{request.port}: {str(exc) or type(exc).__name__}"
            await _refuse(writer, 502, "Bad Gateway", record.error)
            record.duration_s = time.time() - started
            return
        try:
            if request.method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
                first = await _client_hello(reader)
                if first.sni is not None:
                    record.sni = first.sni[:255]
                    ok, why, _ = policy.decide("https", first.sni, request.port)
                    if not ok:
                        record.allowed, record.reason = False, f"TLS server name {first.sni[:255]!r}: {why}"
                        return
                upstream_writer.write(first.data)
                record.bytes_sent += len(first.data)
            else:
                upstream_writer.write(request.origin_head())
            await _pipe_both(reader, writer, upstream_reader, upstream_writer, record)
        finally:
            upstream_writer.close()
            record.duration_s = time.time() - started


@dataclass(slots=True)
class _Request:
    method: str
    target: str
    version: str
    host: str
    port: int
    headers: dict[str, str]
    lines: list[str]
    path: str = "/"

    @property
    def host_header(self) -> str | None:
        value = self.headers.get("host")
        if value is None:
            return None
        host = value.strip().lower()
        return host.rsplit(":", 1)[0] if host.count(":") == 1 else host

    def origin_head(self) -> bytes:
        """The request head for the upstream: origin form, hop-by-hop headers dropped, ``Connection: close``."""
        kept = [line for line in self.lines[1:] if line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
        return "\r\n".join([f"{self.method} {self.path} {self.version}", *kept, "Connection: close", "", ""]
                           ).encode("latin-1")


def _parse_head(head: bytes) -> _Request | None:
    lines = head.decode("latin-1").split("\r\n")[:-2]
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    method, target, version = parts
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            return None
        headers[name.strip().lower()] = value.strip()
    if method == "CONNECT":
        host, sep, digits = target.rpartition(":")
        if not sep or not digits.isdigit() or not 0 < int(digits) < 65536 or not host or host.startswith("["):
            return None
        return _Request(method, target, version, host.lower(), int(digits), headers, lines)
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        return None   # origin form (not a proxy request), or https:// which needs CONNECT
    try:
        port = url.port or 80
    except ValueError:
        return None
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    return _Request(method, target, version, url.hostname.lower(), port, headers, lines, path)


@dataclass(slots=True)
class _First:
    data: bytes
    sni: str | None


async def _client_hello(reader: asyncio.StreamReader) -> _First:
    """The client's first bytes in a tunnel and, for a TLS ClientHello, its server name."""
    first = await reader.read(1)
    if first != b"\x16":   # not a TLS handshake record (or the client closed)
        return _First(first, None)
    header = first + await reader.readexactly(4)
    length = int.from_bytes(header[3:5], "big")
    if length > 16 * 1024 + 2048:
        return _First(header, None)
    body = await reader.readexactly(length)
    return _First(header + body, server_name(body))


def server_name(handshake: bytes) -> str | None:
    """The ``server_name`` (RFC 6066) of a TLS ClientHello handshake message, else None.

    ``handshake``: the body of the first TLS record (type 1 message, its 4-byte header included).
    """
    try:
        if handshake[0] != 1:
            return None
        at = 4 + 2 + 32                                   # header, client version, random
        at += 1 + handshake[at]                           # session id
        at += 2 + int.from_bytes(handshake[at:at + 2], "big")   # cipher suites
        at += 1 + handshake[at]                           # compression methods
        end = at + 2 + int.from_bytes(handshake[at:at + 2], "big")
        at += 2
        while at + 4 <= end:
            kind, size = int.from_bytes(handshake[at:at + 2], "big"), int.from_bytes(handshake[at + 2:at + 4], "big")
            at += 4
            if kind == 0:   # server_name: list length, then (type 0, length, name)
                if handshake[at + 2] != 0:
                    return None
                name_length = int.from_bytes(handshake[at + 3:at + 5], "big")
                return handshake[at + 5:at + 5 + name_length].decode("ascii").lower().rstrip(".")
            at += size
    except (IndexError, UnicodeDecodeError):
        return None
    return None


async def _resolve(host: str, port: int) -> str:
    """The first IPv4 address of ``host`` (an IPv4 literal is itself, without a lookup)."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.IPv4Address(host))
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"{host}: no IPv4 address")
    return str(infos[0][4][0])


async def _pipe_both(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter,
                     record: NetworkRecord) -> None:
    """Copy both ways until the host is done (the runtime's EOF is passed on as a half-close)."""
    def count_sent(size: int) -> None:
        record.bytes_sent += size

    def count_received(size: int) -> None:
        record.bytes_received += size
    up = asyncio.ensure_future(_pipe(reader, upstream_writer, count_sent))
    down = asyncio.ensure_future(_pipe(upstream_reader, writer, count_received))
    try:   # the runtime's EOF is passed on and the host's answer awaited; the host's EOF ends both
        done, _ = await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        if up in done and not up.cancelled() and up.exception() is None:
            await asyncio.wait([down])
    finally:
        up.cancel()
        down.cancel()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, count: Callable[[int], None]) -> None:
    while chunk := await source.read(CHUNK_BYTES):
        count(len(chunk))
        sink.write(chunk)
        await sink.drain()
    if sink.can_write_eof():
        with contextlib.suppress(OSError):
            sink.write_eof()


async def _refuse(writer: asyncio.StreamWriter, status: int, phrase: str, message: str, extra: str = "") -> None:
    body = f"prefect-rollouts egress proxy: {message}\n".encode()
    writer.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n{extra}"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    with contextlib.suppress(Exception):
        await writer.drain()



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
    trace.network.extend(records)
    if route.dropped:
        trace.info["network_log_dropped"] = trace.info.get("network_log_dropped", 0) + route.dropped
        route.dropped = 0
