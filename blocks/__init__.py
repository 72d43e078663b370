"""Prefect blocks: ``ModelEndpoint`` (where a model is served, with its key) and ``TraceStore``
(where the trace dataset is: a directory or an object store, with its credentials).

Contract: configuration plus a small factory each, no workflow logic. A key lives only in the
block (a ``SecretStr``) and in memory while requests are made; configs name the block.
May import Prefect and core types; the core never imports it: importing it registers the
endpoint resolver with the core (``model.open.set_endpoint_resolver``).
"""

from prefect_rollouts.blocks.endpoints import ModelEndpoint, resolve_client
from prefect_rollouts.blocks.trace_store import TraceStore, resolve_trace_path, resolve_trace_root
from prefect_rollouts.model.open import set_endpoint_resolver

set_endpoint_resolver(resolve_client)   # the core resolves client.endpoint through this layer, never imports it

__all__ = ["ModelEndpoint", "TraceStore", "resolve_client", "resolve_trace_path", "resolve_trace_root"]
