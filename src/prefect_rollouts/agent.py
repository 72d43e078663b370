"""The public entry points: ``make_agent``, ``Agent.run`` and ``Agent.interaction``.

An ``Agent`` owns one model client (one connection pool) shared by all its rollouts. Each
rollout runs the lifecycle in ``stages.py``; failures are data on the returned trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from types import TracebackType
from typing import Any, Literal

import httpx

from prefect_rollouts.config import AgentConfig
from prefect_rollouts.engine import InlineOrchestrator, Orchestrator, run_rollout
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.model import ModelClient
from prefect_rollouts.model.open import open_client as open_model_client
from prefect_rollouts.scoring.judges import JudgeClients, client_key, open_judges
from prefect_rollouts.scoring.env import is_template
from prefect_rollouts.stages import RolloutState, Segment, new_state, opening_messages
from prefect_rollouts.task import Task
from prefect_rollouts.trace import Receipt, SendRecord, Trace


def make_agent(config: AgentConfig) -> Agent:
    """Build an ``Agent`` from ``config``. Use it as ``async with make_agent(config) as agent:``."""
    return Agent(config)


class Agent:
    """A configured harness and model that runs rollouts in fresh runtimes.

    Args:
        config: The ``AgentConfig``; stamped on every trace with secrets redacted.

    Raises:
        TypeError: ``config`` is not an ``AgentConfig``.
    """

    def __init__(self, config: AgentConfig) -> None:
        if not isinstance(config, AgentConfig):
            raise TypeError(f"make_agent(config=...) needs an AgentConfig, got {type(config).__name__}")
        self.config = config
        self.info = redacted_config(config)
        self._client: ModelClient | None = None
        self._server: Any = None
        self._judges: JudgeClients | None = None

    async def __aenter__(self) -> Agent:
        if self._client is not None:
            raise RuntimeError("this Agent is already open; enter it once")
        self._client, self._server, self._judges = await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        opened = self._client, self._server, self._judges
        self._client = self._server = self._judges = None
        await _close(*opened)

    async def _open(self) -> tuple[ModelClient, Any, JudgeClients]:
        """The model client, its local server (or None) and the judge clients. The agent's own
        judges are imported and opened here, so a bad judge fails before any rollout runs."""
        client, server = await open_client(self.config)
        judges = JudgeClients({client_key(self.config.model, self.config.client): client},
                              default_client=self.config.client)
        try:
            await open_judges(self.config.scoring.judges, judges)
        except BaseException:
            await _close(client, server, judges)
            raise
        return client, server, judges

    async def run(self, task: Task) -> Trace:
        """Run one rollout to completion: setup, one segment on the task's prompt and one per
        ``TaskData.user_turns`` entry, finalize, score.

        Returns:
            The finished ``Trace``. Rollout failures (model endpoint, runtime, task code,
            deadlines) are recorded on it, not raised.

        Raises:
            ConfigError: the task has no prompt (use ``interaction`` for prompt-less tasks).
        """
        if task.data.prompt is None:
            raise ConfigError(f"TaskData.prompt = None (task {task.id!r}): run() needs a prompt. "
                              "Set a prompt, or drive the task with agent.interaction(task)")
        async with self._borrow_client() as (client, judges):
            state = new_state(self.config, task, client, agent_info=self.info, judge_clients=judges)
            if self.config.orchestrator == "prefect":
                from prefect_rollouts.flows.rollout import run_rollout_flow  # Prefect loads only here

                return await run_rollout_flow(state)
            return await run_rollout(InlineOrchestrator(), state)

    def orchestrator(self) -> Orchestrator:
        """A fresh orchestrator for one rollout, as ``config.orchestrator`` selects."""
        if self.config.orchestrator == "prefect":
            from prefect_rollouts.flows.rollout import FlowOrchestrator

            return FlowOrchestrator()
        return InlineOrchestrator()

    def new_rollout(self, task: Task, client: ModelClient, labels: dict[str, str] | None = None) -> RolloutState:
        """The state of a new rollout of ``task`` on ``client`` (for orchestrators such as ``eval_flow``)."""
        return new_state(self.config, task, client, agent_info=self.info, labels=labels, judge_clients=self._judges)

    @property
    def client(self) -> ModelClient:
        """The agent's model client (its connection pool); the agent must be entered.

        Raises:
            RuntimeError: the agent is not open.
        """
        if self._client is None:
            raise RuntimeError("the agent is not open; use `async with make_agent(config) as agent:`")
        return self._client

    def interaction(self, task: Task) -> Interaction:
        """Open a turn-by-turn rollout of ``task``: ``async with agent.interaction(task) as it:``."""
        return Interaction(self, task)

    @contextlib.asynccontextmanager
    async def _borrow_client(self) -> Any:
        """``(client, judge clients)``: the agent's, or for an un-entered agent a set for this rollout only."""
        if self._client is not None:
            yield self._client, self._judges
            return
        client, server, judges = await self._open()
        try:
            yield client, judges
        finally:
            await _close(client, server, judges)


