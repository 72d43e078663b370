"""Harnesses: what drives the model through a segment (``chat``: one response; ``tools``: the loop).

Contract: ``Harness`` in ``base.py``; ``make_harness`` maps ``HarnessConfig.id`` to a class.
A harness sees a ``SegmentContext``, appends to ``ctx.trace`` and stops it via ``trace.stop``. Must not import Prefect.
"""

from __future__ import annotations

from prefect_rollouts.config import HarnessConfig
from prefect_rollouts.harnesses.base import Harness, SegmentContext
from prefect_rollouts.harnesses.chat import ChatHarness
from prefect_rollouts.harnesses.tools import ToolsHarness

__all__ = ["Harness", "SegmentContext", "make_harness"]

HARNESSES: dict[str, type[ChatHarness] | type[ToolsHarness]] = {"chat": ChatHarness, "tools": ToolsHarness}
"""The registry: ``HarnessConfig.id`` -> harness class."""


def make_harness(config: HarnessConfig) -> Harness:
    """A new harness instance (one per rollout) for ``config.id``."""
    return HARNESSES[config.id](config)

