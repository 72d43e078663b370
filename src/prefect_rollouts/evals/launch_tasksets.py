"""The launch form's taskset part: one form per taskset (its own options, defaults read from its loader),
a suite's further tasksets, and the helpers every form field is built with (``config_field`` takes a
config key's default and description). ``evals/launch_form.py`` assembles them into ``LaunchForm``.
Must not import Prefect.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefect_rollouts.bounds import MAX_STORAGE_MB, MAX_TIMEOUT_MULTIPLIER
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.sources import validate_config
from prefect_rollouts.environments import BUILTIN


def _number_fields(schema: dict[str, Any]) -> None:
    """Give each field its ``position`` in declaration order. Prefect's form sorts fields by it, and
    only by it: a Prefect server on PostgreSQL stores the schema as JSONB, which reorders keys
    (shortest first), so without positions the form came out as Model, Taskset, Advanced, ..."""
    for position, field in enumerate(schema.get("properties", {}).values()):
        field["position"] = position


def dotted_value(model: BaseModel, dotted: str) -> Any:
    """The value at the dotted path of ``model`` (``env.agent.client.timeout``)."""
    value: Any = model
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


CONFIG_DEFAULTS = EvalConfig.model_validate({"env": {"taskset": {"id": "arithmetic"}, "agent": {}}})
"""A config with every default: where the form's fields that are config keys take theirs from."""


def config_field(key: str, *, title: str, description: str, **constraints: Any) -> Any:
    """A form field for the eval config's dotted ``key``, its default the config's (None as ``""`` for
    a text field, which ``to_eval_config`` turns back into None); see ``described``."""
    default = dotted_value(CONFIG_DEFAULTS, key)
    return described("" if default is None and key in TEXT_KEYS else default, title, description, constraints)


def option_field(taskset_id: str, option: str, *, title: str, description: str, **constraints: Any) -> Any:
    """A form field for an option of a built-in taskset, its default the loader's own (its signature)."""
    module, _, function = BUILTIN[taskset_id].partition(":")
    default = inspect.signature(getattr(importlib.import_module(module), function)).parameters[option].default
    return described(default, title, description, constraints)


def described(default: Any, title: str, description: str, constraints: dict[str, Any]) -> Any:
    """A field whose description ends with ``Default <value>.``; a default of None or ``""`` must be
    explained in ``description`` itself (``Empty: ...``)."""
    if default not in (None, ""):
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        description = f"{description} Default {shown}."
    return Field(default, title=title, description=description, **constraints)


TEXT_KEYS = {"run_name", "traces.store", "baseline"}
"""Config keys whose None is an empty text field in the form."""


class Form(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_number_fields)


class ArithmeticTaskset(Form):
    """Integer additions "What is a + b?", scored by exact match; needs no data."""

    model_config = ConfigDict(title="arithmetic")
    id: Literal["arithmetic"] = Field("arithmetic", title="Name")
    count: int = option_field("arithmetic", "count", ge=1, title="Questions",
                               description="How many questions the taskset has.")
    seed: int = option_field("arithmetic", "seed", title="Seed",
                              description="Random seed of the questions; task ids are add-SEED-N.")
    max_value: int = option_field("arithmetic", "max_value", ge=0, title="Largest operand",
                                   description="Operands are drawn uniformly from 0 to this.")


