"""The model client: OpenAI-compatible ``/chat/completions`` over httpx, with retries.

Contract: ``ModelClient.complete(body) -> Completion`` or ``ProviderError``. One client (one
connection pool) per agent. Must not import Prefect.
"""

from prefect_rollouts.model.client import Completion, ModelClient

__all__ = ["Completion", "ModelClient"]
