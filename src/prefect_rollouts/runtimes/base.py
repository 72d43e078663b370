"""The runtime handle used by harness tools, task hooks and scoring functions."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import scrub

IMAGE_USER = ""
"""``Runtime.exec(user=IMAGE_USER)`` runs the command as the image's ``USER`` (root when the image sets none),
whatever ``config.user`` says: Docker's own meaning of an empty user."""

SCRUB_SLACK_BYTES = 4096
"""Bytes of a command's output kept beyond ``output_cap_bytes`` so that a secret straddling the
cap is still whole when it is scrubbed; the text is cut to the cap afterwards."""


def cache_dir(name: str) -> Path:
    """The host directory ``<cache>/<name>``, created: ``<cache>`` is ``$PREFECT_ROLLOUTS_CACHE``, else
    ``$XDG_CACHE_HOME/prefect-rollouts``, else ``~/.cache/prefect-rollouts`` (mini-swe-agent installs,
    task image build locks)."""
    base = os.environ.get("PREFECT_ROLLOUTS_CACHE") or \
        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "prefect-rollouts")
    root = Path(base) / name
    root.mkdir(parents=True, exist_ok=True)
    return root


def output_text(raw: bytes | bytearray, cap: int) -> str:
    """A command's captured output as text: decoded as UTF-8 (errors replaced), scrubbed of
    registered secrets (``errors.scrub``), then cut to ``cap`` characters. Read up to
    ``cap + SCRUB_SLACK_BYTES`` bytes: a cut before the scrub could keep a prefix of a key."""
    return scrub(bytes(raw).decode("utf-8", errors="replace"))[:cap]


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
    removes everything the runtime created, also after a failed start). Implementations:
    ``local`` (a temporary directory) and ``docker`` (a container); their docstrings say only
    what differs from this contract.
    """

    id: str
    config: RuntimeConfig
    binds: dict[str, str]
    """Host directories mounted into the runtime (``make_runtime(binds=...)``): host path -> where it
    appears inside (``local``: the host path itself; without the ``:ro`` of a read-only bind)."""

    @property
    def network(self) -> NetworkPolicy:
        """The network policy its commands run under."""
        ...

    async def start(self) -> None:
        """Create the workspace.

        Raises:
            RuntimeUnavailableError: it cannot be created (a retryable one is retried by setup).
            ConfigError: the config asks for what this runtime cannot do here (e.g. a network policy).
        """

    async def stop(self) -> None:
        """Remove everything the runtime created; idempotent; a ``scoped`` view leaves it alone."""

    async def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        """Run ``cmd`` with ``bash -c`` in the workspace.

        Args:
            cmd: Shell command.
            timeout: Seconds before the command is killed; default ``config.exec_timeout_s``.
                A killed command returns exit code -9 and ``timed_out``.
            env: Extra environment variables over ``config.env``.
            user: ``docker``: the user to run as (a name or UID known in the image, ``uid:gid`` too) instead
                of ``config.user``; ``IMAGE_USER``: the image's ``USER``. ``local`` runs every command as
                this process's user and refuses any other (``ValueError``).

        Returns:
            ``ExecResult``; stdout and stderr are decoded as UTF-8 (errors replaced) and cut to
            ``config.output_cap_bytes`` each.

        Raises:
            RuntimeUnavailableError: the runtime itself was lost (not the command's failure).
        """

    async def read_file(self, path: str) -> bytes:
        """Bytes of a workspace file.

        Raises:
            FileNotFoundError: it does not exist.
            ValueError: it is not a regular file, or the path leaves the workspace.
        """

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a workspace file (``str`` is written as UTF-8), creating parent directories.

        Raises:
            ValueError: the path leaves the workspace or names something that is not a regular file.
        """

    async def collect_artifacts(self, paths: list[str]) -> tuple[bytes, list[str]]:
        """Pack the declared paths into a tar (names relative to the workspace) for isolated scoring.

        Returns:
            ``(archive, missing)``: the tar bytes and the paths that were not found (scoring sees
            them absent; they are not an error).

        Raises:
            TaskError: the files exceed ``config.artifact_max_bytes``.
        """

    async def restore_artifacts(self, archive: bytes) -> None:
        """Unpack a ``collect_artifacts`` archive into the workspace (no path may leave it)."""

    async def upload(self, source: Path, target: str) -> None:
        """Copy the host file or directory ``source`` (recursively, modes kept) to ``target`` in the
        runtime, creating parent directories. ``target`` is relative to the workspace, or absolute
        (``docker``: anywhere writable; ``local``: inside the workspace only).

        Raises:
            FileNotFoundError: ``source`` does not exist.
            ValueError: ``target`` is not a place this runtime can write.
        """

    async def kill_all(self) -> None:
        """Kill every process the rollout started in the runtime (an agent program's whole tree,
        escaped ones included); never raises."""

    async def limits_hit(self) -> dict[str, str]:
        """The runtime's limits that ended or refused a process since the last call (a fresh runtime
        counts from its start). Costs a command in the runtime: ask after a command failed.

        Returns:
            ``"memory"`` (a process was killed for memory) and ``"pids"`` (a process could not start:
            the process limit) -> a sentence naming the config key and the fix; empty when none, or
            the runtime has no such limits (``local``). Never raises.
        """

    async def check_storage(self) -> None:
        """Raise when the rollout filled the runtime's disk quota (``docker``'s ``storage_mb``); a
        runtime without a quota (``local``) has nothing to check. Called when the rollout finalizes.

        Raises:
            TaskError: the quota was filled; the message names ``storage_mb`` and where.
        """

    async def scoped(self, *, env: dict[str, str] | None = None, network: NetworkPolicy | None = None) -> Runtime:
        """A view of this started runtime (same workspace) whose commands get ``env`` and run
        under ``network``; for shared scoring. Stopping the view does nothing."""
