"""Which tasksets an eval runs: ``[env.taskset]``, or a suite's ``[[env.tasksets]]`` entries with
their environment names, task counts and agent keys, and each environment as ``EnvironmentSpec``.
Part of the eval config (``config.eval``). Must not import Prefect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefect_rollouts.bounds import MAX_TASKS
from prefect_rollouts.config.agent import AgentConfig
from prefect_rollouts.config.env import is_template
from prefect_rollouts.config.sources import validate_config


class TasksetConfig(BaseModel):
    """``[env.taskset]``: ``id`` plus the taskset's own options (any other keys)."""

    model_config = ConfigDict(extra="allow")

    id: str
    """A built-in taskset name, or ``pkg.module:function`` returning tasks."""

    @property
    def options(self) -> dict[str, Any]:
        """The keys other than ``id``, passed to the taskset's loader."""
        return dict(self.model_extra or {})


NAME_MAX_BYTES = 120
"""Longest ``run_name`` or environment name, in UTF-8 bytes: a run id (``<name>-<UTC time>-<4 hex>``,
21 more) must fit ``RUN_ID_MAX_BYTES``."""
RUN_ID_MAX_BYTES = 200
"""Longest run id, in UTF-8 bytes: it names the ``run_id=<id>`` directory, and a file name holds at
most 255 bytes."""


def path_safe(name: str, max_bytes: int = NAME_MAX_BYTES) -> bool:
    """Whether ``name`` can be (part of) a run id: the dataset's ``run_id=<id>`` directory. Not empty,
    no ``/``, ``\\`` or ``=`` (a ``/`` made nested directories and lost the run's rows), no control
    character (a NUL is refused by the file system and the Prefect API), at most ``max_bytes`` in UTF-8."""
    return (bool(name.strip()) and not any(c in "/\\=" or ord(c) < 32 or ord(c) == 127 for c in name)
            and len(name.encode("utf-8", "surrogatepass")) <= max_bytes)


class SuiteTasksetConfig(TasksetConfig):
    """One ``[[env.tasksets]]`` entry of a suite: a taskset with its options, the name of its
    environment and its number of tasks."""

    name: str | None = None
    """The environment's name in rows, the summary and comparisons; default the taskset id. Two
    entries of one taskset need different names."""
    num_tasks: int | None = Field(None, ge=1, le=MAX_TASKS)
    """How many tasks from the start of this taskset; default the top-level ``num_tasks`` (all when unset).
    At most 100,000 (``bounds.MAX_TASKS``)."""
    agent: dict[str, Any] = Field(default_factory=dict)
    """``[env.agent]`` keys that differ for this environment, e.g. ``{ harness = "tools", max_turns = 4 }``
    (merged over ``[env.agent]``, tables key by key). Nothing that may hold a secret: no ``client``
    (a suite has one model endpoint, and judges' clients belong in ``[env.agent]``, where ``[limits]``
    and the secrets checks cover them) and only ``${VAR}`` templates as environment values; nor
    ``orchestrator`` (``rollout_granularity`` decides)."""

    @property
    def environment(self) -> str:
        return self.name or self.id

    @field_validator("name")
    @classmethod
    def _usable_name(cls, value: str | None) -> str | None:
        if value is not None and (value == "all" or not path_safe(value)):
            raise ValueError("an environment's name names rows and run ids: no /, \\ or =, no control character, "
                             f"not empty, at most {NAME_MAX_BYTES} bytes (UTF-8), and not \"all\" (the summary's "
                             "overall line)")
        return value

    @field_validator("agent")
    @classmethod
    def _nothing_secret(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "orchestrator" in value:
            raise ValueError("agent.orchestrator: an eval's rollout_granularity decides how rollouts run; remove it")

        def walk(node: Any, path: str) -> None:
            if isinstance(node, list):
                for i, item in enumerate(node):
                    walk(item, f"{path}[{i}]")
            if not isinstance(node, dict):
                return
            for key, item in node.items():
                where = f"{path}.{key}"
                if key == "client":
                    raise ValueError(f"{where}: a suite's environments share [env.agent.client] and the judges' "
                                     "clients (they may hold keys); set them in [env.agent] and remove them here")
                if key == "env" and isinstance(item, dict):
                    literal = [name for name, text in item.items() if not is_template(str(text))]
                    if literal:
                        raise ValueError(f"{where}: {', '.join(literal)} must be ${{VAR}} templates here (a suite "
                                         "entry is stored with the run and sent to workers as it is)")
                walk(item, where)
        walk(value, "agent")
        return value


@dataclass(frozen=True)
class EnvironmentSpec:
    """One environment of an eval: its name (the rows' ``environment``), taskset id, options and task count."""

    name: str
    taskset: str
    options: dict[str, Any]
    num_tasks: int | None
    agent: AgentConfig
    """``[env.agent]``, with the entry's ``agent`` keys merged over it in a suite."""


def merged_agent(base: AgentConfig, changes: dict[str, Any], section: str) -> AgentConfig:
    """``base`` with ``changes`` merged over it, tables key by key.

    Raises:
        ConfigError: the result is not a valid agent config (the message names ``section`` and the key).
    """
    if not changes:
        return base

    def merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
        for key, value in more.items():
            into[key] = merge(dict(into[key]), value) if isinstance(value, dict) and isinstance(into.get(key),
                                                                                                dict) else value
        return into
    data = merge(base.model_dump(exclude_unset=True), changes)
    data["client"] = base.client   # refused in changes: the suite's one endpoint, secrets kept as they are
    return validate_config(AgentConfig, data, section)
