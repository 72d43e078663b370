"""Issue 23: the egress proxy on loopback (``runtimes/egress.py``): credentials, rules from the request
line, the Host header and the TLS server name, the network log. Docker's half is tests/docker/test_network_policy.py."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator

import httpx
import pytest

from prefect_rollouts import NetworkPolicy
from prefect_rollouts.errors import scrub
from prefect_rollouts.runtimes.egress.address import is_host_address, resolve, use_resolver
from prefect_rollouts.runtimes.egress.proxy import EgressProxy, Route
from prefect_rollouts.runtimes.egress.wire import server_name
from tests.support.waiting import within

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
    # the tunnel is closed, nothing of the hello came back
    assert await within(reader.read(), 5, "the proxy to close the tunnel") == b""
    writer.close()
    await asyncio.sleep(0)
    tunnel, fronted = route.records
    assert tunnel.allowed and tunnel.bytes_sent == 5 and tunnel.bytes_received == 5 and tunnel.sni is None
    assert not fronted.allowed and fronted.sni == "blocked.test"
    assert "TLS server name 'blocked.test': blocked by rule 'blocked.test'" in fronted.reason


def test_the_server_name_is_read_from_a_real_client_hello():
    hello = client_hello("Files.PythonHosted.org")
    assert hello[0] == 0x16 and server_name(hello[5:]) == "files.pythonhosted.org"
    for broken in (b"\x01\x00", b"GET / HTTP/1.1", hello[5:-20]):
        with pytest.raises(ValueError):
            server_name(broken)


async def test_a_glob_never_reaches_loopback_but_an_exact_rule_does(proxy, upstream):
    egress, port = proxy
    everything = egress.open_route(NetworkPolicy.model_validate({"allow": ["*"]}))
    reader, writer, head = await connect(port, f"localhost:{upstream}", everything)
    assert head.startswith(b"HTTP/1.1 403")
    assert b"loopback or link-local" in await within(reader.read(), 5, "the refusal's end")
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
    answer = await within(reader.read(), 5, "the refusal's end")
    writer.close()
    assert answer.startswith(b"HTTP/1.1 403") and b"Host header 'blocked.test'" in answer


async def test_closing_a_route_closes_its_open_tunnels(proxy, upstream):
    egress, port = proxy
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{upstream}"]}))
    reader, writer, _ = await connect(port, f"127.0.0.1:{upstream}", route)
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


def split_records(hello: bytes, at: int) -> bytes:
    """``hello`` (one TLS record) as two records, the handshake cut ``at`` bytes in."""
    body = hello[5:]
    return b"".join(b"\x16" + hello[1:3] + len(part).to_bytes(2, "big") + part for part in (body[:at], body[at:]))


async def test_a_client_hello_split_over_records_is_joined_and_checked_and_garbage_closes_the_tunnel(proxy, upstream):
    egress, port = proxy
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{upstream}"],
                                                            "block": ["blocked.test"]}))
    for payload in (split_records(client_hello("blocked.test"), 10), b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00"):
        reader, writer, head = await connect(port, f"127.0.0.1:{upstream}", route)
        assert head.startswith(b"HTTP/1.1 200")
        writer.write(payload)
        assert await asyncio.wait_for(reader.read(), 5) == b""   # closed, nothing echoed
        writer.close()
    split, garbage = route.records
    assert (split.sni, split.allowed) == ("blocked.test", False) and "blocked by rule" in split.reason
    assert not garbage.allowed and "ClientHello could not be read" in garbage.reason
    reader, writer, head = await connect(port, f"127.0.0.1:{upstream}", route)   # split, and allowed: relayed
    allowed = split_records(client_hello("127.0.0.1"), 40)
    writer.write(allowed)
    assert await asyncio.wait_for(reader.readexactly(len(allowed)), 5) == allowed
    writer.close()


async def request(port: int, route: Route, text: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = base64.b64encode(f"{route.id}:{route.credential}".encode()).decode()
    writer.write(text.replace("AUTH", f"Proxy-Authorization: Basic {auth}").encode())
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_a_request_the_proxy_cannot_check_is_refused_and_a_pipelined_one_never_leaves(proxy):
    egress, port = proxy
    heads: list[bytes] = []

    async def recording(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.3)   # everything the proxy will ever send has arrived
        heads.append(await reader.read(65536))
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
        writer.close()
    server = await asyncio.start_server(recording, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[1]
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{target}"]}))
    twice = await request(port, route, f"GET http://127.0.0.1:{target}/ HTTP/1.1\r\nHost: blocked.test\r\n"
                                       "Host: 127.0.0.1\r\nAUTH\r\n\r\n")
    assert twice.startswith(b"HTTP/1.1 400") and b"the Host header twice" in twice
    chunked = await request(port, route, f"POST http://127.0.0.1:{target}/ HTTP/1.1\r\nTransfer-Encoding: chunked"
                                         "\r\nAUTH\r\n\r\n")
    assert chunked.startswith(b"HTTP/1.1 400") and b"send Content-Length" in chunked
    answer = await request(port, route, f"POST http://127.0.0.1:{target}/a HTTP/1.1\r\nContent-Length: 3\r\nAUTH"
                                        "\r\n\r\nabcGET /hidden HTTP/1.1\r\nHost: blocked.test\r\n\r\n")
    server.close()
    assert answer.endswith(b"ok")
    (sent,) = heads
    assert sent.startswith(b"POST /a HTTP/1.1\r\n") and sent.endswith(b"\r\n\r\nabc") and b"hidden" not in sent
    assert b"Proxy-Authorization" not in sent and b"Connection: close" in sent
    assert route.records[-1].bytes_sent == 3


async def test_connections_are_capped_per_route_and_before_authentication(proxy, upstream, monkeypatch):
    import prefect_rollouts.runtimes.egress.connection as egress_module

    egress, port = proxy
    monkeypatch.setattr(egress_module, "MAX_TUNNELS_PER_ROUTE", 2)
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"127.0.0.1:{upstream}"]}))
    held = [await connect(port, f"127.0.0.1:{upstream}", route) for _ in range(2)]
    _, writer, head = await connect(port, f"127.0.0.1:{upstream}", route)
    assert head.startswith(b"HTTP/1.1 503") and "connections of this rollout" in route.records[-1].reason
    writer.close()
    monkeypatch.setattr(egress_module, "MAX_PENDING", 1)
    idle = await asyncio.open_connection("127.0.0.1", port)   # holds the one unauthenticated slot
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(), 5) == b""   # dropped at once
    for _, held_writer, _ in held:
        held_writer.close()
    idle[1].close()
    writer.close()


def test_a_credential_the_runtime_plants_in_a_host_name_is_scrubbed_from_the_trace():
    from prefect_rollouts.runtimes.egress.proxy import take_network_log
    from prefect_rollouts.trace import NetworkRecord, Trace

    route = Route(NetworkPolicy.model_validate({"allow": []}))
    planted = f"{route.credential.upper()}.x"
    route.records.append(NetworkRecord(phase="agent", method="CONNECT", host=planted, port=443, allowed=False,
                                       reason=f"no allow rule names https://{planted}:443", started_at=0.0))

    class Runtime:
        egress_route = route
    trace = Trace(task_id="t", model="m")
    take_network_log(Runtime(), trace)
    assert route.credential.lower() not in trace.model_dump_json().lower()
    assert trace.network[0].host == "***.x"


def machine_address() -> str:
    """A non-loopback IPv4 address of this machine: the source the kernel picks toward an outside
    address (eth0's), else toward Docker's default bridge (its gateway). A UDP connect sends nothing."""
    for outside in ("198.51.100.1", "172.17.0.2"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((outside, 9))
            except OSError:
                continue
            source = probe.getsockname()[0]
        if not ipaddress.ip_address(source).is_loopback:
            return str(source)
    pytest.skip("this machine has no non-loopback IPv4 address (no route out, no Docker bridge)")


@pytest.fixture
async def host_server() -> AsyncIterator[tuple[str, int]]:
    """A server on a non-loopback address of this machine: one of its own services."""
    address = machine_address()
    server = await asyncio.start_server(_echo_or_http, address, 0)
    yield address, server.sockets[0].getsockname()[1]
    server.close()


def test_the_kernel_says_which_addresses_are_this_machines():
    assert is_host_address(machine_address()) and is_host_address("127.0.0.1") and is_host_address("0.0.0.0")
    assert not is_host_address("198.51.100.1") and not is_host_address("203.0.113.9")


async def test_star_and_globs_never_reach_this_machines_own_addresses_but_an_exact_rule_does(proxy, host_server):
    egress, port = proxy
    address, target = host_server

    async def rebinding(host: str, port: int) -> str:   # a DNS server answering with this machine's address
        return address if host.endswith(".rebind.test") else await resolve(host, port)
    with use_resolver(rebinding):
        everything = egress.open_route(NetworkPolicy.model_validate({"allow": ["*"]}))
        glob = egress.open_route(NetworkPolicy.model_validate({"allow": [f"*.rebind.test:{target}"]}))
        for route, host in ((everything, address), (everything, "0.0.0.0"), (glob, "api.rebind.test")):
            reader, writer, head = await connect(port, f"{host}:{target}", route)
            body = await within(reader.read(), 5, "the refusal's end")
            writer.close()
            assert head.startswith(b"HTTP/1.1 403"), (host, head)
            assert f"{host} resolves to".encode() in body and b"only a rule naming the host exactly" in body
        assert b"an address of this machine" in body
        assert [record.allowed for record in everything.records + glob.records] == [False] * 3
        assert "an address of this machine" in everything.records[0].reason
        exact = egress.open_route(NetworkPolicy.model_validate({"allow": [f"{address}:{target}"]}))
        reader, writer, head = await connect(port, f"{address}:{target}", exact)
        assert head.startswith(b"HTTP/1.1 200")
        writer.write(b"ping\n")
        assert await reader.readexactly(5) == b"ping\n"
        writer.close()
        assert (exact.records[0].allowed, exact.records[0].address) == (True, address)


async def test_the_proxys_own_port_is_refused_even_under_an_exact_rule(proxy):
    egress, port = proxy
    address = machine_address()
    outside = await egress.listen(address)   # the proxy on a Docker gateway's address, as in use
    route = egress.open_route(NetworkPolicy.model_validate({"allow": [f"{address}:{outside}", f"localhost:{port}"]}))
    for target in (f"{address}:{outside}", f"localhost:{port}"):
        reader, writer, head = await connect(port, target, route)
        body = await within(reader.read(), 5, "the refusal's end")
        writer.close()
        assert head.startswith(b"HTTP/1.1 403") and b"is this egress proxy itself" in body, (target, body)
    assert [record.allowed for record in route.records] == [False, False]
