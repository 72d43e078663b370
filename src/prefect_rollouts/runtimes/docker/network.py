"""A docker runtime's network under each policy, and the moves between them (``DockerRuntime.scoped``).

- ``open``: the container is on ``docker_network`` (default ``bridge``) as Docker made it.
- ``none``: on Docker's ``none`` network, a loopback interface only.
- ``rules``: on ``docker_network`` with IPv6 off, and *guarded*: the packet filter of the
  container's own network namespace drops everything but loopback (Docker's embedded DNS server
  at 127.0.0.11 excepted) and TCP to the egress proxy (``gateway:port``, the host side of that
  network), and refuses new connections from outside.
  The rules are set by a short-lived helper container of the sandbox image (``SANDBOX_IMAGE``,
  which has ``iptables``) sharing the namespace with ``NET_ADMIN``; the rollout's container has
  every capability dropped, so nothing in it can undo them. DNS then reaches no server: a name
  resolves only through the proxy, which checks it first.

A move from ``none`` to ``rules`` drops everything before the container joins a network, so no
process in it ever has an unguarded interface; a move from ``rules`` to ``open`` (a program
harness's trusted setup) lifts the guard. The helper is labelled like every container of this
project, so the janitor removes one left by a killed process. All functions block (call them in a thread).
"""

from __future__ import annotations

from typing import Any

import docker.errors

from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes.docker.limits import LOG_CONFIG
from prefect_rollouts.runtimes.docker.sandbox import DEFAULT_IMAGE as SANDBOX_IMAGE

GUARD_TIMEOUT_S = 60
"""The helper's longest run (it takes about 0.25 s here)."""

# $1: the proxy's address, $2: its port; "" for both drops everything but loopback. Docker's
# embedded DNS server of a user-defined network (127.0.0.11, on the loopback, which forwards what
# it does not know to the host's resolver) is refused too. iptables-nft first, the legacy backend
# where the kernel has no nf_tables.
_GUARD = r"""set -e
ipt() { iptables -w "$@" 2>/dev/null || iptables-legacy -w "$@"; }
ipt -P INPUT DROP; ipt -P FORWARD DROP; ipt -P OUTPUT DROP
ipt -F INPUT; ipt -F OUTPUT; ipt -F FORWARD
ipt -A INPUT -i lo -j ACCEPT
ipt -A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
ipt -A OUTPUT -d 127.0.0.11 -j REJECT
ipt -A OUTPUT -o lo -j ACCEPT
if [ -n "$1" ]; then ipt -A OUTPUT -d "$1" -p tcp --dport "$2" -j ACCEPT; fi
ipt -A OUTPUT -p tcp -j REJECT --reject-with tcp-reset
ipt -A OUTPUT -j REJECT
"""

_UNGUARD = r"""set -e
ipt() { iptables -w "$@" 2>/dev/null || iptables-legacy -w "$@"; }
ipt -F INPUT; ipt -F OUTPUT; ipt -F FORWARD
ipt -P INPUT ACCEPT; ipt -P FORWARD ACCEPT; ipt -P OUTPUT ACCEPT
"""


def create_options(mode: str, docker_network: str) -> dict[str, Any]:
    """``containers.run`` options of a container starting under ``mode`` (``open``, ``none``, ``rules``)."""
    if mode == "none":
        return {"network_mode": "none"}
    options: dict[str, Any] = {"network_mode": docker_network}
    if mode == "rules":
        options["sysctls"] = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
    return options


def gateway(client: docker.DockerClient, container: Any, network: str) -> str:
    """The host side of ``network`` as ``container`` sees it (its gateway address).

    Raises:
        RuntimeUnavailableError: the container is not on ``network``, or it has no IPv4 gateway.
    """
    container.reload()
    settings = container.attrs["NetworkSettings"]["Networks"].get(network) or {}
    address = settings.get("Gateway") or ""
    if not address:
        raise RuntimeUnavailableError(f"[env.agent.runtime] docker_network = {network!r}: the container has no IPv4 "
                                      "gateway there, so it cannot reach the egress proxy. Use a bridge network")
    return str(address)


def guard(client: docker.DockerClient, container: Any, proxy: tuple[str, int] | None) -> None:
    """Let ``container`` reach only loopback and ``proxy`` (``(address, port)``; None: loopback only).

    Raises:
        RuntimeUnavailableError: the helper could not run (no sandbox image: not retryable).
    """
    address, port = proxy or ("", 0)
    _helper(client, container, _GUARD, address, str(port) if proxy else "")


def unguard(client: docker.DockerClient, container: Any) -> None:
    """Lift ``guard``: the container's network as Docker made it."""
    _helper(client, container, _UNGUARD)


def attach(client: docker.DockerClient, container: Any, network: str) -> None:
    """Put ``container`` on ``network`` alone (``none``: no interface but loopback)."""
    container.reload()
    for name in list(container.attrs["NetworkSettings"]["Networks"]):
        if name != network:
            client.networks.get(name).disconnect(container, force=True)
    if network not in container.attrs["NetworkSettings"]["Networks"]:
        client.networks.get(network).connect(container)


def _helper(client: docker.DockerClient, container: Any, script: str, *args: str) -> None:
    # the rollout container's labels (run, rollout, owner, started_at): the janitor treats the helper as it
    labels = {**(container.labels or {}), "org.prefect-rollouts.role": "network-guard"}
    try:
        helper = client.containers.run(
            SANDBOX_IMAGE, ["sh", "-c", script, "guard", *args], detach=True, network_mode=f"container:{container.id}",
            cap_drop=["ALL"], cap_add=["NET_ADMIN", "NET_RAW"], security_opt=["no-new-privileges"], labels=labels,
            log_config=LOG_CONFIG)
    except docker.errors.ImageNotFound:
        raise RuntimeUnavailableError(f"a network policy with rules needs the sandbox image {SANDBOX_IMAGE} (it sets "
                                      "the container's packet filter). Build it with `prefect-rollouts sandbox build`",
                                      retryable=False) from None
    except docker.errors.APIError as exc:
        raise RuntimeUnavailableError(f"cannot guard container {container.id[:12]}'s network "
                                      f"({exc.explanation or exc})") from exc
    try:
        code = helper.wait(timeout=GUARD_TIMEOUT_S).get("StatusCode")
        if code != 0:
            output = helper.logs().decode(errors="replace").strip()[-500:]
            raise RuntimeUnavailableError(
                f"cannot guard container {container.id[:12]}'s network: the packet filter refused ({output or code}). "
                f"Rebuild the sandbox image (`prefect-rollouts sandbox build`: it installs iptables)", retryable=False)
    finally:
        try:
            helper.remove(force=True, v=True)   # v: anonymous volumes of the image's VOLUMEs
        except docker.errors.NotFound:
            pass
