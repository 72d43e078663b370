"""The image's ``VOLUME`` paths under the docker runtime's disk quota (``storage_mb``).

For each ``VOLUME`` line of an image (postgres, mysql, mongo and many other service images have
one) Docker makes an anonymous volume on the engine's disk, outside the quota of ``docker/storage.py``:
``storage_opt size`` and the watch (``docker/quota.py``) both cover only the writable layer (with
``storage_mb = 64``, ``dd`` wrote 300 MiB to an image's ``/data`` on the host disk). So under a quota
each such path that no other mount covers gets a tmpfs volume of its own instead: ``storage_mb``
each, removed with the container, and seeded with the image's files there as Docker seeds an
anonymous volume (``seed``: Docker copies nothing into a tmpfs one). The directory itself is the
tmpfs's (mode 1777, root's), not the image's: an entrypoint that needs its owner or mode sets them,
as postgres's and mysql's do.

How volumes count: each is capped at ``storage_mb`` and held in memory, its pages counted against
``memory_mb``; so all the box writes stays within ``storage_mb`` on the engine's disk (plus the
watch's overshoot) and ``memory_mb`` in memory. A write past ``storage_mb`` in one volume fails with
ENOSPC (and ``check_storage`` reports the filled quota); past ``memory_mb`` the OOM killer ends a
process. A service whose data outgrows that needs ``storage_mb = 0`` (no quota: then Docker's own
anonymous volumes on disk, as without this runtime).

Must not import Prefect.
"""

from __future__ import annotations

import functools
import io
import posixpath
import tarfile
from collections.abc import Iterable
from typing import Any

import docker
import docker.errors
from docker.types import DriverConfig, Mount

from prefect_rollouts.config.agent import RuntimeConfig


def image_volumes(image: Any) -> list[str]:
    """The image's ``VOLUME`` paths (``Config.Volumes`` of ``docker image inspect``), normalised and
    sorted; absolute paths only (Docker makes relative ones absolute at build)."""
    volumes = (image.attrs.get("Config") or {}).get("Volumes") or {}
    return sorted({posixpath.normpath(path) for path in volumes if path.startswith("/")} - {"/"})


def volume_mounts(config: RuntimeConfig, image: Any, mounts: Iterable[Mount]) -> list[Mount]:
    """A tmpfs volume of ``config.storage_mb`` for each of the image's ``VOLUME`` paths (``image_volumes``)
    that the container's other ``mounts`` do not mount already (a mount at the same path replaces the
    image's volume); none without a quota.

    Args:
        config: The runtime config (``storage_mb``).
        image: The container's image (``docker.models.images.Image``).
        mounts: The binds' ``Mount`` objects.

    Returns:
        ``Mount`` objects for ``containers.run(mounts=...)``, one per uncovered volume path.
    """
    if config.storage_mb == 0:
        return []
    covered = {posixpath.normpath(mount["Target"]) for mount in mounts}
    options = {"type": "tmpfs", "device": "tmpfs", "o": f"size={config.storage_mb}m"}
    return [Mount(path, None, type="volume", driver_config=DriverConfig("local", options))   # anonymous: removed
            for path in image_volumes(image) if path not in covered]                        # with the container


def seed(client: Any, container_id: str, image_id: str, paths: Iterable[str]) -> None:
    """Copy the image's own files at each of ``paths`` (the tmpfs volumes of ``volume_mounts``, which
    hide them) into the container ``container_id`` before its commands run; read once per image and
    path (``image_files``).

    Raises:
        docker.errors.APIError: the engine refused an archive (the caller removes the container).
    """
    for path in paths:
        if files := image_files(client, image_id, path):
            client.api.put_archive(container_id, path, files)


@functools.lru_cache(maxsize=16)
def image_files(client: docker.DockerClient, image_id: str, path: str) -> bytes | None:
    """The image's own files under ``path`` as a tar with names relative to it (None: none), to seed
    a tmpfs volume that hides them. Read once per image from a created, never started container."""
    container = client.api.create_container(image_id, command=["true"])["Id"]
    try:
        try:
            stream, _ = client.api.get_archive(container, path)
        except docker.errors.NotFound:
            return None
        source = tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r")
        buffer, kept = io.BytesIO(), 0
        with source, tarfile.open(fileobj=buffer, mode="w") as out:
            for member in source:
                tail = member.name.split("/", 1)[1] if "/" in member.name else ""
                if not tail:
                    continue
                member.name = tail
                out.addfile(member, source.extractfile(member) if member.isfile() else None)
                kept += 1
        return buffer.getvalue() if kept else None
    finally:
        client.api.remove_container(container, force=True, v=True)   # v: its anonymous volumes
