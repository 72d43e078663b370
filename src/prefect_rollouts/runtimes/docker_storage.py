"""The docker runtime's disk quota (``[env.agent.runtime] storage_mb``): how this engine enforces it.

Without a quota a container's writable layer sits on the engine's disk and can fill it (one
rollout wrote 3 GB, with PostgreSQL and the dataset on the same disk). Two ways, chosen per engine:

- ``size``: the storage driver caps the writable layer (``storage_opt={"size": ...}``), which
  Docker supports for overlay2 on xfs mounted with ``pquota``, btrfs, zfs, devicemapper and
  windowsfilter. The container writes anywhere, up to ``storage_mb`` in all, on the engine's disk.
- ``tmpfs``: everywhere else (overlay2 on ext4, as on the machine this was built on), the root
  filesystem is read-only and the writable places are tmpfs of ``storage_mb`` each: the workspace
  (a tmpfs *volume*, which the archive API behind read_file, write_file and the artifacts can
  reach, seeded with the image's own workdir files), the config's ``writable`` paths (tmpfs volumes
  too, so an upload reaches them directly), ``/tmp``, ``/var/tmp``, ``/run`` and HOME.
  A tmpfs is memory, and the pages a container writes count against its memory limit, so all it
  writes together stays within ``memory_mb`` and never reaches the engine's disk. A write past
  ``storage_mb`` in one place fails with ENOSPC; past ``memory_mb`` the kernel's OOM killer ends a
  process of the container. An image that must write elsewhere (``apt-get``, ``pip`` into /usr)
  needs an engine with ``size`` support, or ``storage_mb = 0`` (no quota).

Must not import Prefect.
"""

from __future__ import annotations

import functools
import io
import posixpath
import tarfile
from typing import Any, Literal

import docker
import docker.errors
from docker.types import DriverConfig, Mount

from prefect_rollouts.config.agent import RuntimeConfig

QuotaMode = Literal["size", "tmpfs"]

SIZE_DRIVERS = frozenset({"btrfs", "zfs", "devicemapper", "windowsfilter"})
"""Storage drivers that take ``storage_opt size`` on any backing filesystem (overlay2 needs xfs)."""

SCRATCH = ("/tmp", "/var/tmp", "/run")
"""Writable tmpfs directories besides the workspace and HOME under the ``tmpfs`` quota."""

FULL_BELOW_KB = 1024
"""A quota'd filesystem with less than this many KiB free at the end of a rollout was filled."""

ENOSPC_TEXT = "No space left on device"

_size_refused = False
"""Set once the engine refused ``storage_opt size`` (overlay2 on xfs without pquota): then tmpfs."""


def quota_mode(info: dict[str, Any]) -> QuotaMode:
    """The way an engine can enforce a disk quota, from its ``docker info``: ``Driver`` and
    ``DriverStatus``'s "Backing Filesystem" (``xfs`` for overlay2's ``size``)."""
    driver = info.get("Driver", "")
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
    if not _size_refused and (driver in SIZE_DRIVERS or (driver == "overlay2" and backing == "xfs")):
        return "size"
    return "tmpfs"


def refuse_size(exc: docker.errors.APIError) -> bool:
    """Whether creating a container failed because the engine cannot take ``storage_opt size``;
    if so, later containers use the ``tmpfs`` quota."""
    global _size_refused
    text = str(exc.explanation or exc).lower()
    if "storage-opt" in text or "storage opt" in text or "pquota" in text:
        _size_refused = True
    return _size_refused


def quota_options(config: RuntimeConfig, mode: QuotaMode, home: str | None) -> dict[str, Any]:
    """Keyword arguments of ``containers.run`` that enforce ``config.storage_mb`` (none when it is 0).

    Args:
        config: The runtime config (``storage_mb``, ``workdir``).
        mode: ``quota_mode`` of the engine.
        home: HOME of the image's user, made a tmpfs too under ``tmpfs`` (None: not known).
    """
    if config.storage_mb == 0:
        return {}
    if mode == "size":
        return {"storage_opt": {"size": f"{config.storage_mb}m"}}
    size = f"size={config.storage_mb}m"
    volumes = [config.workdir,
               *(place for place in sorted(set(config.writable)) if not _overlaps(place, config.workdir))]
    mounts = [Mount(place, None, type="volume",   # anonymous: removed with the container (v=True)
                    driver_config=DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": size}))
              for place in volumes]
    places = {*SCRATCH, *([home] if home else [])}
    return {"read_only": True, "mounts": mounts,
            "tmpfs": {place: f"{size},exec" for place in sorted(places)
                      if not any(_overlaps(place, volume) for volume in volumes)}}


def archive_roots(config: RuntimeConfig, mode: QuotaMode | None) -> list[str]:
    """Directories the archive API (``put_archive``) can write into directly: the workspace, and under
    the ``tmpfs`` quota also the ``writable`` places (tmpfs *volumes*, which it reaches, unlike tmpfs
    mounts). Under ``size`` or no quota the root filesystem is writable: only the workspace is known
    to exist."""
    if mode != "tmpfs" or config.storage_mb == 0:
        return [config.workdir]
    return [config.workdir, *(place for place in config.writable if not _overlaps(place, config.workdir))]


def quota_paths(config: RuntimeConfig, mode: QuotaMode, home: str | None) -> list[str]:
    """The container paths whose filesystems carry the quota, for ``df``."""
    if mode == "size":
        return [config.workdir]
    places = {*SCRATCH, *config.writable, *([home] if home else [])}
    return [config.workdir, *sorted(place for place in places if not _overlaps(place, config.workdir))]


def image_home(image: Any, config: RuntimeConfig) -> str | None:
    """HOME in the container: ``config.env``'s, else the image's ``Env``, else ``/root`` for root."""
    if config.env.get("HOME"):
        return config.env["HOME"]
    settings = image.attrs.get("Config") or {}
    for item in settings.get("Env") or []:
        if item.startswith("HOME="):
            return str(item[5:]) or None
    return "/root" if (settings.get("User") or "root") in ("root", "0") else None


def full_places(df_output: str) -> list[str]:
    """Mount points of ``df -P -k`` output with less than ``FULL_BELOW_KB`` KiB available."""
    full = []
    for line in df_output.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 6 and fields[3].isdigit() and int(fields[3]) < FULL_BELOW_KB:
            full.append(fields[5])
    return sorted(set(full))


@functools.lru_cache(maxsize=16)
def image_workdir(client: docker.DockerClient, image_id: str, workdir: str) -> bytes | None:
    """The image's own files under ``workdir`` as a tar with names relative to it (None: none),
    to seed a tmpfs workspace that hides them. Read once per image from a created, never
    started container."""
    container = client.api.create_container(image_id, command=["true"])["Id"]
    try:
        try:
            stream, _ = client.api.get_archive(container, workdir)
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
        client.api.remove_container(container, force=True)


def _overlaps(place: str, workdir: str) -> bool:
    inner = posixpath.normpath(place)
    outer = posixpath.normpath(workdir)
    return inner in ("/", outer) or inner.startswith(outer + "/") or outer.startswith(inner + "/")
