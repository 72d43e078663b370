"""The ``ModelEndpoint`` block and how agent configs that name it are resolved."""

from __future__ import annotations

from typing import Any, cast

from prefect.blocks.core import Block
from pydantic import Field, SecretStr
from pydantic_core import PydanticCustomError

from prefect_rollouts.config.agent import ClientConfig
from prefect_rollouts.config.base import check_base_url
from prefect_rollouts.errors import ConfigError


class ModelEndpoint(Block):
    """An OpenAI-compatible model endpoint and its API key.

    Name it in an agent config instead of an environment variable; the key is read from the
    block when the agent opens and never reaches a trace, a flow run's parameters or a log.

    Example:
        ```python
        from prefect_rollouts.blocks import ModelEndpoint
        ModelEndpoint(base_url="http://127.0.0.1:8000/v1", api_key="sk-...").save("local-llm")
        ```
        then in TOML: ``[env.agent.client] endpoint = "local-llm"``.
    """

    _block_type_name = "Model Endpoint"
    _block_type_slug = "prefect-rollouts-model-endpoint"
    _description = "An OpenAI-compatible model endpoint (base URL, API key, headers) for prefect-rollouts."

    base_url: str = Field(description="Endpoint root; requests go to {base_url}/chat/completions.")
    api_key: SecretStr | None = Field(default=None, description="API key sent as a Bearer token.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (redacted from traces).")
    model: str | None = Field(default=None, description="Default model name served here (informational).")


async def resolve_client(config: ClientConfig) -> tuple[ClientConfig, str | None]:
    """Apply the ``ModelEndpoint`` block named by ``config.endpoint``.

    Returns:
        ``(client config, api key)``: the block's ``base_url`` and ``headers`` (fields set
        explicitly on ``config`` win) and the key in plain text, for the client's memory only.

    Raises:
        ConfigError: no such block, or its ``base_url`` is not an http(s) URL or holds a user
            name or password.
    """
    name = config.endpoint
    assert name is not None
    try:
        block = cast(ModelEndpoint, await ModelEndpoint.aload(name))
    except ValueError as exc:
        raise ConfigError(f"[env.agent.client] endpoint = {name!r}: no ModelEndpoint block with that name "
                          f"({exc}). Create it with ModelEndpoint(...).save({name!r})") from None
    update: dict[str, Any] = {}
    if "base_url" not in config.model_fields_set:
        try:   # userinfo would be sent as Basic auth (base64 of user:password), the key not as Bearer
            update["base_url"] = check_base_url(block.base_url)
        except PydanticCustomError as exc:
            shown = "" if exc.type == "secret_in_url" else f"{block.base_url!r}: "   # the message masks a password
            raise ConfigError(f"ModelEndpoint block {name!r}: base_url = {shown}{exc.message()}") from None
    update["headers"] = {**{key: SecretStr(value) for key, value in block.headers.items()}, **config.headers}
    key = block.api_key.get_secret_value() if block.api_key is not None else None
    return config.model_copy(update=update), key
