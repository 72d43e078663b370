"""A Harbor task reads only its own directory: no file it names may be a link out of it.

``instruction.md`` becomes the prompt (sent to the provider, stored in Parquet), ``task.toml`` is
read on this host, ``tests/`` and ``solution/`` are archived into the box and ``environment/`` is
the Docker build context. A symlink among them that leads out of the task directory (to
``/proc/self/environ``, ``~/.aws/credentials``, ``/``) would carry a host file into the prompt, the
box or the image, so such a task is refused with a ``ConfigError`` naming the link (``inside``).
A symlink that stays inside the task directory is fine: the top-level names are used by their
resolved path, and links within the directories travel as links (``tarfile`` and the Docker SDK's
build context store a link, never its target, and do not descend into a linked directory).

A hard link cannot be followed to see where its other names are: a hard-linked ``instruction.md``
read a host file's text into the prompt, and one under ``tests/`` was uploaded with the host file's
contents (``tarfile`` stores a file whose other names are not in the archive as a whole file). So a
regular file with more than one name (``st_nlink > 1``) is refused wherever a symlink out would be,
even when its other name is inside the task: git checkouts and ``tarfile``'s ``data`` filter make
none, and a copy of the file loads. Must not import Prefect.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from prefect_rollouts.errors import ConfigError

TASK_FILES = ("task.toml", "instruction.md")
"""Files of a task read on this host."""
TASK_DIRECTORIES = ("tests", "solution", "environment")
"""Directories of a task copied into a box (``tests/``, ``solution/``) or sent as a build context."""


def check_task_directory(directory: Path, where: str) -> None:
    """Refuse a task whose files or directories (``TASK_FILES``, ``TASK_DIRECTORIES`` and everything
    under them) hold a symlink that resolves outside ``directory``, or a hard link; missing ones are
    not checked here.

    Raises:
        ConfigError: ``<where>: <relative path> -> <link target>: resolves outside the task directory
            (<resolved>). Replace the link with the file itself``; a symlink loop likewise; ``<where>:
            <relative path> is a hard link (<n> names of one file) ... Replace it with a copy``.
    """
    for name in (*TASK_FILES, *TASK_DIRECTORIES):
        inside(directory, name, where)


def inside(directory: Path, name: str, where: str) -> Path:
    """``directory / name`` resolved, after checking that it, and every link under it when it is a
    directory, stays inside ``directory``; it need not exist.

    Args:
        directory: The task directory.
        name: A path relative to it (``"tests"``, ``"instruction.md"``).
        where: The task, as error messages name it.

    Returns:
        The resolved path: read, archive or build from this one, not through the link.

    Raises:
        ConfigError: a link leads out of ``directory``, or a file is a hard link (see
            ``check_task_directory``).
    """
    root = directory.resolve()
    path = directory / name
    resolved = _resolved_inside(root, path, name, where)
    _single_name(resolved, name, where)
    if resolved.is_dir():
        for parent, dirnames, filenames in os.walk(resolved):   # links to directories are listed, not entered
            for entry in (*dirnames, *filenames):
                child = Path(parent) / entry
                shown = f"{name}/{child.relative_to(resolved).as_posix()}"
                if child.is_symlink():
                    _resolved_inside(root, child, shown, where)
                else:
                    _single_name(child, shown, where)
    return resolved


def _single_name(path: Path, shown: str, where: str) -> None:
    """A ``ConfigError`` when ``path`` (not followed) is a regular file with more than one name."""
    try:
        status = path.lstat()
    except OSError:   # missing: not checked here
        return
    if stat.S_ISREG(status.st_mode) and status.st_nlink > 1:
        raise ConfigError(f"{where}: {shown} is a hard link ({status.st_nlink} names of one file), whose other "
                          "name may be a file outside the task directory. Replace it with a copy of the file "
                          f"(cp {shown} {shown}.copy && mv {shown}.copy {shown})")


def _resolved_inside(root: Path, path: Path, shown: str, where: str) -> Path:
    """``path`` resolved; a ``ConfigError`` when it leads out of ``root`` (or loops)."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):   # a symlink loop (RuntimeError on Python 3.11, OSError from 3.13)
        raise ConfigError(f"{where}: {shown} is a symlink loop. Replace the link with the file itself") from None
    if resolved == root or root in resolved.parents:
        return resolved
    target = os.readlink(path) if path.is_symlink() else str(resolved)
    also = "" if target == str(resolved) else f" ({resolved})"
    raise ConfigError(f"{where}: {shown} -> {target}: resolves outside the task directory{also}. Replace the "
                      "link with the file itself")
