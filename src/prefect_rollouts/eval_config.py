"""The eval config: a taskset, an agent, how many rollouts, where traces go. Loaded from TOML.

```toml
run_name = "nightly"          # optional
num_tasks = 50                # optional: all when absent
rollouts_per_task = 1
max_concurrent = 16

[traces]
path = "./traces"             # or store = "<TraceStore block name>"

[env.taskset]
id = "arithmetic"             # a built-in name, or "pkg.module:function"
count = 200                   # taskset options

[env.agent]                   # AgentConfig
model = "some/model"
```
"""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefect_rollouts.config import AgentConfig, _Config, _read_toml, config_dir, validate_config
from prefect_rollouts.errors import ConfigError


class TasksetConfig(BaseModel):
    """``[env.taskset]``: ``id`` plus the taskset's own options (any other keys)."""

    model_config = ConfigDict(extra="allow")

    id: str
    """A built-in taskset name, or ``pkg.module:function`` returning tasks."""

    @property
    def options(self) -> dict[str, Any]:
        """The keys other than ``id``, passed to the taskset's loader."""
        return dict(self.model_extra or {})


class EnvConfig(_Config):
    """``[env]``: the taskset and the agent."""

    taskset: TasksetConfig
    agent: AgentConfig


class TracesConfig(_Config):
    """``[traces]``: where the Parquet dataset goes: a local ``path`` or a ``TraceStore`` block."""

    path: str | None = "./traces"
    store: str | None = None
    """Name of a ``TraceStore`` block; wins over ``path``."""

    def check_writable(self) -> None:
        """Make sure files can be written under ``path`` (creating it), so a bad path is a config
        error before anything starts. A ``store`` block is checked where it is resolved.

        Raises:
            ConfigError: ``path`` is a file, sits under a file, or is a directory that cannot be
                created or written; the message names ``[traces] path`` and the cause.
        """
        if self.store or self.path is None:
            return
        root = Path(self.path)
        fix = 'Choose a writable directory, or set [traces] store = "<TraceStore block name>"'
        if root.exists() and not root.is_dir():
            raise ConfigError(f"[traces] path = {self.path!r}: is a file, not a directory. {fix}")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"[traces] path = {self.path!r}: cannot create it ({exc.strerror or exc}). "
                              f"{fix}") from None
        try:
            with tempfile.TemporaryFile(dir=root, prefix=".write-check-"):
                pass
        except OSError as exc:
            raise ConfigError(f"[traces] path = {self.path!r}: cannot write files in it ({exc.strerror or exc}). "
                              f"{fix}") from None


class EvalConfig(_Config):
    """A whole evaluation: ``num_tasks`` tasks x ``rollouts_per_task`` rollouts of one agent."""

    run_name: str | None = None
    """Prefix of the run id; default: the taskset id."""
    num_tasks: int | None = Field(None, ge=1)
    """How many tasks from the start of the taskset; None = all."""
    rollouts_per_task: int = Field(1, ge=1)
    """Rollouts of each task (pass@k is reported for every k up to this)."""
    max_concurrent: int = Field(16, ge=1)
    """Rollouts in flight at once."""
    rollout_granularity: Literal["flow", "task", "batch"] = "flow"
    """``flow``: a flow run per rollout, a task run per stage (most visible). ``task``: a task run
    per rollout. ``batch``: a task run per shard of ``batch_size`` rollouts (fastest). In an eval
    this is the one setting of how rollouts run; ``[env.agent] orchestrator`` applies to
    ``Agent.run`` and interactions only, and ``"inline"`` there is refused (see the validator)."""
    batch_size: int = Field(50, ge=1)
    """Rollouts per shard with ``rollout_granularity = "batch"``."""
    pass_threshold: float = 1.0
    """A rollout passes (for pass@k) when its reward is at least this."""
    max_error_fraction: float = Field(0.0, ge=0.0, le=1.0)
    """Share of rollouts (0 to 1) that may end in an error (``provider_error``, ``setup_error``,
    a scoring error, ...) while the run still counts as a success: above it the eval flow run
    ends Failed and ``prefect-rollouts eval`` exits 1. Default 0: one errored rollout fails the
    run. Rollouts scored 0, truncated or skipped are not errors."""
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
    traces: TracesConfig = TracesConfig()
    env: EnvConfig

    @model_validator(mode="after")
    def _one_orchestration_setting(self) -> EvalConfig:
        if self.env.agent.orchestrator != "prefect":
            raise ValueError(f'[env.agent] orchestrator = "{self.env.agent.orchestrator}": an eval always runs as a '
                             "Prefect flow, and rollout_granularity alone decides how each rollout runs (flow, "
                             "task, or batch: inline stages inside a shard's task run). Remove the key, and set "
                             'rollout_granularity = "batch" for the cheapest orchestration')
        return self


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
    data = _read_toml(source)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected dotted.key=value, e.g. --set env.agent.max_turns=4")
        _assign(data, key.strip().split("."), _parse_value(raw.strip()))
    return validate_config(EvalConfig, data, "", config_dir(source))


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def _assign(data: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        node = data.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {part!r} is a value, not a table")
        data = node
    data[path[-1]] = value
