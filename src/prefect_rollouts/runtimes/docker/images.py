"""Task images on the Docker engine: built from a task's ``environment/`` directory once, by content.

An image is tagged by a hash of its build directory (``image_tag``: every file's relative path,
executable bit and bytes), so it is built once per engine and again only when the directory
changes; a cached check is an ``images.get`` (a few ms). Builds of one tag are serialised across
threads and processes (a file lock under the cache directory), so the rollouts of a task and the
workers sharing an engine build it once. A failed build is remembered for ``FAILURE_TTL_S`` in
this process, so a task's other rollouts fail at once with the same error instead of building again.

Must not import Prefect.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from prefect_rollouts.errors import InfrastructureError
from prefect_rollouts.runtimes.base import cache_dir
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client

REPOSITORY = "prefect-rollouts-task"
"""Repository of built task images: ``prefect-rollouts-task/<task name>:<hash>``."""
LOG_TAIL_LINES = 30
"""Lines of a failed build's log kept in its error ..."""
LOG_LINE_CHARS = 300
"""... each cut to this many characters (a build may print one line of megabytes)."""
FAILURE_TTL_S = 300.0
"""How long this process remembers a failed build of a tag before it tries again (seconds)."""


@dataclass(frozen=True, slots=True)
class ImageReady:
    """An image a task's rollouts can start: its ``tag``, the image's ``workdir`` (its ``WORKDIR``,
    ``/`` when it sets none), and ``build_s``: seconds this call spent building (0.0 when cached)."""

    tag: str
    workdir: str
    build_s: float


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
_failures: dict[str, tuple[float, InfrastructureError]] = {}


