"""Installs of agent programs into the host cache, shared by the built-in program harnesses.

An install is made once per key (release, platform) and machine, into ``<cache>/<agent>/<key>``
(``runtimes.base.cache_dir``), by whichever process gets there first: it builds into a scratch
directory and renames it into place under a file lock; the others wait on the lock and reuse it.
A killed install leaves only a scratch directory, removed by the next one. ``mini-swe-agent``
installs with pip (``mini_swe_agent.py``), ``codex`` and ``claude-code`` with npm (``npm_agents.py``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from prefect_rollouts.errors import TaskError

logger = logging.getLogger("prefect_rollouts.installs")


def install_once(root: Path, key: str, *, ready: Callable[[Path], bool], build: Callable[[Path], None],
                 note: str) -> Path:
    """``root / key``, made by ``build(scratch)`` unless ``ready(root / key)`` already holds.

    Safe to call from many processes at once (see the module docstring). ``note`` is logged once
    when this process builds (what, where from, about how long).

    Returns:
        The install directory ``root / key``.

    Raises:
        Whatever ``build`` raised (a ``TaskError`` from ``run_installer``); nothing is left in place.
    """
    target = root / key
    if ready(target):
        return target
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready(target):
            return target
        for stale in root.glob(f"{key}.partial-*"):   # left by a killed install: we hold the lock now
            shutil.rmtree(stale, ignore_errors=True)
        scratch = root / f"{key}.partial-{os.getpid()}"
        logger.warning("%s into %s (once per version and machine)", note, target)
        try:
            (scratch / ".tmp").mkdir(parents=True)   # the installer's temporary files: gone with scratch
            build(scratch)
            shutil.rmtree(scratch / ".tmp")
            if target.exists():   # a broken install (ready() said no): replace it
                shutil.rmtree(target)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def run_installer(argv: list[str], *, timeout_s: float, tmp: Path, what: str, fix: str,
                  cwd: Path | None = None) -> None:
    """Run an installer command (pip, npm) with ``TMPDIR`` (and npm's cache) under ``tmp``.

    Args:
        argv: The command.
        timeout_s: Seconds before it is killed.
        tmp: Scratch directory for its temporary files.
        what: What runs, for messages (``'harness "codex": npm install @openai/codex@0.169.0'``).
        fix: What the user can do instead, ending the message (a sentence without its full stop).
        cwd: Working directory.

    Raises:
        TaskError: it ran longer than ``timeout_s`` or exited non-zero (the end of its stderr, warnings
            left out, is in the message).
    """
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                                env={**os.environ, "TMPDIR": str(tmp)})
    except FileNotFoundError as exc:
        raise TaskError(f"{what}: {exc.filename} is not on this machine's PATH. {fix}") from exc
    except subprocess.TimeoutExpired as exc:
        raise TaskError(f"{what} ran longer than {timeout_s:g} s installing it "
                        f"([env.agent.harness] setup_timeout_s). {fix}") from exc
    if result.returncode != 0:
        tail = "\n".join(line for line in result.stderr.splitlines()
                         if not line.startswith(("WARNING", "npm warn")))[-1500:]
        raise TaskError(f"{what} could not install it (exit {result.returncode}): {tail}. {fix}")
