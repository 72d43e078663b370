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
import tempfile
from pathlib import Path

import docker
import docker.errors

from prefect_rollouts.errors import RuntimeUnavailableError

logger = logging.getLogger("prefect_rollouts.sandbox")

DEFAULT_IMAGE = "prefect-rollouts-sandbox:latest"
"""The image the ``docker`` runtime uses unless ``[env.agent.runtime] image`` says otherwise."""

PULL_BASE = "python:3.11-slim-bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"

_DOCKERFILE = """\
FROM {base}
RUN if ! command -v python3 >/dev/null; then \\
      apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates \\
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
