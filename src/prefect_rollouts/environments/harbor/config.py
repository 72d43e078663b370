"""A Harbor task's ``task.toml``, read with Harbor's schema (task config ``schema_version`` 1.4, as in Harbor
0.26; its ``harbor/models/task/config.py`` is 0.25's with one comment added).

The fields and defaults are Harbor's own, and values are coerced the way Harbor's pydantic models coerce
them (``"600"`` is a float there too), so a task that Harbor loads loads here
(``tests/environments/test_harbor_schema.py`` checks the shipped tasks against Harbor's own ``TaskConfig``).
Nonsense is refused naming the key: ``cpus = 0``, NaN or infinity, and values past what a box or a deadline
can hold (``bounds``: deadlines at most a week, ``memory_mb`` and ``storage_mb`` at most 1 TiB, ``cpus`` at
most 1024; ``timeout_sec = 1e308`` ended in an ``OverflowError``, ``memory_mb = 2**62`` in an error of the
Docker engine's). ``cpus``, ``memory_mb`` and ``storage_mb`` left unset are the agent's runtime config's
(Harbor's Docker environment sets no limit then). Keys Harbor may add later are accepted with one warning
per key (``read_task_toml``; Harbor ignores them silently). What this system cannot run is refused with an
error naming the task, the key and the fix (``refuse_unsupported``: GPUs and TPUs, Windows boxes, MCP
servers, skills, multi-step tasks, a separate verifier image, compose collect hooks and artifacts of compose
services; ``allowed_hosts`` without ``allowlist`` or with a malformed host). ``[agent] user`` and
``[verifier] user`` are run as that user (``harbor.HarborTask``). Must not import Prefect.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prefect_rollouts.bounds import MAX_CPUS, MAX_DEADLINE_S, MAX_MEMORY_MB, MAX_STORAGE_MB, MIN_CPUS
from prefect_rollouts.config.network import parse_rule
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.nesting import toml_loads

log = logging.getLogger("prefect_rollouts.harbor")
_warned: set[str] = set()

NetworkMode = Literal["public", "no-network", "allowlist"]

MAX_HEALTHCHECK_RETRIES = 1000
"""``[environment.healthcheck] retries``: each is a command in the box and a wait of ``interval_sec``."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class AgentSection(_Section):
    """``[agent]``: the agent phase."""

    timeout_sec: float | None = Field(None, gt=0, le=MAX_DEADLINE_S)
    """The agent deadline in seconds (None: none)."""
    user: str | int | None = None
    """The user (name or UID) the agent's commands run as; None: the image's ``USER`` (root when unset)."""
    network_mode: NetworkMode | None = None
    """Overrides ``[environment] network_mode`` while the agent runs."""
    allowed_hosts: list[str] | None = None
    """The hosts of this phase's ``allowlist``; only with this phase's own ``network_mode = "allowlist"``."""


class VerifierSection(_Section):
    """``[verifier]``: the tests (``tests/test.sh``)."""

    timeout_sec: float = Field(600.0, gt=0, le=MAX_DEADLINE_S)
    """The scoring deadline: ``test.sh`` is killed after this many seconds."""
    env: dict[str, str] = {}
    user: str | int | None = None
    """The user (name or UID) ``test.sh`` runs as; None: the image's ``USER`` (root when unset), not the agent's."""
    environment_mode: Literal["shared", "separate"] | None = None
    """``separate``: the tests run in a fresh container of the task's image with the agent's workdir restored.
    Unset: ``separate`` when ``[verifier.environment]`` is given, else ``shared`` (Harbor's rule)."""
    environment: dict[str, Any] | None = None
    """``[verifier.environment]``: another image for a separate verifier (refused here)."""
    collect: list[dict[str, Any]] = []
    """``[[verifier.collect]]``: commands run in compose services before artifacts are collected (refused)."""
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None

    @model_validator(mode="after")
    def _mode(self) -> VerifierSection:
        if self.environment_mode == "shared" and self.environment is not None:
            raise ValueError("environment_mode = 'shared' is incompatible with [verifier.environment]; omit the "
                             "environment or set environment_mode = 'separate'")
        if self.environment_mode is None:
            self.environment_mode = "separate" if self.environment is not None else "shared"
        return self


