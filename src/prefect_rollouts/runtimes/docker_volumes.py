"""The image's ``VOLUME`` paths under the docker runtime's disk quota (``storage_mb``).

For each ``VOLUME`` line of an image (postgres, mysql, mongo and many other service images have
one) Docker makes an anonymous volume on the engine's disk, outside both quotas of
``docker_storage``: the ``tmpfs`` quota's places do not cover it, and ``storage_opt size`` caps only
the writable layer (with ``storage_mb = 64``, ``dd`` wrote 300 MiB to an image's ``/data`` on the host
disk). So under either quota each such path that no other mount covers gets a tmpfs volume of its
own instead, like the workspace: ``storage_mb`` each, removed with the container, and seeded with the
image's files there as Docker seeds an anonymous volume (``seed``: Docker copies nothing into a tmpfs
one). The directory itself is the tmpfs's (mode 1777, root's), not the image's: an entrypoint that
needs its owner or mode sets them, as postgres's and mysql's do.

How volumes count: as the ``tmpfs`` quota's places do, each is capped at ``storage_mb`` and held in
memory, its pages counted against ``memory_mb``; so all the box writes to them, to its other tmpfs
places and (under ``size``) to its writable layer stays within ``memory_mb`` plus ``storage_mb`` and
nothing lands on the engine's disk past ``storage_mb``. A write past ``storage_mb`` in one volume fails
with ENOSPC (and ``check_storage`` reports the filled quota); past ``memory_mb`` the OOM killer ends a
process. A service whose data outgrows that needs ``storage_mb = 0`` (no quota: then Docker's own
anonymous volumes on disk, as without this runtime).

Must not import Prefect.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

from docker.types import DriverConfig, Mount

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.runtimes.docker_storage import image_workdir


def image_volumes(image: Any) -> list[str]:
    """The image's ``VOLUME`` paths (``Config.Volumes`` of ``docker image inspect``), normalised and
    sorted; absolute paths only (Docker makes relative ones absolute at build)."""
    volumes = (image.attrs.get("Config") or {}).get("Volumes") or {}
    return sorted({posixpath.normpath(path) for path in volumes if path.startswith("/")} - {"/"})


def volume_mounts(config: RuntimeConfig, image: Any, mounts: Iterable[Mount], tmpfs: Iterable[str]) -> list[Mount]:
    """A tmpfs volume of ``config.storage_mb`` for each of the image's ``VOLUME`` paths (``image_volumes``)
    that the container's other ``mounts`` and ``tmpfs`` places do not mount already (a mount at the
    same path replaces the image's volume); none without a quota.

    Args:
        config: The runtime config (``storage_mb``).
        image: The container's image (``docker.models.images.Image``).
        mounts: The quota's and the binds' ``Mount`` objects.
        tmpfs: The container paths of the quota's tmpfs mounts (``quota_options``' ``tmpfs``).

    Returns:
        ``Mount`` objects for ``containers.run(mounts=...)``, one per uncovered volume path.
    """
    if config.storage_mb == 0:
        return []
    covered = {posixpath.normpath(path) for path in (*(mount["Target"] for mount in mounts), *tmpfs)}
    options = {"type": "tmpfs", "device": "tmpfs", "o": f"size={config.storage_mb}m"}
    return [Mount(path, None, type="volume", driver_config=DriverConfig("local", options))   # anonymous: removed
            for path in image_volumes(image) if path not in covered]                        # with the container


def seed(client: Any, container_id: str, image_id: str, paths: Iterable[str]) -> None:
    """Copy the image's own files at each of ``paths`` (tmpfs places that hide them: the workspace and
    ``volume_mounts``) into the container ``container_id`` before its commands run; read once per image
    and path (``docker_storage.image_workdir``).

    Raises:
        docker.errors.APIError: the engine refused an archive (the caller removes the container).
    """
    for path in paths:
        if files := image_workdir(client, image_id, path):
            client.api.put_archive(container_id, path, files)
