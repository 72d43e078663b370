"""``harbor``: agentic tasks in Harbor's task format, each a box with a goal that its tests check afterwards.

A task directory holds ``instruction.md`` (the prompt), ``task.toml`` (``harbor.config.TaskToml``),
``environment/`` (its ``Dockerfile``), ``tests/test.sh`` and, for the ``oracle`` harness,
``solution/solve.sh``. ``[env.taskset] path`` names one task directory or a directory of them (the
task ids are the directory names). Every problem a task's files have is a ``ConfigError`` naming the
task and the key, raised while the taskset loads, before any rollout; a task that links out of its
directory is refused (``harbor_files``).

A rollout of a task (the ``docker`` runtime only):

1. ``prepare``: the image (``[environment] docker_image``, else built from ``environment/``, tagged by
   a hash of the directory: ``runtimes/docker/images.py``) and the agent config of the rollout: that image,
   ``cpus``, ``memory_mb``, ``storage_mb`` (each unset: the runtime config's), ``workdir`` (default the
   image's ``WORKDIR``), ``env``, the user of the agent's commands (``[agent] user``, else the image's
   ``USER``) and the agent deadline (``[agent] timeout_sec``). The agent phase's network is the task's
   ``TaskData.network``, composed with the agent's ``runtime.network`` (``config.network.compose``).
   A failed build is an ``InfrastructureError`` of the task's rollouts (reward None), never reward 0.
2. ``setup``: ``/logs/agent``, ``/logs/verifier`` and ``/logs/artifacts`` made by root, writable by every
   user (as Harbor makes them); the healthcheck run as the image's user.
3. The agent (any harness; ``oracle`` runs ``solve``: ``solution/`` copied to ``/solution``, ``solve.sh``
   executed as Harbor's oracle does: ``harbor_scripts``). What the agent leaves running is not killed: it
   runs until the tests end (``keeps_agent_processes``).
4. ``finalize``: what the agent left in ``/logs/artifacts`` is listed (small text files kept) in
   ``trace.info["harbor"]["artifacts"]``.
5. Scoring (``tests``), in the agent's box (``[verifier] environment_mode = "shared"``) or in a fresh
   box of the same image with the agent's workdir restored (``"separate"``: isolated scoring), under
   the verifier phase's network: ``tests/test.sh`` executed as Harbor does, with ``[verifier] env`` for
   at most ``[verifier] timeout_sec``, in a private view of the box whose ``/tests`` and
   ``/logs/verifier`` nothing the agent left can write; then every process of the box is killed and
   ``reward.json`` or else ``reward.txt`` read (``harbor_scripts``, ``read_reward``). No reward file, an
   empty or non-finite one, or a test run past its deadline is a scoring error (reward None), not 0.

Deadlines scale by the taskset option ``timeout_multiplier``. Network modes: ``public`` is ``open``,
``no-network`` is ``none``, ``allowlist`` is ``{ allow = allowed_hosts }`` (README "Network
policies"); ``[agent]`` and ``[verifier]`` override ``[environment]`` for their phase (their own
``allowed_hosts``, else the environment's).
"""

from __future__ import annotations

import asyncio
import functools
import math
import shlex
import time
from pathlib import Path
from typing import Any, Literal

from prefect_rollouts.bounds import MAX_STORAGE_MB, MAX_TIMEOUT_MULTIPLIER
from prefect_rollouts.config.agent import AgentConfig, ScoringConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.environments.harbor import scripts as harbor_scripts
from prefect_rollouts.environments.harbor.config import TaskToml, read_task_toml, refuse_unsupported
from prefect_rollouts.environments.harbor.files import check_task_directory, inside
from prefect_rollouts.environments.harbor.scripts import LOG_DIRS, ROOT
from prefect_rollouts.errors import ConfigError, TaskError
from prefect_rollouts.runtimes.base import IMAGE_USER
from prefect_rollouts.task import Task, TaskData, reward
from prefect_rollouts.threads import run_sync
from prefect_rollouts.trace import Trace

