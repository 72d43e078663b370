"""``${VAR}`` and ``${VAR:-default}`` templates in ``scoring.env``, resolved from the host environment."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from prefect_rollouts.errors import ScoringEnvError

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(env: Mapping[str, str], host: Mapping[str, str] | None = None) -> dict[str, str]:
    """Resolve every ``${VAR}`` / ``${VAR:-default}`` in the values of ``env``.

    ``${VAR:-default}`` uses ``default`` when VAR is unset or empty (the shell's rule);
    ``$$`` is not special. Called when scoring starts, so the value is the one scoring sees.

    Args:
        env: Variable name -> template, e.g. ``{"TOKEN": "${JUDGE_TOKEN}"}``.
        host: Environment to read; default ``os.environ``.

    Raises:
        ScoringEnvError: a ``${VAR}`` without default names a variable that is unset.
    """
    host = os.environ if host is None else host
    resolved = {}
    for name, template in env.items():
        def substitute(match: re.Match[str], name: str = name, template: str = template) -> str:
            var, default = match.group(1), match.group(2)
            value = host.get(var)
            if default is not None:
                return value if value else default
            if value is None:
                raise ScoringEnvError(
                    f'scoring.env.{name} = "{template}": {var} is not set where scoring runs. '
                    f'Export it, or write "${{{var}:-}}" to allow an empty value')
            return value
        resolved[name] = _TEMPLATE.sub(substitute, template)
    return resolved


def is_template(value: str) -> bool:
    """True when ``value`` is made only of ``${...}`` references (safe to show in a trace)."""
    return bool(value) and _TEMPLATE.sub("", value) == ""
