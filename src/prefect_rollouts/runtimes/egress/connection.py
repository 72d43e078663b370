"""One connection from a runtime to the egress proxy: the request head, the checks, the ClientHello of a
tunnel, then a relay to the host, protocol to protocol (``proxy.py`` has what is checked and why).

Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from prefect_rollouts.runtimes.egress.address import refusal, resolve_with
from prefect_rollouts.runtimes.egress.wire import MAX_HELLO_BYTES, client_hello, parse_head
from prefect_rollouts.trace import NetworkRecord

if TYPE_CHECKING:
    from prefect_rollouts.runtimes.egress.proxy import EgressProxy, Route

logger = logging.getLogger("prefect_rollouts.egress")

MAX_HEAD_BYTES = 64 * 1024
"""The longest request head taken (431 above): a proxy request is a line and a few headers."""
HEAD_TIMEOUT_S = 10.0
"""A client that sends no complete request head (or, in a tunnel, no complete TLS ClientHello once
it began one) within this many seconds is dropped."""
MAX_PENDING = 1024
"""Connections the proxy holds before they have authenticated; more are dropped at once, so one
runtime cannot use up the agent's file descriptors."""
MAX_TUNNELS_PER_ROUTE = 256
"""Connections one rollout may have open through the proxy at once (more get 503, and a record)."""
CONNECT_TIMEOUT_S = 30.0
"""Resolving and connecting to the upstream host, in seconds (then 502)."""
CHUNK_BYTES = 64 * 1024


