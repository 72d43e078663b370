"""The ``local`` runtime: a fresh temporary workspace and subprocesses on this machine.

For development and machines without a container engine. It isolates files by directory only.
``network = "none"`` runs each command in a new network namespace (``unshare --net``), which
needs root or unprivileged user namespaces; where that fails, starting the runtime fails.
"""

from __future__ import annotations

import asyncio
import copy
import io
import logging
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

logger = logging.getLogger("prefect_rollouts.runtimes")

_BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ")
_DRAIN_S = 1.0
"""After a command ends, how long its pipes may stay open (held by an escaped process) before reading stops."""


class LocalRuntime:
    """A temporary directory as workspace; commands run with ``bash -c`` inside it.

    Args:
        config: ``RuntimeConfig`` with ``type = "local"``.
        network: Overrides ``config.network`` (used for scoring's policy).
        labels: Accepted for the ``Runtime`` interface and kept on ``self.labels``; a directory has
            nowhere to carry them (the docker runtime puts them on its containers).
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
            workspace, self.workspace = self.workspace, None
            for _ in range(3):  # a process that escaped its command may still be writing into it
                await asyncio.to_thread(shutil.rmtree, workspace, True)
                if not workspace.exists():
                    return
                await asyncio.sleep(0.2)
            logger.warning('runtime "local": could not remove workspace %s (a process started by the agent '
                           "may still be writing into it)", workspace)

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
        out, err = bytearray(), bytearray()
        readers = [asyncio.ensure_future(_read_capped(proc.stdout, cap, out)),
                   asyncio.ensure_future(_read_capped(proc.stderr, cap, err))]
        timed_out = False
        try:
            async with asyncio.timeout(timeout or self.config.exec_timeout_s):
                code = await _wait_exit(proc, readers)
        except TimeoutError:
            timed_out, code = True, -9
        finally:
            _kill_group(proc.pid)  # the command's background jobs end with it
            if proc.returncode is None:
                await asyncio.shield(proc.wait())
            # a process that left the group (setsid) may hold the pipes open: stop reading soon
            await asyncio.wait(readers, timeout=_DRAIN_S)
            for reader in readers:
                reader.cancel()
        return ExecResult(code, out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace"), timed_out)

    async def read_file(self, path: str) -> bytes:
        """Bytes of a workspace file.

        Raises:
            FileNotFoundError: it does not exist.
            ValueError: it is not a regular file (a FIFO or device would block), or the path
                leaves the workspace.
        """
        target = self._resolve(path)
        if target.exists() and not target.is_file():
            raise ValueError(f"path {path!r} is not a regular file")
        return await asyncio.to_thread(target.read_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a workspace file, creating parent directories.

        Raises:
            ValueError: the path leaves the workspace or names something that is not a regular file.
        """
        target = self._resolve(path)
        if target.exists() and not target.is_file():
            raise ValueError(f"path {path!r} exists and is not a regular file")
        payload = data.encode() if isinstance(data, str) else data

        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(payload)
        await asyncio.to_thread(write)

    async def collect_artifacts(self, paths: list[str]) -> tuple[bytes, list[str]]:
        """Pack the declared workspace paths into an uncompressed tar (names relative to the workspace).

        Regular files and directories are packed; a symlink is packed as the file or directory
        it points to when that target lies inside the workspace. Anything else (a missing path,
        a link leaving the workspace, a FIFO or device) is left out and listed as missing, so
        scoring sees it absent.

        Returns:
            ``(archive, missing)``.

        Raises:
            TaskError: the files to pack exceed ``config.artifact_max_bytes`` (checked before
                anything is read).
        """
        root = self._root().resolve()

        def plan() -> tuple[list[tuple[Path, str]], list[str]]:
            chosen, missing = [], []
            for rel in paths:
                found = _walk(root, rel)
                if found:
                    chosen.extend(found)
                else:
                    missing.append(rel)
            return chosen, missing

        chosen, missing = await asyncio.to_thread(plan)
        size = sum(source.stat().st_size for source, _ in chosen if source.is_file())
        if size > self.config.artifact_max_bytes:
            raise TaskError(f"artifacts {paths!r}: {size} bytes exceed artifact_max_bytes = "
                            f"{self.config.artifact_max_bytes}. Declare fewer paths or raise "
                            "[env.agent.runtime] artifact_max_bytes")

        def pack() -> bytes:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                for source, name in chosen:
                    tar.add(source, arcname=name, recursive=False)
            return buffer.getvalue()
        return await asyncio.to_thread(pack), missing

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


async def _wait_exit(proc: asyncio.subprocess.Process, readers: list[asyncio.Future[None]]) -> int:
    """The command's exit code, once its output ended, or once it exited while a background job
    it started still holds the pipes (``Process.wait`` would wait for that job on Python 3.11)."""
    while True:
        done, _ = await asyncio.wait(readers, timeout=0.05)
        if len(done) == len(readers):
            return await proc.wait()
        if proc.returncode is not None:
            return proc.returncode


def _walk(root: Path, rel: str, seen: set[Path] | None = None) -> list[tuple[Path, str]]:
    """``(real path, archive name)`` of the regular files and directories under ``root / rel``
    (each real directory once, so a symlink loop ends)."""
    seen = set() if seen is None else seen
    name = os.path.normpath(rel).lstrip("/")
    if name.startswith(".."):
        return []
    source = (root / name).resolve()
    if source != root and root not in source.parents:
        return []
    if source.is_file():
        return [(source, name)]
    if not source.is_dir() or source in seen:
        return []
    seen.add(source)
    found = [(source, name)]
    for entry in sorted(source.iterdir()):
        found.extend(_walk(root, os.path.join(name, entry.name), seen))
    return found


async def _read_capped(stream: asyncio.StreamReader | None, cap: int, kept: bytearray) -> None:
    """Read ``stream`` to EOF, keeping its first ``cap`` bytes in ``kept`` (kept even if cancelled)."""
    if stream is not None:
        while chunk := await stream.read(65536):
            if len(kept) < cap:
                kept += chunk[: cap - len(kept)]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
