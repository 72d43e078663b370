"""Which resolved addresses the egress proxy connects to: never this machine's own under ``*`` or a glob.

Rules name hosts; the proxy resolves a host once and connects to that address, so the check is on
the address connected to (a name that resolves to this machine, for instance by DNS rebinding, is
caught). Under ``*`` or a glob (a rule without ``Rule.exact``) the proxy never connects to:

- a loopback, link-local (cloud metadata), unspecified or multicast address
  (``config.network.is_special_address``);
- an address of this machine: any of its interfaces' (``eth0``'s, a Docker network's gateway such as
  ``172.17.0.1``), including interfaces added after the proxy started. The kernel is asked at check
  time (``is_host_address``), so there is no list to keep fresh.

A rule naming the host exactly (``allow = ["172.17.0.1:8000"]``, or a name written as it is) reaches
those. The proxy's own ports on any address of this machine are refused whatever the rules say: a
request through the proxy to the proxy itself is never a rollout's business.

Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Collection

from prefect_rollouts.config.network import Rule, is_special_address


def is_host_address(address: str) -> bool:
    """True when the IPv4 ``address`` is one of this machine's (a loopback one included).

    Asks the routing table (``connect`` on a UDP socket sends nothing): the source address the kernel
    picks for a destination of this machine is the destination itself (its ``local`` route's
    ``src``), or a loopback address; for any other destination it is the outgoing interface's. About
    5 µs here, so it runs for every connection and follows interfaces as they come and go. Unlike a
    test ``bind``, it holds with ``net.ipv4.ip_nonlocal_bind = 1``. An address with no route (or a
    broadcast one, which TCP cannot reach either) is not this machine's.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
        except OSError:
            return False
        source = probe.getsockname()[0]
    return bool(source == address or ipaddress.ip_address(source).is_loopback)


def refusal(host: str, address: str, port: int, rule: Rule | None, proxy_ports: Collection[int]) -> str | None:
    """Why the proxy must not connect to ``address:port`` (what ``host`` resolved to) although
    ``rule`` allowed ``host``; None when it may (module docstring)."""
    special = is_special_address(address)
    if not (special or is_host_address(address)):
        return None
    if port in proxy_ports:
        return f"{address}:{port} is this egress proxy itself, which no rule reaches"
    if rule is not None and rule.exact:
        return None
    what = ("a loopback or link-local address" if special else
            "an address of this machine (one of its interfaces, such as a Docker network's gateway)")
    return (f"{host} resolves to {address}, {what}, which only a rule naming the host exactly reaches "
            f"(e.g. allow = ['{host}:{port}'])")


async def resolve(host: str, port: int) -> str:
    """The first IPv4 address of ``host`` (an IPv4 literal is itself, without a lookup): the address
    both checked and connected to.

    Raises:
        OSError: ``host`` does not resolve to an IPv4 address.
    """
    with contextlib.suppress(ValueError):
        return str(ipaddress.IPv4Address(host))
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"{host}: no IPv4 address")
    return str(infos[0][4][0])