class HealthcheckSection(_Section):
    """``[environment.healthcheck]``: run until it passes before the agent starts (Docker's HEALTHCHECK)."""

    command: str
    interval_sec: float = Field(5.0, ge=0, le=MAX_DEADLINE_S)
    timeout_sec: float = Field(30.0, gt=0, le=MAX_DEADLINE_S)
    start_period_sec: float = Field(0.0, ge=0, le=MAX_DEADLINE_S)
    start_interval_sec: float = Field(5.0, ge=0, le=MAX_DEADLINE_S)
    retries: int = Field(3, ge=0, le=MAX_HEALTHCHECK_RETRIES)
    """Failures after the start period that fail the task (0 fails it at the first, as 1 does)."""


class EnvironmentSection(_Section):
    """``[environment]``: the box."""

    build_timeout_sec: float = Field(600.0, gt=0, le=MAX_DEADLINE_S)
    docker_image: str | None = None
    """A prebuilt image; without it the image is built from ``environment/``."""
    os: Literal["linux", "windows"] = "linux"
    """The box's operating system (any case); only ``linux`` runs here."""
    cpus: float | None = Field(None, ge=MIN_CPUS, le=MAX_CPUS)
    """CPUs of the box (Harbor takes fractions); None: the runtime config's ``cpus``."""
    memory_mb: int | None = Field(None, ge=16, le=MAX_MEMORY_MB)
    """None: the runtime config's ``memory_mb``."""
    storage_mb: int | None = Field(None, ge=0, le=MAX_STORAGE_MB)
    """None: the runtime config's ``storage_mb``."""
    gpus: int | None = Field(None, ge=0)
    gpu_types: list[str] | None = None
    tpu: dict[str, Any] | None = None
    allow_internet: bool | None = None
    """Deprecated by Harbor (``network_mode``): ``false`` is ``no-network`` when ``network_mode`` is unset."""
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    mcp_servers: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    skills_dir: str | None = None
    healthcheck: HealthcheckSection | None = None
    workdir: str | None = None
    """The agent's and the tests' working directory; default the image's ``WORKDIR``."""
    memory: str | None = None
    """Deprecated by Harbor (``memory_mb``): ``"2G"``, ``"512M"``."""
    storage: str | None = None
    """Deprecated by Harbor (``storage_mb``)."""

    @model_validator(mode="before")
    @classmethod
    def _os_case(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("os"), str):
            data = {**data, "os": data["os"].lower()}
        return data

    @model_validator(mode="after")
    def _deprecated_sizes(self) -> EnvironmentSection:
        for key in ("memory", "storage"):
            size = getattr(self, key)
            if size is None:
                continue
            megabytes, given = _megabytes(size, key), getattr(self, f"{key}_mb")
            if given is not None and given != megabytes:
                raise ValueError(f"{key} = {size!r} ({megabytes} MB) conflicts with {key}_mb = {given}; keep one")
            setattr(self, f"{key}_mb", megabytes)
        if self.memory_mb is not None and not 16 <= self.memory_mb <= MAX_MEMORY_MB:
            raise ValueError(f"memory = {self.memory!r}: must be 16 MiB to 1 TiB (bounds.MAX_MEMORY_MB)")
        if self.storage_mb is not None and self.storage_mb > MAX_STORAGE_MB:
            raise ValueError(f"storage = {self.storage!r}: must be at most 1 TiB (bounds.MAX_STORAGE_MB)")
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ValueError(f"workdir = {self.workdir!r}: must be an absolute path in the box, e.g. /app")
        return self

    def baseline_network(self) -> NetworkMode:
        """``network_mode``, else ``no-network`` when ``allow_internet = false``, else ``public``."""
        if self.network_mode is not None:
            return self.network_mode
        return "no-network" if self.allow_internet is False else "public"


