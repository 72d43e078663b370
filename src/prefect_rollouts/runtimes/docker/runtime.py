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
The SDK is blocking, so every call runs in a thread of the runtime's own pool (``_in_thread``):
an ``exec`` holds its thread for the whole command, and asyncio's default pool (``min(32,
cores + 4)`` threads, 6 here) would queue concurrent commands behind each other. ``stop``
removes the container on every path, cancellation included.

Past 400 lines (about 550) because every part works on the one container handle; the archive work
is in ``docker/archive.py``, the disk quota's watch in ``docker/quota.py``; the network changes
(``scoped``, ``_apply``) are the part to move out next.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import errno
import functools
import io
import posixpath
import shlex
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
from docker.types import Mount

from prefect_rollouts import limits
from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import AgentFailure, InfrastructureError, RuntimeUnavailableError, TaskError
from prefect_rollouts.runtimes.base import SCRUB_SLACK_BYTES, ExecResult, output_text
from prefect_rollouts.runtimes.docker import archive as archives
from prefect_rollouts.runtimes.docker import limits as resources
from prefect_rollouts.runtimes.docker import network as net
from prefect_rollouts.runtimes.docker import private as private_view
from prefect_rollouts.runtimes.docker import quota as docker_quota
from prefect_rollouts.runtimes.docker import storage
from prefect_rollouts.runtimes.docker import volumes as image_volumes
from prefect_rollouts.runtimes.egress.proxy import EgressProxy, Route
from prefect_rollouts.runtimes.owner import current_owner
from prefect_rollouts.unwind import run_to_end

LABEL = "org.prefect-rollouts"
"""Every container this project starts carries ``LABEL=1`` and ``LABEL.<key>`` labels."""

# Runs the command in its own process group and kills that group when the command ends, so a
# background job neither outlives the command nor holds its output open; a watchdog (output
# to /dev/null, so it holds nothing) kills the group at the deadline. The wrapper's own job-control
# messages go to /dev/null; the command's stderr is fd 3. $1 = command, $2 = seconds.
_WRAPPER = r"""exec 3>&2 2>/dev/null
set -m
bash -c "$1" </dev/null 2>&3 3>&- &
pid=$!
( sleep "$2"; kill -9 -- -$pid ) >/dev/null </dev/null 3>&- &
watchdog=$!
wait $pid
code=$?
kill -9 -- -$pid
kill -9 -- -$watchdog
exit $code
"""


_T = TypeVar("_T")

MAX_THREADS = 512
"""Threads of the docker runtime's pool: the most blocking Docker calls (mostly running
``exec``s) in flight at once in one process. A ``ThreadPoolExecutor`` starts a thread only when
no idle one is free, so the pool grows to the concurrency that uses it, not to this cap."""


@functools.cache
def _executor() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="docker-runtime")


async def _in_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in the docker runtime's thread pool (not asyncio's default one, see the module docstring)."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args))


@functools.cache
def docker_client() -> docker.DockerClient:
    """One Docker client per process (``docker.from_env()``: the local socket or ``DOCKER_HOST``).

    Raises:
        RuntimeUnavailableError: no engine answers.
    """
    try:
        client = docker.from_env(timeout=120, max_pool_size=64)   # connections kept for concurrent calls
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        raise RuntimeUnavailableError(f'runtime "docker": no Docker engine answers at DOCKER_HOST or '
                                      f"/var/run/docker.sock ({exc}). Start dockerd, or set "
                                      '[env.agent.runtime] type = "local"') from exc


