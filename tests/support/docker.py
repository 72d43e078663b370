"""The Docker runtime config the system tier's Docker tests start from."""

from __future__ import annotations

from typing import Any

import prefect_rollouts as vf


def docker_config(**fields: Any) -> vf.RuntimeConfig:
    """``RuntimeConfig(type="docker", exec_timeout_s=20)`` updated with ``fields`` (any
    ``RuntimeConfig`` field, e.g. ``image``, ``network``, ``memory_mb``, or ``exec_timeout_s`` for
    a module whose commands take longer). 20 s bounds one command in the box; the tests' commands
    take well under a second on an idle engine, the rest is room for a shared, busy one."""
    return vf.RuntimeConfig(**{"type": "docker", "exec_timeout_s": 20, **fields})
