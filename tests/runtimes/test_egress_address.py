"""Which addresses ``*`` and globs never reach (``runtimes/egress_address.py``): containers on this
machine's bridges, found from the kernel's routing table (a stub table here; the real engine in
tests/docker/test_network_policy.py)."""

from __future__ import annotations

import pytest

from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.runtimes.egress import address as egress_address
from prefect_rollouts.runtimes.egress.address import is_bridged_address, refusal

pytestmark = pytest.mark.unit

# /proc/net/route of a host: default via 192.0.2.1 on eth0 (its LAN 192.0.2.0/24), docker0 on 172.17/16,
# a user-defined Docker network br-1 on 172.18/16, a VPN's 10.8/16 through a gateway, a downed bridge
ROUTES = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
br-1\t000012AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
eth0\t0000080A\t090200C0\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0
br-2\t000013AC\t00000000\t0000\t0\t0\t0\t0000FFFF\t0\t0\t0
"""


@pytest.mark.parametrize(("address", "bridged"), [
    ("172.17.0.3", True),      # a container on docker0
    ("172.18.5.9", True),      # one on a user-defined network
    ("192.0.2.7", False),      # a LAN host, on the default route's interface
    ("10.8.0.1", False),       # through a gateway
    ("8.8.8.8", False),        # the default route
    ("172.19.0.2", False),     # a route that is down: the default route takes it
    ("not-an-address", False),
])
def test_an_address_a_bridge_reaches_directly_is_bridged(address, bridged):
    assert is_bridged_address(address, ROUTES) is bridged


def test_star_and_globs_refuse_a_bridged_address_and_an_exact_rule_reaches_it(tmp_path, monkeypatch):
    table = tmp_path / "route"
    table.write_text(ROUTES)
    monkeypatch.setattr(egress_address, "ROUTE_TABLE", str(table))
    star = NetworkPolicy.model_validate({"allow": ["*"]}).allow_rules[0]
    glob = NetworkPolicy.model_validate({"allow": ["*.internal"]}).allow_rules[0]
    exact = NetworkPolicy.model_validate({"allow": ["172.17.0.3:8000"]}).allow_rules[0]
    for host, rule in (("172.17.0.3", star), ("2886795523", star), ("db.internal", glob)):
        reason = refusal(host, "172.17.0.3", 8000, rule, proxy_ports=())
        assert reason == (f"{host} resolves to 172.17.0.3, an address on one of this machine's bridges (a container "
                          "of this host, such as another box or a service's container), which only a rule naming the "
                          f"host exactly reaches (e.g. allow = ['{host}:8000'])")
    assert refusal("172.17.0.3", "172.17.0.3", 8000, exact, proxy_ports=()) is None
    assert refusal("lan.example", "192.0.2.7", 8000, star, proxy_ports=()) is None