@functools.cache
def _engine_info(client: docker.DockerClient) -> dict[str, Any]:
    return dict(client.info())


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
        job = asyncio.ensure_future(_in_thread(self._create))
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
        """Route the container through the egress proxy under ``policy``, guarded (``docker/network.py``).

        Raises:
            RuntimeUnavailableError: no egress proxy, the proxy cannot listen on the network's
                gateway (a remote engine), or the guard could not be set (not retryable).
        """
        state = self._net
        if "route" not in state:
            if self._egress is None:
                raise RuntimeUnavailableError(f"{self.source} network = {{ allow/block }} needs the agent's egress "
                                              "proxy: run the rollout through an agent (make_agent)", retryable=False)
            gateway = await _in_thread(net.gateway, docker_client(), self.container, self.config.docker_network)
            try:
                port = await self._egress.listen(gateway)
            except OSError as exc:
                raise RuntimeUnavailableError(
                    f"{self.source} network = {{ allow/block }}: the egress proxy cannot listen on {gateway}, the "
                    f"gateway of Docker network {self.config.docker_network!r} ({exc}). Rules need a Docker engine on "
                    "this machine", retryable=False) from exc
            route = self._egress.open_route(policy, phase="scoring" if self.labels.get("role") == "scoring" else
                                            "setup")
            state.update(route=route, proxy=(gateway, port), guarded=False,
                         env=EgressProxy.environment(route, gateway, port))
        state["route"].policy = policy
        if not state["guarded"]:
            await _in_thread(net.guard, docker_client(), self.container, state["proxy"])
            state["guarded"] = True

    def _create(self) -> Any:
        client = docker_client()
        config = self.config
        try:
            image = client.images.get(config.image)
        except docker.errors.ImageNotFound:
            raise RuntimeUnavailableError(
                f'{self.source} image = "{config.image}": no such image on the Docker engine. Build the '
                "default sandbox with `prefect-rollouts sandbox build`, or name an image you have",
                retryable=False) from None
        labels = {LABEL: "1", f"{LABEL}.started_at": str(int(time.time())), f"{LABEL}.owner": str(current_owner()),
                  **{f"{LABEL}.{key}": value for key, value in self.labels.items()}}
        mode = storage.quota_mode(_engine_info(client))
        quota = storage.quota_options(config, mode)
        mounts = [Mount(inside, host, type="bind", read_only=host in self._read_only)
                  for host, inside in self.binds.items()]
        volumes = image_volumes.volume_mounts(config, image, mounts)   # the image's VOLUMEs: tmpfs of storage_mb
        try:
            container = client.containers.run(
                config.image, ["sleep", "infinity"], detach=True, init=True, working_dir=config.workdir,
                labels=labels, **net.create_options(self.network.mode, config.docker_network),
                **resources.create_options(config), cap_drop=["ALL"], security_opt=["no-new-privileges"],
                cap_add=list(private_view.BOX_CAPABILITIES) if config.capabilities == "docker-default" else None,
                environment=dict(config.env), mounts=[*mounts, *volumes],
                **quota)
        except docker.errors.APIError as exc:
            if mode == "size" and storage.refuse_size(exc):
                return self._create()   # overlay2 on xfs without pquota: the watch instead
            if (quota or volumes) and any(word in str(exc).lower() for word in ("tmpfs", "mount", "volume", "storage")):
                raise RuntimeUnavailableError(
                    f"{self.source} storage_mb = {config.storage_mb}: the Docker engine (storage driver "
                    f"{_engine_info(client).get('Driver')}) cannot enforce the disk quota: {exc.explanation or exc}. "
                    "Use an engine whose driver takes a size (overlay2 on xfs with pquota, btrfs, zfs), or set "
                    "storage_mb = 0 for no quota", retryable=False) from exc
            raise RuntimeUnavailableError(f'runtime "docker": cannot start a container from {config.image} '
                                          f"({exc.explanation or exc})") from exc
        if config.storage_mb:
            self._quota.update(mode=mode, enospc=False, volumes=bool(volumes),
                               paths=[*([config.workdir] if mode == "size" else []), *(v["Target"] for v in volumes)])
        try:
            image_volumes.seed(client, container.id, image.id, [volume["Target"] for volume in volumes])
            if config.storage_mb and mode == "watch":
                self._quota["watch"] = docker_quota.QuotaWatch(client.api, container.id, config.storage_mb,
                                                               functools.partial(_kill_all, container.id, self._users))
        except BaseException:
            _remove(container)
            raise
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
        await _in_thread(put)

    async def kill_all(self) -> None:
        """``Runtime.kill_all``: SIGKILL every process but the init (PID 1) and the keep-alive
        ``sleep infinity``, until none is left (up to 5 rounds; a fork bomb too: ``docker_limits.KILL_ALL``),
        swept as the image's user and as each other user that ran a command (no capability lets one user
        signal another's processes here); a lost container is left alone."""
        if self.container is not None:
            await _in_thread(_kill_all, self._container_id(), self._users)

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
                await _in_thread(watch.measure)
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
                await run_to_end(_in_thread(_remove, container))
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
            await self._apply(network)
        return view

    async def _apply(self, target: NetworkPolicy) -> None:
        state, client, name = self._net, docker_client(), self.config.docker_network
        before = state["network"].mode
        if target.mode == "rules":
            if before == "none":   # nothing gets out while it joins the network and the proxy is let in
                await _in_thread(net.guard, client, self.container, None)
                state["guarded"] = False
                await _in_thread(net.attach, client, self.container, name)
            await self._restrict(target)
        elif target.mode == "open":
            if state.get("guarded"):
                await _in_thread(net.unguard, client, self.container)
                state["guarded"] = False
            if before == "none":
                await _in_thread(net.attach, client, self.container, name)
        else:
            await _in_thread(net.attach, client, self.container, "none")
        state["network"] = target

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
        code, out, err = await _in_thread(self._exec, ["bash", "-c", _WRAPPER, "bash", cmd, f"{limit:.3f}"],
                                                 environment, user)
        timed_out = code == 137 and time.monotonic() - started >= limit
        if self._quota and storage.ENOSPC_TEXT in err:
            self._quota["enospc"] = True
        if (failure := self._past_quota()) is not None:   # the watch killed this command
            raise failure
        if code in (137, -1) and not timed_out:  # SIGKILL: of the command, or of the whole container?
            await _in_thread(resources.check_alive, self.container)
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
            code, timed_out, _, files = await _in_thread(job)
        except docker.errors.APIError as exc:
            raise RuntimeUnavailableError(f'runtime "docker": a private view of container {self.id[:12]} failed '
                                          f"({exc.explanation or exc})") from exc
        return ExecResult(-9 if timed_out else code, "", "", timed_out), files

    async def limits_hit(self) -> dict[str, str]:
        """``Runtime.limits_hit``: the container's cgroup counters, read inside it (``docker/limits.py``)."""
        if self.container is None:
            return {}
        return await _in_thread(resources.limits_hit, docker_client().api, self._container_id(), self.config,
                                self.source, self._seen, self._quota.get("volumes", False))

    def _exec(self, argv: list[str], environment: dict[str, str], user: str = "") -> tuple[int, str, str]:
        api = docker_client().api
        cap = self.config.output_cap_bytes + SCRUB_SLACK_BYTES
        try:
            exec_id = api.exec_create(self._container_id(), argv, workdir=self.config.workdir,
                                      environment=environment, user=user)["Id"]
            out, err = bytearray(), bytearray()
            for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
                if chunk_out and len(out) < cap:
                    out += chunk_out[: cap - len(out)]
                if chunk_err and len(err) < cap:
                    err += chunk_err[: cap - len(err)]
            code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.APIError as exc:
            raise RuntimeUnavailableError(f'runtime "docker": exec in container {self.id[:12]} failed '
                                          f"({exc.explanation or exc})") from exc
        shown = self.config.output_cap_bytes
        return int(code if code is not None else -1), output_text(out, shown), output_text(err, shown)

    async def read_file(self, path: str) -> bytes:
        """Bytes of a file in the workdir.

        Raises:
            FileNotFoundError: it does not exist. ValueError: not a regular file, or the path leaves the workdir.
        """
        target = self._path(path)
        return await _in_thread(archives.read_file, docker_client().api, self._container_id(), target, path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file in the workdir (parent directories are created)."""
        relative = posixpath.relpath(self._path(path), self.config.workdir)
        archive = archives.file_tar(relative, data.encode() if isinstance(data, str) else data)
        await _in_thread(self._put_archive, archive, path)

    async def collect_artifacts(self, paths: list[str]) -> tuple[bytes, list[str]]:
        """Pack the declared workdir paths into a tar (names relative to the workdir).

        Regular files, directories and symlinks are kept (a link is restored as a link);
        devices and FIFOs are dropped. Missing paths are listed, not raised.

        Raises:
            TaskError: more than ``config.artifact_max_bytes`` (counted while streaming).
        """
        targets = {rel: self._path(rel) for rel in paths}
        return await _in_thread(archives.collect, docker_client().api, self._container_id(), self.config.workdir,
                                targets, self.config.artifact_max_bytes)

    async def restore_artifacts(self, archive: bytes) -> None:
        """Unpack a ``collect_artifacts`` archive into the workdir."""
        await _in_thread(self._put_archive, archive, "the artifacts")

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


REMOVE_TRIES = 3
"""Tries to remove a container, 1 s apart: a busy engine can fail a forced removal once ("could not
kill", "removal already in progress") and take it the next time."""


def _remove(container: Any) -> None:
    for attempt in range(1, REMOVE_TRIES + 1):
        try:
            container.remove(force=True, v=True)   # v: the anonymous tmpfs volumes of the image's VOLUMEs too
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            if attempt == REMOVE_TRIES:
                raise
            time.sleep(1.0)


def _kill_all(container_id: str, users: set[str]) -> None:
    """``docker_limits.kill_all`` in the container as the image's user and ``users``; a lost container or a
    busy engine is left alone."""
    with contextlib.suppress(Exception):
        resources.kill_all(docker_client().api, container_id, list(users))
