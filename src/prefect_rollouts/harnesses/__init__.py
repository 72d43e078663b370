"""Harnesses: what drives the model through a segment.

In this process: ``chat`` (one response) and ``tools`` (the tool loop); without a model: ``oracle``
(the task's reference solution) and ``nop`` (nothing), which check a task. In the runtime: the program
harnesses (``program``, ``bash``, ``mini-swe-agent``), whose model calls reach the agent's
interception endpoint (``endpoint.py``). Contract: ``Harness`` in ``base.py``; ``make_harness`` maps
``HarnessConfig.id`` to a class. A harness appends to ``ctx.trace`` and stops it via ``trace.stop``.
Must not import Prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.harnesses.base import Harness, SegmentContext
from prefect_rollouts.harnesses.chat import ChatHarness
from prefect_rollouts.harnesses.oracle import NopHarness, OracleHarness
from prefect_rollouts.harnesses.tools import ToolsHarness

if TYPE_CHECKING:
    from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint

__all__ = ["Harness", "SegmentContext", "make_harness"]

HARNESSES: dict[str, type[ChatHarness] | type[ToolsHarness] | type[OracleHarness] | type[NopHarness]] = {
    "chat": ChatHarness, "tools": ToolsHarness, "oracle": OracleHarness, "nop": NopHarness}
"""The in-process harnesses: ``HarnessConfig.id`` -> class. Every other id is a program harness."""


def make_harness(config: HarnessConfig, endpoint: InterceptionEndpoint | None = None) -> Harness:
    """A new harness instance (one per rollout) for ``config.id``; a program harness needs the
    agent's started interception ``endpoint``.

    Raises:
        ConfigError: a program harness without an endpoint.
    """
    if config.is_program:
        from prefect_rollouts.harnesses.program import ProgramHarness  # starlette/uvicorn load only here

        return ProgramHarness(config, endpoint)
    return HARNESSES[config.id](config)
