"""The runtime handle used by harness tools, task hooks and scoring functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from prefect_rollouts.config import NetworkPolicy, RuntimeConfig


@dataclass(frozen=True, slots=True)
class ExecResult:
    """Outcome of one command. ``exit_code`` is -9 when the command was killed by its timeout."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


class Runtime(Protocol):
    """A workspace plus a way to run commands in it. Paths are relative to the workspace.

    Lifecycle: ``await start()`` once, then any calls, then ``await stop()`` (idempotent,
    removes everything the runtime created, also after a failed start).
    """

    id: str
    config: RuntimeConfig

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None) -> ExecResult: ...
    async def read_file(self, path: str) -> bytes: ...
    async def write_file(self, path: str, data: bytes | str) -> None: ...
    async def collect_artifacts(self, paths: list[str]) -> tuple[bytes, list[str]]: ...
    async def restore_artifacts(self, archive: bytes) -> None: ...
    async def scoped(self, *, env: dict[str, str] | None = None, network: NetworkPolicy | None = None) -> Runtime: ...


def make_runtime(config: RuntimeConfig, *, network: NetworkPolicy | None = None, labels: dict[str, str] | None = None,
                 source: str = "[env.agent.runtime]") -> Runtime:
    """Build an unstarted runtime from ``config``; ``network`` overrides ``config.network`` (scoring).

    ``source`` is the config table ``config`` came from, named in error messages (e.g.
    ``[env.agent.scoring.runtime]`` for an isolated-scoring runtime of its own).
    """
    if config.type == "docker":
        from prefect_rollouts.runtimes.docker import DockerRuntime  # the docker SDK loads only when used

        return DockerRuntime(config, network=network, labels=labels, source=source)
    from prefect_rollouts.runtimes.local import LocalRuntime

    return LocalRuntime(config, network=network, labels=labels)
