"""The ``chat`` harness: one model response per segment, no tools, no steering."""

from __future__ import annotations

from typing import Any

from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.harnesses.base import SegmentContext, request_template, sample


class ChatHarness:
    """Samples exactly one assistant message per segment. It has no safe point, so it cannot steer."""

    id = "chat"
    can_steer = False
    binds: dict[str, str] = {}

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.template: dict[str, Any] = {}

    async def open(self, ctx: SegmentContext) -> None:
        """Build the request template (model and sampling)."""
        self.template = request_template(ctx.config)

    async def run_segment(self, ctx: SegmentContext) -> None:
        """One model call on the conversation so far."""
        await sample(ctx, self.template)
