"""Tasks: ``TaskData`` (what to solve) and ``Task`` (how to set up, finalize and score it).

Subclass ``Task`` for behaviour::

    class Add(vf.Task):
        @vf.reward(weight=1.0)
        async def correct(self, trace: vf.Trace) -> float:
            return float(trace.last_reply == self.data.answer)

Reward and metric methods, and the ``setup``/``finalize`` hooks, receive the parameters they
name: ``trace``, ``runtime`` and ``task``. They may be sync or async: an ``async def`` runs on the
event loop that runs the other rollouts, a sync one in a worker thread (``threads.py``), so a
blocking call (``time.sleep``, ``subprocess.run``) holds up only its own rollout and its stage
deadline still holds. Objects that rollouts share (made in ``__init__``) must then be safe to use
from several threads; a rollout's own sync rewards and metrics run one after another.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from prefect_rollouts.config.agent import AgentConfig, ScoringConfig
from prefect_rollouts.config.network import NetworkPolicy
from prefect_rollouts.errors import TaskError
from prefect_rollouts.threads import run_sync

if TYPE_CHECKING:
    from prefect_rollouts.harnesses.schema import ToolSpec

Messages = list[dict[str, Any]]
_ROLES = ("system", "user", "assistant", "tool")

_SCORE_ATTR = "__prefect_rollouts_score__"


class TaskData(BaseModel):
    """The data of one task. Frozen; subclass to add fields.

    ``id`` defaults to a hash of the other fields, so the same data has the same id across runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")

    id: str | None = None
    """Durable task id; default: the first 16 hex digits of the sha256 of the data's JSON."""
    prompt: str | Messages | None = None
    """The opening user message (or messages); None = the user opens through an interaction."""
    user_turns: list[str | Messages] = []
    """Further user messages of a multi-turn task. ``Agent.run`` and evals send each as one more
    turn after the prompt's, as ``Interaction.turn(message)`` would, until the run stops; in an
    interaction the caller drives the turns and this list is not used."""
    system_prompt: str | None = None
    answer: Any = None
    """Reference answer, for rewards and judges."""
    info: dict[str, Any] = {}
    """Free-form task metadata, copied to ``trace.info["task"]``."""
    files: dict[str, str | bytes] = {}
    """Files created in the workspace at setup: relative path -> content."""
    artifacts: list[str] = []
    """Workspace paths (relative) collected after finalize for isolated scoring."""
    tool_choice: str | dict[str, Any] | None = None
    """Per-task ``tool_choice`` sent when tools are offered (wins over ``sampling.tool_choice``);
    e.g. a taskset forcing the call of its one function for a model that only calls forced tools."""
    scoring: ScoringConfig | None = None
    """Task defaults for scoring placement; fields set on ``AgentConfig.scoring`` override them."""
    network: NetworkPolicy | None = None
    """The task's network policy while the agent runs, joined with the agent's ``runtime.network``
    (``config.network.compose``: either side open takes the other's; two rule lists keep the rules
    in both, blocks add up; ``none`` on either side is ``none``). None: the agent's alone."""

    @field_validator("user_turns")
    @classmethod
    def _real_turns(cls, turns: list[Any]) -> list[Any]:
        for index, turn in enumerate(turns):
            if isinstance(turn, str):
                if not turn.strip():
                    raise ValueError(f"user_turns[{index}] is empty; give the user's message text")
                continue
            if not turn:
                raise ValueError(f"user_turns[{index}] is an empty message list; give at least one message")
            for message in turn:
                if message.get("role") not in _ROLES or "content" not in message:
                    raise ValueError(f"user_turns[{index}] holds {str(message)[:80]}; each message needs a role "
                                     f"({', '.join(_ROLES)}) and content")
        return turns

    @model_validator(mode="after")
    def _default_id(self) -> TaskData:
        if self.id is None:
            payload = self.model_dump(mode="json", exclude={"id"}, exclude_none=True)
            digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
            object.__setattr__(self, "id", digest)
        return self


