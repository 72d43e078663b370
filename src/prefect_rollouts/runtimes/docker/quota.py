"""The watch that enforces the docker runtime's disk quota (``storage_mb``) where the storage driver
cannot cap a container (``docker/storage.py``'s ``watch`` mode: overlay2 on ext4).

The container's root is writable, as Docker makes it; what it writes lands in its writable layer on
the engine's disk. A thread per container measures that layer (``layer_bytes``) and, once it holds
more than ``storage_mb``, records the breach and kills every process of the container (the runtime's
``kill_all`` sweep): the command writing ends, and the runtime then raises ``AgentFailure(...,
"storage_quota", scored=False)`` from the command's ``exec`` (and from every later one, and from
``check_storage``), so the rollout is scored 0 with that stop condition. After a breach the watch
stops; the layer keeps what was written until the container is removed at teardown.

How the layer is measured (``layer_bytes``), from measurements on this project's machine (2 vCPUs,
ext4 on a virtio disk, Docker 20.10 overlay2):

- On a local engine whose overlay2 upper directory this process can read (root): ``du -s -B1 -x`` of
  ``GraphDriver.Data.UpperDir``, the blocks the files hold (hard links once). 20,000 small files:
  28 ms; a layer of a few large files: about 2 ms (mostly starting ``du``). ``du`` is a process of
  its own, so the walk does not hold this process's GIL (a Python walk took 47 ms of it).
- Anywhere else (a remote engine, a user in the ``docker`` group who cannot read
  ``/var/lib/docker``, another driver): the engine's ``SizeRw`` (``containers/json?size=1``), which
  the engine computes by the same walk (50 ms for 20,000 files) but from the files' apparent sizes:
  it counts those 20,000 two-byte files as 40 KB where they hold 80 MB of disk, and a sparse file
  at its full length.

When it measures (``next_check_s``): sooner the closer the layer is to the quota, at most every
``MAX_INTERVAL_S`` and at least ``MIN_INTERVAL_S`` apart: the time the rest of the quota takes to
fill at ``WRITE_RATE_MB_S``; and never sooner than ``COST_FACTOR`` times the last measurement took,
so the watch spends at most about a tenth of a core on a container of many files. So a write no
faster than ``WRITE_RATE_MB_S`` cannot pass the quota between two measurements by more than ``WRITE_RATE_MB_S *
MIN_INTERVAL_S``; with the time to measure and to kill (``STOP_LATENCY_S``) the overshoot is at most
``OVERSHOOT_MB`` (500 MB) while one measurement takes at most 10 ms (a layer of up to about 4,000
files by ``du``); a layer that takes ``t`` s to measure can overshoot by ``WRITE_RATE_MB_S * (11 t +
STOP_LATENCY_S)`` (20,000 files, 28 to 50 ms: 0.9 to 1.4 GB).

Measured (``benchmarks/storage_watch.py``, load average 2.3 to 3.7 on 2 cores): 3 GB into a 1 GiB
quota was stopped 139 to 274 MB past it, 0.7 to 0.85 s after it started (six runs); 8 fresh
containers under the default 1 GiB quota were each measured 1.8 times a second for 3 to 4 ms of CPU a
second, 8 holding 20,000 files each 1.2 times a second for 48 ms.

Must not import Prefect. Everything here blocks (it runs in the watch's own thread).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

WRITE_RATE_MB_S = 2000
"""The fastest a container is assumed to write, in MB/s: ``head -c 3G /dev/zero > /usr/big`` wrote
1.6 GB/s into the page cache here (3 GB in 1.95 s; the kernel lets a writer dirty about 20% of the
memory before it slows to the disk's own speed)."""

MIN_INTERVAL_S = 0.1
"""The shortest time between two measurements of a container's layer (a layer near its quota)."""

MAX_INTERVAL_S = 5.0
"""The longest time between two measurements (a layer far from its quota)."""

STOP_LATENCY_S = 0.15
"""Allowance for measuring the layer and killing the container's processes once it is past the quota:
``du`` of a few large files 2 ms, the kill sweep (an ``exec``) 40 to 90 ms measured here."""

OVERSHOOT_MB = int(WRITE_RATE_MB_S * (MIN_INTERVAL_S + STOP_LATENCY_S))
"""How far past ``storage_mb`` a write at ``WRITE_RATE_MB_S`` can get before it is stopped, in MB (500)."""

COST_FACTOR = 10.0
"""The next measurement waits at least this many times as long as the last one took."""

DU_TIMEOUT_S = 60.0
"""The longest one ``du`` of a layer may take (a layer of millions of files) before the engine's
``SizeRw`` is asked instead."""


def next_check_s(used: int, quota: int, took_s: float = 0.0) -> float:
    """Seconds until the next measurement of a layer holding ``used`` bytes under a quota of ``quota``
    bytes: the time the rest takes to fill at ``WRITE_RATE_MB_S``, within [``MIN_INTERVAL_S``,
    ``MAX_INTERVAL_S``], and at least ``COST_FACTOR`` times ``took_s`` (the last measurement's wall time)."""
    return max(min(max((quota - used) / (WRITE_RATE_MB_S * 1e6), MIN_INTERVAL_S), MAX_INTERVAL_S),
               COST_FACTOR * took_s)


def upper_dir(api: Any, container_id: str) -> str | None:
    """The container's overlay2 upper directory when this process can read it (a local engine, as
    root), else None."""
    data = (api.inspect_container(container_id).get("GraphDriver") or {}).get("Data") or {}
    upper = data.get("UpperDir")
    if upper and shutil.which("du") and os.access(upper, os.R_OK | os.X_OK):
        return str(upper)
    return None


def engine_files(api: Any, container_id: str) -> list[str]:
    """The files the engine bind-mounts into the container from its own directory, writable by the
    container's root and outside its layer (``/etc/hosts``, ``/etc/resolv.conf``, ``/etc/hostname``: an
    adversarial pass appended 1.5 GB to ``/etc/hosts`` past a 256 MiB quota), when this process can read
    them (a local engine); else none."""
    attrs = api.inspect_container(container_id)
    paths = [attrs.get(key) for key in ("HostsPath", "ResolvConfPath", "HostnamePath")]
    return [path for path in paths if path and os.access(path, os.R_OK)]


def layer_bytes(api: Any, container_id: str, upper: str | None, files: list[str] | None = None) -> int:
    """What the container's writable layer holds, in bytes: the blocks of ``upper`` and of ``files``
    (``engine_files``) by ``du`` when given (and it answers), else the engine's ``SizeRw`` (apparent sizes,
    the layer alone; see the module docstring).

    Raises:
        LookupError: the container is gone. docker.errors.APIError: the engine cannot tell.
    """
    if upper is not None:
        try:
            done = subprocess.run(["du", "-s", "-c", "-B1", "-x", upper, *(files or [])], capture_output=True,
                                  text=True, timeout=DU_TIMEOUT_S)
            return int(done.stdout.splitlines()[-1].split()[0])   # the total (a file removed during the walk:
            # an error, still a total)
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            pass
    rows = api.containers(all=True, size=True, filters={"id": container_id})
    if not rows:
        raise LookupError(f"container {container_id[:12]} is gone")
    return int(rows[0].get("SizeRw") or 0)


class QuotaWatch:
    """A thread that measures one container's writable layer and, past ``quota_mb``, stops it.

    Args:
        api: The engine's low-level client (``docker.APIClient``).
        container_id: The container to watch.
        quota_mb: ``storage_mb``, in MiB.
        stop: Kills every process of the container (blocking); called once, at the breach.

    ``used`` is the last measurement in bytes; ``breach`` the bytes found past the quota (None until
    then). ``close`` ends the thread (it does not wait for it).
    """

    def __init__(self, api: Any, container_id: str, quota_mb: int, stop: Callable[[], None]) -> None:
        self.api, self.container_id, self.quota_mb, self._stop = api, container_id, quota_mb, stop
        self.quota = quota_mb * 2**20
        self.used = 0
        self.breach: int | None = None
        self._closed = threading.Event()
        self._upper = upper_dir(api, container_id)
        self._files = engine_files(api, container_id) if self._upper is not None else []
        self._thread = threading.Thread(target=self._run, name=f"quota-watch-{container_id[:12]}", daemon=True)
        self._thread.start()

    @property
    def how(self) -> str:
        """How the layer is measured: ``"du"`` of its upper directory or the engine's ``"SizeRw"``."""
        return "du" if self._upper is not None else "SizeRw"

    def measure(self) -> int:
        """Measure the layer now (``layer_bytes``); past the quota, record the breach (the caller stops).

        Raises:
            LookupError: the container is gone. docker.errors.APIError: the engine cannot tell.
        """
        self.used = layer_bytes(self.api, self.container_id, self._upper, self._files)
        if self.used > self.quota and self.breach is None:
            self.breach = self.used
        return self.used

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        delay = next_check_s(0, self.quota)
        while not self._closed.wait(delay):
            started = time.monotonic()
            try:
                self.measure()
            except LookupError:   # removed (its runtime was never stopped): nothing left to watch
                return
            except Exception:   # the engine is busy: try again later
                delay = MAX_INTERVAL_S
                continue
            if self.breach is not None:
                if not self._closed.is_set():
                    self._stop()
                return
            delay = next_check_s(self.used, self.quota, time.monotonic() - started)
