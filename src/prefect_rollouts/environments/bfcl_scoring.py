"""BFCL's AST rules for Python function calls, as our own code.

A model answer is a list of calls ``[{function_name: {param: value}}]``; the ground truth gives,
per expected call, each parameter's acceptable values (``""`` among them: the parameter may be
left out). Rules, as the Berkeley Function Calling Leaderboard's checker applies them:

- simple: exactly one call, to the expected function; every required parameter present; no
  parameter the function or the answer does not know; each value of the declared type (an int
  passes for a float; a value of the answer's type passes as a "variable") and among the
  acceptable values: strings compared after dropping spaces and ``,./-_*^`` and lowering case,
  lists element-wise the same way, dicts key by key; every answer parameter without ``""`` given.
- multiple: one call, checked as simple against the expected function.
- parallel, parallel_multiple: as many calls as expected, each expected call matched by a
  distinct model call, in any order.
- irrelevance: correct when there is no call.

``tests/environments/test_bfcl.py`` checks agreement with the package's own checker.
"""

from __future__ import annotations

import re
from typing import Any, cast

_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                           "tuple": list, "dict": dict, "any": str}
_NESTED = ("array", "tuple")
_DROP = re.compile(r"[ ,./\-_*^]")

Call = dict[str, dict[str, Any]]


def check(category: str, functions: list[dict[str, Any]], calls: list[Call], answers: list[Call]) -> bool:
    """True when ``calls`` answer the task under ``category``'s rules (see the module docstring)."""
    if category == "irrelevance":
        return not calls
    if len(calls) != len(answers):
        return False
    if "parallel" in category:
        used: set[int] = set()
        for answer in answers:
            function = _describe(functions, next(iter(answer)))
            match = next((i for i, call in enumerate(calls) if i not in used and _one(function, call, answer)), None)
            if match is None:
                return False
            used.add(match)
        return True
    function = _describe(functions, next(iter(answers[0])))
    return _one(function, calls[0], answers[0])


def _describe(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((f for f in functions if f["name"] == name), functions[0])


def _one(function: dict[str, Any], call: Call, answer: Call) -> bool:
    accepted = next(iter(answer.values()))
    name = function["name"]
    if name not in call:
        return False
    given = call[name]
    properties = function["parameters"]["properties"]
    if any(param not in given for param in function["parameters"].get("required", [])):
        return False
    for param, value in given.items():
        if param not in properties or param not in accepted:
            return False
        declared = properties[param]["type"]
        expected = _TYPES[declared]
        nested = _TYPES[properties[param]["items"]["type"]] if declared in _NESTED else None
        if declared == "float" and type(value) is int:
            value = float(value)
        ok, is_variable = _type_ok(value, accepted[param], expected, nested)
        if not ok or not _value_ok(value, accepted[param], expected, nested, is_variable):
            return False
    return all(param in given or "" in values for param, values in accepted.items())


def _answer_type(values: list[Any]) -> type | None:
    return next((type(v) for v in values if v != ""), None)


def _type_ok(value: Any, values: list[Any], expected: type | None, nested: type | None) -> tuple[bool, bool]:
    """``(type acceptable, value is a "variable")`` under BFCL's one-level type check: a value of
    the answer's own type (when it differs from the declared one) passes as a variable."""
    answer_type = _answer_type(values)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for candidate in values:
            items = cast(list[Any], value)   # a list: its type is the declared one
            if type(candidate) is not list or all(_type_ok(item, candidate, nested, None)[0] for item in items):
                return True, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _norm(value: Any) -> Any:
    return _DROP.sub("", value).lower().replace("'", '"') if isinstance(value, str) else value


def _value_ok(value: Any, values: list[Any], expected: type, nested: type | None, is_variable: bool) -> bool:
    if not is_variable:
        if expected is dict:
            return any(_dict_ok(value, candidate) for candidate in values if candidate != "")
        if expected is list and nested is dict:
            return any(isinstance(candidate, list) and len(value) == len(candidate)
                       and all(_dict_ok(v, c) for v, c in zip(value, candidate, strict=True)) for candidate in values)
        if expected is str:
            return _norm(value) in [_norm(v) for v in values if isinstance(v, str)]
        if expected is list:
            return [_norm(v) for v in value] in [[_norm(v) for v in c] for c in values if isinstance(c, (list, str))]
    return value in values


def _dict_ok(value: dict[str, Any], candidate: dict[str, Any]) -> bool:
    if not isinstance(value, dict) or not isinstance(candidate, dict):
        return False
    for key, item in value.items():
        if key not in candidate or _norm(item) not in [_norm(c) for c in candidate[key]]:
            return False
    return all(key in value or "" in options for key, options in candidate.items())
