"""Agent configuration: pydantic models and TOML loading.

Every model forbids unknown keys, so a typo is an error that names the key and its section.
TOML uses the seed's layout: ``[env.agent]`` holds ``AgentConfig``; its sub-tables are
``[env.agent.client]``, ``[env.agent.sampling]``, ``[env.agent.harness]``,
``[env.agent.runtime]``, ``[env.agent.timeouts]`` and ``[env.agent.scoring]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from prefect_rollouts.bounds import (
    MAX_CPUS,
    MAX_DEADLINE_S,
    MAX_MEMORY_MB,
    MAX_PIDS,
    MAX_RETRIES,
    MAX_STORAGE_MB,
    MIN_CPUS,
)
from prefect_rollouts.config.base import (
    ClientConfig,
    ConfigModel,
    EnvTable,
    RetryConfig,
    SamplingConfig,
)
from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.config.judge import AnyJudgeConfig
from prefect_rollouts.config.network import NetworkPolicy, compose
from prefect_rollouts.config.sources import config_dir, read_toml, validate_config
from prefect_rollouts.errors import ConfigError


class RuntimeConfig(ConfigModel):
    """Where the agent's tools and the task's commands run (``[env.agent.runtime]``)."""

    type: Literal["local", "docker"] = "local"
    """``local``: a fresh temporary directory and subprocesses on this machine (no isolation
    beyond files). ``docker``: a fresh container per rollout."""
    network: NetworkPolicy = NetworkPolicy()
    """Network policy while the agent runs (and while scoring, unless ``scoring.network`` says
    otherwise): ``"open"``, ``"none"`` (loopback only) or ``{ allow = [...], block = [...] }``
    (docker only; docs/network.md, ``config/network.py``)."""
    exec_timeout_s: float = Field(120.0, gt=0, le=MAX_DEADLINE_S)
    """Default timeout of one command (``runtime.exec`` and the ``bash`` tool), in seconds."""
    output_cap_bytes: int = Field(64 * 1024, ge=1024)
    """stdout and stderr of a command are each cut to this many bytes."""
    artifact_max_bytes: int = Field(32 * 1024 * 1024, ge=1)
    """Cap of the collected artifacts archive (verifiers' 32 MiB default)."""
    env: EnvTable = {}
    """Environment variables set for commands (local: over a minimal PATH/HOME/LANG base); values may
    use ``${VAR}`` and ``${VAR:-default}``, resolved where the runtime starts. Literal values count
    as secrets: ``"***"`` in every JSON dump (``config.base.EnvTable``)."""
    image: str = "prefect-rollouts-sandbox:latest"
    """docker: the container image (build the default with ``prefect-rollouts sandbox build``)."""
    workdir: str = "/workspace"
    """docker: the workspace directory in the container (absolute)."""
    cpus: float = Field(1.0, ge=MIN_CPUS, le=MAX_CPUS)
    """docker: CPU limit, in CPUs (at least Docker's 0.01, at most 1024: ``bounds.MIN_CPUS``, ``bounds.MAX_CPUS``)."""
    memory_mb: int = Field(2048, ge=16, le=MAX_MEMORY_MB)
    """docker: memory limit, in MiB (at most 1 TiB: ``bounds.MAX_MEMORY_MB``)."""
    pids_limit: int = Field(512, ge=16, le=MAX_PIDS)
    """docker: most processes the container may hold (at most Linux's 4,194,304: ``bounds.MAX_PIDS``)."""
    storage_mb: int = Field(1024, ge=0, le=MAX_STORAGE_MB)
    """docker: disk quota of the container, in MiB (at most 1 TiB: ``bounds.MAX_STORAGE_MB``); 0 = none (it
    can fill the Docker engine's disk). The container's root is writable everywhere either way.
    Where the storage driver can cap a container (overlay2 on xfs with ``pquota``, btrfs, zfs,
    devicemapper) a write past it fails with "No space left on device". Elsewhere (overlay2 on ext4)
    a watch measures the container's writable layer every 0.1 to 5 s and, past the quota, kills its
    processes (a write at 2 GB/s gets up to ``docker_quota.OVERSHOOT_MB``, 500 MB, further in a layer
    of a few thousand files). Each ``VOLUME`` path of the image is a tmpfs of this size, counted
    against ``memory_mb``. A rollout that filled it ends as the agent's failure: stop condition
    ``storage_quota``, reward 0. ``runtimes/docker/storage.py``, ``runtimes/docker/quota.py`` and
    ``runtimes/docker/volumes.py`` have the details."""
    docker_network: str = "bridge"
    """docker: the Docker network joined under ``network = "open"``."""
    user: str | None = None
    """docker: the user the rollout's commands run as (a name or UID known in the image, ``uid:gid`` too);
    None: the image's ``USER`` (root when it sets none). A Harbor task's ``[agent] user`` sets it."""
    capabilities: Literal["none", "docker-default"] = "none"
    """docker: the Linux capabilities of the container's processes. ``none``: every one dropped (root can
    neither ``chown`` another's file nor ``setgroups``, so ``apt-get`` as root fails). ``docker-default``:
    Docker's default set, as a Harbor box has it (a Harbor task sets it), but ``MKNOD``: the tests of a
    Harbor task run with the whole default set, which the kernel's ptrace check then keeps out of the
    agent's reach (``runtimes/docker/private.py``). ``no-new-privileges`` either way."""
    writable: list[str] = []
    """docker: absolute paths the container must be able to write besides the workspace. The
    container's root is writable everywhere (``storage_mb``), so this changes nothing today; a Harbor
    task names ``/logs``, ``/tests`` and ``/solution``."""

    @model_validator(mode="after")
    def _absolute_workdir(self) -> RuntimeConfig:
        if not self.workdir.startswith("/"):
            raise ValueError(f"workdir = {self.workdir!r}: must be an absolute path in the container, e.g. /workspace")
        if bad := [path for path in self.writable if not path.startswith("/") or path.rstrip("/") == ""]:
            raise ValueError(f"writable = {bad!r}: each must be an absolute path in the container other than /")
        if self.type == "local" and self.network.mode == "rules":
            raise ValueError(local_rules_error("network"))
        if self.type == "local" and self.user:
            raise ValueError(f'user = {self.user!r}: the local runtime runs commands as this process\'s user. Set '
                             'type = "docker", or remove user')
        return self


def local_rules_error(key: str) -> str:
    """Why the local runtime refuses allow/block rules under ``key``, and the fix."""
    return (f'{key} = {{ allow/block rules }}: the local runtime cannot enforce host rules (its commands use this '
            'machine\'s network). Set [env.agent.runtime] type = "docker", or network = "open" or "none"')


class TimeoutConfig(ConfigModel):
    """Stage deadlines in seconds; None = no deadline. An expired one stops the run as ``<stage>_timeout``.
    Each is at most a week (``bounds.MAX_DEADLINE_S``)."""

    setup: float | None = Field(None, gt=0, le=MAX_DEADLINE_S)
    """Setup: ``Task.prepare``, starting the runtime, writing ``TaskData.files``, ``Task.setup`` and
    opening the harness (a program harness's ``files`` and ``setup`` commands); expiry: ``setup_timeout``."""
    agent: float | None = Field(None, gt=0, le=MAX_DEADLINE_S)
    """Budget of all harness segments together; time waiting on an interaction's caller is not counted."""
    finalize: float | None = Field(None, gt=0, le=MAX_DEADLINE_S)
    """``Task.finalize`` (e.g. writing the answer into the workspace); expiry: ``finalize_timeout``."""
    scoring: float | None = Field(None, gt=0, le=MAX_DEADLINE_S)
    """Scoring: the task's metrics and rewards and the judges, shared or isolated (every isolated attempt
    together); expiry: ``scoring_timeout``."""


class ScoringConfig(ConfigModel):
    """Where and how task scoring runs.

    ``TaskData.scoring`` gives a task's defaults; every field explicitly set on
    ``AgentConfig.scoring`` overrides them (``effective_scoring``); ``mode`` falls back to shared.
    """

    mode: Literal["shared", "isolated"] | None = None
    """``shared``: score in the agent's workspace. ``isolated``: restore artifacts into a fresh runtime."""
    runtime: RuntimeConfig | None = None
    """Runtime of isolated scoring; None = the agent's runtime config."""
    env: EnvTable = {}
    """Environment of scoring commands; values may use ``${VAR}`` and ``${VAR:-default}``, resolved
    when scoring starts. Literal values count as secrets, as in ``RuntimeConfig.env``."""
    network: NetworkPolicy | None = None
    """Network policy while scoring runs; None = the runtime's."""
    retries: RetryConfig = RetryConfig(max_retries=2)
    """Retries of isolated scoring on retryable errors, each with a fresh runtime. Shared is never retried."""
    skip_on_truncated: bool = False
    """Skip task scoring (reward 0) when ``trace.is_truncated``."""
    skip_on_timeout: bool = False
    """Skip task scoring (reward 0) when ``trace.is_timeout``."""
    judges: list[AnyJudgeConfig] = []
    """Judges run after the task's metrics and rewards, each recorded as a reward."""

    @model_validator(mode="after")
    def _unique_judges(self) -> ScoringConfig:
        names = [judge.reward_name for judge in self.judges]
        if len(set(names)) != len(names):
            raise ValueError(f"judges: reward names {names} clash; give each judge its own name")
        return self


class StageRetryConfig(ConfigModel):
    """Stage retries, the ``[env.agent.retries]`` table (the model client retries each request first).

    A retried segment resumes where its failed model call left it (tool results already
    produced stay: their side effects happened); a retried setup starts a fresh runtime. Shared
    scoring is never retried; isolated scoring uses ``scoring.retries``. Waits double from
    ``backoff_s`` (capped at 30 s), jittered, on the inline path and under Prefect alike.
    """

    setup: int = Field(1, ge=0, le=MAX_RETRIES)
    """Retries of setup when the runtime fails to start."""
    segment: int = Field(1, ge=0, le=MAX_RETRIES)
    """Retries of a harness segment after a ``ProviderError`` (on top of ``client.retries``)."""
    backoff_s: float = Field(1.0, ge=0, le=MAX_DEADLINE_S)
    """Wait before a stage retry, in seconds (doubled each time, jittered)."""


class AgentConfig(ConfigModel):
    """A harness driving a model inside a runtime; the ``[env.agent]`` table."""

    model: str = "local/smollm2"
    """Model name sent in each request. ``local/smollm2`` (the default, so the seed's TOML
    fragment runs as written) or ``local/PATH.gguf`` start an embedded llama.cpp server (needs
    the ``local`` extra); any other name is sent to ``client.base_url``."""
    client: ClientConfig = ClientConfig()
    sampling: SamplingConfig = SamplingConfig()
    harness: HarnessConfig = HarnessConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    max_turns: int | None = Field(None, ge=1)
    """Cap on sampled model responses per rollout; hitting it stops the run as ``max_turns``."""
    max_turn_tokens: int | None = Field(None, ge=1)
    """Token cap of each response; a response that hits it stops the run as ``max_turn_tokens``."""
    max_rollout_tokens: int | None = Field(None, ge=1)
    """Token cap of the whole rollout (prompt and completion tokens of all its model calls, over all its
    turns; judges not counted): once a response brings the rollout's tokens to it, the run stops before
    the next model call as ``max_rollout_tokens`` (truncated). It may pass the cap by one call's tokens."""
    timeouts: TimeoutConfig = TimeoutConfig()
    retries: StageRetryConfig = StageRetryConfig()
    scoring: ScoringConfig = Field(default_factory=lambda: ScoringConfig())
    orchestrator: Literal["prefect", "inline"] = "prefect"
    """``prefect``: each rollout is a Prefect flow run with one task run per stage.
    ``inline``: the same stages as plain asyncio calls (tests, RL loops, benchmarks)."""

    @model_validator(mode="after")
    def _files_fit_the_runtime(self) -> AgentConfig:
        if self.runtime.type == "local":
            outside = [target for target in self.harness.files if target.startswith("/")]
            if outside:
                raise ValueError(f"[env.agent.harness] files {outside}: the local runtime has no filesystem of its "
                                 "own, so runtime paths are relative to the workspace (e.g. \".agent/my-agent\"); "
                                 'or use [env.agent.runtime] type = "docker"')
        scoring_runtime = self.scoring.runtime or self.runtime
        if scoring_runtime.type == "local" and self.scoring.network is not None and \
                self.scoring.network.mode == "rules":
            raise ValueError(local_rules_error("[env.agent.scoring] network"))
        return self


def effective_scoring(agent: ScoringConfig, task: ScoringConfig | None) -> ScoringConfig:
    """Merge scoring configs: the task's defaults, then every field explicitly set on the agent's.

    ``env`` merges key by key (agent keys win); every other field is replaced whole. A mode
    set by neither falls back to ``"shared"``. Returns a new ``ScoringConfig`` with ``mode`` set.
    """
    if task is None:  # the common case: no copy through validation (it deep-copies defaults)
        return agent if agent.mode is not None else agent.model_copy(update={"mode": "shared"})
    merged = task.model_dump(exclude_unset=True)
    for name in agent.model_fields_set:
        value = getattr(agent, name)
        if name == "env":
            merged["env"] = {**merged.get("env", {}), **value}
        else:
            merged[name] = value
    merged.setdefault("mode", None)
    if merged["mode"] is None:
        merged["mode"] = "shared"
    return ScoringConfig.model_validate(merged)


def load_config(source: str | Path, *, section: str = "env.agent") -> AgentConfig:
    """Load an ``AgentConfig`` from a TOML file (or TOML text) at ``section`` (default ``env.agent``).

    Raises:
        ConfigError: the file is missing or not TOML, the section is absent, or a key is unknown
            or invalid; the message names the key with its ``[section]`` and the fix.
    """
    data = read_toml(source)
    table: Any = data
    for part in section.split("."):
        if not isinstance(table, dict) or part not in table:
            raise ConfigError(f"[{section}]: table not found in the config. "
                              f"Add a [{section}] table (model defaults to \"local/smollm2\")")
        table = table[part]
    return validate_config(AgentConfig, table, section, config_dir(source))


def with_task_network(config: AgentConfig, task_network: NetworkPolicy | None, task_id: str) -> AgentConfig:
    """``config`` with its ``runtime.network`` composed with a task's ``TaskData.network``
    (``config.network.compose``), as ``effective_scoring`` merges the task's scoring.

    Raises:
        ConfigError: the composed policy has rules and the runtime is local.
    """
    network = compose(config.runtime.network, task_network)
    if network == config.runtime.network:
        return config
    if network.mode == "rules" and config.runtime.type == "local":
        raise ConfigError(f"task {task_id!r}: TaskData.network {local_rules_error('network')}")
    return config.model_copy(update={"runtime": config.runtime.model_copy(update={"network": network})})
