"""One rollout's private state between its stages, and the messages a turn starts from.

``RolloutState`` is what a ``Rollout`` owns in the process running it (``new_state`` mints it with the
trace: no I/O); ``Segment`` is what one ``turn()`` returns (public: ``prefect_rollouts.Segment``);
``opening_messages`` and ``user_messages`` turn a task's prompt or a user's message into wire messages.
The stages that act on the state are ``stages.py``. Must not import Prefect.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prefect_rollouts.config.agent import AgentConfig, ScoringConfig, effective_scoring
from prefect_rollouts.harnesses import Harness, make_harness
from prefect_rollouts.model.local import is_local
from prefect_rollouts.runtimes import Runtime
from prefect_rollouts.runtimes.egress.proxy import EgressProxy
from prefect_rollouts.task import Task
from prefect_rollouts.trace import SendRecord, Trace

if TYPE_CHECKING:
    from prefect_rollouts.evals.budget import Budget
    from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint
    from prefect_rollouts.model import ModelClient
    from prefect_rollouts.scoring.judges import JudgeClients


@dataclass(eq=False)
class RolloutState:
    """What one rollout holds between stages; owned by its ``Rollout``, in the process running it.

    Harnesses see it through the narrow ``harnesses.SegmentContext`` protocol.
    """

    config: AgentConfig
    task: Task
    client: ModelClient
    trace: Trace
    harness: Harness
    scoring: ScoringConfig
    runtime: Runtime | None = None
    turns: int = 0
    """Model responses sampled so far (for ``max_turns``)."""
    agent_elapsed_s: float = 0.0
    """Agent budget consumed by segments so far."""
    steer_inbox: list[SendRecord] = field(default_factory=list)
    """Steer messages waiting for the harness's next safe point."""
    segment_inputs: int = 0
    """User messages delivered at the start of the last segment (they are not part of its output)."""
    artifacts: bytes | None = None
    """Archive collected after finalize for isolated scoring."""
    resume_segment: bool = False
    """The last segment raised; the next ``run_segment`` resumes it instead of starting one."""
    labels: dict[str, str] = field(default_factory=dict)
    judge_clients: JudgeClients | None = None
    """The agent's judge clients; None opens them per scoring call."""
    egress: EgressProxy | None = None
    """The agent's egress proxy (``runtimes/egress/proxy.py``), for a docker runtime under ``{ allow, block }``."""
    budget: Budget | None = None
    """The eval run's token or cost budget (``evals/budget.py``), shared by its rollouts; None outside an
    eval with one."""

    @property
    def stopped(self) -> bool:
        """True once the run has a stop condition (completed, limited, timed out or failed)."""
        return self.trace.stop_condition is not None

    @property
    def segment_index(self) -> int:
        """Index of the current (or last) segment."""
        return len(self.trace.segments) - 1

    def turn_limit_reached(self) -> bool:
        """The one ``max_turns`` rule: once ``turns`` sampled responses reach the cap, the run stops
        as ``max_turns`` (if nothing stopped it first) and its last segment is terminated.
        Checked before every model call, before every turn, and after an interaction's turn."""
        limit = self.config.max_turns
        if limit is None or self.turns < limit:
            return False
        self.trace.stop("max_turns")
        if self.trace.segments:
            self.trace.segments[-1].terminated = True
        return True

    async def budget_reached(self) -> bool:
        """The eval's budget rule, beside ``turn_limit_reached`` at the same boundary (before every model
        call): once the run's spend reached its budget, the run stops as ``budget`` (if nothing stopped it
        first; ``trace.UNFINISHED_STOPS``: not scored, run again on resume) and its last segment is terminated."""
        if self.budget is None or not await self.budget.check():
            return False
        self.trace.stop("budget")
        if self.trace.segments:
            self.trace.segments[-1].terminated = True
        return True

    async def charge(self, tokens: int, cost_usd: float | None, usage_note: str | None = None) -> None:
        """Count one model call's tokens and cost against the eval's budget (if any); ``usage_note``: its
        usage was missing or invalid (``Budget.warn_unknown``)."""
        if self.budget is not None:
            await self.budget.charge(tokens, cost_usd, usage_note)