WRITABLE = ("/logs", "/tests", "/solution")
"""Places besides the workdir a Harbor box must be able to write (``RuntimeConfig.writable``)."""
ARTIFACT_FILE_BYTES = 16 * 1024
"""Files in ``/logs/artifacts`` up to this size are kept on the trace as text; larger ones are listed."""
ARTIFACT_FILES = 50
"""At most this many files of ``/logs/artifacts`` are listed on the trace."""

class HarborTask(Task):
    """One Harbor task directory (see the module docstring).

    Attributes:
        directory: The task directory (absolute).
        toml: Its ``task.toml``.
        timeout_multiplier: Scales the agent, verifier and build deadlines.
        storage_mb: Overrides ``[environment] storage_mb`` (the taskset option), when not None.
    """

    keeps_agent_processes = True
    """What the agent started stays up until the tests end, as in Harbor (``harbor_scripts``)."""

    def __init__(self, data: TaskData, directory: Path, toml: TaskToml, *, timeout_multiplier: float = 1.0,
                 storage_mb: int | None = None) -> None:
        super().__init__(data)
        self.directory = directory
        self.toml = toml
        self.timeout_multiplier = timeout_multiplier
        self.storage_mb = storage_mb

    @property
    def separate(self) -> bool:
        """Whether the tests run in a fresh box (``[verifier] environment_mode = "separate"``)."""
        return self.toml.verifier.environment_mode == "separate"

    def network(self, phase: Literal["agent", "verifier"]) -> NetworkPolicy:
        """The network policy of ``phase`` (``agent`` or ``verifier``): its own mode, else the environment's."""
        return _policy(self.toml, phase)

    async def prepare(self, config: AgentConfig) -> AgentConfig:
        """The task's image (built or found; see the module docstring) and the agent config of its rollouts.

        Raises:
            ConfigError: the runtime is not ``docker``.
            InfrastructureError: the image does not build (the build log's tail), or a ``docker_image``
                is neither on the engine nor pullable.
        """
        from prefect_rollouts.runtimes.docker import images  # the docker SDK loads only for a harbor eval

        if config.runtime.type != "docker":
            raise ConfigError(f'[env.agent.runtime] type = "{config.runtime.type}": Harbor task {self.id!r} runs in '
                              'its own image; set [env.agent.runtime] type = "docker"')
        environment = self.toml.environment
        what = f"Harbor task {self.id!r}"
        timeout_s = environment.build_timeout_sec * self.timeout_multiplier
        known: images.ImageReady | None = getattr(self, "image", None)
        if environment.docker_image:
            job = functools.partial(images.pull_image, environment.docker_image, timeout_s=timeout_s, what=what)
        else:   # the tag this task object first got (the eval's, before its rollouts): one image per eval
            source = await asyncio.to_thread(inside, self.directory, "environment", what)   # again: it may have changed
            tag = known.tag if known is not None else await asyncio.to_thread(images.image_tag, self.id, source)
            job = functools.partial(images.build_image, source, tag, timeout_s=timeout_s, what=what)
        ready = await run_sync(job, f"{what}: the image")   # a daemon thread: Ctrl-C does not wait for a build
        if known is None:
            self.image = ready   # its build_s is the eval's build, not a rollout's cached check
        storage_mb = next(size for size in (self.storage_mb, environment.storage_mb, config.runtime.storage_mb)
                          if size is not None)
        user = self.toml.agent.user
        runtime = config.runtime.model_copy(update={
            "image": ready.tag, "workdir": environment.workdir or ready.workdir,
            "cpus": float(environment.cpus or config.runtime.cpus),
            "memory_mb": environment.memory_mb or config.runtime.memory_mb, "storage_mb": storage_mb,
            "user": config.runtime.user if user is None else str(user), "capabilities": "docker-default",
            "env": {**config.runtime.env, **environment.env},
            "writable": sorted({*config.runtime.writable, *WRITABLE})})
        timeouts = config.timeouts
        if self.toml.agent.timeout_sec is not None:
            timeouts = timeouts.model_copy(update={"agent": self.toml.agent.timeout_sec * self.timeout_multiplier})
        return config.model_copy(update={"runtime": runtime, "timeouts": timeouts})

    async def setup(self, runtime: Any, trace: Trace | None = None) -> None:
        """Make the log directories; run ``[environment.healthcheck]`` until it passes.

        Raises:
            TaskError: the directories cannot be made, ``[agent]`` or ``[verifier] user`` names a user the image
                does not have, or the healthcheck failed ``retries`` times.
        """
        info = trace.info.setdefault("harbor", {}) if trace is not None else {}
        info.update(image=runtime.config.image, workdir=runtime.config.workdir,
                    build_s=image.build_s if (image := getattr(self, "image", None)) else None,
                    network={"agent": runtime.network.describe(), "verifier": self.network("verifier").describe()})
        made = await runtime.exec(f"mkdir -p {' '.join(LOG_DIRS)} && chmod 777 {' '.join(LOG_DIRS)}", timeout=60,
                                  user=ROOT)
        if made.exit_code != 0:
            raise TaskError(f"Harbor task {self.id!r}: cannot make {', '.join(LOG_DIRS)} in the box: "
                            f"{made.stderr.strip()[-500:]}")
        await self._check_users(runtime)
        check = self.toml.environment.healthcheck
        if check is None:
            return
        started, failures = time.monotonic(), 0
        while True:
            result = await runtime.exec(check.command, timeout=check.timeout_sec, user=IMAGE_USER)
            if result.exit_code == 0:
                return
            starting = time.monotonic() - started < check.start_period_sec
            failures += 0 if starting else 1
            if not starting and failures >= check.retries:
                raise TaskError(f"Harbor task {self.id!r}: [environment.healthcheck] {check.command!r} failed "
                                f"{failures} times (exit {result.exit_code}): {result.stderr.strip()[-500:]}")
            await asyncio.sleep(check.start_interval_sec if starting else check.interval_sec)

    async def _check_users(self, runtime: Any) -> None:
        """Raise ``TaskError`` naming the key when ``[agent] user`` or ``[verifier] user`` names a user (or a
        group after ``:``) the image does not have; a number needs no entry (Docker takes any UID)."""
        for table, user in (("agent", self.toml.agent.user), ("verifier", self.toml.verifier.user)):
            name, _, group = str(user or "").partition(":")
            lookups = [f"id -u -- {shlex.quote(name)}"] if name and not name.isdigit() else []
            lookups += [f"getent group -- {shlex.quote(group)}"] if group and not group.isdigit() else []
            if not lookups:
                continue
            found = await runtime.exec(" && ".join(f"{lookup} >/dev/null" for lookup in lookups), timeout=30, user=ROOT)
            if found.exit_code != 0:
                said = found.stderr.strip()[-200:] or f"exit code {found.exit_code}"
                raise TaskError(f"Harbor task {self.id!r}: [{table}] user = {str(user)!r}: the image has no such user "
                                f"or group ({said}). Create it in environment/Dockerfile (useradd), or name one the "
                                "image has")

    async def solve(self, runtime: Any, trace: Trace) -> None:
        """The oracle: copy ``solution/`` to ``/solution`` and run ``solve.sh`` as Harbor's oracle does
        (``harbor.scripts.solve``: executed directly, its output in ``/logs/agent/oracle.txt``, what it starts
        in the background left running), within the agent deadline.

        Raises:
            AgentFailure: it exited non-zero (``program_failed``) or ran past the deadline (``program_timeout``):
                the oracle's own failure, scored by the tests as in Harbor (``agent_exits``).
            TaskError: there is no ``solution/solve.sh``, or it could not start (exit 126 or 127).
        """
        solution = self._inside("solution")
        if not (solution / "solve.sh").is_file():
            raise TaskError(f"Harbor task {self.id!r}: no solution/solve.sh for the oracle harness")
        await harbor_scripts.solve(self, runtime, trace, solution)

    async def finalize(self, trace: Trace, runtime: Any) -> None:
        """Keep what the agent left in ``/logs/artifacts`` on the trace (``trace.info["harbor"]["artifacts"]``:
        path -> text of each file up to ``ARTIFACT_FILE_BYTES``, None for a larger or binary one)."""
        listing = await runtime.exec(_LIST_ARTIFACTS, timeout=60)
        if listing.exit_code != 0 or not listing.stdout.strip():
            return
        kept: dict[str, str | None] = {}
        for line in listing.stdout.splitlines()[:ARTIFACT_FILES]:
            size, _, path = line.partition(" ")
            kept[path] = None
            if size.isdigit() and int(size) <= ARTIFACT_FILE_BYTES:
                content = await runtime.exec(f"cat -- {shlex.quote('/logs/artifacts/' + path)}", timeout=30)
                if content.exit_code == 0 and "\ufffd" not in content.stdout:
                    kept[path] = content.stdout
        trace.info.setdefault("harbor", {})["artifacts"] = kept

    def _inside(self, name: str) -> Path:
        """``harbor.files.inside`` at run time (the directory may have changed since it loaded): a link out
        of the task directory is an error of the rollout (``TaskError``)."""
        try:
            return inside(self.directory, name, f"Harbor task {self.id!r}")
        except ConfigError as exc:
            raise TaskError(str(exc)) from None

    @reward
    async def tests(self, trace: Trace, runtime: Any) -> float:
        """The reward ``tests/test.sh`` writes, run as Harbor runs it while the agent's services still run,
        apart from them (``harbor.scripts.tests``); the other keys of an object in ``reward.json`` become
        metrics. How the tests ran (exit code, output tail) is in ``trace.info["harbor"]["verifier"]``.

        Raises:
            TaskError: the tests ran past ``[verifier] timeout_sec``, wrote no usable reward, or could not run.
        """
        return await harbor_scripts.tests(self, runtime, trace, self._inside("tests"))


