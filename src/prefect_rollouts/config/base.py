"""The config pieces every config module shares: the strict base model, ``RetryConfig``,
``ClientConfig``, ``SamplingConfig``, and the wording of validation errors.

``agent.py`` (the agent) and ``judge.py`` (judges, which have their own client and
sampling) both build on it, so neither imports the other's internals.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, SecretStr, SerializationInfo, field_validator
from pydantic_core import PydanticCustomError

from prefect_rollouts.bounds import MAX_DEADLINE_S, MAX_RETRIES
from prefect_rollouts.config.env import is_template

MASK = "***"
"""What a secret value reads as wherever a config is written out (JSON dumps, stored configs)."""

REVEAL_SECRETS = {"reveal_secrets": True}
"""Serialization context (``model_dump(mode="json", context=REVEAL_SECRETS)``) that keeps literal
environment values: for code that compares configs in memory, never for anything stored or sent."""


def _mask_literal_values(env: dict[str, str], info: SerializationInfo) -> dict[str, str]:
    if info.mode_is_json() and not (info.context or {}).get("reveal_secrets"):
        return {name: value if is_template(value) else MASK for name, value in env.items()}
    return dict(env)


EnvTable = Annotated[dict[str, str], PlainSerializer(_mask_literal_values)]
"""An environment table (``[env.agent.runtime] env``, ``[env.agent.scoring] env``): values are
literal or ``${VAR}`` / ``${VAR:-default}`` templates, resolved from the environment of the process
that starts the runtime or scoring (``config.env.resolve_env``). A literal value may be a secret, so
every JSON dump shows it as ``"***"`` (templates as written): that is what the Prefect server stores
as a flow run's parameters. Where a config must travel as JSON (a work pool's shards, a deployment),
literal values are refused."""


def check_base_url(url: str) -> str:
    """Return ``url`` when it is an ``http(s)://host[:port]/...`` URL without user name or password.

    Raises:
        PydanticCustomError: not such a URL; the message names the fix and never the password
            (type ``"secret_in_url"`` for userinfo, ``"url"`` otherwise).
    """
    try:
        parts = urlsplit(url)
        _ = parts.port   # raises ValueError on a port out of range
    except ValueError:
        parts = None
    if parts is not None and (parts.username is not None or parts.password is not None):
        shown = parts._replace(netloc=f"{MASK}@{parts.netloc.rpartition('@')[2]}").geturl()
        raise PydanticCustomError("secret_in_url", f"{shown!r}: holds a user name or password, which would be "
                                  "sent as Basic auth and stored with the run's parameters. Remove it from the "
                                  "URL: name the variable holding the key in api_key_env, or put the key in a "
                                  'ModelEndpoint block and set endpoint = "<block name>"')
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise PydanticCustomError("url", 'not an http(s) URL. Give the endpoint root, e.g. '
                                  '"http://127.0.0.1:8000/v1" or "https://api.openai.com/v1"')
    return url


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True,
                              allow_inf_nan=False)


class RetryConfig(ConfigModel):
    """How often and how patiently to retry a retryable failure.

    Used by ``ScoringConfig.retries`` (isolated scoring; the seed's default ``max_retries=2``)
    and ``ClientConfig.retries`` (model requests). Backoff before retry ``n`` (0-based) is
    ``min(backoff_s * 2**n, max_backoff_s)`` scaled by a random factor in [0.5, 1.5]; a
    ``Retry-After`` header from the server wins when it is longer.
    """

    max_retries: int = Field(2, ge=0, le=MAX_RETRIES)
    """Retries after the first attempt; 0 disables retrying."""
    backoff_s: float = Field(0.5, ge=0, le=MAX_DEADLINE_S)
    """Wait before the first retry, in seconds; doubles on each further retry."""
    max_backoff_s: float = Field(30.0, ge=0, le=MAX_DEADLINE_S)
    """Upper bound of a single wait, in seconds."""
    max_elapsed_s: float | None = Field(None, gt=0, le=MAX_DEADLINE_S)
    """Stop retrying once this many seconds have passed since the first attempt; None = no bound."""


PRICE_MAX = 1_000_000.0
"""The largest price, USD per million tokens (a dollar a token, far past any model's): a larger one is a
typo, and one near ``1e308`` made every cost ``inf``."""


class PriceConfig(ConfigModel):
    """What a client's tokens cost, in USD per million tokens, as the user's provider bills them
    (``[env.agent.client] price = { input = 3.0, output = 15.0, cached_input = 0.3, cache_write = 3.75 }``).
    There is no built-in price table: a cost is only ever computed from prices given here
    (``pricing.call_cost_usd``)."""

    input: float = Field(ge=0, le=PRICE_MAX, allow_inf_nan=False)
    """Prompt tokens not served from the cache."""
    output: float = Field(ge=0, le=PRICE_MAX, allow_inf_nan=False)
    """Completion tokens; reasoning tokens are completion tokens and bill at this price."""
    cached_input: float | None = Field(None, ge=0, le=PRICE_MAX, allow_inf_nan=False)
    """Prompt tokens the server served from its cache (``cached_tokens``); None: billed as ``input``."""
    cache_write: float | None = Field(None, ge=0, le=PRICE_MAX, allow_inf_nan=False)
    """Prompt tokens written to the cache, where the server reports them; None: billed as ``input``."""


class ClientConfig(ConfigModel):
    """A model provider's endpoint and the wire API spoken to it. The API key is read from
    ``api_key_env`` at request time."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """Endpoint root; requests go to ``{base_url}/chat/completions``, ``/responses`` or ``/messages``
    (``api``). Usually ends in ``/v1``. An ``http(s)`` URL without user name or password (a key goes in
    ``api_key_env`` or a block)."""
    api: Literal["chat", "responses", "messages"] = "chat"
    """The wire API spoken to the provider (``model.apis``): ``"chat"`` (OpenAI chat completions: every
    OpenAI-compatible server), ``"responses"`` (OpenAI Responses: reasoning items resent as they came),
    ``"messages"`` (Anthropic Messages, ``x-api-key`` auth: thinking blocks and cache marks resent as
    they came). docs/providers.md says which to choose."""
    stream: bool = False
    """Ask for a streamed response (server-sent events) and assemble it (``model.sse``). The result and
    the trace are the same; turn it on for a provider or gateway that cuts a long non-streamed request
    (an idle read past its proxy's timeout: long reasoning, large ``max_tokens``) or serves some models
    only streamed. ``timeout`` still bounds the whole response."""
    api_key_env: str | None = Field("OPENAI_API_KEY", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    """Name of the environment variable holding the API key, read at each request. None or ``""``:
    a keyless server. A named variable that is unset sends no auth header and logs a warning once."""
    headers: dict[str, SecretStr] = {}
    """Extra HTTP headers. Their values are secrets: never in traces, Parquet, logs or Prefect
    flow-run parameters (which show ``**********``). A deployment therefore cannot carry them
    as parameters: put them in a ``ModelEndpoint`` block (``endpoint``)."""

    def header_values(self) -> dict[str, str]:
        """``headers`` with their secret values, for the HTTP client."""
        return {key: value.get_secret_value() for key, value in self.headers.items()}
    endpoint: str | None = None
    """Name of a ``ModelEndpoint`` Prefect block supplying ``base_url``, the API key and headers
    (fields set here win); the key then comes from the block, not ``api_key_env``."""
    timeout: float = Field(600.0, gt=0, le=MAX_DEADLINE_S)
    """Per-request timeout in seconds (connect, read and write each)."""
    retries: RetryConfig = RetryConfig(max_retries=5, backoff_s=0.5, max_backoff_s=30.0, max_elapsed_s=300.0)
    """Retries on 429, 5xx, connect and read errors."""
    max_connections: int = Field(64, ge=1)
    """Size of the agent's connection pool; keep it near your rollout concurrency."""
    price: PriceConfig | None = None
    """USD per million tokens of this client's calls (``PriceConfig``): the traces' ``cost_usd`` and an
    eval's ``cost_budget_usd`` come from it. None: its calls have no cost (and no cost budget can be set)."""

    @field_validator("base_url")
    @classmethod
    def _http_url_without_userinfo(cls, value: str) -> str:
        return check_base_url(value)


class SamplingConfig(ConfigModel):
    """Sampling parameters sent with every request; None leaves the server default."""

    temperature: float | None = None
    """Sampling temperature sent with each request (the server's range, usually 0 to 2)."""
    top_p: float | None = None
    """Nucleus sampling: the probability mass of the tokens sampled from (0 to 1)."""
    max_tokens: int | None = Field(None, ge=1)
    """Completion token cap per request; ``max_turn_tokens`` wins when both are set."""
    seed: int | None = None
    """Sampling seed sent with each request, for servers that honour one."""
    tool_choice: str | dict[str, Any] | None = None
    """``"auto"``, ``"required"``, ``"none"`` or a named function; sent only when tools are offered."""
    extra: dict[str, Any] = {}
    """Further request-body keys, sent as they are (e.g. ``{"stop": ["\\n\\n"]}``)."""

    def request_keys(self) -> dict[str, Any]:
        """The standard sampling keys that are set (``temperature``, ``top_p``, ``seed``,
        ``max_tokens``); ``tool_choice`` and ``extra`` are the caller's to add."""
        return {key: value for key in ("temperature", "top_p", "seed", "max_tokens")
                if (value := getattr(self, key)) is not None}


#: Tags of the judge config union; pydantic puts them in error locations, which ``explain_error`` drops.
JUDGE_TAGS = ("reference", "rubric", "plugin")


def explain_error(err: Any, section: str) -> str:
    loc: list[str] = []
    tagged = False
    for part in err["loc"]:
        if isinstance(part, int) and loc:
            loc[-1] += f"[{part}]"      # judges[0]: the first [[...judges]] entry
        elif str(part).startswith("function-"):
            continue
        elif loc and loc[-1].endswith("]") and part in JUDGE_TAGS and not tagged:
            tagged = True                  # the union member pydantic tried, right after the index
        else:
            loc.append(str(part))
    tables = ([section] if section else []) + loc[:-1]
    key = loc[-1] if loc else "(table)"
    where = f"[{'.'.join(tables)}] {key}" if tables else key
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key. Remove it or check its spelling against the documented keys"
    if err["type"] == "missing":
        return f"{where}: required key is missing. Add it"
    if err["type"] == "value_error" and not loc and section == "":
        return str(err["ctx"]["error"])   # a whole-config rule whose message names its own keys
    value = err.get("input")
    if err["type"] == "secret_in_url":   # the message shows the value itself, its password masked
        return f"{where} = {err['msg']}"
    shown = "" if isinstance(value, dict) else f" = {value!r}"
    message = str(err["msg"]).removeprefix("Value error, ")   # a validator's own message names the fix
    own_fix = message != err["msg"] or err["type"] == "url"   # a validator's message that names its fix
    return f"{where}{shown}: {message}" if own_fix else f"{where}{shown}: {message}. Fix the value"
