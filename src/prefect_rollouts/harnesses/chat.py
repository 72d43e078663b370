"""The ``chat`` harness: one model response per segment, no tools, no steering."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_rollouts.config import HarnessConfig
from prefect_rollouts.harnesses.base import request_template, sample

if TYPE_CHECKING:
    from prefect_rollouts.stages import RolloutState


class ChatHarness:
    """Samples exactly one assistant message per segment. It has no safe point, so it cannot steer."""

    id = "chat"
    can_steer = False

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self.template: dict[str, Any] = {}

    async def open(self, state: RolloutState) -> None:
        """Build the request template (model and sampling)."""
        self.template = request_template(state.config)

    async def run_segment(self, state: RolloutState) -> None:
        """One model call on the conversation so far."""
        await sample(state, self.template)
