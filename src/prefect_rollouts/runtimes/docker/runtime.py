"""The ``docker`` runtime: one container per rollout (and per isolated scoring attempt).

Built on the Python ``docker`` SDK (a local daemon or ``DOCKER_HOST``). The container runs
``sleep infinity`` under an init process with CPU, memory and pids limits and capped logs
(``docker/limits.py``, which also tells which limit a dead command hit), all capabilities
dropped and ``no-new-privileges``, labelled with the run, rollout and flow run ids, the Prefect
API and the owning process, so the janitor flow can find leftovers and tell whose owner is
gone. ``network = "none"`` gives it only a loopback interface; under ``{ allow, block }`` its only
way out is the agent's egress proxy (``docker/network.py``, ``egress``). Its root is writable everywhere;
``storage_mb`` is its disk quota, enforced as this engine allows (``docker/storage.py``: a size on the
writable layer, or the watch of ``docker/quota.py``; ``docker/volumes.py``), and a rollout past it ends as
the agent's failure (``storage_quota``, scored 0): its ``exec`` and ``check_storage`` raise ``AgentFailure``.
The SDK is blocking: every call runs in the runtime's own thread pool (``engine.in_thread``). ``stop``
removes the container on every path, cancellation included.

What a container is made of sits beside this module: ``create.py`` (creating it), ``commands.py`` (a command
under its deadline), ``routing.py`` (moves between network policies), ``archive.py`` (files), ``quota.py``
(the disk quota's watch), ``engine.py`` (the client, the thread pool, removal).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import functools
import io
import posixpath
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors

from prefect_rollouts import limits
from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import AgentFailure, InfrastructureError, RuntimeUnavailableError, TaskError
from prefect_rollouts.runtimes.base import ExecResult
from prefect_rollouts.runtimes.docker import archive as archives
from prefect_rollouts.runtimes.docker import commands, routing, storage
from prefect_rollouts.runtimes.docker import limits as resources
from prefect_rollouts.runtimes.docker import private as private_view
from prefect_rollouts.runtimes.docker.create import create_container
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client, in_thread, kill_all, remove
from prefect_rollouts.runtimes.egress.proxy import EgressProxy, Route
from prefect_rollouts.unwind import run_to_end


class DockerRuntime:
    """A container as workspace; commands run with ``bash -c`` in ``config.workdir``.

    Args:
        config: ``RuntimeConfig`` with ``type = "docker"`` (image, workdir, cpus, memory_mb,
            pids_limit, docker_network, network, limits).
        network: Overrides ``config.network`` (scoring's policy).
        labels: Added to the container as ``org.prefect-rollouts.<key>`` labels, besides
            ``owner`` (this process, see ``runtimes.owner``) and ``started_at`` (Unix seconds),
            the evidence the janitor flow goes by.
        source: The config table ``config`` came from, named in error messages.
        binds: Host directory -> container path, bind-mounted read-write (``PATH:ro``: read-only).
        egress: The agent's egress proxy; needed once the network policy has rules.
    """

    def __init__(self, config: RuntimeConfig, *, network: NetworkPolicy | None = None,
                 labels: dict[str, str] | None = None, source: str = "[env.agent.runtime]",
                 binds: dict[str, str] | None = None, egress: EgressProxy | None = None) -> None:
        self.config = config
        self.binds = {host: inside.removesuffix(":ro") for host, inside in (binds or {}).items()}
        self._read_only = {host for host, inside in (binds or {}).items() if inside.endswith(":ro")}
        self.source = source
        self.labels = dict(labels or {})
        self.id = ""
        self.container: Any = None
        self._owner = True
        self._slot: limits.HeldSlot | None = None
        self._quota: dict[str, Any] = {}
        """The quota's ``mode``, ``paths`` (filesystems it caps, for ``df``), ``volumes`` (the image's
        VOLUMEs are tmpfs), ``enospc`` (a command or write saw "No space left on device") and under the
        ``watch`` mode its ``watch`` (``docker_quota.QuotaWatch``); shared with ``scoped`` views."""
        self._seen: dict[str, int] = {}
        """The cgroup counters ``limits_hit`` read last (shared with ``scoped`` views)."""
        self._users: set[str] = set()
        """Users other than the image's that ran a command here (``exec(user=...)``, ``config.user``), for
        ``kill_all``: under ``cap_drop=ALL`` a user can signal only its own processes. Shared with views."""
        self._egress = egress
        self._net: dict[str, Any] = {"network": network or config.network}
        """Shared with ``scoped`` views: the container's ``network`` policy now, and under rules its
        ``route``, ``proxy`` (address, port), ``guarded`` and the proxy variables ``env``."""

    @property
    def network(self) -> NetworkPolicy:
        """The policy the container's commands run under now (the same for every ``scoped`` view)."""
        policy: NetworkPolicy = self._net["network"]
        return policy

    @property
    def egress_route(self) -> Route | None:
        """This container's route through the egress proxy (None until a policy with rules applied)."""
        return self._net.get("route")

    async def start(self) -> None:
        """Create and start the container.

        Raises:
            RuntimeUnavailableError: no engine (retryable), the image is missing (not
                retryable; the message names ``prefect-rollouts sandbox build``), the
                container cannot start, or no slot of ``[limits] containers`` could be asked for.

        With ``[limits] containers`` in force, waits for a slot first and holds it until ``stop``
        has removed the container. An isolated-scoring container (label ``role=scoring``) runs
        under its rollout's slot: the rollout's own container is alive until teardown, so a
        second slot per rollout could deadlock a full limit.
        """
        if self.labels.get("role") != "scoring":
            try:
                self._slot = await limits.hold_container_slot()
            except InfrastructureError as exc:
                raise RuntimeUnavailableError(f'runtime "docker": no slot of [limits] containers: {exc}') from exc
        job = asyncio.ensure_future(in_thread(self._create))
        try:
            self.container = await asyncio.shield(job)
        except asyncio.CancelledError:   # the thread creates the container all the same: wait for it, remove it
            with contextlib.suppress(BaseException):   # cancelled again while waiting: still waits to the end
                await run_to_end(job)
            if not job.cancelled() and job.exception() is None:
                self.container = job.result()
            await run_to_end(self.stop())
            await self._release_slot()
            raise
        except BaseException:
            await self._release_slot()
            raise
        self.id = self.container.id
        if self.network.mode == "rules":
            try:
                await self._restrict(self.network)
            except BaseException:
                await self.stop()
                raise

    async def _restrict(self, policy: NetworkPolicy) -> None:
        await routing.restrict(self._net, policy, **self._routing())

    def _routing(self) -> dict[str, Any]:
        phase = "scoring" if self.labels.get("role") == "scoring" else "setup"
        return {"container": self.container, "config": self.config, "source": self.source, "egress": self._egress,
                "phase": phase}

    def _create(self) -> Any:
        container, quota = create_container(self.config, source=self.source, labels=self.labels, binds=self.binds,
                                            read_only=self._read_only, network_mode=self.network.mode,
                                            users=self._users)
        self._quota.update(quota)
        return container

    async def upload(self, source: Path, target: str) -> None:
        """``Runtime.upload``: a tar of ``source`` unpacked at ``target`` (absolute, or relative to the
        workdir), its parent created first.

        A directory uploaded onto the workdir itself is unpacked into it.

        Raises:
            FileNotFoundError: ``source`` does not exist. OSError: the place is not writable.
        """
        destination = posixpath.normpath(posixpath.join(self.config.workdir, target))   # an absolute target wins
        parent, name = posixpath.split(destination)
        workdir = posixpath.normpath(self.config.workdir)

        def pack() -> tuple[bytes, bool]:
            if not source.exists():
                raise FileNotFoundError(f"{source}: no such file or directory")
            onto = destination == workdir and source.is_dir()
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                tar.add(source, arcname="." if onto else name)
            return buffer.getvalue(), onto
        archive, onto_workdir = await asyncio.to_thread(pack)
        if not onto_workdir and parent != workdir:
            made = await self.exec(f"mkdir -p {shlex.quote(parent)}", timeout=30)
            if made.exit_code != 0:
                raise OSError(f"cannot create {parent} in the container: {made.stderr.strip()}")

        def put() -> None:
            try:
                docker_client().api.put_archive(self._container_id(), destination if onto_workdir else parent, archive)
            except docker.errors.APIError as exc:
                raise OSError(f"cannot write {destination} in the container ({exc.explanation or exc})") from None
        await in_thread(put)

    async def kill_all(self) -> None:
        """``Runtime.kill_all``: SIGKILL every process but the init (PID 1) and the keep-alive
        ``sleep infinity``, until none is left (up to 5 rounds; a fork bomb too: ``docker_limits.KILL_ALL``),
        swept as the image's user and as each other user that ran a command (no capability lets one user
        signal another's processes here); a lost container is left alone."""
        if self.container is not None:
            await in_thread(kill_all, self._container_id(), self._users)

    async def check_storage(self) -> None:
        """``Runtime.check_storage``: the layer is past ``storage_mb`` (the watch found it, or its last
        measurement, taken now, does), a command or write of the rollout met "No space left on
        device", or a filesystem the quota caps has less than 1 MiB free (``df``).

        Raises:
            AgentFailure: ``storage_quota``, ``scored=False`` (``TaskError`` in a scoring container).
        """
        if not self._quota or self.container is None:
            return
        watch = self._quota.get("watch")
        if watch is not None and watch.breach is None:
            with contextlib.suppress(Exception):   # what was written since its last measurement
                await in_thread(watch.measure)
        if (failure := self._past_quota()) is not None:
            raise failure
        full = []
        if paths := self._quota["paths"]:
            usage = await self.exec("df -P -k " + " ".join(shlex.quote(path) for path in paths), timeout=30)
            full = storage.full_places(usage.stdout)
        if full or self._quota["enospc"]:
            where = f"{', '.join(full)} full" if full else 'a command or write met "No space left on device"'
            raise self._quota_failure(f"{self.source} storage_mb = {self.config.storage_mb}: the rollout filled its "
                                      f"disk quota ({where}). Raise storage_mb, or have the task write less")

    def _past_quota(self) -> Exception | None:
        """The failure to raise once the watch found the layer past ``storage_mb`` (None before)."""
        watch = self._quota.get("watch")
        if watch is None or watch.breach is None:
            return None
        return self._quota_failure(
            f"{self.source} storage_mb = {self.config.storage_mb}: the rollout wrote {watch.breach / 2**20:.0f} MiB to "
            f"the container's disk (its writable layer, measured by {watch.how}), past the quota; its processes "
            "were killed. Raise storage_mb, or have the task write less")

    def _quota_failure(self, message: str) -> Exception:
        if self.labels.get("role") == "scoring":   # the task's own tests filled it: not the agent's result
            return TaskError(message)
        return AgentFailure(message, "storage_quota", scored=False)

    async def stop(self) -> None:
        """Remove the container (force) and close its egress route. Idempotent; a ``scoped`` view leaves it alone."""
        container, self.container = self.container, None
        if container is not None and self._owner:
            if (watch := self._quota.get("watch")) is not None:
                watch.close()
            try:
                await run_to_end(in_thread(remove, container))
            finally:
                if (route := self._net.get("route")) is not None and self._egress is not None:
                    self._egress.close_route(route)
                await self._release_slot()

    async def _release_slot(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            await run_to_end(slot.release())

    async def scoped(self, *, env: dict[str, str] | None = None, network: NetworkPolicy | None = None) -> DockerRuntime:
        """A view of this started container whose commands get ``env``; ``network`` (if it
        differs) applies to the container from now on, for every view (``docker/network.py``: ``none``
        leaves loopback only, ``open`` joins ``docker_network``, rules guard it and go through the
        egress proxy). Stopping the view does nothing."""
        view = copy.copy(self)
        view.config = self.config.model_copy(update={"env": {**self.config.env, **(env or {})}})
        view._owner = False
        if network is not None and network != self.network:
            await routing.apply(self._net, network, **self._routing())
        return view

    async def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        """``Runtime.exec`` in ``config.workdir``, as ``user`` (else ``config.user``, else the image's ``USER``);
        raises ``AgentFailure`` (``storage_quota``) when the disk quota's watch killed the command or had
        found the layer past ``storage_mb`` before.

        The command runs in its own process group, killed when it ends or at its timeout. A
        process that leaves that group (``setsid``, a double fork) is not killed with it: it
        lives until the container is removed, which ``stop`` (the rollout's teardown) always
        does; meanwhile ``pids_limit`` bounds how many there can be. (Killing every process of
        the container at a timeout would also kill the commands of parallel tool calls.)
        Raises ``RuntimeUnavailableError`` (retryable) when the container is gone or the engine failed.
        """
        if (failure := self._past_quota()) is not None:   # nothing more runs in a box past its quota
            raise failure
        limit = timeout or self.config.exec_timeout_s
        proxied = self._net.get("env", {}) if self.network.mode == "rules" else {}
        environment = {**self.config.env, **(env or {}), **proxied}
        user = (self.config.user or "") if user is None else user
        if user:
            self._users.add(user)
        started = time.monotonic()
        code, out, err = await in_thread(commands.run, docker_client().api, self._container_id(), cmd, limit,
                                         self.config, environment, user)
        timed_out = code == 137 and time.monotonic() - started >= limit
        if self._quota and storage.ENOSPC_TEXT in err:
            self._quota["enospc"] = True
        if (failure := self._past_quota()) is not None:   # the watch killed this command
            raise failure
        if code in (137, -1) and not timed_out:  # SIGKILL: of the command, or of the whole container?
            await in_thread(resources.check_alive, self.container)
        return ExecResult(-9 if timed_out else code, out, err, timed_out)

    async def exec_private(self, cmd: str, *, inputs: dict[str, Path], private: list[str], collect: str,
                           keep_bytes: int, timeout: float, env: dict[str, str] | None = None,
                           user: str | None = None) -> tuple[ExecResult, dict[str, tuple[int, bytes]]]:
        """``cmd`` (``bash -c``, its output discarded: write it to a file in ``collect``) in a private view of
        this container that its other processes cannot touch (``docker_private.run_private``: the arguments
        and what it raises), with this runtime's environment and network; the private tmpfs holds
        ``storage_mb`` (1 GiB without a quota), as ``user`` (else ``config.user``, else the image's ``USER``).
        An engine error is a ``RuntimeUnavailableError`` (retryable).

        Returns:
            The command's ``ExecResult`` (no output; exit code -9 when its deadline killed it) and the files
            it left in ``collect``: name -> (size in bytes, last ``keep_bytes``).
        """
        proxied = self._net.get("env", {}) if self.network.mode == "rules" else {}
        user = (self.config.user or "") if user is None else user
        if not user and self.container is not None:   # the image's USER, as a plain exec runs
            user = (self.container.attrs.get("Config") or {}).get("User") or ""
        job = functools.partial(
            private_view.run_private, docker_client(), self._container_id(), resources.create_options(self.config),
            command=cmd, environment={**self.config.env, **(env or {}), **proxied},
            workdir=self.config.workdir, inputs=inputs, private=private, collect=collect, keep_bytes=keep_bytes,
            size_mb=self.config.storage_mb or 1024, timeout_s=timeout,
            labels={**(self.container.labels if self.container is not None else {}), f"{LABEL}.role": "private"},
            user=user)
        try:
            code, timed_out, _, files = await in_thread(job)
        except docker.errors.APIError as exc:
            raise RuntimeUnavailableError(f'runtime "docker": a private view of container {self.id[:12]} failed '
                                          f"({exc.explanation or exc})") from exc
        return ExecResult(-9 if timed_out else code, "", "", timed_out), files

    async def limits_hit(self) -> dict[str, str]:
        """``Runtime.limits_hit``: the container's cgroup counters, read inside it (``docker/limits.py``)."""
        if self.container is None:
            return {}
        return await in_thread(resources.limits_hit, docker_client().api, self._container_id(), self.config,
                                self.source, self._seen, self._quota.get("volumes", False))

    async def read_file(self, path: str) -> bytes:
        """Bytes of a file in the workdir.

        Raises:
            FileNotFoundError: it does not exist. ValueError: not a regular file, or the path leaves the workdir.
        """
        target = self._path(path)
        return await in_thread(archives.read_file, docker_client().api, self._container_id(), target, path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file in the workdir (parent directories are created)."""
        relative = posixpath.relpath(self._path(path), self.config.workdir)
        archive = archives.file_tar(relative, data.encode() if isinstance(data, str) else data)
        await in_thread(self._put_archive, archive, path)

    async def collect_artifacts(self, paths: list[str]) -> tuple[bytes, list[str]]:
        """Pack the declared workdir paths into a tar (names relative to the workdir).

        Regular files, directories and symlinks are kept (a link is restored as a link);
        devices and FIFOs are dropped. Missing paths are listed, not raised.

        Raises:
            TaskError: more than ``config.artifact_max_bytes`` (counted while streaming).
        """
        targets = {rel: self._path(rel) for rel in paths}
        return await in_thread(archives.collect, docker_client().api, self._container_id(), self.config.workdir,
                                targets, self.config.artifact_max_bytes)

    async def restore_artifacts(self, archive: bytes) -> None:
        """Unpack a ``collect_artifacts`` archive into the workdir."""
        await in_thread(self._put_archive, archive, "the artifacts")

    def _put_archive(self, archive: bytes, what: str) -> None:
        """Unpack ``archive`` into the workdir; a full quota is ``OSError(ENOSPC)`` naming ``what``."""
        try:
            docker_client().api.put_archive(self._container_id(), self.config.workdir, archive)
        except docker.errors.APIError as exc:
            if "no space left on device" not in str(exc).lower():
                raise
            if self._quota:
                self._quota["enospc"] = True
            raise OSError(errno.ENOSPC, f"No space left on device: writing {what} "
                                        f"(storage_mb = {self.config.storage_mb})") from None

    def _container_id(self) -> str:
        if self.container is None:
            raise RuntimeError('runtime "docker" is not started (or already stopped)')
        return str(self.container.id)

    def _path(self, path: str) -> str:
        target = posixpath.normpath(posixpath.join(self.config.workdir, path))
        if target != self.config.workdir and not target.startswith(self.config.workdir.rstrip("/") + "/"):
            raise ValueError(f"path {path!r} leaves the workspace; use a path relative to it")
        return target
