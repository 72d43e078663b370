"""The docker runtime's disk quota (``[env.agent.runtime] storage_mb``): how this engine enforces it.

Without a quota a container's writable layer sits on the engine's disk and can fill it (one
rollout wrote 3 GB, with PostgreSQL and the dataset on the same disk). The container's root is
writable everywhere in both ways (as Docker and Harbor make it: Terminal-Bench tasks write
``/usr/local/bin``, ``/etc``, ``/opt`` and ``pip install``); they differ in how the quota holds:

- ``size``: the storage driver caps the writable layer (``storage_opt={"size": ...}``), which
  Docker supports for overlay2 on xfs mounted with ``pquota``, btrfs, zfs, devicemapper and
  windowsfilter. A write past ``storage_mb`` fails with ENOSPC.
- ``watch``: everywhere else (overlay2 on ext4, as on the machine this was built on), a thread
  measures the writable layer every 0.1 to 5 s and, past ``storage_mb``, kills the container's
  processes; the rollout ends as the agent's failure (``storage_quota``, scored 0). A write can get
  at most ``docker_quota.OVERSHOOT_MB`` past the quota before it is stopped (``docker/quota.py``).

Under both, each of the image's ``VOLUME`` paths is a tmpfs of ``storage_mb`` (``docker/volumes.py``),
which counts against ``memory_mb``; ``storage_mb = 0`` is no quota.

Must not import Prefect.
"""

from __future__ import annotations

from typing import Any, Literal

import docker
import docker.errors

from prefect_rollouts.config.agent import RuntimeConfig

QuotaMode = Literal["size", "watch"]

SIZE_DRIVERS = frozenset({"btrfs", "zfs", "devicemapper", "windowsfilter"})
"""Storage drivers that take ``storage_opt size`` on any backing filesystem (overlay2 needs xfs)."""

FULL_BELOW_KB = 1024
"""A quota'd filesystem with less than this many KiB free at the end of a rollout was filled."""

ENOSPC_TEXT = "No space left on device"

_size_refused = False
"""Set once the engine refused ``storage_opt size`` (overlay2 on xfs without pquota): then the watch."""


def quota_mode(info: dict[str, Any]) -> QuotaMode:
    """The way an engine can enforce a disk quota, from its ``docker info``: ``Driver`` and
    ``DriverStatus``'s "Backing Filesystem" (``xfs`` for overlay2's ``size``)."""
    driver = info.get("Driver", "")
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
    if not _size_refused and (driver in SIZE_DRIVERS or (driver == "overlay2" and backing == "xfs")):
        return "size"
    return "watch"


def refuse_size(exc: docker.errors.APIError) -> bool:
    """Whether creating a container failed because the engine cannot take ``storage_opt size``;
    if so, later containers use the ``watch`` quota."""
    global _size_refused
    text = str(exc.explanation or exc).lower()
    if "storage-opt" in text or "storage opt" in text or "pquota" in text:
        _size_refused = True
    return _size_refused


def quota_options(config: RuntimeConfig, mode: QuotaMode) -> dict[str, Any]:
    """Keyword arguments of ``containers.run`` that enforce ``config.storage_mb``: ``storage_opt``
    under ``size``; none under ``watch`` (the watch starts with the container) or when it is 0."""
    if config.storage_mb == 0 or mode != "size":
        return {}
    return {"storage_opt": {"size": f"{config.storage_mb}m"}}


def full_places(df_output: str) -> list[str]:
    """Mount points of ``df -P -k`` output with less than ``FULL_BELOW_KB`` KiB available."""
    full = []
    for line in df_output.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 6 and fields[3].isdigit() and int(fields[3]) < FULL_BELOW_KB:
            full.append(fields[5])
    return sorted(set(full))
