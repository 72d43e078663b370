"""The ``local`` runtime: a fresh temporary workspace and subprocesses on this machine.

For development and machines without a container engine. It isolates files by directory only.

Process lifetime: each command runs as PID 1 of its own PID namespace (``unshare --pid --fork
--kill-child``). When that first process ends, or is killed at the command's timeout, the kernel
kills every process in the namespace, so nothing the command started outlives it: not a
background job, not a ``setsid``/``nohup`` escapee, not a double fork. A process group or a
session does not give this (``setsid`` leaves both), a cgroup needs a writable cgroup v2 tree
(not given in containers or on cgroup v1 hosts), and a subreaper would make the whole eval
process the parent of every orphan; a PID namespace is one ``unshare`` per command and the
kernel does the rest. It needs root or unprivileged user namespaces (then ``--user
--map-root-user`` is added); where neither works, commands run in their own session and
process group only, and a warning says that a process leaving its session may outlive them.

``network = "none"`` adds a network namespace (``unshare --net``) under the same conditions;
where that fails, starting the runtime fails.

Workspaces are ``rollout-<host>_<boot>_<pid>_<start>-<random>`` directories under the temporary
directory, naming the process that owns them (``runtimes.owner``), so the janitor flow can
remove those of a killed eval and never those of a live one.
"""

from __future__ import annotations

import asyncio
import copy
import io
import logging
import os
import posixpath
import shutil
import signal
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import ConfigError, RuntimeUnavailableError, TaskError
from prefect_rollouts.runtimes.base import SCRUB_SLACK_BYTES, ExecResult, output_text
from prefect_rollouts.runtimes.owner import Owner, current_owner

logger = logging.getLogger("prefect_rollouts.runtimes")

WORKSPACE_PREFIX = "rollout-"
"""Workspace directories are ``<tempdir>/rollout-<owner>-<random>`` (see ``workspace_owner``)."""

_BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ")
_DRAIN_S = 0.5
"""After a command ends, how long its pipes may stay open (held by an escaped process) before reading stops."""
_PID_NAMESPACE = ["unshare", "--pid", "--fork", "--kill-child"]
_PARENT_DEATH = ["setpriv", "--pdeathsig", "KILL"]
"""``unshare`` gets SIGKILL when the process running the rollout dies (even by ``kill -9``), and
its ``--kill-child`` ends the namespace: no command outlives a killed eval."""


