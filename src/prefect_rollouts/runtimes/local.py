"""The ``local`` runtime: a fresh temporary workspace and subprocesses on this machine.

For development and machines without a container engine. It isolates files by directory only.
``network = "none"`` runs each command in a new network namespace (``unshare --net``), which
needs root or unprivileged user namespaces; where that fails, starting the runtime fails.
"""

from __future__ import annotations

import asyncio
import copy
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from pathlib import Path

from prefect_rollouts.config import NetworkPolicy, RuntimeConfig
from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError, TaskError
from prefect_rollouts.runtimes.base import ExecResult

_BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ")


class LocalRuntime:
    """A temporary directory as workspace; commands run with ``bash -c`` inside it.

    Args:
        config: ``RuntimeConfig`` with ``type = "local"``.
        network: Overrides ``config.network`` (used for scoring's policy).
        labels: Recorded as the workspace directory's name prefix hint only (no engine labels here).
    """

    def __init__(self, config: RuntimeConfig, *, network: NetworkPolicy | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.config = config
        self.network = network or config.network
        self.labels = dict(labels or {})
        self.workspace: Path | None = None
        self.id = ""
        self._prefix: list[str] = []
        self._owner = True

    async def start(self) -> None:
        """Create the workspace; with ``network = "none"`` check that a namespace can be made.

        Raises:
            ConfigError: ``network = "none"`` but no network namespace can be created here.
            RuntimeUnavailableError: the temporary directory cannot be created.
        """
        if self.network.mode == "none":
            self._prefix = ["unshare", "--net"]
            await self._check_namespace()
        try:
            self.workspace = Path(tempfile.mkdtemp(prefix="rollout-"))
        except OSError as exc:
            raise RuntimeUnavailableError(f'runtime "local": cannot create a workspace directory ({exc}). '
                                          "Free disk space or set TMPDIR") from exc
        self.id = str(self.workspace)

    async def scoped(self, *, env: dict[str, str] | None = None, network: NetworkPolicy | None = None) -> LocalRuntime:
        """A view of this started runtime (same workspace) whose commands get ``env`` and ``network``.

        Used for shared scoring. Stopping the view does nothing; stop the original.
        """
        view = copy.copy(self)
        view.config = self.config.model_copy(update={"env": {**self.config.env, **(env or {})}})
        view._owner = False
        if network is not None and network.mode != self.network.mode:
            view.network = network
            view._prefix = ["unshare", "--net"] if network.mode == "none" else []
            if view._prefix:
                await view._check_namespace()
        return view

    async def stop(self) -> None:
        """Remove the workspace. Idempotent; a ``scoped`` view leaves it alone."""
        if self.workspace is not None and self._owner:
            await asyncio.to_thread(shutil.rmtree, self.workspace, True)
            self.workspace = None

    async def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None) -> ExecResult:
        """Run ``cmd`` with ``bash -c`` in the workspace.

        Args:
            cmd: Shell command.
            timeout: Seconds before the command's process group is killed; default
                ``config.exec_timeout_s``. A killed command returns exit code -9, ``timed_out``.
            env: Extra environment variables over ``config.env``.

        Returns:
            ``ExecResult``; stdout and stderr are decoded as UTF-8 (errors replaced) and cut to
            ``config.output_cap_bytes`` each.
        """
        root = self._root()
        proc_env = {k: os.environ[k] for k in _BASE_ENV_KEYS if k in os.environ}
        proc_env.update(HOME=str(root), **self.config.env, **(env or {}))
        proc = await asyncio.create_subprocess_exec(
            *self._prefix, "bash", "-c", cmd, cwd=root, env=proc_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        cap = self.config.output_cap_bytes
        reads = asyncio.gather(_read_capped(proc.stdout, cap), _read_capped(proc.stderr, cap), proc.wait())
        timed_out = False
        try:
            async with asyncio.timeout(timeout or self.config.exec_timeout_s):
                out, err, code = await asyncio.shield(reads)
        except TimeoutError:
            timed_out = True
        finally:
            if proc.returncode is None:
                _kill_group(proc.pid)
        if timed_out:
            out, err, _ = await reads
            code = -9
        return ExecResult(code, out, err, timed_out)

    async def read_file(self, path: str) -> bytes:
        """Bytes of a workspace file. Raises ``FileNotFoundError`` when it does not exist."""
        return await asyncio.to_thread(self._resolve(path).read_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a workspace file, creating parent directories."""
        target = self._resolve(path)
        payload = data.encode() if isinstance(data, str) else data

        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(payload)
        await asyncio.to_thread(write)

    async def collect_artifacts(self, paths: list[str]) -> tuple[bytes, list[str]]:
        """Pack the workspace paths that exist into an uncompressed tar (paths relative).

        Returns:
            ``(archive, missing)``: the tar bytes and the declared paths that did not exist
            (left out; scoring then sees them absent).

        Raises:
            TaskError: the archive exceeds ``config.artifact_max_bytes``.
        """
        root = self._root()

        missing: list[str] = []

        def pack() -> bytes:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                for rel in paths:
                    source = self._resolve(rel)
                    if source.exists():
                        tar.add(source, arcname=str(source.relative_to(root)))
                    else:
                        missing.append(rel)
            return buffer.getvalue()
        archive = await asyncio.to_thread(pack)
        if len(archive) > self.config.artifact_max_bytes:
            raise TaskError(f"artifacts {paths!r}: {len(archive)} bytes exceed artifact_max_bytes = "
                            f"{self.config.artifact_max_bytes}. Declare fewer paths or raise "
                            "[env.agent.runtime] artifact_max_bytes")
        return archive, missing

    async def restore_artifacts(self, archive: bytes) -> None:
        """Unpack a ``collect_artifacts`` archive into the workspace (no path may leave it)."""
        root = self._root()

        def unpack() -> None:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
                tar.extractall(root, filter="data")
        await asyncio.to_thread(unpack)

    def _root(self) -> Path:
        if self.workspace is None:
            raise RuntimeError('runtime "local" is not started (or already stopped)')
        return self.workspace

    def _resolve(self, path: str) -> Path:
        root = self._root()
        target = (root / path).resolve()
        if target != root.resolve() and root.resolve() not in target.parents:
            raise ValueError(f"path {path!r} leaves the workspace; use a path relative to it")
        return target

    async def _check_namespace(self) -> None:
        proc = await asyncio.create_subprocess_exec(*self._prefix, "true", stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise ConfigError(f'runtime "local" cannot enforce network = "none" (creating a network '
                              f"namespace failed: {err.decode().strip()}). Run as root, or set "
                              'network = "open"')


async def _read_capped(stream: asyncio.StreamReader | None, cap: int) -> str:
    kept = bytearray()
    if stream is not None:
        while chunk := await stream.read(65536):
            if len(kept) < cap:
                kept += chunk[: cap - len(kept)]
    return kept.decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