class Task:
    """Behaviour of a task. Override ``setup``, ``finalize``, ``tools`` and add ``@reward``/``@metric`` methods.

    Args:
        data: The task's ``TaskData``.
    """

    rewards_have_side_effects: ClassVar[bool] = False
    """True when scoring acts on the world (writes, sends, charges): an eval then makes each rollout
    durable as it finishes, so ``--resume`` after a kill does not score a finished rollout again."""

    keeps_agent_processes: ClassVar[bool] = False
    """True when what the agent leaves running (a server it started) must stay up until scoring ends, as in
    Harbor (its tests query the agent's services). False: the harness kills every process the agent
    started when its segment ends (``Runtime.kill_all``)."""

    def __init__(self, data: TaskData) -> None:
        if not isinstance(data, TaskData):
            raise TypeError(f"Task(data=...) needs a TaskData, got {type(data).__name__}")
        self.data = data

    @property
    def id(self) -> str:
        """The task id (``data.id``)."""
        return self.data.id  # type: ignore[return-value]

    async def prepare(self, config: AgentConfig) -> AgentConfig:
        """Make what this task's runtime needs (e.g. build its image) and return the agent config its
        rollouts run with (e.g. that image, its own deadlines). Default: ``config`` unchanged.

        An eval calls it for every task before any rollout starts (a few tasks at a time), and each
        rollout's setup calls it again before its runtime starts, on the rollout's own copy of the
        task: keep expensive work cached per process (and across processes where it is shared, like
        a Docker engine's images), so the second call returns at once.

        Raises:
            ConfigError: the task cannot run under ``config`` at all (e.g. it needs the ``docker``
                runtime); an eval stops before any rollout runs.
            InfrastructureError: what the task needs could not be made (e.g. its image does not
                build); its rollouts fail with this error (reward None), the eval's other tasks run.
        """
        return config

    async def setup(self, runtime: Any) -> None:
        """Prepare the workspace after ``data.files`` are written. Default: nothing."""

    async def solve(self, runtime: Any, trace: Any) -> None:
        """Apply the task's reference solution in ``runtime`` (what the ``oracle`` harness runs); a
        task whose solution works scores full reward after it.

        Raises:
            TaskError: the task has no reference solution (the default), or it could not start.
            AgentFailure: it failed on its own (``agent_exits.program_failure``): scored by the task.
        """
        raise TaskError(f"task {self.id!r} ({type(self).__name__}) has no reference solution for the oracle "
                        "harness: define Task.solve, or use another harness")

    async def finalize(self, trace: Any, runtime: Any) -> None:
        """Run after the last segment, before scoring (e.g. record a diff). Default: nothing."""

    def tools(self) -> Sequence[Callable[..., Any] | ToolSpec]:
        """Python callables offered to the model as tools by the ``tools`` harness. Default: none.

        Each tool's JSON schema comes from its type hints; its description and argument
        descriptions from its Google-style docstring. Tools may be sync or async.
        """
        return []

    def scoring_functions(self) -> list[tuple[str, Literal["reward", "metric"], float, Callable[..., Any]]]:
        """The task's ``@reward`` and ``@metric`` methods as ``(name, kind, weight, bound method)``, by name."""
        found = []
        for name in sorted(dir(type(self))):
            marker = getattr(getattr(type(self), name, None), _SCORE_ATTR, None)
            if marker is not None:
                found.append((name, marker[0], marker[1], getattr(self, name)))
        return found


def reward(fn: Callable[..., Any] | None = None, *, weight: float = 1.0) -> Any:
    """Mark a ``Task`` method as a reward. ``trace.reward`` is the sum of reward x ``weight``.

    Use as ``@reward`` or ``@reward(weight=0.5)``. The method returns a float (bool is accepted).
    """
    if not math.isfinite(weight):
        raise ValueError(f"@reward(weight={weight!r}): the weight must be a finite number")

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _SCORE_ATTR, ("reward", float(weight)))
        return f
    return mark(fn) if fn is not None else mark


def metric(fn: Callable[..., Any] | None = None) -> Any:
    """Mark a ``Task`` method as a metric: recorded in ``trace.metrics``, not part of the reward."""
    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _SCORE_ATTR, ("metric", 0.0))
        return f
    return mark(fn) if fn is not None else mark


async def call_injected(fn: Callable[..., Any], available: dict[str, Any], what: str = "task code",
                        on_abandon: Callable[[str], None] | None = None) -> Any:
    """Call ``fn`` with the parameters it names from ``available``; await it if it is async.

    An ``async def`` runs on the event loop; any other callable runs in a worker thread
    (``threads.run_sync``), so sync task code that blocks cannot stall the other rollouts, and a
    stage deadline still fires; an awaitable it returns is then awaited on the loop.

    Args:
        fn: Task code (a hook, a reward, a metric).
        available: Parameter values by name (``trace``, ``runtime``, ``task``).
        what: What ``fn`` is, for the warning when its thread is abandoned (e.g. ``"finalize hook"``).
        on_abandon: Receives that warning (see ``threads.run_sync``).

    Raises:
        TypeError: ``fn`` names a required parameter that is not available.
        asyncio.CancelledError: the caller was cancelled (a sync ``fn`` still running is abandoned).
    """
    kwargs = injected_kwargs(fn, available)
    if inspect.iscoroutinefunction(fn):
        return await fn(**kwargs)
    result = await run_sync(functools.partial(fn, **kwargs), f"{what} ({qualname(fn)})", on_abandon)
    if inspect.isawaitable(result):
        result = await result
    return result


def injected_kwargs(fn: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` gets from ``available``: the parameters it names.

    Raises:
        TypeError: ``fn`` names a required parameter that is not available.
    """
    kwargs = {}
    for name, required in _parameters(fn):
        if name in available:
            kwargs[name] = available[name]
        elif required:
            raise TypeError(f"{qualname(fn)} asks for parameter {name!r}; available are {sorted(available)}")
    return kwargs


def qualname(fn: Callable[..., Any]) -> str:
    """``fn``'s qualified name (``Add.exact``), or its repr."""
    return str(getattr(fn, "__qualname__", None) or fn)


_PARAMETERS: dict[Any, tuple[tuple[str, bool], ...]] = {}


def _parameters(fn: Callable[..., Any]) -> tuple[tuple[str, bool], ...]:
    """``(name, required)`` of ``fn``'s named parameters, cached per underlying function."""
    key = (getattr(fn, "__func__", fn), hasattr(fn, "__self__"))
    found = _PARAMETERS.get(key)
    if found is None:
        found = tuple((name, p.default is inspect.Parameter.empty)
                      for name, p in inspect.signature(fn).parameters.items()
                      if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
        _PARAMETERS[key] = found
    return found
