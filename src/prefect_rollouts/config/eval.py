"""The eval config: a taskset, an agent, how many rollouts, where traces go. Loaded from TOML.

```toml
run_name = "nightly"          # optional: default <environment>-<harness>-<model> (EvalConfig.run_prefix)
num_tasks = 50                # optional: all when absent
rollouts_per_task = 1
max_concurrent = 16

[traces]
path = "./traces"             # or "s3://bucket/prefix", or store = "<TraceStore block name>"

[limits]                      # optional: Prefect global concurrency limits (LimitsConfig)
model_requests = 8            # requests in flight per model endpoint, all workers together
containers = 16               # containers alive at once per Docker host

[env.taskset]
id = "arithmetic"             # a built-in name, or "pkg.module:function"
count = 200                   # taskset options

[env.agent]                   # AgentConfig
model = "some/model"
```
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from prefect_rollouts.bounds import (
    MAX_BATCH,
    MAX_CONCURRENT,
    MAX_DEADLINE_S,
    MAX_RETRIES,
    MAX_ROLLOUTS_PER_TASK,
    MAX_TASKS,
)
from prefect_rollouts.config.agent import AgentConfig
from prefect_rollouts.config.base import ClientConfig, ConfigModel
from prefect_rollouts.config.env import resolve_env
from prefect_rollouts.config.eval_tables import DispatchConfig, LimitsConfig, TracesConfig
from prefect_rollouts.config.sources import set_source, toml_source, validate_sources
from prefect_rollouts.config.taskset import (
    NAME_MAX_BYTES,
    EnvironmentSpec,
    SuiteTasksetConfig,
    TasksetConfig,
    merged_agent,
    path_safe,
)
from prefect_rollouts.keys import slug
from prefect_rollouts.retry_rule import check_error_types

if TYPE_CHECKING:
    pass


class EnvConfig(ConfigModel):
    """``[env]``: the taskset (``[env.taskset]``) or a suite of them (``[[env.tasksets]]``), and the agent."""

    taskset: TasksetConfig | None = None
    """The one taskset of the eval; its environment is named after its id."""
    tasksets: list[SuiteTasksetConfig] | None = None
    """A suite: several tasksets in one run, each its own environment (``SuiteTasksetConfig``)."""
    agent: AgentConfig

    @model_validator(mode="after")
    def _one_way_to_name_tasksets(self) -> EnvConfig:
        if (self.taskset is None) == (self.tasksets is None):
            raise ValueError("give exactly one of [env.taskset] (one taskset) and [[env.tasksets]] (a suite); "
                             + ("both are set" if self.taskset is not None else "neither is set"))
        if self.tasksets is not None:
            if not self.tasksets:
                raise ValueError("[[env.tasksets]] is empty: list at least one taskset, or use [env.taskset]")
            names = [entry.environment for entry in self.tasksets]
            twice = sorted({name for name in names if names.count(name) > 1})
            if twice:
                raise ValueError(f"[[env.tasksets]] name: {', '.join(twice)} names two environments. Give each entry "
                                 'of the same taskset its own name = "..."')
        return self


class EvalConfig(ConfigModel):
    """A whole evaluation: ``num_tasks`` tasks x ``rollouts_per_task`` rollouts of one agent."""

    run_name: str | None = None
    """Prefix of the run id (and the series' name outside a deployment); default: the run id's
    prefix is made from the config's own parts (``run_prefix``: environment, harness, model), the
    series is the taskset id (``default_name``)."""
    num_tasks: int | None = Field(None, ge=1, le=MAX_TASKS)
    """How many tasks from the start of the taskset; None = all. At most 100,000
    (``bounds.MAX_TASKS``: tasks are held in memory for the whole eval), also for all of a taskset."""
    rollouts_per_task: int = Field(1, ge=1, le=MAX_ROLLOUTS_PER_TASK)
    """Rollouts of each task (pass@k is reported for every k up to this). At most 1,000
    (``bounds.MAX_ROLLOUTS_PER_TASK``), and an eval's rollouts in all at most 1,000,000
    (``bounds.MAX_ROLLOUTS``)."""
    max_concurrent: int = Field(16, ge=1, le=MAX_CONCURRENT)
    """Rollouts in flight at once (with ``[dispatch] work_pool``: in each shard flow run). At most
    1,000 (``bounds.MAX_CONCURRENT``: each holds open files and, with docker, a thread and a container)."""
    rollout_granularity: Literal["flow", "task", "batch"] = "flow"
    """``flow``: a flow run per rollout, a task run per stage (most visible). ``task``: a task run
    per rollout. ``batch``: a task run per shard of ``batch_size`` rollouts (fastest). In an eval
    this is the one setting of how rollouts run; ``[env.agent] orchestrator`` applies to
    ``Agent.run`` and interactions only, and ``"inline"`` there is refused (see the validator)."""
    batch_size: int = Field(50, ge=1, le=MAX_BATCH)
    """Rollouts per shard with ``rollout_granularity = "batch"``. At most 10,000 (``bounds.MAX_BATCH``)."""
    pass_threshold: float = 1.0
    """A rollout passes (for pass@k) when its reward is at least this."""
    max_error_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Share of rollouts (0 to 1) that may end in an error (``provider_error``, ``setup_error``,
    a scoring error, ...) while the run still counts as a success: above it the eval flow run
    ends Failed and ``prefect-rollouts eval`` exits 1. Default 0: one errored rollout fails the
    run. Rollouts scored 0, truncated or skipped are not errors."""
    baseline: str | None = None
    """Run to compare with when the eval ends (``flows/services/baseline.py``): ``"last"``, the last Completed
    run of the same series (deployment, else ``run_name``, else taskset id), kept in a Prefect
    Variable that each Completed run updates; or a run id of the same trace dataset. The comparison
    is published as an artifact, and an environment whose 95% interval lies below zero emits the
    event ``prefect-rollouts.eval.regressed`` (above: ``...improved``). None: no comparison."""
    flush_each_rollout: bool = False
    """Make each rollout's row durable as soon as it finishes, not in batches of up to
    ``max_concurrent`` (at most 64) rollouts every 2 s. Then a kill loses only the rollouts in
    flight (or in the milliseconds of its own write), so ``--resume`` does not run a finished rollout,
    and a reward with side effects, again. Measured without it: every rollout that finished in the
    last 2 s before a ``kill -9`` ran and was scored again (tests/prefect/test_flush_each.py).
    Always on when ``rollouts_per_task > 1`` or a task sets ``Task.rewards_have_side_effects``."""
    api_outage_limit_s: float = Field(600.0, gt=0)
    """How long (seconds) rollouts keep running while the Prefect API is unreachable; past it the
    eval stops, keeping its durable rows, and prints the ``--resume`` command."""
    token_budget: int | None = Field(None, ge=1)
    """Tokens the whole run may spend: prompt and completion tokens of every model call of every attempt,
    judges included, across every shard and worker (``docs/budgets.md``). Once reached, no new rollout
    starts and rollouts in flight stop at their next model call as ``budget`` (not scored, not done: a
    ``--resume`` runs them again); the eval ends ``BudgetReached`` and the CLI exits 4. The run may pass it
    by at most the calls in flight when it was reached (and the judge calls of rollouts being scored). A
    resume may raise it. None: no budget."""
    cost_budget_usd: float | None = Field(None, gt=0)
    """USD the whole run may spend, as ``token_budget`` but priced with each client's ``price`` (the
    agent's ``[env.agent.client] price``, a judge's own client's). Every client the run uses needs a price."""
    max_rollout_attempts: int = Field(1, ge=1, le=MAX_RETRIES)
    """Attempts of one rollout in all (the row column ``attempt`` numbers them): an attempt that ends in an
    error the retry rule takes (``retry_error_types``) runs again, after ``rollout_backoff_s``, as a new
    attempt with a row of its own; the summary reads each rollout's latest. Default 1: no retry; at most 100
    (``bounds.MAX_RETRIES``). A resume runs the retries a stopped eval had left. See docs/retries.md."""
    retry_error_types: list[str] | None = None
    """Error types (the row's ``error_type``, e.g. ``["ProviderError"]``) whose attempts run again; None:
    the default rule (``retry_rule.RETRY_ERROR_TYPES``: provider, runtime and infrastructure errors). A
    rollout the agent itself failed is never retried. ``[]`` is refused (set ``max_rollout_attempts = 1`` for
    no retry). ``--retry-errors TYPE,...`` sets it."""
    rollout_backoff_s: float = Field(10.0, ge=0, le=MAX_DEADLINE_S)
    """Wait before an errored rollout's next attempt, seconds, doubled for each further one, capped at
    300 s and jittered by ±50% (``retry_rule.backoff_s``); its concurrency slot is free meanwhile."""
    traces: TracesConfig = TracesConfig()
    dispatch: DispatchConfig = DispatchConfig()
    limits: LimitsConfig = LimitsConfig()
    env: EnvConfig

    def environments(self) -> list[EnvironmentSpec]:
        """The eval's environments in config order: ``[env.taskset]`` alone (named after its id, with
        ``num_tasks``), or each ``[[env.tasksets]]`` entry (its ``num_tasks``, else the top-level one)."""
        agent = self.env.agent
        if self.env.tasksets is None:
            assert self.env.taskset is not None   # the validator makes sure
            return [EnvironmentSpec(self.env.taskset.id, self.env.taskset.id, self.env.taskset.options,
                                    self.num_tasks, agent)]
        return [EnvironmentSpec(entry.environment, entry.id, entry.options, entry.num_tasks or self.num_tasks,
                                merged_agent(agent, entry.agent, f"env.tasksets[{i}].agent"))
                for i, entry in enumerate(self.env.tasksets)]

    def check_env(self, host: Mapping[str, str] | None = None) -> None:
        """Resolve every env table of each environment's agent (``runtime.env``, ``scoring.env``,
        ``scoring.runtime.env``) from ``host`` (default ``os.environ``), as the runtimes and scoring
        will, so that an unset ``${VAR}`` is a config error before anything starts. For an eval
        that runs here; a work pool's workers resolve them in their own environment.

        Raises:
            ScoringEnvError: a ``${VAR}`` without default is unset; the message names the key.
        """
        for spec in self.environments():
            scoring = spec.agent.scoring
            resolve_env(spec.agent.runtime.env, host, table="[env.agent.runtime] env", place="where the runtime starts")
            resolve_env(scoring.env, host)
            if scoring.runtime is not None:
                resolve_env(scoring.runtime.env, host, table="[env.agent.scoring.runtime] env",
                            place="where the runtime starts")

    @property
    def default_name(self) -> str:
        """``run_name``, else the taskset id, else the suite's environment names joined by ``+``
        (the series' name outside a deployment: runs of other harnesses or models are compared with it)."""
        return self.run_name or "+".join(env.name for env in self.environments())

    @property
    def run_prefix(self) -> str:
        """The run id's prefix: ``run_name``, else ``<environments>-<harnesses>[-<models>]`` from
        the config's own parts, so runs of two harnesses or models are told apart by their ids.

        The parts: the environment names joined by ``+`` (the taskset id alone), then the distinct
        harness ids of the environments and, unless no environment's harness calls a model
        (``oracle``, ``nop``), their distinct models, each joined by ``+`` and made lowercase ASCII
        letters, digits and dashes by ``keys.slug`` (the sanitiser of Prefect keys too). Cut to
        ``NAME_MAX_BYTES``. E.g. ``harbor-mini-swe-agent-local-smollm2``, ``harbor-oracle``,
        ``arithmetic-tools-my-model``.
        """
        if self.run_name:
            return self.run_name
        envs = self.environments()
        parts = ["+".join(env.name for env in envs),
                 "+".join(dict.fromkeys(slug(env.agent.harness.id) for env in envs))]
        models = "+".join(dict.fromkeys(slug(env.agent.model) for env in envs if env.agent.harness.uses_model))
        name = "-".join([*parts, *([models] if models else [])])
        return name.encode("utf-8", "surrogatepass")[:NAME_MAX_BYTES].decode("utf-8", "ignore")

    @field_validator("run_name")
    @classmethod
    def _run_name_in_paths(cls, value: str | None) -> str | None:
        if value is not None and not path_safe(value):
            raise ValueError("the run id's prefix names a directory of the dataset (run_id=<id>): no /, \\ or =, "
                             f"no control character, not empty, at most {NAME_MAX_BYTES} bytes (UTF-8). Choose "
                             "another name")
        return value

    @field_validator("retry_error_types")
    @classmethod
    def _known_error_types(cls, value: list[str] | None) -> list[str] | None:
        if value == []:
            raise ValueError("names no error type. Remove the key for the default rule (provider, runtime and "
                             "infrastructure errors), or set max_rollout_attempts = 1 for no retry")
        return None if value is None else check_error_types(value)

    @field_validator("baseline")
    @classmethod
    def _baseline_named(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError('baseline = "": name a run id, or "last" for the last completed run of the series; '
                             "remove the key for no comparison")
        return value

    @model_validator(mode="after")
    def _default_name_fits(self) -> EvalConfig:
        if self.run_name is None and not path_safe(self.default_name):   # then run_prefix is path-safe too
            raise ValueError(f"run_name: the run id's prefix defaults to {self.default_name!r} (the taskset id, or "
                             "a suite's environment names joined by +), which cannot name the run_id=<id> directory "
                             f"(no /, \\ or =, no control character, at most {NAME_MAX_BYTES} bytes). Set run_name")
        return self

    @model_validator(mode="after")
    def _suite_agents(self) -> EvalConfig:
        self.environments()   # a suite entry's agent keys are checked now, not when the eval runs
        return self

    @model_validator(mode="after")
    def _priced_for_cost_budget(self) -> EvalConfig:
        if self.cost_budget_usd is None:
            return self
        for where, client in priced_clients(self):
            if client.price is None:
                raise ValueError(f"cost_budget_usd = {self.cost_budget_usd:g}: {where} has no price, so the cost of "
                                 f"its calls is unknown. Set {where} price = {{ input = ..., output = ... }} (USD per "
                                 "million tokens), or use token_budget instead")
        return self

    @model_validator(mode="after")
    def _one_orchestration_setting(self) -> EvalConfig:
        if self.env.agent.orchestrator != "prefect":
            raise ValueError(f'[env.agent] orchestrator = "{self.env.agent.orchestrator}": an eval always runs as a '
                             "Prefect flow, and rollout_granularity alone decides how each rollout runs (flow, "
                             "task, or batch: inline stages inside a shard's task run). Remove the key, and set "
                             'rollout_granularity = "batch" for the cheapest orchestration')
        return self


def priced_clients(config: EvalConfig) -> list[tuple[str, ClientConfig]]:
    """Every client an eval's calls go through, with the TOML table that configures it: each
    environment's agent client (unless its harness calls no model: ``oracle``, ``nop``) and each judge's
    client (its own ``client``, else the agent's, which then bills its calls)."""
    found: dict[str, ClientConfig] = {}
    for env in config.environments():   # a suite's entries may not change the client (SuiteTasksetConfig)
        if env.agent.harness.uses_model:
            found.setdefault("[env.agent.client]", env.agent.client)
        for j, judge in enumerate(env.agent.scoring.judges):
            if judge.client is not None:
                found.setdefault(f"[env.agent.scoring.judges.{j}.client]", judge.client)
            else:
                found.setdefault(f"[env.agent.client] (judge {judge.reward_name!r} uses it)", env.agent.client)
    return list(found.items())


def load_eval_config(source: str | Path, overrides: list[str] | None = None) -> EvalConfig:
    """Load an ``EvalConfig`` from a TOML file or text, then apply ``--set`` overrides.

    Args:
        source: Path of a ``.toml`` file, or TOML text.
        overrides: ``dotted.key=value`` strings; the value is parsed as a TOML value
            (``3``, ``true``, ``"x"``, ``[1, 2]``) and taken as a plain string otherwise.

    Raises:
        ConfigError: unreadable TOML, a malformed override, or an invalid or unknown key (the
            message names the key and its table).
    """
    return validate_sources(EvalConfig, [toml_source(source), set_source(overrides or [])])
