"""``eval --retry-errors [TYPE,...]``: which token after the flag is its value (typer's parser has no
optional option values)."""

from __future__ import annotations

from pathlib import Path

import typer

RETRY_ALL = "all"
"""``eval --retry-errors`` without types (or with ``all``): every errored rollout runs again."""


def retry_errors_args(args: list[str]) -> list[str]:
    """``args`` of ``eval`` with ``--retry-errors`` given its value: the next token when it is a list of
    error type names (``_is_type_list``), else ``all`` (every type), the token keeping its own meaning
    (``--retry-errors eval.toml``: the config file).

    Raises:
        typer.BadParameter: a second type follows, separated by a space instead of a comma.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--retry-errors":
            value = args[i + 1] if i + 1 < len(args) and _is_type_list(args[i + 1]) else None
            out.append(f"--retry-errors={RETRY_ALL if value is None else value}")
            i += 1 if value is None else 2
        else:
            out.append(arg)
            i += 1
            value = arg.removeprefix("--retry-errors=") if arg.startswith("--retry-errors=") else None
        if value is not None and i < len(args) and _is_type_list(args[i]) and _names_known_types(args[i]):
            raise typer.BadParameter(f"{value} {args[i]}: separate error types with commas: "
                                     f"--retry-errors {value},{args[i]}", param_hint="--retry-errors")
    return out


def _is_type_list(token: str) -> bool:
    """Whether ``token`` reads as error type names separated by commas (``ProviderError,TaskError``): not
    an option, not a TOML file or an existing path (the config's place), each name an identifier."""
    if token.startswith("-") or token.endswith(".toml") or Path(token).exists():
        return False
    return all(part.strip().isidentifier() for part in token.split(",") if part.strip())


def _names_known_types(token: str) -> bool:
    from prefect_rollouts.retry_rule import known_error_types
    names = [part.strip() for part in token.split(",") if part.strip()]
    return bool(names) and set(names) <= set(known_error_types())
