"""``${VAR}`` and ``${VAR:-default}`` templates in every env table (``scoring.env``, ``runtime.env``),
resolved from the host environment. The one resolver: the runtimes and scoring both call it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from prefect_rollouts.errors import ScoringEnvError

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def template_variables(template: str) -> list[str]:
    """The names of the variables ``template`` reads (``${VAR}`` and ``${VAR:-default}``), in order."""
    return [match.group(1) for match in _TEMPLATE.finditer(template)]


def resolve_env(env: Mapping[str, str], host: Mapping[str, str] | None = None, *, table: str = "scoring.env",
                place: str = "where scoring runs") -> dict[str, str]:
    """Resolve every ``${VAR}`` / ``${VAR:-default}`` in the values of ``env``.

    ``${VAR:-default}`` uses ``default`` when VAR is unset or empty (the shell's rule);
    ``$$`` is not special. Called when scoring starts (or a runtime), so the value is the one it sees.

    Args:
        env: Variable name -> template, e.g. ``{"TOKEN": "${JUDGE_TOKEN}"}``.
        host: Environment to read; default ``os.environ``.
        table: The config key of ``env``, named in the error (e.g. ``[env.agent.runtime] env``).
        place: Where the variable must be set, named in the error (e.g. ``where the runtime starts``).

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
                    f'{table}.{name} = "{template}": {var} is not set {place}. '
                    f'Export it, or write "${{{var}:-}}" to allow an empty value')
            return value
        resolved[name] = _TEMPLATE.sub(substitute, template)
    return resolved


def is_template(value: str) -> bool:
    """True when ``value`` is made only of ``${...}`` references (safe to show in a trace)."""
    return bool(value) and _TEMPLATE.sub("", value) == ""