BfclCategory = Literal["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "multi_turn_base"]
"""The BFCL categories the taskset supports (``environments.bfcl.CATEGORIES``)."""


class BfclTaskset(Form):
    """Berkeley Function Calling Leaderboard items (needs bfcl-eval: see the README's Install)."""

    model_config = ConfigDict(title="bfcl")
    id: Literal["bfcl"] = Field("bfcl", title="Name")
    category: BfclCategory = option_field("bfcl", "category", title="Category", description="BFCL category.")
    count: int | None = option_field(
        "bfcl", "count", ge=1, title="Items",
        description="How many items from the start of the category (of each category). Empty: all.")
    force_tool_choice: bool | None = option_field(
        "bfcl", "force_tool_choice", title="Force tool choice",
        description="Single-turn categories: on forces a call of the task's function (small models call no tool "
                    "otherwise); off leaves tool_choice to the model. Empty: on, except for irrelevance and "
                    "multi_turn_base (which refuses on).")
    categories: list[BfclCategory] | None = option_field(
        "bfcl", "categories", title="Categories",
        description="Several categories in one taskset, each reported on its own line (instead of Category). "
                    "Empty: the category above.")


class HumanEvalTaskset(Form):
    """OpenAI HumanEval: write a Python function, scored by its unit tests (needs the humaneval extra)."""

    model_config = ConfigDict(title="humaneval")
    id: Literal["humaneval"] = Field("humaneval", title="Name")
    count: int | None = option_field("humaneval", "count", ge=1, title="Problems",
                                      description="How many problems from the first (164 in all). Empty: all.")
    timeout_s: float = option_field("humaneval", "timeout_s", gt=0, title="Test timeout (s)",
                                     description="Limit of one test run, in seconds.")


class HarborTaskset(Form):
    """Agentic tasks in Harbor's format: a directory of task directories on the worker (docker runtime)."""

    model_config = ConfigDict(title="harbor")
    id: Literal["harbor"] = Field("harbor", title="Name")
    path: str = option_field(
        "harbor", "path", min_length=1, title="Task directory",
        description="A Harbor task directory, or a directory of them, on the worker (relative to the directory it "
                    "runs in).")
    tasks: list[str] | None = option_field("harbor", "tasks", title="Tasks",
                                            description="Only these task directories, by name. Empty: all.")
    timeout_multiplier: float = option_field(
        "harbor", "timeout_multiplier", gt=0, le=MAX_TIMEOUT_MULTIPLIER, title="Timeout multiplier",
        description="Scales every agent, verifier and build deadline.")
    storage_mb: int | None = option_field(
        "harbor", "storage_mb", ge=0, le=MAX_STORAGE_MB, title="Disk quota (MiB)",
        description="Every box's disk quota instead of the task's storage_mb; 0 = none. Empty: each task's own.")


class CustomTaskset(Form):
    """A taskset of your own: a function ``load(**options) -> Iterable[Task]`` importable on the worker."""

    model_config = ConfigDict(title="custom (import path)")
    id: Literal["custom"] = Field("custom", title="Name")
    loader: str = Field(..., min_length=1, title="Import path",
                        description='The function that returns the tasks, as "pkg.module:function".')
    options: dict[str, Any] = Field({}, title="Options",
                                    description="Keyword arguments of the function, as a JSON object. Default {}.")


Taskset = ArithmeticTaskset | BfclTaskset | HumanEvalTaskset | HarborTaskset | CustomTaskset
"""One form per taskset. A plain union (``anyOf`` in the schema): Prefect's form shows it as a
switch of the five titles with the chosen taskset's own fields; a discriminated union
(``oneOf``) is shown as a bare JSON editor. Pydantic still picks the one whose ``id`` matches."""


class SuiteEntry(Form):
    """One more taskset of a suite: its own environment in the summary and comparisons."""

    model_config = ConfigDict(title="Suite taskset")
    taskset: Taskset = Field(ArithmeticTaskset(), title="Taskset",
                             description="A built-in taskset with its options, or your own by import path.")
    name: str = Field("", title="Environment name",
                      description="Its name in the summary and comparisons. Empty: the taskset's name.")
    num_tasks: int | None = Field(None, ge=1, title="Number of tasks",
                                  description="Tasks from the start of this taskset. Empty: the form's Number of "
                                              "tasks.")
    agent: dict[str, Any] = Field(
        {}, title="Agent keys",
        description='[env.agent] keys that differ for this taskset, as a JSON object, e.g. {"harness": {"id": '
                    '"tools"}, "max_turns": 4}. Default {}.')

    @field_validator("name", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    def entry(self) -> dict[str, Any]:
        """The ``[[env.tasksets]]`` entry."""
        return {**taskset_entry(self.taskset), **({"name": self.name} if self.name else {}),
                **({"num_tasks": self.num_tasks} if self.num_tasks else {}),
                **({"agent": self.agent} if self.agent else {})}


#: The taskset form of each built-in taskset.
BUILTIN_TASKSETS: dict[str, type[Form]] = {"arithmetic": ArithmeticTaskset, "bfcl": BfclTaskset,
                                            "harbor": HarborTaskset, "humaneval": HumanEvalTaskset}

def taskset_entry(taskset: Taskset) -> dict[str, Any]:
    """A taskset form as a config table: ``id`` and options."""
    if isinstance(taskset, CustomTaskset):
        return {"id": taskset.loader, **taskset.options}
    entry = taskset.model_dump(exclude_none=True)
    if isinstance(taskset, BfclTaskset) and taskset.categories and taskset.category == "simple_python":
        entry.pop("category")   # the default, which categories replaces: the config then reads as it was written
    return entry


def taskset_form(taskset_id: str, options: dict[str, Any]) -> Any:
    """The form of taskset ``taskset_id`` with ``options``: its own for a built-in one, else ``CustomTaskset``.

    Raises:
        ConfigError: a built-in taskset has an option its form does not know.
    """
    builtin = BUILTIN_TASKSETS.get(taskset_id)
    return (validate_config(builtin, {"id": taskset_id, **options}, "env.taskset") if builtin
            else CustomTaskset(loader=taskset_id, options=options))
