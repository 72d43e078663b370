"""A docker container's resource limits: the options that set them when a container is created
(CPU, memory, processes, logs).

Logs: a container's own output (what its PID 1 writes, and whatever a process writes to
``/proc/1/fd/1``) is kept by the engine on the host's disk; without a cap one ``> /proc/1/fd/1``
wrote 2.0 GB in 22 s. ``LOG_CONFIG`` caps it for every container this project starts (rollout,
scoring, the network guard helper, the sandbox check).

Must not import Prefect.
"""

from __future__ import annotations

from typing import Any

from docker.types import LogConfig

from prefect_rollouts.config.agent import RuntimeConfig

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
(``docker_storage.image_workdir``'s container is created, never started: it writes no log.)"""


def create_options(config: RuntimeConfig) -> dict[str, Any]:
    """``containers.run`` options of a rollout or scoring container: ``cpus``, ``memory_mb``, ``pids_limit``
    and capped logs."""
    return {"nano_cpus": int(config.cpus * 1e9), "mem_limit": f"{config.memory_mb}m", "pids_limit": config.pids_limit,
            "log_config": LOG_CONFIG}
