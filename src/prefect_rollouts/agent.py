"""The public entry points: ``make_agent``, ``Agent.run`` and ``Agent.interaction``.

An ``Agent`` owns one model client (one connection pool) shared by all its rollouts. Each
rollout is a ``Rollout`` (``rollout.py``): ``run()`` drives it whole, an ``Interaction`` turn by
turn; failures are data on the returned trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import uuid
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, cast

from prefect_rollouts.config.agent import AgentConfig
from prefect_rollouts.config.redact import redact_agent_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.harnesses.oracle import NoModelClient
from prefect_rollouts.model import ModelClient
from prefect_rollouts.model.open import open_client
from prefect_rollouts.rollout import Rollout
from prefect_rollouts.rollout_state import RolloutState, Segment, new_state, opening_messages
from prefect_rollouts.runtimes.egress.proxy import EgressProxy
from prefect_rollouts.scoring.judges import JudgeClients, client_key, open_judges
from prefect_rollouts.task import Task
from prefect_rollouts.trace import Receipt, SendRecord, Trace

if TYPE_CHECKING:
    from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint

PREFECT_LAYER = {"blocks": "prefect_rollouts.blocks", "rollout": "prefect_rollouts.flows.rollout"}
"""What ``orchestrator = "prefect"`` needs from the Prefect layer, by module name: ``blocks`` (resolves
endpoint blocks once imported) and the rollout flow (``run_rollout_flow``, ``FlowChannel``). The core sits
below that layer and never imports it (DESIGN.md: what the core needs from it is injected); it loads
these by name when a rollout starts, as Prefect loads a deployment's entrypoint, so ``import
prefect_rollouts`` stays Prefect-free and the package graph stays one-way (``docs/architecture.md``)."""


def _prefect_layer(part: Literal["blocks", "rollout"]) -> ModuleType:
    """The Prefect layer's module ``PREFECT_LAYER[part]``, imported on first use."""
    return importlib.import_module(PREFECT_LAYER[part])


@dataclass(eq=False)
class _Services:
    """What an open agent shares among its rollouts: the model client and its local server (or
    None), the judge clients, the interception endpoint (program harnesses, else None) and the
    egress proxy (it listens only once a runtime's network policy has rules)."""

    client: ModelClient
    server: Any
    judges: JudgeClients
    endpoint: InterceptionEndpoint | None = None
    egress: EgressProxy = field(default_factory=EgressProxy)

    async def aclose(self) -> None:
        """Stop the egress proxy and the interception endpoint, close the judge clients, then the
        model client, then stop the local server; each on every path."""
        async with contextlib.AsyncExitStack() as stack:   # callbacks run last-registered first
            if self.server is not None:
                stack.push_async_callback(self.server.stop)
            stack.push_async_callback(self.client.aclose)
            stack.push_async_callback(self.judges.aclose)
            if self.endpoint is not None:
                stack.push_async_callback(self.endpoint.stop)
            stack.push_async_callback(self.egress.stop)

    def state(self, config: AgentConfig, task: Task, info: dict[str, Any], labels: dict[str, str] | None = None
              ) -> RolloutState:
        """A new rollout's ``RolloutState`` on these services."""
        return new_state(config, task, self.client, agent_info=info, labels=labels, judge_clients=self.judges,
                         endpoint=self.endpoint, egress=self.egress)


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
        self.info = redact_agent_config(config)
        self._services: _Services | None = None

    async def __aenter__(self) -> Agent:
        if self._services is not None:
            raise RuntimeError("this Agent is already open; enter it once")
        self._services = await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        services, self._services = self._services, None
        if services is not None:
            await services.aclose()

    async def _open(self) -> _Services:
        """The agent's ``_Services``; for a program harness with its endpoint started. The agent's
        own judges are imported and opened here, so a bad judge fails before any rollout runs."""
        if self.config.orchestrator == "prefect":   # Prefect loads only here; it resolves endpoint blocks
            _prefect_layer("blocks")
        if self.config.harness.uses_model:
            client, server = await open_client(self.config.model, self.config.client)
            shared = {client_key(self.config.model, self.config.client): client}
        else:   # oracle, nop: no client, no local model server
            client, server, shared = cast(ModelClient, NoModelClient(self.config.harness.id)), None, {}
        services = _Services(client, server, JudgeClients(shared, default_client=self.config.client))
        try:
            await open_judges(self.config.scoring.judges, services.judges)
            if self.config.harness.is_program:
                from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint as Endpoint  # loads uvicorn

                services.endpoint = Endpoint()
                await services.endpoint.start()
        except BaseException:
            await services.aclose()
            raise
        return services

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
        async with self._borrow() as services:
            rollout = Rollout(services.state(self.config, task, self.info))
            if self.config.orchestrator == "prefect":
                trace: Trace = await _prefect_layer("rollout").run_rollout_flow(rollout)   # Prefect loads here
                return trace
            return await rollout.run()

    def rollout(self, task: Task, labels: dict[str, str] | None = None) -> Rollout:
        """A new, unopened ``Rollout`` of ``task`` on this open agent's client, run inline unless its
        ``orchestrator`` is replaced (``eval_flow`` and ``rollout_flow`` do).

        Raises:
            RuntimeError: the agent is not open.
        """
        if self._services is None:
            raise RuntimeError("the agent is not open; use `async with make_agent(config) as agent:`")
        return Rollout(self._services.state(self.config, task, self.info, labels))

    @property
    def client(self) -> ModelClient:
        """The agent's model client (its connection pool); the agent must be entered.

        Raises:
            RuntimeError: the agent is not open.
        """
        if self._services is None:
            raise RuntimeError("the agent is not open; use `async with make_agent(config) as agent:`")
        return self._services.client

    def interaction(self, task: Task) -> Interaction:
        """Open a turn-by-turn rollout of ``task``: ``async with agent.interaction(task) as it:``."""
        return Interaction(self, task)

    @contextlib.asynccontextmanager
    async def _borrow(self) -> Any:
        """The agent's ``_Services``, or for an un-entered agent a set for this rollout only."""
        if self._services is not None:
            yield self._services
            return
        services = await self._open()
        try:
            yield services
        finally:
            await services.aclose()


