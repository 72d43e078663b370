"""The wire dialects the interception endpoint serves, and which one a path belongs to."""

from __future__ import annotations

from prefect_rollouts.harnesses.dialects import Dialect
from prefect_rollouts.harnesses.dialects import chat as chat_dialect
from prefect_rollouts.harnesses.dialects import messages as messages_dialect
from prefect_rollouts.harnesses.dialects import responses as responses_dialect

DIALECTS: tuple[Dialect, ...] = (
    chat_dialect.DIALECT,
    responses_dialect.DIALECT,
    messages_dialect.DIALECT,
)
"""The wire dialects served, each on its ``paths`` (``harnesses/dialects``): one line per dialect."""


def dialect_of(path: str) -> Dialect:
    """The dialect whose error shape a refusal on ``path`` takes: Anthropic Messages' on ``/v1/messages``
    and below it (``count_tokens``), else OpenAI's (chat's)."""
    if path.rstrip("/") == "/v1/messages" or path.startswith("/v1/messages/"):
        return messages_dialect.DIALECT
    return next((dialect for dialect in DIALECTS if path in dialect.paths), chat_dialect.DIALECT)
