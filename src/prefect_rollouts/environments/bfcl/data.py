"""BFCL data shared by the single- and multi-turn tasksets: where bfcl-eval's files are, how
its JSON-lines files read, and how its function names and schemas go on the wire."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prefect_rollouts.environments import package_dir

_TYPE = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}



def data_dir() -> Path:
    """The ``data`` directory of the installed ``bfcl-eval`` package.

    Raises:
        ConfigError: the package is not installed.
    """
    hint = "pip install --no-deps bfcl-eval (its pinned dependencies are not needed)"
    return package_dir("bfcl_eval", "bfcl", hint) / "data"


def tool_name(name: str) -> str:
    """``name`` made valid as a tool name (``[A-Za-z0-9_-]``): other characters become ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]


def wire_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter schema in JSON Schema terms (``dict`` -> ``object``, ``float`` -> ``number``, ...)."""
    converted: dict[str, Any] = {}
    for key, value in parameters.items():
        if key == "type" and isinstance(value, str):
            converted[key] = _TYPE.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            converted[key] = {name: wire_schema(spec) for name, spec in value.items()}
        elif key == "items" and isinstance(value, dict):
            converted[key] = wire_schema(value)
        else:
            converted[key] = value
    return converted


def read_jsonl(path: Path, count: int | None) -> list[dict[str, Any]]:
    """The first ``count`` JSON objects (all when None) of the JSON-lines file ``path``; blank lines skipped."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if count is not None and len(rows) >= count:
                break
            if line.strip():
                rows.append(json.loads(line))
    return rows
