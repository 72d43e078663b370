"""The interception endpoint's host directories: the in-runtime scripts and the sockets.

The scripts' directory is bound read-only into containers; the local runtime reads it in place, as
the same user as its programs, so before each launch a changed script is written back
(``restore_scripts``). The sockets' directory holds the endpoint's own socket and the rollouts'
doors (``InterceptionEndpoint.new_door``). Must not import Prefect.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
from importlib import resources
from pathlib import Path

from prefect_rollouts.runtimes.owner import current_owner

logger = logging.getLogger("prefect_rollouts.endpoint")

SOCKET_NAME = "s"
"""A socket's file name (short: a Unix socket path is limited to 107 bytes)."""


def prepare(names: tuple[str, ...]) -> tuple[Path, Path, socket.socket, dict[str, bytes]]:
    """The endpoint's directory with the scripts copied in, its sockets' directory, its own listening
    socket there, and the scripts' bytes."""
    directory = Path(tempfile.mkdtemp(prefix=f"rollout-{current_owner()}-", suffix=".endpoint"))
    sockets = Path(tempfile.mkdtemp(prefix=f"rollout-{current_owner()}-", suffix=".sockets"))
    try:
        for made in (directory, sockets):
            made.chmod(0o755)   # a container's non-root user must reach the scripts and the doors
        programs = resources.files("prefect_rollouts.harnesses") / "programs"
        scripts = {name: (programs / name).read_bytes() for name in names}
        for name, data in scripts.items():
            write_script(directory, name, data)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(sockets / SOCKET_NAME))
        os.chmod(sockets / SOCKET_NAME, 0o777)   # connecting needs write permission on the socket
        sock.listen(1024)
        sock.setblocking(False)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(sockets, ignore_errors=True)
        raise
    return directory, sockets, sock, scripts


def write_script(directory: Path, name: str, data: bytes) -> None:
    """Write ``directory/name`` as a new read-only file (``0o555``) holding ``data``, replacing
    whatever is there (a link is replaced, not followed)."""
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, 0o555)
        os.replace(temporary, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def restore_scripts(directory: Path, scripts: dict[str, bytes]) -> list[str]:
    """Make ``directory`` hold ``scripts`` (name -> bytes) again (blocking: file I/O). A script whose
    bytes differ, or that is no longer a plain file, is written back (atomically, never through a
    link); the directory's permissions are set back too. Returns the names written back (a warning
    is logged for each)."""
    os.chmod(directory, 0o755)   # a program may have taken its write permission away
    restored = []
    for name, genuine in scripts.items():
        path = directory / name
        try:
            with open(path, "rb", opener=lambda file, flags: os.open(file, flags | os.O_NOFOLLOW)) as handle:
                if os.fstat(handle.fileno()).st_size == len(genuine) and handle.read() == genuine:
                    continue
        except OSError:
            pass   # gone, or a link: written back
        write_script(directory, name, genuine)
        restored.append(name)
        logger.warning("interception endpoint: %s in %s was changed by a program; the package's copy is "
                       "back", name, directory)
    return restored
