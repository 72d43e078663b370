"""Building the default sandbox image (``prefect-rollouts sandbox build``).

The normal way pulls a slim Python base image. Where no registry answers (this project's
machines reach only package registries), it builds one offline: ``debootstrap`` a minimal
Debian into a directory, ``docker import`` it, then install python3 with apt in a
``docker build`` (containers on the default bridge reach Debian's mirror).
"""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import docker
import docker.errors

from prefect_rollouts.errors import RuntimeUnavailableError
from prefect_rollouts.runtimes.docker.limits import LOG_CONFIG

logger = logging.getLogger("prefect_rollouts.sandbox")

DEFAULT_IMAGE = "prefect-rollouts-sandbox:latest"
"""The image the ``docker`` runtime uses unless ``[env.agent.runtime] image`` says otherwise."""

PULL_BASE = "python:3.11-slim-bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"

_DOCKERFILE = """\
FROM {base}
RUN if ! command -v python3 >/dev/null || ! command -v iptables >/dev/null; then \\
      apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates iptables \\
      && rm -rf /var/lib/apt/lists/*; fi \\
    && mkdir -p /workspace
WORKDIR /workspace
LABEL org.prefect-rollouts.sandbox="1"
"""


def build_sandbox_image(tag: str = DEFAULT_IMAGE, *, base: str = PULL_BASE, offline: bool | None = None,
                        client: docker.DockerClient | None = None) -> str:
    """Build the sandbox image ``tag`` (bash, coreutils, python3, workdir ``/workspace``).

    Args:
        tag: Name of the image to build.
        base: Image to pull for the normal way.
        offline: True: skip the pull and debootstrap; False: pull only; None: pull, and
            debootstrap when the pull fails.
        client: Docker client; default ``docker.from_env()``.

    Returns:
        The image id.

    Raises:
        RuntimeUnavailableError: no Docker engine, or neither way worked (the message says why).
    """
    client = client or _client()
    base_image = None
    if offline is not True:
        try:
            logger.info("pulling %s", base)
            client.images.pull(base)
            base_image = base
        except docker.errors.APIError as exc:
            if offline is False:
                raise RuntimeUnavailableError(f"cannot pull {base} ({exc.explanation or exc})",
                                              retryable=False) from exc
            logger.info("pull failed (%s); building a Debian base offline with debootstrap", exc.explanation or exc)
    if base_image is None:
        base_image = _debootstrap_base(client, f"{tag.rsplit(':', 1)[0]}-base:{SUITE}")
    logger.info("building %s from %s", tag, base_image)
    image, _ = client.images.build(fileobj=io.BytesIO(_DOCKERFILE.format(base=base_image).encode()), tag=tag,
                                   rm=True, forcerm=True, pull=False)
    return str(image.id)


def _debootstrap_base(client: docker.DockerClient, name: str) -> str:
    """A minimal Debian as an image ``name``, made with debootstrap and ``docker import``."""
    if shutil.which("debootstrap") is None:
        raise RuntimeUnavailableError("no registry answered and debootstrap is not installed. "
                                      "Install it (apt-get install -y debootstrap) and run "
                                      "`prefect-rollouts sandbox build` again", retryable=False)
    with tempfile.TemporaryDirectory(prefix="sandbox-rootfs-") as scratch:
        root = Path(scratch) / "rootfs"
        result = subprocess.run(["debootstrap", "--variant=minbase", SUITE, str(root), MIRROR],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeUnavailableError(f"debootstrap {SUITE} failed: {result.stderr.strip()[-500:]}",
                                          retryable=False)
        archive = Path(scratch) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True)
        repository, _, tag = name.partition(":")
        client.api.import_image(src=str(archive), repository=repository, tag=tag or "latest")
    return name


def _client() -> docker.DockerClient:
    try:
        client = docker.from_env()
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        raise RuntimeUnavailableError(f"no Docker engine answers (DOCKER_HOST or /var/run/docker.sock): {exc}. "
                                      "Start dockerd", retryable=False) from exc


def image_python(tag: str, *, client: docker.DockerClient | None = None) -> tuple[str, str]:
    """``("3.11", "x86_64")``: the Python version and machine of image ``tag``'s ``python3``.

    Raises:
        RuntimeUnavailableError: no engine, or the image has no working ``python3``.
    """
    client = client or _client()
    try:
        out = client.containers.run(tag, ["python3", "-c", 'import platform, sys; '
                                          'print("%d.%d" % sys.version_info[:2], platform.machine())'],
                                    remove=True, network_mode="none", log_config=LOG_CONFIG)
    except docker.errors.DockerException as exc:
        raise RuntimeUnavailableError(f"{tag}: its python3 did not run ({exc})", retryable=False) from exc
    python, machine = out.decode().split()
    return python, machine


def bake_directory(tag: str, source: Path, target: str, *, labels: dict[str, str] | None = None,
                   client: docker.DockerClient | None = None) -> str:
    """Rebuild image ``tag`` with the host directory ``source`` copied to ``target`` (one layer on top).

    Returns:
        The new image id (the tag now names it).

    Raises:
        RuntimeUnavailableError: no engine, or the build failed.
    """
    client = client or _client()
    dockerfile = f"FROM {tag}\nCOPY payload {target}\n" + "".join(
        f'LABEL {key}="{value}"\n' for key, value in (labels or {}).items())
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as archive:
            data = dockerfile.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
            archive.add(source, arcname="payload")
        context.seek(0)
        try:
            image, _ = client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True,
                                           pull=False)
        except docker.errors.DockerException as exc:
            raise RuntimeUnavailableError(f"adding {source} to {tag} failed: {exc}", retryable=False) from exc
    return str(image.id)