class Interaction:
    """One open rollout driven by the caller, who plays the user.

    ``turn()`` runs one harness segment; ``send()`` delivers messages while the agent works
    (``steer``) or at the next turn boundary (``queue``). Leaving the ``async with`` block
    cancels outstanding deliveries, then finalizes and scores; ``trace`` is then complete.
    """

    def __init__(self, agent: Agent, task: Task) -> None:
        self.agent = agent
        self.task = task
        self.rollout: Rollout | None = None
        self._channel: Any = None
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
        if self.rollout is None:
            raise RuntimeError("the interaction has not started; use it as `async with agent.interaction(task)`")
        return self.rollout.trace

    async def __aenter__(self) -> Interaction:
        if self.rollout is not None:
            raise RuntimeError("an Interaction runs one rollout; call agent.interaction(task) again for another")
        self._client_cm = self.agent._borrow()
        services = await self._client_cm.__aenter__()
        rollout = self.rollout = Rollout(services.state(self.agent.config, self.task, self.agent.info))
        if self.agent.config.orchestrator == "prefect":
            rollout.orchestrator = self._channel = _prefect_layer("rollout").FlowChannel(rollout)   # Prefect loads here
        self.task = rollout.task   # the rollout's own copy, whose setup state the caller may read
        try:
            await rollout.open()
        except BaseException:
            await self._release()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        rollout = self.rollout
        assert rollout is not None
        self._closed = True
        try:
            await self._cancel_deliveries()
            if exc is None:
                rollout.stop("user_closed")
                await rollout.close()
            elif not isinstance(exc, asyncio.CancelledError):
                rollout.record_error(exc, "interaction")  # recorded, then re-raised by the block
        finally:
            await self._release()

    async def _release(self) -> None:
        """Teardown (if not done), end the background flow run (under Prefect), release the client;
        each on every path."""
        assert self.rollout is not None
        async with contextlib.AsyncExitStack() as stack:   # callbacks run last-registered first
            stack.push_async_callback(self._client_cm.__aexit__, None, None, None)
            if self._channel is not None:
                stack.push_async_callback(self._channel.aclose)
            stack.push_async_callback(self.rollout.teardown)

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
        rollout = self.rollout
        if rollout is None:
            raise RuntimeError("the interaction has not started; use it as `async with agent.interaction(task)`")
        refusal = None
        if self._closed or rollout.stopped:
            refusal = f"the interaction has stopped ({rollout.trace.stop_condition or 'closed'})"
        elif mode == "steer" and not rollout.can_steer:
            refusal = f"harness {rollout.harness_id!r} cannot steer; send with mode='queue'"
        elif not self._opened and self.task.data.prompt is not None:
            refusal = "the opening turn() has not run yet; call turn() first"
        if refusal is not None:
            receipt = Receipt(accepted=False, message_id=message_id, mode=mode, reason=refusal)
            record = SendRecord(message_id=message_id, text=text, mode=mode, receipt=receipt, status="refused")
        elif self._active and mode == "steer":
            receipt = Receipt(accepted=True, message_id=message_id, mode=mode, reason="injected at the next safe point")
            record = SendRecord(message_id=message_id, text=text, mode=mode, receipt=receipt)
            rollout.steer(record)
        else:
            reason = "delivered at the start of the next turn" if self._active else "woke the idle interaction"
            receipt = Receipt(accepted=True, message_id=message_id, mode=mode, reason=reason)
            record = SendRecord(message_id=message_id, text=text, mode=mode, receipt=receipt)
            self._queue.append(record)
            if not self._active:
                self._wake()
        self._sends[message_id] = record
        rollout.trace.sends.append(record)
        return receipt

    async def wait_idle(self) -> None:
        """Wait until no delivery is pending or running (turns woken by ``send`` have finished)."""
        while self._drain is not None and not self._drain.done():
            await asyncio.shield(self._drain)

    async def _turn(self, message: str | list[dict[str, Any]] | None) -> Segment:
        rollout = self.rollout
        if rollout is None or self._closed:
            raise RuntimeError("the interaction is not open; call turn() inside `async with agent.interaction(task)`")
        if rollout.is_over():   # also applies the turn cap
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
        index = len(rollout.trace.segments)
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
            segment = rollout.end_turn(await rollout.turn(messages))   # the cap reached ends the exchange
        finally:
            self._active = False
        self._queue[:0] = rollout.take_steers()  # steers that arrived after the last safe point
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
        leftover = self.rollout.take_steers() if self.rollout is not None else []
        for record in [*self._queue, *leftover]:
            record.status = "cancelled"
        self._queue.clear()
