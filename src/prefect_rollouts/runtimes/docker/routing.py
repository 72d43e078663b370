"""Moving a started docker runtime's container between network policies (``DockerRuntime.start`` under
rules, ``DockerRuntime.scoped`` with another policy): routed through the agent's egress proxy and guarded,
or released to ``open`` or ``none``. Async, over ``network.py``'s blocking calls.

``state`` is the runtime's network state, shared with its ``scoped`` views: ``network`` (the policy now)
and, once routed, ``route`` (the egress proxy's route), ``proxy`` (its address and port), ``guarded`` and
``env`` (the proxy variables every command gets). Must not import Prefect.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes.docker import network as net
from prefect_rollouts.runtimes.docker.engine import docker_client, in_thread
from prefect_rollouts.runtimes.egress.proxy import EgressProxy


async def restrict(state: dict[str, Any], policy: NetworkPolicy, *, container: Any, config: RuntimeConfig,
                   source: str, egress: EgressProxy | None, phase: Literal["setup", "scoring"]) -> None:
    """Route the container through the egress proxy under ``policy``, guarded (``network.py``); a container
    already routed only gets the new policy on its route.

    Args:
        state: The runtime's network state (see the module docstring); updated.
        policy: A policy with rules.
        container: The started container. config: Its runtime config. source: Its config table, for errors.
        egress: The agent's egress proxy. phase: Whose connections the route records (``setup`` or ``scoring``).

    Raises:
        RuntimeUnavailableError: no egress proxy, the proxy cannot listen on the network's
            gateway (a remote engine), or the guard could not be set (not retryable).
    """
    if "route" not in state:
        if egress is None:
            raise RuntimeUnavailableError(f"{source} network = {{ allow/block }} needs the agent's egress "
                                          "proxy: run the rollout through an agent (make_agent)", retryable=False)
        gateway = await in_thread(net.gateway, docker_client(), container, config.docker_network)
        try:
            port = await egress.listen(gateway)
        except OSError as exc:
            raise RuntimeUnavailableError(
                f"{source} network = {{ allow/block }}: the egress proxy cannot listen on {gateway}, the "
                f"gateway of Docker network {config.docker_network!r} ({exc}). Rules need a Docker engine on "
                "this machine", retryable=False) from exc
        route = egress.open_route(policy, phase=phase)
        state.update(route=route, proxy=(gateway, port), guarded=False,
                     env=EgressProxy.environment(route, gateway, port))
    state["route"].policy = policy
    if not state["guarded"]:
        await in_thread(net.guard, docker_client(), container, state["proxy"])
        state["guarded"] = True


async def apply(state: dict[str, Any], target: NetworkPolicy, *, container: Any, config: RuntimeConfig,
                source: str, egress: EgressProxy | None, phase: Literal["setup", "scoring"]) -> None:
    """Move the container from ``state["network"]`` to ``target``: a move to rules from ``none`` guards it
    before it joins the network (no process in it ever has an unguarded interface); a move to ``open`` lifts
    the guard; ``none`` leaves it loopback only. Arguments and errors as ``restrict``."""
    client, name = docker_client(), config.docker_network
    before = state["network"].mode
    if target.mode == "rules":
        if before == "none":   # nothing gets out while it joins the network and the proxy is let in
            await in_thread(net.guard, client, container, None)
            state["guarded"] = False
            await in_thread(net.attach, client, container, name)
        await restrict(state, target, container=container, config=config, source=source, egress=egress, phase=phase)
    elif target.mode == "open":
        if state.get("guarded"):
            await in_thread(net.unguard, client, container)
            state["guarded"] = False
        if before == "none":
            await in_thread(net.attach, client, container, name)
    else:
        await in_thread(net.attach, client, container, "none")
    state["network"] = target