class Connection(asyncio.Protocol):
    """One connection from a runtime: the request head, the checks (in a task), then a relay.

    Relaying is protocol to protocol (``data_received`` writes straight into the other transport,
    with each side's write buffer pausing the other's reading), not streams: a stream hop cost
    several times the CPU per chunk (``benchmarks/egress_proxy.py``).
    """

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.route: Route | None = None
        self.record: NetworkRecord | None = None
        self.state = "head"            # head -> checking -> hello (CONNECT) -> relay -> closed
        self.buffer = bytearray()
        self.job: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.started = time.time()
        self.pending = False
        self.body_left = 0
        """A plain request: bytes of its body still to send upstream; what comes after is dropped."""
        self.sent = self.received = 0
        """Bytes each way, written on the record when the connection closes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.proxy.pending >= MAX_PENDING:
            self.state = "closed"
            transport.abort()
            return
        self.proxy.pending += 1
        self.pending = True
        self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self.close)

    def _authenticated(self) -> None:
        if self.pending:
            self.pending = False
            self.proxy.pending -= 1

    def data_received(self, data: bytes) -> None:
        if self.state == "relay":   # the hot path: plain ints, no checks (a record's attribute costs more)
            self.sent += len(data)
            self.upstream.write(data)   # type: ignore[union-attr]
            return
        if self.state == "body":
            self._send_body(data)
            return
        if self.state == "closed":
            return
        self.buffer += data
        if self.state == "head":
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    self.refuse(431, "Request Header Fields Too Large", f"request head over {MAX_HEAD_BYTES} bytes")
                return
            head, self.buffer = bytes(self.buffer[:end + 4]), self.buffer[end + 4:]
            self.state = "checking"
            self._pause()
            self.job = asyncio.ensure_future(self._check(head))
        elif self.state == "hello":
            self._hello()

    def eof_received(self) -> bool:
        if self.state == "body":
            return True   # the request is sent; its answer still comes back
        if self.state == "relay" and self.upstream is not None and self.upstream.can_write_eof():
            self.upstream.write_eof()   # the runtime is done sending; the answer still comes back
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    def _pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def close(self) -> None:
        """End the connection both ways (a route closing, a timeout, either side gone); idempotent."""
        if self.state == "closed":
            return
        self.state = "closed"
        self._authenticated()
        for handle in (self.timer, self.job):
            if handle is not None:
                handle.cancel()
        if self.route is not None:
            self.route.tunnels.discard(self)
        if self.record is not None:
            self.record.duration_s = time.time() - self.started
            self.record.bytes_sent, self.record.bytes_received = self.sent, self.received
        for transport in (self.transport, self.upstream):
            if transport is not None:
                transport.close()

    def refuse(self, status: int, phrase: str, message: str, extra: str = "") -> None:
        body = f"prefect-rollouts egress proxy: {message}\n".encode()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n{extra}"
                                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        self.close()

    async def _check(self, head: bytes) -> None:
        try:
            request = parse_head(head)
        except ValueError as exc:
            self.refuse(400, "Bad Request", str(exc))
            return
        route = self.proxy._authorised(request.headers.get("proxy-authorization", ""))
        if route is None:
            self.refuse(407, "Proxy Authentication Required",
                        "this is a prefect-rollouts egress proxy; it serves its own rollouts only",
                        extra='Proxy-Authenticate: Basic realm="prefect-rollouts"\r\n')
            return
        if self.timer is not None:
            self.timer.cancel()
        self._authenticated()
        self.route = route
        self.record = record = NetworkRecord(phase=route.phase, method=request.method, host=request.host[:255],
                                             port=request.port, allowed=False, reason="", started_at=self.started)
        route.record(record)
        if len(route.tunnels) >= MAX_TUNNELS_PER_ROUTE:
            record.reason = f"more than {MAX_TUNNELS_PER_ROUTE} connections of this rollout open at once"
            self.refuse(503, "Service Unavailable", record.reason)
            return
        route.tunnels.add(self)
        policy, scheme = route.policy, "https" if request.method == "CONNECT" else "http"
        allowed, reason, rule = policy.decide(scheme, request.host, request.port)
        host_header = request.host_header
        if allowed and host_header is not None and host_header != request.host:
            allowed, why, _ = policy.decide(scheme, host_header, request.port)
            reason = reason if allowed else f"Host header {host_header[:255]!r}: {why}"
        record.reason = reason
        if not allowed:
            self.refuse(403, "Forbidden", f"{request.method} {request.host[:255]}:{request.port} denied: {reason} "
                        f"(this rollout's network policy, {route.phase} phase)")
            return
        try:
            address = await asyncio.wait_for(resolve_with(self.proxy.resolver, request.host, request.port),
                                             CONNECT_TIMEOUT_S)
            if refused := refusal(request.host[:255], address, request.port, rule, self.proxy.ports):
                record.reason = refused
                self.refuse(403, "Forbidden", f"{request.host[:255]}:{request.port} denied: {refused}")
                return
            record.allowed, record.address = True, address
            loop = asyncio.get_running_loop()
            upstream, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _Upstream(self), address, request.port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            record.error = f"cannot reach {request.host[:255]}:{request.port}: {str(exc) or type(exc).__name__}"
            self.refuse(502, "Bad Gateway", record.error)
            return
        if self.state == "closed":   # the runtime went away while this connected
            upstream.close()
            return
        self.upstream = upstream
        assert self.transport is not None
        if request.method == "CONNECT":
            self.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.state = "hello"
            self._hello()
        else:
            upstream.write(request.origin_head())
            self.state, self.body_left = "body", request.content_length
            body, self.buffer = bytes(self.buffer), bytearray()
            self._send_body(body)
        self._resume()

    def _send_body(self, data: bytes) -> None:
        """A plain request's body goes upstream, up to its ``Content-Length``; bytes after it (a
        pipelined second request, which would escape the checks) are dropped."""
        assert self.upstream is not None and self.record is not None
        part = data[:self.body_left]
        if part:
            self.body_left -= len(part)
            self.sent += len(part)
            self.upstream.write(part)

    def _hello(self) -> None:
        """In a tunnel: wait for the client's whole TLS ClientHello (it may span several records),
        check its server name, then relay; bytes that are not TLS are relayed as they are (the
        tunnel's host and port were checked). A ClientHello that cannot be read closes the tunnel."""
        route, record = self.route, self.record
        assert route is not None and record is not None
        status, name = client_hello(self.buffer)
        if status == "wait":
            if self.timer is None and self.buffer:
                self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self.close)
            return
        if self.timer is not None:
            self.timer.cancel()
        if status == "bad":
            record.allowed, record.reason = False, ("the TLS ClientHello could not be read (malformed, cut short or "
                                                    f"over {MAX_HELLO_BYTES} bytes), so its server name is unknown")
            self.close()
            return
        if name is not None:
            record.sni = name[:255]
            ok, why, _ = route.policy.decide("https", name, record.port)
            if not ok:
                record.allowed, record.reason = False, f"TLS server name {name[:255]!r}: {why}"
                self.close()
                return
        self._relay()

    def _relay(self) -> None:
        assert self.upstream is not None and self.record is not None
        self.state = "relay"
        if self.buffer:
            self.sent += len(self.buffer)
            self.upstream.write(bytes(self.buffer))
            self.buffer = bytearray()


class _Upstream(asyncio.Protocol):
    """The proxy's connection to the host: what comes back goes straight to the runtime."""

    def __init__(self, client: Connection) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        client = self.client
        client.received += len(data)
        client.transport.write(data)   # type: ignore[union-attr]

    def eof_received(self) -> bool:
        return False   # the host is done: close, which ends the runtime's side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()

    def pause_writing(self) -> None:
        self.client._pause()

    def resume_writing(self) -> None:
        if self.client.state == "relay":
            self.client._resume()
