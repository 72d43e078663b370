"""Which resolved addresses the egress proxy connects to: never this machine's own under ``*`` or a glob.

Rules name hosts; the proxy resolves a host once and connects to that address, so the check is on
the address connected to (a name that resolves to this machine, for instance by DNS rebinding, is
caught). Under ``*`` or a glob (a rule without ``Rule.exact``) the proxy never connects to:

- a loopback, link-local (cloud metadata), unspecified or multicast address
  (``config.network.is_special_address``);
- an address of this machine: any of its interfaces' (``eth0``'s, a Docker network's gateway such as
  ``172.17.0.1``), including interfaces added after the proxy started. The kernel is asked at check
  time (``is_host_address``), so there is no list to keep fresh;
- an address this machine reaches directly through an interface that carries no default route
  (``is_bridged_address``): a Docker bridge's (``docker0``, ``br-...``), a VM's or a VPN's subnet. The
  containers of this host are this machine's services too: another rollout's box under ``open``, a
  database's or a model server's container (``allow = ["*"]`` fetched a page from ``172.17.0.3:8000``,
  a container beside the box, and from its decimal form). Hosts of the LAN the default route's
  interface is on are not this machine's and stay reachable.

A rule naming the host exactly (``allow = ["172.17.0.1:8000"]``, or a name written as it is) reaches
those. The proxy's own ports on any address of this machine are refused whatever the rules say: a
request through the proxy to the proxy itself is never a rollout's business.

Names are resolved by a ``Resolver``: ``resolve`` (this machine's resolver) unless the proxy was given
its own, or the process one (``use_resolver``: a test's servers under names it owns, without editing
``/etc/hosts``). The checks above run on whatever address it returns.

Must not import Prefect.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import sys
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping

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


ROUTE_TABLE = "/proc/net/route"
"""The kernel's IPv4 routing table (main table): interface, destination, gateway, mask, metric per line."""


def is_bridged_address(address: str, table: str | None = None) -> bool:
    """True when this machine reaches the IPv4 ``address`` directly (no gateway) through an interface
    that carries no default route: a container or VM on one of its bridges.

    The route is the kernel's choice, found as the kernel finds it: the longest prefix of ``table``
    (the text of ``/proc/net/route``; read at each call when None, tens of µs, so bridges that come
    and go are followed) that holds ``address``, the lowest metric among equals. An address reached
    through a gateway, or directly on the default route's interface (the LAN), is not bridged.
    """
    try:
        target = int(ipaddress.IPv4Address(address))
    except ValueError:
        return False
    if table is None:
        try:
            with open(ROUTE_TABLE) as routes:
                table = routes.read()
        except OSError:
            return False
    best: tuple[int, int, str, int] | None = None   # (prefix length, -metric, interface, gateway)
    defaults = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        interface, (destination, gateway, flags, metric, mask) = fields[0], (
            _hex(fields[1]), _hex(fields[2]), int(fields[3], 16), int(fields[6]), _hex(fields[7]))
        if not flags & 1:   # RTF_UP
            continue
        if mask == 0:
            defaults.add(interface)
        if target & mask == destination:
            length = bin(mask).count("1")
            if best is None or (length, -metric) > best[:2]:
                best = (length, -metric, interface, gateway)
    return best is not None and best[0] > 0 and best[3] == 0 and best[2] not in defaults


def _hex(field: str) -> int:
    """An address of ``/proc/net/route`` (hex of the bytes in network order read in the machine's order) as an int."""
    return int.from_bytes(int(field, 16).to_bytes(4, sys.byteorder), "big")


def refusal(host: str, address: str, port: int, rule: Rule | None, proxy_ports: Collection[int]) -> str | None:
    """Why the proxy must not connect to ``address:port`` (what ``host`` resolved to) although
    ``rule`` allowed ``host``; None when it may (module docstring)."""
    special = is_special_address(address)
    host_address = not special and is_host_address(address)
    if host_address or special:
        if port in proxy_ports:
            return f"{address}:{port} is this egress proxy itself, which no rule reaches"
    elif not is_bridged_address(address):
        return None
    if rule is not None and rule.exact:
        return None
    what = ("a loopback or link-local address" if special else
            "an address of this machine (one of its interfaces, such as a Docker network's gateway)" if host_address
            else "an address on one of this machine's bridges (a container of this host, such as another box or "
                 "a service's container)")
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


Resolver = Callable[[str, int], Awaitable[str]]
"""``await resolver(host, port)``: the IPv4 address (dotted text) the proxy checks and connects to for
``host`` (a name or an address, as the request wrote it); ``OSError`` when there is none (the request
gets 502). ``resolve`` is the default."""

_process_resolver: Resolver | None = None


def process_resolver() -> Resolver:
    """The resolver of every ``EgressProxy`` made without one, looked up at each request: the one
    ``use_resolver`` set, else ``resolve``."""
    return _process_resolver or resolve


@contextlib.contextmanager
def use_resolver(resolver: Resolver) -> Iterator[None]:
    """While the block runs, ``resolver`` resolves for every ``EgressProxy`` of this process made
    without its own (an agent's included, made or not yet made); then the previous one is back.

    For a process that must resolve names this machine does not know, such as a test's servers:
    ``with use_resolver(hosts_resolver({"allowed.test": "172.18.0.2"})):`` instead of lines in
    ``/etc/hosts``. The address checks (``refusal``) still run on what it returns.
    """
    global _process_resolver
    previous, _process_resolver = _process_resolver, resolver
    try:
        yield
    finally:
        _process_resolver = previous


async def resolve_with(resolver: Resolver | None, host: str, port: int) -> str:
    """The address of ``host`` by ``resolver`` (None: ``process_resolver()``), as IPv4 text.

    Raises:
        OSError: ``host`` has no address, or the resolver's answer is not an IPv4 address.
    """
    address = await (resolver or process_resolver())(host, port)
    try:
        return str(ipaddress.IPv4Address(address))
    except ValueError:
        raise OSError(f"the egress proxy's resolver answered {str(address)[:100]!r} for it, not an IPv4 address"
                      ) from None


def hosts_resolver(names: Mapping[str, str], fallback: Resolver = resolve) -> Resolver:
    """A ``Resolver`` reading ``names`` (host name -> IPv4 address, as lines of ``/etc/hosts``
    would; exact, case-insensitive) first, and ``fallback`` for every other host."""
    table = {name.lower(): address for name, address in names.items()}

    async def resolver(host: str, port: int) -> str:
        address = table.get(host.lower())
        return address if address is not None else await fallback(host, port)
    return resolver
