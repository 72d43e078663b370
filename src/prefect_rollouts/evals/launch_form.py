"""The launch form: an eval as a person fills it in from the Prefect UI, and its ``EvalConfig``.

``EvalConfig`` mirrors the TOML (86 fields once flattened, in the order of its tables), which
makes a poor form. ``LaunchForm`` is the ``launch`` flow's one parameter (``flows/launch.py``):
the fields that change between launches first (the taskset with its own options, model,
endpoint, number of tasks, rollouts per task, concurrency), then ``advanced`` (run id prefix,
granularity, harness, caps, sampling, runtime, traces) and, for every other key, dotted
``overrides`` as the CLI's ``--set`` takes them. ``to_eval_config`` turns a form into the config
``eval_flow`` runs; ``from_eval_config`` is its inverse (``prefect-rollouts serve CONFIG``
launches the config's values as the form's defaults). Prefect renders the form from the JSON
schema: field order is the order below, titles and descriptions are the fields' own.
Must not import Prefect.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from prefect_rollouts.bounds import MAX_STORAGE_MB, MAX_TIMEOUT_MULTIPLIER
from prefect_rollouts.config.agent import HarnessId
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.sources import Source, validate_config, validate_sources
from prefect_rollouts.config.taskset import TasksetConfig
from prefect_rollouts.environments import BUILTIN
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.identity import check_portable


def _number_fields(schema: dict[str, Any]) -> None:
    """Give each field its ``position`` in declaration order. Prefect's form sorts fields by it, and
    only by it: a Prefect server on PostgreSQL stores the schema as JSONB, which reorders keys
    (shortest first), so without positions the form came out as Model, Taskset, Advanced, ..."""
    for position, field in enumerate(schema.get("properties", {}).values()):
        field["position"] = position


def _get(model: BaseModel, dotted: str) -> Any:
    """The value at the dotted path of ``model`` (``env.agent.client.timeout``)."""
    value: Any = model
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


_CONFIG_DEFAULTS = EvalConfig.model_validate({"env": {"taskset": {"id": "arithmetic"}, "agent": {}}})
"""A config with every default: where the form's fields that are config keys take theirs from."""


def _config_field(key: str, *, title: str, description: str, **constraints: Any) -> Any:
    """A form field for the eval config's dotted ``key``, its default the config's (None as ``""`` for
    a text field, which ``to_eval_config`` turns back into None); see ``_described``."""
    default = _get(_CONFIG_DEFAULTS, key)
    return _described("" if default is None and key in _TEXT_KEYS else default, title, description, constraints)


def _option_field(taskset_id: str, option: str, *, title: str, description: str, **constraints: Any) -> Any:
    """A form field for an option of a built-in taskset, its default the loader's own (its signature)."""
    module, _, function = BUILTIN[taskset_id].partition(":")
    default = inspect.signature(getattr(importlib.import_module(module), function)).parameters[option].default
    return _described(default, title, description, constraints)


def _described(default: Any, title: str, description: str, constraints: dict[str, Any]) -> Any:
    """A field whose description ends with ``Default <value>.``; a default of None or ``""`` must be
    explained in ``description`` itself (``Empty: ...``)."""
    if default not in (None, ""):
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        description = f"{description} Default {shown}."
    return Field(default, title=title, description=description, **constraints)


_TEXT_KEYS = {"run_name", "traces.store", "baseline"}
"""Config keys whose None is an empty text field in the form."""


class _Form(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_number_fields)


class ArithmeticTaskset(_Form):
    """Integer additions "What is a + b?", scored by exact match; needs no data."""

    model_config = ConfigDict(title="arithmetic")
    id: Literal["arithmetic"] = Field("arithmetic", title="Name")
    count: int = _option_field("arithmetic", "count", ge=1, title="Questions",
                               description="How many questions the taskset has.")
    seed: int = _option_field("arithmetic", "seed", title="Seed",
                              description="Random seed of the questions; task ids are add-SEED-N.")
    max_value: int = _option_field("arithmetic", "max_value", ge=0, title="Largest operand",
                                   description="Operands are drawn uniformly from 0 to this.")


