"""Creating a docker runtime's container: the image checked, labels, mounts, limits, network mode, capabilities
and the disk quota (as ``docker/storage.py`` says this engine enforces it), with the image's ``VOLUME``s seeded
and, under the ``watch`` mode, the quota's watch started. Must not import Prefect."""

from __future__ import annotations

import functools
import time
from typing import Any

import docker.errors
from docker.types import Mount

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes.docker import limits as resources
from prefect_rollouts.runtimes.docker import network as net
from prefect_rollouts.runtimes.docker import private as private_view
from prefect_rollouts.runtimes.docker import quota as docker_quota
from prefect_rollouts.runtimes.docker import storage
from prefect_rollouts.runtimes.docker import volumes as image_volumes
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client, engine_info, kill_all, remove
from prefect_rollouts.runtimes.owner import current_owner


def create_container(config: RuntimeConfig, *, source: str, labels: dict[str, str], binds: dict[str, str],
                     read_only: set[str], network_mode: str, users: set[str]) -> tuple[Any, dict[str, Any]]:
    """Create and start a rollout's container from ``config`` (the docker runtime's ``start``, in a thread).

    Args:
        config: The runtime's config (image, workdir, limits, ``storage_mb``, env).
        source: The config table it came from, for error messages.
        labels: Added as ``org.prefect-rollouts.<key>`` besides ``owner`` and ``started_at``.
        binds: Host directory -> container path; those in ``read_only`` are mounted read-only.
        network_mode: The policy's mode at creation (``none``, ``open`` or ``rules``).
        users: The runtime's users set, which the quota watch's kill sweeps as well (shared, filled later).

    Returns:
        The started container and the disk quota's state for the runtime (empty without ``storage_mb``):
        ``mode``, ``enospc``, ``volumes``, ``paths`` and, under the ``watch`` mode, the ``watch``.

    Raises:
        RuntimeUnavailableError: the image is missing or the engine cannot enforce the quota (not
            retryable), or the container cannot start.
    """
    client = docker_client()
    quota_state: dict[str, Any] = {}
    try:
        image = client.images.get(config.image)
    except docker.errors.ImageNotFound:
        raise RuntimeUnavailableError(
            f'{source} image = "{config.image}": no such image on the Docker engine. Build the '
            "default sandbox with `prefect-rollouts sandbox build`, or name an image you have",
            retryable=False) from None
    tags = {LABEL: "1", f"{LABEL}.started_at": str(int(time.time())), f"{LABEL}.owner": str(current_owner()),
            **{f"{LABEL}.{key}": value for key, value in labels.items()}}
    mode = storage.quota_mode(engine_info(client))
    quota = storage.quota_options(config, mode)
    mounts = [Mount(inside, host, type="bind", read_only=host in read_only)
              for host, inside in binds.items()]
    volumes = image_volumes.volume_mounts(config, image, mounts)   # the image's VOLUMEs: tmpfs of storage_mb
    try:
        container = client.containers.run(
            config.image, ["sleep", "infinity"], detach=True, init=True, working_dir=config.workdir,
            labels=tags, **net.create_options(network_mode, config.docker_network),
            **resources.create_options(config), cap_drop=["ALL"], security_opt=["no-new-privileges"],
            cap_add=list(private_view.BOX_CAPABILITIES) if config.capabilities == "docker-default" else None,
            environment=dict(config.env), mounts=[*mounts, *volumes],
            **quota)
    except docker.errors.APIError as exc:
        if mode == "size" and storage.refuse_size(exc):
            # overlay2 on xfs without pquota: quota_mode now says the watch instead
            return create_container(config, source=source, labels=labels, binds=binds, read_only=read_only,
                                    network_mode=network_mode, users=users)
        if (quota or volumes) and any(word in str(exc).lower() for word in ("tmpfs", "mount", "volume", "storage")):
            raise RuntimeUnavailableError(
                f"{source} storage_mb = {config.storage_mb}: the Docker engine (storage driver "
                f"{engine_info(client).get('Driver')}) cannot enforce the disk quota: {exc.explanation or exc}. "
                "Use an engine whose driver takes a size (overlay2 on xfs with pquota, btrfs, zfs), or set "
                "storage_mb = 0 for no quota", retryable=False) from exc
        raise RuntimeUnavailableError(f'runtime "docker": cannot start a container from {config.image} '
                                      f"({exc.explanation or exc})") from exc
    if config.storage_mb:
        quota_state.update(mode=mode, enospc=False, volumes=bool(volumes),
                           paths=[*([config.workdir] if mode == "size" else []), *(v["Target"] for v in volumes)])
    try:
        image_volumes.seed(client, container.id, image.id, [volume["Target"] for volume in volumes])
        if config.storage_mb and mode == "watch":
            quota_state["watch"] = docker_quota.QuotaWatch(client.api, container.id, config.storage_mb,
                                                           functools.partial(kill_all, container.id, users))
    except BaseException:
        remove(container)
        raise
    return container, quota_state