@dataclass(slots=True)
class Segment:
    """What one ``turn()`` produced.

    Attributes:
        messages: Messages the harness added in the segment (assistant messages, tool
            results, steer messages injected mid-segment), in order; wire-format dicts.
        terminated: True when the rollout has stopped; no further turn will run.
        last_reply: Content of the segment's last assistant message, stripped ("" if none).
    """

    messages: list[dict[str, Any]]
    terminated: bool
    last_reply: str = ""

    def __repr__(self) -> str:
        return f"Segment(messages=<{len(self.messages)}>, terminated={self.terminated}, last_reply={self.last_reply!r})"


def new_state(config: AgentConfig, task: Task, client: ModelClient, *, agent_info: dict[str, Any],
              labels: dict[str, str] | None = None, judge_clients: JudgeClients | None = None,
              endpoint: InterceptionEndpoint | None = None, egress: EgressProxy | None = None) -> RolloutState:
    """Mint the trace and state of one rollout (no I/O).

    ``endpoint``: the agent's interception endpoint, which a program harness needs; ``egress``: the
    agent's egress proxy.
    ``agent_info`` (the redacted config) becomes ``trace.agent``; for a ``local/...`` model its
    ``client`` says what was used: the local server's ``base_url``, no key, no endpoint block.

    The rollout gets its own shallow copy of ``task`` (``rollout_copy``), so ``Task.setup`` may
    keep per-rollout state on ``self`` (e.g. the live tool objects of a stateful benchmark)
    while many rollouts of one task run at once.
    """
    task = rollout_copy(task)
    # the client talks to the agent's llama.cpp server, not to config.client (oracle and nop open none)
    if is_local(config.model) and config.harness.uses_model:
        served = {"base_url": client.config.base_url, "api_key_env": None, "endpoint": None}
        agent_info = {**agent_info, "client": {**agent_info["client"], **served}}
    trace = Trace(task_id=task.id, task_type=type(task).__name__, model=config.model, agent=agent_info)
    if task.data.info:
        trace.info["task"] = dict(task.data.info)
    return RolloutState(config=config, task=task, client=client, trace=trace,
                        harness=make_harness(config.harness, endpoint),
                        labels={**(labels or {}), "rollout_id": trace.id},
                        scoring=effective_scoring(config.scoring, task.data.scoring), judge_clients=judge_clients,
                        egress=egress)


def rollout_copy(task: Task) -> Task:
    """A rollout's own shallow copy of ``task``: its ``__copy__`` when the class defines one, else
    the same attributes on a new instance (not ``copy.copy``, which would go through pickling
    hooks such as a ``__getstate__`` that drops a client). Attributes are shared, not copied:
    ``setup`` should assign new objects to ``self``, not mutate ones made in ``__init__``."""
    cls = type(task)
    if getattr(cls, "__copy__", None) is not None:
        return copy.copy(task)
    clone = object.__new__(cls)
    if hasattr(task, "__dict__"):
        clone.__dict__.update(vars(task))
    for klass in cls.__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(task, name):
                setattr(clone, name, getattr(task, name))
    return clone


def user_messages(message: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn as wire messages: a string is one user message, a list is copied."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    return [dict(m) for m in message]


def opening_messages(task: Task) -> list[dict[str, Any]]:
    """The system prompt (if any) and the task's prompt as wire messages."""
    messages: list[dict[str, Any]] = []
    if task.data.system_prompt:
        messages.append({"role": "system", "content": task.data.system_prompt})
    prompt = task.data.prompt
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt is not None:
        messages.extend(dict(m) for m in prompt)
    return messages
