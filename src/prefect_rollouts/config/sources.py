"""Where a config comes from, in order of precedence: reading TOML, ``--set`` items, and the
list of sources an eval's config is merged from.

An eval's config is one or more ``Source`` objects merged in order, each later one winning key by
key (a table merges into a table; any other value, lists included, replaces): the TOML file or
the stored config of the run being resumed, then the ``--set`` items, then (from the UI) the launch
form's values. ``merge`` is the only place that rule is written; ``config.eval.load_eval_config``,
``evals.identity.stored_eval_config`` and ``evals.launch_form.LaunchForm.to_eval_config`` build their
configs from it. Must not import Prefect.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from prefect_rollouts.config.base import explain_error
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.nesting import MAX_JSON_DEPTH, toml_loads


@dataclass(frozen=True)
class Source:
    """One source of config keys, named for messages by ``name``: ``data`` as nested tables (a TOML
    file, a stored config) and ``sets``, keys set one by one (``--set``, a form's fields), each
    ``(key path, value)`` replacing what is at its path. ``config_dir`` is the directory relative
    paths in it are relative to (a TOML file's), or None.
    """

    name: str
    data: dict[str, Any] = field(default_factory=dict)
    sets: list[tuple[list[str], Any]] = field(default_factory=list)
    config_dir: Path | None = None


def toml_source(source: str | Path) -> Source:
    """The keys of a TOML file (or TOML text, named ``TOML text``).

    Raises:
        ConfigError: as ``read_toml``.
    """
    directory = config_dir(source)
    return Source(str(source) if directory is not None else "TOML text", read_toml(source), config_dir=directory)


def set_source(overrides: Sequence[str]) -> Source:
    """The keys of ``--set`` items (``dotted.key=value``, the value parsed as TOML, else a plain string).

    Raises:
        ConfigError: an item is not ``dotted.key=value``, or sets a key inside a value.
    """
    return Source("--set", sets=parse_sets(overrides))


def merge(sources: Sequence[Source]) -> dict[str, Any]:
    """The keys of ``sources`` merged in order, a later source winning. A source's ``data`` merges
    table by table, key by key (any other value, a list too, replaces what was there); then each of
    its ``sets`` replaces the value at its path, whatever it was. The sources are not changed.

    Raises:
        ConfigError: a set's path runs through a value, not a table (named with the source).
    """
    merged: dict[str, Any] = {}
    for source in sources:
        _merge_into(merged, copy.deepcopy(source.data))
        for path, value in source.sets:
            _assign(merged, path, copy.deepcopy(value), source.name)
    return merged


def _merge_into(target: dict[str, Any], data: dict[str, Any]) -> None:
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        else:
            target[key] = value


def validate_sources(model: type[BaseModel], sources: Sequence[Source], section: str = "") -> Any:
    """``merge(sources)`` validated as ``model``; relative paths are relative to the last source
    with a ``config_dir`` (the TOML file's directory).

    Raises:
        ConfigError: naming each invalid or unknown key with its ``[table]`` (``validate_config``).
    """
    directory = next((s.config_dir for s in reversed(sources) if s.config_dir is not None), None)
    return validate_config(model, merge(sources), section, directory)


def validate_config(model: type[BaseModel], data: Any, section: str, config_dir: Path | None = None) -> Any:
    """Validate ``data`` as ``model``, turning pydantic errors into a ``ConfigError`` naming ``[section] key``.

    ``config_dir``: the directory of the config file; relative paths in it (e.g. ``rubric``) are
    relative to it. None: relative to the working directory.
    """
    try:
        return model.model_validate(data, context={"config_dir": config_dir} if config_dir else None)
    except ValidationError as exc:
        raise ConfigError("\n".join(explain_error(err, section) for err in exc.errors())) from None


_SHALLOWER = "Write it with fewer levels of tables and arrays"


def read_toml(source: str | Path) -> dict[str, Any]:
    """Parse ``source``: a ``Path``, a string naming an existing file, or TOML text.

    A one-line string without ``=`` or ``[`` is taken as a path (so a typo in a file name
    says "not found" rather than "not valid TOML").
    """
    text_like = isinstance(source, str) and ("\n" in source or "=" in source or source.lstrip().startswith("["))
    path = None if text_like and not _is_file(str(source)) else Path(source)
    try:
        text = path.read_text(encoding="utf-8") if path is not None else str(source)
        return toml_loads(text, _describe(source, path), fix=_SHALLOWER)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r}: not found. Check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {str(path)!r}: is a directory. Name the .toml file inside it") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r}: not UTF-8 text ({exc.reason}). Save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{_describe(source, path)}: not valid TOML ({exc})") from None
    except ValueError as exc:   # nested too deep
        raise ConfigError(str(exc)) from None


def config_dir(source: str | Path) -> Path | None:
    """The directory of the config file ``source`` names; None for TOML text."""
    if isinstance(source, Path) or _is_file(str(source)):
        return Path(source).resolve().parent
    return None


def _is_file(name: str) -> bool:
    try:
        return Path(name).is_file()
    except (OSError, ValueError):  # TOML text longer than a file name may be, or holding NUL
        return False


def _describe(source: str | Path, path: Path | None = None) -> str:
    return f"config file {str(path)!r}" if path is not None else "TOML text"


def parse_sets(overrides: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``--set`` items (``dotted.key=value``) as ``(key path, value)``; the value is parsed as a TOML
    value (``3``, ``true``, ``"x"``, ``[1, 2]``, ``{a = 1}``) and taken as a plain string otherwise.

    Raises:
        ConfigError: an item is not ``dotted.key=value``, or its key and value together nest deeper
            than ``MAX_JSON_DEPTH`` levels.
    """
    sets = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected dotted.key=value, e.g. --set env.agent.max_turns=4")
        path = key.strip().split(".")
        where = f"--set {_cut(key.strip())}"
        if len(path) > MAX_JSON_DEPTH:
            raise ConfigError(f"{where}: the key nests deeper than {MAX_JSON_DEPTH} levels (MAX_JSON_DEPTH). "
                              f"{_SHALLOWER}")
        try:   # the value's levels count below the key's (the document's own table is one level)
            value = toml_loads(f"value = {raw.strip()}", where,
                               limit=MAX_JSON_DEPTH - len(path) + 1)["value"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        except ValueError:
            raise ConfigError(f"{where}: the key and value nest deeper than {MAX_JSON_DEPTH} levels "
                              f"(MAX_JSON_DEPTH). {_SHALLOWER}") from None
        sets.append((path, value))
    return sets


def _cut(text: str, keep: int = 80) -> str:
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def _assign(data: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    for part in path[:-1]:
        node = data.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{source} {'.'.join(path)}: {part!r} is a value, not a table")
        data = node
    data[path[-1]] = value