def directory_digest(directory: Path) -> str:
    """sha256 (hex) of a build directory: each file's path relative to it, executable bit and bytes,
    in path order; a symlink by its target. Other metadata (times, owners) does not count."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix()
        if path.is_symlink():
            digest.update(f"L {relative} -> {os.readlink(path)}\n".encode())
        elif path.is_file():
            digest.update(f"F {relative} {os.access(path, os.X_OK):d} {path.stat().st_size}\n".encode())
            digest.update(path.read_bytes())
        elif path.is_dir():
            digest.update(f"D {relative}\n".encode())
    return digest.hexdigest()


def image_tag(name: str, directory: Path) -> str:
    """The tag of the image built from ``directory`` for task ``name``:
    ``prefect-rollouts-task/<name, lower-case, [a-z0-9._-] only>:<first 16 hex of directory_digest>``."""
    safe = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._") or "task"
    return f"{REPOSITORY}/{safe[:100]}:{directory_digest(directory)[:16]}"


def build_image(directory: Path, tag: str, *, timeout_s: float, what: str) -> ImageReady:
    """The image ``tag`` built from ``directory`` (its ``Dockerfile``), or found when it exists.

    Blocking: call it in a worker thread (``threads.run_sync``, a daemon thread: Ctrl-C does not wait for a
    build, which the engine finishes on its own). Safe to call from many threads and processes at once.

    Args:
        directory: The build context.
        tag: From ``image_tag`` (content-addressed: an existing tag is up to date).
        timeout_s: Most seconds the build may take (Harbor's ``build_timeout_sec``).
        what: The task, as error messages name it.

    Raises:
        InfrastructureError (not retryable): no engine answers, the build failed (the error and the
            last ``LOG_TAIL_LINES`` lines of its log) or ran past ``timeout_s``; a failure remembered
            from an earlier call in the last ``FAILURE_TTL_S`` seconds is raised again.
    """
    client = _client(what)
    found = _existing(client, tag)
    if found is not None:
        return found
    with _tag_lock(tag):
        failed = _failures.get(tag)
        if failed is not None and time.monotonic() - failed[0] < FAILURE_TTL_S:
            raise failed[1]
        with _file_lock(tag):
            found = _existing(client, tag)
            if found is not None:
                return found
            started = time.monotonic()
            try:
                _build(client, directory, tag, timeout_s, what)
            except InfrastructureError as exc:
                _failures[tag] = (time.monotonic(), exc)
                raise
            _failures.pop(tag, None)
            ready = _existing(client, tag)
            if ready is None:
                raise InfrastructureError(f"{what}: the build of {tag} ended but the image is not on the engine",
                                          retryable=False)
            return ImageReady(ready.tag, ready.workdir, round(time.monotonic() - started, 3))


def pull_image(reference: str, *, timeout_s: float, what: str) -> ImageReady:
    """The image ``reference`` (Harbor's ``docker_image``): found on the engine, else pulled.

    Raises:
        InfrastructureError (not retryable): it is not on the engine and cannot be pulled (the
            message says how to bring it: ``docker load``, a local registry mirror, or a ``FROM``
            rewritten to an image built here).
    """
    client = _client(what)
    found = _existing(client, reference)
    if found is not None:
        return found
    started = time.monotonic()
    try:
        client.images.pull(reference)
    except docker.errors.DockerException as exc:
        raise InfrastructureError(
            f'{what}: [environment] docker_image = "{reference}" is not on the Docker engine and cannot be '
            f"pulled ({exc}). Load it (docker load), point the engine at a registry mirror that has it, or "
            "remove docker_image so the image builds from environment/", retryable=False) from exc
    ready = _existing(client, reference)
    if ready is None:
        raise InfrastructureError(f'{what}: pulled "{reference}" but the engine does not list it', retryable=False)
    del timeout_s   # the SDK's pull has no deadline of its own; the engine client's 120 s read timeout holds
    return ImageReady(ready.tag, ready.workdir, round(time.monotonic() - started, 3))


def _client(what: str) -> docker.DockerClient:
    try:
        return docker_client()
    except InfrastructureError as exc:
        raise InfrastructureError(f"{what}: {exc}", retryable=False) from exc


def _existing(client: docker.DockerClient, tag: str) -> ImageReady | None:
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise InfrastructureError(f"cannot inspect image {tag} ({exc.explanation or exc})", retryable=False) from exc
    workdir = (image.attrs.get("Config") or {}).get("WorkingDir") or "/"
    return ImageReady(tag, workdir, 0.0)


def _build(client: docker.DockerClient, directory: Path, tag: str, timeout_s: float, what: str) -> None:
    """Run the build, streaming its log; raise with the log's tail when it fails or runs too long."""
    if not (directory / "Dockerfile").is_file():
        raise InfrastructureError(f"{what}: environment/Dockerfile does not exist", retryable=False)
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []

    def tail() -> str:
        return "\n".join(lines)
    stream = client.api.build(path=str(directory), tag=tag, rm=True, forcerm=True, pull=False, decode=True,
                              timeout=max(timeout_s, 1.0), labels={LABEL: "1", f"{LABEL}.task": what[:200]})
    try:
        for chunk in stream:
            text = str(chunk.get("stream") or chunk.get("status") or "").replace("\0", "")
            if text:
                lines.extend(line[:LOG_LINE_CHARS] for line in text.rstrip("\n").splitlines() if line.strip())
                del lines[:-LOG_TAIL_LINES]
            if "error" in chunk:
                detail = str((chunk.get("errorDetail") or {}).get("message") or chunk["error"]).replace("\0", "")
                raise InfrastructureError(f"{what}: building environment/ failed: {detail.strip()[:2000]}\n"
                                          + tail(), retryable=False)
            if time.monotonic() > deadline:
                raise InfrastructureError(f"{what}: building environment/ ran past [environment] build_timeout_sec "
                                          f"= {timeout_s:g} s\n" + tail(), retryable=False)
    except InfrastructureError:
        raise
    except Exception as exc:   # a Dockerfile the engine refuses, a lost engine, or no output for timeout_s
        quiet = "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower()
        why = (f"ran past [environment] build_timeout_sec = {timeout_s:g} s (no output for that long)" if quiet
               else f"failed: {type(exc).__name__}: {str(exc)[:500]}")
        raise InfrastructureError(f"{what}: building environment/ {why}\n" + tail(), retryable=False) from exc
    finally:
        with contextlib.suppress(Exception):
            stream.close()


def _tag_lock(tag: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(tag, threading.Lock())


@contextlib.contextmanager
def _file_lock(tag: str) -> Any:
    """An exclusive lock on ``<cache>/task-images/<tag>.lock``, held across processes of this host."""
    with open(cache_dir("task-images") / (re.sub(r"[^A-Za-z0-9._-]", "_", tag) + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
