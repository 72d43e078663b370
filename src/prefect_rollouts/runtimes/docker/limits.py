"""A docker container's resource limits, and what they did: the options that set them when a container
is created (CPU, memory, processes, logs), and the counters that tell afterwards that a process was
killed for memory or could not start for the process limit.

- Logs: a container's own output (what its PID 1 writes, and whatever a process writes to
  ``/proc/1/fd/1``) is kept by the engine on the host's disk; without a cap one ``> /proc/1/fd/1``
  wrote 2.0 GB in 22 s. ``LOG_CONFIG`` caps it for every container this project starts (rollout,
  scoring, the network guard helper, the sandbox check).
- Memory: ``memory_mb`` is the cgroup's limit; past it the kernel's OOM killer ends a process of the
  container. The engine's ``State.OOMKilled`` tells only about the container itself (set when it
  exits; a process run by ``exec`` and killed leaves it False: the exit code 137 alone cannot tell
  memory from a ``kill -9``). What tells is the cgroup's ``oom_kill`` counter, read inside the
  container: ``memory.events`` (cgroup v2), ``memory.oom_control`` (cgroup v1, kernel >= 4.13).
  Measured on Docker 20.10, cgroup v1, kernel 6.18: the counter rose by one per kill of an exec'd
  program, ``OOMKilled`` stayed False.
- Processes: ``pids_limit``; a fork past it fails (EAGAIN), and the cgroup counts the refusals in
  ``pids.events``'s ``max`` (both versions). Under a fork bomb a command that forks cannot run, but
  an ``exec`` is placed in the cgroup past the limit: the counters are read, and ``KILL_ALL`` (the
  runtime's ``kill_all``) ends every process, by shells that run builtins only. (The sweep before
  it forked for each process: under a bomb at ``pids_limit = 32`` five rounds killed a few of them
  and left the container unable to run a command; this one ends them all in one pass.)

Must not import Prefect. The functions that call the engine block (call them in a thread).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from docker.types import LogConfig

from prefect_rollouts.config.agent import RuntimeConfig
from prefect_rollouts.errors import RuntimeUnavailableError

LOG_MAX_SIZE = "1m"
"""Size of a container's log file before the engine rotates it. Nothing reads a rollout's or scoring
container's log (commands run as ``exec``s, whose output comes back over the API, capped by
``output_cap_bytes``); the guard helper's is read for its last 500 characters when it fails, and the
sandbox check's (``sandbox.image_python``) for its one line."""

LOG_MAX_FILES = "2"
"""Log files kept per container (the current one and one rotated): at most 2 MiB of the engine's disk
per container, and at least the last 1 MiB is kept."""

LOG_CONFIG = LogConfig(type="json-file", config={"max-size": LOG_MAX_SIZE, "max-file": LOG_MAX_FILES})
"""``log_config`` of every container this project starts: ``json-file`` (Docker's default driver), capped.
(``docker_volumes.image_files``'s container is created, never started: it writes no log.)"""

# The container's cgroup counters as "oom_kill N" and "pids_max N" lines, cgroup v2 or v1. Builtins
# only (no fork): it must run while a fork bomb holds every process slot.
_COUNTERS = r"""for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
  [ -r "$f" ] && while read -r key value; do [ "$key" = oom_kill ] && echo "oom_kill $value"; done < "$f"
done
for f in /sys/fs/cgroup/pids.events /sys/fs/cgroup/pids/pids.events; do
  [ -r "$f" ] && while read -r key value; do [ "$key" = max ] && echo "pids_max $value"; done < "$f"
done
true
"""

# Kills every process of the container but PID 1 (the init), the keep-alive (the lowest-numbered
# "sleep" child of the init: it started first, so a look-alike a process made later has a higher PID;
# the name and parent come from /proc/PID/status, whose PPid a process cannot forge) and this shell;
# prints the PIDs it killed. It first stops every process but the init and itself with one kill(-1):
# the kernel signals them all at once, so none can fork again (a fork in flight fails), and a fork bomb
# that holds every process slot is over in one pass. Builtins only: under a fork bomb it cannot fork.
KILL_ALL = r"""parent() {
  ppid="" name=""
  while read -r key value; do
    case "$key" in Name:) name=$value ;; PPid:) ppid=$value; return 0 ;; esac
  done < "$1/status"
  return 1
}
kill -s STOP -- -1 2>/dev/null
keep=""
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  parent "$p" 2>/dev/null || continue
  if [ "$ppid" = 1 ] && [ "$name" = sleep ] && { [ -z "$keep" ] || [ "$pid" -lt "$keep" ]; }; then
    keep=$pid
  fi
done
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  case "$pid" in 1|"$keep"|"$$") continue ;; esac
  parent "$p" 2>/dev/null || continue
  [ "$ppid" = "$$" ] && continue
  kill -9 "$pid" 2>/dev/null && echo "$pid"
done
[ -n "$keep" ] && kill -s CONT "$keep" 2>/dev/null
true
"""