BfclCategory = Literal["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "multi_turn_base"]
"""The BFCL categories the taskset supports (``environments.bfcl.CATEGORIES``)."""


class BfclTaskset(_Form):
    """Berkeley Function Calling Leaderboard items (needs bfcl-eval: see the README's Install)."""

    model_config = ConfigDict(title="bfcl")
    id: Literal["bfcl"] = Field("bfcl", title="Name")
    category: BfclCategory = _option_field("bfcl", "category", title="Category", description="BFCL category.")
    count: int | None = _option_field(
        "bfcl", "count", ge=1, title="Items",
        description="How many items from the start of the category (of each category). Empty: all.")
    force_tool_choice: bool | None = _option_field(
        "bfcl", "force_tool_choice", title="Force tool choice",
        description="Single-turn categories: on forces a call of the task's function (small models call no tool "
                    "otherwise); off leaves tool_choice to the model. Empty: on, except for irrelevance and "
                    "multi_turn_base (which refuses on).")
    categories: list[BfclCategory] | None = _option_field(
        "bfcl", "categories", title="Categories",
        description="Several categories in one taskset, each reported on its own line (instead of Category). "
                    "Empty: the category above.")


class HumanEvalTaskset(_Form):
    """OpenAI HumanEval: write a Python function, scored by its unit tests (needs the humaneval extra)."""

    model_config = ConfigDict(title="humaneval")
    id: Literal["humaneval"] = Field("humaneval", title="Name")
    count: int | None = _option_field("humaneval", "count", ge=1, title="Problems",
                                      description="How many problems from the first (164 in all). Empty: all.")
    timeout_s: float = _option_field("humaneval", "timeout_s", gt=0, title="Test timeout (s)",
                                     description="Limit of one test run, in seconds.")


class HarborTaskset(_Form):
    """Agentic tasks in Harbor's format: a directory of task directories on the worker (docker runtime)."""

    model_config = ConfigDict(title="harbor")
    id: Literal["harbor"] = Field("harbor", title="Name")
    path: str = _option_field(
        "harbor", "path", min_length=1, title="Task directory",
        description="A Harbor task directory, or a directory of them, on the worker (relative to the directory it "
                    "runs in).")
    tasks: list[str] | None = _option_field("harbor", "tasks", title="Tasks",
                                            description="Only these task directories, by name. Empty: all.")
    timeout_multiplier: float = _option_field(
        "harbor", "timeout_multiplier", gt=0, le=MAX_TIMEOUT_MULTIPLIER, title="Timeout multiplier",
        description="Scales every agent, verifier and build deadline.")
    storage_mb: int | None = _option_field(
        "harbor", "storage_mb", ge=0, le=MAX_STORAGE_MB, title="Disk quota (MiB)",
        description="Every box's disk quota instead of the task's storage_mb; 0 = none. Empty: each task's own.")


class CustomTaskset(_Form):
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


class SuiteEntry(_Form):
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
        return {**_taskset_entry(self.taskset), **({"name": self.name} if self.name else {}),
                **({"num_tasks": self.num_tasks} if self.num_tasks else {}),
                **({"agent": self.agent} if self.agent else {})}


class AdvancedSettings(_Form):
    """Settings that rarely change between launches; any other config key goes in Other config keys."""

    model_config = ConfigDict(title="Advanced")
    run_name: str = _config_field(
        "run_name", title="Run id prefix",
        description="Traces are stored under the run id PREFIX-YYYYmmdd-HHMMSS-XXXX. Empty: taskset-harness-model. "
                    "(Prefect's Run Name above names the launch's flow run only.)")
    rollout_granularity: Literal["flow", "task", "batch"] = _config_field(
        "rollout_granularity", title="Granularity",
        description="What Prefect records of each rollout: flow = a flow run with a task run per stage (most "
                    "visible); task = one task run; batch = one task run per batch of rollouts (fastest).")
    batch_size: int = _config_field("batch_size", ge=1, title="Batch size",
                                    description="Rollouts per batch with granularity batch.")
    harness: HarnessId = _config_field(
        "env.agent.harness.id", title="Harness",
        description="chat = one model reply per turn; tools = the tool-calling loop with bash, read_file and "
                    "write_file; program = your agent program (its command and files in overrides under "
                    "env.agent.harness); bash = the package's own agent program.")
    max_turns: int | None = _config_field("env.agent.max_turns", ge=1, title="Max model replies",
                                  description="Cap on model replies per rollout. Empty: no cap.")
    max_turn_tokens: int | None = _config_field("env.agent.max_turn_tokens", ge=1, title="Max tokens per reply",
                                        description="Token cap of each model reply, in tokens. Empty: the server's.")
    temperature: float | None = _config_field("env.agent.sampling.temperature", ge=0, title="Temperature",
                                      description="Sampling temperature. Empty: the server's default.")
    api_key_env: str = _config_field(
        "env.agent.client.api_key_env", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$", title="API key variable",
        description="Environment variable on the worker that holds the endpoint's API key (never the key itself). "
                    "Empty: no key; a ModelEndpoint block brings its own.")
    request_timeout_s: float = _config_field("env.agent.client.timeout", gt=0, title="Request timeout (s)",
                                             description="Timeout of one model request, in seconds.")
    runtime: Literal["local", "docker"] = _config_field(
        "env.agent.runtime.type", title="Runtime",
        description="Where tools and tests run: local = a temporary directory on the worker; docker = a fresh "
                    "container per rollout.")
    traces_path: str = _config_field("traces.path", min_length=1, title="Traces directory",
                                     description="Parquet dataset directory on the worker.")
    trace_store: str = _config_field("traces.store", title="TraceStore block",
                             description="Name of a TraceStore block; wins over the directory. Empty: none.")
    pass_threshold: float = _config_field("pass_threshold", title="Pass threshold",
                                          description="A rollout passes (for pass@k) at this reward or more.")
    baseline: str = _config_field(
        "baseline", title="Baseline",
        description='Run to compare with at the end: "last" = the last completed run of this deployment (it then '
                    "becomes this run if this one completes), or a run id. A change whose 95% interval excludes 0 "
                    "emits prefect-rollouts.eval.regressed or .improved. Empty: no comparison.")
    finish_run: str = Field("", title="Finish run", description=(
        "Run id of an earlier run to finish instead: its rollouts without a row run, and its errored ones again as "
        "new attempts (of retry_error_types when Other config keys sets it). The form must launch the config the "
        "run started with. Empty: a new run."))
    overrides: dict[str, Any] = Field(
        {}, title="Other config keys",
        description='Any other eval config key, dotted as in --set, with its value: e.g. {"env.agent.timeouts.agent": '
                    '300, "env.agent.sampling.top_p": 0.9}. Keys that have a field above are refused. Default {}.')

    @field_validator("run_name", "api_key_env", "traces_path", "trace_store", "baseline", "finish_run", mode="before")
    @classmethod
    def _none_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        """A config's None (and a UI's null) is the field's default."""
        return cls.model_fields[info.field_name or ""].default if value is None else value


class LaunchForm(_Form):
    """One eval as launched from the UI. Defaults are the TOML's (the taskset's: arithmetic)."""

    model_config = ConfigDict(title="Eval")
    taskset: Taskset = Field(ArithmeticTaskset(), title="Taskset",
                             description="A built-in taskset with its options, or your own by import path. "
                                         "Default arithmetic.")
    model: str = _config_field("env.agent.model", min_length=1, title="Model",
                               description="Model name sent to the endpoint; local/smollm2 or local/PATH.gguf start an "
                                           "embedded llama.cpp server on the worker (the local extra).")
    endpoint: str = Field(
        "", title="Endpoint",
        description="OpenAI-compatible server as its base URL (http://HOST:PORT/v1), or the name of a "
                    "ModelEndpoint block (URL and API key). Empty: http://127.0.0.1:8000/v1; local/* models "
                    "ignore it.")
    num_tasks: int | None = _config_field("num_tasks", ge=1, title="Number of tasks",
                                          description="Tasks from the start of the taskset. Empty: all of them.")
    rollouts_per_task: int = _config_field("rollouts_per_task", ge=1, title="Rollouts per task",
                                           description="Rollouts of each task; pass@k is reported up to this.")
    max_concurrent: int = _config_field("max_concurrent", ge=1, title="Concurrency",
                                        description="Rollouts in flight at once.")
    more_tasksets: list[SuiteEntry] = Field(
        [], title="More tasksets (a suite)",
        description="Tasksets run in the same eval after the one above, each its own environment with its own "
                    "options and number of tasks. Default [].")
    advanced: AdvancedSettings = Field(AdvancedSettings(), title="Advanced",
                                       description="Rarer settings, and any other config key by its dotted name.")

    @field_validator("endpoint", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    def to_eval_config(self) -> EvalConfig:
        """The ``EvalConfig`` this form launches (``""`` in a text field is the config's None).

        Raises:
            ConfigError: an endpoint URL with credentials in it, an ``advanced.overrides`` key
                that has its own field in the form or is no config key, or a value the config
                refuses; the message names the form field or the override's key.
        """
        first = _taskset_entry(self.taskset)
        sets: list[tuple[list[str], Any]] = [
            (["env", "tasksets"], [first, *(entry.entry() for entry in self.more_tasksets)]) if self.more_tasksets
            else (["env", "taskset"], first)]
        sets += [(key.split("."), None if (value := _get(self, field)) == "" else value) for field, key in _FIELDS]
        if self.endpoint:
            sets.append((_endpoint_key(self.endpoint).split("."), self.endpoint))
        for key in self.advanced.overrides:
            if (title := _field_of(key, self.endpoint)) is not None:
                raise ConfigError(f'advanced.overrides["{key}"]: the form has a field for it ({title}). '
                                  "Set it there and remove the key")
        overrides = [(key.split("."), value) for key, value in self.advanced.overrides.items()]
        return validate_sources(EvalConfig, [Source("the launch form", sets=sets),
                                             Source("advanced.overrides", sets=overrides)])

    @classmethod
    def from_eval_config(cls, config: EvalConfig) -> LaunchForm:
        """The form that launches ``config``: its values in the form's fields, every other key
        that differs from its default in ``advanced.overrides``.

        Raises:
            ConfigError: ``[env.agent.client] headers`` is set (header values are secrets and
                cannot be flow-run parameters: put them in a ModelEndpoint block), a judge's client
                has headers or an env table a literal value (``evals.identity.check_portable``), or a built-in
                taskset has an option its form does not know.
        """
        client = config.env.agent.client
        if client.headers:
            raise ConfigError("[env.agent.client] headers: a launch form cannot carry header values (they are "
                              "secrets, and flow-run parameters are visible). Put them in a ModelEndpoint block "
                              'and set [env.agent.client] endpoint = "<block name>"')
        check_portable(config, "a launch form")
        form: dict[str, Any] = {"advanced": {}}
        for field, key in _FIELDS:
            _put(form, field, _get(config, key))
        first: TasksetConfig
        if config.env.tasksets:
            first, *more = config.env.tasksets
            if first.name not in (None, first.id) or first.num_tasks or first.agent:
                raise ConfigError("[[env.tasksets]] first entry: a launch form names the first environment after "
                                  "its taskset, with the form's Number of tasks and agent. Remove its name, "
                                  "num_tasks and agent keys, or list another entry first")
            form["more_tasksets"] = [SuiteEntry(taskset=_taskset_form(entry.id, entry.options), name=entry.name or "",
                                                num_tasks=entry.num_tasks, agent=entry.agent) for entry in more]
        else:
            assert config.env.taskset is not None   # EnvConfig's validator
            first = config.env.taskset
        form["taskset"] = _taskset_form(first.id, first.options)
        form["endpoint"] = client.endpoint or (client.base_url if "base_url" in client.model_fields_set else "")
        values = _flatten(config.model_dump(mode="json"))   # whole values: a judge's id is a default, yet needed
        changed = _flatten(config.model_dump(mode="json", exclude_defaults=True))
        form["advanced"]["overrides"] = {key: values.get(key, value) for key, value in changed.items()
                                         if _field_of(key, form["endpoint"]) is None}
        return cls.model_validate(form)


#: The taskset form of each built-in taskset.
BUILTIN_TASKSETS: dict[str, type[_Form]] = {"arithmetic": ArithmeticTaskset, "bfcl": BfclTaskset,
                                            "harbor": HarborTaskset, "humaneval": HumanEvalTaskset}

#: (form field, config key) pairs that hold the same value; ``""`` in the form is None in the config.
#: The taskset and the endpoint are mapped on their own.
_FIELDS = (
    ("model", "env.agent.model"), ("num_tasks", "num_tasks"), ("rollouts_per_task", "rollouts_per_task"),
    ("max_concurrent", "max_concurrent"), ("advanced.run_name", "run_name"),
    ("advanced.rollout_granularity", "rollout_granularity"), ("advanced.batch_size", "batch_size"),
    ("advanced.harness", "env.agent.harness.id"), ("advanced.max_turns", "env.agent.max_turns"),
    ("advanced.max_turn_tokens", "env.agent.max_turn_tokens"),
    ("advanced.temperature", "env.agent.sampling.temperature"),
    ("advanced.api_key_env", "env.agent.client.api_key_env"),
    ("advanced.request_timeout_s", "env.agent.client.timeout"),
    ("advanced.runtime", "env.agent.runtime.type"), ("advanced.traces_path", "traces.path"),
    ("advanced.trace_store", "traces.store"), ("advanced.pass_threshold", "pass_threshold"),
    ("advanced.baseline", "baseline"),
)


def _taskset_entry(taskset: Taskset) -> dict[str, Any]:
    """A taskset form as a config table: ``id`` and options."""
    if isinstance(taskset, CustomTaskset):
        return {"id": taskset.loader, **taskset.options}
    entry = taskset.model_dump(exclude_none=True)
    if isinstance(taskset, BfclTaskset) and taskset.categories and taskset.category == "simple_python":
        entry.pop("category")   # the default, which categories replaces: the config then reads as it was written
    return entry


def _taskset_form(taskset_id: str, options: dict[str, Any]) -> Any:
    """The form of taskset ``taskset_id`` with ``options``: its own for a built-in one, else ``CustomTaskset``.

    Raises:
        ConfigError: a built-in taskset has an option its form does not know.
    """
    builtin = BUILTIN_TASKSETS.get(taskset_id)
    return (validate_config(builtin, {"id": taskset_id, **options}, "env.taskset") if builtin
            else CustomTaskset(loader=taskset_id, options=options))


def _endpoint_key(endpoint: str) -> str:
    """The config key the Endpoint field sets: ``base_url`` for a URL, ``endpoint`` for a block name.

    Raises:
        ConfigError: a URL with credentials in it.
    """
    if "://" not in endpoint:
        return "env.agent.client.endpoint"
    parts = urlsplit(endpoint)
    if parts.username or parts.password:
        raise ConfigError("endpoint: the URL carries credentials, and form values are visible to everyone who "
                          "can see the flow run. Put the key in a ModelEndpoint block and name the block here")
    return "env.agent.client.base_url"


def _field_of(key: str, endpoint: str) -> str | None:
    """The form field that sets config key ``key`` (or a key inside or around it), None if none does.
    ``base_url`` stays free beside an Endpoint that names a block (the block's URL is then overridden)."""
    covered = {key_: field for field, key_ in _FIELDS} | {"env.taskset": "taskset", "env.tasksets": "more_tasksets",
                                                         "env.agent.client.endpoint":
                                                         "endpoint", "env.agent.client.base_url": "endpoint"}
    if endpoint and "://" not in endpoint:
        covered.pop("env.agent.client.base_url")
    for config_key, field in covered.items():
        if key == config_key or key.startswith(config_key + ".") or config_key.startswith(key + "."):
            return field
    return None


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``dotted = "a.b.c"``, creating the tables on the way.

    Raises:
        ConfigError: a part on the way already holds a value that is not a table.
    """
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a table")
    node[parts[-1]] = value


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; empty tables and every other value stay whole."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