_LIST_ARTIFACTS = ("cd /logs/artifacts 2>/dev/null && find . -type f -printf '%s %P\\n' 2>/dev/null | sort -k2 | "
                   f"head -n {ARTIFACT_FILES}")


def load(path: str = "examples/harbor-tasks", tasks: list[str] | None = None, timeout_multiplier: float = 1.0,
         storage_mb: int | None = None) -> list[HarborTask]:
    """The Harbor tasks under ``path``, in directory-name order.

    Args:
        path: One task directory (it holds ``task.toml``) or a directory of them (default: the shipped
            ``examples/harbor-tasks``; a relative path is
            resolved against the current directory, not the config file's; subdirectories without ``task.toml`` or
            ``instruction.md`` are skipped).
        tasks: Only these task directory names, in this order.
        timeout_multiplier: Scales every task's agent, verifier and build deadlines (> 0, at most 100).
        storage_mb: The disk quota of every box, in MiB (at most 1 TiB), instead of ``[environment] storage_mb``; 0 =
            none (under the ``tmpfs`` quota a box's root filesystem is read-only: ``docker/storage.py``).

    Raises:
        ConfigError: ``path`` is missing or holds no task; ``tasks`` names one that is not there; a task
            lacks ``instruction.md``, ``tests/test.sh`` or an image (``environment/Dockerfile`` or
            ``docker_image``); its ``task.toml`` is not TOML, has a wrong type or a value out of bounds (named
            by key); a file it names is a link out of its directory (``harbor_files``); or it asks for what
            this system does not run (``harbor.config.refuse_unsupported``: GPUs, MCP servers, Docker Compose,
            multi-step tasks, ...).
    """
    if not (math.isfinite(timeout_multiplier) and 0 < timeout_multiplier <= MAX_TIMEOUT_MULTIPLIER):
        raise ConfigError(f"[env.taskset] timeout_multiplier = {timeout_multiplier}: must be above 0 and at most "
                          f"{MAX_TIMEOUT_MULTIPLIER:g} (bounds.MAX_TIMEOUT_MULTIPLIER)")
    if storage_mb is not None and not 0 <= storage_mb <= MAX_STORAGE_MB:
        raise ConfigError(f"[env.taskset] storage_mb = {storage_mb}: must be 0 (no quota) to {MAX_STORAGE_MB} MiB "
                          "(1 TiB, bounds.MAX_STORAGE_MB)")
    return [_task(name, directory, timeout_multiplier, storage_mb)
            for name, directory in task_directories(path, tasks).items()]