async def _close(client: ModelClient | None, server: Any, judges: JudgeClients | None) -> None:
    """Close judge clients, then the model client, then stop the local server; each on every path."""
    try:
        if judges is not None:
            await judges.aclose()
    finally:
        try:
            if client is not None:
                await client.aclose()
        finally:
            if server is not None:
                await server.stop()


class Interaction:
    """One open rollout driven by the caller, who plays the user.

    ``turn()`` runs one harness segment; ``send()`` delivers messages while the agent works
    (``steer``) or at the next turn boundary (``queue``). Leaving the ``async with`` block
    cancels outstanding deliveries, then finalizes and scores; ``trace`` is then complete.
    """

    def __init__(self, agent: Agent, task: Task) -> None:
        self.agent = agent
        self.task = task
        self.state: RolloutState | None = None
        self._orchestrator = agent.orchestrator()
        self._client_cm: Any = None
        self._lock = asyncio.Lock()
        self._active = False
        self._opened = False
        self._closed = False
        self._queue: list[SendRecord] = []
        self._sends: dict[str, SendRecord] = {}
        self._drain: asyncio.Task[None] | None = None

    @property
    def trace(self) -> Trace:
        """The live trace (complete after the block exits)."""
        if self.state is None:
            raise RuntimeError("the interaction has not started; use it as `async with agent.interaction(task)`")
        return self.state.trace

    async def __aenter__(self) -> Interaction:
        if self.state is not None:
            raise RuntimeError("an Interaction runs one rollout; call agent.interaction(task) again for another")
        self._client_cm = self.agent._borrow_client()
        client, judges = await self._client_cm.__aenter__()
        self.state = new_state(self.agent.config, self.task, client, agent_info=self.agent.info,
                               judge_clients=judges)
        self.task = self.state.task   # the rollout's own copy, whose setup state the caller may read
        try:
            await self._orchestrator.setup(self.state)
        except BaseException:
            await self._orchestrator.teardown(self.state)
            await self._client_cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        state = self.state
        assert state is not None
        self._closed = True
        try:
            await self._cancel_deliveries()
            if exc is None:
                state.trace.stop("user_closed")
                await self._orchestrator.score(state)
            elif not isinstance(exc, asyncio.CancelledError):
                state.trace.record_error(exc, "interaction")  # recorded, then re-raised by the block
        finally:
            await self._orchestrator.teardown(state)
            await self._client_cm.__aexit__(None, None, None)

    async def turn(self, message: str | list[dict[str, Any]] | None = None) -> Segment:
        """Run one harness segment and return it.

        The opening turn is a bare ``turn()`` when the task has a prompt, ``turn(message)``
        when its prompt is None. Queued messages are delivered first, in order. After the
        rollout stopped, returns an empty terminated ``Segment`` without consuming ``message``.

        Raises:
            ValueError: the opening turn got the wrong form, or a later turn has no message
                and nothing is queued.
            RuntimeError: the interaction was not entered or is closed.
        """
        async with self._lock:
            return await self._turn(message)

    async def send(self, text: str, mode: Literal["steer", "queue"] = "steer",
                   message_id: str | None = None) -> Receipt:
        """Offer a user message while the agent works, or wake an idle interaction.

        ``steer`` is injected at the harness's next safe point (before its next model call);
        ``queue`` waits for the current turn to end and is delivered with the other pending
        messages, in order, at the start of the next turn. When no turn is running, the
        message starts a new turn in the background (``wait_idle`` waits for it).

        Returns:
            ``Receipt``: ``accepted`` says whether it was accepted for delivery (not whether
            it was acted on); ``reason`` says why not. The same ``message_id`` twice returns
            the first receipt and is delivered once.

        Raises:
            ValueError: empty text, unknown mode, or a ``message_id`` reused with other text.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError("send(text=...): text must be a non-empty string")
        if mode not in ("steer", "queue"):
            raise ValueError(f"send(mode={mode!r}): use 'steer' or 'queue'")
        message_id = message_id or uuid.uuid4().hex
        if (previous := self._sends.get(message_id)) is not None:
            if previous.text != text:
                raise ValueError(f"send(message_id={message_id!r}): already used for a different message")
            return previous.receipt
        state = self.state
        if state is None:
            raise RuntimeError("the interaction has not started; use it as `async with agent.interaction(task)`")
        refusal = None
        if self._closed or state.stopped:
            refusal = f"the interaction has stopped ({state.trace.stop_condition or 'closed'})"
        elif mode == "steer" and not state.harness.can_steer:
            refusal = f"harness {state.harness.id!r} cannot steer; send with mode='queue'"
        elif not self._opened and self.task.data.prompt is not None:
            refusal = "the opening turn() has not run yet; call turn() first"
        if refusal is not None:
            receipt = Receipt(accepted=False, message_id=message_id, mode=mode, reason=refusal)
            record = SendRecord(message_id=message_id, text=text, mode=mode, receipt=receipt, status="refused")
        elif self._active and mode == "steer":
            receipt = Receipt(accepted=True, message_id=message_id, mode=mode, reason="injected at the next safe point")
            record = SendRecord(message_id=message_id, text=text, mode=mode, receipt=receipt)
            state.steer_inbox.append(record)
        else:
            reason = "delivered at the start of the next turn" if self._active else "woke the idle interaction"
            receipt = Receipt(accepted=True, message_id=message_id, mode=mode, reason=reason)
            record = SendRecord(message_id=message_id, text=text, mode=mode, receipt=receipt)
            self._queue.append(record)
            if not self._active:
                self._wake()
        self._sends[message_id] = record
        state.trace.sends.append(record)
        return receipt

    async def wait_idle(self) -> None:
        """Wait until no delivery is pending or running (turns woken by ``send`` have finished)."""
        while self._drain is not None and not self._drain.done():
            await asyncio.shield(self._drain)

    async def _turn(self, message: str | list[dict[str, Any]] | None) -> Segment:
        state = self.state
        if state is None or self._closed:
            raise RuntimeError("the interaction is not open; call turn() inside `async with agent.interaction(task)`")
        limit = state.config.max_turns
        if limit is not None and state.turns >= limit:
            state.trace.stop("max_turns")
        if state.stopped:
            return Segment([], True)
        messages: list[dict[str, Any]] = []
        if not self._opened:
            has_prompt = self.task.data.prompt is not None
            if has_prompt and message is not None:
                raise ValueError("this task has a prompt: open the interaction with a bare turn()")
            if not has_prompt and message is None and not self._queue:
                raise ValueError("this task has no prompt: open the interaction with turn(message)")
            messages = opening_messages(self.task)
            self._opened = True
        elif message is None and not self._queue:
            raise ValueError("turn() needs a message (or a queued send) after the opening turn")
        index = len(state.trace.segments)
        for record in self._queue:
            messages.append({"role": "user", "content": record.text})
            record.status, record.delivered_segment = "delivered", index
        self._queue.clear()
        if isinstance(message, str):
            messages.append({"role": "user", "content": message})
        elif message is not None:
            messages.extend(dict(m) for m in message)
        self._active = True
        try:
            segment = await self._orchestrator.segment(state, messages)
        finally:
            self._active = False
        if limit is not None and state.turns >= limit and not state.stopped:
            state.trace.stop("max_turns")  # no further response can be sampled: the exchange is over
            state.trace.segments[-1].terminated = True
            segment = Segment(segment.messages, True, segment.last_reply)
        self._queue[:0] = state.steer_inbox  # steers that arrived after the last safe point
        state.steer_inbox.clear()
        if self._queue:
            self._wake()
        return segment

    async def _cancel_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain

    def _wake(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._run_queued())

    async def _run_queued(self) -> None:
        async with self._lock:
            while self._queue and not self._closed:
                await self._turn(None)

    async def _cancel_deliveries(self) -> None:
        """Cancel a running woken turn, wait for a caller's running turn, then drop pending sends."""
        await self._cancel_drain()
        async with self._lock:
            await self._cancel_drain()
        state = self.state
        for record in [*self._queue, *(state.steer_inbox if state else [])]:
            record.status = "cancelled"
        self._queue.clear()
        if state is not None:
            state.steer_inbox.clear()


async def open_client(config: AgentConfig) -> tuple[ModelClient, Any]:
    """The model client of ``config`` and the local model server it needs (or None); see
    ``model.open.open_client``."""
    return await open_model_client(config.model, config.client)


def redacted_config(config: AgentConfig) -> dict[str, Any]:
    """``config`` as a JSON dict with what may be a secret replaced by ``"***"``: header values
    and a password in ``base_url`` (of the agent's client and every judge's), and environment
    values (``runtime.env``, ``scoring.env``, ``scoring.runtime.env``) that are not pure
    ``${VAR}`` templates."""
    data = config.model_dump(mode="json")
    judge_clients = [judge["client"] for judge in data["scoring"]["judges"] if judge["client"] is not None]
    for client in [data["client"], *judge_clients]:
        client["headers"] = {key: "***" for key in client["headers"]}
        url = httpx.URL(client["base_url"])
        if url.password or url.username:
            client["base_url"] = str(url.copy_with(username="***", password=None))
    for table in (data["runtime"], data["scoring"], data["scoring"].get("runtime") or {}):
        if table.get("env"):
            table["env"] = {key: value if is_template(value) else "***" for key, value in table["env"].items()}
    return data
