"""Issue 23: the egress proxy on loopback (``runtimes/egress.py``): credentials, rules from the request
line, the Host header and the TLS server name, the network log. Docker's half is tests/docker/test_network_policy.py."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator

import httpx
import pytest

from prefect_rollouts import NetworkPolicy
from prefect_rollouts.errors import scrub
from prefect_rollouts.runtimes.egress import EgressProxy, Route, server_name

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


async def _echo_or_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An HTTP/1.0 server answering ``hello <path>``; bytes that are not HTTP are echoed back."""
    first = await reader.read(65536)
    if first.startswith((b"GET ", b"POST ")):
        path = first.split(b" ")[1]
        body = b"hello " + path
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    else:
        while first:
            writer.write(first)
            await writer.drain()
            first = await reader.read(65536)
    await writer.drain()
    writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo_or_http, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[EgressProxy, int]]:
    egress = EgressProxy()
    port = await egress.listen("127.0.0.1")
    yield egress, port
    await egress.stop()


def proxy_url(route: Route, port: int) -> str:
    return EgressProxy.environment(route, "127.0.0.1", port)["HTTP_PROXY"]


async def connect(port: int, target: str,
                  route: Route | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = "" if route is None else "Proxy-Authorization: Basic " + base64.b64encode(
        f"{route.id}:{route.credential}".encode()).decode() + "\r\n"
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    return reader, writer, head


def client_hello(name: str) -> bytes:
    """A real TLS ClientHello for ``name`` (Python's ssl, no network)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def test_a_plain_request_goes_through_only_when_allowed_and_each_is_logged(proxy, upstream):
    egress, port = proxy
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{upstream}"]}), phase="agent")
    async with httpx.AsyncClient(proxy=proxy_url(route, port), timeout=10) as client:
        answer = await client.get(f"http://127.0.0.1:{upstream}/simple")
        denied = await client.get(f"http://127.0.0.1:{upstream + 1 if upstream < 65535 else 1}/x")
    assert answer.status_code == 200 and answer.text == "hello /simple"
    assert denied.status_code == 403 and "denied: no allow rule names" in denied.text and "agent phase" in denied.text
    first, second = route.records
    assert (first.allowed, first.method, first.host, first.port, first.address) == (True, "GET", "127.0.0.1", upstream,
                                                                                     "127.0.0.1")
    assert first.bytes_received > len("hello /simple") and first.bytes_sent == 0 and first.phase == "agent"
    assert not second.allowed and second.address is None


async def test_a_request_without_the_routes_credential_gets_407(proxy, upstream):
    egress, port = proxy
    route = egress.open_route(NetworkPolicy.model_validate({"allow": ["*"]}))
    stranger = Route(route.policy, id=route.id)   # the right user, another secret
    for who in (None, stranger):
        _, writer, head = await connect(port, f"127.0.0.1:{upstream}", who)
        assert head.startswith(b"HTTP/1.1 407") and b"Proxy-Authenticate: Basic" in head
        writer.close()
    egress.close_route(route)
    _, writer, head = await connect(port, f"127.0.0.1:{upstream}", route)   # a closed route is unknown
    assert head.startswith(b"HTTP/1.1 407")
    writer.close()
    assert route.records == []


async def test_a_tunnel_carries_bytes_and_checks_the_tls_server_name(proxy, upstream):
    egress, port = proxy
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{upstream}", "allowed.test:443"],
                                                            "block": ["blocked.test"]}))
    reader, writer, head = await connect(port, f"127.0.0.1:{upstream}", route)
    assert head.startswith(b"HTTP/1.1 200")
    writer.write(b"ping\n")
    assert await reader.readexactly(5) == b"ping\n"
    writer.close()
    reader, writer, head = await connect(port, f"127.0.0.1:{upstream}", route)   # allowed host, blocked SNI
    hello = client_hello("blocked.test")
    writer.write(hello)
    assert await reader.read() == b""   # the tunnel is closed, nothing of the hello came back
    writer.close()
    await asyncio.sleep(0)
    tunnel, fronted = route.records
    assert tunnel.allowed and tunnel.bytes_sent == 5 and tunnel.bytes_received == 5 and tunnel.sni is None
    assert not fronted.allowed and fronted.sni == "blocked.test"
    assert "TLS server name 'blocked.test': blocked by rule 'blocked.test'" in fronted.reason


def test_the_server_name_is_read_from_a_real_client_hello():
    hello = client_hello("Files.PythonHosted.org")
    assert hello[0] == 0x16 and server_name(hello[5:]) == "files.pythonhosted.org"
    assert server_name(b"\x01\x00") is None and server_name(b"GET / HTTP/1.1") is None


async def test_a_glob_never_reaches_loopback_but_an_exact_rule_does(proxy, upstream):
    egress, port = proxy
    everything = egress.open_route(NetworkPolicy.model_validate({"allow": ["*"]}))
    reader, writer, head = await connect(port, f"localhost:{upstream}", everything)
    assert head.startswith(b"HTTP/1.1 403") and b"loopback or link-local" in await reader.read()
    writer.close()
    exact = egress.open_route(NetworkPolicy.model_validate({"allow": [f"localhost:{upstream}"]}))
    _, writer, head = await connect(port, f"localhost:{upstream}", exact)
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()
    assert not everything.records[0].allowed and exact.records[0].address == "127.0.0.1"


async def test_a_host_header_naming_a_blocked_host_is_refused(proxy, upstream):
    egress, port = proxy
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{upstream}"]}))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = base64.b64encode(f"{route.id}:{route.credential}".encode()).decode()
    writer.write(f"GET http://127.0.0.1:{upstream}/ HTTP/1.1\r\nHost: blocked.test\r\n"
                 f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 403") and b"Host header 'blocked.test'" in answer


async def test_closing_a_route_closes_its_open_tunnels(proxy, upstream):
    egress, port = proxy
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{upstream}"]}))
    reader, writer, head = await connect(port, f"127.0.0.1:{upstream}", route)
    writer.write(b"x")
    assert await reader.readexactly(1) == b"x"
    egress.close_route(route)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


def test_the_credential_is_scrubbed_wherever_text_is_recorded():
    route = Route(NetworkPolicy.model_validate({"allow": []}))
    environment = EgressProxy.environment(route, "172.17.0.1", 3128)
    assert environment["NO_PROXY"] == environment["no_proxy"] == "localhost,127.0.0.1,::1"
    printed = "\n".join(f"{key}={value}" for key, value in environment.items())
    assert route.credential in printed and route.credential not in scrub(printed)
    assert route.credential[:20] not in scrub(printed)