class SolutionSection(_Section):
    """``[solution]``: the oracle's ``solve.sh``."""

    env: dict[str, str] = {}


class TaskToml(_Section):
    """A whole ``task.toml``. ``version`` is read as ``schema_version`` (Harbor renamed it)."""

    schema_version: str = "1.4"
    task: dict[str, Any] | None = None
    """``[task]``: the registry package (``name = "org/name"``, ...); kept, not used."""
    metadata: dict[str, Any] = {}
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    source: str | None = None
    steps: list[dict[str, Any]] | None = None
    """``[[steps]]``: a multi-step task (``steps/<name>/``), refused here."""
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    """How a multi-step task's reward is made; only with ``steps``."""
    artifacts: list[str | dict[str, Any]] = []
    """Paths Harbor collects from the box after the tests (for the record, and into a separate verifier's
    box); here ``/logs/artifacts`` is kept on the trace and a separate verifier gets the agent's workdir."""

    @model_validator(mode="before")
    @classmethod
    def _version_rename(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            data.setdefault("schema_version", str(data.pop("version")))
        return data

    def phase_network(self, phase: Literal["agent", "verifier"]) -> NetworkMode:
        """The network mode of ``phase``: its own ``network_mode``, else the environment's baseline."""
        section: AgentSection | VerifierSection = self.agent if phase == "agent" else self.verifier
        return section.network_mode or self.environment.baseline_network()

    def phase_hosts(self, phase: Literal["agent", "verifier"]) -> list[str]:
        """The ``allowed_hosts`` of ``phase`` under ``allowlist``: its own when it sets its own ``network_mode``
        (none given: none but the model endpoint), else the environment's (Harbor's ``explicit_phase_policy``)."""
        section: AgentSection | VerifierSection = self.agent if phase == "agent" else self.verifier
        hosts = section.allowed_hosts if section.network_mode is not None else self.environment.allowed_hosts
        return list(hosts or [])

    def unknown_keys(self) -> list[str]:
        """Dotted names of the keys this schema does not know (``environment.foo``), sorted."""
        found = [str(key) for key in self.model_extra or {}]
        for name in ("verifier", "agent", "environment", "solution"):
            section: BaseModel = getattr(self, name)
            found += [f"{name}.{key}" for key in section.model_extra or {}]
        health = self.environment.healthcheck
        if health is not None:
            found += [f"environment.healthcheck.{key}" for key in health.model_extra or {}]
        return sorted(found)


def _megabytes(size: str, key: str) -> int:
    text = size.strip().upper()
    factors = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not text or text[-1] not in factors:
        raise ValueError(f"{key} = {size!r}: write a size like \"2G\" or \"512M\" (or use {key}_mb)")
    try:
        megabytes = int(float(text[:-1]) * factors[text[-1]])
    except (ValueError, OverflowError):
        raise ValueError(f"{key} = {size!r}: write a size like \"2G\" or \"512M\" (or use {key}_mb)") from None
    if megabytes < 0:
        raise ValueError(f"{key} = {size!r}: a size cannot be negative")
    return megabytes


def read_task_toml(directory: Path, where: str) -> TaskToml:
    """``directory/task.toml`` read and checked; unknown keys are logged once each (per process).

    Raises:
        ConfigError: it is missing, not TOML (the line), nested deeper than ``MAX_JSON_DEPTH`` levels,
            or a key has a wrong type (the key and the expected type).
    """
    path = directory / "task.toml"
    if not path.is_file():
        raise ConfigError(f"{where}: task.toml is missing")
    try:
        raw = toml_loads(path.read_text(encoding="utf-8"), f"{where}: task.toml",
                         fix="Write it with fewer levels of tables and arrays")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: task.toml is not valid TOML ({exc})") from None
    except ValueError as exc:   # nested too deep
        raise ConfigError(str(exc)) from None
    try:
        toml = TaskToml.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{_key(error)}: {error['msg']}" for error in exc.errors()[:5])
        raise ConfigError(f"{where}: task.toml: {problems}. Fix the value (Harbor's task.toml schema)") from None
    for key in toml.unknown_keys():
        if key not in _warned:
            _warned.add(key)
            log.warning("%s: task.toml key %r is not in Harbor's schema as this version knows it; ignored", where, key)
    return toml


def _key(error: Any) -> str:
    """``environment.memory_mb = 4611686018427387904``: a validation error's key, and its value when it is
    a scalar (a string cut to 100 characters)."""
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    value = error.get("input")
    if not error["loc"] or isinstance(value, (dict, list)) or value is None:
        return key
    return f"{key} = {repr(value)[:100]}"


def refuse_unsupported(toml: TaskToml, where: str, directory: Path | None = None) -> None:
    """Raise ``ConfigError`` naming each key of ``toml`` (and each file of the task ``directory``) asking for
    what this system does not run, and the fix: ``environment/docker-compose.yaml`` (Harbor starts the task's
    services with Docker Compose when it is there; here it would be ignored) is refused too.

    Raises:
        ConfigError: ``<where>: task.toml asks for what this system does not run: [section] key = value (why;
            the fix); ...``.
    """
    environment = toml.environment
    refused = []
    if directory is not None and (compose := (directory / "environment" / "docker-compose.yaml")).exists():
        refused.append(f"{compose.relative_to(directory)} (Docker Compose services are not run here: the box is the "
                       "image of environment/Dockerfile alone; fold what the services do into that image, or run "
                       "the task in Harbor)")
    if environment.gpus:
        refused.append(f"[environment] gpus = {environment.gpus} (this system runs no GPU boxes; run the task in "
                       "Harbor on a GPU host, or set gpus = 0 if it does not need one)")
    if environment.tpu is not None:
        refused.append("[environment] tpu (this system runs no TPU boxes; run the task in Harbor on GKE)")
    if environment.os != "linux":
        refused.append(f'[environment] os = "{environment.os}" (only Linux boxes run here)')
    if environment.mcp_servers:
        refused.append("[environment] mcp_servers (MCP servers are not run for the agent; remove them, or run the "
                       "task in Harbor)")
    if environment.skills_dir:
        refused.append("[environment] skills_dir (skills are not copied for the agent; remove it)")
    if toml.steps:
        refused.append(f"[[steps]] ({len(toml.steps)} steps: multi-step tasks are not run here; split them into "
                       "one task per step, or run the task in Harbor)")
    if toml.verifier.environment is not None:
        refused.append("[verifier.environment] (a separate verifier image is not run here; drop it to grade in a "
                       "fresh box of the task's own image with environment_mode = \"separate\")")
    if toml.verifier.collect:
        refused.append("[[verifier.collect]] (collect hooks run in Docker Compose services, which are not run here)")
    if any(isinstance(entry, dict) and entry.get("service") not in (None, "main") for entry in toml.artifacts):
        refused.append("artifacts from a compose service (Docker Compose is not run here)")
    if toml.artifacts and toml.verifier.environment_mode == "separate":
        refused.append("artifacts with environment_mode = \"separate\" (here the fresh box gets the agent's "
                       "workdir, not a list of artifacts; drop artifacts, or grade with environment_mode = \"shared\")")
    for section, mode in (("environment", environment.network_mode), ("agent", toml.agent.network_mode),
                          ("verifier", toml.verifier.network_mode)):
        hosts = getattr(toml, section).allowed_hosts
        if hosts is not None and mode != "allowlist":
            refused.append(f'[{section}] allowed_hosts = {hosts!r} without network_mode = "allowlist" in '
                           f"[{section}] (set it there, or drop allowed_hosts)")
        for host in hosts or []:
            try:
                parse_rule(host)
            except ValueError as exc:
                refused.append(f"[{section}] allowed_hosts: {exc}")
    if refused:
        raise ConfigError(f"{where}: task.toml asks for what this system does not run: {'; '.join(refused)}")
