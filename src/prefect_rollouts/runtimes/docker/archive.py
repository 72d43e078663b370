"""The docker runtime's file transfers through the engine's archive API (``get_archive`` and
``put_archive``: tars over the socket, no command in the container): reading a file, packing a file
or the declared artifacts, unpacking into the container.

The container's root is writable (``docker/storage.py``), so an archive can be unpacked anywhere; what it
writes counts against ``storage_mb`` like any other write.

Must not import Prefect. Every function blocks (the runtime calls them in its thread pool).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from typing import Any

import docker.errors

from prefect_rollouts.errors import TaskError


def read_file(api: Any, container_id: str, target: str, path: str) -> bytes:
    """The bytes of the regular file ``target`` (absolute) in the container; ``path`` is named in errors.

    Raises:
        FileNotFoundError: it does not exist. ValueError: not a regular file.
    """
    try:
        stream, _ = api.get_archive(container_id, target)
    except docker.errors.NotFound:
        raise FileNotFoundError(path) from None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.next()
        if member is None or not member.isfile():
            raise ValueError(f"path {path!r} is not a regular file")
        handle = tar.extractfile(member)
        assert handle is not None
        return handle.read()


def file_tar(relative: str, payload: bytes) -> bytes:
    """A tar holding ``payload`` at ``relative`` (mode 644, now), its parent directories first (755)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        parts = relative.split("/")
        for depth in range(1, len(parts)):
            directory = tarfile.TarInfo("/".join(parts[:depth]))
            directory.type, directory.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(directory)
        info = tarfile.TarInfo(relative)
        info.size, info.mode, info.mtime = len(payload), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def collect(api: Any, container_id: str, workdir: str, targets: dict[str, str], cap: int) -> tuple[bytes, list[str]]:
    """Pack ``targets`` (declared path -> absolute path in the container) into one tar with names
    relative to ``workdir``: regular files, directories and symlinks (a link stays a link); devices
    and FIFOs are dropped.

    Returns:
        The tar and the declared paths that do not exist.

    Raises:
        TaskError: more than ``cap`` bytes (counted while streaming).
    """
    buffer, missing, total = io.BytesIO(), [], 0
    too_big = TaskError(f"artifacts {list(targets)!r}: more than artifact_max_bytes = {cap} bytes. "
                        "Declare fewer paths or raise [env.agent.runtime] artifact_max_bytes")
    with tarfile.open(fileobj=buffer, mode="w") as out:
        for declared, target in targets.items():
            try:
                stream, _ = api.get_archive(container_id, target)
            except docker.errors.NotFound:
                missing.append(declared)
                continue
            raw = bytearray()
            for chunk in stream:
                raw += chunk
                if len(raw) > cap + 1024 * 1024:  # tar headers and padding on top of the content
                    raise too_big
            with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r|") as source:
                base = posixpath.relpath(target, workdir)
                for member in source:
                    if not (member.isfile() or member.isdir() or member.issym()):
                        continue
                    total += member.size
                    if total > cap:
                        raise too_big
                    tail = member.name.split("/", 1)[1] if "/" in member.name else ""
                    member.name = posixpath.join(base, tail) if tail else base
                    out.addfile(member, source.extractfile(member) if member.isfile() else None)
    return buffer.getvalue(), missing