def problems(path: str, tasks: list[str] | None = None) -> list[str]:
    """What is wrong with each task under ``path`` (one message per broken task, as ``load`` would raise
    it for the first), so that a check can name them all at once; empty when every task loads.

    Raises:
        ConfigError: ``path`` itself is wrong (see ``task_directories``).
    """
    found = []
    for name, directory in task_directories(path, tasks).items():
        try:
            _task(name, directory, 1.0, None)
        except ConfigError as exc:
            found.append(str(exc))
    return found


def task_directories(path: str, tasks: list[str] | None = None) -> dict[str, Path]:
    """Task name -> directory under ``path`` (see ``load``), not yet read.

    Raises:
        ConfigError: ``path`` is missing or holds no task, or ``tasks`` names one that is not there.
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        what = "a file, not a directory" if root.exists() else "no such directory"
        raise ConfigError(f'[env.taskset] path = "{path}": {what} ({root}). Give a Harbor task '
                          "directory, or a directory of them")
    if (root / "task.toml").is_file():
        found = {root.name: root}
    else:
        found = {child.name: child for child in sorted(root.iterdir())
                 if child.is_dir() and ((child / "task.toml").is_file() or (child / "instruction.md").is_file())}
    if not found:
        raise ConfigError(f'[env.taskset] path = "{path}": no Harbor task in {root} (a task directory holds '
                          "task.toml, instruction.md and tests/test.sh)")
    if tasks is not None:
        unknown = [name for name in tasks if name not in found]
        if unknown:
            raise ConfigError(f"[env.taskset] tasks: {', '.join(map(repr, unknown))} not in {root}. Its tasks are: "
                              f"{', '.join(found)}")
        found = {name: found[name] for name in tasks}
    return found


def _task(name: str, directory: Path, timeout_multiplier: float, storage_mb: int | None) -> HarborTask:
    """One task directory as a ``HarborTask`` (see ``load`` for what it raises)."""
    where = f"Harbor task {name!r} ({directory})"
    check_task_directory(directory, where)   # before anything of it is read
    toml = read_task_toml(directory, where)
    instruction = inside(directory, "instruction.md", where)
    if not instruction.is_file():
        raise ConfigError(f"{where}: instruction.md is missing; it holds the prompt")
    if not (directory / "tests" / "test.sh").is_file():
        raise ConfigError(f"{where}: tests/test.sh is missing; it runs the tests and writes the reward")
    for script in ("tests/test.sh", "solution/solve.sh"):
        if (directory / script).is_file() and (directory / script).read_bytes()[:4096].split(b"\n")[0].endswith(b"\r"):
            raise ConfigError(f"{where}: {script} has Windows line endings (CRLF): executed directly, its first line "
                              f"asks for an interpreter named with a carriage return. Convert it: sed -i 's/\\r$//' "
                              f"{script}")
    if not toml.environment.docker_image and not (directory / "environment" / "Dockerfile").is_file():
        raise ConfigError(f"{where}: environment/Dockerfile is missing and [environment] docker_image is not set; "
                          "give one of them")
    refuse_unsupported(toml, where, directory)
    try:
        prompt = instruction.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: instruction.md is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not prompt.strip():
        raise ConfigError(f"{where}: instruction.md is empty")
    metadata = toml.metadata
    info: dict[str, Any] = {}
    for key in ("category", "difficulty"):
        if isinstance(metadata.get(key), str):
            info[key] = metadata[key]
    separate = toml.verifier.environment_mode == "separate"
    scoring = ScoringConfig(mode="isolated" if separate else "shared",
                            network=_policy(toml, "verifier"))
    return HarborTask(TaskData(id=name, prompt=prompt, info=info, artifacts=["."] if separate else [],
                               scoring=scoring, network=_policy(toml, "agent")),
                      directory, toml, timeout_multiplier=timeout_multiplier, storage_mb=storage_mb)


def _policy(toml: TaskToml, phase: Literal["agent", "verifier"]) -> NetworkPolicy:
    """The policy of ``phase``: Harbor's ``public`` is ``open``, ``no-network`` is ``none``,
    ``allowlist`` allows its ``allowed_hosts`` (rules as in ``config/network.py``)."""
    mode = toml.phase_network(phase)
    if mode == "allowlist":
        return NetworkPolicy(mode="rules", allow=toml.phase_hosts(phase))
    return NetworkPolicy(mode="open" if mode == "public" else "none")
