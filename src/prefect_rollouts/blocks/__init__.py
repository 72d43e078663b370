"""Prefect blocks: ``ModelEndpoint`` (where a model is served, with its key) and ``TraceStore``.

Contract: configuration plus a small factory each, no workflow logic. A key lives only in the
block (a ``SecretStr``) and in memory while requests are made; configs name the block.
May import Prefect and core types; the core reaches this package only lazily.
"""

from prefect_rollouts.blocks.endpoints import ModelEndpoint, TraceStore, resolve_client, resolve_trace_path

__all__ = ["ModelEndpoint", "TraceStore", "resolve_client", "resolve_trace_path"]
