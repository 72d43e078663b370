"""What of a config is a secret, and the config with it replaced by ``"***"``.

A trace's ``info["agent"]``, a run's stored config, a Prefect parameter and a log line only ever
hold the redacted form: header values, a password in a ``base_url`` (the agent's client's and
every judge's), and environment values that are not pure ``${VAR}`` templates (literal env values
are ``"***"`` in every JSON dump already: ``config.base.EnvTable``). Must not import Prefect.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx

from prefect_rollouts.config.agent import AgentConfig
from prefect_rollouts.config.base import REVEAL_SECRETS
from prefect_rollouts.config.env import is_template

if TYPE_CHECKING:   # the eval config loads only where an eval is run, not with the agent
    from prefect_rollouts.config.eval import EvalConfig

_ABSENT = object()


def redact_agent_config(config: AgentConfig) -> dict[str, Any]:
    """``config`` as a JSON dict with what may be a secret replaced by ``"***"``: header values
    and a password in ``base_url`` (of the agent's client and every judge's), and environment
    values (``runtime.env``, ``scoring.env``, ``scoring.runtime.env``) that are not pure
    ``${VAR}`` templates."""
    data = config.model_dump(mode="json")
    judge_clients = [judge["client"] for judge in data["scoring"]["judges"] if judge["client"] is not None]
    for client in [data["client"], *judge_clients]:
        client["headers"] = {key: "***" for key in client["headers"]}
        url = httpx.URL(client["base_url"])
        if url.password or url.username:
            client["base_url"] = str(url.copy_with(username="***", password=None))
    for table in (data["runtime"], data["scoring"], data["scoring"].get("runtime") or {}):
        if table.get("env"):
            table["env"] = {key: value if is_template(value) else "***" for key, value in table["env"].items()}
    return data


def redact_eval_config(config: EvalConfig) -> tuple[dict[str, Any], list[str]]:
    """``config`` as JSON with every secret replaced by ``"***"`` (``redact_agent_config``: header
    values, a password in a ``base_url``, environment values that are not ``${VAR}`` templates).

    Returns:
        ``(data, redacted)``: the JSON dict and the dotted keys whose values were replaced.
    """
    data = config.model_dump(mode="json")   # literal env values are "***" already (config.base.EnvTable)
    data["env"]["agent"] = redact_agent_config(config.env.agent)
    plain = dict(leaves(config.model_dump(mode="json", context=REVEAL_SECRETS)))
    redacted = [render_key(key) for key, value in leaves(data) if plain.get(key, _ABSENT) != value]
    return data, redacted


def leaves(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(key path, value)`` of every leaf; an empty dict or list is a leaf."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (*prefix, str(key)))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from leaves(item, (*prefix, index))
    else:
        yield prefix, value


def render_key(key: tuple[Any, ...]) -> str:
    """A key path as the dotted key of a message: ``("env", "tasksets", 0, "id")`` is ``env.tasksets[0].id``."""
    text = ""
    for part in key:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
