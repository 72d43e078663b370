"""Opening a model client for a model name: a ``local/...`` server, a ``ModelEndpoint`` block, or a URL."""

from __future__ import annotations

from typing import Any

from prefect_rollouts.config import ClientConfig
from prefect_rollouts.model.client import ModelClient
from prefect_rollouts.model.local import is_local


async def open_client(model: str, config: ClientConfig) -> tuple[ModelClient, Any]:
    """The client for ``model`` on ``config``, and the local model server it needs (or None).

    ``local/...`` models start a llama.cpp server (``model/local.py``) that the caller stops
    with ``await server.stop()``; a ``ModelEndpoint`` block named by ``config.endpoint`` is
    loaded here (that imports Prefect).

    Raises:
        ConfigError: an unknown local model, or a block that does not load.
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
            return ModelClient(config), server
        from prefect_rollouts.blocks import resolve_client

        resolved, key = await resolve_client(config)
        return ModelClient(resolved, api_key=key), server
    except BaseException:
        if server is not None:
            await server.stop()
        raise
