"""Issue 35: the egress proxy's resolver is injectable (``EgressProxy(resolver=...)``, or the process's with
``egress_address.use_resolver``), so a test's servers get names without a line in /etc/hosts, and the address
checks still run on the address it returns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from prefect_rollouts import NetworkPolicy
from prefect_rollouts.runtimes.egress.address import hosts_resolver, process_resolver, resolve, use_resolver
from prefect_rollouts.runtimes.egress.proxy import EgressProxy
from tests.runtimes.test_egress import _echo_or_http, proxy_url

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

NAME = "upstream.egress-resolver.test"
"""A name no resolver of this machine knows (``.test`` is reserved: RFC 2606)."""


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    """The port of a loopback server answering ``hello <path>``."""
    server = await asyncio.start_server(_echo_or_http, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
def asked() -> list[tuple[str, int]]:
    """What the test resolver was asked, in order."""
    return []


def resolver_of(asked: list[tuple[str, int]]):
    """A resolver answering ``NAME`` with the loopback address and recording each question."""
    names = hosts_resolver({NAME: "127.0.0.1"})

    async def resolver(host: str, port: int) -> str:
        asked.append((host, port))
        return await names(host, port)
    return resolver


async def get(egress: EgressProxy, port: int, policy: dict, url: str) -> tuple[httpx.Response, object]:
    route = egress.open_route(NetworkPolicy.model_validate(policy), phase="agent")
    async with httpx.AsyncClient(proxy=proxy_url(route, port), timeout=10) as client:
        answer = await client.get(url)
    (record,) = route.records
    return answer, record


async def test_a_proxy_given_a_resolver_connects_a_name_only_it_knows_to_the_address_it_returns(upstream, asked):
    egress = EgressProxy(resolver=resolver_of(asked))
    port = await egress.listen("127.0.0.1")
    try:
        answer, record = await get(egress, port, {"allow": [f"{NAME}:{upstream}"]}, f"http://{NAME}:{upstream}/x")
    finally:
        await egress.stop()
    assert (answer.status_code, answer.text) == (200, "hello /x")
    assert (record.host, record.address, record.allowed) == (NAME, "127.0.0.1", True)
    assert asked == [(NAME, upstream)]


async def test_the_address_checks_run_on_what_the_resolver_returns(upstream, asked):
    egress = EgressProxy(resolver=resolver_of(asked))
    port = await egress.listen("127.0.0.1")
    try:   # under "*" the loopback address the name resolves to is refused; so is the proxy itself, always
        star, star_record = await get(egress, port, {"allow": ["*"]}, f"http://{NAME}:{upstream}/")
        itself, _ = await get(egress, port, {"allow": [f"{NAME}:{port}"]}, f"http://{NAME}:{port}/")
    finally:
        await egress.stop()
    assert star.status_code == 403 and f"{NAME} resolves to 127.0.0.1, a loopback or link-local address" in star.text
    assert (star_record.allowed, star_record.address) == (False, None)
    assert itself.status_code == 403 and f"127.0.0.1:{port} is this egress proxy itself" in itself.text
    assert asked == [(NAME, upstream), (NAME, port)]


async def test_the_process_resolver_serves_every_proxy_made_without_one_while_it_is_in_use(upstream, asked):
    before = EgressProxy()   # as an agent's: made before the test's resolver is set
    port = await before.listen("127.0.0.1")
    try:
        with use_resolver(resolver_of(asked)):
            assert process_resolver() is not resolve
            answer, record = await get(before, port, {"allow": [f"{NAME}:{upstream}"]}, f"http://{NAME}:{upstream}/a")
            inner = hosts_resolver({NAME: "127.0.0.2"})
            with use_resolver(inner):
                assert process_resolver() is inner
            assert process_resolver() is not inner   # the outer one is back
    finally:
        await before.stop()
    assert (answer.status_code, answer.text, record.address) == (200, "hello /a", "127.0.0.1")
    assert asked == [(NAME, upstream)]
    assert process_resolver() is resolve   # this machine's again


async def test_a_hosts_resolver_answers_its_names_and_asks_the_fallback_for_others():
    async def fallback(host: str, port: int) -> str:
        raise OSError(f"{host}: unknown")
    names = hosts_resolver({"Allowed.Test": "172.18.0.2"}, fallback=fallback)
    assert await names("allowed.test", 80) == "172.18.0.2"
    with pytest.raises(OSError, match=r"other\.test: unknown"):
        await names("other.test", 80)
    assert await hosts_resolver({})("10.1.2.3", 80) == "10.1.2.3"   # by default this machine's: a literal is itself


async def test_a_resolver_answering_no_ipv4_address_or_nothing_in_time_gets_the_request_a_502(monkeypatch):
    import prefect_rollouts.runtimes.egress.connection as egress_module

    async def wrong(host: str, port: int) -> str:
        return "::1" if host == "six.test" else "localhost"

    async def hanging(host: str, port: int) -> str:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")
    monkeypatch.setattr(egress_module, "CONNECT_TIMEOUT_S", 0.2)
    answers = []
    for resolver, host in ((wrong, "six.test"), (wrong, "name.test"), (hanging, "slow.test")):
        egress = EgressProxy(resolver=resolver)
        port = await egress.listen("127.0.0.1")
        try:
            answers.append(await get(egress, port, {"allow": [f"{host}:80"]}, f"http://{host}/"))
        finally:
            await egress.stop()
    (six, six_record), (name, _), (slow, slow_record) = answers
    assert six.status_code == 502 and six_record.error == (
        "cannot reach six.test:80: the egress proxy's resolver answered '::1' for it, not an IPv4 address")
    assert name.status_code == 502 and "answered 'localhost' for it" in name.text
    assert slow.status_code == 502 and slow_record.error == "cannot reach slow.test:80: TimeoutError"
    assert not six_record.allowed and not slow_record.allowed
