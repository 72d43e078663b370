"""The launch form: an eval as a person fills it in from the Prefect UI, and its ``EvalConfig``.

``EvalConfig`` mirrors the TOML (86 fields once flattened, in the order of its tables), which
makes a poor form. ``LaunchForm`` is the ``launch`` flow's one parameter (``flows/launch.py``):
the fields that change between launches first (the taskset with its own options, model,
endpoint, number of tasks, rollouts per task, concurrency), then ``limits`` (budgets, attempts per
rollout) and ``advanced`` (run id prefix, granularity, harness, caps, sampling, runtime, traces,
finishing an earlier run) and, for every other key, dotted
``overrides`` as the CLI's ``--set`` takes them. ``to_eval_config`` turns a form into the config
``eval_flow`` runs; ``from_eval_config`` is its inverse (``prefect-rollouts serve CONFIG``
launches the config's values as the form's defaults). Prefect renders the form from the JSON
schema: field order is the order below, titles and descriptions are the fields' own. The taskset forms
and the field helpers are ``launch_tasksets.py``.
Must not import Prefect.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from prefect_rollouts.bounds import MAX_RETRIES
from prefect_rollouts.config.eval import EvalConfig
from prefect_rollouts.config.harness import HarnessId
from prefect_rollouts.config.sources import Source, validate_sources
from prefect_rollouts.config.taskset import TasksetConfig
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.identity import check_portable
from prefect_rollouts.evals.launch_tasksets import (
    ArithmeticTaskset,
    Form,
    SuiteEntry,
    Taskset,
    config_field,
    dotted_value,
    taskset_entry,
    taskset_form,
)


class AdvancedSettings(Form):
    """Settings that rarely change between launches; any other config key goes in Other config keys."""

    model_config = ConfigDict(title="Advanced")
    run_name: str = config_field(
        "run_name", title="Run id prefix",
        description="Traces are stored under the run id PREFIX-YYYYmmdd-HHMMSS-XXXX. Empty: taskset-harness-model. "
                    "(Prefect's Run Name above names the launch's flow run only.)")
    rollout_granularity: Literal["flow", "task", "batch"] = config_field(
        "rollout_granularity", title="Granularity",
        description="What Prefect records of each rollout: flow = a flow run with a task run per stage (most "
                    "visible); task = one task run; batch = one task run per batch of rollouts (fastest).")
    batch_size: int = config_field("batch_size", ge=1, title="Batch size",
                                    description="Rollouts per batch with granularity batch.")
    harness: HarnessId = config_field(
        "env.agent.harness.id", title="Harness",
        description="chat = one model reply per turn; tools = the tool-calling loop with bash, read_file and "
                    "write_file; program = your agent program (its command and files in overrides under "
                    "env.agent.harness); bash = the package's own agent program.")
    max_turns: int | None = config_field("env.agent.max_turns", ge=1, title="Max model replies",
                                  description="Cap on model replies per rollout. Empty: no cap.")
    max_turn_tokens: int | None = config_field("env.agent.max_turn_tokens", ge=1, title="Max tokens per reply",
                                        description="Token cap of each model reply, in tokens. Empty: the server's.")
    temperature: float | None = config_field("env.agent.sampling.temperature", ge=0, title="Temperature",
                                      description="Sampling temperature. Empty: the server's default.")
    api_key_env: str = config_field(
        "env.agent.client.api_key_env", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$", title="API key variable",
        description="Environment variable on the worker that holds the endpoint's API key (never the key itself). "
                    "Empty: no key; a ModelEndpoint block brings its own.")
    request_timeout_s: float = config_field("env.agent.client.timeout", gt=0, title="Request timeout (s)",
                                             description="Timeout of one model request, in seconds.")
    runtime: Literal["local", "docker"] = config_field(
        "env.agent.runtime.type", title="Runtime",
        description="Where tools and tests run: local = a temporary directory on the worker; docker = a fresh "
                    "container per rollout.")
    traces_path: str = config_field("traces.path", min_length=1, title="Traces directory",
                                     description="Parquet dataset directory on the worker.")
    trace_store: str = config_field("traces.store", title="TraceStore block",
                             description="Name of a TraceStore block; wins over the directory. Empty: none.")
    pass_threshold: float = config_field("pass_threshold", title="Pass threshold",
                                          description="A rollout passes (for pass@k) at this reward or more.")
    baseline: str = config_field(
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


class LimitSettings(Form):
    """What a run may spend, and how often an errored rollout runs again (``docs/budgets.md``,
    ``docs/retries.md``)."""

    model_config = ConfigDict(title="Limits")
    max_rollout_attempts: int = config_field(
        "max_rollout_attempts", ge=1, le=MAX_RETRIES, title="Attempts per rollout",
        description="A rollout that ends in a provider, runtime or infrastructure error runs again, up to this "
                    "many attempts in all, each a row of its own. 1: no retry.")
    token_budget: int | None = config_field(
        "token_budget", ge=1, title="Token budget",
        description="Tokens the whole run may spend (every model and judge call of every attempt). Once reached, no "
                    "rollout starts, rollouts in flight stop at their next call, and the run ends BudgetReached; "
                    "Finish run with a larger budget runs the rest. Empty: no budget.")
    cost_budget_usd: float | None = config_field(
        "cost_budget_usd", gt=0, title="Cost budget (USD)",
        description="USD the whole run may spend, as the token budget, priced with each client's price (set "
                    "env.agent.client.price in Advanced > Other config keys). Empty: no budget.")


class LaunchForm(Form):
    """One eval as launched from the UI. Defaults are the TOML's (the taskset's: arithmetic)."""

    model_config = ConfigDict(title="Eval")
    taskset: Taskset = Field(ArithmeticTaskset(), title="Taskset",
                             description="A built-in taskset with its options, or your own by import path. "
                                         "Default arithmetic.")
    model: str = config_field("env.agent.model", min_length=1, title="Model",
                               description="Model name sent to the endpoint; local/smollm2 or local/PATH.gguf start an "
                                           "embedded llama.cpp server on the worker (the local extra).")
    endpoint: str = Field(
        "", title="Endpoint",
        description="OpenAI-compatible server as its base URL (http://HOST:PORT/v1), or the name of a "
                    "ModelEndpoint block (URL and API key). Empty: http://127.0.0.1:8000/v1; local/* models "
                    "ignore it.")
    num_tasks: int | None = config_field("num_tasks", ge=1, title="Number of tasks",
                                          description="Tasks from the start of the taskset. Empty: all of them.")
    rollouts_per_task: int = config_field("rollouts_per_task", ge=1, title="Rollouts per task",
                                           description="Rollouts of each task; pass@k is reported up to this.")
    max_concurrent: int = config_field("max_concurrent", ge=1, title="Concurrency",
                                        description="Rollouts in flight at once.")
    more_tasksets: list[SuiteEntry] = Field(
        [], title="More tasksets (a suite)",
        description="Tasksets run in the same eval after the one above, each its own environment with its own "
                    "options and number of tasks. Default [].")
    limits: LimitSettings = Field(LimitSettings(), title="Limits",
                                  description="Token and cost budgets of the run, and attempts per rollout.")
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
        first = taskset_entry(self.taskset)
        sets: list[tuple[list[str], Any]] = [
            (["env", "tasksets"], [first, *(entry.entry() for entry in self.more_tasksets)]) if self.more_tasksets
            else (["env", "taskset"], first)]
        sets += [(key.split("."), None if (value := dotted_value(self, field)) == "" else value)
                 for field, key in _FIELDS]
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
            _put(form, field, dotted_value(config, key))
        first: TasksetConfig
        if config.env.tasksets:
            first, *more = config.env.tasksets
            if first.name not in (None, first.id) or first.num_tasks or first.agent:
                raise ConfigError("[[env.tasksets]] first entry: a launch form names the first environment after "
                                  "its taskset, with the form's Number of tasks and agent. Remove its name, "
                                  "num_tasks and agent keys, or list another entry first")
            form["more_tasksets"] = [SuiteEntry(taskset=taskset_form(entry.id, entry.options), name=entry.name or "",
                                                num_tasks=entry.num_tasks, agent=entry.agent) for entry in more]
        else:
            assert config.env.taskset is not None   # EnvConfig's validator
            first = config.env.taskset
        form["taskset"] = taskset_form(first.id, first.options)
        form["endpoint"] = client.endpoint or (client.base_url if "base_url" in client.model_fields_set else "")
        values = _flatten(config.model_dump(mode="json"))   # whole values: a judge's id is a default, yet needed
        changed = _flatten(config.model_dump(mode="json", exclude_defaults=True))
        form["advanced"]["overrides"] = {key: values.get(key, value) for key, value in changed.items()
                                         if _field_of(key, form["endpoint"]) is None}
        return cls.model_validate(form)


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
    ("advanced.baseline", "baseline"), ("limits.max_rollout_attempts", "max_rollout_attempts"),
    ("limits.token_budget", "token_budget"), ("limits.cost_budget_usd", "cost_budget_usd"),
)


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
