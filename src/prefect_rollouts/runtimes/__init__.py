"""Runtimes: where the agent's tools and the task's commands run.

Contract: ``Runtime`` in ``base.py`` (exec, read_file, write_file, artifacts, start/stop).
``make_runtime`` (the registry, here) picks the implementation from ``RuntimeConfig.type``:
``local.py`` or the ``docker/`` package (``docker/runtime.py``, with its disk quota, network, limits and
images beside it). ``egress/`` is the agent's egress proxy, the one way out under ``{ allow, block }``
rules; ``owner.py`` names the process that owns a sandbox. Must not import Prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.config.env import resolve_env
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.runtimes.base import ExecResult, Runtime

if TYPE_CHECKING:
    from prefect_rollouts.runtimes.egress.proxy import EgressProxy

__all__ = ["ExecResult", "Runtime", "make_runtime"]


def make_runtime(config: RuntimeConfig, *, network: NetworkPolicy | None = None, labels: dict[str, str] | None = None,
                 source: str = "[env.agent.runtime]", binds: dict[str, str] | None = None,
                 egress: EgressProxy | None = None) -> Runtime:
    """Build an unstarted runtime from ``config``; ``network`` overrides ``config.network`` (scoring).

    ``binds``: host directory -> absolute path inside the runtime, mounted read-write (a program
    harness's endpoint directory), or read-only when the path ends in ``:ro`` (docker's own
    spelling); the local runtime sees host paths as they are. ``egress``: the agent's egress proxy,
    through which a docker runtime's commands go under a network policy with rules.

    ``source`` is the config table ``config`` came from, named in error messages (e.g.
    ``[env.agent.scoring.runtime]`` for an isolated-scoring runtime of its own). ``${VAR}``
    templates in ``config.env`` are resolved here, from this process's environment.

    Raises:
        ScoringEnvError: a ``${VAR}`` in ``config.env`` is unset and has no default.
    """
    if config.env:
        config = config.model_copy(update={"env": resolve_env(config.env, table=f"{source} env",
                                                              place="where the runtime starts")})
    if config.type == "docker":
        from prefect_rollouts.runtimes.docker.runtime import DockerRuntime  # the docker SDK loads only when used

        return DockerRuntime(config, network=network, labels=labels, source=source, binds=binds, egress=egress)
    from prefect_rollouts.runtimes.local import LocalRuntime

    return LocalRuntime(config, network=network, labels=labels, binds=binds)

