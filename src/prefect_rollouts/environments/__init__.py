"""Environments: tasksets by name (``arithmetic``, ...) or by import path ``pkg.module:function``.

Contract: a taskset is a function ``load(**options) -> Iterable[Task]`` whose tasks have
unique ids. ``load_taskset`` resolves ``[env.taskset]``. Must not import Prefect.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from prefect_rollouts.bounds import MAX_TASKS
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.task import Task

#: Built-in taskset names and the function behind each.
BUILTIN = {
    "arithmetic": "prefect_rollouts.environments.arithmetic:load",
    "bfcl": "prefect_rollouts.environments.bfcl.taskset:load",
    "harbor": "prefect_rollouts.environments.harbor.taskset:load",
    "humaneval": "prefect_rollouts.environments.humaneval:load",
}


def load_taskset(taskset_id: str, options: dict[str, Any] | None = None, limit: int | None = None) -> list[Task]:
    """The first ``limit`` tasks (all when None) of taskset ``taskset_id`` built with ``options``.

    Each option is checked against the type its loader declares (``count: int`` refuses
    ``"ten"``) before the loader runs, and whatever the loader raises while it builds or yields
    tasks becomes a ``ConfigError``: a bad option is reported, never a traceback.

    Raises:
        ConfigError: unknown name, a path that does not import, an option of the wrong type or
            one the loader rejects (also while iterating a generator loader), something that is
            not a ``Task``, two tasks with the same id, no task at all, or more than
            ``bounds.MAX_TASKS`` of them.
    """
    loader = _resolve(taskset_id)
    options = _checked_options(taskset_id, loader, options or {})
    tasks: list[Task] = []
    seen: set[str] = set()
    try:
        for item in loader(**options):
            if limit is not None and len(tasks) >= limit:
                break
            if len(tasks) >= MAX_TASKS:
                raise ConfigError(f"[env.taskset] id = {taskset_id!r}: yields more than {MAX_TASKS:,} tasks, more "
                                  "than one eval holds (bounds.MAX_TASKS). Set num_tasks, or split the taskset "
                                  "into several runs")
            if not isinstance(item, Task):
                raise ConfigError(f"[env.taskset] id = {taskset_id!r}: produced {type(item).__name__}, not a Task")
            if item.id in seen:
                raise ConfigError(f"[env.taskset] id = {taskset_id!r}: two tasks have id {item.id!r}; "
                                  "task ids must be unique (set TaskData.id)")
            seen.add(item.id)
            tasks.append(item)
    except ConfigError:
        raise
    except Exception as exc:  # a loader's failure on its options; its own bugs are chained for debugging
        raise ConfigError(f"[env.taskset] id = {taskset_id!r}: its loader failed with the options "
                          f"{_shown(options)} ({type(exc).__name__}: {exc}). Check the taskset's options") from exc
    if not tasks:
        raise ConfigError(f"[env.taskset] id = {taskset_id!r}: no tasks with the options {_shown(options)}. "
                          "Check the options (e.g. a count of at least 1)")
    return tasks


def _checked_options(taskset_id: str, loader: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """``options`` checked (strictly) against the loader's signature and type hints.

    Raises:
        ConfigError: an option the loader does not take, or a value not of its declared type.
    """
    try:
        signature = inspect.signature(loader)
        hints = typing.get_type_hints(loader)
    except (TypeError, ValueError, NameError):  # no signature or unresolvable hints: the loader checks
        return options
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    checked = dict(options)
    for key, value in options.items():
        parameter = signature.parameters.get(key)
        if parameter is None or parameter.kind in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL):
            if takes_any:
                continue
            known = [name for name, p in signature.parameters.items() if p.kind in (p.KEYWORD_ONLY,
                                                                                    p.POSITIONAL_OR_KEYWORD)]
            raise ConfigError(f"[env.taskset] {key}: unknown option of taskset {taskset_id!r}. "
                              f"Its options are: {', '.join(known) or 'none'}")
        if key not in hints:
            continue
        try:
            checked[key] = TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as exc:
            raise ConfigError(f"[env.taskset] {key} = {_toml(value)}: taskset {taskset_id!r} takes {key}: "
                              f"{_type_name(hints[key])} ({exc.errors()[0]['msg']}). Write a value of that "
                              "type (numbers and true/false without quotes)") from None
        except Exception:  # a hint pydantic cannot check: leave it to the loader
            continue
    return checked


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _toml(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, bool)) or value is None else repr(value)


def _shown(options: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key} = {_toml(value)}" for key, value in sorted(options.items())) + "}"


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


_loaded: dict[str, dict[str, Task]] = {}


def find_task(taskset_id: str, options: dict[str, Any], task_id: str) -> Task:
    """Task ``task_id`` of taskset ``taskset_id`` built with ``options`` (the whole taskset is
    loaded once per process and kept, so a worker rebuilding many rollouts loads it once).

    Raises:
        ConfigError: the taskset fails to load (see ``load_taskset``), or it has no task
            ``task_id`` here: the taskset differs on this machine (another package version or
            data), and running another task under that id would give a wrong row.
    """
    key = json.dumps([taskset_id, options], sort_keys=True, default=str)
    if key not in _loaded:
        _loaded[key] = {task.id: task for task in load_taskset(taskset_id, options)}
    tasks = _loaded[key]
    if task_id not in tasks:
        raise ConfigError(f"[env.taskset] id = {taskset_id!r}: no task with id {task_id!r} in this process "
                          f"({len(tasks)} tasks loaded with options {options!r}). The taskset differs on this "
                          "machine: install the same package versions and data as where the eval was planned")
    return tasks[task_id]
