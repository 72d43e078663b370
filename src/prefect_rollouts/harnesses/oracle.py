"""The model-free harnesses that check a task rather than an agent: ``oracle`` and ``nop``.

``oracle`` applies the task's reference solution (``Task.solve``: a Harbor task copies
``solution/`` to ``/solution`` and runs ``solve.sh``) and ``nop`` does nothing. A sound task scores
full reward after the oracle and none after nop (``prefect-rollouts tasks check``). Neither calls a
model: an agent with one opens no model client and starts no local model server (``NoModelClient``).
Both end the rollout after their one segment; what the solution printed is on the task's trace info.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect_rollouts.config.agent import ClientConfig
from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.harnesses.base import SegmentContext


class NoModelClient:
    """Stands in for the model client of an agent whose harness never calls a model.

    ``complete`` raises: a judge or harness that tries to sample anyway gets a clear error.
    """

    def __init__(self, harness: str) -> None:
        self.harness = harness
        self.config = ClientConfig()

    async def complete(self, body: dict[str, Any]) -> Any:
        """Raises ``ConfigError``: this agent opened no model client."""
        raise ConfigError(f'[env.agent.harness] id = "{self.harness}" calls no model, so the agent opened no '
                          "model client; give judges a client of their own ([[env.agent.scoring.judges]] client)")

    async def aclose(self) -> None:
        """Nothing to close."""


class OracleHarness:
    """Runs ``Task.solve`` once in the runtime, within the agent deadline; a further turn does nothing.

    Raises (from ``run_segment``): ``AgentFailure`` when the solution failed on its own (``program_failed``,
    ``program_timeout``: scored by the task's tests, as Harbor scores its oracle); ``TaskError`` when the
    task has no solution or it could not start (``agent_exits``).
    """

    id = "oracle"
    can_steer = False

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.binds: dict[str, str] = {}
        self._solved = False

    async def open(self, ctx: SegmentContext) -> None:
        """Nothing to open."""

    async def run_segment(self, ctx: SegmentContext) -> None:
        """Apply the reference solution (first segment only), then kill what it left running, unless the task
        keeps the agent's processes for its tests (``Task.keeps_agent_processes``: Harbor's); a solution that
        failed or ran out of time is killed all the same."""
        if self._solved:
            return
        self._solved = True
        try:
            await ctx.task.solve(ctx.runtime, ctx.trace)
        except BaseException:
            if ctx.runtime is not None:
                await asyncio.shield(ctx.runtime.kill_all())
            raise
        if ctx.runtime is not None and not ctx.task.keeps_agent_processes:
            await asyncio.shield(ctx.runtime.kill_all())   # as after a program: nothing outlives the agent


class NopHarness:
    """Does nothing: the untouched box goes to scoring."""

    id = "nop"
    can_steer = False

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.binds: dict[str, str] = {}

    async def open(self, ctx: SegmentContext) -> None:
        """Nothing to open."""

    async def run_segment(self, ctx: SegmentContext) -> None:
        """Nothing to do."""
