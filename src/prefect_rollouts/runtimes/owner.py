"""Who owns a sandbox: the process that started it, identified so that a janitor can tell,
on positive evidence only, that the owner is gone.

A process is named by ``host_boot_pid_start``: the host name, the first 8 characters of the
kernel's boot id (``/proc/sys/kernel/random/boot_id``), the pid and the process start time in
clock ticks since boot (field 22 of ``/proc/PID/stat``). A pid alone is reused; a pid with its
start time and boot id is not, so "no such process with that start time on this boot" is proof
that the owner died. On another host, or where ``/proc`` is missing, nothing can be proven.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

_OWNER = re.compile(r"^(?P<host>.+)_(?P<boot>[0-9a-f]{8}|-)_(?P<pid>\d+)_(?P<start>\d+)$")


@dataclass(frozen=True, slots=True)
class Owner:
    """A process identity: ``host``, ``boot`` (8 hex digits or ``"-"``), ``pid`` and ``start`` (ticks)."""

    host: str
    boot: str
    pid: int
    start: int

    def __str__(self) -> str:
        return f"{self.host}_{self.boot}_{self.pid}_{self.start}"   # no ':' (PATH-like lists, tar)

    @classmethod
    def parse(cls, text: str | None) -> Owner | None:
        """The owner written by ``str(owner)``, or None for anything else (old or foreign labels)."""
        match = _OWNER.match(text or "")
        if match is None:
            return None
        return cls(match["host"], match["boot"], int(match["pid"]), int(match["start"]))

    def is_alive(self) -> bool | None:
        """True or False when this host can tell; None when it cannot (another host or boot
        unknown, no ``/proc``): no evidence either way."""
        if self.host != _host() or self.boot == "-" or self.boot != boot_id():
            return None
        if not Path("/proc/self/stat").exists():
            return None
        started = process_start(self.pid)
        return started is not None and started == self.start


def current_owner() -> Owner:
    """The identity of this process (cached per pid, so a forked child names itself)."""
    return _owner_of(os.getpid())


@functools.cache
def _owner_of(pid: int) -> Owner:
    return Owner(_host(), boot_id(), pid, process_start(pid) or 0)


@functools.cache
def _host() -> str:
    return "".join(c if c.isalnum() or c in ".-_" else "-" for c in socket.gethostname()) or "unknown"


@functools.cache
def boot_id() -> str:
    """The first 8 characters of this boot's id, or ``"-"`` where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8] or "-"
    except OSError:
        return "-"


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name (field 2) is in parentheses and may hold spaces; fields after it are plain
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])   # field 22 overall = index 19 after the pid and (comm)
    except (IndexError, ValueError):
        return None
