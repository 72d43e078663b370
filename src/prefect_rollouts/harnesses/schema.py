"""Tool definitions from Python callables: OpenAI function schema and argument validation.

The JSON schema comes from the callable's type hints (via a pydantic model of its
parameters); the description and per-argument descriptions from its docstring (Google, reST or
NumPy style, read by ``docstring_parser``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, create_model

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model: ``name``, wire ``schema``, the ``arguments`` model and ``fn``.

    An *answer tool* has no ``fn`` (and no ``arguments`` model): its calls are the model's answer
    (as in function-calling benchmarks); the harness records them and ends the segment.
    """

    name: str
    schema: dict[str, Any]
    arguments: type[BaseModel] | None
    fn: Callable[..., Any] | None


def answer_tool(name: str, description: str, parameters: dict[str, Any]) -> ToolSpec:
    """An answer tool: offered with this JSON schema, never executed (see ``ToolSpec``).

    Raises:
        ValueError: the name does not match ``[A-Za-z0-9_-]{1,64}``.
    """
    if not _NAME.match(name):
        raise ValueError(f"tool name {name!r}: must match [A-Za-z0-9_-]{{1,64}}")
    function = {"name": name, "description": description or name, "parameters": parameters}
    return ToolSpec(name=name, schema={"type": "function", "function": function}, arguments=None, fn=None)


def tool_spec(fn: Callable[..., Any], name: str | None = None) -> ToolSpec:
    """Describe ``fn`` as an OpenAI tool.

    Raises:
        ValueError: the name does not match ``[A-Za-z0-9_-]{1,64}`` (what servers accept).
    """
    name = name or fn.__name__
    if not _NAME.match(name):
        raise ValueError(f"tool name {name!r}: must match [A-Za-z0-9_-]{{1,64}}. Rename the function")
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or pname == "self":
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints.get(pname, Any), Field(default, description=arg_docs.get(pname)))
    arguments = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    parameters = arguments.model_json_schema()
    parameters.pop("title", None)
    for prop in parameters.get("properties", {}).values():
        prop.pop("title", None)
    function = {"name": name, "description": summary or name, "parameters": parameters}
    return ToolSpec(name=name, schema={"type": "function", "function": function}, arguments=arguments, fn=fn)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Summary (short and long description) and argument descriptions by name, from a Google,
    reST or NumPy docstring (``docstring_parser`` detects the style)."""
    parsed = docstring_parser.parse(doc)
    summary = " ".join(filter(None, (parsed.short_description, parsed.long_description)))
    args = {param.arg_name: " ".join((param.description or "").split()) for param in parsed.params}
    return " ".join(summary.split()), args