def create_options(config: RuntimeConfig) -> dict[str, Any]:
    """``containers.run`` options of a rollout or scoring container: ``cpus``, ``memory_mb``, ``pids_limit``
    and capped logs."""
    return {"nano_cpus": int(config.cpus * 1e9), "mem_limit": f"{config.memory_mb}m", "pids_limit": config.pids_limit,
            "log_config": LOG_CONFIG}


def counters(api: Any, container_id: str) -> dict[str, int]:
    """``{"oom_kill": N, "pids_max": N}`` of the container's cgroup (a key is missing where this
    kernel has no such counter); empty when the container cannot be reached."""
    try:
        exec_id = api.exec_create(container_id, ["sh", "-c", _COUNTERS])["Id"]
        text = api.exec_start(exec_id).decode(errors="replace")
    except Exception:   # a lost container or engine: nothing is known
        return {}
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("oom_kill", "pids_max") and value.strip().isdigit():
            found[key] = max(found.get(key, 0), int(value))
    return found


def kill_all(api: Any, container_id: str, users: Iterable[str] = (), rounds: int = 5) -> None:
    """Run ``KILL_ALL`` in the container until it kills nothing, at most ``rounds`` times (the runtime's
    ``kill_all``, and the disk quota's watch at a breach), as the image's user and then as each of
    ``users`` (no capability lets one user signal another's processes in a box without capabilities).

    Raises:
        docker.errors.APIError: the engine refused the ``exec`` (e.g. the container is gone).
    """
    for user in ["", *sorted(set(users))]:
        for _ in range(rounds):
            exec_id = api.exec_create(container_id, ["sh", "-c", KILL_ALL], user=user)["Id"]
            if not api.exec_start(exec_id).decode(errors="replace").split():
                break


def limits_hit(api: Any, container_id: str, config: RuntimeConfig, source: str, seen: dict[str, int],
               tmpfs_volumes: bool) -> dict[str, str]:
    """The limits that ended or refused a process since the last call (``seen`` holds the counters
    read then, and is updated; a fresh container's start at 0).

    Returns:
        ``"memory"`` and/or ``"pids"`` -> a sentence naming the config key and the fix; empty: none.
        ``tmpfs_volumes``: the image's ``VOLUME`` paths are tmpfs of ``storage_mb`` (``docker/volumes.py``),
        memory the container's files there use too, so the memory sentence names ``storage_mb``.
    """
    now = counters(api, container_id)
    hit: dict[str, str] = {}
    killed = now.get("oom_kill", 0) - seen.get("oom_kill", 0)
    if killed > 0:
        files = (f"; its files in the image's VOLUME paths (tmpfs of storage_mb = {config.storage_mb} each) "
                 "are memory too and count against it") if tmpfs_volumes else ""
        hit["memory"] = (f"out of memory: the kernel's OOM killer ended {killed} process(es) of the container at "
                         f"{source} memory_mb = {config.memory_mb}{files}. Raise memory_mb, or have the program "
                         "use less")
    refused = now.get("pids_max", 0) - seen.get("pids_max", 0)
    if refused > 0:
        hit["pids"] = (f"the process limit was hit: {refused} fork(s) refused with the container holding "
                       f"{source} pids_limit = {config.pids_limit} processes. Raise pids_limit, or have the program "
                       "start fewer")
    seen.update(now)
    return hit


def check_alive(container: Any, settle_s: float = 1.0) -> None:
    """Raise if the container stopped (the engine marks it a moment after its processes die).

    Raises:
        RuntimeUnavailableError: it is not running; the message says when the OOM killer ended it
            (``State.OOMKilled``).
    """
    deadline = time.monotonic() + settle_s
    while True:
        container.reload()
        if container.status != "running":
            memory_mb = (container.attrs.get("HostConfig") or {}).get("Memory", 0) // 2**20
            why = (f", out of memory: killed by the kernel's OOM killer at memory_mb = {memory_mb}"
                   if (container.attrs.get("State") or {}).get("OOMKilled") else "")
            raise RuntimeUnavailableError(f'runtime "docker": container {container.id[:12]} was lost during a '
                                          f"command (status {container.status}{why})")
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)
