"""Opening a model client for a model name: a ``local/...`` server, a ``ModelEndpoint`` block, or a URL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prefect_rollouts.config.agent import ClientConfig
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.model.client import ModelClient
from prefect_rollouts.model.local import is_local

EndpointResolver = Callable[[ClientConfig], Awaitable[tuple[ClientConfig, "str | None"]]]
"""Turns a config naming ``endpoint`` into the resolved config and its API key (or None)."""

_resolver: EndpointResolver | None = None


def set_endpoint_resolver(resolver: EndpointResolver) -> None:
    """Register how ``client.endpoint`` names are resolved. The core has no resolver of its own;
    the Prefect layer (``prefect_rollouts.blocks``) registers one that loads ``ModelEndpoint``
    blocks when it is imported, so the core never imports Prefect."""
    global _resolver
    _resolver = resolver


async def open_client(model: str, config: ClientConfig) -> tuple[ModelClient, Any]:
    """The client for ``model`` on ``config``, and the local model server it needs (or None).

    ``local/...`` models start a llama.cpp server (``model/local.py``) that the caller stops
    with ``await server.stop()``; an endpoint named by ``config.endpoint`` is resolved by the
    registered resolver (``set_endpoint_resolver``; the Prefect layer's loads a block).

    Raises:
        ConfigError: an unknown local model, an endpoint named with no resolver registered, or
            a block that does not load.
        ProviderError: the local server did not come up.
    """
    server = None
    if is_local(model):
        from prefect_rollouts.model.local import LocalModelServer

        server = LocalModelServer(model)
        base_url = await server.start()
        config = config.model_copy(update={"base_url": base_url, "api_key_env": None, "endpoint": None})
    try:
        if config.endpoint is None:
            return ModelClient(config, local=server is not None), server
        if _resolver is None:
            raise ConfigError(f"client.endpoint = {config.endpoint!r}: a ModelEndpoint block needs the Prefect layer, "
                              "which is not loaded. Run with orchestrator = \"prefect\" or in an eval, import "
                              "prefect_rollouts.blocks first, or give base_url and api_key_env instead")
        resolved, key = await _resolver(config)
        return ModelClient(resolved, api_key=key), server
    except BaseException:
        if server is not None:
            await server.stop()
        raise
