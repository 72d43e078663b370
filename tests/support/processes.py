"""Processes on this machine as psutil sees them: what a process started, whether it still runs.

A ``psutil.Process`` keeps its start time beside its pid, so a check made later (``alive``, ``kill``)
never mistakes a process that took a reused pid for the one it was given.
"""

from __future__ import annotations

from collections.abc import Iterable

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    """The live processes below ``pid`` (its children, theirs, and so on), zombies left out; ``[]``
    when ``pid`` is gone."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return alive(below)


def alive(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` that still run: the same process (pid and start time), not a zombie
    waiting for its parent."""
    return [process for process in processes if _running(process)]


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting for its parent)."""
    try:
        return _running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def kill(processes: Iterable[psutil.Process]) -> None:
    """``kill -9`` each of ``processes`` that still runs; one that ended meanwhile is passed over."""
    for process in processes:
        try:
            process.kill()   # psutil checks the start time first: a reused pid is left alone
        except psutil.NoSuchProcess:
            pass


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