class LocalRuntime:
    """A temporary directory as workspace; commands run with ``bash -c`` inside it.

    Args:
        config: ``RuntimeConfig`` with ``type = "local"``.
        network: Overrides ``config.network`` (used for scoring's policy).
        labels: Accepted for the ``Runtime`` interface and kept on ``self.labels``; a directory has
            nowhere to carry them (the docker runtime puts them on its containers).
    """

    def __init__(self, config: RuntimeConfig, *, network: NetworkPolicy | None = None,
                 labels: dict[str, str] | None = None, binds: dict[str, str] | None = None) -> None:
        self.config = config
        self.binds = {host: host for host in binds or {}}
        self.network = network or config.network
        self.labels = dict(labels or {})
        self.workspace: Path | None = None
        self.id = ""
        self._prefix: list[str] = []
        self._owner = True
        self._isolation: list[str] = []

    async def start(self) -> None:
        """Create the workspace; with ``network = "none"`` check that a namespace can be made.

        Raises:
            ConfigError: ``network = "none"`` but no network namespace can be created here.
            RuntimeUnavailableError: the temporary directory cannot be created.
        """
        self._isolation = await _process_isolation()
        if self.network.mode == "none":
            self._prefix = ["unshare", "--net"]
            await self._check_namespace()
        try:
            self.workspace = Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{current_owner()}-"))
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

    async def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        """``Runtime.exec`` in the workspace directory. Here the timeout kills the command and every
        process it started, within about half a second of the deadline whatever it does (a process
        that escaped to its own session cannot hold the call open); when the call returns, no
        process the command started is left (see the module docstring for the one exception).

        Raises:
            ValueError: ``user`` names a user (this runtime runs commands as this process's user only).
        """
        if user:
            raise ValueError(f'runtime "local" cannot run a command as user {user!r}: its commands run as this '
                             'process\'s user. Use [env.agent.runtime] type = "docker"')
        root = self._root()
        proc_env = {k: os.environ[k] for k in _BASE_ENV_KEYS if k in os.environ}
        proc_env.update(HOME=str(root), **self.config.env, **(env or {}))
        proc = await asyncio.create_subprocess_exec(
            *self._prefix, *self._isolation, "bash", "-c", cmd, cwd=root, env=proc_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        cap = self.config.output_cap_bytes + SCRUB_SLACK_BYTES
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
            _kill_group(proc.pid)  # the command's background jobs end with it (and its namespace)
            # not proc.wait(): on Python 3.11 it also waits for the pipes, which an escaped process holds
            await asyncio.shield(_reaped(proc))
            # without a PID namespace a process that left the group (setsid) may hold the pipes open
            await asyncio.wait(readers, timeout=_DRAIN_S)
            for reader in readers:
                reader.cancel()
        cap = self.config.output_cap_bytes
        return ExecResult(code, output_text(out, cap), output_text(err, cap), timed_out)

    async def upload(self, source: Path, target: str) -> None:
        """``Runtime.upload``; ``target`` must lie in the workspace (this runtime has no filesystem of its own).

        Raises:
            FileNotFoundError: ``source`` does not exist. ValueError: ``target`` leaves the workspace.
        """
        root = str(self._root())
        inside = posixpath.normpath(posixpath.join(root, target))   # an absolute target wins the join
        if inside != root and not inside.startswith(root.rstrip("/") + "/"):
            raise ValueError(f"{target!r} is outside the workspace: the local runtime has no filesystem of its own. "
                             'Use a path relative to the workspace, or [env.agent.runtime] type = "docker"')
        destination = self._resolve(posixpath.relpath(inside, root))

        def copy() -> None:
            if not source.exists():
                raise FileNotFoundError(f"{source}: no such file or directory")
            destination.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, destination, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(source, destination)
        await asyncio.to_thread(copy)

    async def kill_all(self) -> None:
        """``Runtime.kill_all``: nothing to do, since each command runs as PID 1 of its own PID
        namespace and every process it started dies with it when its ``exec`` returns or is cancelled."""

    async def limits_hit(self) -> dict[str, str]:
        """``Runtime.limits_hit``: none; the local runtime sets no memory or process limit."""
        return {}

    async def check_storage(self) -> None:
        """``Runtime.check_storage``: the local workspace has no quota of its own (the host's disk
        bounds it), so there is nothing to check."""

    async def read_file(self, path: str) -> bytes:
        """``Runtime.read_file``; a FIFO or device is refused (it would block)."""
        target = self._resolve(path)
        if target.exists() and not target.is_file():
            raise ValueError(f"path {path!r} is not a regular file")
        return await asyncio.to_thread(target.read_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """``Runtime.write_file``."""
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


async def _reaped(proc: asyncio.subprocess.Process) -> None:
    """Wait until the killed ``proc`` has been reaped (its exit status is known), not for its pipes."""
    while proc.returncode is None:  # noqa: ASYNC110  (on 3.11 no event says "reaped" without the pipes)
        await asyncio.sleep(0.01)


_isolation_checked: list[str] | None = None


async def _process_isolation() -> list[str]:
    """The ``unshare`` prefix that gives each command its own PID namespace here (checked once per
    process), or ``[]`` with a warning where no PID namespace can be made."""
    global _isolation_checked
    if _isolation_checked is None:
        errors = []
        for namespace in (_PID_NAMESPACE, ["unshare", "--user", "--map-root-user", *_PID_NAMESPACE[1:]]):
            prefix = [*_PARENT_DEATH, *namespace] if shutil.which("setpriv") else namespace
            try:
                proc = await asyncio.create_subprocess_exec(*prefix, "true", stdout=subprocess.DEVNULL,
                                                            stderr=subprocess.PIPE)
                _, err = await proc.communicate()
            except OSError as exc:   # no unshare binary
                errors.append(str(exc))
                break
            if proc.returncode == 0:
                _isolation_checked = prefix
                return prefix
            errors.append(err.decode(errors="replace").strip())
        _isolation_checked = []
        logger.warning('runtime "local": cannot give commands their own PID namespace (%s); a process that '
                       "leaves its session (setsid, a double fork) may outlive its command and the rollout. "
                       'Run as root, allow unprivileged user namespaces, or use runtime "docker"',
                       "; ".join(errors) or "unknown")
    return _isolation_checked


def workspace_owner(path: Path) -> Owner | None:
    """The owner named in a workspace directory's name, or None (not a workspace, or an older name)."""
    name = path.name
    if not name.startswith(WORKSPACE_PREFIX):
        return None
    return Owner.parse(name[len(WORKSPACE_PREFIX):].rsplit("-", 1)[0])


async def _wait_exit(proc: asyncio.subprocess.Process, readers: Sequence[asyncio.Future[None]]) -> int:
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
