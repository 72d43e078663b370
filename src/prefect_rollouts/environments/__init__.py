"""Environments: tasksets by name (``arithmetic``, ...) or by import path ``pkg.module:function``.

Contract: a taskset is a function ``load(**options) -> Iterable[Task]`` whose tasks have
unique ids. ``load_taskset`` resolves ``[env.taskset]``. Must not import Prefect.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prefect_rollouts.errors import ConfigError
from prefect_rollouts.task import Task

#: Built-in taskset names and the function behind each.
BUILTIN = {
    "arithmetic": "prefect_rollouts.environments.arithmetic:load",
    "bfcl": "prefect_rollouts.environments.bfcl:load",
    "humaneval": "prefect_rollouts.environments.humaneval:load",
}


def load_taskset(taskset_id: str, options: dict[str, Any] | None = None, limit: int | None = None) -> list[Task]:
    """The first ``limit`` tasks (all when None) of taskset ``taskset_id`` built with ``options``.

    Raises:
        ConfigError: unknown name, a path that does not import, a loader that rejects the
            options, something that is not a ``Task``, or two tasks with the same id.
    """
    loader = _resolve(taskset_id)
    try:
        produced: Iterable[Any] = loader(**(options or {}))
    except TypeError as exc:
        raise ConfigError(f"[env.taskset] id = {taskset_id!r}: its loader rejected the options "
                          f"{sorted(options or {})} ({exc}). Check the taskset's options") from exc
    tasks: list[Task] = []
    seen: set[str] = set()
    for item in produced:
        if limit is not None and len(tasks) >= limit:
            break
        if not isinstance(item, Task):
            raise ConfigError(f"[env.taskset] id = {taskset_id!r}: produced {type(item).__name__}, not a Task")
        if item.id in seen:
            raise ConfigError(f"[env.taskset] id = {taskset_id!r}: two tasks have id {item.id!r}; "
                              "task ids must be unique (set TaskData.id)")
        seen.add(item.id)
        tasks.append(item)
    return tasks


def package_dir(package: str, taskset_id: str, install: str) -> Path:
    """The directory of an installed data package, found with ``find_spec`` (nothing is imported).

    Raises:
        ConfigError: the package is not installed; the message gives ``install``, the command to fix it.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ConfigError(f'[env.taskset] id = "{taskset_id}": the package {package.replace("_", "-")} is not '
                          f"installed. Install it: {install}")
    return Path(spec.origin).parent


def _resolve(taskset_id: str) -> Callable[..., Iterable[Any]]:
    target = BUILTIN.get(taskset_id, taskset_id)
    module_name, _, attribute = target.partition(":")
    if not attribute:
        raise ConfigError(f"[env.taskset] id = {taskset_id!r}: not a built-in taskset ({', '.join(sorted(BUILTIN))}) "
                          "nor an import path. Write \"pkg.module:function\"")
    try:
        loader = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"[env.taskset] id = {taskset_id!r}: cannot import it ({exc}). "
                          "Check the module is installed and the function name") from exc
    if not callable(loader):
        raise ConfigError(f"[env.taskset] id = {taskset_id!r}: {target} is not callable")
    return loader
